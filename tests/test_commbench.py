"""The all-reduce benchmark: its bandwidths against a real nccl-tests log, and a real 2-rank
gloo run on the CPU recording both its own time and nccl-tests' time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scalerepro.training import commbench

from conftest import clean_env

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

# all_reduce_perf on 16 H100 ranks (2 nodes x 8), out-of-place columns: size (B), time (us),
# algbw, busbw (GB/s); lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result, commit 02dd8f455c43.
NCCL_TESTS_16_RANKS = [
    (4194304, 364.6, 11.50, 21.57),
    (134217728, 1652.2, 81.24, 152.32),
    (1073741824, 6759.0, 158.86, 297.86),
    (8589934592, 47535, 180.71, 338.82),
]


@pytest.mark.parametrize(("size", "time_us", "algbw", "busbw"), NCCL_TESTS_16_RANKS)
def test_bandwidths_are_nccl_tests_definitions(size, time_us, algbw, busbw):
    # the log prints time to 4-5 significant digits and bandwidths to 0.01: agree to that
    got_algbw, got_busbw = commbench.bandwidths(size, time_us * 1e-6, 16)
    assert got_algbw / 1e9 == pytest.approx(algbw, rel=1e-4, abs=0.006)
    assert got_busbw / 1e9 == pytest.approx(busbw, rel=1e-4, abs=0.006)


def test_two_gloo_ranks_record_their_time_and_nccl_tests_time(tmp_path):
    out = tmp_path / "comm.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "scalerepro.training.commbench",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--sizes",
        "4096",
        "262144",
        "--iterations",
        "8",
        "--warmup",
        "2",
    ]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert set(document["time_definitions"]) == {"time_us_median", "nccl_tests_time_us"}
    for row in document["results"]:
        # nccl-tests' figures follow its definitions from its own time
        seconds = row["nccl_tests_time_us"] * 1e-6
        assert row["nccl_tests_algbw_gbps"] == pytest.approx(row["size_bytes"] / seconds / 1e9)
        assert row["nccl_tests_busbw_gbps"] == pytest.approx(row["nccl_tests_algbw_gbps"] * 2 * (2 - 1) / 2)
        # the loop time per iteration includes the host's gaps between all-reduces: never below the fastest one
        assert row["nccl_tests_time_us"] >= row["time_us_min"] * 0.999


def test_one_rank_is_refused_unless_asked_for_a_communicator_of_one(tmp_path):
    out = tmp_path / "comm.json"
    command = [sys.executable, "-m", "scalerepro.training.commbench", "--out", str(out), "--device", "cpu", "--sizes", "4096", "--iterations", "4"]
    refused = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--process-group-at-one-rank" in refused.stderr and not out.exists()
    done = subprocess.run([*command, "--process-group-at-one-rank"], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["world_size"] == 1 and document["backend"] == "gloo"
    [row] = document["results"]
    assert row["time_us_median"] > 0 and row["busbw_gbps"] == 0  # busbw = algbw * 2 (n - 1) / n
