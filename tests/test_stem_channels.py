"""The ResNets' padded stem (`--stem-channels` 4 or 8): the plain model's logits in either memory
format, zero channels that stay zero through training, the plain model's FLOPs and parameters,
one-line errors, and one real trainer run."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch

from scalerepro.models import vision
from scalerepro.models.registry import ModelShape, ModelSpec, build, resolve
from scalerepro.trainer_flags import OptimConfig, TrainerConfigError, parse_args
from scalerepro.training import optim, run_setup

from conftest import load_record, python_train

SMALL = {"resnet18_cifar": ModelShape(image_size=32), "resnet50": ModelShape(image_size=32, num_classes=10)}
BATCH = 4
MEMORY_FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


@functools.cache  # a resolve measures FLOPs on the meta device: a second or two of ResNet-50
def spec_of(name: str, stem_channels: int) -> ModelSpec:
    return resolve(name, dataclasses.replace(SMALL[name], stem_channels=stem_channels))


def seeded(spec: ModelSpec, memory_format: torch.memory_format) -> torch.nn.Module:
    torch.manual_seed(0)
    return build(spec).to(memory_format=memory_format)


@functools.cache  # built once, then shared by the forward-only tests, in eval mode: nothing changes them
def seeded_for_inference(name: str, stem_channels: int) -> torch.nn.Module:
    return seeded(spec_of(name, stem_channels), torch.contiguous_format).eval()


def images(memory_format: torch.memory_format) -> torch.Tensor:
    return torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(1)).contiguous(memory_format=memory_format)


def stem(model: torch.nn.Module) -> torch.nn.Conv2d:
    conv1 = model.conv1
    assert isinstance(conv1, torch.nn.Conv2d)
    return conv1


def extra_channels(model: torch.nn.Module) -> torch.Tensor:
    return stem(model).weight[:, vision.IMAGE_CHANNELS :]


@pytest.mark.parametrize("memory_format", MEMORY_FORMATS.values(), ids=MEMORY_FORMATS.keys())
@pytest.mark.parametrize("stem_channels", [4, 8])
@pytest.mark.parametrize("name", SMALL)
def test_padded_stem_computes_the_plain_models_logits(name: str, stem_channels: int, memory_format: torch.memory_format) -> None:
    """The logits fail if the build gives the stem fresh weights instead of the plain model's.
    They cannot tell whether the extra weights are zero (those multiply zero inputs): the zero
    check here and the training test below do."""
    # Module.to converts the shared models' conv weights in place, to this test's format.
    plain = seeded_for_inference(name, 3).to(memory_format=memory_format)
    padded = seeded_for_inference(name, stem_channels).to(memory_format=memory_format)
    # The build copies the plain conv's seeded weights into the first 3 input channels itself
    # (and draws nothing more from the RNG): no copying needed here, the same seed is enough.
    assert stem(padded).weight.shape == (64, stem_channels, *stem(plain).kernel_size)
    assert torch.equal(stem(padded).weight[:, :3], stem(plain).weight)
    assert torch.equal(extra_channels(padded), torch.zeros_like(extra_channels(padded)))
    assert [n for n, _ in padded.named_parameters()] == [n for n, _ in plain.named_parameters()]  # torchvision's names

    stem_outputs: dict[str, torch.Tensor] = {}
    hooks = [
        stem(model).register_forward_hook(lambda module, args, output, label=label: stem_outputs.__setitem__(label, output))
        for label, model in (("plain", plain), ("padded", padded))
    ]
    with torch.no_grad():
        torch.testing.assert_close(padded(images(memory_format)), plain(images(memory_format)))
    for hook in hooks:
        hook.remove()
    # The padded stem hands the network the plain stem's layout: channels_last stays channels_last.
    for output in stem_outputs.values():
        assert output.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("memory_format", MEMORY_FORMATS.values(), ids=MEMORY_FORMATS.keys())
def test_padding_keeps_the_memory_format(memory_format: torch.memory_format) -> None:
    image = images(memory_format)
    for channels in (4, 8):
        padded = vision.pad_image_channels(image, channels)
        assert padded.shape == (BATCH, channels, 32, 32) and padded.is_contiguous(memory_format=memory_format)
        assert torch.equal(padded[:, :3], image) and not padded[:, 3:].any()


@pytest.mark.parametrize(("stem_channels", "memory_format"), [(4, torch.contiguous_format), (8, torch.channels_last)], ids=["4-nchw", "8-channels_last"])
def test_training_leaves_the_zero_channels_at_zero(stem_channels: int, memory_format: torch.memory_format) -> None:
    """Their inputs are zeros, so their gradient is exactly zero; weight decay and momentum of a
    zero weight are zero: they stay zero, identical on every DDP rank. Nonzero extra weights
    (the bug) would shrink under the weight decay, and this fails."""
    spec = spec_of("resnet18_cifar", stem_channels)
    model = seeded(spec, memory_format)
    config = OptimConfig()  # the trainer's CNN optimizer: SGD, momentum, Nesterov, weight decay
    resolved = optim.resolve(config, spec.family, BATCH)
    assert resolved.kind == "sgd" and resolved.weight_decay > 0 and config.momentum > 0
    optimizer = optim.build_optimizer(model, config, resolved)
    before = stem(model).weight.detach().clone()
    targets = torch.randint(10, (BATCH,), generator=torch.Generator().manual_seed(2))
    # One step: its update is the gradient plus weight decay (and momentum's buffer, which is
    # that sum again), so a zero after it is a zero after any number of steps.
    torch.nn.functional.cross_entropy(model(images(memory_format)), targets).backward()
    grad = stem(model).weight.grad
    assert grad is not None and torch.equal(grad[:, 3:], torch.zeros_like(grad[:, 3:]))
    optimizer.step()
    assert torch.equal(extra_channels(model), torch.zeros_like(extra_channels(model)))
    assert not torch.equal(stem(model).weight[:, :3], before[:, :3])  # the image's channels did train


@pytest.mark.parametrize("stem_channels", [4, 8])
@pytest.mark.parametrize("name", SMALL)
def test_spec_counts_the_plain_models_flops_and_parameters(name: str, stem_channels: int) -> None:
    plain, padded = spec_of(name, 3), spec_of(name, stem_channels)
    assert padded.train_flops_per_sample == plain.train_flops_per_sample
    assert padded.num_parameters == plain.num_parameters
    assert padded.shape.stem_channels == stem_channels and plain.shape.stem_channels == 3
    assert padded.flops_source.startswith(plain.flops_source) and "plain 3-channel stem" in padded.flops_source
    # The built model holds the zero weights the spec leaves out: 64 x k x k per extra channel.
    with torch.device("meta"):
        built = build(padded)
    kernel = 3 if name == "resnet18_cifar" else 7
    assert sum(p.numel() for p in built.parameters()) == padded.num_parameters + 64 * kernel * kernel * (stem_channels - 3)


@pytest.mark.parametrize(
    ("name", "stem_channels", "says"),
    [
        ("resnet18_cifar", 5, "must be 3, 4 or 8 for resnet18_cifar"),
        ("resnet50", 16, "must be 3, 4 or 8 for resnet50"),
        ("resnet50", 0, "must be 3, 4 or 8 for resnet50"),
        ("cnn", 4, "does not apply to cnn (got 4): only resnet18_cifar and resnet50 take 4 or 8"),
        ("vit_b_16", 4, "does not apply to vit_b_16"),
        ("gpt2_small", 8, "does not apply to gpt2_small"),
    ],
)
def test_bad_stem_channels_is_one_line(name: str, stem_channels: int, says: str) -> None:
    with pytest.raises(ValueError, match="^--stem-channels ") as error:
        resolve(name, ModelShape(stem_channels=stem_channels))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_the_trainer_refuses_a_padded_stem_on_another_model() -> None:
    with pytest.raises(TrainerConfigError, match="^--stem-channels does not apply to cnn "):
        run_setup.resolve_model(parse_args(["--model", "cnn", "--stem-channels", "4"]))


@pytest.mark.slow  # a training process, as tests/test_trainer.py's
def test_the_trainer_runs_a_padded_stem(tmp_path: Path) -> None:
    record_path = tmp_path / "run.json"
    args = ["--model", "resnet18_cifar", "--stem-channels", "4", "--steps", "3", "--warmup-steps", "1", "--per-gpu-batch", "8"]
    args += ["--device", "cpu", "--synthetic-samples", "64", "--no-eval", "--comm-probe-steps", "0", "--bucket-probe-steps", "0"]
    done = python_train([*args, "--record", str(record_path)])
    assert done.returncode == 0, done.stderr
    record = load_record(record_path)
    assert record["status"] == "ok" and record["steps"]["completed"] == 3
    assert record["config"]["model"]["stem_channels"] == 4 and record["knobs"]["stem_channels"] == 4
    assert record["model"]["num_parameters"] == resolve("resnet18_cifar").num_parameters  # the plain model's count
