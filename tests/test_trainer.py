"""The trainer on one process: every model learns, every precision runs, checkpoints resume
exactly, signals checkpoint and exit with the distinct code, bad input is one line."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from scalerepro.analysis.tables import cell_tables, readers
from scalerepro.common import cpu_features
from scalerepro.common.exits import EXIT_PREEMPTED
from scalerepro.record import evidence
from scalerepro.record.read import from_document
from scalerepro.trainer_flags import TrainConfig, parse_args
from scalerepro.training import buckets, checkpoint_store, distributed, probes, run_setup, run_state
from scalerepro.training.stop_request import StopRequest
from scalerepro.training.train import main
from scalerepro.training.trainer import Trainer

from conftest import SHARED_MACHINE_TARGETS, clean_env, load_record, python_train

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

SMALL_TRANSFORMER = ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "2"]
# (model flags, steps, batch): small shapes that learn the synthetic task within the steps given.
LEARNING_RUNS = {
    "cnn": (["--model", "cnn"], 100, 32),
    "resnet18_cifar": (["--model", "resnet18_cifar", "--image-size", "16"], 30, 16),  # 16 px: a third of 32 px's time
    "resnet50": (["--model", "resnet50", "--image-size", "32", "--num-classes", "10", "--lr", "0.05"], 30, 16),
    "vit_b_16": (["--model", "vit_b_16", "--image-size", "32", "--num-classes", "10", "--lr", "3e-3", *SMALL_TRANSFORMER], 40, 16),
    "bert_base": (["--model", "bert_base", "--seq-len", "32", "--vocab-size", "64", "--lr", "1e-2", *SMALL_TRANSFORMER], 300, 32),
    "gpt2_small": (["--model", "gpt2_small", "--seq-len", "32", "--vocab-size", "128", "--lr", "3e-3", *SMALL_TRANSFORMER], 40, 16),
}


def _resolved(config: TrainConfig) -> tuple[TrainConfig, distributed.DistContext]:
    """A one-process CPU context and ``config`` resolved for it, with the process state set: what
    train.main does before it builds the Trainer."""
    ctx = distributed.setup("cpu", 60, environ={})
    config = run_setup.resolve_config(config, ctx)
    run_setup.set_process_state(config, ctx)
    return config, ctx


def small_run(tmp_path: Path, *extra: str, steps: int = 12, name: str = "run") -> list[str]:
    return [
        "--steps",
        str(steps),
        "--warmup-steps",
        "2",
        "--per-gpu-batch",
        "16",
        "--num-workers",
        "0",
        "--synthetic-samples",
        "1024",
        "--eval-samples",
        "128",
        "--log-interval",
        "4",
        "--record",
        str(tmp_path / f"{name}.json"),
        "--run-id",
        name,
        *extra,
    ]


@pytest.mark.parametrize("model", list(LEARNING_RUNS))
def test_loss_falls_on_synthetic_data(model, tmp_path):
    flags, steps, batch = LEARNING_RUNS[model]
    argv = [
        *flags,
        "--steps",
        str(steps),
        "--warmup-steps",
        "2",
        "--per-gpu-batch",
        str(batch),
        "--loader",
        "device",
        "--synthetic-samples",
        "8192",
        "--eval-samples",
        "256",
        "--log-interval",
        str(steps // 4),
        "--lr-warmup-steps",
        str(steps // 10),
        "--record",
        str(tmp_path / "r.json"),
    ]
    assert main(argv) == 0
    record = load_record(tmp_path / "r.json")
    losses = [entry["loss"] for entry in record["loss_log"]]
    assert losses[-1] < 0.9 * losses[0], f"{model} did not learn: interval losses {losses}"
    # (Held-out loss is not compared: after 30 steps BatchNorm's running statistics still lag.)
    assert record["history"][-1]["eval_accuracy"] >= 0
    m = record["measurements"]
    assert m["samples_per_s"] > 0 and m["measured_steps"] == steps - 2
    if record["model"]["task"] != "image_classification":
        assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * record["model"]["tokens_per_sample"])


def test_record_figures_follow_their_formulas(tmp_path):
    assert main(small_run(tmp_path, "--model", "cnn", "--grad-accum-steps", "2")) == 0
    r = load_record(tmp_path / "run.json")
    m = r["measurements"]
    assert r["batch"] == {"micro_batch": 16, "grad_accum_steps": 2, "samples_per_gpu_step": 32.0, "global_batch": 32}
    assert m["measured_samples"] == m["measured_steps"] * 32 == 10 * 32
    assert m["samples_per_s"] == pytest.approx(m["measured_samples"] / m["window_s"])
    assert m["step_time_s"]["p10"] <= m["step_time_s"]["median"] <= m["step_time_s"]["p90"]
    assert m["epoch_time_s"] == pytest.approx(r["steps"]["per_epoch"] * m["step_time_s"]["median"])
    assert r["steps"]["per_epoch"] == 1024 // (16 * 2)
    assert m["achieved_flops"] == pytest.approx(r["model"]["train_flops_per_sample"] * m["samples_per_s"])
    # No GPU here: nothing may be invented.
    assert m["mfu"] is None and m["peak"] is None and "no GPU" in m["peak_reason"]
    assert m["nvml"]["available"] is False and m["nvml"]["reason"] and m["energy_per_sample_j"] is None
    assert m["energy_per_sample_net_j"] is None and m["nvml"]["idle_power_w"] is None
    assert m["memory"]["rss_bytes_max"] > 0 and m["memory"]["allocated_bytes_max"] is None
    assert m["exposed_communication"]["fraction"] == 0.0  # one process: nothing to communicate
    assert m["data_stall_fraction"] == pytest.approx(m["data_wait_s"] / m["window_s"])  # over the window only
    assert r["parallel"]["world_size"] == 1 and r["parallel"]["launcher"] == "single"
    assert r["status"] == "ok" and r["git"].keys() >= {"commit", "dirty"}
    assert m["data_wait_clock"] == "host" and r["purpose"] == "measurement"
    # the analysis holds a record's figures against each other by the same formulas: a real record agrees
    assert evidence.problems(from_document(r).record) == []


def test_a_smoke_run_says_so_in_its_record(tmp_path):
    assert main(small_run(tmp_path, "--model", "cnn", "--purpose", "smoke", steps=4)) == 0
    record = load_record(tmp_path / "run.json")
    assert record["purpose"] == "smoke" and from_document(record).purpose_basis == "stated by the record"


# The first batch a DataLoader worker serves comes a second late: a warm-up wait longer than any
# CPU's window of two tiny steps, whatever the CPU's speed (the worker inherits the patch by fork).
LATE_FIRST_BATCH = """
import sys, time
from scalerepro.data import loaders
from scalerepro.training import train
serve, late = loaders._BatchedDataset.__getitems__, [1.0]
def first_late(self, keys):
    time.sleep(late.pop() if late else 0.0)
    return serve(self, keys)
loaders._BatchedDataset.__getitems__ = first_late
sys.exit(train.main(sys.argv[1:]))
"""


def test_data_stall_counts_the_measured_steps_only(tmp_path):
    # The stall fraction is over the measured steps (each step's wait is inside its own time), so
    # it cannot exceed 1; counting the warm-up waits too gave 1.7-1.8 (issue 14: 0.449 where the
    # in-window figure was 0.050). A process of its own with one DataLoader worker, as the workflow
    # runs it.
    argv = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        "2",
        "--steps",
        "4",
        "--warmup-steps",
        "2",
        "--num-workers",
        "1",
        "--synthetic-samples",
        "1024",
        "--no-eval",
        "--comm-probe-steps",
        "0",
        "--record",
        str(tmp_path / "r.json"),
    ]
    done = subprocess.run([sys.executable, "-c", LATE_FIRST_BATCH, *argv], env=clean_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    m = load_record(tmp_path / "r.json")["measurements"]
    assert m["data_wait_warmup_s"] >= 1.0 > m["window_s"]  # the case this test needs, set up
    assert 0 <= m["data_wait_s"] <= m["window_s"]
    assert m["data_stall_fraction"] == pytest.approx(m["data_wait_s"] / m["window_s"]) and m["data_stall_fraction"] <= 1


def test_peak_flops_override_gives_mfu(tmp_path):
    assert main(small_run(tmp_path, "--model", "cnn", "--peak-tflops", "0.5")) == 0
    m = load_record(tmp_path / "run.json")["measurements"]
    assert m["mfu"] == pytest.approx(m["achieved_flops"] / 0.5e12)
    assert m["peak"]["basis"] == "user override" and m["peak"]["flops_per_s"] == 0.5e12 and m["peak"]["clock_mhz"] is None


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_precisions_run(precision, tmp_path):
    # fp16 autocast on a CPU runs its kernels emulated, many times slower than the others: two
    # measured steps, no probe and a few held-out samples say what this test asks (the flag trains
    # and is recorded)
    argv = small_run(tmp_path, "--model", "cnn", "--precision", precision, "--channels-last", "--eval-samples", "16", "--bucket-probe-steps", "0", steps=4)
    assert main(argv) == 0
    record = load_record(tmp_path / "run.json")
    assert record["precision"]["name"] == precision and record["knobs"]["channels_last"] is True


@pytest.mark.parametrize("schedule", ["onecycle", "constant"])
def test_schedules_and_clipping(schedule, tmp_path):
    argv = small_run(
        tmp_path,
        "--model",
        "gpt2_small",
        "--seq-len",
        "16",
        "--vocab-size",
        "64",
        *SMALL_TRANSFORMER,
        "--lr-schedule",
        schedule,
        "--clip-grad-norm",
        "1.0",
        "--optimizer-impl",
        "fused",
    )
    assert main(argv) == 0
    assert load_record(tmp_path / "run.json")["optimizer"]["kind"] == "adamw"


def test_epochs_evaluate_each_epoch(tmp_path, prepared_cifar):
    argv = small_run(tmp_path, "--model", "cnn", "--data", str(prepared_cifar), "--loader", "device")
    argv[argv.index("--steps") : argv.index("--steps") + 2] = ["--epochs", "2"]
    assert main(argv) == 0
    record = load_record(tmp_path / "run.json")
    assert [(h["epoch"], h["complete"]) for h in record["history"]] == [(0, True), (1, True)]
    assert record["data"]["kind"] == "cifar10" and record["data"]["eval_samples"] == 128
    assert record["steps"]["completed"] == 2 * (2048 // 16)


def _params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_sigusr1_checkpoints_then_resume_is_bit_exact(tmp_path):
    common = small_run(tmp_path, "--model", "cnn", "--num-workers", "1", "--keep-final-checkpoint", steps=120)
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    # All three runs are separate processes with the same environment (one thread each): a
    # different thread count would change floating-point summation order, not the algorithm.
    assert python_train([*common, "--checkpoint-dir", str(reference)]).returncode == 0

    record_path = tmp_path / "interrupted.json"
    args = [*common, "--checkpoint-dir", str(interrupted), "--record", str(record_path)]
    process = subprocess.Popen(
        [sys.executable, "-m", "scalerepro.training.train", *args], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for line in process.stdout:  # wait until training is under way, then send the preemption warning
        if line.startswith("step 20/"):
            process.send_signal(signal.SIGUSR1)
            break
    output = process.stdout.read()
    assert process.wait(timeout=120) == EXIT_PREEMPTED, output
    assert "stopped by SIGUSR1" in output
    preempted = load_record(record_path)
    assert preempted["status"] == "preempted" and preempted["stop_signal"] == "SIGUSR1"
    stopped_at = preempted["steps"]["completed"]
    assert 20 <= stopped_at < 120
    assert Path(preempted["checkpoint"]).name == f"step-{stopped_at:08d}.pt"

    assert python_train([*args, "--resume"]).returncode == 0
    resumed = load_record(record_path)
    assert resumed["status"] == "ok" and resumed["steps"]["resumed_from"].endswith(f"step-{stopped_at:08d}.pt")
    expected, actual = _params(reference / "step-00000120.pt"), _params(interrupted / "step-00000120.pt")
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    uninterrupted = torch.load(reference / "step-00000120.pt", weights_only=True)["progress"]["history"]
    assert resumed["history"] == uninterrupted


def test_resume_passes_over_a_truncated_checkpoint_and_another_runs_naming_each(tmp_path):
    directory = tmp_path / "ckpt"
    common = small_run(tmp_path, "--model", "cnn", "--checkpoint-dir", str(directory), "--keep-final-checkpoint")
    assert main(common) == 0
    final = checkpoint_store.list_checkpoints(directory)[0]
    final.write_bytes(final.read_bytes()[:1000])  # a crash mid-copy
    assert main([*common, "--resume"]) == 0
    skipped = load_record(tmp_path / "run.json")["steps"]["checkpoints_skipped"]
    assert [s["path"] for s in skipped] == [str(final)] and skipped[0]["reason"].startswith("unreadable")
    result = python_train([*common, "--resume", "--per-gpu-batch", "8"])  # the finished run's final checkpoint
    assert result.returncode == 0, result.stderr
    assert "written by a different configuration (per_gpu_batch was 16, now 8" in result.stdout


def test_non_finite_loss_names_the_step(tmp_path):
    result = python_train(small_run(tmp_path, "--model", "cnn", "--lr", "1e9", "--lr-scaling", "none"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "non-finite at step" in result.stderr, result.stderr
    record = load_record(tmp_path / "run.json")
    assert record["status"] == "failed" and "non-finite" in record["error"]["message"]
    assert record["measurements_scope"] == "rank 0 only" and record["measurements"]["measured_steps"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--precision", "fp8"], "invalid choice: 'fp8'"),
        (["--per-gpu-batch", "0"], "--per-gpu-batch must be at least 1"),
        (["--steps", "5", "--epochs", "1"], "give --steps or --epochs, not both"),
        (["--model", "alexnet"], "unknown model 'alexnet'"),
        (["--model", "alexnet", "--data", "{cifar}"], "unknown model 'alexnet'"),
        (["--model", "resnet50", "--seq-len", "64"], "--seq-len"),
        (["--data", "/nonexistent/cifar10"], "dataset directory '/nonexistent/cifar10' does not exist"),
        (["--model", "gpt2_small", "--data", "{cifar}"], "needs an image model"),
        (["--warmup-steps", "50", "--steps", "10"], "--warmup-steps (50) must be smaller"),
    ],
)
def test_bad_input_is_one_line(flags, message, tmp_path, prepared_cifar, capsys):
    flags = [f.replace("{cifar}", str(prepared_cifar)) for f in flags]
    try:
        code = main(["--num-workers", "0", "--record", str(tmp_path / "r.json"), *flags])
    except SystemExit as exit_:  # argparse's exit for flags that do not parse
        code = exit_.code
    stderr = capsys.readouterr().err
    assert code == 2
    assert stderr.count("\n") == 1, stderr
    assert message in stderr
    if (tmp_path / "r.json").exists():  # errors found after the flags parse still leave a record
        assert load_record(tmp_path / "r.json")["status"] == "failed"


def test_missing_dataset_from_the_command_line(tmp_path):
    result = python_train(["--data", str(tmp_path / "absent"), "--record", str(tmp_path / "r.json")], timeout=60)
    assert result.returncode == 2
    assert result.stderr == (
        f"scalerepro.training.train: error: rank 0: dataset directory '{tmp_path / 'absent'}' does not exist: "
        f"run the workflow's fetch rule to prepare it (snakemake {tmp_path / 'absent'}) or train with --data synthetic\n"
    )
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "failed" and record["error"]["type"] == "DatasetError"


def test_help_documents_every_flag_with_its_default():
    result = python_train(["--help"], timeout=60)
    assert result.returncode == 0
    for flag in (
        "--model",
        "--data",
        "--per-gpu-batch",
        "--steps",
        "--epochs",
        "--warmup-steps",
        "--precision",
        "--record",
        "--checkpoint-dir",
        "--resume",
        "--seed",
        "--channels-last",
        "--compile",
        "--bucket-cap-mb",
        "--gradient-as-bucket-view",
        "--static-graph",
        "--optimizer-impl",
        "--loader",
        "--num-workers",
        "--pin-memory",
        "--persistent-workers",
        "--prefetch-factor",
    ):
        assert flag in result.stdout
    assert result.stdout.count("(default:") >= 50


def test_log_points_are_outside_the_timed_steps(tmp_path):
    """A log point reads the loss from the device, all-reduces and prints: host work that is not
    part of the step. With a log sink as slow as a congested shared file system (1 s a line),
    no timed step may contain it."""
    delay_s = 1.0
    lines: list[str] = []

    def slow_log(line: str) -> None:
        lines.append(line)
        time.sleep(delay_s)

    config = parse_args(
        small_run(
            tmp_path,
            "--model",
            "cnn",
            "--steps",
            "8",
            "--log-interval",
            "2",
            "--no-eval",
            "--comm-probe-steps",
            "0",
            "--bucket-probe-steps",
            "0",
            "--progress",
            "off",
        )
    )
    stop = StopRequest()
    try:
        trainer = Trainer(*_resolved(config), stop, log=slow_log)
        assert trainer.fit().status == "ok"
    finally:
        stop.restore()
    assert sum(line.startswith("step ") for line in lines) == 4  # steps 2, 4, 6, 8 logged
    durations = trainer.measured.timer.durations_s()
    # Steps 2, 4, 6, 8 end at a log point (durations[1], [3], ...); the first step also starts
    # the loader and allocator, so it is left out of the bound.
    assert len(durations) == 8 and max(durations[1:]) < delay_s, durations


def test_the_optimised_preset_resolves_once_explicit_flags_win_and_the_record_says_both(tmp_path):
    """--preset optimised on the CPU: bf16 autocast, channels_last and cudnn.benchmark (a CNN),
    the device loader, the fused optimizer; --compile none given explicitly wins over the
    preset's compile, and the record names the preset and that override."""
    assert main(small_run(tmp_path, "--model", "cnn", "--preset", "optimised", "--compile", "none")) == 0
    record = load_record(tmp_path / "run.json")
    knobs = record["knobs"]
    assert knobs["preset"] == "optimised" and knobs["preset_overrides"] == {"compile": "none"}
    from scalerepro.common import host_heap  # the rank fixed its malloc thresholds and the record says how

    assert knobs["host_heap"] == host_heap.SETTING and knobs["host_heap"].startswith(("glibc malloc", "left as it is"))
    # bf16 where this CPU runs it natively, else fp32 (scalerepro.common.cpu_features: the suite
    # also runs with oneDNN held below bf16, ONEDNN_MAX_CPU_ISA=AVX512_CORE)
    from scalerepro.common import cpu_features

    native, why = cpu_features.native_bf16()
    assert record["precision"]["name"] == ("bf16" if native else "fp32") and knobs["compile"] == "none", why
    assert knobs["channels_last"] and knobs["cudnn_benchmark"]
    assert knobs["loader"] == "device" and knobs["optimizer_impl"] == "fused"
    assert record["config"]["perf"]["preset"] == "optimised"
    losses = [entry["loss"] for entry in record["loss_log"]]
    assert all(loss == loss for loss in losses) and record["measurements"]["samples_per_s"] > 0

    # A transformer gets neither channels_last nor cudnn.benchmark; baseline is the defaults.
    gpt = parse_args(["--model", "gpt2_small", "--preset", "optimised"])
    assert (gpt.perf.precision, gpt.perf.compile, gpt.perf.channels_last, gpt.perf.cudnn_benchmark) == ("bf16", "default", False, False)
    assert parse_args(["--preset", "baseline"]) == parse_args([])


def test_the_optimised_preset_compiles_the_conv_nets_with_cuda_graphs_where_a_step_is_one_micro_batch_of_ddp():
    """The preset's CUDA graphs (compile mode reduce-overhead): the conv nets, whose short steps
    the host's launches bound; not the transformers; not under gradient accumulation (a replay
    would reuse the memory of the gradients being accumulated) nor FSDP/TP/PP; an explicit
    --compile wins, and the record's preset_overrides compare with the rule that applied."""
    from scalerepro.trainer_flags import preset_overrides

    compile_mode = lambda *flags: parse_args(["--preset", "optimised", *flags]).perf.compile  # noqa: E731
    for model in ("cnn", "resnet18_cifar", "resnet50"):
        assert compile_mode("--model", model) == "reduce-overhead", model
        assert compile_mode("--model", model, "--grad-accum-steps", "2") == "default", model
        assert compile_mode("--model", model, "--parallel", "fsdp") == "default", model
    for model in ("vit_b_16", "bert_base", "gpt2_small", "llama_1b"):
        assert compile_mode("--model", model) == "default", model
    assert compile_mode("--model", "resnet50", "--compile", "default") == "default"
    assert parse_args(["--model", "resnet50", "--preset", "baseline"]).perf.compile == "none"
    accumulating = parse_args(["--model", "resnet50", "--preset", "optimised", "--grad-accum-steps", "4"])
    assert preset_overrides(accumulating) == {}
    explicit = parse_args(["--model", "resnet50", "--preset", "optimised", "--compile", "default"])
    assert preset_overrides(explicit) == {"compile": "default"}


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_the_optimised_preset_trains_fp32_on_a_cpu_that_would_emulate_bf16_and_the_record_says_why(tmp_path, monkeypatch, device):
    """On a CPU the optimised preset trains bf16 only where it is native (scalerepro.common.cpu_features):
    with oneDNN held below AVX512_CORE_BF16 (the variable that hides native bf16 from it, as on a
    CPU without avx512_bf16) the run trains fp32, --device auto too, and the record says why; an
    explicit --precision bf16 (the ablation's bf16 cell) still trains bf16 and says it is emulated."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert main(small_run(tmp_path, "--model", "cnn", "--preset", "optimised", "--compile", "none", "--device", device, steps=6)) == 0
    record = load_record(tmp_path / "run.json")
    assert record["precision"]["name"] == "fp32" and record["knobs"]["preset_overrides"] == {"compile": "none"}
    assert record["config"]["parallel"]["device"] == "cpu"
    # the reason is this CPU's: the cap where the CPU has bf16 (hidden by it), its missing flags where not
    has_bf16_flags = bool(cpu_features.cpu_flags(Path("/proc/cpuinfo").read_text()) & {"avx512_bf16", "amx_bf16"})
    why = "ONEDNN_MAX_CPU_ISA=AVX512_CORE keeps oneDNN below AVX512_CORE_BF16" if has_bf16_flags else "this CPU has no native bf16"
    assert why in record["precision"]["reason"] and cpu_features.native_bf16()[1] in record["precision"]["reason"]
    assert (
        main(
            small_run(tmp_path, "--model", "cnn", "--preset", "optimised", "--compile", "none", "--device", device, "--precision", "bf16", steps=6, name="bf16")
        )
        == 0
    )
    lever = load_record(tmp_path / "bf16.json")
    assert lever["precision"]["name"] == "bf16" and lever["knobs"]["preset_overrides"] == {"compile": "none", "precision": "bf16"}
    assert lever["precision"]["reason"].startswith("bf16 (given explicitly)") and "slower than fp32" in lever["precision"]["reason"]
    # the analysis reads the reason, and the ablation's bf16 row says why it loses against fp32
    matrix = pd.DataFrame(
        [
            {
                "run_id": name,
                "study": "ablation",
                "model": "cnn",
                "gpus": 1,
                "nodes": 1,
                "gpus_per_node": 1,
                "repeat": 1,
                "variant": variant,
                "precision": precision,
                "per_gpu_batch": 16,
                "global_batch": 16,
                "bucket_cap_mb": 25.0,
                "runtime_min": 10,
                "record": str(tmp_path / f"{name}.json"),
                "rerun": "",
            }
            for name, variant, precision in (("run", "baseline", "fp32"), ("bf16", "bf16", "bf16"))
        ]
    )
    matrix.to_csv(tmp_path / "matrix.csv", index=False)
    runs, _, _ = readers.read_runs(readers.read_matrix(tmp_path / "matrix.csv"), evidence.quiet(SHARED_MACHINE_TARGETS))
    notes = cell_tables.ablation_table(runs).set_index("variant")["note"]
    assert notes["baseline"] == "" and f"bf16 emulated on this CPU: {why}" in notes["bf16"]
    # where bf16 is native (this machine, if its CPU has avx512_bf16 or AMX), the preset keeps it
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    native = cpu_features.native_bf16()[0]
    assert parse_args(["--model", "cnn", "--preset", "optimised", "--device", "cpu"]).perf.precision == ("bf16" if native else "fp32")
    assert parse_args(["--model", "cnn", "--preset", "optimised", "--device", "cuda"]).perf.precision == "bf16"


def test_native_bf16_reads_the_cpu_flags_and_the_onednn_cap():
    """On this machine's real /proc/cpuinfo: the flags decide, and ONEDNN_MAX_CPU_ISA (or the older
    DNNL_MAX_CPU_ISA) below AVX512_CORE_BF16 hides them; the same text without the bf16 flags (as an
    Intel Xeon without avx512_bf16 writes it) is not native whatever the cap."""
    text = Path("/proc/cpuinfo").read_text()
    flags = cpu_features.cpu_flags(text)
    has = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert cpu_features.native_bf16(text, {}, "x86_64")[0] is has
    assert cpu_features.native_bf16(text, {"ONEDNN_MAX_CPU_ISA": "avx2"}, "x86_64")[0] is False
    assert cpu_features.native_bf16(text, {"DNNL_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "x86_64")[0] is False
    assert cpu_features.native_bf16(text, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "x86_64")[0] is has
    stripped = "\n".join(line.replace(" avx512_bf16", "").replace(" amx_bf16", "") for line in text.splitlines())
    native, why = cpu_features.native_bf16(stripped, {}, "x86_64")
    assert native is False and "no native bf16" in why


def _run_state(trainer: Trainer) -> dict:
    """Everything a step changes, copied: model, optimizer, LR scheduler, loss scaler, RNG."""
    return copy.deepcopy(
        {
            "model": trainer.module.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "scaler": trainer.scaler.state_dict(),
            "rng": checkpoint_store.rng_state(),
        }
    )


def _differences(a: object, b: object, path: str = "") -> list[str]:
    """Paths where two nested states differ, tensors compared element by element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [path]
        return [d for key in a for d in _differences(a[key], b[key], f"{path}/{key}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}/{i}")]
    return [] if a == b else [path]


def test_the_trainer_keeps_the_config_it_was_given_and_refuses_one_left_open():
    """The flags a rank leaves open (--num-workers, --eval-samples) are decided before the
    Trainer (run_setup.resolve_config), which keeps the config it is given, the one the record
    holds; a config left open is refused, not rewritten."""
    config = parse_args(["--model", "cnn", "--steps", "4", "--warmup-steps", "1", "--per-gpu-batch", "8", "--synthetic-samples", "256", "--progress", "off"])
    assert config.data.num_workers is None and config.data.eval_samples is None
    stop = StopRequest()
    try:
        with pytest.raises(ValueError, match="resolved config"):
            Trainer(config, distributed.setup("cpu", 60, environ={}), stop, log=lambda line: None)
        resolved, ctx = _resolved(config)
        assert resolved.data.num_workers is not None and resolved.data.eval_samples is not None
        trainer = Trainer(resolved, ctx, stop, log=lambda line: None)
    finally:
        stop.restore()
    assert trainer.config is resolved


def test_the_bucket_probe_runs_the_trainers_step_and_leaves_the_run_as_it_was(tmp_path, monkeypatch):
    """The bucket probe times the trainer's own step function, handed to it (told each phase's
    end through its marks), not a copy of it, and takes real optimizer steps inside
    probes.preserved_state: after the probe the model, optimizer, scheduler, scaler and RNG
    states equal, tensor by tensor, those training left, though the probe's steps changed them
    (AdamW's moments, the weights, dropout's RNG draws). OneCycleLR raises on a step past the
    run's end: the probe leaves the scheduler alone."""
    config = parse_args(
        [
            "--model",
            "gpt2_small",
            "--seq-len",
            "32",
            "--vocab-size",
            "128",
            *SMALL_TRANSFORMER,
            "--dropout",
            "0.1",
            "--lr-schedule",
            "onecycle",
            "--steps",
            "4",
            "--warmup-steps",
            "1",
            "--per-gpu-batch",
            "8",
            "--num-workers",
            "0",
            "--synthetic-samples",
            "256",
            "--no-eval",
            "--comm-probe-steps",
            "0",
            "--bucket-probe-steps",
            "3",
            "--bucket-cap-mb",
            "0.02",
            "--progress",
            "off",
        ]
    )
    stop = StopRequest()
    try:
        trainer = Trainer(*_resolved(config), stop, log=lambda line: None)
        before: list[dict] = []  # the run's state as training left it, and after the probe
        after: list[dict] = []
        probe_steps: list[tuple[object, dict]] = []  # (the marks each step got, the state after it)
        probe_step, probe = trainer.probe_step, probes.backward_buckets

        def watched_probe(probed: probes.ProbedRun, steps: int) -> dict:
            before.append(_run_state(trainer))
            profile = probe(probed, steps)
            after.append(_run_state(trainer))
            return profile

        def watched_step(*args, **kwargs):
            loss = probe_step(*args, **kwargs)
            probe_steps.append((kwargs.get("marks"), _run_state(trainer)))
            return loss

        trainer.probe_step = watched_step
        monkeypatch.setattr(probes, "backward_buckets", watched_probe)
        assert trainer.fit().status == "ok"
    finally:
        stop.restore()
    profile = trainer.results().backward_buckets
    assert profile is not None and profile.reason is None and profile.steps == 3 and len(profile.buckets) >= 2, profile
    # the warm-up step and 3 timed ones, all the trainer's step, all marked by one recorder
    marks = {id(m) for m, _ in probe_steps}
    assert len(probe_steps) == 4 and len(marks) == 1 and isinstance(probe_steps[0][0], buckets.PhaseRecorder)
    changed = _differences(before[0], probe_steps[-1][1])
    for part in ("/model/", "/optimizer/state/", "/rng/torch"):
        assert any(path.startswith(part) for path in changed), f"the probe's steps never changed {part}: {changed[:5]}"
    assert _differences(before[0], after[0]) == []


# A probe after training that needs more memory than the measured steps (on an H100 the eager
# bucket probe raised llama_1b's peak from the 42.7 GiB training used to 65.0 GiB). On the CPU the
# peak is the process's RSS, which only grows: a probe touching more than the peak so far shows in
# it. Run in a child process, so that the test process's own history of RSS is not in the figure.
_PROBE_THAT_GROWS = """
import json, sys, torch
from scalerepro.telemetry import metrics
from scalerepro.training.train import main
from scalerepro.training import probes

original = probes.backward_buckets

def probe_that_grows(probed, steps):
    # written, so resident; as large as the peak so far and 512 MiB more, so the peak must rise
    block = torch.ones((metrics.peak_memory(probed.ctx.device)["rss_bytes"] + 512 * 2**20) // 4)
    after = metrics.peak_memory(probed.ctx.device)["rss_bytes"]
    del block
    print(json.dumps({"rss_after_probe": after}))
    return original(probed, steps)

probes.backward_buckets = probe_that_grows
sys.exit(main(sys.argv[1:]))
"""


def test_peak_memory_is_the_measured_windows_not_what_runs_after_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _PROBE_THAT_GROWS, *small_run(tmp_path, "--model", "cnn")], env=clean_env(), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    after_probe = next(json.loads(line)["rss_after_probe"] for line in done.stdout.splitlines() if line.startswith("{"))
    recorded = load_record(tmp_path / "run.json")["measurements"]["memory"]["rss_bytes_max"]
    assert recorded < after_probe - 512 * 2**20, (recorded, after_probe)


def test_fp32_is_ieee_and_tf32_is_tf32_in_matmuls_and_convolutions():
    # through torch's fp32_precision settings: the deprecated allow_tf32 switches leave the
    # convolutions' setting at "none" (seen with torch 2.13)
    from scalerepro.training.run_setup import set_precision

    before = torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    try:
        for precision, mode in (("tf32", "tf32"), ("fp32", "ieee"), ("bf16", "ieee"), ("tf32", "tf32"), ("fp16", "ieee")):
            set_precision(precision)
            assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == (mode, mode), precision
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = before


def test_mid_run_checkpoints_are_outside_the_energy_window(tmp_path, monkeypatch):
    from scalerepro.telemetry.nvml import NvmlSampler

    events: list[str] = []
    monkeypatch.setattr(NvmlSampler, "pause", lambda self: events.append("pause"))
    monkeypatch.setattr(NvmlSampler, "resume", lambda self: events.append("resume"))
    save = run_state.save
    monkeypatch.setattr(run_state, "save", lambda *args: (events.append("save"), save(*args))[1])
    argv = small_run(tmp_path, "--model", "cnn", "--no-eval", "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "4")
    assert main(argv) == 0
    assert events.count("save") == 3  # steps 4, 8, 12
    assert events == ["pause", "save", "resume"] * 3


@pytest.mark.parametrize("schedule", ["cosine", "onecycle"])
def test_a_window_shorter_than_min_window_s_is_lengthened_at_the_schedules_last_lr(schedule, tmp_path):
    # 4 measured steps of a small CNN take a few hundredths of a second here (half a second on a
    # loaded machine): far under 2 s. The extension steps leave the schedule alone (OneCycleLR
    # refuses a step past its end).
    argv = small_run(tmp_path, "--model", "cnn", "--no-eval", "--min-window-s", "2", "--lr-schedule", schedule, steps=6)
    assert main(argv) == 0
    record = load_record(tmp_path / "run.json")
    m, steps = record["measurements"], record["steps"]
    assert m["window_s"] >= 2 and steps["total"] > 6 and steps["scheduled"] == 6 and steps["completed"] == steps["total"]
    assert m["measured_steps"] == steps["total"] - 2


def test_a_window_of_fewer_than_min_window_steps_is_lengthened_to_them(tmp_path):
    """--min-window-steps holds a floor under the window where a longer warm-up or a short --steps
    leaves fewer measured steps (the CPU study's floor of 3, however slow a step): the run goes on,
    at the schedule's last learning rate, until it has them; a window that has them is left alone."""
    argv = small_run(tmp_path, "--model", "cnn", "--no-eval", "--min-window-steps", "5", steps=4)
    assert main(argv) == 0
    record = load_record(tmp_path / "run.json")
    assert record["measurements"]["measured_steps"] == 5
    assert record["steps"]["total"] == 7 and record["steps"]["scheduled"] == 4
    argv = small_run(tmp_path, "--model", "cnn", "--no-eval", "--min-window-steps", "2", steps=4, name="met")
    assert main(argv) == 0
    assert load_record(tmp_path / "met.json")["steps"]["total"] == 4


def test_the_step_timer_reads_each_steps_input_waits_on_its_clock_and_drops_those_outside_a_step():
    """The waits of a step are the gaps between the clock marks around each of its fetches, summed
    per step, the measured steps' apart from the warm-up's; a fetch outside an open step (a probe's,
    timed by its own timer) counts for no step. On the CPU the clock is the host's."""
    import time as clock

    from scalerepro.telemetry.metrics import StepTimer, window_stats

    timer = StepTimer(torch.device("cpu"))
    outside = timer.data_wait_started()
    timer.data_wait_ended(outside)
    assert outside is None
    # each step's fetches: what it sleeps, and the span the test's own clock reads around each
    # fetch's marks (a slow or throttled machine lengthens a sleep; the timer must read the wait
    # it got, which lies between the two)
    slept, spans = [], []
    for measured, fetches in [(False, (0.02,)), (True, (0.01, 0.03)), (True, ())]:
        timer.start()
        slept.append(sum(fetches))
        spans.append(0.0)
        for seconds in fetches:
            before = clock.perf_counter()
            started = timer.data_wait_started()
            clock.sleep(seconds)
            timer.data_wait_ended(started)
            spans[-1] += clock.perf_counter() - before
        timer.stop(0, measured)
    waits = timer.data_waits_s()
    assert len(waits) == 3 and waits[2] == 0.0
    for wait, low, high in zip(waits, slept, spans, strict=True):
        assert low <= wait <= high, (waits, slept, spans)
    stats = window_stats(timer)
    assert stats.data_wait_s == pytest.approx(waits[1]) and stats.warmup_data_wait_s == pytest.approx(waits[0])
    assert stats.seconds >= stats.data_wait_s  # a step's waits are inside its own bracket


def test_the_step_timer_reads_each_steps_allreduce_wait_from_the_last_launch_to_the_last_completion():
    """A step's wait for its gradient all-reduce runs from its last bucket's launch (the backward's
    compute is done) to the last completion, which gloo marks on a thread of its own; it is 0 where
    every bucket was done before the last launch, and None for a step that ran no all-reduce or
    left one unfinished. A launch outside an open step marks nothing."""
    import threading
    import time as clock

    from scalerepro.telemetry.metrics import StepTimer

    timer = StepTimer(torch.device("cpu"))
    assert timer.allreduce_launched() is None

    def complete_after(marks, seconds):
        clock.sleep(seconds)
        marks.completed.append(timer.clock.now())

    # step 0: two buckets, 0.03 s apart; the first completes at once, the last 0.05 s after its launch
    timer.start()
    first = timer.allreduce_launched()
    first.completed.append(timer.clock.now())
    clock.sleep(0.03)
    last = timer.allreduce_launched()
    assert last is first  # one step, one set of marks
    finishing = threading.Thread(target=complete_after, args=(last, 0.05))
    finishing.start()
    finishing.join()
    timer.stop(0, True)
    # step 1: its only bucket completed before the step's last launch cannot make a wait below 0
    timer.start()
    marks = timer.allreduce_launched()
    marks.completed.append(marks.launched[0] - 0.01)
    timer.stop(0, True)
    # step 2: no all-reduce (a no-sync step); step 3: one launched and never completed
    for launched in (False, True):
        timer.start()
        if launched:
            timer.allreduce_launched()
        timer.stop(0, True)
    timer.durations_s()
    waits = timer.allreduce_waits_s()
    assert waits[0] == pytest.approx(0.05, abs=0.02) and waits[1] == 0.0 and waits[2] is None and waits[3] is None


def test_the_window_split_takes_the_exposed_wait_from_the_last_rank_and_the_rest_as_the_wait_for_it():
    """Rank 1 finishes each backward 20 ms after rank 0, and the all-reduce then takes 5 ms: rank 0
    waits 25 ms, rank 1 5 ms. The exposed wait is the last rank's, the typical rank's straggler wait
    the mean less it, and compute is each step less its two waits."""
    from scalerepro.training.allreduce_timing import window_split

    ranks = [
        {"step": [0.100, 0.100], "data": [0.002, 0.0], "allreduce": [0.025, 0.025]},
        {"step": [0.100, 0.100], "data": [0.0, 0.002], "allreduce": [0.005, 0.005]},
    ]
    split = window_split(ranks, "host")
    assert split["steps"] == 2 and split["reason"] is None and split["clock"] == "host"
    assert split["exposed_allreduce_wait_s"] == pytest.approx(0.005)
    assert split["straggler_wait_s"] == pytest.approx(0.010)
    assert split["data_wait_rank_mean_s"] == pytest.approx(0.001)
    assert split["compute_rank_mean_s"] == pytest.approx(0.100 - 0.001 - 0.015)
    parts = split["compute_rank_mean_s"] + split["straggler_wait_s"] + split["exposed_allreduce_wait_s"] + split["data_wait_rank_mean_s"]
    assert parts == pytest.approx(split["step_rank_mean_s"])
    assert window_split([ranks[0], {**ranks[1], "step": [0.1]}], "host")["reason"] == "the ranks measured different numbers of steps"
    unfinished = {**ranks[1], "allreduce": [0.005, None]}
    assert window_split([ranks[0], unfinished], "host")["reason"] == "a measured step ran no timed all-reduce"


def test_warm_up_probes_and_evaluation_are_sized_by_time_with_their_floors(tmp_path):
    """The CPU study's time outside its windows is bounded by time, each with its reason in the record:
    the warm-up goes on until two steps agree (at most --warmup-max-steps), the probes take as many
    steps as fit --probe-budget-s but never fewer than their floors, the evaluation stops past
    --eval-budget-s after at least one batch."""

    def run(name: str, *extra: str) -> dict:
        assert main(small_run(tmp_path, "--model", "cnn", "--bucket-probe-steps", "2", *extra, name=name)) == 0
        return load_record(tmp_path / f"{name}.json")

    never = run("never-settles", "--warmup-max-steps", "4", "--warmup-settle", "0")
    assert never["steps"]["warmup"] == 4 and never["steps"]["warmup_reason"].startswith("4 steps: the most --warmup-max-steps allows")
    settled = run("settles", "--warmup-max-steps", "4", "--warmup-settle", "100")
    assert settled["steps"]["warmup"] == 2 and settled["steps"]["warmup_reason"].startswith("2 steps: settled within 10000 %")
    assert settled["history"][-1]["eval_samples"] == 128 and settled["measurements"]["probe_budget"] is None
    bounded = run("bounded", "--eval-budget-s", "1e-9", "--probe-budget-s", "1e-9")
    assert bounded["history"][-1]["eval_samples"] == 16  # one batch of 16, then past the budget
    probe = bounded["measurements"]["probe_budget"]
    assert (probe["comm_probe_steps"], probe["bucket_probe_steps"]) == (0, probes.BUCKET_PROBE_FLOOR) and "over the probes' 1e-09 s" in probe["reason"]
    roomy = run("roomy", "--probe-budget-s", "60")
    assert roomy["measurements"]["probe_budget"]["bucket_probe_steps"] == 2
