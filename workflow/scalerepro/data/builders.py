"""Datasets and loaders: synthetic data for every model, CIFAR-10 from a prepared directory."""

from __future__ import annotations

import torch

from scalerepro.data import cifar10
from scalerepro.data.loaders import DeviceLoader, HostLoader, TrainLoader, eval_batches, to_device
from scalerepro.data.sources import Batch, CifarImages, Source, SyntheticCausalLM, SyntheticImages, SyntheticMaskedLM
from scalerepro.models.registry import ModelSpec, required
from scalerepro.trainer_flags import DataConfig

__all__ = [
    "Batch",
    "Source",
    "TrainLoader",
    "eval_batches",
    "is_synthetic",
    "make_sources",
    "make_train_loader",
    "to_device",
]

# Held-out samples evaluated unless --eval-samples says otherwise: a few batches (at most 16 per
# rank) and at most 2048 samples, enough for an accuracy within a few points and few enough that
# evaluating never outlasts a benchmark's steps (10,000 synthetic samples at batch 2 took minutes).
# --eval-samples 10000 evaluates the whole CIFAR-10 test split.
DEFAULT_EVAL_SAMPLES, DEFAULT_EVAL_BATCHES = 2048, 16


def default_eval_samples(eval_batch_per_rank: int, data_parallel_ranks: int) -> int:
    """The held-out samples a run evaluates when --eval-samples is not given."""
    return min(DEFAULT_EVAL_SAMPLES, DEFAULT_EVAL_BATCHES * eval_batch_per_rank * data_parallel_ranks)


def is_synthetic(config: DataConfig) -> bool:
    return config.data == "synthetic"


def _synthetic(spec: ModelSpec, num_samples: int, seed: int, index_offset: int) -> Source:
    if spec.task == "image_classification":
        return SyntheticImages(num_samples, required(spec.num_classes), required(spec.image_size), seed, index_offset)
    if spec.task == "causal_lm":
        return SyntheticCausalLM(num_samples, required(spec.vocab_size), required(spec.seq_len), seed, index_offset)
    return SyntheticMaskedLM(
        num_samples, required(spec.vocab_size), required(spec.seq_len), required(spec.num_masked), required(spec.mask_token_id), seed, index_offset
    )


def make_sources(config: DataConfig, spec: ModelSpec, seed: int) -> tuple[Source, Source]:
    """(training split, held-out split) for ``spec``; raises cifar10.DatasetError for a bad directory."""
    if is_synthetic(config):
        train = _synthetic(spec, config.synthetic_samples, seed, index_offset=0)
        # The held-out split uses indices past the training ones: unseen (label, noise) pairs.
        held_out = config.eval_samples or DEFAULT_EVAL_SAMPLES
        return train, _synthetic(spec, held_out, seed, index_offset=config.synthetic_samples)

    splits = cifar10.load(config.data)
    train_split, test_split = splits["train"], splits["test"]
    eval_count = min(config.eval_samples or DEFAULT_EVAL_SAMPLES, len(test_split.labels))
    return (
        CifarImages(torch.from_numpy(train_split.images), torch.from_numpy(train_split.labels), config.augment, seed),
        CifarImages(torch.from_numpy(test_split.images[:eval_count]), torch.from_numpy(test_split.labels[:eval_count]), False, seed),
    )


def make_train_loader(
    config: DataConfig,
    source: Source,
    batch_size: int,
    dp_size: int,
    dp_rank: int,
    seed: int,
    device: torch.device,
    channels_last: bool,
) -> TrainLoader:
    if config.loader == "device":
        return DeviceLoader(source, batch_size, dp_size, dp_rank, seed, device, channels_last)
    assert config.num_workers is not None  # run_setup.resolve_config decides it
    return HostLoader(
        source,
        batch_size,
        dp_size,
        dp_rank,
        seed,
        device,
        channels_last,
        num_workers=config.num_workers,
        pin_memory=config.pin_memory,
        persistent_workers=config.persistent_workers,
        prefetch_factor=config.prefetch_factor,
    )
