"""The GPU smoke's own programs, run on the CPU as its rehearsal runs them: a stage that breaks here
would otherwise break in device time (the frontier's benchmark called a renamed option, and every
stage built on it would have failed at its first model on the next GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # starts training processes


def test_the_frontier_benchmark_writes_its_table_with_compile_and_kernel_figures_and_the_report_reads_it(tmp_path):
    table = tmp_path / "cnn-frontier.json"
    flags = "--compile none --kernel-profile-steps 2"
    command = [sys.executable, "benchmarks/trainer_throughput.py", "--models", "cnn", "--presets", "optimised", "--steps", "4", "--warmup-steps", "1"]
    command += ["--per-gpu-batch", "16", "--records", str(tmp_path), "--json", str(table), "--label", "frontier", f"--flags={flags}"]
    done = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = json.loads(table.read_text())["results"]["cnn"]["optimised"]
    assert run["ok"] and run["batch"] == 16  # --per-gpu-batch reached the trainer
    assert run["first_step_s"] > 0 and run["compile_scope"] is None and run["profiled_steps"] == 2 and run["top_kernels"]
    record = json.loads((tmp_path / "cnn-optimised-frontier.json").read_text())
    assert record["batch"]["micro_batch"] == 16 and record["config"]["run"]["kernel_profile_steps"] == 2

    report = subprocess.run([sys.executable, "benchmarks/gpu/bench_report.py", str(table)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    line = report.stdout.strip()
    assert line.startswith("BENCH cnn") and "batch   16" in line and "(not compiled)" in line and "over 2 profiled steps" in line, line
