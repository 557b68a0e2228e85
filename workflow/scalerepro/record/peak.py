"""The peak an MFU is a fraction of, as structured facts (``model.Peak``), and its words.

One function gives the peak of a device at a precision (``peak_for``): the rank calls it for the
record it writes, and the upgrade chain for a record that stated its peak as a number and prose
(schemas 1 to 4), so that every record's peak is the same facts: the rate, the precision and
units it is quoted for, the clock it is quoted at, the part, a MIG instance's share.
"""

from __future__ import annotations

from scalerepro.common import gpu_peaks
from scalerepro.record.base import PeakPrecision, Precision, Units
from scalerepro.record.measured import Peak

# What each --precision runs its matmuls and convolutions on, and so which peak its MFU is against:
# fp32 with TF32 off runs on the CUDA cores, the others on the tensor cores.
ARITHMETIC: dict[str, tuple[PeakPrecision, Units]] = {
    "fp32": ("fp32", "cuda_core"),
    "tf32": ("tf32", "tensor"),
    "fp16": ("fp16", "tensor"),
    "bf16": ("bf16", "tensor"),
}
PEAK_PRECISION_WORDS = {"fp32": "fp32, TF32 off", "tf32": "tf32 (TF32 on)"}


def peak_for(gpu_name: str | None, precision: Precision, override_tflops: float | None = None) -> tuple[Peak | None, str | None]:
    """(the dense peak of one ``gpu_name`` device at ``precision``, None), or (None, why there is
    none). ``override_tflops`` (TFLOP/s per device, the trainer's --peak-tflops) wins over the table."""
    if precision not in ARITHMETIC:
        raise ValueError(f"precision must be one of {tuple(ARITHMETIC)}, got {precision!r}")
    arithmetic, units = ARITHMETIC[precision]
    if override_tflops is not None:
        if not override_tflops > 0:
            raise ValueError(f"override_tflops must be positive, got {override_tflops!r}")
        return Peak(
            flops_per_s=override_tflops * gpu_peaks.TFLOPS,
            precision=arithmetic,
            units=units,
            clock_mhz=None,
            part=None,
            mig_profile=None,
            mig_slices=None,
            form_factor_assumed=False,
            basis="user override",
            source=f"user override ({override_tflops} TFLOP/s per GPU)",
        ), None
    if not gpu_name:
        return None, "no GPU: peak throughput is tabulated for NVIDIA GPUs only"
    key = gpu_peaks.peaks_key(gpu_name)
    if key is None:
        known = ", ".join(sorted({p.model for p in gpu_peaks.PEAKS.values()}))
        return None, f"no peak-throughput entry for {gpu_name!r} (known: {known}); pass a user override"
    entry = gpu_peaks.PEAKS[key]
    rate = entry.tflops(arithmetic) if units == "tensor" else entry.cuda_core_tflops(arithmetic)
    if rate is None:
        return None, f"the peak table has no dense {arithmetic} rate of the {entry.model}: pass a user override"
    source = f"{entry.model}, dense {arithmetic}: {entry.source}"
    assumed = gpu_peaks.names_no_form_factor(gpu_name)
    if assumed:
        source += f"; {gpu_peaks.BARE_NAME_RULE}"
    mig = gpu_peaks.mig_slices(gpu_name)
    slices, profile = mig if mig is not None else (None, None)
    if slices is not None and not 1 <= slices <= gpu_peaks.MIG_COMPUTE_SLICES:
        return None, f"MIG profile {profile} of {gpu_name!r} claims {slices} of {gpu_peaks.MIG_COMPUTE_SLICES} compute slices: pass a user override"
    flops = rate * gpu_peaks.TFLOPS
    if slices is not None:
        # MIG instance peak = GPU peak x compute slices / 7 (the clock is the whole GPU's)
        flops *= slices / gpu_peaks.MIG_COMPUTE_SLICES
        source = f"MIG {profile}: {slices}/{gpu_peaks.MIG_COMPUTE_SLICES} of the GPU's compute slices ({gpu_peaks.MIG_USER_GUIDE}) x {source}"
    return Peak(
        flops_per_s=flops,
        precision=arithmetic,
        units=units,
        clock_mhz=entry.clock_mhz(units),
        part=entry.model,
        mig_profile=profile,
        mig_slices=slices,
        form_factor_assumed=assumed,
        basis="table",
        source=source,
    ), None


def tflops_text(flops: float) -> str:
    tflops = flops / gpu_peaks.TFLOPS
    return f"{tflops:,.0f}" if tflops >= 100 else f"{tflops:.1f}"


def rate_words(peak: Peak) -> str:
    """ "989 TFLOP/s dense bf16"; a user override: "500 TFLOP/s per GPU"."""
    if peak.basis == "user override":
        return f"{tflops_text(peak.flops_per_s)} TFLOP/s per GPU"
    return f"{tflops_text(peak.flops_per_s)} TFLOP/s dense {PEAK_PRECISION_WORDS.get(peak.precision, peak.precision)}"


def part_words(peak: Peak) -> str | None:
    """ "H100 SXM5", with a MIG instance's share and an assumed form factor said."""
    if peak.basis == "user override":
        return "user override"
    part = peak.part
    if part is None:
        return None
    if peak.mig_profile is not None:
        part += f", MIG {peak.mig_profile}: {peak.mig_slices}/{gpu_peaks.MIG_COMPUTE_SLICES} of the GPU"
    if peak.form_factor_assumed:
        part += ", form factor assumed"
    return part
