"""Reading Nsight Compute's `--csv --page raw` output: one row per kernel launch and metric, the
units ncu prints converted to SI.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.profiles.intervals import ProfileError

# --------------------------------------------------------------------------------------------
# Nsight Compute: the CSV (long "details" layout: one row per kernel launch and metric)
# --------------------------------------------------------------------------------------------

# What the roofline and the summary read, by raw metric name: the rows of --metrics, and every
# row under --print-metric-name name (scalerepro.launching.nsight asks for that). -> (field, quantity)
NCU_RAW = {
    "gpu__time_duration.sum": ("duration", "time"),
    "dram__bytes.sum": ("dram_bytes", "bytes"),
    "dram__bytes.sum.per_second": ("dram_bytes_per_s", "bytes/s"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("sm_throughput_pct", "percent"),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("memory_throughput_pct", "percent"),
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("dram_throughput_pct", "percent"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved_occupancy_pct", "percent"),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical_occupancy_pct", "percent"),
    # tensor-pipe utilisation, one metric per GPU generation (scalerepro.launching.nsight.TENSOR_PIPE_METRICS)
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
NCU_FIELDS = (
    "duration",
    "dram_bytes",
    "dram_bytes_per_s",
    "sm_throughput_pct",
    "memory_throughput_pct",
    "dram_throughput_pct",
    "tensor_pipe_pct",
    "wgmma_instructions",
    "achieved_occupancy_pct",
    "theoretical_occupancy_pct",
)
# FLOPs per SASS thread instruction: an FMA is two.
FLOP_COUNTERS = {
    f"sm__sass_thread_inst_executed_op_{precision}{op}_pred_on.sum": weight
    for precision in ("f", "h", "d")
    for op, weight in (("add", 1), ("mul", 1), ("fma", 2))
}
# the CUDA-core precision of each counter: the roofline sets a kernel against the roof of the
# precision most of its CUDA-core FLOPs ran in (``flops_fp32``, ``flops_fp16``, ``flops_fp64``)
FLOP_COUNTER_PRECISION = {name: {"f": "fp32", "h": "fp16", "d": "fp64"}[name.split("_op_")[1][0]] for name in FLOP_COUNTERS}
CUDA_CORE_PRECISIONS = ("fp32", "fp16", "fp64")
_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # ncu's byte prefixes are decimal (Kbyte = 1000 byte)
# Every unit spelling ncu prints for the quantities read here -> (quantity, factor to the base
# unit: seconds, bytes, bytes/s, percent, count). Older versions spell time "nsecond", newer
# "ns"; without --print-units base ncu scales each value to its own prefix (usecond, Mbyte...).
NCU_UNITS = {
    **{
        unit: ("time", scale)
        for scale, units in ((1e-9, ("ns", "nsecond")), (1e-6, ("us", "usecond")), (1e-3, ("ms", "msecond")), (1.0, ("s", "second")))
        for unit in units
    },
    **{f"{p}{b}": ("bytes", scale) for p, scale in _SI.items() for b in ("byte", "B")},
    **{f"{p}{b}{per}": ("bytes/s", scale) for p, scale in _SI.items() for b in ("byte", "B") for per in ("/second", "/s")},
    "%": ("percent", 1.0),
    "": ("count", 1.0),
    "inst": ("count", 1.0),
}
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
        raise ProfileError(f'{path}: no ncu CSV header (a line starting with "ID"): was it written by ncu --csv?')
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
        field_name: str | None
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
            by_precision = f"flops_{FLOP_COUNTER_PRECISION[name]}"
            launch[by_precision] = launch.get(by_precision, 0.0) + FLOP_COUNTERS[name] * value
        else:
            launch[field_name] = value * scale
    frame = pd.DataFrame(list(launches.values()), columns=["id", "kernel", "flops", *(f"flops_{p}" for p in CUDA_CORE_PRECISIONS), *NCU_FIELDS])
    if frame.empty:
        raise ProfileError(f"{path}: the ncu CSV holds no kernel")
    # The display-name layout has DRAM bandwidth but no byte count: bytes = bandwidth x duration.
    derived = frame["dram_bytes"].isna() & frame["dram_bytes_per_s"].notna() & frame["duration"].notna()
    frame.loc[derived, "dram_bytes"] = frame.loc[derived, "dram_bytes_per_s"] * frame.loc[derived, "duration"]
    # numpy's stubs take no None, which np.where places in an object array as it is
    frame["dram_bytes_source"] = np.where(derived, "DRAM bytes/s x duration", np.where(frame["dram_bytes"].notna(), "dram__bytes.sum", None))  # type: ignore[call-overload]
    problems = [f"{path.name}: {metric}: {why}, in {len(ids)} of {len(frame)} launches: not read" for (metric, why), ids in unread.items()]
    untimed = frame[frame["duration"].isna()]
    if len(untimed):
        problems.append(
            f"{path.name}: {len(untimed)} of {len(frame)} launches have no duration (gpu__time_duration.sum or Duration): "
            f"{', '.join(sorted(set(untimed['kernel'].str.slice(0, 60))))}"
        )
    layout = {frozenset({"raw"}): "raw metric names", frozenset({"display"}): "section display names"}.get(frozenset(names_seen), "raw and display names")
    return NcuReading(launches=frame, layout=layout, problems=problems, compute_capabilities=sorted(capabilities - {""}))
