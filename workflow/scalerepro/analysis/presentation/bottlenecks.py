"""What bounds each model on one GPU, from the evidence its one-GPU headline cell has
(``headline.headline``; its clocks, power and MFU from ``cell_facts.clocks``) and, where a run of
the cell's configuration was profiled, the profile's kernel classes (``profiles.step``) and roofline.
Each finding states its evidence and the lever it implies; the rules are the thresholds below, each
with its unit and its reason:

* power-bound: mean power at least ``POWER_BOUND_SHARE`` of the power limit while the SM clock's
  mean is under ``CLOCK_HELD_SHARE`` of its top: the power controller, not the work, sets the clock.
  The limit and the top clock are the cell's (its records, else the inventory), else the part's
  datasheet (``gpu_peaks``: the most power it can be set to draw, and its top boost clock, the one
  its CUDA-core rates are quoted at): a configured limit is at most the datasheet's, so power at
  95 % of that is at 95 % of the limit too, and the verdict never rests on whether an inventory
  happened to be kept beside the records.
* matmul-bound: the MFU at the clock held at least ``MATMUL_MFU_MIN``, or a profile whose GEMM
  class is at least ``MATMUL_CLASS_SHARE_MIN`` of the kernel time. Power-bound matmuls (both at
  once) take the levers that move a GEMM at its power cap: FP8 matmuls and a larger batch.
* memory-bound normalisation and elementwise kernels: that class at least ``MEMORY_CLASS_SHARE_MIN``
  of the kernel time, its kernels' time-weighted median DRAM throughput at least
  ``MEMORY_BOUND_DRAM_MIN`` of the peak. Lever: fuse the normalisation (fewer passes over the activations).
* the stem on the CUDA cores: the longest convolution set under a CUDA-core roof (no tensor-core
  work; roofline.py). Lever: pad the stem's input to 4 or 8 channels.
* a timeline's classification other than compute-bound (input-, launch/latency-, communication-bound).

A model none of these fits is "unknown", with what each rule lacked or where its evidence fell
short. NVML's GPU utilisation is evidence of none of them: it is the share of its sample periods in
which a kernel ran, whatever bounded that kernel. On the analysis side: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.presentation.formatting import MISSING
from scalerepro.analysis.presentation.headline import headline
from scalerepro.analysis.presentation.inputs import read_table
from scalerepro.analysis.profiles.kernels import kernel_class, short_name
from scalerepro.analysis.profiles.step import CLASS_COLUMNS, ONE_PER_CONFIGURATION
from scalerepro.analysis.values import finite_number, plain
from scalerepro.common.gpu_peaks import PEAKS, peaks_key

# share of the power limit: the controller holds a moving average of the power at the limit,
# stepping the clock down and up around it, so a card it holds reads a few percent under the limit
# over a window (the kept power-capped language models: 97-99 %); 95 % leaves room for that.
POWER_BOUND_SHARE = 0.95
# share of the top SM clock: a card the controller leaves alone runs within a few percent of its
# top (the kept ResNets: 97.6-100 %); under 97 % the clock was pulled down.
CLOCK_HELD_SHARE = 0.97
# MFU at the clock held, of the dense peak at that clock: no kernel runs above the peak, so it is a
# floor on the share of the step the tensor cores spend on the model's matmuls; bf16 GEMMs of
# these shapes sustain about 70-80 % of the dense peak, so at 40 % the matmuls take about half the
# step or more.
MATMUL_MFU_MIN = 0.40
# share of the profiled kernel time: the GEMMs (the linear layers, where FP8 applies) are the
# larger part of the step's kernels.
MATMUL_CLASS_SHARE_MIN = 0.50
MATMUL_CLASS = "GEMM"
# share of the profiled kernel time: a class worth a lever is a quarter of it or more.
MEMORY_CLASS_SHARE_MIN = 0.25
# share of the peak DRAM bandwidth: HBM sustains about 80-90 % of its peak in practice, so a kernel
# at 60 % of the peak or more is paced by the bytes it moves, and only moving fewer (fusion) speeds it.
MEMORY_BOUND_DRAM_MIN = 0.60
MEMORY_CLASS = "normalisation and elementwise"
# the lever of a timeline's classification (profiles.classify)
CLASS_LEVERS = {
    "input-bound": "feed it faster: the device loader (--loader device) or more loader workers",
    "launch/latency-bound": "fewer launches: CUDA graphs (--compile reduce-overhead) or larger batches",
    "communication-bound": "overlap or shrink the communication: gradient buckets, bf16 gradients",
}
FUSION_LEVER = "fused attention, fused norms and a fused loss move fewer bytes, so the same power holds a higher clock"
MATMUL_LEVERS = (
    "FP8 matmuls (Transformer Engine or torchao float8: fewer joules per FLOP, twice the dense peak)",
    "a larger batch (bigger GEMMs run nearer their peak, fewer launches per sample)",
)
PROFILE_LEVER = "profile it (profiling.runs): its kernel classes and roofline name what bounds it"
UNKNOWN = "unknown"


def _number(value: Any) -> float | None:
    return finite_number(plain(value))


def with_datasheet_limits(clocks: Mapping[str, Any] | None, device_name: Any) -> dict[str, Any] | None:
    """A cell's clocks (cell_facts.clocks) with the power limit and the top SM clock its records and
    the inventory left out taken from its part's datasheet (gpu_peaks), the basis saying so."""
    if not clocks:
        return None
    filled = dict(clocks)
    part = PEAKS.get(peaks_key(device_name if isinstance(device_name, str) else None) or "")
    if part is None:
        return filled
    if _number(filled.get("power_limit_w")) is None and part.power_limit_max_w:
        filled.update(power_limit_w=part.power_limit_max_w, power_limit_basis=f"the {part.model} datasheet's most")
    if _number(filled.get("sm_top_mhz")) is None and part.cuda_core_clock_mhz:
        filled.update(sm_top_mhz=part.cuda_core_clock_mhz, sm_top_basis=f"the {part.model} boost clock")
    return filled


def _power_and_clock(clocks: Mapping[str, Any]) -> tuple[float, float, float, float] | None:
    """Power, its limit, the SM clock's mean and its top, None where any is unknown."""
    figures = tuple(_number(clocks.get(key)) for key in ("power_per_gpu_w", "power_limit_w", "sm_mean_mhz", "sm_top_mhz"))
    return None if any(not figure for figure in figures) else figures  # type: ignore[return-value]


def _power_text(power: float, limit: float, mean: float, top: float, clocks: Mapping[str, Any]) -> str:
    datasheet = " (datasheet)" if "datasheet" in str(clocks.get("power_limit_basis") or "") else ""
    return f"{power:,.0f} W of {limit:,.0f}{datasheet}, SM clock {mean:,.0f} of {top:,.0f} MHz"


def power_bound(clocks: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The power-bound finding of a cell's clocks (with_datasheet_limits), None where it is not one."""
    figures = _power_and_clock(clocks) if clocks else None
    if clocks is None or figures is None:
        return None
    power, limit, mean, top = figures
    if power < POWER_BOUND_SHARE * limit or mean >= CLOCK_HELD_SHARE * top:
        return None
    reasons = f"; clock events: {clocks['reasons']}" if clocks.get("reasons") else ""
    return {"what": "power-bound", "evidence": _power_text(*figures, clocks) + reasons, "lever": f"fewer joules per step: {FUSION_LEVER}"}


def _not_power_bound(clocks: Mapping[str, Any] | None) -> str:
    """Why a cell is not shown power-bound: the figure that fell short, or the one that is missing."""
    if not clocks:
        return "no NVML power or clock"
    figures = _power_and_clock(clocks)
    if figures is None:
        missing = [
            name
            for key, name in (("power_per_gpu_w", "power"), ("power_limit_w", "power limit"), ("sm_top_mhz", "top SM clock"))
            if not _number(clocks.get(key))
        ]
        return f"no {' or '.join(missing)} known: power-bound untested"
    power, limit, mean, top = figures
    why = (
        f"power {100 * power / limit:.1f} % of the limit, under {100 * POWER_BOUND_SHARE:.0f} %"
        if power < POWER_BOUND_SHARE * limit
        else f"clock {100 * mean / top:.1f} % of its top, {100 * CLOCK_HELD_SHARE:.0f} % or more"
    )
    return f"{_power_text(*figures, clocks)}: not power-bound ({why})"


def _mfu_held(cell: Mapping[str, Any]) -> float | None:
    """The cell's MFU at the clock held (cell_facts.clocks), else its MFU."""
    held = _number((cell.get("clocks") or {}).get("mfu_at_clock"))
    return held if held is not None else _number(cell.get("mfu"))


def _class_shares(profile: Mapping[str, Any]) -> dict[str, float]:
    """Each kernel class's share of the profile's kernel time ({} without one)."""
    seconds = {c: _number(profile.get(column)) or 0.0 for c, column in CLASS_COLUMNS.items()}
    total = sum(seconds.values())
    return {c: value / total for c, value in seconds.items()} if total else {}


def matmul_bound(cell: Mapping[str, Any], profile: Mapping[str, Any] | None) -> str | None:
    """The evidence that the cell's step is mostly tensor-core matmuls, None where there is none."""
    gemm = _class_shares(profile).get(MATMUL_CLASS, 0.0) if profile else 0.0
    if gemm >= MATMUL_CLASS_SHARE_MIN:
        return f"GEMMs {100 * gemm:.0f} % of the profiled kernel time"
    held = _mfu_held(cell)
    if held is not None and held >= MATMUL_MFU_MIN:
        return f"MFU {100 * held:.1f} % at the clock held: the matmuls take at least that share of the step"
    return None


def _profile_of(profiling: pd.DataFrame, runs: pd.DataFrame, cell: Mapping[str, Any]) -> dict[str, Any] | None:
    """The profile of a run of the cell's configuration (one of its counted runs, or another run of
    the same cell), None where no such run was profiled: a profile of other settings is not its."""
    if profiling.empty or "run_id" not in profiling.columns or not {"run_id", "cell"} <= set(runs.columns):
        return None
    same = profiling[profiling["run_id"].isin(runs.loc[runs["cell"].eq(cell["cell"]), "run_id"])]
    return {key: plain(value) for key, value in same.iloc[0].items()} if len(same) else None


def memory_bound_class(profile: Mapping[str, Any], roofline: pd.DataFrame) -> dict[str, str] | None:
    """The normalisation-and-elementwise finding: its share of the kernel time and its kernels'
    DRAM throughput (the time-weighted middle half), None where it is not one."""
    coverage = profile.get("kernel_coverage")
    shares = _class_shares(profile)
    if not shares or roofline.empty:
        return None
    share = shares[MEMORY_CLASS]
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
    """Per model with a one-GPU headline cell on a GPU: ``model``, ``config`` (the cell's),
    ``findings`` (each ``what``, ``evidence``, ``lever``: one "unknown" finding, saying what each
    rule lacked, where none holds), ``profiled`` (the profile's run id, None without one)."""
    profiling = read_table(Path(tables_dir), "profiling")
    roofline = read_table(Path(tables_dir), "profiling_roofline")
    out = []
    for item in headline(runs, cells, scaling, inventory):
        cell = item["one"]
        if cell is None or (cell.get("device") or {}).get("cpu"):
            continue
        clocks = with_datasheet_limits(cell.get("clocks"), cell.get("device_name"))
        profile = _profile_of(profiling, runs, cell)
        own_roof = roofline[roofline["run_id"].eq(profile["run_id"])] if profile and "run_id" in roofline.columns else pd.DataFrame()
        power, matmul = power_bound(clocks), matmul_bound(cell, profile)
        findings = [power if not matmul else None]
        if matmul:
            findings.append(
                {
                    "what": "power-bound matmuls" if power else "matmul-bound",
                    "evidence": f"{power['evidence']}; {matmul}" if power else matmul,
                    "lever": "; ".join(MATMUL_LEVERS) + (f"; fewer joules per step besides: {FUSION_LEVER}" if power else ""),
                }
            )
        if profile:
            findings.append(memory_bound_class(profile, own_roof))
            findings.append(stem_on_cuda_cores(own_roof, cell.get("unit") == "img/s"))
            verdict = profile.get("classification")
            if verdict in CLASS_LEVERS:
                findings.append({"what": verdict, "evidence": str(profile.get("evidence") or ""), "lever": CLASS_LEVERS[verdict]})
        findings = [finding for finding in findings if finding] or [_unknown(cell, clocks, profile)]
        out.append({"model": item["model"], "config": cell.get("config"), "findings": findings, "profiled": (profile or {}).get("run_id")})
    return out


def _unknown(cell: Mapping[str, Any], clocks: Mapping[str, Any] | None, profile: Mapping[str, Any] | None) -> dict[str, str]:
    """The finding of a cell none of the rules fits: what each rule lacked or where its evidence fell short."""
    held = _mfu_held(cell)
    parts = [
        f"profile of {profile['run_id']}: no kernel class past its threshold" if profile else "no profile",
        _not_power_bound(clocks),
        f"MFU {100 * held:.1f} % at the clock held: under {100 * MATMUL_MFU_MIN:.0f} %, not shown matmul-bound" if held is not None else "no MFU",
    ]
    return {"what": UNKNOWN, "evidence": "; ".join(parts), "lever": MISSING if profile else PROFILE_LEVER}
