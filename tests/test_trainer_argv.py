"""trainer_flags.render_argv is the inverse of parse_args: a valid trainer config renders as the
command line that the trainer reads back as that very config (the planner renders each job's argv
once from its run's config and never parses it: scalerepro.planning.study)."""

from __future__ import annotations

import dataclasses
import random
import types
import typing

import pytest

from scalerepro import trainer_flags
from scalerepro.trainer_flags import TrainConfig

# What a command line could take for something else: a flag, a negative number, "flag=value", a separator.
WORDS = ["x", "results/runs/a b", "-starts-with-a-dash", "--looks-like-a-flag", "a=b", "-1", "ünï", ""]
MODELS = ["cnn", "resnet18_cifar", "resnet50", "vit_b_16", "bert_base", "gpt2_small", "llama_1b", "not_a_model"]
# fields TrainConfig.validate leaves unbounded below: they may be negative
SIGNED = {"lr", "momentum", "adam_beta1", "adam_beta2", "weight_decay", "image_size", "seq_len", "peak_tflops"}
HINTS = {name: typing.get_type_hints(type(section)) for name, section in vars(TrainConfig()).items()}


def _value(rng: random.Random, name: str, annotation: typing.Any) -> typing.Any:
    """A value of the field's type that the trainer's checks let through (mostly)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
        return None if rng.random() < 0.3 else _value(rng, name, inner)
    if annotation is bool:
        return rng.random() < 0.5
    if typing.get_origin(annotation) is typing.Literal:
        return rng.choice(typing.get_args(annotation))
    sign = rng.choice((1, -1)) if name in SIGNED else 1
    if annotation is int:
        return sign * rng.choice((1, 2, 3, 7, 64, 10**12))
    if annotation is float:
        return sign * rng.choice((0.01, 0.1 + 0.2, 1e-05, 0.5, 0.9, 2 / 3))
    assert annotation is str, (name, annotation)
    return rng.choice(MODELS if name == "model" else WORDS)


def _config(rng: random.Random) -> TrainConfig:
    """A resolved config (a preset on a model, strategy, accumulation and device) with a random
    share of its fields then set to random values, mended where the trainer's checks would refuse it."""
    base = trainer_flags.with_values(
        TrainConfig(),
        {
            "model": rng.choice(MODELS),
            "preset": rng.choice(("baseline", "optimised")),
            "device": rng.choice(("auto", "cuda", "cpu")),
            "grad_accum_steps": rng.choice((1, 4)),
            "parallel": rng.choice(("ddp", "fsdp", "tp", "fsdp+tp", "pp")),
        },
    )
    config = trainer_flags.with_preset(base, ())
    share = rng.choice((0.0, 0.1, 0.5, 1.0))
    changes = {name: _value(rng, name, HINTS[section][name]) for name, section in trainer_flags._sections().items() if rng.random() < share}
    config = trainer_flags.with_values(config, changes)
    mend: dict[str, typing.Any] = {}
    if config.run.steps is not None and config.run.epochs is not None:
        mend["epochs"] = None
    if config.parallel.parallel == "tp":
        mend["optimizer_impl"] = trainer_flags.TP_OPTIMIZER_IMPL
    if config.parallel.tp_size is not None and config.parallel.tp_size < 2:
        mend["tp_size"] = 2
    if config.run.resume and not config.run.checkpoint_dir:
        mend["checkpoint_dir"] = "checkpoints"
    if config.profile.profile_mode == "torch" and not config.profile.profile_dir:
        mend["profile_dir"] = "profiles"
    return trainer_flags.with_values(config, mend)


@pytest.mark.parametrize("native_bf16", [True, False], ids=["cpu-as-found", "cpu-without-native-bf16"])
def test_parse_args_reads_the_rendered_argv_of_a_config_as_that_config(native_bf16, monkeypatch):
    """600 varied configs: each field at its preset's value, its default or another; strings
    that look like flags, negative numbers, floats that print long; on a CPU the preset's precision
    depends on the CPU (held without native bf16 in the second case)."""
    if not native_bf16:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    rng, checked = random.Random(64), 0
    for _ in range(600):
        config = _config(rng)
        try:
            config.validate()
        except trainer_flags.TrainerConfigError:
            continue  # e.g. a checkpoint folder that is a file here
        argv = trainer_flags.render_argv(config)
        assert trainer_flags.parse_args(argv) == config, argv
        checked += 1
    assert checked > 550


def test_the_argv_names_the_preset_and_then_only_what_departs_from_it_in_the_fields_order():
    optimised = trainer_flags.parse_args(["--model", "resnet50", "--preset", "optimised", "--device", "cuda"])
    assert trainer_flags.render_argv(optimised) == ["--model", "resnet50", "--preset", "optimised", "--device", "cuda"]
    changed = trainer_flags.with_values(optimised, {"seed": 3, "channels_last": False, "lr": -0.5, "grad_accum_steps": 2, "eval": False})
    # a change of accumulation changes the preset's compile mode: rendered as the value it kept
    assert trainer_flags.render_argv(changed) == [
        "--model",
        "resnet50",
        "--preset",
        "optimised",
        "--lr=-0.5",
        "--grad-accum-steps",
        "2",
        "--device",
        "cuda",
        "--no-channels-last",
        "--compile",
        "reduce-overhead",
        "--seed",
        "3",
        "--no-eval",
    ]
    assert trainer_flags.parse_args(trainer_flags.render_argv(changed)) == changed
    # a field its preset leaves alone is rendered against its default: --flag for True
    assert trainer_flags.render_argv(trainer_flags.with_values(TrainConfig(), {"static_graph": True}))[-1] == "--static-graph"
    assert dataclasses.asdict(trainer_flags.parse_args(["--preset", "baseline"])) == dataclasses.asdict(TrainConfig())
