"""Index-addressable datasets: ``batch(indices, epoch)`` returns the samples at ``indices``.

Every sample, and every random augmentation of it, is a pure function of (seed, epoch, index),
computed with a stateless integer hash rather than a stateful RNG. That one decision gives:

* the DataLoader (CPU workers) and the device-resident loader produce bit-identical batches;
* one rank with global batch B and N ranks with B/N each see exactly the same samples;
* a run resumed mid-epoch continues with exactly the samples it would have seen;
* no RNG state in DataLoader workers to checkpoint.

A batch is ``(inputs, targets)``: the model is called as ``model(*inputs)`` and its logits are
scored against ``targets`` with cross-entropy, for every task.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

Batch = tuple[tuple[Tensor, ...], Tensor]

_MASK31 = (1 << 31) - 1
# CIFAR-10 per-channel mean and std of the training split (RGB, on [0, 1] pixels).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def stateless_hash(x: Tensor, salt: int) -> Tensor:
    """Integer hash of each element of ``x`` (int64, values < 2**31) to [0, 2**31).

    Murmur3-style finaliser on 31-bit values: every product stays below 2**63, so int64 tensor
    arithmetic never overflows and CPU and GPU agree bit for bit.
    """
    x = (x.long() + ((salt * 2654435761) & _MASK31)) & _MASK31
    for multiplier, shift in ((0x85EBCA6B, 16), (0xC2B2AE35, 13), (0x27D4EB2F, 16)):
        x = ((x ^ (x >> shift)) * multiplier) & _MASK31
    return x ^ (x >> 16)


def salt_for(seed: int, purpose: int, epoch: int = 0) -> int:
    """One salt per (seed, purpose, epoch); purposes keep label, noise, crop and flip draws independent."""
    return (seed * 1_000_003 + purpose * 7919 + epoch * 104_729) & _MASK31


class Source(ABC):
    """A dataset of ``num_samples`` samples held on one device."""

    num_samples: int
    _tensors: tuple[str, ...]  # attributes that live on the source's device

    def to(self, device: torch.device) -> Source:
        """The same dataset with its tensors on ``device``."""
        moved = copy.copy(self)
        for name in self._tensors:
            setattr(moved, name, getattr(self, name).to(device))
        return moved

    @abstractmethod
    def batch(self, indices: Tensor, epoch: int) -> Batch:
        """The samples at ``indices`` (int64, on this source's device) as seen in ``epoch``."""


class SyntheticImages(Source):
    """Learnable random images, held as uint8 pixels like a decoded dataset.

    Each class has a fixed low-resolution template. A bank of up to 512 images is rendered once
    (image j: the template of class j mod C, upsampled, plus Gaussian noise, quantised to uint8,
    stored CHW); sample i is bank image hash(i) mod 512, so its label depends on its input (through the
    template) and a model must learn the templates: the loss falls, and a broken gradient path
    shows as a flat loss. The held-out split (``index_offset`` past the training samples) renders
    its own bank: the same templates under noise no training sample carries.

    A batch is gathered from the bank and normalised per channel as ``CifarImages`` normalises
    real pixels, so a DataLoader worker does the work of reading a decoded dataset, not of
    generating images: rendering them per batch cost ~1-2.5 ms per 224-pixel image on one CPU
    core, which capped a rank with 4 workers near 1,600 images/s, so every DataLoader variant of
    the ablation read as input-bound (``benchmarks/synthetic_images.py`` prints the cost).
    """

    _TEMPLATE_SIDE = 8
    _BANK = 512
    _RENDER_CHUNK = 64  # bank images rendered at once (bounds the float32 scratch at 224 px: 38 MB)
    _PIXEL_MEAN, _PIXEL_SCALE = 128.0, 40.0  # pixel = 128 + 40 x (template + noise), clamped to [0, 255]
    _NOISE = 2
    _tensors = ("bank", "bank_labels", "mean", "std")

    def __init__(self, num_samples: int, num_classes: int, image_size: int, seed: int, index_offset: int = 0):
        self.num_samples, self.num_classes, self.image_size = num_samples, num_classes, image_size
        self.seed, self.index_offset = seed, index_offset
        side = self._TEMPLATE_SIDE
        self.templates = torch.randn(num_classes, 3, side, side, generator=torch.Generator().manual_seed(seed))
        bank_size = min(self._BANK, num_samples)
        self.bank_labels = torch.arange(bank_size) % num_classes
        noise = torch.Generator().manual_seed(salt_for(seed, self._NOISE, index_offset))
        self.bank = torch.empty(bank_size, 3, image_size, image_size, dtype=torch.uint8)
        for first in range(0, bank_size, self._RENDER_CHUNK):
            labels = self.bank_labels[first : first + self._RENDER_CHUNK]
            signal = F.interpolate(self.templates[labels], size=image_size, mode="nearest")
            pixels = self._PIXEL_MEAN + self._PIXEL_SCALE * (signal + torch.randn(signal.shape, generator=noise))
            self.bank[first : first + len(labels)] = pixels.round().clamp(0, 255).to(torch.uint8)
        # Per-channel statistics of the bank, as CIFAR10_MEAN/STD are of CIFAR-10's training split.
        per_channel = self.bank.transpose(0, 1).flatten(1).double()
        self.mean = per_channel.mean(dim=1).float().view(3, 1, 1)
        self.std = per_channel.std(dim=1).float().view(3, 1, 1)

    def batch(self, indices: Tensor, epoch: int) -> Batch:
        keys = indices + self.index_offset
        bank_ids = stateless_hash(keys, salt_for(self.seed, self._NOISE)) % len(self.bank)
        # x = (pixel - mean) / std per channel, in place on the one float copy (index_select and
        # in-place arithmetic: a third of the time of indexing and out-of-place arithmetic).
        images = self.bank.index_select(0, bank_ids).float().sub_(self.mean).div_(self.std)
        return (images,), self.bank_labels[bank_ids]


class SyntheticCausalLM(Source):
    """Token sequences that walk a fixed random cyclic order of the vocabulary.

    Sample i starts at a hashed offset; every next token is the current token's successor in the
    cycle, a bigram rule the model can learn, so next-token loss falls from ln(V) towards 0.
    """

    _START = 3
    _tensors = ("cycle", "positions")

    def __init__(self, num_samples: int, vocab_size: int, seq_len: int, seed: int, index_offset: int = 0):
        self.num_samples, self.seq_len, self.seed, self.index_offset = num_samples, seq_len, seed, index_offset
        self.cycle = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
        self.positions = torch.arange(seq_len + 1)

    def _walk(self, indices: Tensor, length: int) -> Tensor:
        start = stateless_hash(indices + self.index_offset, salt_for(self.seed, self._START)) % len(self.cycle)
        return self.cycle[(start[:, None] + self.positions[:length]) % len(self.cycle)]

    def batch(self, indices: Tensor, epoch: int) -> Batch:
        tokens = self._walk(indices, self.seq_len + 1)
        return (tokens[:, :-1],), tokens[:, 1:]


class SyntheticMaskedLM(SyntheticCausalLM):
    """The same cyclic-walk sequences with a fixed number of positions replaced by [MASK].

    Each masked token is predictable from its unmasked neighbours (its cycle predecessor and
    successor). The count of masked positions is static (BERT's max_predictions_per_seq), so
    shapes never change and the MLM head runs only at those positions.
    """

    _MASK = 4

    def __init__(self, num_samples: int, vocab_size: int, seq_len: int, num_masked: int, mask_token_id: int, seed: int, index_offset: int = 0):
        super().__init__(num_samples, vocab_size, seq_len, seed, index_offset)
        self.num_masked, self.mask_token_id = num_masked, mask_token_id
        self.cycle = self.cycle[self.cycle != mask_token_id]  # [MASK] never occurs as content

    def batch(self, indices: Tensor, epoch: int) -> Batch:
        tokens = self._walk(indices, self.seq_len)
        # The masked positions are the num_masked smallest hash keys of (sample, position): a
        # uniformly random subset per sample, drawn without a stateful RNG.
        keys = (indices[:, None] + self.index_offset) * self.seq_len + self.positions[: self.seq_len]
        order = stateless_hash(keys, salt_for(self.seed, self._MASK)).argsort(dim=1)
        masked_positions = order[:, : self.num_masked].sort(dim=1).values
        targets = tokens.gather(1, masked_positions)
        inputs = tokens.scatter(1, masked_positions, self.mask_token_id)
        return (inputs, masked_positions), targets


class CifarImages(Source):
    """CIFAR-10 arrays (uint8 NHWC) with the standard augmentation, applied per batch.

    Augmentation (training split): zero-pad 4 pixels, random 32x32 crop, random horizontal flip,
    with the crop offsets and flip of each sample drawn by hash from (seed, epoch, index). Then
    the usual per-channel normalisation.
    """

    _CROP_Y, _CROP_X, _FLIP = 5, 6, 7
    _PAD = 4
    _tensors = ("images", "labels", "mean", "std")

    def __init__(self, images: Tensor, labels: Tensor, augment: bool, seed: int):
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
            raise ValueError("CIFAR images must be uint8 (N, H, W, 3)")
        self.images, self.labels, self.augment, self.seed = images, labels, augment, seed
        self.num_samples = len(labels)
        self.mean = torch.tensor(CIFAR10_MEAN).mul(255)
        self.std = torch.tensor(CIFAR10_STD).mul(255)

    def _crop_and_flip(self, images: Tensor, indices: Tensor, epoch: int) -> Tensor:
        batch, height, width, _ = images.shape
        pad = self._PAD
        padded = F.pad(images, (0, 0, pad, pad, pad, pad))  # (B, H+8, W+8, 3), zeros outside
        dy = stateless_hash(indices, salt_for(self.seed, self._CROP_Y, epoch)) % (2 * pad + 1)
        dx = stateless_hash(indices, salt_for(self.seed, self._CROP_X, epoch)) % (2 * pad + 1)
        rows = dy[:, None] + torch.arange(height, device=images.device)  # (B, H)
        cols = dx[:, None] + torch.arange(width, device=images.device)  # (B, W)
        sample = torch.arange(batch, device=images.device)[:, None, None]
        cropped = padded[sample, rows[:, :, None], cols[:, None, :]]  # (B, H, W, 3)
        flip = (stateless_hash(indices, salt_for(self.seed, self._FLIP, epoch)) & 1).bool()
        return torch.where(flip[:, None, None, None], cropped.flip(2), cropped)

    def batch(self, indices: Tensor, epoch: int) -> Batch:
        images = self.images[indices]
        if self.augment:
            images = self._crop_and_flip(images, indices, epoch)
        # x = (pixel - 255*mean) / (255*std), computed in NHWC and returned as an NCHW view.
        normalised = (images.float() - self.mean) / self.std
        return (normalised.permute(0, 3, 1, 2),), self.labels[indices]
