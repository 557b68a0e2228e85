"""Training FLOPs per sample of a model built on the ``meta`` device (shapes only, no weights).

Training FLOPs count forward + backward matmuls and convolutions, 2 FLOPs per multiply-add.
The transformer LMs use closed forms (``transformer.py`` and ``llama.py``); the image models are
counted with ``FlopCounterMode`` (``count_train_flops_per_image``). Both count the same thing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from scalerepro.models import llama, transformer

IMAGE_FLOPS_SOURCE = "FlopCounterMode: conv/matmul FLOPs of one forward+backward on the meta device"


def count_train_flops_per_image(meta_model: nn.Module, image_size: int) -> float:
    """Conv and matmul FLOPs of one training step, per image, counted by FlopCounterMode on meta.

    We count the forward and the backward that autograd actually runs, rather than 3 x forward:
    the first conv's backward computes no input gradient (images do not require grad), which
    3 x forward would count (about 1% of ResNet-50's FLOPs). For the transformer LMs, whose first
    matmul input (the embeddings) does require grad, the two are the same number, so these counts
    and the LM closed forms mean the same thing.

    Two images, halved: FLOPs are linear in the batch, and BatchNorm in training mode refuses a
    batch with one value per channel (ResNets at 32 px end at 1x1).
    """
    batch = 2
    images = torch.empty(batch, 3, image_size, image_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta_model(images).sum().backward()
    return counter.get_total_flops() / batch


def train_flops_per_sample(meta_model: nn.Module, image_size: int | None, seq_len: int | None, num_masked: int | None) -> tuple[float, str]:
    """Training FLOPs of one sample (an image, or one sequence of an LM) of ``meta_model``, and
    the one line that says how they were derived. The sizes are None where the model takes none
    (an LM's image size), set where it does (registry.resolve)."""
    if isinstance(meta_model, transformer.BertForMaskedLM):
        assert seq_len is not None and num_masked is not None
        return float(transformer.bert_train_flops_per_sequence(meta_model.config, seq_len, num_masked)), transformer.BERT_FLOPS_SOURCE
    if isinstance(meta_model, transformer.GPT):
        assert seq_len is not None
        return float(transformer.gpt_train_flops_per_sequence(meta_model.config, seq_len)), transformer.GPT_FLOPS_SOURCE
    if isinstance(meta_model, llama.Llama):
        assert seq_len is not None
        return float(llama.llama_train_flops_per_sequence(meta_model.config, seq_len)), llama.LLAMA_FLOPS_SOURCE
    assert image_size is not None
    return count_train_flops_per_image(meta_model, image_size), IMAGE_FLOPS_SOURCE
