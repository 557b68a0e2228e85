"""Profiles -> a few numbers per run, and the run's bottleneck.

    python -m scalerepro.analysis.profile summarize --run-dir results/profiles/<run> --run-id <run> \
        --references config/references.yaml --gpu-peaks h100_sxm --thresholds '{...}' --out summary.json
    python -m scalerepro.analysis.profile table --summaries results/profiles/*/summary.json --out results/tables

What a profiling job leaves in ``results/profiles/<run>/<tool>/`` (``workflow/rules/profile.smk``):
``nsys/rank<R>.sqlite`` (``nsys export --type sqlite``), ``ncu/kernels.csv`` (``ncu --csv``,
long "details" layout: raw metric names as ``scalerepro.profile_rank`` asks for them, or the
sections' display names of any ncu version) and ``torch/trace.json`` + ``torch/operators.csv``
(the torch.profiler fallback, ``scalerepro.profiling``), each with a ``capture.json`` saying what
ran and why. What a reader cannot read (an unknown unit, a text value where a number belongs, a
kernel without a duration, a timeline without step ranges) is one line in the summary's
``warnings``, shown in the report; it never aborts the summary or reads as a figure.

Definitions. All times are over the profiling window W: from the start of the trainer's first
``scalerepro:step`` range (steps K .. K+M-1) to the later of the last step range's end and the end
of the last kernel launched inside the steps (the ranges are host time; the GPU runs on). An
export without step ranges gets the whole capture as W, labelled "whole capture (no step
ranges)", and its classification is provisional. |X| is the length of the union of intervals X.

    compute C          kernels that are not NCCL's (nsys, CUDA trace) / operators of the training
                       thread outside data loading (torch fallback on a CPU)
    communication N    NCCL kernels (nsys, CUDA trace) / gloo or NCCL collective ops (CPU)
    overlap            |N ∩ C|;  overlap fraction = |N ∩ C| / |N|
    exposed comm       |N \\ C| = |N| - |N ∩ C|   (communication nothing else hides)
    data wait          |D \\ (C ∪ N)|, D the host's ``scalerepro:data`` ranges: the device is idle
                       while the input pipeline is asked for the next batch
    idle               |W| - |C ∪ N| - data wait
    busy fraction      |C ∪ N| / |W|   (GPU busy fraction on a GPU)
    compute + exposed comm + data wait + idle = |W|, and each fraction is that time / |W|.

Roofline (Nsight Compute, per kernel, over its launches that have a duration; one without is
reported as missing, never as 0 s): FLOPs = FADD + FMUL + 2 FFMA (fp32, and likewise fp16 and
fp64 from the SASS thread-instruction counters), achieved FLOP/s = FLOPs / gpu__time_duration,
DRAM bytes = dram__bytes.sum (or, from sections only, DRAM bytes/s x duration),
arithmetic intensity AI = FLOPs / dram__bytes, attainable = min(peak FLOP/s, AI x peak DRAM B/s),
ridge = peak FLOP/s / peak DRAM B/s: a kernel left of the ridge is memory-bound. The SASS
counters do not see tensor-core work: a kernel's tensor-core FLOPs are estimated as tensor-pipe
utilisation x duration x the dense tensor peak of the run's precision, added to its SASS FLOPs,
and it is set against that tensor roof (``tensor_work`` says how, or why the tensor-core work
could not be counted). On Hopper the dense peak is wgmma's: a kernel whose tensor pipe is busy
with no wgmma instruction (mma.sync, or HFMA2.MMA in elementwise kernels) gets no estimate. The peaks are those of the GPU the capture names (``gpu_peaks`` in
config/references.yaml, keyed by device name: H100 SXM/PCIe/NVL, H200, A100) and of the run's
precision; the configured ``profiling.gpu_peaks`` applies only when the capture names no GPU.

Classification (thresholds from the config, ``profiling.classification``): each candidate has a
score = fraction / its threshold, communication-bound (exposed comm), input-bound (data wait),
launch/latency-bound (idle); the largest score of at least 1 names the bottleneck, else the run
is compute-bound. The evidence lists every fraction against its threshold.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import sqlite3
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

Interval = tuple[float, float]
RANGE_PREFIX = "scalerepro:"  # the trainer's range names (scalerepro.profiling.RANGES)
NCCL_KERNEL = re.compile(r"^nccl", re.IGNORECASE)  # ncclKernel_AllReduce_..., ncclDevKernel_...
COLLECTIVE_OP = re.compile(r"^(gloo|nccl|mpi|ucc):")  # torch.profiler's collective execution events
TOP_KERNELS = 10
CATEGORIES = ("compute", "exposed_comm", "data_wait", "idle")
CLASSES = ("compute-bound", "communication-bound", "input-bound", "launch/latency-bound")


class ProfileError(ValueError):
    """A profile file that cannot be read as what it claims to be; the message names the file."""


# --------------------------------------------------------------------------------------------
# Interval arithmetic (seconds; half-open [start, end))
# --------------------------------------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the given ones (empty ones dropped)."""
    merged: list[list[float]] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The union of ``a`` intersected with the union of ``b``."""
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The union of ``a`` without the union of ``b``."""
    out = []
    b = union(b)
    for start, end in union(a):
        cursor = start
        for s, e in b:
            if e <= cursor or s >= end:
                continue
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
        if cursor < end:
            out.append((cursor, end))
    return out


# --------------------------------------------------------------------------------------------
# One rank's timeline and its breakdown
# --------------------------------------------------------------------------------------------


@dataclass
class Timeline:
    """What one profiled rank did in the window, as interval sets (seconds)."""

    source: str  # what recorded it: "nsys", "torch.profiler (CUDA kernels)", "torch.profiler (CPU operators)"
    rank: str
    window: Interval
    steps: int
    compute: list[Interval]
    communication: list[Interval]
    data_wait: list[Interval]
    # name, kind (compute | communication), duration_s: one row per kernel (or operator) call
    calls: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["name", "kind", "duration_s"]))
    # what bounds the window: the trainer's step ranges, or WHOLE_CAPTURE where it has none
    window_label: str = ""

    @property
    def provisional(self) -> bool:
        """A verdict over a window that is not the trainer's steps is a guess, and says so."""
        return self.window_label == WHOLE_CAPTURE


def breakdown(timeline: Timeline) -> dict[str, Any]:
    """The window split into compute / exposed comm / data wait / idle (see the module docstring)."""
    w = [timeline.window]
    compute = intersect(timeline.compute, w)
    comm = intersect(timeline.communication, w)
    busy = union([*compute, *comm])
    window_s = timeline.window[1] - timeline.window[0]
    compute_s, comm_s, busy_s = length(compute), length(comm), length(busy)
    overlap_s = length(intersect(comm, compute))
    exposed_s = comm_s - overlap_s  # = |N \ C|
    data_wait_s = length(subtract(intersect(timeline.data_wait, w), busy))
    idle_s = max(window_s - busy_s - data_wait_s, 0.0)
    kernel_times = timeline.calls.groupby("kind")["duration_s"].sum() if len(timeline.calls) else {}

    def fraction(seconds: float) -> float | None:
        return seconds / window_s if window_s > 0 else None

    return {
        "source": timeline.source,
        "rank": timeline.rank,
        "steps": timeline.steps,
        "window": timeline.window_label,
        "provisional": timeline.provisional,
        "window_s": window_s,
        "compute_s": compute_s,
        "communication_s": comm_s,
        "overlap_s": overlap_s,
        "exposed_comm_s": exposed_s,
        "data_wait_s": data_wait_s,
        "idle_s": idle_s,
        "busy_fraction": fraction(busy_s),
        "compute_fraction": fraction(compute_s),
        "exposed_comm_fraction": fraction(exposed_s),
        "data_wait_fraction": fraction(data_wait_s),
        "idle_fraction": fraction(idle_s),
        # overlap fraction = |N ∩ C| / |N|: the share of communication hidden behind compute
        "overlap_fraction": overlap_s / comm_s if comm_s > 0 else None,
        # sums over calls (kernels overlapping on several streams count each)
        "compute_kernel_time_s": float(kernel_times.get("compute", 0.0)),
        "comm_kernel_time_s": float(kernel_times.get("communication", 0.0)),
        "median_call_us": float(timeline.calls["duration_s"].median() * 1e6) if len(timeline.calls) else None,
    }


def top_calls(calls: pd.DataFrame, count: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The ``count`` kernels (or operators) with the most total time: name, kind, calls, total_s,
    mean_us, share (of all calls' time)."""
    if calls.empty:
        return []
    grouped = calls.groupby(["name", "kind"], as_index=False)["duration_s"].agg(calls="count", total_s="sum")
    total = grouped["total_s"].sum()
    grouped = grouped.assign(mean_us=grouped["total_s"] / grouped["calls"] * 1e6, share=grouped["total_s"] / total)
    top = grouped.sort_values(["total_s", "name"], ascending=[False, True]).head(count)
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in top.to_dict("records")]


# --------------------------------------------------------------------------------------------
# Nsight Systems: the SQLite export
# --------------------------------------------------------------------------------------------

# NVTX_EVENTS.eventType (ENUM_NSYS_EVENT_TYPE) of the two kinds of range: push/pop (what
# torch.cuda.nvtx.range writes) and start/end (nvtxRangeStart/End, torch.cuda.nvtx.range_start).
NVTX_PUSH_POP_RANGE, NVTX_START_END_RANGE = 59, 60
WHOLE_CAPTURE = "whole capture (no step ranges)"


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
            meta["gpus"] = [f"{name} (compute capability {c})" if c else name
                            for name, c in db.execute(f"SELECT DISTINCT name, {cc} FROM TARGET_INFO_GPU ORDER BY name")]  # fmt: skip
        if "TARGET_INFO_SYSTEM_ENV" in tables and {"name", "value"} <= _columns(db, "TARGET_INFO_SYSTEM_ENV"):
            drivers = [v for (v,) in db.execute("SELECT DISTINCT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CudaDriverVersion'")]
            meta["driver"] = ", ".join(drivers) or None
        meta["cuda_api_calls"] = db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables else None
        meta["tables"] = tables
    return meta


def _no_kernel(path: Path, meta: Mapping[str, Any], what: str) -> ProfileError:
    """The one-line error for an export without kernels, saying what the capture itself shows."""
    traced, calls = meta.get("traced"), meta.get("cuda_api_calls")
    if (traced and "Cuda" in traced) or calls:
        evidence = "; ".join(x for x in (f"capture metadata traces {', '.join(traced)}" if traced else "",
                                         f"{calls} CUDA API calls recorded" if calls else "") if x)  # fmt: skip
        return ProfileError(f"{path}: {what}, though CUDA was traced ({evidence}): no kernel ran between cudaProfilerStart "
                            "and cudaProfilerStop; check that the trainer reached its profiling window (profile.log)")  # fmt: skip
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
            join = ("LEFT JOIN (SELECT correlationId, globalTid >> 24 AS process, MIN(start) AS start "
                    "FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1, 2) AS r "
                    "ON r.correlationId = k.correlationId AND r.process = (k.globalPid >> 24)")  # fmt: skip
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
                f"SELECT n.start, n.end, n.globalTid, {text} AS name FROM NVTX_EVENTS AS n {join_text} "
                "WHERE n.eventType IN (?, ?) AND n.end IS NOT NULL",
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
                    }
                ),
                window_label=label,
            )
        )
    return timelines


# --------------------------------------------------------------------------------------------
# torch.profiler fallback: the Chrome trace and the operator table
# --------------------------------------------------------------------------------------------


def read_torch_trace(path: str | os.PathLike[str]) -> Timeline:
    """The fallback's Chrome trace (``export_chrome_trace``; times in microseconds). With CUDA
    kernels in it, kernels are compute and NCCL kernels communication, as with nsys. On a CPU, the
    training thread's operators outside data loading are compute and the collective ops (gloo's,
    on its own threads) are communication: host-side figures, labelled so."""
    path = Path(path)
    try:
        events = json.loads(path.read_text())["traceEvents"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ProfileError(f"{path}: not a Chrome trace from torch.profiler ({error})") from None
    spans = pd.DataFrame(
        [
            {"name": e["name"], "cat": e.get("cat", ""), "tid": e.get("tid"), "start": e["ts"] * 1e-6, "end": (e["ts"] + e["dur"]) * 1e-6}
            for e in events
            if e.get("ph") == "X" and "dur" in e and "ts" in e
        ],
        columns=["name", "cat", "tid", "start", "end"],
    )
    steps = spans[spans["name"].eq(RANGE_PREFIX + "step")]
    if steps.empty:
        raise ProfileError(f"{path}: no {RANGE_PREFIX}step range: the trace does not come from the trainer's profiling window")
    window = (steps["start"].min(), steps["end"].max())
    data = spans[spans["name"].eq(RANGE_PREFIX + "data")]
    data_wait = list(zip(data["start"], data["end"]))
    kernels = spans[spans["cat"].eq("kernel")]
    if len(kernels):
        # the step ranges are host time; the profiler stops after a synchronize, so every kernel in
        # the trace from the first step on belongs to the window, and the window ends with the last
        window = (window[0], max(window[1], kernels.loc[kernels["start"] >= window[0], "end"].max()))
    if len(kernels):
        source, calls_frame = "torch.profiler (CUDA kernels)", kernels
        is_comm = kernels["name"].str.match(NCCL_KERNEL)
    else:
        main = steps["tid"].iloc[0]
        collectives = spans[spans["name"].str.match(COLLECTIVE_OP)]
        ops = spans[spans["cat"].eq("cpu_op") & spans["tid"].eq(main) & ~spans["name"].str.match(COLLECTIVE_OP)]
        ops = ops[~ops["name"].str.startswith("c10d::")]  # the collective's launch, not its work
        # outermost operators only: nested ones would count their parents' time twice in the sums
        outer = union(zip(ops["start"], ops["end"]))
        starts = {s for s, _ in outer}
        top_level = ops[ops["start"].isin(starts)].drop_duplicates("start")
        calls_frame = pd.concat([top_level, collectives])
        is_comm = calls_frame["name"].str.match(COLLECTIVE_OP)
        source = "torch.profiler (CPU operators)"
    spans_list = list(zip(calls_frame["start"], calls_frame["end"]))
    compute = [span for span, comm in zip(spans_list, is_comm) if not comm]
    if source.endswith("CPU operators)"):
        compute = subtract(compute, data_wait)  # the DataLoader's own ops are input, not compute
    return Timeline(
        source=source,
        rank="rank 0",
        window=window,
        steps=len(steps),
        compute=compute,
        communication=[span for span, comm in zip(spans_list, is_comm) if comm],
        data_wait=data_wait,
        calls=pd.DataFrame(
            {
                "name": calls_frame["name"].to_numpy(),
                "kind": is_comm.map({True: "communication", False: "compute"}).to_numpy(),
                "duration_s": (calls_frame["end"] - calls_frame["start"]).to_numpy(),
            }
        ),
        window_label=f"{len(steps)} {RANGE_PREFIX}step ranges" + (", to the end of their last kernel" if len(kernels) else ""),
    )


def read_operator_table(path: str | os.PathLike[str], count: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The fallback's operators.csv (``scalerepro.profiling``): the ``count`` operators with the
    most self time (device time first, where there is any)."""
    table = pd.read_csv(path)
    ranked = table.sort_values(["self_device_time_total_us", "self_cpu_time_total_us"], ascending=False).head(count)
    return ranked.to_dict("records")


# --------------------------------------------------------------------------------------------
# Nsight Compute: the CSV (long "details" layout: one row per kernel launch and metric)
# --------------------------------------------------------------------------------------------

# What the roofline and the summary read, by raw metric name: the rows of --metrics, and every
# row under --print-metric-name name (scalerepro.profile_rank asks for that). -> (field, quantity)
NCU_RAW = {
    "gpu__time_duration.sum": ("duration", "time"),
    "dram__bytes.sum": ("dram_bytes", "bytes"),
    "dram__bytes.sum.per_second": ("dram_bytes_per_s", "bytes/s"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("sm_throughput_pct", "percent"),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("memory_throughput_pct", "percent"),
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("dram_throughput_pct", "percent"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved_occupancy_pct", "percent"),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical_occupancy_pct", "percent"),
    # tensor-pipe utilisation, one metric per GPU generation (scalerepro.profile_rank.TENSOR_PIPE_METRICS)
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": ("tensor_pipe_pct", "percent"),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed": ("tensor_pipe_pct", "percent"),
    # Hopper: warpgroup MMA instructions; none in a kernel whose tensor pipe is busy means mma.sync
    # or HFMA2.MMA work, which the wgmma peak does not bound (roofline)
    "sm__inst_executed_pipe_tensor_op_gmma.sum": ("wgmma_instructions", "count"),
}
# The same figures as the sections print them by default (--print-metric-name label): display
# names, which differ between versions (2019-2020: "SM [%]", "Memory [%]", "SOL FB"; later
# "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput"). "Memory Throughput" is a
# percentage in GPU Speed Of Light and DRAM bytes/s in Memory Workload Analysis, so the key is
# the name and the quantity of its unit.
NCU_DISPLAY = {
    ("Duration", "time"): "duration",
    ("Compute (SM) Throughput", "percent"): "sm_throughput_pct",
    ("SM [%]", "percent"): "sm_throughput_pct",
    ("Memory Throughput", "percent"): "memory_throughput_pct",
    ("Memory [%]", "percent"): "memory_throughput_pct",
    ("Memory Throughput", "bytes/s"): "dram_bytes_per_s",
    ("DRAM Throughput", "percent"): "dram_throughput_pct",
    ("SOL FB", "percent"): "dram_throughput_pct",
    ("Achieved Occupancy", "percent"): "achieved_occupancy_pct",
    ("Theoretical Occupancy", "percent"): "theoretical_occupancy_pct",
}
NCU_FIELDS = ("duration", "dram_bytes", "dram_bytes_per_s", "sm_throughput_pct", "memory_throughput_pct",
              "dram_throughput_pct", "tensor_pipe_pct", "wgmma_instructions", "achieved_occupancy_pct", "theoretical_occupancy_pct")  # fmt: skip
# FLOPs per SASS thread instruction: an FMA is two.
FLOP_COUNTERS = {
    f"sm__sass_thread_inst_executed_op_{precision}{op}_pred_on.sum": weight
    for precision in ("f", "h", "d")
    for op, weight in (("add", 1), ("mul", 1), ("fma", 2))
}
_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # ncu's byte prefixes are decimal (Kbyte = 1000 byte)
# Every unit spelling ncu prints for the quantities read here -> (quantity, factor to the base
# unit: seconds, bytes, bytes/s, percent, count). Older versions spell time "nsecond", newer
# "ns"; without --print-units base ncu scales each value to its own prefix (usecond, Mbyte...).
NCU_UNITS = {
    **{unit: ("time", scale) for scale, units in ((1e-9, ("ns", "nsecond")), (1e-6, ("us", "usecond")),
                                                  (1e-3, ("ms", "msecond")), (1.0, ("s", "second"))) for unit in units},
    **{f"{p}{b}": ("bytes", scale) for p, scale in _SI.items() for b in ("byte", "B")},
    **{f"{p}{b}{per}": ("bytes/s", scale) for p, scale in _SI.items() for b in ("byte", "B") for per in ("/second", "/s")},
    "%": ("percent", 1.0),
    "": ("count", 1.0), "inst": ("count", 1.0),
}  # fmt: skip
NCU_UNITS_KNOWN = "ns/nsecond, us/usecond, ms/msecond, s/second, [K|M|G|T]byte (or B), the same per second (/second or /s), %, inst"
NCU_COLUMNS = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
# a number as ncu prints it (en_US): digits grouped by commas, a decimal point, an exponent
_NCU_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d*)?([eE][-+]?\d+)?$")


@dataclass
class NcuReading:
    """An ncu CSV read: one row per profiled launch (``launches``: id, kernel, flops and
    NCU_FIELDS in base units), which name layout it used, and one line per thing it could not
    read (``problems``: a metric with an unknown unit or a value that is not a number)."""

    launches: pd.DataFrame
    layout: str  # "raw metric names" | "section display names" | "raw and display names"
    problems: list[str]
    compute_capabilities: list[str] = field(default_factory=list)  # the CSV's "CC" column (ncu 2020.2+)


def _ncu_value(text: str) -> float | None:
    """The number in an ncu value cell, None for one that is not a number ("n/a", "PolicySpread")."""
    text = text.strip()
    return float(text.replace(",", "")) if _NCU_NUMBER.match(text) else None


def read_ncu_csv(path: str | os.PathLike[str]) -> NcuReading:
    """The launches of an ``ncu --csv`` details page, in either name layout and any unit spelling.
    Rows the roofline does not use (launch statistics, rule results, text values such as
    "cudaFuncCachePreferNone") are skipped; a row it uses whose unit is unknown or whose value is
    not a number is left out of the launch and named in ``problems``. FLOPs = FADD + FMUL + 2 FFMA
    over fp32, fp16 and fp64, where the SASS counters are present."""
    path = Path(path)
    lines = path.read_text(errors="replace").splitlines()
    # ncu prints its own "==PROF==" lines (and the application's output) before the table
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ProfileError(f"{path}: no ncu CSV header (a line starting with \"ID\"): was it written by ncu --csv?")
    reader = csv.DictReader(lines[start:])
    missing = [column for column in NCU_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise ProfileError(f"{path}: not the long ncu CSV layout (--page details): no column {', '.join(missing)}")
    launches: dict[str, dict[str, Any]] = {}
    unread: dict[tuple[str, str], set[str]] = {}  # (metric, why) -> launch ids
    names_seen = set()
    capabilities: set[str] = set()
    display_names = {name for name, _ in NCU_DISPLAY}
    for row in reader:
        name, unit, text = (row.get(key) or "" for key in ("Metric Name", "Metric Unit", "Metric Value"))
        if not row.get("ID") or not name:
            continue  # a rule result row (ncu 2023+: "SOLBottleneck", ...) or a truncated line
        launch = launches.setdefault(row["ID"], {"id": int(row["ID"]), "kernel": row["Kernel Name"]})
        capabilities.add(row.get("CC") or "")
        if name not in NCU_RAW and name not in FLOP_COUNTERS and name not in display_names:
            continue  # not a figure of the summary: skipped unread, whatever its value
        if unit not in NCU_UNITS:
            unread.setdefault((name, f"unit {unit!r} not understood (known: {NCU_UNITS_KNOWN})"), set()).add(row["ID"])
            continue
        quantity, scale = NCU_UNITS[unit]
        if name in NCU_RAW:
            field_name, expected = NCU_RAW[name]
        elif name in FLOP_COUNTERS:
            field_name, expected = "flop_counter", "count"
        else:
            field_name, expected = NCU_DISPLAY.get((name, quantity)), quantity
            if field_name is None:
                continue  # a display name in another quantity (e.g. Memory Throughput in bytes/s of L1)
        if quantity != expected:
            unread.setdefault((name, f"unit {unit!r} is not a {expected} unit"), set()).add(row["ID"])
            continue
        value = _ncu_value(text)
        if value is None:
            unread.setdefault((name, f"value {text.strip()!r} is not a number"), set()).add(row["ID"])
            continue
        names_seen.add("raw" if name in NCU_RAW or name in FLOP_COUNTERS else "display")
        if field_name == "flop_counter":
            launch["flops"] = launch.get("flops", 0.0) + FLOP_COUNTERS[name] * value
        else:
            launch[field_name] = value * scale
    frame = pd.DataFrame(list(launches.values()), columns=["id", "kernel", "flops", *NCU_FIELDS])
    if frame.empty:
        raise ProfileError(f"{path}: the ncu CSV holds no kernel")
    # The display-name layout has DRAM bandwidth but no byte count: bytes = bandwidth x duration.
    derived = frame["dram_bytes"].isna() & frame["dram_bytes_per_s"].notna() & frame["duration"].notna()
    frame.loc[derived, "dram_bytes"] = frame.loc[derived, "dram_bytes_per_s"] * frame.loc[derived, "duration"]
    frame["dram_bytes_source"] = np.where(derived, "DRAM bytes/s x duration", np.where(frame["dram_bytes"].notna(), "dram__bytes.sum", None))
    problems = [f"{path.name}: {metric}: {why}, in {len(ids)} of {len(frame)} launches: not read" for (metric, why), ids in unread.items()]
    untimed = frame[frame["duration"].isna()]
    if len(untimed):
        problems.append(f"{path.name}: {len(untimed)} of {len(frame)} launches have no duration (gpu__time_duration.sum or Duration): "
                        f"{', '.join(sorted(set(untimed['kernel'].str.slice(0, 60))))}")  # fmt: skip
    layout = {frozenset({"raw"}): "raw metric names", frozenset({"display"}): "section display names"}.get(frozenset(names_seen), "raw and display names")
    return NcuReading(launches=frame, layout=layout, problems=problems, compute_capabilities=sorted(capabilities - {""}))


# The dense tensor-core peak of each training precision, by its gpu_peaks key in references.yaml.
# fp32 (TF32 off) runs no tensor-core math: no tensor roof.
TENSOR_PEAK_KEYS = {"tf32": "tf32_dense_tflops", "bf16": "bf16_dense_tflops", "fp16": "fp16_dense_tflops", "fp8": "fp8_dense_tflops"}


def _device(name: Any) -> str:
    return " ".join(str(name).lower().split())


def peaks_key_for_device(references: Mapping[str, Any], device_name: str) -> str | None:
    """The gpu_peaks entry whose ``device_names`` holds ``device_name`` (as NVML spells it, case
    and spacing aside; an nsys "name (compute capability X)" suffix ignored), else None."""
    bare = re.sub(r"\s*\(compute capability [^)]*\)$", "", str(device_name))
    for key, entry in (references.get("gpu_peaks") or {}).items():
        if any(_device(bare) == _device(name) for name in (entry or {}).get("device_names") or []):
            return key
    return None


def gpu_peaks(references: Mapping[str, Any], key: str, precision: str | None = None) -> dict[str, Any]:
    """Peaks of ``gpu_peaks.<key>`` in references.yaml, in base units: fp32 FLOP/s (CUDA cores,
    the roof of the SASS FP counters), the dense tensor-core FLOP/s of ``precision`` (None for
    fp32, an unknown precision or one the GPU lacks, with ``tensor_reason`` saying which), DRAM
    bytes/s."""
    peaks = (references.get("gpu_peaks") or {}).get(key)
    if not peaks:
        raise ProfileError(f"references.yaml has no gpu_peaks.{key}: add it or choose another profiling.gpu_peaks")
    name = peaks.get("name", key)
    tensor_key = TENSOR_PEAK_KEYS.get(precision or "")
    if precision is None:
        tensor, why = None, "the run's precision is unknown (pass --precision): no tensor-core roof to count against"
    elif tensor_key is None:
        tensor, why = None, f"a {precision} run uses no tensor-core precision"
    elif tensor_key not in peaks:
        tensor, why = None, f"{name} has no {precision} tensor cores ({tensor_key} not in gpu_peaks.{key})"
    else:
        tensor, why = float(peaks[tensor_key]) * 1e12, None
    return {
        "key": key,
        "name": name,
        "precision": precision,
        "fp32_flops": float(peaks["fp32_tflops"]) * 1e12,
        "tensor_flops": tensor,
        "tensor_reason": why,
        "dram_bytes_per_s": float(peaks["hbm_bandwidth_tbps"]) * 1e12,
    }


def resolve_peaks(references: Mapping[str, Any], device_names: Sequence[str], configured: str | None,
                  precision: str | None) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
    """The peaks of the GPU the capture ran on (its device name looked up in gpu_peaks) and of the
    run's precision, and where they come from. The configured key (profiling.gpu_peaks) applies
    only when the capture names no GPU; a named GPU that gpu_peaks lacks gets no peaks (its
    fractions would be of another GPU's roofs)."""
    names = sorted(set(device_names))
    keys = {name: peaks_key_for_device(references, name) for name in names}
    found = sorted({key for key in keys.values() if key})
    if len(found) > 1:
        return None, f"the capture ran on several GPU models ({', '.join(names)}): no single roof"
    if found:
        peaks = gpu_peaks(references, found[0], precision)
        return peaks, f"{peaks['name']} (gpu_peaks.{found[0]}, from the capture's device name {', '.join(names)}), {precision or 'precision unknown'}"
    if names:
        return None, f"no gpu_peaks entry in references.yaml names {', '.join(names)}: add it (device_names) to get a roofline"
    if configured is None:
        return None, "the capture names no GPU and no gpu_peaks entry is configured"
    peaks = gpu_peaks(references, configured, precision)
    return peaks, f"{peaks['name']} (gpu_peaks.{configured}, as configured: the capture names no GPU), {precision or 'precision unknown'}"


def precision_of_capture(captures: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The trainer's --precision on a capture's command line (capture.json ``command``), or a
    ``precision`` the capture states; None when neither says."""
    for capture in captures.values():
        if capture.get("precision"):
            return str(capture["precision"])
        command = [str(part) for part in capture.get("command") or []]
        for flag, value in zip(command, command[1:]):
            if flag == "--precision":
                return value
        for part in command:
            if part.startswith("--precision="):
                return part.split("=", 1)[1]
    return None


def roofline(launches: pd.DataFrame, peaks: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per kernel name, over its launches that have a duration: achieved FLOP/s and DRAM B/s,
    their fractions of the peaks, arithmetic intensity, the attainable FLOP/s at that intensity
    and which roof bounds it. ``missing`` says what a row lacks (no duration: no rates at all).

    FLOPs = CUDA-core FLOPs (SASS FP counters, FMA = 2) + tensor-core FLOPs, the latter estimated
    as tensor-pipe utilisation x duration x the dense tensor peak of the run's precision on this
    GPU (the SASS counters do not see tensor-core work). A kernel with tensor-core work is set
    against that tensor peak, any other against the CUDA-core FP32 peak. Where the tensor-core
    work cannot be counted (no tensor-pipe metric in the capture, or no tensor peak for the
    precision) ``tensor_work`` says so and the FLOPs are the CUDA cores' only."""
    out = []
    tensor_peak = peaks.get("tensor_flops")
    for kernel, every in launches.groupby("kernel", sort=False):
        group = every[every["duration"].notna()]
        missing = []
        if len(group) < len(every):
            missing.append(f"duration ({len(every) - len(group)} of {len(every)} launches)")
        seconds = group["duration"].sum() if len(group) else None
        has_counters = len(group) > 0 and group["flops"].notna().all()
        has_tensor = len(group) > 0 and group["tensor_pipe_pct"].notna().any()
        cuda_core = float(group["flops"].sum()) if has_counters else None
        tensor_busy_s = float((group["tensor_pipe_pct"].fillna(0) / 100 * group["duration"]).sum()) if has_tensor else None
        tensor: float | None = None
        if not has_tensor:
            tensor_work = "not counted: the capture has no tensor-pipe metric for this kernel"
        elif tensor_busy_s == 0:
            tensor, tensor_work = 0.0, "none: the tensor pipe was idle"
        elif tensor_peak is None:
            tensor_work = f"not counted: tensor pipe busy {tensor_busy_s / seconds:.0%} of the time, but {peaks.get('tensor_reason')}"
        elif group["wgmma_instructions"].notna().any() and group["wgmma_instructions"].fillna(0).sum() == 0:
            # Hopper's tensor-pipe counter also counts mma.sync (HMMA) and the half-precision FMAs
            # issued to the tensor pipe (HFMA2.MMA, elementwise kernels): neither runs at the wgmma
            # rate the dense peak is quoted for, so utilisation x that peak would overstate them
            tensor_work = (f"not counted: tensor pipe busy {tensor_busy_s / seconds:.0%} of the time with no wgmma instruction "
                           "(mma.sync or HFMA2.MMA work, which the dense wgmma peak does not bound)")
            missing.append("tensor-core FLOPs")
        else:
            # tensor FLOPs = tensor-pipe busy share x duration x dense tensor peak of the precision
            tensor = tensor_busy_s * tensor_peak
            tensor_work = f"estimate: tensor-pipe utilisation x {peaks.get('precision')} tensor peak"
        if cuda_core is None and tensor is None:
            flops, source = None, "not measured: no FP counters, and tensor-core work " + tensor_work
            if len(group):
                missing.append("FLOP count")
        else:
            flops = (cuda_core or 0.0) + (tensor or 0.0)
            parts = ["SASS FP counters (FMA = 2)" if cuda_core is not None else "no SASS FP counters"]
            parts.append(f"tensor cores: {tensor_work}")
            source = "; ".join(parts)
        on_tensor = tensor is not None and tensor > 0
        peak = tensor_peak if on_tensor else peaks["fp32_flops"]
        peak_name = f"{peaks.get('name')} {peaks.get('precision')} dense tensor" if on_tensor else f"{peaks.get('name')} FP32 CUDA cores"
        dram_bytes = group["dram_bytes"].sum() if len(group) and group["dram_bytes"].notna().all() else None
        if len(group) and dram_bytes is None:
            missing.append("DRAM bytes")
        achieved = flops / seconds if seconds and flops is not None else None
        bandwidth = dram_bytes / seconds if seconds and dram_bytes is not None else None
        intensity = flops / dram_bytes if dram_bytes and flops is not None else None
        ridge = peak / peaks["dram_bytes_per_s"]  # FLOP/byte where the two roofs meet
        attainable = min(peak, intensity * peaks["dram_bytes_per_s"]) if intensity is not None else None
        sources = sorted(set(group["dram_bytes_source"].dropna())) if "dram_bytes_source" in group else []
        out.append(
            {
                "kernel": kernel,
                "launches": len(every),
                "duration_s": seconds,
                "flops": flops,
                "flops_source": source,
                "cuda_core_flops": cuda_core,
                "tensor_flops": tensor,
                "tensor_work": tensor_work,
                "achieved_flops_per_s": achieved,
                "peak_flops_per_s": peak,
                "peak": peak_name,
                "flops_fraction": achieved / peak if achieved is not None else None,
                "dram_bytes": dram_bytes,
                "dram_bytes_source": ", ".join(sources) or None,
                "dram_bytes_per_s": bandwidth,
                "dram_fraction": bandwidth / peaks["dram_bytes_per_s"] if bandwidth is not None else None,
                "arithmetic_intensity": intensity,
                "ridge_intensity": ridge,
                "attainable_flops_per_s": attainable,
                "bound": None if intensity is None else ("memory" if intensity < ridge else "compute"),
                "sm_throughput_pct": every["sm_throughput_pct"].mean(),
                "memory_throughput_pct": every["memory_throughput_pct"].mean(),
                "achieved_occupancy_pct": every["achieved_occupancy_pct"].mean(),
                "theoretical_occupancy_pct": every["theoretical_occupancy_pct"].mean(),
                "missing": "; ".join(missing) or None,
            }
        )
    return sorted(out, key=lambda row: -(row["duration_s"] or 0.0))


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------

DEFAULT_THRESHOLDS = {"exposed_comm_min": 0.20, "data_wait_min": 0.10, "idle_min": 0.25}
_CANDIDATES = (
    ("communication-bound", "exposed_comm_fraction", "exposed_comm_min", "exposed communication"),
    ("input-bound", "data_wait_fraction", "data_wait_min", "data wait"),
    ("launch/latency-bound", "idle_fraction", "idle_min", "idle"),
)


def classify(figures: Mapping[str, Any], thresholds: Mapping[str, float]) -> dict[str, Any]:
    """The run's bottleneck: the candidate whose fraction / threshold is largest and at least 1,
    else compute-bound; with the evidence (every fraction against its threshold)."""
    scores, evidence = {}, []
    for name, column, key, what in _CANDIDATES:
        value, limit = figures.get(column), thresholds[key]
        if value is None:
            evidence.append(f"{what} not measured")
            continue
        scores[name] = float(value / limit)
        evidence.append(f"{what} {value:.1%} {'≥' if value >= limit else '<'} {limit:.0%}")
    compute = figures.get("compute_fraction")
    evidence.append(f"compute {compute:.1%}" if compute is not None else "compute not measured")
    if figures.get("overlap_fraction") is not None:
        evidence.append(f"overlap {figures['overlap_fraction']:.1%} of communication")
    if figures.get("median_call_us") is not None:
        evidence.append(f"median kernel/op {figures['median_call_us']:.1f} µs")
    over = {name: score for name, score in scores.items() if score >= 1}
    verdict = max(over, key=over.get) if over else "compute-bound"
    provisional = bool(figures.get("provisional"))
    if provisional:  # the fractions are of a window that is not the trainer's steps
        evidence.insert(0, f"provisional: window is the {figures.get('window') or WHOLE_CAPTURE}")
    return {"class": verdict, "provisional": provisional, "evidence": "; ".join(evidence), "scores": scores,
            "thresholds": dict(thresholds)}  # fmt: skip


# --------------------------------------------------------------------------------------------
# One run's summary, and the study's tables
# --------------------------------------------------------------------------------------------


def _mean_breakdown(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's figures: the mean over its profiled ranks (numbers), the first rank's labels."""
    frame = pd.DataFrame(parts)
    numeric = frame.select_dtypes("number").mean().to_dict()
    return {**{k: v for k, v in parts[0].items() if k not in numeric}, **numeric, "ranks": len(parts),
            "provisional": any(p["provisional"] for p in parts)}  # fmt: skip


def _files(run_dir: Path) -> list[dict[str, Any]]:
    kinds = {".sqlite": "Nsight Systems SQLite export", ".nsys-rep": "Nsight Systems report", ".ncu-rep": "Nsight Compute report",
             ".json": "JSON", ".csv": "CSV table", ".log": "log"}  # fmt: skip
    descriptions = {"trace.json": "Chrome/Perfetto trace (torch.profiler)", "operators.csv": "operator table (torch.profiler)",
                    "kernels.csv": "Nsight Compute metrics (CSV)", "capture.json": "what the profiling job ran"}  # fmt: skip
    return [
        {"path": str(p), "description": descriptions.get(p.name, kinds.get(p.suffix, p.suffix)), "bytes": p.stat().st_size}
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != "summary.json"
    ]


def summarize(
    run_dir: str | os.PathLike[str],
    run_id: str,
    thresholds: Mapping[str, float],
    peaks: Mapping[str, Any] | None,
    references: Mapping[str, Any] | None = None,
    configured_peaks: str | None = None,
    precision: str | None = None,
    device_name: str | None = None,
) -> dict[str, Any]:
    """Everything one run's profiles say (see the module docstring), as a JSON-ready dict, with
    ``warnings``: one line per thing that makes a figure missing or provisional.

    The roofline's peaks: ``peaks`` as given, or (with ``references``) those of the GPU the
    capture ran on (``device_name``, else the GPU names in the nsys export) and of the run's
    precision (``precision``, else the --precision on a capture's command line); see
    resolve_peaks."""
    run_dir = Path(run_dir)
    captures = {p.parent.name: json.loads(p.read_text()) for p in sorted(run_dir.glob("*/capture.json"))}
    if not captures:
        raise ProfileError(f"{run_dir}: no <tool>/capture.json: the profiling job did not run")
    parts: list[dict[str, Any]] = []
    top: list[dict[str, Any]] = []
    operators: list[dict[str, Any]] = []
    warnings: list[str] = []
    metadata: list[dict[str, Any]] = []
    for path in sorted((run_dir / "nsys").glob("*.sqlite")):
        metadata.append({k: v for k, v in read_nsys_metadata(path).items() if k != "tables"})
        for timeline in read_nsys_sqlite(path):
            parts.append(breakdown(timeline))
            if timeline.provisional:
                warnings.append(f"{timeline.rank}: no {RANGE_PREFIX}step ranges: window: {WHOLE_CAPTURE}; its classification is provisional")
            if not top:
                top = top_calls(timeline.calls)
    # torch/ normally; under nsys/ or ncu/ when that tool was missing on the node and the job fell back
    trace = next(iter(sorted(run_dir.glob("*/trace.json"))), None)
    if not parts and trace is not None:
        timeline = read_torch_trace(trace)
        parts.append(breakdown(timeline))
        top = top_calls(timeline.calls)
        if (trace.parent / "operators.csv").is_file():
            operators = read_operator_table(trace.parent / "operators.csv")
    kernels_csv = run_dir / "ncu" / "kernels.csv"
    roof: list[dict[str, Any]] = []
    peaks_basis = "as given" if peaks else None
    if kernels_csv.is_file() and peaks is None and references is not None:
        precision = precision or precision_of_capture(captures)
        devices = [device_name] if device_name else [re.sub(r"\s*\(compute capability [^)]*\)$", "", g) for m in metadata for g in m.get("gpus") or []]
        peaks, peaks_basis = resolve_peaks(references, devices, configured_peaks, precision)
        if peaks is None:
            warnings.append(f"roofline: {peaks_basis}")
    if kernels_csv.is_file() and peaks:
        reading = read_ncu_csv(kernels_csv)
        metadata.append({"file": "ncu/kernels.csv", "layout": reading.layout, "tool_version": (captures.get("ncu") or {}).get("tool_version"),
                         "gpus": [f"compute capability {cc} (ncu)" for cc in reading.compute_capabilities]})  # fmt: skip
        warnings += reading.problems
        roof = roofline(reading.launches, peaks)
        warnings += [f"roofline: {row['kernel'][:80]}: no {row['missing']}" for row in roof if row["missing"]]
    figures = _mean_breakdown(parts) if parts else {}
    fallback = [c for c in captures.values() if c.get("fallback_reason")]
    return {
        "run_id": run_id,
        "tools": sorted(captures),
        "fallback": bool(fallback),
        "fallback_reason": fallback[0]["fallback_reason"] if fallback else None,
        "captures": captures,
        "capture_metadata": metadata,
        "breakdown": figures or None,
        "per_rank": parts,
        "top_kernels": top,
        "operators": operators,
        "roofline": roof,
        "gpu_peaks": dict(peaks) if peaks else None,
        "peaks_basis": peaks_basis,
        "classification": classify(figures, thresholds) if figures else None,
        "warnings": warnings,
        "files": _files(run_dir),
    }


def _capture_facts(summary: Mapping[str, Any]) -> dict[str, str | None]:
    """Tool versions, GPUs and driver as the captures record them (profiling.csv columns)."""
    meta = summary.get("capture_metadata") or []
    versions = [c.get("tool_version") for c in (summary.get("captures") or {}).values()] + [m.get("tool_version") for m in meta]

    def joined(values: Iterable[Any]) -> str | None:
        return "; ".join(dict.fromkeys(str(v) for v in values if v)) or None

    return {"tool_versions": joined(versions), "gpus": joined(g for m in meta for g in m.get("gpus") or []),
            "driver": joined(m.get("driver") for m in meta)}  # fmt: skip


PROFILING_COLUMNS = (
    "run_id", "tools", "fallback", "fallback_reason", "source", "ranks", "steps", "window_s", "busy_fraction",
    "compute_fraction", "exposed_comm_fraction", "data_wait_fraction", "idle_fraction", "overlap_fraction",
    "compute_s", "communication_s", "overlap_s", "exposed_comm_s", "data_wait_s", "idle_s",
    "compute_kernel_time_s", "comm_kernel_time_s", "median_call_us", "window", "classification", "provisional",
    "evidence", "tool_versions", "gpus", "driver", "warnings",
)  # fmt: skip
KERNEL_COLUMNS = ("run_id", "rank_in_run", "name", "kind", "calls", "total_s", "mean_us", "share")
ROOFLINE_COLUMNS = (
    "run_id", "kernel", "launches", "duration_s", "flops", "flops_source", "cuda_core_flops", "tensor_flops",
    "tensor_work", "achieved_flops_per_s", "peak_flops_per_s", "peak", "flops_fraction", "dram_bytes",
    "dram_bytes_per_s", "dram_fraction", "arithmetic_intensity", "ridge_intensity", "attainable_flops_per_s", "bound",
    "sm_throughput_pct", "memory_throughput_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct",
    "peak_dram_bytes_per_s", "dram_bytes_source", "peaks_basis", "missing",
)  # fmt: skip
FILE_COLUMNS = ("run_id", "path", "description", "bytes")


def tables(summaries: Iterable[Mapping[str, Any]]) -> dict[str, pd.DataFrame]:
    """profiling.csv (one row per profiled run), profiling_kernels.csv (its top kernels or
    operators), profiling_roofline.csv (Nsight Compute kernels), profiling_files.csv (raw files)."""
    runs, kernels, roof, files = [], [], [], []
    for s in summaries:
        b = s.get("breakdown") or {}
        c = s.get("classification") or {}
        runs.append(
            {**{k: b.get(k) for k in PROFILING_COLUMNS}, "run_id": s["run_id"], "tools": " ".join(s["tools"]),
             "fallback": s["fallback"], "fallback_reason": s["fallback_reason"], "classification": c.get("class"),
             "provisional": c.get("provisional"), "evidence": c.get("evidence"), **_capture_facts(s),
             "warnings": "\n".join(s.get("warnings") or []) or None}  # fmt: skip
        )
        kernels += [{"run_id": s["run_id"], "rank_in_run": i + 1, **k} for i, k in enumerate(s["top_kernels"])]
        peak_bw = (s.get("gpu_peaks") or {}).get("dram_bytes_per_s")
        roof += [{"run_id": s["run_id"], **k, "peak_dram_bytes_per_s": peak_bw, "peaks_basis": s.get("peaks_basis")} for k in s["roofline"]]
        files += [{"run_id": s["run_id"], **f} for f in s["files"]]
    return {
        "profiling": pd.DataFrame(runs, columns=PROFILING_COLUMNS),
        "profiling_kernels": pd.DataFrame(kernels, columns=KERNEL_COLUMNS),
        "profiling_roofline": pd.DataFrame(roof, columns=ROOFLINE_COLUMNS),
        "profiling_files": pd.DataFrame(files, columns=FILE_COLUMNS),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalerepro.analysis.profile", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("summarize", help="one run's profiles -> summary.json")
    one.add_argument("--run-dir", required=True, type=Path, help="results/profiles/<run>")
    one.add_argument("--run-id", required=True)
    one.add_argument("--references", required=True, type=Path, help="config/references.yaml (gpu_peaks)")
    one.add_argument("--gpu-peaks", required=True, help="the gpu_peaks entry for roofline fractions when the capture names no GPU")
    one.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16", "fp8"], help="the run's precision (default: the capture's --precision)")
    one.add_argument("--device-name", help="the GPU as NVML names it (default: the nsys export's GPU names)")
    one.add_argument("--thresholds", required=True, type=json.loads, help="classification thresholds as JSON")
    one.add_argument("--out", required=True, type=Path)
    many = commands.add_parser("table", help="every run's summary.json -> the profiling tables")
    many.add_argument("--summaries", nargs="*", default=[], type=Path)
    many.add_argument("--out", required=True, type=Path, help="directory of the CSV tables")
    args = parser.parse_args(argv)
    try:
        if args.command == "summarize":
            references = yaml.safe_load(args.references.read_text()) or {}
            summary = summarize(args.run_dir, args.run_id, {**DEFAULT_THRESHOLDS, **args.thresholds}, None, references,
                                args.gpu_peaks, args.precision, args.device_name)  # fmt: skip
            args.out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
            for warning in summary["warnings"]:
                print(f"profile: {args.run_id}: warning: {warning}", file=sys.stderr)
            verdict = (summary["classification"] or {}).get("class", "no breakdown")
            provisional = " (provisional)" if (summary["classification"] or {}).get("provisional") else ""
            print(f"profile: {args.run_id}: {verdict}{provisional} ({', '.join(summary['tools'])})", file=sys.stderr)
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            for name, table in tables(json.loads(p.read_text()) for p in args.summaries).items():
                table.to_csv(args.out / f"{name}.csv", index=False)
            print(f"profile: {len(args.summaries)} profiled runs -> {args.out}", file=sys.stderr)
    except ProfileError as error:
        print(f"scalerepro.analysis.profile: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
