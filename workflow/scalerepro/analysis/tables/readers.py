"""Reading a study's files into frames: the matrix, each run's JSON record (one row of runs.csv, its
epochs and its loss curve) and the communication benchmark's CSVs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import (
    COMM_COLUMNS,
    EPOCH_COLUMNS,
    LOSS_COLUMNS,
    MATRIX_COLUMNS,
    OPTIONAL_MATRIX_COLUMNS,
    RECORD_COLUMNS,
    RUN_COLUMNS,
)
from scalerepro.analysis.tables.cell_tables import counts
from scalerepro.common import study_layout
from scalerepro.common.cli import CommandError
from scalerepro.common.files import JsonFileError, read_json_object
from scalerepro.common.probe_off import PROBE_OFF_REASON
from scalerepro.record import cell as cells
from scalerepro.record import columns as record_columns
from scalerepro.record import evidence
from scalerepro.record.read import Reading, RecordUnreadable, from_document


class TableInputError(CommandError, ValueError):
    """A study file the aggregation reads is not what the workflow writes; the message names it and the fix."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


RECORDS_STUDY = "records"  # rebuild --records' study column: runs no study planned, named after their files
LOG_TAIL_BYTES = 4096  # enough for the last lines of a train.log, however long the log


def _log_ending(log: Path, record_named: str) -> str:
    """Where a run left no record but its job's log is there (a run stopped or crashed before
    its record was written): "; its log ends: <last line> (<log>)", the log named beside the
    record as the study names it, else ""."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - LOG_TAIL_BYTES))
            lines = [line.strip() for line in handle.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f"; its log ends: {lines[-1][:300]} ({Path(record_named).parent / log.name})" if lines else ""


def identity_problem(reading: Reading, run_id: Any = None, model: Any = None) -> str | None:
    """Why the record is not the run its plan names (its run id or model differ), or None; a
    plan that names neither (rebuild --records) asks nothing."""
    differs = [
        f"{name} {stated!r}, not {planned!r}"
        for name, stated, planned in (("run id", reading.record.run_id, run_id), ("model", reading.record.model.name, model))
        if planned is not None and str(stated) != str(planned)
    ]
    return f"it is another run's record ({'; '.join(differs)})" if differs else None


class RecordRead(NamedTuple):
    """One record as the tables take it: its runs.csv fields, its epochs.csv and loss_log.csv
    rows, and the cell it ran in (None where it has no readable record)."""

    fields: dict[str, Any]
    epochs: list[tuple[Any, ...]]
    losses: list[tuple[Any, ...]]
    cell: cells.Cell | None


def read_record(
    run_id: str, path: str, planned: dict[str, Any] | None = None, named: str | None = None, quiet: Sequence[evidence.Bound] = evidence.QUIET
) -> RecordRead:
    """One record as the tables take it, read at ``path`` and named in its messages ``named``
    (the matrix's path, as the study names it: a message shows no path of the machine that read
    it), by default ``path``.

    A record that is absent, unreadable, out of bounds, of a schema this code does not read
    (scalerepro.record.read), or another run's (``planned``: the matrix row, whose run id and
    model it must state) gives status "missing" and the reason as its error: the run has no
    record of its own. One whose figures are no measurement (negative, infinite, NaN, text) or do
    not agree with each other (scalerepro.record.evidence) gives status "failed". A completed run
    whose record departs from the rest of its plan (scalerepro.record.cell.departures), or whose
    window did not have its machine to itself (``quiet``: scalerepro.record.evidence.disturbances), is not
    ``consistent``, and says why in ``consistency``. A figure the record is known to hold wrongly
    (the upgrade chain's ``withheld``) is empty, and ``withheld`` says why."""
    planned = planned or {}
    shown = named or path

    def missing(error: str) -> RecordRead:
        return RecordRead({"run_id": run_id, "status": "missing", "error": error}, [], [], None)

    try:
        document = read_json_object(path)
    except FileNotFoundError:
        return missing(f"no run record at {shown}{_log_ending(Path(path).parent / 'train.log', shown)}")
    except (OSError, ValueError) as error:
        why = str(error).replace(str(path), shown) if isinstance(error, JsonFileError) else f"unreadable run record {shown}: {error}"
        return missing(f"{why}: rerun this run")
    try:
        reading = from_document(document)
    except RecordUnreadable as error:
        return missing(f"the record at {shown} cannot be read here: {error}")
    other = identity_problem(reading, planned.get("run_id"), planned.get("model"))
    if other:
        return missing(f"the record at {shown} is not this run's: {other}: rerun this run")
    record = reading.record
    fields = {**reading.row(), "run_id": run_id}
    measured = record.measurements
    empty = record.status == "ok" and not (measured is not None and measured.measured_steps and measured.samples_per_s)
    # figures out of bounds first; an empty window's figures need not agree (it has none)
    problems = list(reading.nonsense) or ([] if empty else reading.problems)
    if problems:
        # a figure no measurement gives, or figures that disagree with each other: the record is
        # no evidence of a result (nor of any of its figures)
        fields.update(dict.fromkeys(record_columns.FIGURES))
        fields.update(status="failed", error=f"the record's figures are no measurement ({'; '.join(problems)}): rerun this run")
    elif empty:
        # A record with no measurements is a failure, whatever it says of itself.
        fields.update(status="failed", error="the record says ok but its measured window is empty (no steps, no throughput)")
    fields.update({column: None for defect in reading.withheld for column in defect.columns})
    fields["withheld"] = " | ".join(f"{', '.join(defect.columns)}: {defect.why}" for defect in reading.withheld) or None  # "<columns>: <why> | ..."
    # a completed run is held to its plan: the cell the plan sets, on a machine of its own
    departures = [*cells.departures(reading.cell, cells.Cell.planned(planned)), *evidence.disturbances(record, quiet)] if fields["status"] == "ok" else []
    fields["consistency"] = "; ".join(departures) or None
    if fields["scheduler_job_id"] is not None:
        fields["scheduler_job_id"] = str(fields["scheduler_job_id"])  # an integer or a string in the schema
    epochs = [(run_id, e.epoch, e.step, e.complete, e.train_loss, e.eval_loss, e.eval_accuracy) for e in record.history]
    losses = [(run_id, entry.step, entry.loss, entry.samples_per_s) for entry in record.loss_log]
    return RecordRead(fields, epochs, losses, reading.cell)


# A matrix row is ~300 bytes: 64 MiB would be 200,000 planned runs, more than any study plans.
MAX_MATRIX_BYTES = 64 << 20


def read_matrix(path: str | os.PathLike[str], study: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """The study matrix at ``path``, checked, with each run's record file (``record_file``: the
    matrix's ``record`` resolved inside the study folder by ``study_layout.record_file``).
    ``study``: the study folder, by default the one the matrix lies in (``<study>/tables/matrix.csv``).
    A record path that resolves outside the study folder is refused: a study is read from its own
    files, never from whatever lies beside it."""
    size = Path(path).stat().st_size
    if size > MAX_MATRIX_BYTES:
        raise TableInputError(
            f"{path} is {size / 2**20:.0f} MiB, larger than any study matrix ({MAX_MATRIX_BYTES >> 20} MiB): make it again (rule study_matrix)"
        )
    try:
        matrix = pd.read_csv(path, dtype={"run_id": str, "variant": str, "record": str, "rerun": str, "reference": str})
    except pd.errors.EmptyDataError:
        raise TableInputError(f"{path}: the study matrix is empty: make it again (rule study_matrix)") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as error:
        raise TableInputError(f"{path}: not a study matrix, not CSV text ({str(error).splitlines()[0][:100]}): make it again (rule study_matrix)") from None
    absent = [column for column in MATRIX_COLUMNS if column not in matrix.columns]
    if absent:
        raise TableInputError(f"{path}: the study matrix lacks the columns {absent}: make it again (rule study_matrix) with this scalerepro")
    if matrix["run_id"].duplicated().any():
        raise TableInputError(f"{path}: run_id repeats: {sorted(matrix.loc[matrix.run_id.duplicated(), 'run_id'])}: make it again (rule study_matrix)")
    for column, default in OPTIONAL_MATRIX_COLUMNS.items():  # a matrix from before the column
        matrix[column] = matrix[column].fillna(default) if column in matrix.columns else default
    # data_parallel: the replicas reading different data; every rank is one under DDP (older matrices)
    matrix["data_parallel"] = matrix["data_parallel"].fillna(matrix["gpus"]).astype(int)
    # cell: the planned cell each run repeats; a matrix from before the column names its runs
    # <cell>_r<repeat> (scalerepro.planning.study.Run.cell)
    derived = [run_id.removesuffix(f"_r{repeat}") for run_id, repeat in zip(matrix["run_id"], matrix["repeat"])]
    matrix["cell"] = matrix["cell"].astype(str).where(matrix["cell"].astype(str).ne(""), derived)
    folder = Path(study) if study is not None else study_layout.study_folder_of(path)
    files = []
    for run_id, recorded in zip(matrix["run_id"], matrix["record"].fillna("")):
        try:
            files.append(str(study_layout.record_file(recorded, folder)) if recorded else "")
        except study_layout.OutsideStudy as error:
            raise TableInputError(
                f"{path}: the record of run {run_id}, {error}: a study is read from its own folder (give the folder that holds "
                "its tables/ and runs/, whatever it is called)"
            ) from None
    return matrix.assign(variant=matrix["variant"].fillna(""), grad_accum_steps=matrix["grad_accum_steps"].astype(int), record_file=files)


def _mixed_cells(runs: pd.DataFrame, recorded: list[cells.Cell | None]) -> pd.Series:
    """Why each completed run's cell mixes configurations ("" where it does not). The completed
    repeats of a planned cell must agree on every condition their records state beside the plan
    (scalerepro.record.cell.RUN_CONDITIONS: each stated by all or by none): where they do not, none of
    the cell's runs counts, since which of them ran the configuration cannot be told. And for the
    strong and weak studies, whose efficiencies set a model's GPU counts against each other, a run
    on another device than most of that model's runs in the study does not count (with no device
    most ran on, none counts)."""
    why = pd.Series("", index=runs.index, dtype=object)

    def add(index: pd.Index, text: str) -> None:
        why.loc[index] = [f"{existing}; {text}" if existing else text for existing in why.loc[index]]

    done = runs[runs["status"].eq("ok") & runs["consistency"].isna()]
    for _, planned in done.groupby("cell", sort=False):
        differing = cells.differences([cell for position in planned.index if (cell := recorded[position]) is not None])
        if differing:
            add(planned.index, f"its repeats differ in {'; '.join(differing)}")
    for (study, model), group in done[done["study"].isin(["strong", "weak"])].groupby(["study", "model"], sort=False):
        devices = group["device_name"].fillna("not stated").value_counts()
        if len(devices) > 1:
            most = devices.index[0] if devices.iloc[0] > len(group) / 2 else None
            others = group.index[group["device_name"].fillna("not stated").ne(most)] if most is not None else group.index
            add(others, f"the {study} study's {model} runs ran on {', '.join(sorted(devices.index))}: its efficiencies would set one against another")
    return why


def read_runs(matrix: pd.DataFrame, quiet: Sequence[evidence.Bound] = evidence.QUIET) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """runs, epochs and loss_log tables: every matrix row left-joined with its record (read from
    ``record_file``, read_matrix's resolution of the matrix's path), each window held to
    ``quiet`` (the study's: scalerepro.record.evidence.quiet of its targets)."""
    # Sequential on purpose: json.loads holds the GIL and a page-cached read is ~20 us, so a
    # thread pool was measured slower (10,000 records: 1.5-2.8 s with 2-8 threads vs 1.1 s).
    # The run each record must be is its matrix row: its run id (where a study planned it:
    # rebuild --records names runs after their files; a row that reads another cell's run,
    # record_of, must find that run's id), its model and every knob the plan sets.
    rows = matrix.to_dict("records")
    planned = [{**row, "run_id": (row.get("record_of") or row["run_id"]) if row.get("study") != RECORDS_STUDY else None} for row in rows]
    files = matrix["record_file"] if "record_file" in matrix.columns else matrix["record"]
    parsed = [read_record(*row, quiet=quiet) for row in zip(matrix["run_id"], files, planned, matrix["record"].fillna(""))]
    fields = pd.DataFrame.from_records([p.fields for p in parsed], columns=RECORD_COLUMNS)
    runs = matrix.reset_index(drop=True).merge(fields, on="run_id", how="left", validate="one_to_one")
    ended = pd.to_datetime(runs["ended_at"], format="ISO8601", utc=True)
    started = pd.to_datetime(runs["started_at"], format="ISO8601", utc=True)
    runs["duration_s"] = (ended - started).dt.total_seconds()
    for column in (
        "world_size_recorded",
        "nodes_recorded",
        "peak_memory_bytes",
        "per_gpu_batch_recorded",
        "grad_accum_recorded",
        "tokens_per_sample",
        "image_size",
        "seq_len",
        "state_bytes_per_rank_max",
        "state_bytes_per_rank_min",
        *record_columns.MEMORY_SPLIT,
    ):
        runs[column] = runs[column].astype("Int64")
    runs["channels_last"] = runs["channels_last"].astype("boolean")
    mixed = _mixed_cells(runs, [p.cell for p in parsed])
    runs["consistency"] = ["; ".join(filter(None, [own if isinstance(own, str) else "", cell])) or None for own, cell in zip(runs["consistency"], mixed)]
    # consistent: a completed run whose record states every knob of its plan, each as planned, on a
    # machine of its own, in a cell whose repeats agree; a run that did not complete is not judged (True: failed, not
    # inconsistent); empty where there is no record
    runs["consistent"] = runs["consistency"].isna().astype("boolean").where(runs["status"].isin(["ok", "failed", "preempted"]))
    runs["git_dirty"] = runs["git_dirty"].astype("boolean")
    epochs = pd.DataFrame.from_records([row for p in parsed for row in p.epochs], columns=EPOCH_COLUMNS)
    losses = pd.DataFrame.from_records([row for p in parsed for row in p.losses], columns=LOSS_COLUMNS)
    # Whether a run counts is decided here, once, and read from runs.csv by every table, figure
    # and the report.
    runs["counts"] = counts(runs)
    runs["probe_of"] = cell_probes(runs)
    return runs[list(RUN_COLUMNS)], epochs, losses


# The exposed-communication probe's figures a run's window needs for its overlap cost
# (loss_decomposition.run_quantities): a run whose probe was off by plan takes them from its cell.
OVERLAP_FIELDS = ("nosync_rank_mean_s", "sync_compute_rank_mean_s", "overlap_cost_se_s")


def cell_probes(runs: pd.DataFrame) -> pd.Series:
    """The run whose probe gives each run its overlap cost (None where none does), filling in the
    OVERLAP_FIELDS of runs whose probe was off by plan.

    Under a study budget the probes measure each configuration once, in its repeat 1
    (scalerepro.planning.study: later rounds time the window only): the probe measures what the
    all-reduce running beside the backward costs the backward, a property of the configuration,
    not of one window. A counted run of the cell whose probe ran, the lowest repeat, gives its
    figures to the cell's counted runs whose probe did not run; the rest keep their own or none.
    The window's own parts are every run's own: the overlap cost only moves time between
    compute inflation and exposed comm (loss_decomposition), and the loss they add up to is the
    run's."""
    probed = runs["sync_compute_rank_mean_s"].notna() & runs["nosync_rank_mean_s"].notna()
    source = runs["run_id"].where(probed).astype(object)
    source = source.where(source.notna(), None)
    takers = runs["counts"].astype(bool) & ~probed & runs["exposed_comm_reason"].eq(PROBE_OFF_REASON)
    if not takers.any():
        return source
    for _, cell in runs[runs["counts"].astype(bool)].groupby("cell", sort=False):
        donors = cell[probed.loc[cell.index]].sort_values("repeat")
        needing = cell.index[takers.loc[cell.index]]
        if donors.empty or needing.empty:
            continue
        donor = donors.iloc[0]
        for field in OVERLAP_FIELDS:
            runs.loc[needing, field] = donor[field]
        source.loc[needing] = donor["run_id"]
    return source


# --------------------------------------------------------------------------------------------
# Communication and published references
# --------------------------------------------------------------------------------------------


COMM_KEYS = {"world_size": int, "nodes": int, "backend": str, "results": list}


def read_comm(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One all-reduce benchmark result (``scalerepro.training.commbench``), read within bounds and
    with the keys the tables use; a TableInputError naming the file otherwise."""
    try:
        document = read_json_object(path, what="all-reduce benchmark result", max_bytes=16 << 20)
    except JsonFileError as error:
        raise TableInputError(f"{error}: run the all-reduce benchmark again (rule comm_benchmark)") from None
    wrong = [key for key, kind in COMM_KEYS.items() if not isinstance(document.get(key), kind)]
    if wrong:
        raise TableInputError(f"{path} lacks {', '.join(wrong)} of an all-reduce benchmark result: run the all-reduce benchmark again (rule comm_benchmark)")
    return document


def communication_table(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """All-reduce results of every file; the bandwidths are checked against the times."""
    frames = []
    for path in paths:
        document = read_comm(path)
        frame = pd.DataFrame(document["results"], columns=["size_bytes", "time_us_median", "algbw_gbps", "busbw_gbps"])
        n = document["world_size"]
        algbw = frame["size_bytes"] / (frame["time_us_median"] * 1e3)  # algbw = size / t, in GB/s
        busbw = algbw * 2 * (n - 1) / n  # busbw = algbw * 2 (N - 1) / N
        consistent = np.allclose(frame["algbw_gbps"], algbw, rtol=1e-6) and np.allclose(frame["busbw_gbps"], busbw, rtol=1e-6)
        if not consistent:
            raise TableInputError(f"{path}: algbw_gbps/busbw_gbps disagree with size / time and 2 (N - 1) / N for N = {n}: run the all-reduce benchmark again")
        frames.append(frame.assign(gpus=n, nodes=document["nodes"], backend=document["backend"]))
    if not frames:
        return pd.DataFrame(columns=COMM_COLUMNS)
    table = pd.concat(frames, ignore_index=True)[list(COMM_COLUMNS)]
    return table.sort_values(["gpus", "size_bytes"], ignore_index=True)
