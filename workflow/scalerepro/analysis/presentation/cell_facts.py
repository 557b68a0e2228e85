"""What a reader needs beside a cell's median to trust it: its spread, the clocks and power its card
held, and where its repeats came from.

A cell is the counted repeats of one configuration (runs.csv rows). Each figure below is read from
those rows alone, with its formula:

* spread: over n >= 3 repeats the min - max of their throughputs (a median of three is one of
  them); over n = 2 the two runs themselves, whose median is their mean, a figure no run
  measured; over n = 1 the run's own spread over its measured steps, the throughput of its p90
  and p10 steps: global batch / step time (p90 step: the low end).
* clocks and power (NVML over the window): the SM clock's mean (the median over repeats) and
  lowest reading (the lowest over repeats) against the card's top SM clock; the mean power (the
  energy counter's delta over the NVML window: the power samples, 1 s moving averages on Hopper,
  lag a window of seconds; their mean only where no counter was read) against the power limit;
  the hottest reading; the clock-event (throttle) reasons and the share of the window each was
  active. MFU at the clock held = MFU x the clock the peak is quoted at / mean
  clock: the MFU the run would have against the peak scaled to the clock it ran at (the peak's
  own clock: an H100 SXM5's dense bf16 989.4 TFLOP/s is quoted at 1,830 MHz, not at its 1,980 MHz
  top clock; none where the peak's source quotes no clock).
* provenance: the commits and cards the repeats ran at, where there are several.

On the analysis side: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from scalerepro.analysis.values import finite_number, plain


def _numbers(cell: pd.DataFrame, column: str) -> list[float]:
    if column not in cell.columns:
        return []
    return [number for value in cell[column] if (number := finite_number(value)) is not None]


def _texts(cell: pd.DataFrame, column: str) -> list[str]:
    if column not in cell.columns:
        return []
    return sorted({str(value) for value in cell[column] if plain(value) is not None})


def spread(cell: pd.DataFrame, tokens: bool) -> dict[str, Any]:
    """The spread of a cell's throughput (samples/s, or tokens/s where ``tokens``): its kind
    ("repeats": min - max; "two runs": the two, the median their mean; "steps": one run's p10 and
    p90 steps), the low and high figures and what they are over."""
    column = "tokens_per_s" if tokens else "samples_per_s"
    values = _numbers(cell, column)
    if len(values) >= 2:
        return {"kind": "repeats" if len(values) > 2 else "two runs", "low": min(values), "high": max(values), "n": len(values)}
    if len(cell) != 1:
        return {"kind": None, "low": None, "high": None, "n": len(values)}
    run = cell.iloc[0]
    batch, p10, p90 = (finite_number(run.get(key)) for key in ("global_batch", "step_time_p10_s", "step_time_p90_s"))
    per_sample = (finite_number(run.get("tokens_per_sample")) or 0) if tokens else 1
    steps = finite_number(run.get("measured_steps"))
    if not (batch and p10 and p90 and per_sample):
        return {"kind": None, "low": None, "high": None, "n": 1}
    # a step's throughput = global batch (x tokens per sample) / its time: the p90 step is the slow end
    return {"kind": "steps", "low": batch * per_sample / p90, "high": batch * per_sample / p10, "n": 1, "steps": int(steps) if steps else None}


def median_step_rate(cell: pd.DataFrame, tokens: bool) -> float | None:
    """One run's median step as a throughput: global batch (x tokens per sample where ``tokens``)
    / its median step time; None for a cell of several runs (its figure is their median)."""
    if len(cell) != 1:
        return None
    run = cell.iloc[0]
    batch, median = finite_number(run.get("global_batch")), finite_number(run.get("step_time_median_s"))
    per_sample = (finite_number(run.get("tokens_per_sample")) or 0) if tokens else 1
    return batch * per_sample / median if batch and median and per_sample else None


def _inventory_gpu(inventory: Any, name: Any) -> Mapping[str, Any]:
    """The inventory's entry of the GPU model ``name`` (its power limit and top clock), or {}."""
    gpus = inventory.get("gpus") if isinstance(inventory, Mapping) else None
    return next((gpu for gpu in gpus or () if isinstance(gpu, Mapping) and gpu.get("name") == name), {})


def clocks(cell: pd.DataFrame, inventory: Any = None) -> dict[str, Any] | None:
    """The clocks and power the card held over the cell's windows (module docstring), None where no
    run of the cell read NVML (a CPU). The top SM clock and the power limit come from the records
    (schema 4) or the inventory kept beside them (inventory_view.cards_beside: ``card_basis``),
    else from the inventory's entry of the same GPU model, and say which."""
    means = _numbers(cell, "sm_clock_mean_mhz")
    if not means:
        return None
    lows = _numbers(cell, "sm_clock_min_mhz")
    device = _texts(cell, "device_name")
    listed = _inventory_gpu(inventory, device[0] if len(device) == 1 else None)
    # a run's top clock and limit are its record's, or the inventory's beside it (card_basis says which)
    beside = "the record" if not _texts(cell, "card_basis") else "the inventory beside the records"
    top, top_basis = max(_numbers(cell, "sm_clock_max_supported_mhz"), default=None), beside
    if top is None and finite_number(listed.get("max_sm_clock_mhz")) is not None:
        top, top_basis = finite_number(listed.get("max_sm_clock_mhz")), "the inventory"
    per_gpu_limit = [
        limit / max(1, finite_number(gpus) or 1) for limit, gpus in zip(cell.get("power_limit_w", []), cell.get("gpus", [])) if finite_number(limit) is not None
    ]
    limit, limit_basis = (max(per_gpu_limit), beside) if per_gpu_limit else (finite_number(listed.get("power_limit_w")), "the inventory")
    gpus = max(_numbers(cell, "gpus"), default=1) or 1
    # power_w: the energy counter's delta over the NVML window, else the power samples' mean (power_basis)
    power = pd.Series(_numbers(cell, "power_w")).median() / gpus if _numbers(cell, "power_w") else None
    power_bases = _texts(cell, "power_basis")
    mean = float(pd.Series(means).median())
    mfu = pd.Series(_numbers(cell, "mfu")).median() if _numbers(cell, "mfu") else None
    quoted = max(_numbers(cell, "peak_clock_mhz"), default=None)  # one peak per cell: its runs share a device and a precision
    reasons = _texts(cell, "clock_event_reasons")
    return {
        "sm_mean_mhz": mean,
        "sm_low_mhz": min(lows) if lows else None,
        "sm_top_mhz": top,
        "sm_top_basis": top_basis if top is not None else None,
        "power_per_gpu_w": power,
        "power_basis": "; ".join(power_bases) if power_bases else None,
        "power_limit_w": limit,
        "power_limit_basis": limit_basis if limit is not None else None,
        "temperature_max_c": max(_numbers(cell, "temperature_max_c"), default=None),
        **window(cell),
        # reasons: each run's "reason share %, ..." (scalerepro.record.columns); none recorded before schema 4
        "reasons": "; ".join(reasons) if reasons else None,
        # MFU at the clock held = MFU x the clock the peak is quoted at / mean clock
        "mfu_at_clock": mfu * quoted / mean if mfu is not None and quoted and mean else None,
        "peak_clock_mhz": quoted,
    }


def window(cell: pd.DataFrame) -> dict[str, Any]:
    """How long the cell's measured windows were and how the card changed over them: the median
    window's seconds; the hottest first and last temperature readings and the lowest first and
    last SM clocks over the repeats (None before schema 6, which first records them)."""
    seconds = _numbers(cell, "window_s")
    return {
        "window_s": float(pd.Series(seconds).median()) if seconds else None,
        "temperature_start_c": max(_numbers(cell, "temperature_start_c"), default=None),
        "temperature_end_c": max(_numbers(cell, "temperature_end_c"), default=None),
        "sm_start_mhz": min(_numbers(cell, "sm_clock_start_mhz"), default=None),
        "sm_end_mhz": min(_numbers(cell, "sm_clock_end_mhz"), default=None),
    }


def hottest_run(cell: pd.DataFrame, tokens: bool) -> dict[str, Any] | None:
    """Of a cell's two or more repeats with a temperature, the hottest (its highest reading) and
    its throughput, and whether it is the slowest: on a power-capped card the hotter run holds a
    lower clock, so short windows on a card that started cool read above its steady state. None
    for a single run or where no run read a temperature."""
    column = "tokens_per_s" if tokens else "samples_per_s"
    if not {"temperature_max_c", column} <= set(cell.columns):
        return None
    runs = [(t, r) for t, r in zip(cell["temperature_max_c"], cell[column]) if finite_number(t) is not None and finite_number(r) is not None]
    if len(runs) < 2:
        return None
    temperature, rate = max(runs, key=lambda run: (run[0], -run[1]))
    return {"temperature_c": temperature, "rate": rate, "slowest": rate == min(r for _, r in runs), "n": len(runs)}


def provenance(cell: pd.DataFrame) -> dict[str, Any]:
    """The commits, cards and hosts a cell's repeats ran at: each list, and how many runs name no
    card (records before schema 4 do not)."""
    commits = _texts(cell, "git_commit")
    dirty = [flag for flag in (plain(v) for v in cell.get("git_dirty", [])) if flag is not None]
    cards = _texts(cell, "gpu_uuid")
    unknown = int(cell["gpu_uuid"].isna().sum()) if "gpu_uuid" in cell.columns else len(cell)
    return {
        "commits": commits,
        "dirty": "all" if dirty and all(dirty) else "some" if any(dirty) else "none" if dirty else None,
        "cards": cards,
        "cards_unknown": unknown if cell.get("device_type", pd.Series(dtype=str)).eq("cuda").any() else 0,
        "hosts": _texts(cell, "hostname"),
    }
