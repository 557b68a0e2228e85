#!/usr/bin/env python3
"""Calibration: is a study's figure what a bare training loop on the same cores measures?

    python benchmarks/calibration.py [--repeats 3] [--min-window-s 3]

One cell of the CPU study (ResNet-18 at CIFAR shapes, synthetic images, bf16 autocast,
channels_last, fused SGD with Nesterov momentum, 8 samples per rank per micro-batch and a global
batch of 16: at 1 rank two accumulated micro-batches, at 2 ranks one each), at 1 and 2 ranks,
measured three ways, each on ranks pinned one to a core with one thread:

  bare     a DDP loop written out here: no scalerepro code but the model's definition and the
           malloc thresholds every rank sets (scalerepro.common.host_heap: a setting of the
           process, so that both loops allocate alike); random batches made before the loop;
           perf_counter around each step (the CPU is synchronous)
  trainer  python -m scalerepro.launching.launch ... -- -m scalerepro.training.train <the study job's own flags>,
           outside Snakemake
  study    the same job run by Snakemake (snakemake --forcerun <its record>) in a copy of the
           workflow, with the environment Snakemake gives its jobs

Each way's figure: samples/s = global samples of the measured steps / their summed step times
(slowest rank). Repeats interleave the ways (bare, trainer, study, then again), so a drift of
the machine falls on all of them. Printed: each way's median (min-max, n) at each rank count, the
ratios the goals are about, and strong efficiency E(2) = samples/s at 2 ranks / (2 x at 1 rank).

Goals: trainer >= 0.97 x bare; study >= 0.95 x trainer; the study's E(2) within 10 % of bare's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
IGNORE = shutil.ignore_patterns(".venv", "results", ".git", ".snakemake", "__pycache__", "*.egg-info", ".pytest_cache", ".whl", ".gl")
PER_RANK_BATCH, GLOBAL_BATCH, WARMUP = 8, 16, 3
# The cell as a study: the strong-scaling cells of resnet18_cifar at 1 and 2 ranks, nothing else.
STUDY = {
    "study_name": "calibration",
    "device": "cpu",
    "data": "synthetic",
    "gpus_per_node": 2,
    "repeats": 1,
    "warmup_steps": WARMUP,
    "trainer_args": [
        "--preset",
        "optimised",
        "--compile",
        "none",
        "--synthetic-samples",
        "1024",
        "--no-eval",
        "--comm-probe-steps",
        "0",
        "--bucket-probe-steps",
        "0",
    ],
    "models": {"resnet18_cifar": {"per_gpu_batch": PER_RANK_BATCH, "args": []}},
    "scaling": {
        "models": ["resnet18_cifar"],
        "gpu_counts": [1, 2],
        "max_gpus": 2,
        "predict_gpus": [4],
        "strong": {"enabled": True, "global_batch": {"resnet18_cifar": GLOBAL_BATCH}},
        "weak": {"enabled": False},
    },
    "sensitivity": {"enabled": False},
    "ablation": {"enabled": False},
    "parallelism": {"enabled": False},
    "reproduce": {"enabled": False},
    "communication": {"enabled": False},
    "profiling": {"enabled": False},
    "resources": {"cpus_per_gpu": 1, "mem_mb_per_gpu": 2000, "runtime_min": 10, "exclusive": True},
}


# ---- the bare loop ----------------------------------------------------------------------------


def bare_rank(rank: int, world: int, port: int, steps_min: int, min_window_s: float, out: str) -> None:
    """One rank of the bare loop: pinned to core ``rank``, one thread, DDP over gloo when world > 1."""
    core = sorted(os.sched_getaffinity(0))[rank]
    os.sched_setaffinity(0, {core})
    from scalerepro.common import host_heap

    host_heap.steady_heap()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from scalerepro.models import registry

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = registry.build(registry.resolve("resnet18_cifar")).to(memory_format=torch.channels_last)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    lr = 0.1 * GLOBAL_BATCH / 256  # the trainer's linear scaling of 0.1 per 256 images
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}], lr=lr, momentum=0.9, nesterov=True, fused=True
    )
    accumulate = GLOBAL_BATCH // (PER_RANK_BATCH * world)
    batches = [(torch.randn(PER_RANK_BATCH, 3, 32, 32).to(memory_format=torch.channels_last), torch.randint(0, 10, (PER_RANK_BATCH,))) for _ in range(8)]
    times: list[float] = []
    step = 0
    while True:
        started = time.perf_counter()
        for micro in range(accumulate):
            inputs, targets = batches[(step * accumulate + micro) % len(batches)]
            sync = world == 1 or micro == accumulate - 1
            # micro-batches before the last accumulate without DDP's all-reduce, as the trainer's
            with wrapped.no_sync() if not sync else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(wrapped(inputs), targets) / accumulate
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - started
        step += 1
        if step > WARMUP:
            times.append(elapsed)
        # every rank stops after the same step: the slowest rank's window decides
        done = torch.tensor([float(len(times) >= steps_min and sum(times) >= min_window_s)])
        if world > 1:
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            break
    window = torch.tensor([sum(times)], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(window, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps({"samples_per_s": GLOBAL_BATCH * len(times) / window.item(), "steps": len(times), "window_s": window.item()}))


def run_bare(world: int, steps_min: int, min_window_s: float, scratch: Path) -> float:
    out = scratch / f"bare_{world}.json"
    out.unlink(missing_ok=True)
    port = 29500 + os.getpid() % 1000
    # gloo on loopback, as scalerepro.launching.launch runs local ranks (the host name may resolve elsewhere)
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow"), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    # leaves with os._exit, as the trainer does: tearing down a gloo group at exit can hang a rank
    code = f"import os, sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import calibration as c; c.bare_rank(int(sys.argv[1]), {world}, {port}, {steps_min}, {min_window_s}, {str(out)!r}); os._exit(0)"
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank)], env=env) for rank in range(world)]
    if any(rank.wait() != 0 for rank in ranks):
        raise SystemExit(f"the bare loop at {world} rank(s) failed")
    return json.loads(out.read_text())["samples_per_s"]


# ---- the trainer alone, and the study's job ----------------------------------------------------


def _plan(workdir: Path):
    from scalerepro.planning import plan

    config = yaml.safe_load((workdir / "config/config.yaml").read_text())
    config.update(yaml.safe_load((workdir / "calibration.yaml").read_text()))
    return plan.load(
        config,
        schema=workdir / "workflow/schemas/config.schema.yaml",
        references=workdir / "config/references.yaml",
        executor=None,
        in_job=False,
        local_gpu_names=[],
    )


def run_trainer(workdir: Path, run, the_plan) -> float:
    """The study job's own launcher and trainer flags, started as a user would, outside Snakemake."""
    record = workdir / "trainer" / f"{run.run_id}.json"
    record.parent.mkdir(exist_ok=True)
    args = the_plan.study.trainer_args(run, str(record), str(workdir / "trainer" / "checkpoints"))
    launch = the_plan.launch_args(run.ranks_per_node, run.nodes, run.run_id)
    env = {**os.environ, "PYTHONPATH": str(workdir / "workflow")}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "scalerepro.launching.launch", *launch, "--", "-m", "scalerepro.training.train", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"the trainer alone failed:\n{done.stderr[-3000:]}")
    return json.loads(record.read_text())["measurements"]["samples_per_s"]


def run_study_job(workdir: Path, run) -> float:
    record = f"results/runs/{run.run_id}/record.json"
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "calibration.yaml", "--forcerun", record, record],
        cwd=workdir,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"the study's job failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads((workdir / record).read_text())["measurements"]["samples_per_s"]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f}, n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-window-s", type=float, default=3.0, help="each way measures at least this long")
    parser.add_argument("--min-steps", type=int, default=5, help="and at least this many steps")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("calibration: needs two cores (ranks are pinned one to a core)")
    with tempfile.TemporaryDirectory(prefix="scalerepro-calibration-") as scratch:
        workdir = Path(scratch) / "workflow"
        shutil.copytree(REPO, workdir, ignore=IGNORE)
        study = {**STUDY, "steps": WARMUP + args.min_steps, "trainer_args": [*STUDY["trainer_args"], "--min-window-s", str(args.min_window_s)]}
        (workdir / "calibration.yaml").write_text(yaml.safe_dump(study))
        the_plan = _plan(workdir)
        runs = sorted(the_plan.study.runs.values(), key=lambda run: run.gpus)
        figures = {(way, run.gpus): [] for way in ("bare", "trainer", "study") for run in runs}
        print(
            f"calibration on {len(os.sched_getaffinity(0))} cores | {time.strftime('%Y-%m-%d %H:%M %Z')} | "
            f"resnet18_cifar, global batch {GLOBAL_BATCH}, >= {args.min_steps} steps and >= {args.min_window_s:g} s a window",
            flush=True,
        )
        for repeat in range(1, args.repeats + 1):
            for run in runs:
                figures["bare", run.gpus].append(run_bare(run.gpus, args.min_steps, args.min_window_s, Path(scratch)))
                figures["trainer", run.gpus].append(run_trainer(workdir, run, the_plan))
                figures["study", run.gpus].append(run_study_job(workdir, run))
                print(
                    f"  repeat {repeat}, {run.gpus} rank(s): bare {figures['bare', run.gpus][-1]:.1f}, trainer "
                    f"{figures['trainer', run.gpus][-1]:.1f}, study {figures['study', run.gpus][-1]:.1f} samples/s",
                    flush=True,
                )
    print(f"\n{'way':8s} {'1 rank, samples/s':>30s} {'2 ranks, samples/s':>30s} {'E(2)':>6s}")
    efficiency = {}
    for way in ("bare", "trainer", "study"):
        one, two = figures[way, 1], figures[way, 2]
        efficiency[way] = statistics.median(two) / (2 * statistics.median(one))
        print(f"{way:8s} {spread(one):>30s} {spread(two):>30s} {efficiency[way]:6.2f}")
    verdicts = []
    for gpus in (1, 2):
        trainer_vs_bare = statistics.median(figures["trainer", gpus]) / statistics.median(figures["bare", gpus])
        study_vs_trainer = statistics.median(figures["study", gpus]) / statistics.median(figures["trainer", gpus])
        verdicts += [
            (f"trainer / bare, {gpus} rank(s)", trainer_vs_bare, trainer_vs_bare >= 0.97, ">= 0.97"),
            (f"study / trainer, {gpus} rank(s)", study_vs_trainer, study_vs_trainer >= 0.95, ">= 0.95"),
        ]
    gap = efficiency["study"] / efficiency["bare"] - 1
    verdicts.append(("E(2) study / E(2) bare - 1", gap, abs(gap) <= 0.10, "within +-0.10"))
    for what, value, met, goal in verdicts:
        print(
            f"{what:32s} {value:+.3f}  (goal {goal}: {'met' if met else 'MISSED'})"
            if "- 1" in what
            else f"{what:32s} {value:.3f}  (goal {goal}: {'met' if met else 'MISSED'})"
        )
    print("ratios of medians; each way's spread above (min-max over the interleaved repeats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
