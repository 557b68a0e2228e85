"""The trainer under torch.compile: the loss is compiled with the model, the loss value is the
eager one, and the bucket probe of a compiled run still sees gradients ready during the backward.
One eager and one compiled run of a tiny GPT-2 (a cold compile costs ~25 s on two cores)."""

from __future__ import annotations

import pytest
import torch

from scalerepro.trainer_flags import parse_args
from scalerepro.training import distributed, run_setup
from scalerepro.training.objective import ModelWithLoss, cross_entropy
from scalerepro.training.stop_request import StopRequest
from scalerepro.training.trainer import Trainer

from conftest import load_record, python_train

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

TINY_GPT2 = ["--model", "gpt2_small", "--seq-len", "32", "--vocab-size", "128", "--num-layers", "2", "--hidden-size", "64", "--num-heads", "2"]


def _args(tmp_path, name: str, compile_mode: str) -> list[str]:
    return [
        *TINY_GPT2,
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--per-gpu-batch",
        "8",
        "--loader",
        "device",
        "--synthetic-samples",
        "512",
        "--no-eval",
        "--log-interval",
        "1",
        "--bucket-cap-mb",
        "0.02",
        "--bucket-probe-steps",
        "3",
        "--comm-probe-steps",
        "0",
        "--compile",
        compile_mode,
        "--progress",
        "off",
        "--record",
        str(tmp_path / f"{name}.json"),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("compiled")
    records = {}
    for name, mode in (("eager", "none"), ("compiled", "default")):
        result = python_train(_args(tmp_path, name, mode), timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        records[name] = load_record(tmp_path / f"{name}.json")
    return records


def test_what_torch_compile_wraps_returns_the_loss(tmp_path):
    """The compiled callable is the model with its loss (not the model alone, whose logits the
    loss then read eagerly): called as it is in a step, it returns the scalar loss."""
    config = parse_args(_args(tmp_path, "wrap", "default"))
    ctx = distributed.setup("cpu", 60, environ={})
    stop = StopRequest()
    try:
        config = run_setup.resolve_config(config, ctx)
        run_setup.set_process_state(config, ctx)
        trainer = Trainer(config, ctx, stop, log=lambda *a: None)
    finally:
        stop.restore()
    compiled_target = trainer.model._orig_mod  # what torch.compile traces; not compiled until called
    assert isinstance(compiled_target, ModelWithLoss) and compiled_target.model is trainer.module
    inputs, targets = next(trainer.loader.epoch(0))
    loss = compiled_target(inputs, targets)
    assert loss.dim() == 0
    assert torch.equal(loss, cross_entropy(trainer.module(*inputs), targets, 0.0))


def test_the_compiled_loss_is_the_eager_loss(runs):
    eager = [entry["loss"] for entry in runs["eager"]["loss_log"]]
    compiled = [entry["loss"] for entry in runs["compiled"]["loss_log"]]
    assert len(eager) == len(compiled) == 6
    assert compiled == pytest.approx(eager, rel=1e-5)
    assert runs["compiled"]["knobs"]["compile"] == "default"


def test_the_bucket_probe_of_a_compiled_run_sees_buckets_ready_during_the_backward(runs):
    """A compiled backward (one graph without DDP) accumulates every gradient at its end; the
    probe times the eager model, so the first bucket is ready early, as in an eager run."""
    for name in ("eager", "compiled"):
        probe = runs[name]["measurements"]["backward_buckets"]
        assert probe["reason"] is None and len(probe["buckets"]) >= 4, probe
        fractions = [bucket["ready_s"] / probe["backward_s"] for bucket in probe["buckets"]]
        assert fractions[0] < 0.5, f"{name}: first bucket ready at {fractions[0]:.2f} of the backward ({fractions})"
        assert fractions == sorted(fractions)
