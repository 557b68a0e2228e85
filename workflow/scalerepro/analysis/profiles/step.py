"""Where a step's time goes: the step split into kernel classes (``kernels.STEP_CLASSES``) and the
GPU's idle time, the parts adding up to the step.

What a capture holds decides what can be said:

* every launch of the step (a timeline: nsys, torch.profiler's CUDA trace). Per class, the time of
  the window that its kernels cover and no class before it (``ATTRIBUTION_ORDER``) covers: a kernel
  running beside another counts once, and communication comes last, so its part is the
  communication no compute hides (the exposed communication). Then the window's data wait and
  idle (``intervals.breakdown``). Each over the window's steps; they add up to the profiled step,
  window / steps, which is set beside the measured run's step.
* one launch of each launch configuration (Nsight Compute as the project runs it). The captured
  launches' times by class; the step's kernel time cannot be split per launch, since a
  configuration the step launches several times is captured once. With the measured run's median
  step S and its GPU utilisation U (NVML: the share of its window in which a kernel ran):

      idle           = S x (1 - U)
      launched again = S x U - captured     (the same configurations' other launches)
      captured (by class) + launched again + idle = S

A timeline summarised before the class split (a kept summary.json whose captures are gone) gives
its window's compute, exposed communication, data wait and idle per step. Shares are of the step, never of the captured sum. On the analysis side: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scalerepro.analysis.profiles.intervals import Timeline, intersect, length, subtract, union
from scalerepro.analysis.profiles.kernels import STEP_CLASSES, kernel_class
from scalerepro.analysis.values import finite_number

ONE_PER_CONFIGURATION = "one launch per configuration"  # ncu --filter-mode per-launch-config --launch-count 1
EVERY_LAUNCH = "every launch in the window"  # a timeline
WINDOW_ONLY = "the window's parts"  # a timeline summarised before the class split (a kept summary.json): compute, exposed communication, data wait, idle
# profiling.csv's column of each class's seconds (analysis.columns.PROFILING_COLUMNS lists them)
CLASS_COLUMNS = {
    "convolution": "class_convolution_s",
    "GEMM": "class_gemm_s",
    "attention": "class_attention_s",
    "normalisation and elementwise": "class_norm_elementwise_s",
    "optimizer": "class_optimizer_s",
    "communication": "class_communication_s",
    "copies": "class_copies_s",
    "other": "class_other_s",
}
# The order in which time that several kernels cover at once is given to a class: the compute
# classes as listed, communication last (communication hidden behind compute is not the step's).
ATTRIBUTION_ORDER = (*(c for c in STEP_CLASSES if c != "communication"), "communication")
RELAUNCHED = "launches of the same configurations again, not captured one by one"
IDLE = "idle: no kernel running"
DATA_WAIT = "data wait: no kernel running, waiting for the next batch"
EXPOSED_COMMUNICATION = "communication, exposed: not hidden behind compute"  # a timeline's communication row (ATTRIBUTION_ORDER)


def timeline_classes(timeline: Timeline) -> dict[str, Any] | None:
    """One rank's window split by class (module docstring): per class its seconds over the window,
    the launches in it; None for a timeline of CPU operators (no kernels)."""
    if timeline.source.endswith("CPU operators)") or "start" not in timeline.calls:
        return None
    start, end = timeline.window
    calls = timeline.calls[(timeline.calls["end"] > start) & (timeline.calls["start"] < end)]
    named = calls.assign(step_class=[kernel_class(name) for name in calls["name"]])
    taken: list[tuple[float, float]] = []
    seconds = {}
    for step_class in ATTRIBUTION_ORDER:
        own = named[named["step_class"].eq(step_class)]
        covered = intersect(zip(own["start"], own["end"]), [timeline.window])
        seconds[step_class] = length(subtract(covered, taken))
        taken = union([*taken, *covered])
    return {"coverage": EVERY_LAUNCH, "seconds": seconds, "launches": int(len(calls)), "kernel_time_s": length(taken)}


def capture_classes(kernels: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An Nsight Compute capture by class: the rows of ``kernels.ncu_kernel_times`` (one launch of
    each configuration) summed per class."""
    seconds = dict.fromkeys(STEP_CLASSES, 0.0)
    for row in kernels:
        seconds[kernel_class(row["name"], row.get("kind"))] += float(row["total_s"])
    return {
        "coverage": ONE_PER_CONFIGURATION,
        "seconds": seconds,
        "launches": int(sum(int(row["calls"]) for row in kernels)),
        "kernel_time_s": float(sum(seconds.values())),
    }


def mean_classes(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ranks' class splits as one: the mean of each figure (the profiling row is the mean rank)."""
    if not parts:
        return None
    n = len(parts)
    return {
        "coverage": parts[0]["coverage"],
        "seconds": {c: sum(p["seconds"][c] for p in parts) / n for c in STEP_CLASSES},
        "launches": round(sum(p["launches"] for p in parts) / n),
        "kernel_time_s": sum(p["kernel_time_s"] for p in parts) / n,
    }


def profile_columns(classes: Mapping[str, Any] | None) -> dict[str, Any]:
    """profiling.csv's columns of a class split (empty where the capture has none)."""
    if not classes:
        return {"kernel_coverage": None, "kernel_launches": None, "kernel_time_s": None, **dict.fromkeys(CLASS_COLUMNS.values())}
    return {
        "kernel_coverage": classes["coverage"],
        "kernel_launches": classes["launches"],
        "kernel_time_s": classes["kernel_time_s"],
        **{column: classes["seconds"][c] for c, column in CLASS_COLUMNS.items()},
    }


def step_breakdown(profile: Mapping[str, Any], run: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The step a profile shows, part by part (module docstring), adding up to ``step_s``.
    ``profile``: its profiling.csv row; ``run``: the measured run's runs.csv row (None without one).
    Each row: ``part`` (what it is), ``step_class`` (its class, None for the other parts),
    ``time_s`` and ``share`` of the step. None where the profile has no class split; with
    ``rows`` None and ``why`` where its step cannot be split."""
    coverage = profile.get("kernel_coverage")
    if coverage not in (ONE_PER_CONFIGURATION, EVERY_LAUNCH) and finite_number(profile.get("compute_s")) is not None:
        coverage = WINDOW_ONLY  # a timeline summarised before the class split: its window's four parts
    elif coverage not in (ONE_PER_CONFIGURATION, EVERY_LAUNCH):
        return None
    seconds = {c: finite_number(profile.get(column)) or 0.0 for c, column in CLASS_COLUMNS.items()}
    measured = finite_number((run or {}).get("step_time_median_s"))
    out: dict[str, Any] = {
        "coverage": coverage,
        "measured_step_s": measured,
        "measured_steps": finite_number((run or {}).get("measured_steps")),
        "captured_s": sum(seconds.values()),
        "launches": finite_number(profile.get("kernel_launches")),
    }
    if coverage in (EVERY_LAUNCH, WINDOW_ONLY):
        steps, window = finite_number(profile.get("steps")), finite_number(profile.get("window_s"))
        if not steps or not window:
            return {**out, "rows": None, "why": "the profile's window has no steps"}
        step = window / steps  # the profiled step: window / steps
        if coverage == EVERY_LAUNCH:
            kernels = [(EXPOSED_COMMUNICATION if c == "communication" else c, c, seconds[c]) for c in STEP_CLASSES]
        else:  # the window's compute and exposed communication (intervals.breakdown)
            kernels = [
                ("compute kernels (not split by class)", "other", finite_number(profile.get("compute_s")) or 0.0),
                (EXPOSED_COMMUNICATION, "communication", finite_number(profile.get("exposed_comm_s")) or 0.0),
            ]
        rows = [_row(part, step_class, total / steps) for part, step_class, total in kernels if total]
        rows.append(_row(DATA_WAIT, None, (finite_number(profile.get("data_wait_s")) or 0.0) / steps))
        rows.append(_row(IDLE, None, (finite_number(profile.get("idle_s")) or 0.0) / steps))
        out.update(
            step_basis="the profiled window's step: window / steps",
            window_s=window,
            steps=steps,
            idle_basis="the profile's own: the window's time with no kernel running and no data wait",
        )
    else:
        if measured is None:
            return {**out, "rows": None, "why": "the profiled run has no measured step (runs.csv step_time_median_s) to split"}
        step = measured
        rows = [_row(c, c, seconds[c]) for c in STEP_CLASSES if seconds[c]]
        utilisation = finite_number((run or {}).get("gpu_util_mean_pct"))
        if utilisation is None:
            rows.append(_row(f"{RELAUNCHED}, and idle time (not told apart: the run recorded no GPU utilisation)", None, step - out["captured_s"]))
            out["idle_basis"] = None
        else:
            busy = step * utilisation / 100  # the step's kernel time: S x U
            rows.append(_row(RELAUNCHED, None, busy - out["captured_s"]))
            rows.append(_row(IDLE, None, step - busy))  # S x (1 - U)
            out["idle_basis"] = (
                f"the measured run's GPU utilisation (NVML): a kernel ran {utilisation:.1f} % of its window, so idle = step x {1 - utilisation / 100:.3f}"
            )
        out["step_basis"] = "the measured run's median step (runs.csv step_time_median_s), without the profiler"
    for row in rows:
        row["share"] = row["time_s"] / step
    return {**out, "step_s": step, "rows": rows, "sum_s": sum(row["time_s"] for row in rows)}


def _row(part: str, step_class: str | None, seconds: float) -> dict[str, Any]:
    return {"part": part, "step_class": step_class, "time_s": seconds}
