#!/usr/bin/env python3
"""Workflow speed: DAG planning, aggregation, and the CPU smoke study end to end.

    .venv/bin/python benchmarks/workflow_bench.py [--skip-study]

Prints three figures, each against its goal:
  1. `snakemake -n` wall time for a 1,000-run study matrix              goal < 5 s
     (min / median / max of 5 runs, interleaved with 5 of a bare Snakefile planning as many jobs,
     and the ratio of the medians: the workflow's own cost over Snakemake's, which is steadier
     than either time on a shared machine)
  2. aggregation of 10,000 run records into the tidy tables            goal < 3 s
  3. the default study (`snakemake --cores all`; on a CPU-only machine, its CPU matrix)  goal < 5 min on 2 cores
"""

from __future__ import annotations

import argparse
import copy
import csv
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
IGNORE = shutil.ignore_patterns(".venv", "results", ".git", ".snakemake", "__pycache__", "*.egg-info", ".pytest_cache", ".whl", ".gl")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def _matrix_1000(scratch: Path) -> Path:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.pop("cpu_overrides")
    # 5 models x 10 GPU counts (1..512) x strong and weak x 10 repeats = 1,000 training runs.
    config.update(device="cpu", gpus_per_node=512, repeats=10)
    config["scaling"].update(gpu_counts=[2**k for k in range(10)])
    config["models"] = {m: {"per_gpu_batch": 512, "args": []} for m in config["scaling"]["models"]}
    for study in ("sensitivity", "ablation", "communication", "reproduce", "profiling"):
        config[study]["enabled"] = False
    path = scratch / "matrix1000.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _bare_snakefile(scratch: Path, jobs: int) -> Path:
    """The same number of jobs with nothing of scalerepro's: Snakemake's own planning cost."""
    bare = scratch / "bare"
    bare.mkdir()
    (bare / "Snakefile").write_text(
        f"RUNS = [f'run{{i}}' for i in range({jobs})]\n\n"
        "rule all:\n    input: 'report.html'\n\n"
        "rule report:\n    input: expand('runs/{run}/record.json', run=RUNS)\n    output: 'report.html'\n    shell: 'touch {output}'\n\n"
        "rule train:\n    output: 'runs/{run}/record.json'\n    resources: gpus=1\n    params: args=lambda wc: ['--run-id', wc.run]\n    shell: 'touch {output}'\n"
    )
    return bare


def _timed(command: list[str], cwd: Path) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return elapsed, result.stdout


def dry_run_1000(scratch: Path, repeats: int = 5) -> tuple[list[float], list[float], int]:
    """(workflow seconds, bare seconds, train jobs), each run ``repeats`` times, interleaved."""
    path = _matrix_1000(scratch)
    ours, bare = [], []
    elapsed, stdout = _timed([sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)], REPO)
    jobs = next(int(line.split()[1]) for line in stdout.splitlines() if line.startswith("train "))
    bare_dir = _bare_snakefile(scratch, jobs)
    for _ in range(repeats):
        ours.append(_timed([sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)], REPO)[0])
        bare.append(_timed([sys.executable, "-m", "snakemake", "-n"], bare_dir)[0])
    return ours, bare, jobs


def aggregate_10000(scratch: Path) -> float:
    from scalerepro.analysis.tables.aggregate import aggregate

    template = json.loads((REPO / "benchmarks/data/record.json").read_text())
    runs = scratch / "runs"
    rows = []
    for i in range(10_000):
        record = copy.deepcopy(template)
        run_id = f"strong_cnn_g{2 ** (i % 4)}_r{i // 4 + 1}"
        record["run_id"] = run_id
        record["measurements"]["samples_per_s"] *= 1 + (i % 7) / 100
        path = runs / run_id / "record.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
        rows.append(
            {
                "run_id": run_id,
                "study": "strong",
                "model": "cnn",
                "gpus": 2 ** (i % 4),
                "nodes": 1,
                "gpus_per_node": 8,
                "repeat": i // 4 + 1,
                "variant": "",
                "precision": "fp32",
                "per_gpu_batch": 16,
                "global_batch": 16,
                "bucket_cap_mb": 25.0,
                "runtime_min": 10,
                "record": str(path),
                "rerun": "snakemake ...",
            }
        )
    matrix = scratch / "matrix.csv"
    with open(matrix, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    started = time.monotonic()
    aggregate(matrix, [], REPO / "config/references.yaml", {})
    return time.monotonic() - started


def cpu_study(scratch: Path) -> float:
    workdir = scratch / "study"
    shutil.copytree(REPO, workdir, ignore=IGNORE)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "all"], cwd=workdir, env=_env(), capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"the CPU study failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-study", action="store_true", help="skip the end-to-end CPU study (minutes)")
    args = parser.parse_args()
    print(f"{len(os.sched_getaffinity(0))} cores | {time.strftime('%Y-%m-%d %H:%M %Z')}", flush=True)
    with tempfile.TemporaryDirectory(prefix="scalerepro-wf-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        ours, bare, jobs = dry_run_1000(scratch)
        median, bare_median = statistics.median(ours), statistics.median(bare)
        print(
            f"snakemake -n, {jobs}-run matrix: {median:6.2f} s median (min {min(ours):.2f}, max {max(ours):.2f}, n={len(ours)})"
            f"   (goal < 5 s)  {'PASS' if median < 5 else 'FAIL'}",
            flush=True,
        )
        print(
            f"  bare Snakefile, {jobs} jobs:  {bare_median:6.2f} s median (min {min(bare):.2f}, max {max(bare):.2f}); ratio {median / bare_median:.2f}",
            flush=True,
        )
        seconds = aggregate_10000(scratch)
        print(f"aggregate 10,000 records:      {seconds:6.2f} s   (goal < 3 s)  {'PASS' if seconds < 3 else 'FAIL'}", flush=True)
        if not args.skip_study:
            seconds = cpu_study(scratch)
            print(f"CPU smoke study, whole DAG:    {seconds:6.1f} s   (goal < 300 s) {'PASS' if seconds < 300 else 'FAIL'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
