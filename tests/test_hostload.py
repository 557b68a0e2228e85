"""The record says what else ran on the node during the measured window."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from scalerepro.training.train import main

from conftest import load_record

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow


@pytest.mark.measures  # what else runs on the machine is its figure: no other test may run beside it
def test_a_busy_neighbour_shows_in_the_record(tmp_path):
    # not a child of this process (which would count as the job): the shell that starts it exits
    started = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    burner = psutil.Process(int(started.stdout))
    burner_cpu_s, since = sum(burner.cpu_times()[:2]), time.monotonic()
    try:
        assert (
            main(
                [
                    "--model",
                    "cnn",
                    "--steps",
                    "40",
                    "--warmup-steps",
                    "2",
                    "--per-gpu-batch",
                    "32",
                    "--num-workers",
                    "0",
                    "--synthetic-samples",
                    "2048",
                    "--eval-samples",
                    "64",
                    "--record",
                    str(tmp_path / "r.json"),
                ]
            )
            == 0
        )
        # the share of this machine's CPUs the burner got while the job ran: a whole one where
        # nothing limits it, less under a CPU quota it shares with the job (0.15 of two at 0.3)
        burner_cpu_s = sum(burner.cpu_times()[:2]) - burner_cpu_s
        burner_share = burner_cpu_s / (time.monotonic() - since) / psutil.cpu_count()
    finally:
        burner.kill()
        burner.wait(timeout=10)
    activity = load_record(tmp_path / "r.json")["measurements"]["host_activity"]
    [node] = activity["nodes"]
    assert burner_share >= 0.05, f"the burner got {burner_share:.1%} of the CPUs: too little to show"
    # the record's peak share of other processes is at least half of what the burner averaged
    assert activity["other_cpu_fraction_max"] >= 0.5 * burner_share, (activity, burner_share)
    assert burner.pid in [p["pid"] for p in node["top_other_processes"]], activity
    assert activity["intra_op_threads_per_rank"] >= 1
