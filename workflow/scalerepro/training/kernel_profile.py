"""Where a step's device time goes: a few steps after the window under ``torch.profiler``, in the run's own process.

A second profiled run would compile the model again (minutes on a GPU); this probe takes the
run's own step function after the other probes (``--kernel-profile-steps N``), on the same
pre-built batches, inside ``probes.preserved_state``, and records:

- on CUDA, every kernel (and copy or fill) the device ran, by name: its launches and device time,
  and the device's idle time between the first kernel's start and the last one's end
  (``idle = span - busy``, busy being the union of the kernels' intervals, so kernels that overlap
  on two streams count once);
- on a CPU, which has no kernels, the ATen operators by their own (self) time.

It is a collective where the run has several ranks (each rank steps, rank 0's profile is
recorded), and takes one unprofiled step first: the probes before it ran the eager model, and the
compiled one may need its programs back in the caches.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd import DeviceType

from scalerepro.training import probes

# kernels kept by name in the record, the longest first; the rest are summed into one entry
KERNELS_KEPT = 40


def not_measured(reason: str) -> dict[str, Any]:
    return {"steps": 0, "reason": reason}


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (start, end), in their unit: overlapping kernels count once."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        busy += end - max(start, reach)
        reach = end
    return busy


def summarise(events: Iterable[Any], device_type: str, steps: int, wall_s: float) -> dict[str, Any]:
    """The record's ``step_kernels`` from the profiler's events (``FunctionEvent``: name,
    device_type, time_range in microseconds, self_cpu_time_total)."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    intervals: list[tuple[float, float]] = []
    for event in events:
        if device_type == "cuda":
            if event.device_type != DeviceType.CUDA:
                continue
            start, end = event.time_range.start, event.time_range.end
            intervals.append((start, end))
            seconds = (end - start) * 1e-6
        else:
            if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
                continue
            seconds = event.self_cpu_time_total * 1e-6
        entry = by_name[event.name]
        entry[0] += 1
        entry[1] += seconds
    ranked = sorted(by_name.items(), key=lambda item: item[1][1], reverse=True)
    total_s = sum(seconds for _, (_, seconds) in ranked)
    kernels = [{"name": name, "launches": int(count), "time_s": seconds} for name, (count, seconds) in ranked[:KERNELS_KEPT]]
    rest = ranked[KERNELS_KEPT:]
    if rest:
        kernels.append({"name": f"({len(rest)} others)", "launches": int(sum(count for _, (count, _) in rest)), "time_s": sum(s for _, (_, s) in rest)})
    summary: dict[str, Any] = {
        "steps": steps,
        "what": "CUDA kernels, copies and fills by device time" if device_type == "cuda" else "ATen operators by self time (a CPU has no kernels)",
        "wall_s": wall_s,
        "names": len(ranked),
        "launches": int(sum(count for _, (count, _) in ranked)),
        "time_s": total_s,
        "kernels": kernels,
        "busy_s": None,
        "span_s": None,
        "idle_fraction": None,
        "reason": None,
    }
    if device_type == "cuda" and intervals:
        span = (max(end for _, end in intervals) - min(start for start, _ in intervals)) * 1e-6
        busy = busy_seconds(intervals) * 1e-6
        summary.update(busy_s=busy, span_s=span, idle_fraction=1.0 - busy / span if span > 0 else None)
    elif device_type == "cuda":
        summary["reason"] = "the profiler saw no kernel (CUPTI unavailable?)"
    return summary


def profile_steps(run: probes.ProbedRun, steps: int) -> dict[str, Any]:
    """``steps`` of the run's step under the profiler (all ranks step; the caller keeps rank 0's)."""
    if steps == 0:
        return not_measured("off (--kernel-profile-steps 0)")
    if run.sharded_by is not None:
        return not_measured(f"not profiled under --parallel {run.sharded_by}: the probes step DDP and single-device runs only")
    device = run.ctx.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    step_batches = run.batches(steps + 1)  # fewer where an epoch has fewer steps
    if len(step_batches) < 2:
        return not_measured("an epoch has one step: none left to profile after the unprofiled one")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with probes.preserved_state(run.state):
        run.step(iter(step_batches[0]), sync_gradients=True)  # unprofiled: back on the compiled programs
        sync()
        with torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False) as profile:
            started = time.perf_counter()
            for batches in step_batches[1:]:
                run.step(iter(batches), sync_gradients=True)
            sync()
            wall_s = time.perf_counter() - started
    return summarise(profile.events(), device.type, len(step_batches) - 1, wall_s)
