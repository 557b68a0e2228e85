"""Run records + the study matrix -> tidy tables for the plots and the report.

    python -m scalerepro.analysis.tables.aggregate --matrix results/tables/matrix.csv \
        --comm results/comm/g2.json results/comm/g4.json --references config/references.yaml \
        --out results/tables --targets "$(yq -o json .targets config/config.yaml)" \
        --inventory results/inventory/system.json

Inputs: the matrix (one row per *expected* run, with the path of its record; relative paths are
resolved against the current directory, the workflow's working directory), the run records
(read through their model, ``scalerepro.record``), one all-reduce benchmark file per GPU count
(``scalerepro.training.commbench``) and the published references (``config/references.yaml``). Nothing is invented: a figure that cannot be computed is
empty (NaN) and a ``note``/``detail`` column says why.

Definitions. A *cell* is a group of matrix rows that differ only in ``repeat``. A run *counts*
when its status is ``ok`` and its record agrees with the matrix (``consistent`` is not false);
a cell's statistics, and the run-level checks, are over the runs that count (any other repeat
is in ``repeats_total`` only). thr = median samples/s of a cell, T = median time per epoch of a cell.
Every cell with repeats has n (repeats_ok), median, min, max, CV and the seeded bootstrap 95 %
interval of its median, and every ratio of cells (efficiency, gain) an interval from paired
bootstrap medians (``scalerepro.analysis.tables.repeats``). A cell whose throughput CV exceeds the
``noise_cv_max`` target (default 0.05) is ``noisy``.

    speedup               S(N) = thr(N) / thr(1)             thr(1): same study and model at 1 GPU
    strong efficiency     E(N) = thr(N) / (N thr(1))         (= T(1) / (N T(N)), global batch fixed)
    weak efficiency       E(N) = T(1) / T(N)                 (per-GPU batch and data fixed)
    ablation gain         G    = thr(variant) / thr(baseline) - 1
    all-reduce bandwidth  algbw = size / t,  busbw = algbw * 2 (N - 1) / N   (nccl-tests)
    comparison ratio      measured / published  (reproduced when |ratio - 1| <= reproduce_tolerance)
    weak variation        (max T - min T) / min T over the GPU counts of a model

Tables written to ``--out`` (CSV, one row per line described):

runs.csv -- one row per matrix row (a run without a record is ``missing``, never dropped): the
    matrix's columns (the plan: run_id, study, model, gpus, nodes, repeat, variant, precision,
    per_gpu_batch, grad_accum_steps, global_batch, bucket_cap_mb, parallel, data_parallel, device,
    data, purpose, cell, record_of, record, rerun, ...; older matrices' missing ones at their
    defaults), whether the run counts (``status``: ok | failed | preempted | missing, ``error``,
    ``consistent``, ``consistency``, ``counts``, ``withheld``, ``probe_of``), ``duration_s``
    (ended_at - started_at), and every column the run record's model declares, read through it
    (scalerepro.record.columns; docs/run-record.md's field table names each field's column and unit).
cells.csv -- one row per cell (the matrix's ``cell``: its repeats; scalerepro.record.cell), as
    its study's table states it: the settings that tell one configuration from another (study,
    model, gpus, nodes, variant, precision, batches, bucket cap, strategy, reference), repeats_ok,
    repeats_total, the throughput's median, min, max, CV, interval and noisy flag, tokens/s, step
    and epoch time and exposed communication (medians), mfu (median), peak_memory_bytes (the
    largest over the repeats), device_name, and the facts its counted records share (data, shape,
    the peak MFU is against with the clock it is quoted at, the card's memory, what is withheld).
    The headline reads it.
epochs.csv -- one row per history entry of every record: run_id, epoch, step, complete
    (false for a partial last epoch), train_loss, eval_loss, eval_accuracy.
loss_log.csv -- one row per logged step of every record: run_id, step, loss, samples_per_s.
scaling.csv -- one row per (study in strong|weak, model, gpus): study, model, gpus, nodes,
    repeats_ok (n), repeats_total, samples_per_s_median, samples_per_s_min, samples_per_s_max,
    samples_per_s_cv, samples_per_s_ci_low, samples_per_s_ci_high (95 % interval of the
    median), noisy, samples_per_s_per_gpu (median / gpus), step_time_median_s, epoch_time_s
    (medians), epoch_time_cv, speedup, ideal_speedup (= gpus), efficiency (strong or weak,
    above), efficiency_ci_low, efficiency_ci_high, weak_variation, weak_variation_ci_low,
    weak_variation_ci_high (weak rows: the model's variation over its GPU counts, above), note.
sensitivity.csv -- one row per (model, gpus, bucket_cap_mb, per_gpu_batch, precision):
    those, repeats_ok, repeats_total, the throughput's median, min, max, CV, interval and noisy
    flag (as scaling.csv), step_time_median_s, exposed_comm_fraction (median), note.
ablation.csv -- one row per (model, gpus, variant), in matrix order (baseline first): those,
    repeats_ok, repeats_total, the throughput's median, min, max, CV, interval and noisy flag,
    gain (fraction; 0.25 = 25 % faster than the baseline), gain_ci_low, gain_ci_high, note.
parallelism.csv -- one row per (model, gpus, strategy) of the ``parallelism`` study, in matrix
    order: model, gpus, nodes, parallel, variant, data_parallel, per_gpu_batch (per replica),
    global_batch (the same for every strategy at a GPU count), repeats_ok, repeats_total, the
    throughput's median, min, max, CV, interval and noisy flag (as scaling.csv),
    tokens_per_s_median with tokens_per_s_ci_low/high, tokens_per_s_per_gpu (= tokens/s / gpus),
    mfu, peak_memory_bytes (a GPU's peak, the largest over ranks), peak_memory_kind, mesh,
    reshard_after_forward, state_bytes_per_rank_max/min, comm_bytes_per_step, comm_by_collective,
    pipeline_bubble_fraction, the memory split per rank (params, grads, optimizer, activations),
    all medians over the counted repeats; device_name, cell (the cell's name: scalerepro.record.cell), note
    ("not measured: <figure> (<why>)" for each empty figure).
communication.csv -- one row per (gpus, size_bytes): gpus, size_bytes, nodes, backend,
    time_us_median (slowest rank's median of single all-reduces: not nccl-tests' time, see
    scalerepro.training.commbench), algbw_gbps, busbw_gbps (GB = 1e9 bytes).
comparison.csv -- one row per reference in references.yaml, the reproduction group first, then
    the context (another GPU): reference (its id), group (reproduction | context), kind
    (published | expected (seed document) | mlperf), model, gpus, metric (samples_per_s |
    tokens_per_s_per_gpu), published, measured (the median of the ``reproduce`` runs of this
    reference, in its metric), measured_ci_low, measured_ci_high, repeats, measured_cv, noisy,
    ratio, verdict (reproduced | above | below | not comparable: <condition> | not measured: see
    comparison_table), differs (the condition that differs, with both values), measured_cell
    (the runs), measured_device, measured_conditions and published_conditions (side by side,
    one line each), the reference's conditions (gpu, precision, per_gpu_samples_per_step, seq_len,
    memory_format, data, optimizer), framework, metric_notes, source, note.
checks.csv -- one row per entry of ``targets.checks`` (``--targets``; each entry is data: which
    table, which rows (where), which metric column, how reduced, threshold, direction, unit; see
    parse_checks, evaluated by the one ``evaluate``): check (the entry's name), target (text:
    what is checked and against what), threshold (number), measured (number, in the unit),
    interval_low, interval_high (the worst row's 95 % interval, where its table has one), value
    (``measured`` as text), status (pass | fail | inconclusive: the interval holds the
    threshold | not measured), detail (which rows, or why; on a CPU study what a CPU study judges), unit.
cost.csv -- one row per study plus a ``total`` row: study, runs (matrix rows),
    gpu_hours_used = sum(duration_s x gpus) / 3600 and node_hours_used = sum(duration_s x
    nodes) / 3600 over the runs with a record, gpu_hours_requested = sum(runtime_min / 60 x
    gpus) and node_hours_requested over every matrix row (what an allocation request states).
    On a CPU study "gpus" are ranks.
scaling_model.csv -- the alpha-beta model's predicted step time and efficiency beside the
    measured ones, and predictions alone beyond the study's hardware (``--predict-gpus``): see
    ``scalerepro.analysis.tables.scaling_model``.
loss_decomposition.csv -- each multi-rank strong or weak cell's loss against ideal scaling split
    into measured parts (compute inflation, exposed communication, straggler wait, data stall,
    the unexplained rest), each with its interval over repeats, and the bottleneck: see
    ``scalerepro.analysis.tables.loss_decomposition``.
published_comparison.csv, gap_walk.csv -- each measured model beside its best published and best
    like-for-like figures (or why none), the references beside no run here, and the gap walk from
    the like-for-like figure to the measured one: see
    ``scalerepro.analysis.tables.published_comparison``. The power cap a record leaves out is the
    inventory's (``--inventory``) where that inventory is of the runs' machines.
summary.json -- run counts by status, device names and types, git commits, torch versions,
    inconsistent runs, check counts, comparison verdict counts, cpu_study, noisy_cells, left_out,
    and table_sha256: each table's SHA-256 ("<sha256>  <name>.csv", as sha256sum -c reads them),
    which the report and the figures check before they show a figure of a table
    (``scalerepro.analysis.tables.table_digests``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.columns import AGGREGATE_TABLES, CHECK_STATUSES, DEFAULT_NOISE_CV_MAX, DEFAULT_REPRODUCE_TOLERANCE, RUN_STATUSES, TARGETS, VERDICTS
from scalerepro.analysis.study_files import LeftOut, comm_problem, inventory_problem
from scalerepro.analysis.tables import loss_decomposition, published_comparison, published_conditions, scaling_model, table_digests
from scalerepro.analysis.tables.cell_tables import ablation_table, cells_table, cost_table, parallelism_table, scaling_table, sensitivity_table
from scalerepro.analysis.tables.check_definitions import parse_checks
from scalerepro.analysis.tables.checking import checks_table, cpu_study
from scalerepro.analysis.tables.readers import communication_table, read_comm, read_matrix, read_runs
from scalerepro.analysis.tables.reproduction import comparison_table, read_references, read_target_gpu
from scalerepro.common.cli import CommandError, OneLineErrorParser, bounded_int, error_boundary
from scalerepro.common.files import JsonFileError, read_json_object, write_text_atomically
from scalerepro.common.study_layout import study_folder_of
from scalerepro.record import evidence


def summarise(tables: Mapping[str, pd.DataFrame], left_out: Sequence[str] = ()) -> dict[str, Any]:
    """The aggregation at a glance, for summary.json and the log; ``left_out``: the files beside
    the records not taken as this study's, each with why (study_files)."""
    runs, checks = tables["runs"], tables["checks"]
    statuses = runs["status"].value_counts()
    return {
        "runs": len(runs),
        "status": {status: int(statuses.get(status, 0)) for status in RUN_STATUSES},
        "inconsistent_runs": sorted(runs.loc[runs["consistent"].eq(False).fillna(False), "run_id"]),
        "device_names": sorted(runs["device_name"].dropna().unique()),
        "device_types": sorted(runs["device_type"].dropna().unique()),
        "git_commits": sorted(runs["git_commit"].dropna().unique()),
        "torch_versions": sorted(runs["torch_version"].dropna().unique()),
        "checks": {status: int(checks["status"].eq(status).sum()) for status in CHECK_STATUSES},
        "comparison": {verdict: int(tables["comparison"]["verdict"].str.startswith(verdict).sum()) for verdict in VERDICTS} if "comparison" in tables else {},
        "cpu_study": cpu_study(runs),
        "noisy_cells": int(
            sum(tables[name]["noisy"].fillna(False).astype(bool).sum() for name in ("scaling", "sensitivity", "ablation", "parallelism") if name in tables)
        ),
        "left_out": list(left_out),
    }


def aggregate(
    matrix_path: str | os.PathLike[str],
    comm_paths: Iterable[str | os.PathLike[str]],
    references_path: str | os.PathLike[str],
    targets: Mapping[str, Any],
    predict_gpus: Sequence[int] = scaling_model.DEFAULT_PREDICT_GPUS,
    predict_cluster: str | None = None,
    study: str | os.PathLike[str] | None = None,
    inventory: Any = None,
) -> dict[str, pd.DataFrame]:
    """Every table, by file stem (see the module docstring). ``study``: the study folder the
    matrix's record paths resolve in (readers.read_matrix), by default the matrix's own;
    ``inventory``: the study's system.json as read (None: none)."""
    return aggregate_study(matrix_path, comm_paths, references_path, targets, predict_gpus, predict_cluster, study, inventory)[0]


def aggregate_study(
    matrix_path: str | os.PathLike[str],
    comm_paths: Iterable[str | os.PathLike[str]],
    references_path: str | os.PathLike[str],
    targets: Mapping[str, Any],
    predict_gpus: Sequence[int] = scaling_model.DEFAULT_PREDICT_GPUS,
    predict_cluster: str | None = None,
    study: str | os.PathLike[str] | None = None,
    inventory: Any = None,
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """``aggregate``'s tables, and the files it did not take as this study's, each with why: an
    all-reduce result that is not of the runs' communication (study_files.comm_problem)."""
    tolerance = targets.get("reproduce_tolerance", DEFAULT_REPRODUCE_TOLERANCE)
    noise = targets.get("noise_cv_max", DEFAULT_NOISE_CV_MAX)
    matrix = read_matrix(matrix_path, study)
    runs, epochs, losses = read_runs(matrix, evidence.quiet(targets))
    folder = Path(study) if study is not None else study_folder_of(matrix_path)
    named = lambda path: os.path.relpath(path, folder) if Path(path).resolve().is_relative_to(folder.resolve()) else Path(path).name  # noqa: E731
    left_out = [str(LeftOut(named(path), why)) for path in comm_paths if (why := comm_problem(read_comm(path), runs))]
    comm_paths = [path for path in comm_paths if not comm_problem(read_comm(path), runs)]
    references = read_references(references_path)
    tables = {
        "runs": runs,
        "epochs": epochs,
        "loss_log": losses,
        "cells": cells_table(runs, noise),
        "scaling": scaling_table(runs, noise),
        "sensitivity": sensitivity_table(runs, noise),
        "ablation": ablation_table(runs, noise),
        "parallelism": parallelism_table(runs, noise),
        "communication": communication_table(comm_paths),
        "comparison": comparison_table(runs, references, tolerance, noise, read_target_gpu(references_path)),
        "cost": cost_table(runs),
    }
    tables["checks"] = checks_table(tables, targets)
    tables["scaling_model"] = scaling_model.scaling_model_table(
        runs, tables["scaling"], comm_paths, references_path, predict_gpus, predict_cluster, dict(zip(matrix["run_id"], matrix["record_file"]))
    )
    tables["loss_decomposition"] = loss_decomposition.loss_decomposition_table(runs, tables["scaling"])
    # another machine's inventory says nothing of these runs' GPUs (the report leaves it out alike)
    machine = inventory if inventory_problem(inventory, runs) is None else None
    tables["published_comparison"], tables["gap_walk"] = published_comparison.comparison_tables(
        runs, published_conditions.read_references(references_path), tables["comparison"], machine
    )
    return tables, left_out


def write_tables(tables: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike[str], left_out: Sequence[str] = ()) -> dict[str, Any]:
    """Write ``<name>.csv`` per table and summary.json (with each table's SHA-256: table_digests)
    into ``out_dir``; returns the summary."""
    if set(tables) != set(AGGREGATE_TABLES):
        raise ValueError(f"the tables are {sorted(tables)}, not the rule's outputs {sorted(AGGREGATE_TABLES)} (analysis/columns.py)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {name: table.to_csv(index=False) for name, table in tables.items()}
    for name, text in texts.items():  # each file whole or not at all (a full disk keeps the last)
        write_text_atomically(out / f"{name}.csv", text)
    # last, so that tables left by a write that failed halfway match no digest and are never shown
    summary = {**summarise(tables, left_out), table_digests.DIGESTS: table_digests.listed(texts)}
    write_text_atomically(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _targets(text: str) -> dict[str, Any]:
    """``--targets``: the config's ``targets`` mapping as JSON, checked here so that a bad entry
    stops the aggregation with one line before any table is written."""
    try:
        targets = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}): pass the config's targets mapping as JSON") from None
    if not isinstance(targets, dict) or set(targets) - set(TARGETS):
        raise argparse.ArgumentTypeError(f"a mapping of {', '.join(TARGETS)} is expected, got {text[:80]!r}")
    try:
        parse_checks(targets)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return targets


_PROG = "scalerepro.analysis.tables.aggregate"


def _inventory(path: Path | None) -> Any:
    """``--inventory``: the system inventory as read, or None where none is given."""
    if path is None:
        return None
    try:
        return read_json_object(path, what="system inventory", max_bytes=64 << 20)
    except JsonFileError as error:
        raise CommandError(f"{error}: give the system.json that scalerepro.telemetry.inventory wrote") from None


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(
        prog=_PROG,
        description="Join the run records onto the study matrix and write the study's tidy tables.",
        epilog="targets: " + "; ".join(f"{key}: {what}" for key, what in TARGETS.items()),
    )
    parser.add_argument("--matrix", required=True, type=Path, help="matrix.csv, one row per expected run")
    parser.add_argument("--comm", nargs="*", default=[], type=Path, help="all-reduce benchmark JSON files")
    parser.add_argument("--references", required=True, type=Path, help="config/references.yaml")
    parser.add_argument("--out", required=True, type=Path, help="directory for the CSV tables and summary.json")
    parser.add_argument("--targets", default={}, type=_targets, metavar="JSON", help="the config's targets mapping")
    parser.add_argument(
        "--predict-gpus",
        nargs="*",
        type=bounded_int(1, 1_000_000),
        default=list(scaling_model.DEFAULT_PREDICT_GPUS),
        metavar="N",
        help="GPU counts the scaling model predicts beyond the study's hardware (links from --references)",
    )
    parser.add_argument(
        "--predict-cluster",
        metavar="PRESET",
        help="predict those counts on this cluster preset (clusters in --references, e.g. dgx_h100) with the model's typical error",
    )
    parser.add_argument("--inventory", type=Path, help="the study's system inventory (results/inventory/system.json): a power cap the records leave out")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    inventory = _inventory(args.inventory)
    tables, left_out = aggregate_study(args.matrix, args.comm, args.references, args.targets, args.predict_gpus, args.predict_cluster, inventory=inventory)
    summary = write_tables(tables, args.out, left_out)
    for line in left_out:
        print(f"aggregate: left out {line}", file=sys.stderr)
    print(
        f"aggregate: {summary['runs']} runs {summary['status']}, checks {summary['checks']}, "
        f"{len(tables)} tables in {args.out} ({time.perf_counter() - start:.2f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
