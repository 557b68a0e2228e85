"""``python -m scalerepro.training.node_check`` measures this machine's CPU for real: a matmul
rate, a copy bandwidth and (with ranks) a gloo all-reduce, read back through the record's model.
The bounds are wide on purpose: they catch a wrong unit or a figure of nothing, not a slow CPU."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalerepro.record.node_check import NodeCheck
from scalerepro.training import node_check

from conftest import ALL_CORES, REPO, clean_env

# two ranks, and a process pinned to fewer cores than it has: the test needs every core, not its xdist worker's one
pytestmark = pytest.mark.all_cores
CORES = sorted(ALL_CORES)


def _check(out: Path, *flags: str, cores: list[int] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scalerepro.training.node_check", "--out", str(out), *flags],
        env=clean_env(PYTHONPATH=str(REPO / "workflow")),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores),
    )


def _record(out: Path, run: subprocess.CompletedProcess) -> NodeCheck:
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == 1, run.stdout  # one summary line, nothing else
    return NodeCheck.model_validate_json(out.read_text())


def test_one_rank_measures_the_cpu_and_says_why_there_is_no_all_reduce(tmp_path):
    out = tmp_path / "nodes" / "n1.json"
    check = _record(out, _check(out, "--device", "cpu", "--precision", "fp32", "--node", socket.gethostname(), "--seconds", "0.6"))
    assert (check.node, check.device_type, check.precision, check.cores) == (socket.gethostname(), "cpu", "fp32", len(CORES))
    (device,) = check.devices
    assert device.index == 0 and device.name
    assert device.matmul_size == node_check.cpu_matmul_size(len(CORES))
    # a core does 1 to 200 GFLOP/s in fp32; a memory copy runs at 1 to 1000 GB/s
    assert 1e-3 * len(CORES) < device.matmul_tflops < 0.5 * len(CORES)  # 0.5: a core with two AVX-512 FMA units is near 0.2
    assert 1 < device.memory_gbps < 1000 and device.memory_bytes == node_check.CPU_COPY_BYTES
    assert device.repeats >= node_check.MIN_REPEATS and 0 <= device.spread <= 1
    assert device.state.power_w is None and device.state.reason  # a CPU's power is never read
    assert check.allreduce is None and check.allreduce_reason == node_check.ONE_RANK_REASON
    assert 0 < check.seconds < 30


@pytest.mark.skipif(len(CORES) < 2, reason="two ranks need two cores")
def test_two_ranks_time_a_gloo_all_reduce(tmp_path):
    out = tmp_path / "n2.json"
    check = _record(out, _check(out, "--device", "cpu", "--precision", "bf16", "--ranks", "2", "--seconds", "0.6"))
    allreduce = check.allreduce
    assert allreduce is not None and check.allreduce_reason is None
    assert (allreduce.ranks, allreduce.backend, allreduce.size_bytes) == (2, "gloo", node_check.CPU_ALLREDUCE_BYTES)
    # busbw = size / t x 2 (n - 1) / n, n = 2: size / t
    assert allreduce.busbw_gbps == pytest.approx(allreduce.size_bytes / allreduce.time_s / 1e9)
    assert 0.01 < allreduce.busbw_gbps < 1000
    assert check.devices[0].matmul_tflops > 0  # bf16, whether or not this CPU has it natively


def test_a_pinned_process_reports_the_cores_it_may_run_on(tmp_path):
    out = tmp_path / "pinned.json"
    check = _record(out, _check(out, "--device", "cpu", "--precision", "fp32", "--seconds", "0.4", cores=CORES[:1]))
    # the size a core's count picks, or a halving of it where a busy core made one call too slow
    sizes = {node_check.cpu_matmul_size(1) >> k for k in range(4)}
    assert check.cores == 1 and check.devices[0].matmul_size in sizes


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "never.json"
    run = _check(out, "--device", "cuda", "--precision", "bf16")
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("scalerepro.training.node_check: error: --device cuda") and "--device cpu" in line
    assert not out.exists()


def test_more_ranks_than_cores_is_refused_before_any_work(tmp_path):
    run = _check(tmp_path / "never.json", "--device", "cpu", "--precision", "fp32", "--ranks", "2", cores=CORES[:1])
    assert run.returncode == 2
    (line,) = run.stderr.splitlines()
    assert "--ranks 2" in line and "--ranks 1" in line


def test_ranks_split_the_cores_contiguously_and_whole():
    cores = [0, 1, 2, 3, 4, 5, 6]
    shares = [node_check.rank_cores(cores, 3, rank) for rank in range(3)]
    assert shares == [[0, 1], [2, 3], [4, 5, 6]]
    assert node_check.spread([1.0] * 9) == 0.0 and node_check.spread([0.1, 1.0, 1.0, 1.0, 10.0]) == 1.0


def test_a_check_named_for_another_node_is_refused(tmp_path):
    # its figures would be this node's under that node's name: the screen would judge the wrong node
    out = tmp_path / "node02.json"
    run = _check(out, "--device", "cpu", "--precision", "fp32", "--node", "node02-elsewhere", "--seconds", "0.2")
    assert run.returncode == 2 and not out.exists()
    assert len(run.stderr.strip().splitlines()) == 1 and "runs on" in run.stderr and "--nodelist" in run.stderr
