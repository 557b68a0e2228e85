"""The roofline of each profiled kernel: its FLOPs and DRAM bytes from ncu's counters against the
peaks of the run's GPU (the GPU peak table, ``scalerepro.common.gpu_peaks``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from scalerepro.analysis.profiles.intervals import ProfileError
from scalerepro.analysis.profiles.kernels import MATRIX_KINDS, kernel_kind, name_precision
from scalerepro.analysis.profiles.ncu import CUDA_CORE_PRECISIONS
from scalerepro.common.gpu_peaks import PEAKS, TBPS, TFLOPS, peaks_key

# The tensor-core precisions of a training run; fp32 (TF32 off) runs no tensor-core math: no tensor roof.
TENSOR_PRECISIONS = ("tf32", "bf16", "fp16", "fp8")
HALF_PRECISIONS = ("fp16", "bf16")  # what the SASS half-precision counters (HADD, HMUL, HFMA) count, both
# Hopper's tensor-pipe counter also counts the half-precision FMAs a kernel issues to that pipe
# (HFMA2.MMA), which the SASS fp16 counters hold as FP work. A matrix kernel with no wgmma
# instruction, half-precision SASS FLOPs and its tensor pipe busy under this share of its time did
# its math on the CUDA cores: in the kept H100 captures every such kernel (cuDNN's 3-channel stem
# convolution at 0.41 %, two wgrad variants at 0.05 %) is busy exactly in proportion to its
# HFMA2 FLOPs, as Inductor's elementwise kernels are (0.02-1.3 %), while a kernel doing mma.sync
# (CUTLASS's wmma GEMMs at 0.7-1.9 %, an sm80 wgrad at 14 %) has no half-precision SASS FLOPs.
HFMA2_ONLY_BUSY_MAX = 0.02


def gpu_peaks(key: str, precision: str | None = None) -> dict[str, Any]:
    """Peaks of the GPU peak table's entry ``key`` (``scalerepro.common.gpu_peaks``), in base
    units: fp32 FLOP/s (CUDA cores, the roof of the SASS FP counters), the dense tensor-core FLOP/s
    of ``precision`` (None for fp32, an unknown precision or one the GPU lacks, with
    ``tensor_reason`` saying which), DRAM bytes/s."""
    entry = PEAKS.get(key)
    if entry is None:
        raise ProfileError(f"the GPU peak table has no {key!r} (known: {', '.join(PEAKS)}): choose one for profiling.gpu_peaks")
    if entry.hbm_tbps is None:
        raise ProfileError(f"the GPU peak table gives no memory bandwidth for {entry.name}: no roofline for it")
    if precision is None:
        tensor, why = None, "the run's precision is unknown (pass --precision): no tensor-core roof to count against"
    elif precision not in TENSOR_PRECISIONS:
        tensor, why = None, f"a {precision} run uses no tensor-core precision"
    elif (dense := entry.tflops(precision)) is None:
        tensor, why = None, f"{entry.name} has no {precision} tensor cores"
    else:
        tensor, why = dense * TFLOPS, None
    return {
        "key": key,
        "name": entry.name,
        "precision": precision,
        "fp32_flops": entry.fp32 * TFLOPS,
        "tensor_flops": tensor,
        "tensor_reason": why,
        "dram_bytes_per_s": entry.hbm_tbps * TBPS,
    }


def resolve_peaks(device_names: Sequence[str], configured: str | None, precision: str | None) -> tuple[dict[str, Any] | None, str]:
    """The peaks of the GPU the capture ran on (its device name looked up in the GPU peak table)
    and of the run's precision, and where they come from. The configured key (profiling.gpu_peaks)
    applies only when the capture names no GPU; a named GPU that the table lacks gets no peaks (its
    fractions would be of another GPU's roofs)."""
    names = sorted(set(device_names))
    found = sorted({key for key in map(peaks_key, names) if key})
    if len(found) > 1:
        return None, f"the capture ran on several GPU models ({', '.join(names)}): no single roof"
    key, basis = (found[0], f"from the capture's device name {', '.join(names)}") if found else (configured, "as configured: the capture names no GPU")
    if names and not found:
        return None, f"no entry of the GPU peak table (scalerepro.common.gpu_peaks) names {', '.join(names)}: add it to get a roofline"
    if key is None:
        return None, "the capture names no GPU and no gpu_peaks entry is configured"
    try:
        peaks = gpu_peaks(key, precision)
    except ProfileError as error:
        return None, str(error)
    return peaks, f"{peaks['name']} (gpu_peaks.{key}, {basis}), {precision or 'precision unknown'}"


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


def _tensor_roof(peaks: Mapping[str, Any], precision: str | None) -> tuple[float | None, str | None]:
    """The dense tensor roof of ``precision`` on the peaks' GPU (the run's precision's when the
    kernel's name states none), or None and why there is none."""
    if precision is None or precision == peaks.get("precision"):
        return peaks.get("tensor_flops"), peaks.get("tensor_reason")
    entry = PEAKS.get(peaks.get("key") or "")
    if entry is None:
        return None, f"no GPU peak table entry gives a {precision} tensor roof for {peaks.get('name')}"
    rate = entry.tflops(precision) if precision in TENSOR_PRECISIONS else None
    return (rate * TFLOPS, None) if rate else (None, f"{entry.name} has no {precision} tensor cores")


def _cuda_core_roof(peaks: Mapping[str, Any], precision: str, half: str | None) -> tuple[float | None, str]:
    """The CUDA-core roof of the precision most of a kernel's SASS FLOPs ran in: (FLOP/s, its
    name), or (None, why there is none). ``half``: which half precision (fp16, bf16) the
    half-precision counters hold for this kernel (its name's, else the run's); fp16 where neither says."""
    if precision == "fp32":
        return peaks["fp32_flops"], f"{peaks.get('name')} FP32 CUDA cores"
    entry = PEAKS.get(peaks.get("key") or "")
    if precision == "fp16":
        precision = half if half in HALF_PRECISIONS else "fp16"
    rate = entry.cuda_core_tflops(precision) if entry is not None else None
    if rate:
        return rate * TFLOPS, f"{peaks.get('name')} {precision.upper()} CUDA cores"
    what = "FP64" if precision == "fp64" else f"{precision} on the CUDA cores (non-tensor)"
    return None, f"none: FLOPs mostly {what}, a rate the GPU peak table does not hold for {peaks.get('name')}"


def _tensor_work(
    kind: str,
    matrix: bool,
    group: pd.DataFrame,
    seconds: float | None,
    precision: Any,
    tensor_peak: float | None,
    tensor_reason: str | None,
    missing: list[str],
) -> tuple[float | None, str]:
    """A kernel's tensor-core FLOPs (None: not counted) and what they are (``roofline``'s docstring);
    appends to ``missing`` what the capture lacks for them."""
    has_tensor = len(group) > 0 and group["tensor_pipe_pct"].notna().any()
    tensor_busy_s = float((group["tensor_pipe_pct"].fillna(0) / 100 * group["duration"]).sum()) if has_tensor else None
    if not matrix:
        # Hopper's tensor-pipe counter also counts the half-precision FMAs an elementwise
        # kernel issues to that pipe (HFMA2.MMA); the SASS counters hold them as FP work
        share = tensor_busy_s / seconds if tensor_busy_s and seconds else 0.0
        shown = f"{share:.0%}" if share >= 0.005 else "under 0.5 %"
        busy = f"; its tensor pipe was busy {shown} of the time with other instructions (HFMA2.MMA)" if share else ""
        return 0.0, f"none: {kind} kernels do no matrix work{busy}"
    if tensor_busy_s is None:
        return None, "not counted: the capture has no tensor-pipe metric for this kernel"
    if tensor_busy_s == 0:
        return 0.0, "none: the tensor pipe was idle"
    assert seconds, "a tensor pipe busy for some time was timed"
    busy_share = tensor_busy_s / seconds
    if _hfma2_only(group, tensor_busy_s, seconds):
        # its tensor pipe ran only the half-precision FMAs the SASS counters already hold
        return 0.0, (
            f"none: a CUDA-core kernel (no wgmma instruction; its tensor pipe busy {_busy_text(busy_share)} of "
            "the time with the half-precision FMAs its SASS counters hold, HFMA2.MMA)"
        )
    if tensor_peak is None:
        return None, f"not counted: tensor pipe busy {busy_share:.0%} of the time, but {tensor_reason}"
    if group["wgmma_instructions"].notna().any() and group["wgmma_instructions"].fillna(0).sum() == 0:
        # Hopper's tensor-pipe counter also counts mma.sync (HMMA): it does not run at the
        # wgmma rate the dense peak is quoted for, so utilisation x that peak would overstate it
        missing.append("tensor-core FLOPs")
        return None, (
            f"not counted: tensor pipe busy {busy_share:.0%} of the time with no wgmma instruction "
            "(mma.sync or HFMA2.MMA work, which the dense wgmma peak does not bound)"
        )
    # tensor FLOPs = tensor-pipe busy share x duration x dense tensor peak of the precision
    return tensor_busy_s * tensor_peak, f"estimate: tensor-pipe utilisation x {precision} tensor peak"


def _kernel_roof(
    kernel: str, group: pd.DataFrame, peaks: Mapping[str, Any], precision: Any, tensor: float | None, cuda_core: float | None, tensor_peak: float | None
) -> tuple[float | None, str]:
    """The roof a kernel is set under, and its name, or None and why (``roofline``'s docstring)."""
    # the roof of the pipe and precision the kernel's work ran on (docstring)
    peak: float | None
    if tensor is not None and tensor > 0:
        peak, peak_name = tensor_peak, f"{peaks.get('name')} {precision} dense tensor cores"
    elif tensor is None:
        peak, peak_name = None, "none: tensor-core work not counted (see Tensor-core work)"
    elif cuda_core is None:
        peak, peak_name = None, "none: no SASS FP counters in the capture"
    elif cuda_core == 0:
        peak, peak_name = None, "none: no floating-point work (integer, copy or data movement)"
    else:
        by_precision = {p: float(group[f"flops_{p}"].fillna(0).sum()) if f"flops_{p}" in group else 0.0 for p in CUDA_CORE_PRECISIONS}
        dominant = max(by_precision, key=lambda p: by_precision[p]) if any(by_precision.values()) else "fp32"
        peak, peak_name = _cuda_core_roof(peaks, dominant, name_precision(kernel) or peaks.get("precision"))
    return peak, peak_name


def roofline(launches: pd.DataFrame, peaks: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per kernel name, over its launches that have a duration: achieved FLOP/s and DRAM B/s,
    their fractions of the peaks, arithmetic intensity, the attainable FLOP/s at that intensity
    and which roof bounds it. ``missing`` says what a row lacks (no duration: no rates at all).

    FLOPs = CUDA-core FLOPs (SASS FP counters, FMA = 2) + tensor-core FLOPs, the latter estimated
    as tensor-pipe utilisation x duration x the dense tensor peak of the kernel's precision on
    this GPU (the precision its name states, else the run's; the SASS counters do not see
    tensor-core work). Each kernel is set under the roof of the pipe and precision its work ran
    on: a kernel with tensor-core work under that tensor roof; a kernel of a kind that does no
    matrix work (``kernels.MATRIX_KINDS``: elementwise, reduction ...) never under a tensor roof,
    whatever the tensor-pipe counter shows; any other under the CUDA-core roof of the precision
    most of its SASS FLOPs ran in (fp32, fp64, or the half precision its name or the run states),
    a matrix kernel whose tensor pipe ran only the HFMA2.MMA its SASS counters hold
    (``HFMA2_ONLY_BUSY_MAX``: cuDNN's 3-channel stem convolution) included. A kernel with no roof is not placed (no intensity, no
    fraction of a peak) and ``peak`` says why: a kernel with no floating-point work (integer,
    copy), one whose tensor-core work cannot be counted (``tensor_work`` says why: no tensor-pipe
    metric, no tensor peak for its precision, or Hopper's mma.sync, which the wgmma peak does not
    bound), or one whose precision has no rate in the GPU peak table."""
    out = []
    for kernel, every in launches.groupby("kernel", sort=False):
        kind = kernel_kind(kernel)
        matrix = kind in MATRIX_KINDS
        precision = name_precision(kernel) or peaks.get("precision")
        tensor_peak, tensor_reason = _tensor_roof(peaks, precision)
        group = every[every["duration"].notna()]
        missing = []
        if len(group) < len(every):
            missing.append(f"duration ({len(every) - len(group)} of {len(every)} launches)")
        seconds = group["duration"].sum() if len(group) else None
        has_counters = len(group) > 0 and group["flops"].notna().all()
        cuda_core = float(group["flops"].sum()) if has_counters else None
        tensor, tensor_work = _tensor_work(kind, matrix, group, seconds, precision, tensor_peak, tensor_reason, missing)
        if cuda_core is None and tensor is None:
            flops, source = None, "not measured: no FP counters, and tensor-core work " + tensor_work
            if len(group):
                missing.append("FLOP count")
        else:
            flops = (cuda_core or 0.0) + (tensor or 0.0)
            parts = ["SASS FP counters (FMA = 2)" if cuda_core is not None else "no SASS FP counters"]
            # the kind of tensor-core figure, not its detail (``tensor_work`` has that): the
            # roofline figure groups its points by this
            parts.append(f"tensor cores: {tensor_work.split(':')[0]}")
            source = "; ".join(parts)
        peak, peak_name = _kernel_roof(kernel, group, peaks, precision, tensor, cuda_core, tensor_peak)
        dram_bytes = group["dram_bytes"].sum() if len(group) and group["dram_bytes"].notna().all() else None
        if len(group) and dram_bytes is None:
            missing.append("DRAM bytes")
        placed = peak is not None and flops is not None and bool(seconds)
        achieved = flops / seconds if placed and flops is not None and seconds else None
        bandwidth = dram_bytes / seconds if seconds and dram_bytes is not None else None
        intensity = flops / dram_bytes if placed and flops is not None and dram_bytes else None
        ridge = peak / peaks["dram_bytes_per_s"] if peak is not None else None  # FLOP/byte where the two roofs meet
        attainable = min(peak, intensity * peaks["dram_bytes_per_s"]) if intensity is not None and peak is not None else None
        sources = sorted(set(group["dram_bytes_source"].dropna())) if "dram_bytes_source" in group else []
        out.append(
            {
                "kernel": kernel,
                "kind": kind,
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
                "roof": peak_name.removeprefix(f"{peaks.get('name')} "),  # the roof without the GPU's name
                "flops_fraction": achieved / peak if achieved is not None and peak else None,
                "dram_bytes": dram_bytes,
                "dram_bytes_source": ", ".join(sources) or None,
                "dram_bytes_per_s": bandwidth,
                "dram_fraction": bandwidth / peaks["dram_bytes_per_s"] if bandwidth is not None else None,
                "arithmetic_intensity": intensity,
                "ridge_intensity": ridge,
                "attainable_flops_per_s": attainable,
                "bound": None if intensity is None or ridge is None else ("memory" if intensity < ridge else "compute"),
                "sm_throughput_pct": every["sm_throughput_pct"].mean(),
                "memory_throughput_pct": every["memory_throughput_pct"].mean(),
                "achieved_occupancy_pct": every["achieved_occupancy_pct"].mean(),
                "theoretical_occupancy_pct": every["theoretical_occupancy_pct"].mean(),
                "missing": "; ".join(missing) or None,
            }
        )
    # longest first, ties by name: the order (and so the numbers) of the kernels by time (kernels.ncu_kernel_times)
    return sorted(out, key=lambda row: (-(row["duration_s"] or 0.0), row["kernel"]))


def _busy_text(share: float) -> str:
    return f"{share:.1%}" if share >= 0.0005 else "under 0.05 %"


def _hfma2_only(group: pd.DataFrame, tensor_busy_s: float, seconds: float | None) -> bool:
    """Whether a matrix kernel's busy tensor pipe ran only HFMA2.MMA (``HFMA2_ONLY_BUSY_MAX``):
    no wgmma instruction counted, half-precision SASS FLOPs, the pipe busy under that share."""
    if not seconds or "wgmma_instructions" not in group or group["wgmma_instructions"].isna().any():
        return False
    half = float(group["flops_fp16"].fillna(0).sum()) if "flops_fp16" in group else 0.0
    return group["wgmma_instructions"].sum() == 0 and half > 0 and tensor_busy_s / seconds < HFMA2_ONLY_BUSY_MAX
