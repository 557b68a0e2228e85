"""Ranks forked by the fork server against ranks started as new processes: the same job, alternated.

    python benchmarks/fork_server_bench.py [--pairs 5] [--ranks 2] [--model cnn] [--keep DIR]

Each pair runs one training job (the README study's CPU flags, through
``scalerepro.launching.launch``) twice, in an alternating order: its ranks forked by a fork server
started for this benchmark (``scalerepro.launching.fork_server``), and its ranks started as new
processes. It prints, per kind, the job's wall time (the launcher's, start to exit) and what the
record measured: throughput, the median step, the exposed-communication probe's fraction and
the window's exposed all-reduce wait. A forked rank must measure what a new one does: only the
wall time may differ. Alternating keeps a machine whose speed drifts from favouring one kind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from scalerepro.launching import fork_server  # noqa: E402

# the README study's CPU trainer flags and batches (config/config.yaml, cpu_overrides)
CPU_STUDY = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["cpu_overrides"]
FLAGS = [
    *("--data", "synthetic", "--seed", "1", "--device", "cpu", "--progress", "off"),
    *("--steps", str(CPU_STUDY["steps"]), "--warmup-steps", str(CPU_STUDY["warmup_steps"])),
    *CPU_STUDY["trainer_args"],
]
BATCH = {name: str(model["per_gpu_batch"]) for name, model in CPU_STUDY["models"].items()}


def run_job(folder: Path, name: str, ranks: int, model: str, env: dict[str, str]) -> dict:
    record = folder / name / "record.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "scalerepro.launching.launch", "--ranks-per-node", str(ranks), "--cpus-per-node", "2", "--"]
        + ["-m", "scalerepro.training.train", "--model", model, "--per-gpu-batch", BATCH[model], *FLAGS, "--run-id", name, "--record", str(record)],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    forked = done.stderr.count(fork_server.FORKED_LINE)
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / "launch.log").write_text(done.stderr)
    if done.returncode != 0 or not record.exists():
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
    measured = json.loads(record.read_text())["measurements"]
    return {
        "wall_s": wall,
        "forked_ranks": forked,
        "samples_per_s": measured["samples_per_s"],
        "median_step_ms": 1000 * measured["step_time_s"]["median"],
        "exposed_fraction": (measured.get("exposed_communication") or {}).get("fraction"),
        "window_exposed_wait_ms": 1000 * ((measured.get("window_split") or {}).get("exposed_allreduce_wait_s") or float("nan")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--model", choices=sorted(BATCH), default="cnn", help="a model of the CPU study")
    parser.add_argument("--keep", type=Path, default=None, help="a folder for the records (default: a temporary one)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fork-server-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = str(REPO / "workflow")  # the server's, and every job's
    cold_env = {name: value for name, value in os.environ.items() if name != fork_server.SOCKET_ENV}
    server, socket_path = fork_server.start(os.getpid(), folder / "fork_server.log")
    forked_env = {**cold_env, fork_server.SOCKET_ENV: socket_path}
    try:
        run_job(folder, "warm-up", args.ranks, args.model, forked_env)  # the server's imports
        rows: dict[str, list[dict]] = {"forked": [], "new process": []}
        for pair in range(args.pairs):
            order = ["forked", "new process"] if pair % 2 == 0 else ["new process", "forked"]
            for kind in order:
                env = forked_env if kind == "forked" else cold_env
                row = run_job(folder, f"{kind.replace(' ', '-')}-{pair}", args.ranks, args.model, env)
                expected = args.ranks if kind == "forked" else 0
                if row["forked_ranks"] != expected:
                    raise SystemExit(f"{kind} pair {pair}: {row['forked_ranks']} ranks forked, expected {expected} (see {folder})")
                rows[kind].append(row)
    finally:
        fork_server.stop(server, socket_path)
    print(f"{args.model}, {args.ranks} rank(s), {args.pairs} alternated pairs; records in {folder}")
    for kind, found in rows.items():
        cells = []
        for key in ("wall_s", "samples_per_s", "median_step_ms", "exposed_fraction", "window_exposed_wait_ms"):
            values = [row[key] for row in found if row[key] is not None]
            cells.append(f"{key} {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]")
        print(f"  {kind:12s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
