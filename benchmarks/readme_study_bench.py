"""The README's first command, timed, and where its seconds go: the default study on this CPU-only
machine (`snakemake --cores all` in a fresh copy of the checkout), as this CPU is, with oneDNN held
below AVX512_CORE_BF16 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``: the CPU then runs bf16 the way a CPU
without avx512_bf16 does, emulated), and slowed: a CPU quota on the study's processes (a cgroup's
cpu.max, or cpu.cfs_quota_us under cgroup v1; --quota, the share of the cores) with oneDNN and
ATen held at AVX2, so that its steps take longer, as on a slower machine (the ratio is printed:
choose --quota for the slowdown wanted).
The slowed setting needs a writable cgroup (root, or a delegated cgroup); the setting is refused in
one line where there is none.

    .venv/bin/python benchmarks/readme_study_bench.py [--settings native capped slowed] [--repeats 1] [--quota 0.4]

Goal: each under 240 s on 2 cores, and slowed at most 25 % longer than native (issue 50). The
"step" column is the median over the strong one-rank records of their median step time: the slowed
setting's ratio to native is what the quota and caps did to a step. Each study's wall time is split, from its own files:

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
import contextlib
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
sys.path.insert(0, str(REPO / "workflow"))

from scalerepro.launching import fork_server  # noqa: E402
from scalerepro.record.read import read  # noqa: E402

IGNORE = shutil.ignore_patterns(".venv", "results", ".git", ".snakemake", "__pycache__", "*.egg-info", ".pytest_cache", ".whl", ".gl")
SETTINGS = {"native": {}, "capped": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "slowed": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
CGROUP_V2, CGROUP_V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
JOB_LINE = re.compile(r"run_job: launcher and ranks took ([0-9.]+) s wall")
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ONEDNN_", "DNNL_", "ATEN_CPU"))}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def quota_cgroup(name: str, share: float) -> Path:
    """A cgroup whose processes may use ``share`` of this machine's cores (cpu.max under cgroup v2,
    cpu.cfs_quota_us under v1, 100 ms periods); SystemExit in one line where none can be made."""
    period = 100_000
    quota = max(1_000, int(share * (os.cpu_count() or 1) * period))
    v2 = (CGROUP_V2 / "cgroup.controllers").exists()
    group = (CGROUP_V2 if v2 else CGROUP_V1) / name
    try:
        group.mkdir(exist_ok=True)
        if v2:
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
    except OSError as error:
        raise SystemExit(f"the slowed setting needs a writable cgroup ({group}: {error.strerror}): run as root, or leave out 'slowed'") from None
    return group


def _in_cgroup(group: Path | None, command: list[str]) -> list[str]:
    """``command`` run inside ``group`` (its shell joins the group, then becomes the command)."""
    if group is None:
        return command
    procs = group / ("cgroup.procs" if (group / "cgroup.procs").exists() else "tasks")
    return ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *command]


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
    records = ranks = forked = 0
    for record_path in sorted((workdir / "results" / "runs").glob("*/record.json")):
        record = json.loads(record_path.read_text())
        started = datetime.datetime.fromisoformat(record["started_at"])
        ended = datetime.datetime.fromisoformat(record["ended_at"])
        duration = (ended - started).total_seconds()
        window = (record.get("measurements") or {}).get("window_s") or 0.0
        log = (record_path.parent / "train.log").read_text()
        found = JOB_LINE.findall(log)
        ranks += int((record.get("parallel") or {}).get("world_size") or 1)
        forked += log.count(fork_server.FORKED_LINE)
        job = float(found[-1]) if found else duration
        windows += window
        in_trainer += duration - window
        startup += job - duration
        records += 1
    spans = _job_spans(log_text)
    other = sum(seconds for rule, seconds in spans if rule not in ("train",))
    others = sum(1 for rule, _ in spans if rule != "train")
    return {
        "wall": wall_s,
        "windows": windows,
        "in-trainer": in_trainer,
        "start-up": startup,
        "other jobs": other,
        "scheduling": wall_s - windows - in_trainer - startup - other,
        "records": records,
        "ranks": ranks,
        "forked": forked,
        "other_jobs": others,
    }


def run_study(scratch: Path, setting: str, repo: Path = REPO, group: Path | None = None) -> dict[str, float]:
    workdir = scratch / f"study-{setting}"
    shutil.copytree(repo, workdir, ignore=IGNORE)
    started = time.monotonic()
    command = _in_cgroup(group if setting == "slowed" else None, [sys.executable, "-m", "snakemake", "--cores", "all"])
    result = subprocess.run(command, cwd=workdir, env=_env(SETTINGS[setting]), capture_output=True, text=True)
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"the README study ({setting}) failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    figures = breakdown(workdir, wall, result.stderr + result.stdout)
    precisions = sorted({read(p).record.precision.name for p in (workdir / "results" / "runs").glob("strong_*/record.json")})
    figures["precision"] = ", ".join(precisions)
    one_rank = [json.loads(p.read_text())["measurements"]["step_time_s"]["median"] for p in (workdir / "results" / "runs").glob("strong_*_g1_*/record.json")]
    figures["step"] = statistics.median([t for t in one_rank if t]) if any(one_rank) else float("nan")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--repeats", type=int, default=1, help="studies per setting, interleaved")
    parser.add_argument("--keep", type=Path, default=None, help="run the studies under this folder and keep them (default: a temporary folder, removed)")
    parser.add_argument(
        "--quota",
        type=float,
        default=0.4,
        help="the slowed setting's share of the cores (default 0.4); the steps' ratio to native is printed (2-core Xeon: 0.7 gave 1.02x, 0.4 1.4x, 0.2 5.0x)",
    )
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to copy (default: this one; another commit's worktree for a before/after)")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?")
    print(f"README study (snakemake --cores all), {os.cpu_count()} cores, {cpu}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", flush=True)
    results: dict[str, list[dict[str, float]]] = {setting: [] for setting in args.settings}
    group = quota_cgroup("scalerepro-readme-study-slowed", args.quota) if "slowed" in args.settings else None
    with contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for setting in args.settings:
                figures = run_study(Path(scratch) / f"r{repeat}", setting, args.repo, group)
                results[setting].append(figures)
                shares = "  ".join(
                    f"{k} {figures[k]:6.1f} s ({figures[k] / figures['wall']:4.0%})" for k in ("windows", "in-trainer", "start-up", "other jobs", "scheduling")
                )
                print(
                    f"{setting:<7} wall {figures['wall']:6.1f} s (goal < 240 s: {'met' if figures['wall'] < 240 else 'MISSED'}); "
                    f"{figures['records']:.0f} records ({figures['precision']}), one-rank step {figures['step'] * 1e3:.0f} ms, "
                    f"{figures['other_jobs']:.0f} other jobs, {figures['forked']:.0f} of {figures['ranks']:.0f} ranks forked\n        {shares}",
                    flush=True,
                )
    if "native" in results and "slowed" in results:
        walls = {s: statistics.median(r["wall"] for r in results[s]) for s in ("native", "slowed")}
        steps = {s: statistics.median(r["step"] for r in results[s]) for s in ("native", "slowed")}
        growth = walls["slowed"] / walls["native"] - 1
        print(f"slowed/native: steps {steps['slowed'] / steps['native']:.2f}x, wall {growth:+.0%} (goal < +25 %: {'met' if growth < 0.25 else 'MISSED'})")
    if args.repeats > 1:
        for setting, rows in results.items():
            walls = [r["wall"] for r in rows]
            print(f"{setting:<7} wall median {statistics.median(walls):.1f} s (min {min(walls):.1f}, max {max(walls):.1f}, n={len(walls)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
