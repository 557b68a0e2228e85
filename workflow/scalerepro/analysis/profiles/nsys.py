"""Reading an `nsys export --type sqlite` file: the CUPTI kernel and NVTX tables of each rank."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.profiles.intervals import NCCL_KERNEL, WHOLE_CAPTURE, ProfileError, Timeline
from scalerepro.common.range_names import RANGE_PREFIX

# NVTX_EVENTS.eventType (ENUM_NSYS_EVENT_TYPE) of the two kinds of range: push/pop (what
# torch.cuda.nvtx.range writes) and start/end (nvtxRangeStart/End, torch.cuda.nvtx.range_start).
NVTX_PUSH_POP_RANGE, NVTX_START_END_RANGE = 59, 60


def _pid(global_id: int) -> int:
    """The process id inside an nsys serialized globalTid/globalPid (bits 24..47)."""
    return (int(global_id) >> 24) & 0xFFFFFF


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def read_nsys_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What an export says about its own capture, where it says it: the Nsight Systems version
    (META_DATA_EXPORT), the traced event types (META_DATA_CAPTURE CAPTURE_EVENT_TYPE), the GPUs
    (TARGET_INFO_GPU) and the driver (TARGET_INFO_SYSTEM_ENV). Tables and rows an older export
    lacks are left out, never guessed."""
    path = Path(path)
    meta: dict[str, Any] = {"file": path.name}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as error:
        raise ProfileError(f"{path}: not an SQLite export of Nsight Systems ({error})") from None
    with contextlib.closing(db):
        if "META_DATA_EXPORT" in tables:
            export = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT"))
            version = " ".join(v for v in (export.get("EXPORT_PRODUCT_NAME"), export.get("EXPORT_PRODUCT_VERSION")) if v)
            meta["tool_version"] = version or None
            meta["schema_version"] = export.get("EXPORT_SCHEMA_VERSION")
        if "META_DATA_CAPTURE" in tables:
            meta["traced"] = sorted({v for n, v in db.execute("SELECT name, value FROM META_DATA_CAPTURE") if n == "CAPTURE_EVENT_TYPE"})
        if "TARGET_INFO_GPU" in tables and "name" in _columns(db, "TARGET_INFO_GPU"):
            columns = _columns(db, "TARGET_INFO_GPU")
            cc = "computeMajor || '.' || computeMinor" if {"computeMajor", "computeMinor"} <= columns else "NULL"
            meta["gpus"] = [
                f"{name} (compute capability {c})" if c else name for name, c in db.execute(f"SELECT DISTINCT name, {cc} FROM TARGET_INFO_GPU ORDER BY name")
            ]
        if "TARGET_INFO_SYSTEM_ENV" in tables and {"name", "value"} <= _columns(db, "TARGET_INFO_SYSTEM_ENV"):
            drivers = [v for (v,) in db.execute("SELECT DISTINCT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CudaDriverVersion'")]
            meta["driver"] = ", ".join(drivers) or None
        meta["cuda_api_calls"] = (
            db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables else None
        )
        meta["tables"] = tables
    return meta


def _no_kernel(path: Path, meta: Mapping[str, Any], what: str) -> ProfileError:
    """The one-line error for an export without kernels, saying what the capture itself shows."""
    traced, calls = meta.get("traced"), meta.get("cuda_api_calls")
    if (traced and "Cuda" in traced) or calls:
        evidence = "; ".join(
            x for x in (f"capture metadata traces {', '.join(traced)}" if traced else "", f"{calls} CUDA API calls recorded" if calls else "") if x
        )
        return ProfileError(
            f"{path}: {what}, though CUDA was traced ({evidence}): no kernel ran between cudaProfilerStart "
            "and cudaProfilerStop; check that the trainer reached its profiling window (profile.log)"
        )
    if traced is not None:
        return ProfileError(f"{path}: {what}, and the capture traced {', '.join(traced) or 'nothing'} but not CUDA: profile with nsys --trace=cuda")
    return ProfileError(f"{path}: {what}, and the export records neither CUDA API calls nor what was traced: was --trace=cuda on?")


def read_nsys_sqlite(path: str | os.PathLike[str]) -> list[Timeline]:
    """One Timeline per (process, GPU) in an ``nsys export --type sqlite`` file. Kernels come from
    CUPTI_ACTIVITY_KIND_KERNEL (names through StringIds), ranges from NVTX_EVENTS (push/pop or
    start/end; text, or textId through StringIds) of the same process; timestamps are nanoseconds
    on the session's clock.

    The window starts at the first ``scalerepro:step`` range and ends at the later of the last
    step range's end and the end of the last kernel launched inside the steps (the ranges are host
    time: the last step's kernels run on after its range closes). A kernel's launch is its CUDA
    API call (CUPTI_ACTIVITY_KIND_RUNTIME, same correlationId and process); without that table,
    its start (the capture range is the window: the trainer synchronises at both of its edges).
    Without step ranges the window is the whole capture, labelled so and provisional."""
    path = Path(path)
    meta = read_nsys_metadata(path)
    tables = meta["tables"]
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        raise _no_kernel(path, meta, "no CUPTI_ACTIVITY_KIND_KERNEL table")
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        launch = "k.start"
        join = ""
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            launch = "COALESCE(r.start, k.start)"
            # one launch per kernel: correlation ids are unique within a process (bits 24+ of the ids)
            join = (
                "LEFT JOIN (SELECT correlationId, globalTid >> 24 AS process, MIN(start) AS start "
                "FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1, 2) AS r "
                "ON r.correlationId = k.correlationId AND r.process = (k.globalPid >> 24)"
            )
        kernels = pd.read_sql_query(
            f"SELECT k.start, k.end, {launch} AS launch, k.deviceId, k.globalPid, s.value AS name "
            f"FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s ON s.id = k.shortName {join}",
            db,
        )
        ranges = pd.DataFrame(columns=["start", "end", "globalTid", "name"])
        if "NVTX_EVENTS" in tables:
            text = "COALESCE(n.text, s.value)" if "textId" in _columns(db, "NVTX_EVENTS") else "n.text"
            join_text = "LEFT JOIN StringIds AS s ON s.id = n.textId" if "textId" in _columns(db, "NVTX_EVENTS") else ""
            ranges = pd.read_sql_query(
                f"SELECT n.start, n.end, n.globalTid, {text} AS name FROM NVTX_EVENTS AS n {join_text} WHERE n.eventType IN (?, ?) AND n.end IS NOT NULL",
                db,
                params=(NVTX_PUSH_POP_RANGE, NVTX_START_END_RANGE),
            )
    if kernels.empty:
        raise _no_kernel(path, meta, "CUPTI_ACTIVITY_KIND_KERNEL is empty")
    ranges = ranges.assign(pid=ranges["globalTid"].map(_pid))
    ns = 1e-9
    timelines = []
    for (global_pid, device), group in kernels.groupby(["globalPid", "deviceId"], sort=True):
        own = ranges[ranges["pid"].eq(_pid(global_pid))]
        steps = own[own["name"].eq(RANGE_PREFIX + "step")]
        if len(steps):
            first, last = steps["start"].min(), steps["end"].max()
            launched = group[group["launch"].between(first, last)]
            end = max(last, launched["end"].max()) if len(launched) else last
            window, label = (first * ns, end * ns), f"{len(steps)} {RANGE_PREFIX}step ranges, to the end of their last kernel"
        else:
            window, label = (group["start"].min() * ns, group["end"].max() * ns), WHOLE_CAPTURE
        is_comm = group["name"].str.match(NCCL_KERNEL)
        spans = list(zip(group["start"] * ns, group["end"] * ns))
        data = own[own["name"].eq(RANGE_PREFIX + "data")]
        timelines.append(
            Timeline(
                source="nsys",
                rank=f"{path.stem} pid {_pid(global_pid)} GPU {device}",
                window=window,
                steps=len(steps),
                compute=[span for span, comm in zip(spans, is_comm) if not comm],
                communication=[span for span, comm in zip(spans, is_comm) if comm],
                data_wait=list(zip(data["start"] * ns, data["end"] * ns)),
                calls=pd.DataFrame(
                    {
                        "name": group["name"].to_numpy(),
                        "kind": is_comm.map({True: "communication", False: "compute"}).to_numpy(),
                        "duration_s": ((group["end"] - group["start"]) * ns).to_numpy(),
                        "start": (group["start"] * ns).to_numpy(),
                        "end": (group["end"] * ns).to_numpy(),
                    }
                ),
                window_label=label,
            )
        )
    return timelines
