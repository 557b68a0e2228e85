"""What the report's profiling section shows of one profiled run: its failed captures with their
errors, where its step's time goes (``profiles.step``: by kernel class, the launches not captured
one by one and the idle time, adding up to the step), the kernels that took it, and the roofline
rows with readable names and the numbers the roofline figure gives them. A kernel's time is in µs
below 1 ms (``duration_text``).

The rows come from the profiling tables (``scalerepro.analysis.profiles.captures``) as the report
reads them; this module only selects, names and relates them, so the template says no number the
tables do not hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scalerepro.analysis.profiles.kernels import STEP_CLASSES, kernel_class, short_name
from scalerepro.analysis.profiles.step import DATA_WAIT, IDLE, ONE_PER_CONFIGURATION, WINDOW_ONLY, step_breakdown
from scalerepro.analysis.values import finite_number

KERNELS_SHOWN = 15  # the kernels by time the report lists (the CSV has every one)
ROOFLINE_SHOWN = 15  # the roofline rows it lists, by time


def duration_text(seconds: Any) -> str | None:
    """A kernel's or a part's time as a reader takes it in: µs below 1 ms (0 decimals from 100 µs,
    1 below: "311 µs", "11.7 µs"), else ms to three figures ("6.73 ms", "12.4 ms"); None when absent."""
    number = finite_number(seconds)
    if number is None:
        return None
    if abs(number) < 1e-3:
        micro = number * 1e6
        return f"{micro:,.0f} µs" if abs(micro) >= 100 else f"{micro:.1f} µs"
    milli = number * 1e3
    return f"{milli:.2f} ms" if abs(milli) < 10 else f"{milli:.1f} ms" if abs(milli) < 100 else f"{milli:,.0f} ms"


def measured_step(measured: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The profiled run's own measured step (runs.csv, with its count of measured steps): median,
    p10, p90 and n; None when the run has no measured step."""
    if not measured or finite_number(measured[0].get("step_time_median_s")) is None:
        return None
    run = measured[0]
    steps = finite_number(run.get("measured_steps"))
    return {
        "median_s": finite_number(run.get("step_time_median_s")),
        "p10_s": finite_number(run.get("step_time_p10_s")),
        "p90_s": finite_number(run.get("step_time_p90_s")),
        "n": steps,
    }


def profiled_run(
    run: dict[str, Any],
    kernels: Sequence[Mapping[str, Any]],
    roofline: Sequence[Mapping[str, Any]],
    files: Sequence[Mapping[str, Any]],
    measured: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """One profiled run as the template shows it. ``run``: its profiling.csv row; ``kernels``,
    ``roofline``, ``files``: its rows of the other profiling tables; ``measured``: its runs.csv
    row (the measured run the profile repeated), if any."""
    rows = type(run)  # the report's row type: a missing column reads as None
    # "<tool>: <error>" per failed capture (captures.tables)
    failures = [dict(zip(("tool", "error"), line.split(": ", 1))) for line in str(run.get("capture_errors") or "").split("\n") if ": " in line]
    failed = tuple(f"{f['tool']} capture failed: " for f in failures)
    warnings = [line for line in str(run.get("warnings") or "").split("\n") if line.strip() and not line.startswith(failed or ("\0",))]
    from_ncu = str(run.get("kernel_basis") or "").startswith("Nsight Compute")
    kernels_total = sum(finite_number(k.get("total_s")) or 0.0 for k in kernels)
    step = measured_step(measured)
    breakdown = step_breakdown(run, measured[0] if measured else None)
    # a kernel's part of the step: ncu's one launch of each configuration against the measured step
    # (at least that: the step may launch it again); a timeline's kernel time against its window
    of_step = finite_number(run.get("window_s")) if not from_ncu else (step or {}).get("median_s")
    shown = [
        rows(
            {
                **k,
                "short": short_name(str(k.get("name") or "")),
                "time": duration_text(k.get("total_s")),
                "step_share": _share(finite_number(k.get("total_s")), of_step),
            }
        )
        for k in kernels[:KERNELS_SHOWN]
    ]
    by_time = sorted(roofline, key=lambda r: (-(finite_number(r.get("duration_s")) or 0.0), str(r.get("kernel"))))
    unplaced: dict[str, int] = {}
    for row in roofline:
        if finite_number(row.get("peak_flops_per_s")) is None or finite_number(row.get("arithmetic_intensity")) is None:
            reason = str(row.get("roof") or row.get("peak") or "no roof").removeprefix("none: ")
            unplaced[reason] = unplaced.get(reason, 0) + 1
    return {
        "run": run,
        "files": files,
        "failures": failures,
        "warnings": warnings,  # the failures are said above them, in full
        "timeline": finite_number(run.get("window_s")) is not None,  # a breakdown of the step (nsys, torch.profiler)
        "kernels": shown,
        "kernels_count": len(kernels),
        # one launch of each configuration: their sum and how many
        "times": {
            "kernels_s": kernels_total,
            "kernels": duration_text(kernels_total),
            "configurations": sum(int(finite_number(k.get("calls")) or 0) for k in kernels),
        },
        "kernels_from_ncu": from_ncu,
        "breakdown": _shown_breakdown(breakdown, kernels, run),
        "step": step,
        "step_text": duration_text((step or {}).get("median_s")),
        "roofline": [
            rows({**r, "short": short_name(str(r.get("kernel") or "")), "time": duration_text(r.get("duration_s"))}) for r in by_time[:ROOFLINE_SHOWN]
        ],
        "roofline_count": len(roofline),
        "roofline_unplaced": sorted(unplaced.items(), key=lambda item: -item[1]),
        "peaks_basis": next((r.get("peaks_basis") for r in roofline if r.get("peaks_basis")), None),
    }


def _share(part: float | None, whole: float | None) -> float | None:
    """``part`` as a share of ``whole``; None where either is missing or the whole is 0."""
    return part / whole if part is not None and whole else None


def _shown_breakdown(breakdown: Mapping[str, Any] | None, kernels: Sequence[Mapping[str, Any]], run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The step's breakdown (``profiles.step.step_breakdown``) with each class's kernels and launches
    (from the kernels table, which holds every kernel of the capture), times as text, and the parts
    a stacked bar can draw (a negative part, more captured than the step's kernel time, cannot be)."""
    if breakdown is None or breakdown.get("rows") is None:
        return None if breakdown is None else dict(breakdown)
    per_class: dict[str, dict[str, float]] = {c: {"kernels": 0, "launches": 0.0} for c in STEP_CLASSES}
    for kernel in kernels:
        step_class = kernel.get("class") or kernel_class(str(kernel.get("name") or ""), kernel.get("kind"))
        if step_class in per_class:
            per_class[step_class]["kernels"] += 1
            per_class[step_class]["launches"] += finite_number(kernel.get("calls")) or 0.0
    steps = 1.0 if breakdown["coverage"] == ONE_PER_CONFIGURATION else finite_number(run.get("steps")) or 1.0
    shown = []
    for row in breakdown["rows"]:
        counts = per_class.get(row["step_class"]) if row["step_class"] and breakdown["coverage"] != WINDOW_ONLY else None
        # the bar's colour of the part (report/style.css .part-*): its class, or what the rest of the step is
        colour = row["step_class"] or ("idle" if row["part"] == IDLE else "wait" if row["part"] == DATA_WAIT else "again")
        shown.append(
            {
                **row,
                "time": duration_text(row["time_s"]),
                "kernels": counts["kernels"] if counts else None,
                "launches": counts["launches"] / steps if counts else None,
                "colour": colour,
            }
        )
    if breakdown.get("window_s"):  # a timeline's step, window / steps, said with its numbers
        breakdown = {**breakdown, "step_basis": f"the profiled window's step: {duration_text(breakdown['window_s'])} over {breakdown['steps']:g} steps"}
    return {
        **breakdown,
        "rows": shown,
        "step": duration_text(breakdown["step_s"]),
        "sum": duration_text(breakdown["sum_s"]),
        "captured": duration_text(breakdown["captured_s"]),
        "measured_step": duration_text(breakdown.get("measured_step_s")),
        "bar": [row for row in shown if row["share"] > 0],
    }
