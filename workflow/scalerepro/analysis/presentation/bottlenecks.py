"""What bounds each model on one GPU, from the measurements: per model's one-GPU headline cell
(``headline.headline``; its clocks and power from ``cell_facts.clocks``) and, where the model was
profiled, the profile's kernel classes (``profiles.step``) and roofline. Each finding states its
evidence and the lever it implies:

* power-bound: the card's mean power at least ``POWER_BOUND_SHARE`` of its limit while its SM clock
  mean is under ``CLOCK_HELD_SHARE`` of the top clock: the power controller, not the work, sets the
  clock. Lever: fewer joules per step (fused attention, norms and loss move fewer bytes).
* memory-bound normalisation and elementwise kernels: that class at least ``MEMORY_CLASS_SHARE_MIN``
  of the kernel time, its kernels' time-weighted median DRAM throughput at least
  ``MEMORY_BOUND_DRAM_MIN`` of the peak. Lever: fuse the normalisation (fewer passes over the activations).
* the stem on the CUDA cores: the longest convolution set under a CUDA-core roof (no tensor-core
  work; roofline.py). Lever: pad the stem's input to 4 or 8 channels.
* a timeline's classification other than compute-bound (input-, launch/latency-, communication-bound).

A model with none of these says what is known: its GPU utilisation, power and clock, and whether
it was profiled. On the analysis side: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.presentation.headline import counting_runs, headline
from scalerepro.analysis.presentation.inputs import read_table
from scalerepro.analysis.profiles.kernels import kernel_class, short_name
from scalerepro.analysis.profiles.step import CLASS_COLUMNS, ONE_PER_CONFIGURATION
from scalerepro.analysis.values import finite_number, plain

# NVML's power reading is a mean over its sample period; a card the power controller holds at its
# limit reads a few percent under it on average (the controller steps the clock down and up around
# the limit), so 97 % of the limit is "at the limit".
POWER_BOUND_SHARE = 0.97
# A card not held back runs within a few percent of its top SM clock (the kept H100 study's
# ResNets: 99.6 % and 100 %); under 95 % the clock was pulled down.
CLOCK_HELD_SHARE = 0.95
# A class worth a lever: a quarter of the kernel time or more.
MEMORY_CLASS_SHARE_MIN = 0.25
# HBM sustains about 80-90 % of its peak in practice: a kernel at 60 % of the peak or more is paced
# by the bytes it moves, so only moving fewer of them (fusion) makes it faster.
MEMORY_BOUND_DRAM_MIN = 0.60
MEMORY_CLASS = "normalisation and elementwise"
# the lever of a timeline's classification (profiles.classify)
CLASS_LEVERS = {
    "input-bound": "feed it faster: the device loader (--loader device) or more loader workers",
    "launch/latency-bound": "fewer launches: CUDA graphs (--compile reduce-overhead) or larger batches",
    "communication-bound": "overlap or shrink the communication: gradient buckets, bf16 gradients",
}


def _number(value: Any) -> float | None:
    return finite_number(plain(value))


def _cell_runs(runs: pd.DataFrame, cell: Mapping[str, Any]) -> pd.DataFrame:
    """The counted runs of a headline cell."""
    ok = counting_runs(runs)
    return ok[ok["cell"].eq(cell["cell"])]


def power_bound(clocks: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The power-bound finding of a cell's clocks (cell_facts.clocks), None where it is not one."""
    if not clocks:
        return None
    power, limit = _number(clocks.get("power_per_gpu_w")), _number(clocks.get("power_limit_w"))
    mean, top = _number(clocks.get("sm_mean_mhz")), _number(clocks.get("sm_top_mhz"))
    if power is None or mean is None or not limit or not top:
        return None
    if power < POWER_BOUND_SHARE * limit or mean >= CLOCK_HELD_SHARE * top:
        return None
    reasons = f"; clock events: {clocks['reasons']}" if clocks.get("reasons") else ""
    return {
        "what": "power-bound",
        "evidence": f"{power:,.0f} W of {limit:,.0f}, SM clock {mean:,.0f} of {top:,.0f} MHz{reasons}",
        "lever": "fewer joules per step: fused attention, fused norms and a fused loss move fewer bytes, so the same power holds a higher clock",
    }


def _profile_of(profiling: pd.DataFrame, runs: pd.DataFrame, cell_runs: pd.DataFrame, model: Any) -> dict[str, Any] | None:
    """The model's one-GPU profile: of one of the cell's runs, else of another one-GPU run of the model."""
    if profiling.empty or "run_id" not in profiling.columns:
        return None
    own = profiling[profiling["run_id"].isin(cell_runs.get("run_id", pd.Series(dtype=str)))]
    if own.empty and {"run_id", "model", "gpus"} <= set(runs.columns):
        others = runs[runs["model"].eq(model) & runs["gpus"].eq(1)]["run_id"]
        own = profiling[profiling["run_id"].isin(others)]
    return {key: plain(value) for key, value in own.iloc[0].items()} if len(own) else None


def memory_bound_class(profile: Mapping[str, Any], roofline: pd.DataFrame) -> dict[str, str] | None:
    """The normalisation-and-elementwise finding: its share of the kernel time and its kernels'
    DRAM throughput (the time-weighted middle half), None where it is not one."""
    coverage = profile.get("kernel_coverage")
    seconds = {c: _number(profile.get(column)) or 0.0 for c, column in CLASS_COLUMNS.items()}
    total = sum(seconds.values())
    if not total or roofline.empty:
        return None
    share = seconds[MEMORY_CLASS] / total
    rows = roofline[[kernel_class(str(k), kind) == MEMORY_CLASS for k, kind in zip(roofline["kernel"], roofline["kind"])]]
    rows = rows.dropna(subset=["dram_fraction", "duration_s"])
    if share < MEMORY_CLASS_SHARE_MIN or rows.empty:
        return None
    order = rows.sort_values("dram_fraction")
    weight = np.cumsum(order["duration_s"].to_numpy()) / order["duration_s"].sum()
    fraction = order["dram_fraction"].to_numpy()
    low, median, high = (float(fraction[np.searchsorted(weight, q)]) for q in (0.25, 0.5, 0.75))
    if median < MEMORY_BOUND_DRAM_MIN:
        return None
    of = "of the captured kernel time (one launch per configuration)" if coverage == ONE_PER_CONFIGURATION else "of the step's kernel time"
    return {
        "what": "memory-bound normalisation and elementwise kernels",
        "evidence": f"{100 * share:.0f} % {of}, at {100 * low:.0f}–{100 * high:.0f} % of DRAM bandwidth (the middle half of their time)",
        "lever": "fuse the normalisation: fewer passes over the activations (each pass reads and writes them at DRAM speed)",
    }


def stem_on_cuda_cores(roofline: pd.DataFrame, images: bool) -> dict[str, str] | None:
    """The finding of a longest convolution with no tensor-core work (set under a CUDA-core roof)."""
    if roofline.empty:
        return None
    convolutions = roofline[[kernel_class(str(k), kind) == "convolution" for k, kind in zip(roofline["kernel"], roofline["kind"])]]
    convolutions = convolutions.dropna(subset=["duration_s"])
    if convolutions.empty:
        return None
    longest = convolutions.loc[convolutions["duration_s"].idxmax()]
    if not (_number(longest.get("tensor_flops")) == 0 and "CUDA cores" in str(longest.get("roof") or "")):
        return None
    rate, fraction = _number(longest.get("achieved_flops_per_s")), _number(longest.get("flops_fraction"))
    figures = f"{longest['duration_s'] * 1e6:,.0f} µs"
    if rate and fraction:
        figures += f", {rate / 1e12:.1f} TFLOP/s = {100 * fraction:.0f} % of the {longest['roof']} roof"
    name = short_name(str(longest["kernel"]), 40)
    if images:  # an image model's first convolution reads the 3-channel image, too few channels for cuDNN's tensor-core kernels
        return {
            "what": "the 3-channel stem on the CUDA cores",
            "evidence": f"the longest convolution, {name} ({figures}), did no tensor-core work: the stem's 3 input channels",
            "lever": "pad the stem's input to 4 or 8 channels (zero channels) so that cuDNN takes a tensor-core kernel",
        }
    return {
        "what": "the longest convolution on the CUDA cores",
        "evidence": f"{name} ({figures}) did no tensor-core work",
        "lever": "give it channels in multiples of 8 so that cuDNN takes a tensor-core kernel",
    }


def bottleneck_rows(runs: pd.DataFrame, cells: pd.DataFrame, scaling: pd.DataFrame, inventory: Any, tables_dir: Path) -> list[dict[str, Any]]:
    """Per model with a one-GPU headline cell: ``model``, ``config`` (the cell's), ``findings``
    (each ``what``, ``evidence``, ``lever``), ``known`` (what is known where nothing was found),
    ``profiled`` (the profile's run id, None without one)."""
    profiling = read_table(Path(tables_dir), "profiling")
    roofline = read_table(Path(tables_dir), "profiling_roofline")
    out = []
    for item in headline(runs, cells, scaling, inventory):
        cell = item["one"]
        if cell is None or (cell.get("device") or {}).get("cpu"):
            continue
        cell_runs = _cell_runs(runs, cell)
        profile = _profile_of(profiling, runs, cell_runs, item["model"])
        own_roof = roofline[roofline["run_id"].eq(profile["run_id"])] if profile and "run_id" in roofline.columns else pd.DataFrame()
        findings = [power_bound(cell.get("clocks"))]
        if profile:
            findings.append(memory_bound_class(profile, own_roof))
            findings.append(stem_on_cuda_cores(own_roof, cell.get("unit") == "img/s"))
            verdict = profile.get("classification")
            if verdict in CLASS_LEVERS:
                findings.append({"what": verdict, "evidence": str(profile.get("evidence") or ""), "lever": CLASS_LEVERS[verdict]})
        findings = [finding for finding in findings if finding]
        out.append(
            {
                "model": item["model"],
                "config": cell.get("config"),
                "findings": findings,
                "profiled": (profile or {}).get("run_id"),
                "known": None if findings else _known(cell, cell_runs, profile),
            }
        )
    return out


def _known(cell: Mapping[str, Any], cell_runs: pd.DataFrame, profile: Mapping[str, Any] | None) -> str:
    """What the measurements say of a cell none of the findings fits: its GPU utilisation, power
    and clock, and its profile (or that there is none)."""
    parts = []
    utilisation = [n for n in map(_number, cell_runs.get("gpu_util_mean_pct", [])) if n is not None]
    if utilisation:
        parts.append(f"compute at {float(np.median(utilisation)):.1f} % GPU utilisation")
    clocks = cell.get("clocks") or {}
    power, limit = _number(clocks.get("power_per_gpu_w")), _number(clocks.get("power_limit_w"))
    mean, top = _number(clocks.get("sm_mean_mhz")), _number(clocks.get("sm_top_mhz"))
    if power is not None and limit:
        parts.append(f"{power:,.0f} W of {limit:,.0f}")
    if mean is not None and top:
        parts.append(f"SM clock {mean:,.0f} of {top:,.0f} MHz")
    parts.append(f"profiled ({profile['run_id']}): no class of its kernels past a threshold" if profile else "no profile")
    return "; ".join(parts)
