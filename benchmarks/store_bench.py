#!/usr/bin/env python3
"""Results store speed: appending a large study, appending it again, its history, a comparison.

    .venv/bin/python benchmarks/store_bench.py [--runs 10000]

Two studies of ``--runs`` runs each (copies of a real record, benchmarks/data/record.json, in
cells of 10 repeats) are appended to a fresh DuckDB store. Prints, each against its goal:
  1. appending one study (read matrix + records, one transaction)      goal < 10 s for 10,000 runs
  2. appending the same study again (nothing changes)                  goal < 10 s
  3. the history of its headline cells across the two studies          goal < 2 s
  4. comparing the two studies cell by cell (10,000 resamples a cell)  goal < 10 s for 1,000 cells
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))

from scalerepro.analysis.history import compare, store, store_file, study_rows  # noqa: E402

REPEATS = 10


def write_study(root: Path, runs: int, speed: float, start_minute: int) -> None:
    """A study directory as the workflow leaves it: matrix, records, config, inventory."""
    template = json.loads((REPO / "benchmarks/data/record.json").read_text())
    rows = []
    for i in range(runs):
        cell, repeat = divmod(i, REPEATS)
        gpus = 2 ** (cell % 4)
        run_id = f"strong_cnn_g{gpus}_b{cell}_r{repeat + 1}"
        record = copy.deepcopy(template)
        record.update(run_id=run_id, started_at=f"2026-11-20T{8 + start_minute // 60:02d}:{start_minute % 60:02d}:00.000+00:00")
        record["parallel"].update(world_size=gpus, nodes=1)
        record["measurements"]["samples_per_s"] *= speed * (1 + (i % 7) / 100)
        path = root / "results/runs" / run_id / "record.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
        rows.append(
            {
                "run_id": run_id,
                "study": "strong",
                "model": "cnn",
                "gpus": gpus,
                "nodes": 1,
                "gpus_per_node": 8,
                "repeat": repeat + 1,
                "variant": "",
                "precision": "fp32",
                "per_gpu_batch": 16 + cell,
                "global_batch": 16,
                "bucket_cap_mb": 25.0,
                "runtime_min": 10,
                "record": f"results/runs/{run_id}/record.json",
                "rerun": "snakemake ...",
            }
        )
    tables = root / "results/tables"
    tables.mkdir(parents=True)
    with open(tables / "matrix.csv", "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tables / "config.json").write_text(json.dumps({"study_name": "bench", "steps": 200}))
    (root / "results/inventory").mkdir(parents=True)
    (root / "results/inventory/system.json").write_text(json.dumps({"hostname": "bench", "gpus": [], "slurm": None}))


def timed(function, *args):
    started = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for name, speed, minute in (("a", 1.0, 0), ("b", 0.9, 30)):
            write_study(scratch / name, args.runs, speed, minute)
        history = scratch / "history.duckdb"
        figures = []
        ids = []
        for name in ("a", "b"):
            os.chdir(scratch / name)
            study, read_s = timed(
                study_rows.read_study,
                "results/tables/matrix.csv",
                "results/tables/config.json",
                "results/inventory/system.json",
            )
            connection = store_file.connect(history)
            result, append_s = timed(store.append, connection, study)
            connection.close()
            ids.append(study.study_id)
            if name == "a":
                figures.append(
                    (
                        "append a study (read + write)",
                        read_s + append_s,
                        10.0,
                        f"{args.runs:,} runs, {result.added:,} added",
                    )
                )
                connection = store_file.connect(history)
                again, again_s = timed(store.append, connection, study)
                connection.close()
                figures.append(("append it again (no-op)", read_s + again_s, 10.0, f"{again.unchanged:,} unchanged"))
        connection = store_file.connect(history, read_only=True)
        past, history_s = timed(store.history, connection, ids[1])
        figures.append(("history of the headline cells", history_s, 2.0, f"{len(past)} rows"))
        sides = [compare._side(store.load_study(connection, study_id), str(history)) for study_id in ids]
        connection.close()
        table, compare_s = timed(compare.compare, *sides)
        figures.append(
            (
                "compare the two studies",
                compare_s,
                10.0,
                f"{len(table):,} cells, {table.verdict.eq('slower').sum():,} slower",
            )
        )
    print(f"results store, {args.runs:,} runs a study, DuckDB {store.duckdb.__version__}")
    for what, seconds, goal, detail in figures:
        print(f"  {what:<34} {seconds:7.2f} s  (goal < {goal:g} s: {'met' if seconds < goal else 'MISSED'})  {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
