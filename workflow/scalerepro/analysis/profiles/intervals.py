"""A profiled step as intervals: kernel, communication and data-wait intervals per rank, and
the split of the step window into compute, exposed communication, data wait and idle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from scalerepro.common.cli import CommandError

Interval = tuple[float, float]
# The window of a capture without the trainer's step ranges.
WHOLE_CAPTURE = "whole capture (no step ranges)"


NCCL_KERNEL = re.compile(r"^nccl", re.IGNORECASE)  # ncclKernel_AllReduce_..., ncclDevKernel_...
COLLECTIVE_OP = re.compile(r"^(gloo|nccl|mpi|ucc):")  # torch.profiler's collective execution events
TOP_KERNELS = 10


class ProfileError(CommandError, ValueError):
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
    # name, kind (compute | communication), duration_s, start, end: one row per kernel (or operator) call
    calls: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["name", "kind", "duration_s", "start", "end"]))
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
