"""The README's first command, timed, and where its seconds go: the default study on this CPU-only
machine (`snakemake --cores all` in a fresh copy of the checkout), as this CPU is and with oneDNN held
below AVX512_CORE_BF16 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: the CPU then runs bf16 the way a CPU
without avx512_bf16 does, emulated), issue 34.

    .venv/bin/python benchmarks/readme_study_bench.py [--settings native capped] [--repeats 1]

Goal: each under 240 s on 2 cores. Each study's wall time is split, from its own files:

  windows       the measured training windows (each record's measurements.window_s)
  in-trainer    the rest of each training process's life as its record counts it (ended_at -
                started_at - window: model build, warm-up steps, evaluation, probes, record)
  start-up      each training job's wall time (run_job's own line in train.log) less its record's
                duration: the launcher, and each rank's Python and torch imports before the trainer starts
  other jobs    every job that is not a training job (inventory, all-reduce benchmark, aggregation,
                plots, report, store), from Snakemake's log (its timestamps have 1 s resolution)
  scheduling    the rest of the wall time: Snakemake's own planning and scheduling, and the jobs
                that overlap (2 cores: analysis jobs can run beside a training job)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".venv", "results", ".git", ".snakemake", "__pycache__", "*.egg-info", ".pytest_cache", ".whl", ".gl")
SETTINGS = {"native": {}, "capped": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
JOB_LINE = re.compile(r"run_job: launcher and ranks took ([0-9.]+) s wall")
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ONEDNN_", "DNNL_", "ATEN_CPU"))}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def _job_spans(log_text: str) -> list[tuple[str, float]]:
    """(rule, seconds) of every job in a Snakemake log: a job starts at the timestamp before its
    "rule NAME:" line and ends at the timestamp before "Finished jobid: ID"."""
    stamp, started, rules, spans = None, {}, {}, []
    rule = None
    for line in log_text.splitlines():
        found = STAMP.match(line.strip())
        if found:
            stamp = datetime.datetime.strptime(found.group(1), "%a %b %d %H:%M:%S %Y")
            continue
        text = line.strip()
        if text.startswith(("rule ", "localrule ")) and text.endswith(":"):
            rule = text.split(" ", 1)[1].rstrip(":")
        elif text.startswith("jobid:") and rule is not None:
            jobid = text.split(":", 1)[1].strip()
            started[jobid], rules[jobid] = stamp, rule
            rule = None
        elif text.startswith("Finished jobid:"):
            jobid = text.split(":", 1)[1].split()[0].strip()
            if jobid in started and stamp is not None:
                spans.append((rules[jobid], (stamp - started[jobid]).total_seconds()))
    return spans


def breakdown(workdir: Path, wall_s: float, log_text: str) -> dict[str, float]:
    windows = in_trainer = startup = 0.0
    records = 0
    for record_path in sorted((workdir / "results" / "runs").glob("*/record.json")):
        record = json.loads(record_path.read_text())
        started = datetime.datetime.fromisoformat(record["started_at"])
        ended = datetime.datetime.fromisoformat(record["ended_at"])
        duration = (ended - started).total_seconds()
        window = (record.get("measurements") or {}).get("window_s") or 0.0
        found = JOB_LINE.findall((record_path.parent / "train.log").read_text())
        job = float(found[-1]) if found else duration
        windows += window
        in_trainer += duration - window
        startup += job - duration
        records += 1
    spans = _job_spans(log_text)
    other = sum(seconds for rule, seconds in spans if rule not in ("train",))
    others = sum(1 for rule, _ in spans if rule != "train")
    return {"wall": wall_s, "windows": windows, "in-trainer": in_trainer, "start-up": startup, "other jobs": other,
            "scheduling": wall_s - windows - in_trainer - startup - other, "records": records, "other_jobs": others}  # fmt: skip


def run_study(scratch: Path, setting: str, repo: Path = REPO) -> dict[str, float]:
    workdir = scratch / f"study-{setting}"
    shutil.copytree(repo, workdir, ignore=IGNORE)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "all"], cwd=workdir, env=_env(SETTINGS[setting]),
                            capture_output=True, text=True)  # fmt: skip
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"the README study ({setting}) failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    figures = breakdown(workdir, wall, result.stderr + result.stdout)
    precisions = sorted({json.loads(p.read_text())["precision"] for p in (workdir / "results" / "runs").glob("strong_*/record.json")})
    figures["precision"] = ", ".join(precisions)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--repeats", type=int, default=1, help="studies per setting, interleaved")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to copy (default: this one; another commit's worktree for a before/after)")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?")
    print(f"README study (snakemake --cores all), {os.cpu_count()} cores, {cpu}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", flush=True)
    results: dict[str, list[dict[str, float]]] = {setting: [] for setting in args.settings}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for setting in args.settings:
                figures = run_study(Path(scratch) / f"r{repeat}", setting, args.repo)
                results[setting].append(figures)
                shares = "  ".join(f"{k} {figures[k]:6.1f} s ({figures[k] / figures['wall']:4.0%})"
                                   for k in ("windows", "in-trainer", "start-up", "other jobs", "scheduling"))  # fmt: skip
                print(f"{setting:<7} wall {figures['wall']:6.1f} s (goal < 240 s: {'met' if figures['wall'] < 240 else 'MISSED'}); "
                      f"{figures['records']:.0f} records ({figures['precision']}), {figures['other_jobs']:.0f} other jobs\n        {shares}", flush=True)  # fmt: skip
    if args.repeats > 1:
        for setting, rows in results.items():
            walls = [r["wall"] for r in rows]
            print(f"{setting:<7} wall median {statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f}, n={len(walls)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
