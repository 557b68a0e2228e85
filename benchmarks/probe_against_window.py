#!/usr/bin/env python3
"""Does the communication probe's sync step time the step the window times?

    python benchmarks/probe_against_window.py [--seconds 90] [--default-heap]

The loss decomposition's unexplained rest is the window's mean step less the probe's sync step
and the data wait (scalerepro.analysis.tables.loss_decomposition): it is what the probe gets
wrong. This runs the README study's 2-rank ResNet-18 cell (the CPU study's trainer flags, gloo,
each rank on its own core) as blocks, each 16 window steps (the trainer's own step function on
the loader's batches, timed back to back as the window times them) and then the shipped probe
(``probes.exposed_communication`` with the study's 6 steps), until ``--seconds`` have passed, and
prints per block and over all blocks (window mean - probe sync) / window mean, in %; and the same
against the mean of the probe before and the probe after each window (what a probe on both sides
of the window would give).

``--default-heap`` leaves glibc malloc's thresholds as they are (scalerepro.common.host_heap is
skipped): the probe's saved copy of the run's state then moves them, and its steps fault pages in
that the window's do not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
# the CPU study's 2-rank strong cell of resnet18_cifar (config/config.yaml cpu_overrides, as planned)
TRAINER_FLAGS = [
    "--model",
    "resnet18_cifar",
    "--data",
    "synthetic",
    "--per-gpu-batch",
    "8",
    "--steps",
    "6",
    "--warmup-steps",
    "3",
    "--device",
    "cpu",
    "--preset",
    "optimised",
    "--compile",
    "none",
    "--synthetic-samples",
    "1024",
    "--no-eval",
    "--progress",
    "off",
]
WINDOW_STEPS, PROBE_STEPS = 16, 6


def robust_sd(values: list[float]) -> float:
    """The spread that one slow block does not set: 1.4826 x the median absolute deviation (the sd
    of normal data)."""
    middle = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - middle) for v in values) if len(values) > 1 else 0.0


def rank_main(seconds: float, default_heap: bool) -> None:
    from scalerepro.common import host_heap

    if not default_heap:
        host_heap.steady_heap()
    import torch

    from scalerepro.trainer_flags import parse_args
    from scalerepro.training import distributed, probes, run_setup
    from scalerepro.training.stop_request import StopRequest
    from scalerepro.training.trainer import Trainer

    config = parse_args(TRAINER_FLAGS)
    ctx = distributed.setup(config.parallel.device, config.parallel.dist_timeout_s)
    config = run_setup.resolve_config(config, ctx)
    run_setup.set_process_state(config, ctx)
    trainer = Trainer(config, ctx, StopRequest(), log=lambda *args, **kwargs: None)

    def batches():
        epoch = 0
        while True:
            yield from trainer.loader.epoch(epoch)
            epoch += 1

    source = batches()
    for _ in range(4):  # warm-up
        trainer.train_step(source, step_scheduler=False)
    probed = trainer.probed_run()
    started, gaps, windows, syncs = time.perf_counter(), [], [], []
    while True:
        elapsed = torch.tensor([time.perf_counter() - started])
        if distributed.all_reduce_max(ctx, elapsed).item() > seconds:
            break
        window = []
        for _ in range(WINDOW_STEPS):
            begin = time.perf_counter()
            trainer.train_step(source, step_scheduler=False)
            window.append(time.perf_counter() - begin)
        # the window's step: the slowest rank's mean, as the record's window_s / measured_steps
        window_s = distributed.all_reduce_max(ctx, torch.tensor([statistics.fmean(window)], dtype=torch.float64)).item()
        sync_s = probes.exposed_communication(probed, PROBE_STEPS)["sync_step_s"]
        gaps.append((window_s - sync_s) / window_s)
        windows.append(window_s)
        syncs.append(sync_s)
        if ctx.is_main:
            print(f"block {len(gaps):3d}: window {window_s * 1e3:6.1f} ms, probe sync {sync_s * 1e3:6.1f} ms: {gaps[-1]:+.1%}", flush=True)
    if ctx.is_main:
        spread = statistics.pstdev(gaps) if len(gaps) > 1 else 0.0
        heap = "glibc defaults" if default_heap else host_heap.SETTING
        print(
            f"(window - probe sync) / window over {len(gaps)} blocks: mean {statistics.fmean(gaps):+.1%}, sd {spread:.1%}, "
            f"robust sd {robust_sd(gaps):.1%}, largest {max(gaps, key=abs):+.1%}; heap: {heap}"
        )
        # A probe on both sides of the window: each window (from the second) against the mean of
        # the probe before it and the probe after it, the blocks alternating window, probe.
        straddled = [(windows[k] - (syncs[k - 1] + syncs[k]) / 2) / windows[k] for k in range(1, len(windows))]
        if len(straddled) > 1:
            print(
                f"the same against the mean of the probes before and after each window, over {len(straddled)} windows: "
                f"mean {statistics.fmean(straddled):+.1%}, sd {statistics.pstdev(straddled):.1%}, robust sd {robust_sd(straddled):.1%}, "
                f"largest {max(straddled, key=abs):+.1%}"
            )
    distributed.finish(ctx, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--default-heap", action="store_true")
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_rank:
        rank_main(args.seconds, args.default_heap)
        return
    command = [
        sys.executable,
        "-m",
        "scalerepro.launching.launch",
        "--nodes=1",
        "--ranks-per-node=2",
        "--cpus-per-node=2",
        "--name=probe-against-window",
        "--",
        str(Path(__file__).resolve()),
        "--as-rank",
        "--seconds",
        str(args.seconds),
        *(["--default-heap"] if args.default_heap else []),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "workflow"), os.environ.get("PYTHONPATH")]))}
    sys.exit(subprocess.run(command, env=env).returncode)


if __name__ == "__main__":
    main()
