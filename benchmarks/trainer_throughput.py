#!/usr/bin/env python3
"""Trainer throughput: baseline vs optimised configuration of every model, on the device found.

    python benchmarks/trainer_throughput.py                     # every model, this machine's device
    python benchmarks/trainer_throughput.py --models resnet50 gpt2_small --steps 60
    python benchmarks/trainer_throughput.py --models resnet50 --presets optimised --flags=--precision=fp16 --records DIR

Each configuration is a real ``python -m scalerepro.training.train`` process writing a run record; the
table is read from those records. The two configurations are the trainer's presets
(``scalerepro.trainer_flags.PRESETS``), the ones the study uses: ``--preset baseline`` = fp32 (TF32
off), eager, DataLoader with worker processes, foreach optimizer; ``--preset optimised`` = bf16
autocast, channels_last and cudnn.benchmark (CNNs), torch.compile, the device-resident loader
and the fused optimizer. Same model, shapes, batch and steps. ``--flags`` adds trainer flags to
every configuration (one lever changed against the preset: ``--flags=--precision=fp16``), and
``--records DIR`` keeps each run's record and log there.

    ratio = optimised samples/s / baseline samples/s
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Workload:
    model: str
    batch: dict[str, int]  # per-rank batch by device type
    extra: tuple[str, ...] = ()


# Full-size models. Batches: on a GPU, the per-GPU batches of the usual recipes; on a CPU, small
# enough that a step takes seconds, not minutes.
WORKLOADS = (
    Workload("cnn", {"cuda": 512, "cpu": 128}),
    Workload("resnet18_cifar", {"cuda": 512, "cpu": 32}),
    Workload("resnet50", {"cuda": 256, "cpu": 8}),
    Workload("vit_b_16", {"cuda": 128, "cpu": 4}),
    Workload("bert_base", {"cuda": 256, "cpu": 8}),
    Workload("gpt2_small", {"cuda": 32, "cpu": 1}),
    # Llama 3.2 1B shapes at MPT-1B's sequence length (llm-foundry's H100 table trains at 2048),
    # not Llama 3's 8192: at 8 x 2048 tokens the unsharded AdamW state (16 bytes a parameter,
    # ~20 GB) and the activations fit one 80 GB GPU without activation checkpointing.
    Workload("llama_1b", {"cuda": 8, "cpu": 1}, ("--seq-len", "2048")),
)

PRESETS = ("baseline", "optimised")


def detect_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "CPU")
    return f"{cpu} ({len(os.sched_getaffinity(0))} cores)"


def run_one(
    workload: Workload, device: str, flags: tuple[str, ...], steps: int, warmup: int, workers: int, out: Path, log: Path, batch: int | None = None
) -> dict:
    batch = batch or workload.batch[device]
    command = [
        sys.executable,
        "-m",
        "scalerepro.training.train",
        "--model",
        workload.model,
        "--per-gpu-batch",
        str(batch),
        "--steps",
        str(steps),
        "--warmup-steps",
        str(warmup),
        "--no-eval",
        "--comm-probe-steps",
        "0",
        "--synthetic-samples",
        str(max(batch * (steps + 1), 1024)),
        "--num-workers",
        str(workers),
        "--log-interval",
        str(max(steps // 4, 1)),
        "--record",
        str(out),
        *workload.extra,
        *flags,
    ]
    started = time.monotonic()
    with open(log, "w") as stream:
        result = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, cwd=REPO)
    record = json.loads(out.read_text()) if out.exists() else None
    if result.returncode != 0 or record is None:
        message = record["error"]["message"] if record and record.get("error") else f"exit {result.returncode}, see {log}"
        return {"ok": False, "error": message, "wall_s": time.monotonic() - started, "command": command}
    m = record["measurements"]
    memory = m["memory"]["allocated_bytes_max"] or m["memory"]["rss_bytes_max"]
    compiled = m.get("compile") or {}  # records before the compile facts lack them
    kernels = m.get("step_kernels") or {}
    return {
        "ok": True,
        "samples_per_s": m["samples_per_s"],
        "tokens_per_s": m["tokens_per_s"],
        "mfu": m["mfu"],
        "peak_memory_bytes": memory,
        "memory_kind": "allocated" if m["memory"]["allocated_bytes_max"] else "RSS",
        "step_median_s": m["step_time_s"]["median"],
        "step_p10_s": m["step_time_s"]["p10"],
        "step_p90_s": m["step_time_s"]["p90"],
        "measured_steps": m["measured_steps"],
        "batch": batch,
        # the process's first step (its compile, cold or from --compile-cache) and what the cache held
        "first_step_s": compiled.get("first_step_s"),
        "compile_scope": compiled.get("scope"),
        "compile_cache_loaded": compiled.get("cache_loaded"),
        # --kernel-profile-steps: the GPU's idle share between kernels and the longest kernels
        "idle_fraction": kernels.get("idle_fraction"),
        "profiled_steps": kernels.get("steps"),
        "top_kernels": (kernels.get("kernels") or [])[:3],
        "wall_s": time.monotonic() - started,
        "command": command,
    }


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[w.model for w in WORKLOADS], choices=[w.model for w in WORKLOADS])
    parser.add_argument("--steps", type=int, help="steps per configuration (default 60 on a GPU, 8 on a CPU)")
    parser.add_argument("--warmup-steps", type=int, help="excluded steps (default 15 on a GPU, 3 on a CPU)")
    parser.add_argument("--num-workers", type=int, default=min(8, len(os.sched_getaffinity(0))), help="DataLoader workers of the baseline")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS, help="configurations to run (default: both)")
    parser.add_argument("--flags", default="", help="trainer flags added to every configuration, e.g. --flags='--precision fp16'")
    parser.add_argument("--per-gpu-batch", type=int, help="per-rank batch instead of the workload's")
    parser.add_argument("--records", type=Path, help="keep each run's record and log in this directory")
    parser.add_argument("--label", default="", help="appended to each record's name (MODEL-PRESET-LABEL.json), e.g. the lever --flags changes")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    extra = tuple(shlex.split(args.flags))

    device = detect_device()
    steps = args.steps or (60 if device == "cuda" else 8)
    warmup = args.warmup_steps if args.warmup_steps is not None else (15 if device == "cuda" else 3)
    print(f"device: {device_name(device)} | steps {steps} (warm-up {warmup} excluded) | {time.strftime('%Y-%m-%d %H:%M %Z')}", flush=True)
    header = f"{'model':<15} {'config':<10} {'batch':>5} {'samples/s':>11} {'tokens/s':>11} {'MFU':>7} {'peak mem GiB':>12} {'step ms':>9} {'ratio':>6}"
    print(header + "\n" + "-" * len(header), flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="scalerepro-bench-") as scratch:
        where = args.records or Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        for workload in (w for w in WORKLOADS if w.model in args.models):
            pair = {}
            for config in args.presets:
                name = "-".join(filter(None, (workload.model, config, args.label)))
                flags = ("--preset", config, *extra)
                pair[config] = run_one(
                    workload, device, flags, steps, warmup, args.num_workers, where / f"{name}.json", where / f"{name}.log", args.per_gpu_batch
                )
                r = pair[config]
                if not r["ok"]:
                    print(f"{workload.model:<15} {config:<10} failed: {r['error']}", flush=True)
                    continue
                ratio = ""
                if config == "optimised" and pair.get("baseline", {}).get("ok"):
                    ratio = f"{r['samples_per_s'] / pair['baseline']['samples_per_s']:.2f}x"
                print(
                    f"{workload.model:<15} {config:<10} {r['batch']:>5} {fmt(r['samples_per_s'], ',.1f'):>11} "
                    f"{fmt(r['tokens_per_s'], ',.0f'):>11} {fmt(r['mfu'] and 100 * r['mfu'], '.1f') + ('%' if r['mfu'] else ''):>7} "
                    f"{fmt(r['peak_memory_bytes'] / 2**30, '.2f') + (' rss' if r['memory_kind'] == 'RSS' else ''):>12} "
                    f"{fmt(r['step_median_s'] * 1e3, '.1f'):>9} {ratio:>6}",
                    flush=True,
                )
            results[workload.model] = pair
    print("MFU = model FLOPs/s / (devices x dense peak of the precision); n/a where no peak is known (CPUs).")
    if args.json:
        document = {"device": device_name(device), "steps": steps, "warmup": warmup, "flags": list(extra), "results": results}
        args.json.write_text(json.dumps(document, indent=2))
    return 0 if all(r["ok"] for pair in results.values() for r in pair.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
