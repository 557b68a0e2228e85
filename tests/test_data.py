"""Data: disjoint shards, set_epoch, both loaders bit-identical, augmentation, prepared layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalerepro.data import cifar10
from scalerepro.data.builders import make_sources
from scalerepro.data.loaders import DeviceLoader, HostLoader, ShardSampler, eval_batches
from scalerepro.data.sources import CifarImages, SyntheticCausalLM, SyntheticImages, SyntheticMaskedLM, stateless_hash

from conftest import learnable_cifar_split

CPU = torch.device("cpu")


def test_shards_are_disjoint_cover_the_epoch_and_reshuffle():
    shards = [ShardSampler(1000, 4, rank, seed=7) for rank in range(4)]
    for sampler in shards:
        sampler.set_position(epoch=0, start=0)
    epoch0 = [s.shard() for s in shards]
    assert all(len(s) == 250 for s in epoch0)
    assert sorted(i for s in epoch0 for i in s) == list(range(1000))
    for sampler in shards:
        sampler.set_position(epoch=1, start=0)
    assert [s.shard() for s in shards] != epoch0
    shards[0].set_position(epoch=1, start=10)
    assert [index for _, index in shards[0]] == shards[0].shard()[10:]
    assert {epoch for epoch, _ in shards[0]} == {1}


def test_the_two_loaders_yield_identical_batches(prepared_cifar):
    train = cifar10.load(prepared_cifar)["train"]
    source = CifarImages(torch.from_numpy(train.images), torch.from_numpy(train.labels), augment=True, seed=3)
    host = HostLoader(
        source, 32, dp_size=2, dp_rank=1, seed=3, device=CPU, channels_last=False, num_workers=2, pin_memory=False, persistent_workers=True, prefetch_factor=2
    )
    device = DeviceLoader(source, 32, dp_size=2, dp_rank=1, seed=3, device=CPU, channels_last=False)
    for epoch, start in ((0, 0), (1, 5)):
        for (h_inputs, h_targets), (d_inputs, d_targets) in zip(host.epoch(epoch, start), device.epoch(epoch, start), strict=True):
            assert torch.equal(h_inputs[0], d_inputs[0]) and torch.equal(h_targets, d_targets)
    host.close()
    assert host.micro_batches_per_epoch == device.micro_batches_per_epoch == 1024 // 32


def test_channels_last_batches():
    source = SyntheticImages(64, 10, 32, seed=0)
    inputs, _ = next(DeviceLoader(source, 16, 1, 0, 0, CPU, channels_last=True).epoch(0))
    assert inputs[0].is_contiguous(memory_format=torch.channels_last)
    inputs, _ = next(DeviceLoader(source, 16, 1, 0, 0, CPU, channels_last=False).epoch(0))
    assert inputs[0].is_contiguous()


def test_augmentation_is_a_padded_crop_and_flip_of_the_original():
    split = learnable_cifar_split(64, seed=5)
    images, labels = torch.from_numpy(split.images), torch.from_numpy(split.labels)
    plain = CifarImages(images, labels, augment=False, seed=1)
    augmented = CifarImages(images, labels, augment=True, seed=1)
    indices = torch.arange(64)
    (x_plain,), _ = plain.batch(indices, epoch=0)
    (x_aug,), targets = augmented.batch(indices, epoch=0)
    assert torch.equal(targets, labels)
    zero = (0 - torch.tensor([0.4914, 0.4822, 0.4465]) * 255) / (torch.tensor([0.2470, 0.2435, 0.2616]) * 255)
    padded = zero.view(1, 3, 1, 1).expand(64, 3, 40, 40).clone()  # zero pixels, normalised
    padded[:, :, 4:36, 4:36] = x_plain
    matches = 0
    for i in range(64):  # each augmented image is one of the 9x9 crops of the padded one, maybe flipped
        crops = padded[i].unfold(1, 32, 1).unfold(2, 32, 1).permute(1, 2, 0, 3, 4).reshape(81, 3, 32, 32)
        found = any(torch.allclose(c, x_aug[i]) or torch.allclose(c.flip(-1), x_aug[i]) for c in crops)
        matches += found
    assert matches == 64
    (x_next_epoch,), _ = augmented.batch(indices, epoch=1)
    assert not torch.equal(x_aug, x_next_epoch)  # a new epoch draws new crops


def test_normalisation_matches_the_cifar_statistics():
    split = learnable_cifar_split(16, seed=2)
    (x,), _ = CifarImages(torch.from_numpy(split.images), torch.from_numpy(split.labels), False, 0).batch(torch.arange(16), 0)
    expected = (split.images[3, 5, 7, 1] / 255 - 0.4822) / 0.2435
    assert x[3, 1, 5, 7].item() == pytest.approx(expected, rel=1e-5)


def test_synthetic_labels_depend_on_the_input():
    source = SyntheticImages(4096, num_classes=10, image_size=16, seed=0)
    (images,), labels = source.batch(torch.arange(4096), epoch=0)
    # The class template is recoverable from the image: nearest template wins almost always.
    templates = torch.nn.functional.interpolate(source.templates, size=16, mode="nearest").flatten(1)
    predicted = torch.cdist(images.flatten(1), templates).argmin(dim=1)
    assert (predicted == labels).float().mean() > 0.95
    assert labels.bincount(minlength=10).min() > 300  # all classes present


def test_synthetic_images_are_read_from_a_uint8_bank_not_rendered_per_batch():
    """A DataLoader worker must measure loading, not an image generator: each sample is one of
    the pre-rendered uint8 images, normalised with the bank's per-channel statistics."""
    source = SyntheticImages(4096, num_classes=10, image_size=32, seed=0)
    assert source.bank.dtype == torch.uint8 and source.bank.shape == (512, 3, 32, 32)
    (images,), labels = source.batch(torch.arange(200), epoch=0)
    normalised_bank = (source.bank.float() - source.mean) / source.std
    distance = torch.cdist(images.flatten(1), normalised_bank.flatten(1))
    closest = distance.argmin(dim=1)
    assert torch.allclose(images, normalised_bank[closest], atol=1e-5)
    assert torch.equal(labels, source.bank_labels[closest])
    assert len(set(closest.tolist())) > 150  # the samples spread over the bank
    # Normalised: about zero mean and unit spread per channel over the bank.
    assert normalised_bank.mean(dim=(0, 2, 3)).abs().max() < 1e-3
    assert (normalised_bank.std(dim=(0, 2, 3)) - 1).abs().max() < 1e-3
    # The held-out split renders its own bank: same class templates, unseen noise.
    held_out = SyntheticImages(1000, num_classes=10, image_size=32, seed=0, index_offset=4096)
    assert torch.equal(held_out.templates, source.templates) and not torch.equal(held_out.bank, source.bank)


def test_synthetic_language_data():
    causal = SyntheticCausalLM(100, vocab_size=50, seq_len=12, seed=0)
    (tokens,), targets = causal.batch(torch.arange(100), 0)
    successor = {int(a): int(b) for a, b in zip(causal.cycle, causal.cycle.roll(-1))}
    assert torch.equal(targets[:, :-1], tokens[:, 1:])
    assert all(successor[int(a)] == int(b) for a, b in zip(tokens.flatten(), targets.flatten()))

    masked = SyntheticMaskedLM(100, vocab_size=50, seq_len=20, num_masked=3, mask_token_id=0, seed=0)
    (inputs, positions), targets = masked.batch(torch.arange(100), 0)
    assert positions.shape == targets.shape == (100, 3)
    assert (inputs.gather(1, positions) == 0).all() and (targets != 0).all()
    assert ((inputs == 0).sum(dim=1) == 3).all()
    assert (positions.diff(dim=1) > 0).all()


def test_same_sample_on_every_path():
    source = SyntheticImages(100, 10, 8, seed=4, index_offset=0)
    (a,), la = source.batch(torch.tensor([5, 6, 7]), 0)
    (b,), lb = source.batch(torch.tensor([7, 5]), 3)
    assert torch.equal(a[2], b[0]) and torch.equal(a[0], b[1]) and la[2] == lb[0]


def test_stateless_hash_stays_in_range():
    x = stateless_hash(torch.tensor([0, 1, 2**31 - 1]), salt=2**40 + 3)
    assert x.dtype == torch.int64 and (x >= 0).all() and (x < 2**31).all()
    assert len(set(stateless_hash(torch.arange(10_000), 1).tolist())) > 9_990


def test_eval_batches_cover_the_split_once_over_ranks():
    source = SyntheticImages(103, 10, 8, seed=0)
    seen = []
    for rank in range(3):
        for _, labels in eval_batches(source, 10, 3, rank, CPU, False):
            seen.append(len(labels))
    assert sum(seen) == 103


def test_prepared_layout_errors(tmp_path):
    good = tmp_path / "good"
    cifar10.write(good, {"train": learnable_cifar_split(8, 0), "test": learnable_cifar_split(4, 1)}, source="test")
    assert cifar10.load(good)["test"].images.shape == (4, 32, 32, 3)
    with pytest.raises(cifar10.DatasetError, match="already exists"):
        cifar10.write(good, {"train": learnable_cifar_split(8, 0), "test": learnable_cifar_split(4, 1)}, source="test")
    assert [p.name for p in tmp_path.iterdir()] == ["good"]  # the failed write left nothing behind

    (good / "test_labels.npy").unlink()
    with pytest.raises(cifar10.DatasetError, match="test_labels.npy' is missing"):
        cifar10.load(good)
    np.save(good / "test_labels.npy", np.full(4, 12, dtype=np.int64))
    with pytest.raises(cifar10.DatasetError, match="labels outside 0..9"):
        cifar10.load(good)
    (good / "manifest.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(cifar10.DatasetError, match="layout format 99"):
        cifar10.load(good)
    (good / "train_images.npy").write_bytes(b"not numpy")
    (good / "manifest.json").write_text(json.dumps({"format": 1}))
    with pytest.raises(cifar10.DatasetError, match="not a readable .npy"):
        cifar10.load(good)


def test_make_sources_uses_the_whole_test_split(prepared_cifar):
    from scalerepro.models.registry import ModelShape, resolve
    from scalerepro.trainer_flags import DataConfig

    spec = resolve("cnn", ModelShape(image_size=32, num_classes=10))
    train, test = make_sources(DataConfig(data=str(prepared_cifar)), spec, seed=0)
    assert (train.num_samples, test.num_samples) == (2048, 512) and train.augment and not test.augment
