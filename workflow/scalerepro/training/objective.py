"""The training objective as one module: the model and its loss.

Every task is scored the same way: the model's logits against ``targets`` with cross-entropy
(flattened over positions for the language models). Computing the loss inside the module that
``torch.compile`` (and DDP) wrap puts it inside the compiled graph: for GPT-2 the eager
cross-entropy over 32 x 1024 x 50,304 bf16 logits materialises float32 copies of them (autocast
runs cross-entropy in float32), while inductor fuses the upcast, log-softmax and gather into the
reduction.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float) -> Tensor:
    """Mean cross-entropy over every scored position: logits (..., classes), targets (...)."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), label_smoothing=label_smoothing)


class ModelWithLoss(nn.Module):
    """``forward(inputs, targets)`` = the mean loss of ``model(*inputs)``; no parameters of its
    own, so its parameters (and DDP's buckets) are the model's, in the model's order."""

    def __init__(self, model: nn.Module, label_smoothing: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, inputs: tuple[Tensor, ...], targets: Tensor) -> Tensor:
        return cross_entropy(self.model(*inputs), targets, self.label_smoothing)


__all__ = ["ModelWithLoss", "cross_entropy"]
