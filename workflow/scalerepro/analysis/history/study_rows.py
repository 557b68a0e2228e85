"""A study as rows of the results store, read from the files its workflow wrote (the matrix, the
records, the resolved config, the system inventory), and the checks on those rows wherever they
come from (the workflow's files, a bundle): every field fits its column, and every run row is
what the record it carries measured.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerepro.analysis.history.store_file import RUN_TYPES, STORED_RUN_COLUMNS, STUDY_TYPES, StoreError
from scalerepro.analysis.tables import readers
from scalerepro.analysis.values import plain
from scalerepro.common.files import sha256_of
from scalerepro.common.terminal import printable
from scalerepro.record import columns as record_columns
from scalerepro.record import evidence
from scalerepro.record.read import RecordUnreadable, from_document

# Config sections that say where a study is kept and what it is compared with, not what it ran.
UNHASHED_CONFIG_KEYS = ("store", "compare")


# --------------------------------------------------------------------------------------------
# A study, from the files its workflow wrote
# --------------------------------------------------------------------------------------------


@dataclass
class StoredStudy:
    """One study as rows of the store: its ``studies`` row and its ``runs`` rows."""

    row: dict[str, Any]
    runs: list[dict[str, Any]]

    @property
    def study_id(self) -> str:
        return self.row["study_id"]


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the resolved config as canonical JSON, without ``UNHASHED_CONFIG_KEYS``."""
    measured = {key: value for key, value in config.items() if key not in UNHASHED_CONFIG_KEYS}
    return hashlib.sha256(canonical_json(measured).encode("utf-8")).hexdigest()


def make_study_id(hash_hex: str, started_at: str) -> str:
    start = datetime.datetime.fromisoformat(started_at).astimezone(datetime.timezone.utc)
    return f"{hash_hex[:12]}-{start.strftime('%Y%m%dT%H%M%S')}.{start.microsecond // 1000:03d}Z"


def distinct_joined(values: Iterable[Any]) -> str | None:
    """Distinct values, sorted and ", "-joined (None when there are none)."""
    distinct = sorted({str(value) for value in values if value is not None and value != ""})
    return ", ".join(distinct) or None


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON document at ``path`` (the ``what`` a workflow rule wrote); a StoreError saying which rule to run when it is absent or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"no {what} at {path}: run the workflow up to it first") from None
    except ValueError as error:
        raise StoreError(f"{path} is not valid JSON ({error}): rerun the rule that writes the {what}") from None


def read_study(
    matrix_path: str | os.PathLike[str],
    config_path: str | os.PathLike[str],
    inventory_path: str | os.PathLike[str],
) -> StoredStudy:
    """The study the workflow's files describe: the matrix joined with the records (as the
    aggregation joins them), the resolved config and the system inventory."""
    config = read_json(config_path, "resolved config")
    inventory = read_json(inventory_path, "system inventory")
    try:
        matrix = readers.read_matrix(matrix_path)
    except FileNotFoundError:
        raise StoreError(f"no study matrix at {matrix_path}: run the workflow up to it first") from None
    runs, _, _ = readers.read_runs(matrix, evidence.quiet(config.get("targets") or {}))
    record_files = dict(zip(matrix["run_id"], matrix["record_file"]))
    scheduler = inventory.get("scheduler") or {}
    cluster = scheduler.get("cluster_name") or inventory.get("hostname")
    partition = scheduler.get("partition")
    drivers = [gpu.get("driver") for gpu in inventory.get("gpus") or []]

    rows = []
    for run in runs.to_dict("records"):
        text = record = None
        if run["status"] != "missing":  # aggregate read and parsed it
            text = Path(record_files[run["run_id"]]).read_text(encoding="utf-8")  # readers.read_matrix: inside the study folder
            record = from_document(json.loads(text)).record
        row = {column: plain(run.get(column), keep_blank_text=True) for column in STORED_RUN_COLUMNS if column in run}
        # The record is the truth: the batch the run ran, as its record says (the plan's where there is no
        # record or it does not say). One that disagrees with its plan is not consistent (readers.read_runs).
        recorded_batch = plain(run.get("per_gpu_batch_recorded"), keep_blank_text=True)
        row.update(
            record_of=row.get("record_of") or "",  # "": the run is its own
            per_gpu_batch=row.get("per_gpu_batch") if recorded_batch is None else recorded_batch,
            variant=run["variant"] or "",
            cluster=(record.scheduler.cluster_name or cluster) if record else None,
            partition=(record.scheduler.partition or partition) if record else None,
            node_list=distinct_joined(record.parallel.hostnames if record else []),
            cuda_version=record.versions.get("cuda") if record else None,
            nccl_version=record.versions.get("nccl") if record else None,
            driver_version=record.hardware.gpu.driver_version if record else None,
            record_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest() if text is not None else None,
            record=text,
        )
        rows.append({column: row.get(column) for column in STORED_RUN_COLUMNS})

    started = [row["started_at"] for row in rows if row["started_at"]]
    if not started:
        raise StoreError(f"no run of the study in {matrix_path} has a record: there is nothing to store yet")
    first = min(started, key=lambda stamp: datetime.datetime.fromisoformat(stamp))
    ended = [row["ended_at"] for row in rows if row["ended_at"]]
    digest = config_hash(config)
    study_id = make_study_id(digest, first)
    for row in rows:
        row["study_id"] = study_id
    container = config.get("container") or {}
    sif = Path(container["sif"]) if container.get("enabled") and container.get("sif") else None
    dirty = {row["git_dirty"] for row in rows if row["git_dirty"] is not None}
    study = {
        "study_id": study_id,
        "config_hash": digest,
        "started_at": first,
        "ended_at": max(ended, key=lambda stamp: datetime.datetime.fromisoformat(stamp)) if ended else None,
        "study_name": config.get("study_name"),
        "git_commit": distinct_joined(row["git_commit"] for row in rows),
        "git_dirty": (True in dirty) if dirty else None,
        "cluster": cluster,
        "partition": partition,
        "node_list": distinct_joined(host for row in rows for host in (row["node_list"] or "").split(", ")),
        "container_image": container.get("base_image") if container.get("enabled") else None,
        "container_digest": f"sha256:{sha256_of(sif)}" if sif is not None and sif.is_file() else None,
        "torch_version": distinct_joined(row["torch_version"] for row in rows),
        "cuda_version": distinct_joined(row["cuda_version"] for row in rows),
        "nccl_version": distinct_joined(row["nccl_version"] for row in rows),
        "driver_version": distinct_joined(drivers) or distinct_joined(row["driver_version"] for row in rows),
        "device_type": distinct_joined(row["device_type"] for row in rows),
        "device_name": distinct_joined(row["device_name"] for row in rows),
        "runs": len(rows),
        "runs_ok": sum(bool(row["counts"]) for row in rows),
        "config_json": canonical_json(config),
        "inventory_json": canonical_json(inventory),
        "appended_at": None,  # set when appended
    }
    return StoredStudy(study, rows)


# --------------------------------------------------------------------------------------------
# Every field fits its column
# --------------------------------------------------------------------------------------------

# Python types a column takes (bool is an int to Python: refused where a number is meant).
_ACCEPTS: dict[str, tuple[type[Any], ...]] = {"VARCHAR": (str,), "INTEGER": (int,), "BIGINT": (int,), "DOUBLE": (int, float), "BOOLEAN": (bool,)}
_INTEGER_RANGE = {"INTEGER": 2**31, "BIGINT": 2**63}
_TIMESTAMPS = ("started_at", "ended_at", "appended_at")
MAX_TEXT = 1 << 20  # a field's characters (a record or a config as JSON is the longest, far below)


def _field_problem(name: str, kind: str, value: Any) -> str | None:
    """Why ``value`` cannot be column ``name`` of SQL type ``kind`` (None: it can)."""
    base, required = kind.split()[0], "NOT NULL" in kind or "PRIMARY KEY" in kind
    if value is None:
        return "missing" if required else None
    accepted = _ACCEPTS[base]
    if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
        return f"a {type(value).__name__}, not {base.lower()}"
    if base in _INTEGER_RANGE and not -_INTEGER_RANGE[base] <= value < _INTEGER_RANGE[base]:
        return f"{value} is outside the range of {base.lower()}"
    if base == "DOUBLE" and not math.isfinite(value):
        return f"{value} is not a finite number"
    if base == "VARCHAR" and len(value) > MAX_TEXT:
        return f"{len(value)} characters, more than {MAX_TEXT}"
    if name in _TIMESTAMPS:
        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            return f"{value[:40]!r} is not an ISO 8601 time"
    return None


def check_rows(study: StoredStudy) -> None:
    """Every field of the study's rows fits its column (type, range, format): what the store
    accepts, every reader can read; then every run row is what its record measured
    (``check_records``). Raises StoreError naming the first field that does not."""
    for where, row, types in (("study", study.row, STUDY_TYPES), *((f"run {i}", run, RUN_TYPES) for i, run in enumerate(study.runs))):
        for name, kind in types.items():
            problem = _field_problem(name, kind, row.get(name))
            if problem:
                raise StoreError(f"study {str(study.row.get('study_id'))[:80]!r}: {where}: {name} is {problem}: nothing stored")
    check_records(study)


# --------------------------------------------------------------------------------------------
# Every run row is what its record measured
# --------------------------------------------------------------------------------------------

# A runs row copies its figures from the record it carries (``record``, its text; ``record_sha256``):
# rows and record travel together in a bundle, and a bundle's checksums are the sender's, so a figure
# rewritten beside its record (the manifest rewritten to match) passes them. The record decides.

# The store's figures: each a column of the runs table the record model declares, inside its bound.
RECORD_FIGURES = tuple(column for column in RUN_TYPES if column in record_columns.FIGURES)
# What a counted row's cell says the run ran, and the field of the record's cell that states it:
# a run counts only where it ran its plan, and the cell is the plan.
RECORD_SHAPE = {"gpus": "world_size", "nodes": "nodes", "per_gpu_batch": "micro_batch"}
# The figures a counted row must hold: what the history and the comparison read (the aggregation
# fails an ok record without a throughput). Any other figure may be empty where its record has one:
# the aggregation empties the figures of a record that is no measurement, and withholds those a
# trainer is known to have measured wrongly, by rules that grow; a bundle keeps the rows its
# exporter made. A figure that is there is its record's.
COUNTED_FIGURES = ("samples_per_s",)
# JSON text and DuckDB's DOUBLE carry a figure exactly (Python writes the shortest repr that reads
# back the same double); this much is rounding, more is another figure.
FIGURE_RELATIVE_TOLERANCE = 1e-9


def _same_figure(stored: Any, recorded: Any) -> bool:
    if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or not math.isfinite(recorded):
        return False
    return math.isclose(stored, recorded, rel_tol=FIGURE_RELATIVE_TOLERANCE, abs_tol=0.0)


def record_problem(run: Mapping[str, Any]) -> str | None:
    """Why the run row is not what the record it carries measured, or None: a figure out of its
    bound, a row counted that is not ok (or not consistent with its plan), a status, time, figure or
    cell that its record does not state. Rows whose fields fit their columns (``check_rows``)."""
    status, counted = run.get("status"), run.get("counts") is True
    out_of_bounds = [f"{column} is {why}" for column in RECORD_FIGURES if (why := record_columns.FIGURES[column].problem(run.get(column)))]
    if out_of_bounds:
        return f"{out_of_bounds[0]}: no record measures that"
    if counted and status != "ok":
        return f"it counts but its status is {status!r}: only a run whose status is ok counts"
    if counted and run.get("consistent") is False:
        return "it counts but it did not run its plan (consistent is false)"
    text = run.get("record")
    if text is None:
        if status != "missing":
            return f"its status is {status!r} but it carries no record: a run without a record is missing"
        measured = [column for column in RECORD_FIGURES if run.get(column) is not None]
        if measured:
            return f"{measured[0]} is {run[measured[0]]!r} but it carries no record that measured it"
        return "it carries no record but a record_sha256" if run.get("record_sha256") is not None else None
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != run.get("record_sha256"):
        return "its record_sha256 is not the sha256 of the record it carries"
    try:
        document = json.loads(text)
    except (RecursionError, ValueError):
        return "the record it carries is not JSON"
    if not isinstance(document, dict):
        return f"the record it carries is a JSON {type(document).__name__}, not an object"
    try:
        reading = from_document(document)
    except RecordUnreadable as error:
        return f"the record it carries is no run record this code reads: {error}"
    # the run the record must be, as the aggregation asks (rebuild --records names runs after their files;
    # a row that reads another cell's run, record_of, carries that run's record)
    own = run.get("record_of") or run.get("run_id") if run.get("study") != readers.RECORDS_STUDY else None
    other = readers.identity_problem(reading, own, run.get("model"))
    if other:
        return f"the record it carries is not this run's: {other}"
    recorded_status = reading.record.status
    # the aggregation fails an ok record whose figures are no measurement or whose window is empty; it never passes a failed one
    if status != recorded_status and not (status == "failed" and recorded_status == "ok"):
        return f"its status is {status!r} but its record's is {recorded_status!r}"
    if run.get("started_at") != reading.record.started_at:
        return f"its started_at is {run.get('started_at')!r} but its record's is {reading.record.started_at!r}"
    recorded_row = reading.row()
    for column in RECORD_FIGURES:
        stored, recorded = run.get(column), recorded_row[column]
        if stored is None:
            if counted and column in COUNTED_FIGURES:
                return f"it counts but its {column} is empty (its record's is {recorded!r})"
        elif not _same_figure(stored, recorded):
            return f"its {column} is {stored!r} but its record's is {recorded!r}"
    if counted:
        for column, field in RECORD_SHAPE.items():
            ran = getattr(reading.cell, field)
            if ran is not None and ran != run.get(column):
                return f"it counts as {column} {run.get(column)!r} but its record ran {ran!r}"
    return None


def check_records(study: StoredStudy) -> None:
    """Every run row is what the record it carries measured (``record_problem``). Raises StoreError
    naming the first run that is not, and what differs."""
    for run in study.runs:
        problem = record_problem(run)
        if problem:
            raise StoreError(
                f"study {str(study.row.get('study_id'))[:80]!r}: run {printable(str(run.get('run_id')))[:80]!r}: {problem}: "
                "a stored row is what its record measured; these rows are refused, nothing stored"
            )
