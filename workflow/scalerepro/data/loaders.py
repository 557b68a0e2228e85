"""The two training loaders, and the evaluation batches.

Both loaders shard an epoch exactly as ``DistributedSampler(shuffle=True, drop_last=True)`` does
(they use it for the order), so each rank sees a disjoint shard, ``epoch`` reshuffles, and a run
can start mid-epoch at any micro-batch:

* ``HostLoader``: the usual ``torch.utils.data.DataLoader`` with worker processes that build
  whole batches on the CPU, pinned memory and asynchronous copies to the device.
* ``DeviceLoader``: the whole dataset resident on the device; batches (augmentation included) are
  built there by a few kernels, with no worker processes and no host-to-device traffic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TypedDict

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from scalerepro.data.sources import Batch, Source


class ShardSampler(DistributedSampler):
    """DistributedSampler over ``range(num_samples)`` that yields ``(epoch, index)`` pairs and can
    start part-way through its shard.

    Yielding the epoch with each index lets persistent DataLoader workers (which hold their own
    copy of the dataset) augment for the right epoch without any shared state.
    """

    def __init__(self, num_samples: int, num_replicas: int, dp_rank: int, seed: int):
        # the sampler reads only len(dataset): a range of the indices is enough
        super().__init__(range(num_samples), num_replicas=num_replicas, rank=dp_rank, shuffle=True, seed=seed, drop_last=True)  # type: ignore[arg-type]
        self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.set_epoch(epoch)
        self.start = start

    def shard(self) -> list[int]:
        """This rank's indices for the current epoch, in order."""
        return list(super().__iter__())

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for index in self.shard()[self.start :]:
            yield self.epoch, index

    def __len__(self) -> int:
        return self.num_samples - self.start


class _BatchedDataset(Dataset):
    """Adapts a Source to DataLoader: ``__getitems__`` builds the whole batch in one vectorised call."""

    def __init__(self, source: Source):
        self.source = source

    def __len__(self) -> int:
        return self.source.num_samples

    def __getitems__(self, keys: list[tuple[int, int]]) -> Batch:
        epoch = keys[0][0]
        return self.source.batch(torch.tensor([index for _, index in keys]), epoch)

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        return self.__getitems__([key])


def _already_collated(batch: Batch) -> Batch:
    return batch


def to_device(batch: Batch, device: torch.device, channels_last: bool, non_blocking: bool = False) -> Batch:
    """Move a batch to ``device``; image inputs (4-D) get the model's memory format."""
    memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def move(tensor: Tensor) -> Tensor:
        tensor = tensor.to(device, non_blocking=non_blocking)
        return tensor.contiguous(memory_format=memory_format) if tensor.dim() == 4 else tensor.contiguous()

    inputs, targets = batch
    return tuple(move(t) for t in inputs), move(targets)


class TrainLoader(ABC):
    def __init__(self, source: Source, batch_size: int, dp_size: int, dp_rank: int, seed: int):
        self.batch_size = batch_size
        self.sampler = ShardSampler(source.num_samples, dp_size, dp_rank, seed)
        self.micro_batches_per_epoch = self.sampler.num_samples // batch_size

    @abstractmethod
    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Micro-batches ``start, start+1, ...`` of ``epoch`` on the device (the last partial batch dropped)."""

    def close(self) -> None:  # noqa: B027 (a loader without workers has nothing to release)
        """Release worker processes, if any."""


class _WorkerOptions(TypedDict, total=False):
    persistent_workers: bool
    prefetch_factor: int


class HostLoader(TrainLoader):
    def __init__(
        self,
        source: Source,
        batch_size: int,
        dp_size: int,
        dp_rank: int,
        seed: int,
        device: torch.device,
        channels_last: bool,
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
        prefetch_factor: int,
    ):
        super().__init__(source, batch_size, dp_size, dp_rank, seed)
        self.device, self.channels_last = device, channels_last
        self.pin_memory = pin_memory and device.type == "cuda"
        workers: _WorkerOptions = {"persistent_workers": persistent_workers, "prefetch_factor": prefetch_factor} if num_workers else {}
        self.loader = DataLoader(
            _BatchedDataset(source),
            batch_size=batch_size,
            sampler=self.sampler,
            drop_last=True,
            num_workers=num_workers,
            pin_memory=self.pin_memory,
            collate_fn=_already_collated,  # type: ignore[arg-type]  # __getitems__ hands it the whole batch, not a list of samples
            **workers,
        )

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        self.sampler.set_position(epoch, start * self.batch_size)
        for batch in self.loader:
            yield to_device(batch, self.device, self.channels_last, non_blocking=self.pin_memory)

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


class DeviceLoader(TrainLoader):
    def __init__(self, source: Source, batch_size: int, dp_size: int, dp_rank: int, seed: int, device: torch.device, channels_last: bool):
        super().__init__(source, batch_size, dp_size, dp_rank, seed)
        self.source = source.to(device)
        self.device, self.channels_last = device, channels_last

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        self.sampler.set_position(epoch, 0)
        shard = torch.tensor(self.sampler.shard(), dtype=torch.long).to(self.device, non_blocking=True)
        for step in range(start, self.micro_batches_per_epoch):
            indices = shard[step * self.batch_size : (step + 1) * self.batch_size]
            yield to_device(self.source.batch(indices, epoch), self.device, self.channels_last)


def eval_batches(source: Source, batch_size: int, dp_size: int, dp_rank: int, device: torch.device, channels_last: bool) -> Iterator[Batch]:
    """This rank's part of the whole held-out split: indices dp_rank, dp_rank + dp_size, ... with no padding
    and no drop, so that summing over ranks counts every sample exactly once."""
    indices = torch.arange(dp_rank, source.num_samples, dp_size, device=device)
    for chunk in indices.split(batch_size):
        yield to_device(source.batch(chunk, epoch=0), device, channels_last)
