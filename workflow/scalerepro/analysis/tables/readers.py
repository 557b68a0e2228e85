"""Reading a study's files into frames: the matrix, each run's JSON record (one row of runs.csv, its
epochs and its loss curve) and the communication benchmark's CSVs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import (
    COMM_COLUMNS,
    EPOCH_COLUMNS,
    LOSS_COLUMNS,
    MATRIX_COLUMNS,
    MEMORY_SPLIT,
    OPTIONAL_MATRIX_COLUMNS,
    RECORD_COLUMNS,
    RECORD_FIELDS,
    RUN_COLUMNS,
)
from scalerepro.analysis.evidence import (
    FIGURE_BOUNDS,
    EvidenceError,
    dig,
    figure_problems,
    identity_problem,
    plan_problems,
    read_json_document,
    record_problems,
    record_purpose,
    schema_problem,
    withheld,
)
from scalerepro.analysis.tables.cell_tables import counts
from scalerepro.common import study_layout
from scalerepro.common.cli import CommandError
from scalerepro.common.cuda_graphs import replays_cuda_graphs
from scalerepro.common.probe_off import PROBE_OFF_REASON


class TableInputError(CommandError, ValueError):
    """A study file the aggregation reads is not what the workflow writes; the message names it and the fix."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


RECORDS_STUDY = "records"  # rebuild --records' study column: runs no study planned, named after their files


def cuda_graph_replays(document: dict[str, Any]) -> bool:
    """Whether a record's run trained by replaying CUDA graphs: compiled in a graph mode, on CUDA."""
    return replays_cuda_graphs(dig(document, ("parallel", "device_type")), dig(document, ("knobs", "compile")))


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


def read_record(run_id: str, path: str, planned: dict[str, Any] | None = None, named: str | None = None) -> tuple[dict[str, Any], list[tuple], list[tuple]]:
    """One record as (its runs.csv fields, its epochs.csv rows, its loss_log.csv rows), read at
    ``path`` and named in its messages ``named`` (the matrix's path, as the study names it: a
    message shows no path of the machine that read it), by default ``path``.

    A record that is absent, unreadable, out of bounds (``evidence.read_json_document``), of a
    schema this code does not read, or another run's (``planned``: the matrix row, whose run id and
    model it must state: ``evidence.identity_problem``) gives status "missing" and the reason as
    its error: the run has no record of its own. One whose figures are no measurement
    (``evidence.figure_problems``: negative, infinite, NaN, text) or do not agree with each other
    (``evidence.record_problems``) gives status "failed". A completed run whose record departs from
    the rest of its plan (``evidence.plan_problems``) is not ``consistent``, and says why in
    ``consistency``. A figure the record is known to hold wrongly (``evidence.withheld``) is
    empty, and ``withheld`` says why."""
    planned = planned or {}
    shown = named or path
    try:
        document = read_json_document(path)
    except FileNotFoundError:
        return {"run_id": run_id, "status": "missing", "error": f"no run record at {shown}{_log_ending(Path(path).parent / 'train.log', shown)}"}, [], []
    except (OSError, ValueError) as error:
        why = str(error).replace(str(path), shown) if isinstance(error, EvidenceError) else f"unreadable run record {shown}: {error}"
        return {"run_id": run_id, "status": "missing", "error": f"{why}: rerun this run"}, [], []
    unreadable = schema_problem(document)
    if unreadable:
        return {"run_id": run_id, "status": "missing", "error": f"the record at {shown} cannot be read here: {unreadable}"}, [], []
    other = identity_problem(document, {key: planned[key] for key in ("run_id", "model") if key in planned})
    if other:
        return {"run_id": run_id, "status": "missing", "error": f"the record at {shown} is not this run's: {other}: rerun this run"}, [], []
    fields = {column: dig(document, where) for column, where in RECORD_FIELDS.items()}
    if fields["per_gpu_batch_recorded"] is None:  # records of schema version 2 name it batch.per_rank
        fields["per_gpu_batch_recorded"] = dig(document, ("batch", "per_rank"))
    memory = dig(document, ("measurements", "memory")) or {}
    allocated, rss = memory.get("allocated_bytes_max"), memory.get("rss_bytes_max")
    allocated_kind = "cuda_allocated"
    if cuda_graph_replays(document) and memory.get("reserved_bytes_max") is not None:
        # A CUDA graph's replay allocates nothing through the caching allocator: its activations
        # live in the graph's private pool, which the window's "allocated" peak never sees
        # (ResNet-50 on an H100: 0.56 GiB allocated, 12.7 GiB reserved). The reserved peak holds
        # the pools; it bounds the step's memory from above (cached free blocks count too).
        allocated, allocated_kind = memory["reserved_bytes_max"], "cuda_reserved"
    history = document.get("history") or []
    last = history[-1] if history else {}
    purpose, purpose_basis = record_purpose(document)
    reasons = dig(document, ("measurements", "nvml", "clock_event_reasons"))
    knobs = document.get("knobs") or {}
    fields.update(
        # a record from before a lever was in the knobs ran its default
        **{lever: default if knobs.get(lever) is None else knobs[lever] for lever, default in LEVER_DEFAULTS.items()},
        run_id=run_id,
        error=dig(document, ("error", "message")),
        peak_memory_bytes=rss if allocated is None else allocated,
        peak_memory_kind=allocated_kind if allocated is not None else "rss" if rss is not None else None,
        final_train_loss=last.get("train_loss"),
        final_eval_loss=last.get("eval_loss"),
        final_eval_accuracy=last.get("eval_accuracy"),
        device_name=dig(document, ("hardware", "gpu", "name")) or dig(document, ("hardware", "cpu_model")),
        hostname=dig(document, ("hardware", "hostname")) or ", ".join(dig(document, ("parallel", "hostnames")) or []) or None,
        purpose_recorded=purpose,
        purpose_basis=purpose_basis,
        clock_event_reasons=_reason_shares(reasons),
        **_sharding(dig(document, ("measurements",))),
    )
    nonsense = figure_problems(fields)
    empty = fields["status"] == "ok" and not (dig(document, ("measurements", "measured_steps")) and fields["samples_per_s"])
    nonsense += record_problems(document) if not nonsense and not empty else []
    if nonsense:
        # a figure no measurement gives, or figures that disagree with each other: the record is
        # no evidence of a result (nor of any of its figures)
        fields.update({name: None for name in FIGURE_BOUNDS if name in fields})
        fields.update(status="failed", error=f"the record's figures are no measurement ({'; '.join(nonsense)}): rerun this run")
    elif empty:
        # A record with no measurements is a failure, whatever it says of itself.
        fields.update(status="failed", error="the record says ok but its measured window is empty (no steps, no throughput)")
    defects = withheld(document)
    fields.update({column: None for defect in defects for column in defect.columns if column in fields})
    fields["withheld"] = " | ".join(f"{', '.join(defect.columns)}: {defect.why}" for defect in defects) or None  # "<columns>: <why> | ..."
    departures = plan_problems(document, planned) if fields["status"] == "ok" else []
    fields["consistency"] = "; ".join(departures) or None
    if fields["scheduler_job_id"] is not None:
        fields["scheduler_job_id"] = str(fields["scheduler_job_id"])  # an integer or a string in the schema
    epochs = [(run_id, *map(entry.get, EPOCH_COLUMNS[1:])) for entry in history]
    losses = [(run_id, *map(entry.get, LOSS_COLUMNS[1:])) for entry in document.get("loss_log") or []]
    return fields, epochs, losses


def _reason_shares(reasons: Any) -> str | None:
    """measurements.nvml.clock_event_reasons (reason -> share of the window's samples it was
    active in) as text, most frequent first: "sw_power_cap 92 %, ..."; "none" where NVML read
    them and none was active; None where not read."""
    if not isinstance(reasons, dict):
        return None
    shares = sorted(((str(name), share) for name, share in reasons.items() if isinstance(share, (int, float))), key=lambda item: -item[1])
    return ", ".join(f"{name} {100 * share:.0f} %" for name, share in shares) or "none"


def _sharding(measurements: Any) -> dict[str, Any]:
    """The strategy a record says it ran (parallel_recorded: measurements.sharding.strategy, "ddp"
    where the entry is there and null, None where the record predates it or measured nothing),
    its device mesh as text ("2x2 (dp_shard, tp)"), its communication per step and its memory
    split per rank."""
    measurements = measurements if isinstance(measurements, dict) else {}
    split = _memory_split(measurements.get("memory_split"))
    unsharded = {"mesh": None, "comm_bytes_per_step": None, "comm_by_collective": None, **split}
    if "sharding" not in measurements:
        return {"parallel_recorded": None, **unsharded}
    sharding = measurements["sharding"]
    if not isinstance(sharding, dict):
        return {"parallel_recorded": "ddp", **unsharded}
    mesh = sharding.get("mesh") or {}
    shape = "x".join(str(n) for n in mesh.get("shape") or ())
    dims = ", ".join(mesh.get("dims") or ())
    # the analytic bytes a rank sends per optimizer step, by collective (the keys differ by strategy:
    # all_gather/reduce_scatter under fsdp, tp_* and dp_* under tp and fsdp+tp, send_* under pp)
    volume = sharding.get("comm_bytes_per_step_analytic")
    volume = {k: v for k, v in volume.items() if isinstance(v, (int, float))} if isinstance(volume, dict) else {}
    return {
        "parallel_recorded": sharding.get("strategy"),
        "mesh": f"{shape} ({dims})" if dims else shape or None,
        # communication per step = the sum over the collectives of the bytes each rank sends
        "comm_bytes_per_step": float(sum(volume.values())) if volume else None,
        "comm_by_collective": "; ".join(f"{k} {v:,.0f} B" for k, v in volume.items()) or None,
        **split,
    }


def _memory_split(split: Any) -> dict[str, Any]:
    """measurements.memory_split: bytes of parameters, gradients, optimizer state and activations,
    each the largest over the ranks (the rank that sets a GPU's memory need)."""
    ranks = split.get("per_rank") if isinstance(split, dict) else None
    if not isinstance(ranks, list) or not ranks:
        return dict.fromkeys(MEMORY_SPLIT)
    values = {column: [r[kind] for r in ranks if isinstance(r, dict) and r.get(kind) is not None] for column, kind in MEMORY_SPLIT.items()}
    return {column: max(found) if found else None for column, found in values.items()}


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


# The levers outside the presets (scalerepro.training.compilation, the ResNets' stem) and the value
# a record from before the knobs named them ran with.
LEVER_DEFAULTS = {"compile_scope": "model", "attention_backend": "auto", "stem_channels": 3}
# The conditions a record states beside its plan that change its figures: the repeats of a cell
# agree on each, or the cell mixes configurations and none of its runs counts.
CELL_CONDITIONS = {
    "device_name": "device",
    "data_kind": "data",
    "image_size": "image size",
    "seq_len": "sequence length",
    "compile_mode": "compile mode",
    "channels_last": "memory format (channels_last)",
    "loader": "loader",
    "optimizer_impl": "optimizer implementation",
    "cudnn_benchmark": "cuDNN benchmark",
    "compile_scope": "compile scope",
    "attention_backend": "attention kernel",
    "stem_channels": "ResNet stem channels",
}
# What makes a matrix row one repeat of a cell: every planned column but these.
NOT_CELL_COLUMNS = ("run_id", "repeat", "record", "record_file", "rerun", "runtime_min", "record_of")


def _cell_keys(runs: pd.DataFrame) -> list[str]:
    """The planned columns that make a run one repeat of a cell (every one but NOT_CELL_COLUMNS)."""
    return [column for column in runs.columns if column in MATRIX_COLUMNS + tuple(OPTIONAL_MATRIX_COLUMNS) and column not in NOT_CELL_COLUMNS]


def _distinct(values: pd.Series) -> list[str]:
    return sorted({str(v) for v in values.dropna()})


def _mixed_cells(runs: pd.DataFrame) -> pd.Series:
    """Why each completed run's cell mixes configurations ("" where it does not). The completed
    repeats of a cell must agree on every condition of CELL_CONDITIONS (each stated by all or by
    none): where they do not, none of the cell's runs counts, since which of them ran the
    configuration cannot be told. And for the strong and weak studies, whose efficiencies set a
    model's GPU counts against each other, a run on another device than most of that model's runs
    in the study does not count (with no device most ran on, none counts)."""
    why = pd.Series("", index=runs.index, dtype=object)

    def add(index: pd.Index, text: str) -> None:
        why.loc[index] = [f"{existing}; {text}" if existing else text for existing in why.loc[index]]

    done = runs[runs["status"].eq("ok") & runs["consistency"].isna()]
    keys = _cell_keys(runs)
    for _, cell in done.groupby(keys, dropna=False, sort=False):
        differing = []
        for column, name in CELL_CONDITIONS.items():
            values, stated = _distinct(cell[column]), int(cell[column].notna().sum())
            if len(values) > 1 or (values and stated < len(cell)):
                differing.append(f"{name} ({', '.join(values + (['not stated'] if stated < len(cell) else []))})")
        if differing:
            add(cell.index, f"its repeats differ in {'; '.join(differing)}")
    for (study, model), group in done[done["study"].isin(["strong", "weak"])].groupby(["study", "model"], sort=False):
        devices = group["device_name"].fillna("not stated").value_counts()
        if len(devices) > 1:
            most = devices.index[0] if devices.iloc[0] > len(group) / 2 else None
            others = group.index[group["device_name"].fillna("not stated").ne(most)] if most is not None else group.index
            add(others, f"the {study} study's {model} runs ran on {', '.join(sorted(devices.index))}: its efficiencies would set one against another")
    return why


def read_runs(matrix: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """runs, epochs and loss_log tables: every matrix row left-joined with its record (read from
    ``record_file``, read_matrix's resolution of the matrix's path)."""
    # Sequential on purpose: json.loads holds the GIL and a page-cached read is ~20 us, so a
    # thread pool was measured slower (10,000 records: 1.5-2.8 s with 2-8 threads vs 1.1 s).
    # The run each record must be is its matrix row: its run id (where a study planned it:
    # rebuild --records names runs after their files), its model and every knob the plan sets.
    rows = matrix.drop(columns=[c for c in NOT_CELL_COLUMNS if c not in ("run_id", "record_of")], errors="ignore").to_dict("records")
    # a row that reads another cell's run (record_of) must find that run's id in the record
    planned = [
        {
            **{k: v for k, v in row.items() if k not in ("run_id", "record_of")},
            **({"run_id": row.get("record_of") or row["run_id"]} if row.get("study") != RECORDS_STUDY else {}),
        }
        for row in rows
    ]
    files = matrix["record_file"] if "record_file" in matrix.columns else matrix["record"]
    parsed = list(map(read_record, matrix["run_id"], files, planned, matrix["record"].fillna("")))
    fields = pd.DataFrame.from_records([p[0] for p in parsed], columns=RECORD_COLUMNS)
    runs = matrix.merge(fields, on="run_id", how="left", validate="one_to_one")
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
    ):
        runs[column] = runs[column].astype("Int64")
    runs["channels_last"] = runs["channels_last"].astype("boolean")
    for column in ("state_bytes_per_rank_max", "state_bytes_per_rank_min", *MEMORY_SPLIT):
        runs[column] = runs[column].astype("Int64")
    mixed = _mixed_cells(runs)
    runs["consistency"] = [
        ("; ".join(filter(None, [own, cell]))) or None if isinstance(own, str) or cell else None for own, cell in zip(runs["consistency"], mixed)
    ]
    # consistent: a completed run whose record states every knob of its plan, each as planned, in a
    # cell whose repeats agree; a run that did not complete is not judged (True: failed, not
    # inconsistent); empty where there is no record
    runs["consistent"] = runs["consistency"].isna().astype("boolean").where(runs["status"].isin(["ok", "failed", "preempted"]))
    runs["git_dirty"] = runs["git_dirty"].astype("boolean")
    epochs = pd.DataFrame.from_records([row for p in parsed for row in p[1]], columns=EPOCH_COLUMNS)
    losses = pd.DataFrame.from_records([row for p in parsed for row in p[2]], columns=LOSS_COLUMNS)
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
    keys = _cell_keys(runs)
    for _, cell in runs[runs["counts"].astype(bool)].groupby(keys, dropna=False, sort=False):
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
        document = read_json_document(path, what="all-reduce benchmark result", max_bytes=16 << 20)
    except EvidenceError as error:
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
