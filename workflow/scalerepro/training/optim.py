"""Optimizer and learning-rate schedule, built from OptimConfig for a model family."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import torch
from torch.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    LinearLR,
    LRScheduler,
    OneCycleLR,
    SequentialLR,
)

from scalerepro.trainer_flags import OptimConfig


class _Defaults(TypedDict):
    lr: float
    weight_decay: float
    scaling: str


# Defaults by family: SGD at 0.1 per 256 images (Goyal et al. 2017, "Accurate, Large Minibatch
# SGD"), AdamW at 1e-3 per 256 sequences.
_DEFAULTS: dict[str, _Defaults] = {
    "sgd": {"lr": 0.1, "weight_decay": 5e-4, "scaling": "linear"},
    "adamw": {"lr": 1e-3, "weight_decay": 0.1, "scaling": "sqrt"},
}


@dataclass(frozen=True)
class ResolvedOptim:
    kind: str  # "sgd" | "adamw"
    base_lr: float  # at lr_base_batch
    lr: float  # peak LR at the run's global batch
    weight_decay: float
    lr_scaling: str


def resolve(config: OptimConfig, family: str, global_batch: int) -> ResolvedOptim:
    kind = config.optimizer if config.optimizer != "auto" else ("sgd" if family == "cnn" else "adamw")
    defaults = _DEFAULTS[kind]
    base_lr = config.lr if config.lr is not None else defaults["lr"]
    scaling = config.lr_scaling if config.lr_scaling != "auto" else defaults["scaling"]
    # Peak LR for the actual global batch B, from the LR at base batch B0:
    #   linear: lr = lr0 * B / B0        sqrt: lr = lr0 * sqrt(B / B0)        none: lr = lr0
    ratio = global_batch / config.lr_base_batch
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[scaling]
    weight_decay = config.weight_decay if config.weight_decay is not None else defaults["weight_decay"]
    return ResolvedOptim(kind, base_lr, base_lr * factor, weight_decay, scaling)


def build_optimizer(model: torch.nn.Module, config: OptimConfig, resolved: ResolvedOptim) -> torch.optim.Optimizer:
    # Weight decay on weight matrices and conv kernels only: decaying biases and norm gains only
    # hurts (nanoGPT, timm and NVIDIA's recipes all exempt them).
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": resolved.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    impl = {
        "fused": {"fused": True},
        "foreach": {"foreach": True},
        "for-loop": {"foreach": False},
    }[config.optimizer_impl]
    if resolved.kind == "sgd":
        return torch.optim.SGD(groups, lr=resolved.lr, momentum=config.momentum, nesterov=config.nesterov, **impl)
    return torch.optim.AdamW(groups, lr=resolved.lr, betas=(config.adam_beta1, config.adam_beta2), **impl)


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, resolved: ResolvedOptim, total_steps: int) -> LRScheduler:
    """One ``scheduler.step()`` per optimizer step.

    cosine:   linear warm-up over lr_warmup_steps, then lr(t) = lr_min + (lr - lr_min)(1 + cos(pi t/T))/2
    constant: linear warm-up, then lr
    onecycle: torch's OneCycleLR (its own warm-up over the first 25%, cosine annealing after)
    """
    if config.lr_schedule == "onecycle":
        return OneCycleLR(optimizer, max_lr=resolved.lr, total_steps=max(total_steps, 2))
    warmup = min(config.lr_warmup_steps, max(total_steps - 1, 0))
    if config.lr_schedule == "cosine":
        main: LRScheduler = CosineAnnealingLR(optimizer, T_max=max(total_steps - warmup, 1), eta_min=resolved.lr * config.min_lr_ratio)
    else:
        main = ConstantLR(optimizer, factor=1.0, total_iters=0)
    if warmup == 0:
        return main
    ramp = LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup)
    return SequentialLR(optimizer, schedulers=[ramp, main], milestones=[warmup])
