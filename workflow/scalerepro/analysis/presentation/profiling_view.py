"""What the report's profiling section shows of one profiled run: its failed captures with their
errors, the kernels that took the profiled step's time (by kind too), what their times and shares
are of, set beside the measured run's step, and the roofline rows with readable names.

The rows come from the profiling tables (``scalerepro.analysis.profiles.captures``) as the report
reads them; this module only selects, names and relates them, so the template says no number the
tables do not hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerepro.analysis.profiles.kernels import kind_totals, short_name

KERNELS_SHOWN = 15  # the kernels by time the report lists (the CSV has every one)
ROOFLINE_SHOWN = 15  # the roofline rows it lists, by time


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN: no value


def measured_step(measured: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The profiled run's own measured step (runs.csv, and its record's count of measured steps):
    median, p10, p90 and n; None when the run has no measured step."""
    if not measured or _number(measured[0].get("step_time_median_s")) is None:
        return None
    run = measured[0]
    record = Path(str(run.get("record") or ""))
    try:
        steps = ((json.loads(record.read_text()).get("measurements") or {}).get("measured_steps")) if record.is_file() else None
    except (OSError, ValueError):
        steps = None
    return {"median_s": _number(run.get("step_time_median_s")), "p10_s": _number(run.get("step_time_p10_s")),
            "p90_s": _number(run.get("step_time_p90_s")), "n": steps}  # fmt: skip


def profiled_run(
    run: Mapping[str, Any],
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
    kernels_total = sum(_number(k.get("total_s")) or 0.0 for k in kernels)
    shown = [rows({**k, "short": short_name(str(k.get("name") or ""))}) for k in kernels[:KERNELS_SHOWN]]
    by_time = sorted(roofline, key=lambda r: -(_number(r.get("duration_s")) or 0.0))
    unplaced: dict[str, int] = {}
    for row in roofline:
        if _number(row.get("peak_flops_per_s")) is None or _number(row.get("arithmetic_intensity")) is None:
            reason = str(row.get("roof") or row.get("peak") or "no roof").removeprefix("none: ")
            unplaced[reason] = unplaced.get(reason, 0) + 1
    step = measured_step(measured)
    return {
        "run": run,
        "files": files,
        "failures": failures,
        "warnings": warnings,  # the failures are said above them, in full
        "timeline": _number(run.get("window_s")) is not None,  # a breakdown of the step (nsys, torch.profiler)
        "kernels": shown,
        "kernels_count": len(kernels),
        # one launch of each configuration: their sum, how many, and the step's time they do not cover
        "times": {"kernels_s": kernels_total, "configurations": sum(int(_number(k.get("calls")) or 0) for k in kernels),
                  "unseen_s": step["median_s"] - kernels_total if from_ncu and step and step["median_s"] > kernels_total else None},
        "kernels_from_ncu": from_ncu,
        # by kind only where the table holds every kernel (ncu), not a top ten
        "kinds": [rows(k) for k in kind_totals([dict(k) for k in kernels])] if from_ncu else [],
        "step": step,
        "roofline": [rows({**r, "short": short_name(str(r.get("kernel") or ""))}) for r in by_time[:ROOFLINE_SHOWN]],
        "roofline_count": len(roofline),
        "roofline_unplaced": sorted(unplaced.items(), key=lambda item: -item[1]),
        "peaks_basis": next((r.get("peaks_basis") for r in roofline if r.get("peaks_basis")), None),
    }
