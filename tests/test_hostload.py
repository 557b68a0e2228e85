"""The record says what else ran on the node during the measured window."""

from __future__ import annotations

import subprocess
import sys

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
    finally:
        burner.kill()
        burner.wait(timeout=10)
    activity = load_record(tmp_path / "r.json")["measurements"]["host_activity"]
    [node] = activity["nodes"]
    # the burner holds one of this machine's CPUs for the whole window
    assert activity["other_cpu_fraction_max"] >= 0.5 / node["logical_cpus"], activity
    assert burner.pid in [p["pid"] for p in node["top_other_processes"]], activity
    assert activity["intra_op_threads_per_rank"] >= 1
