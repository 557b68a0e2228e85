"""What share of its GPU's peak a published figure implies, and the figures that imply more than
the GPU has. A reference is held to its GPU's dense peak through its model's training FLOPs as a
record is (its MFU):

    share = FLOP/s a GPU must run (scalerepro.common.model_flops) / the GPU's dense peak at the
            reference's precision (scalerepro.common.gpu_peaks)

The references loader (``scalerepro.common.references``) refuses a file with a reference above
MAX_SHARE_OF_PEAK, so no table, comparison or prediction ever sets one beside a run. Where the
figure is unsure the bound is the generous one, so that only an impossible figure is refused: a
language model's FLOPs are a floor, "fp32" may have run TF32 matmuls (frameworks turn them on),
a precision not stated is held to the GPU's fastest rate, and a GPU name without a form factor is
the SXM part (``gpu_peaks.BARE_NAME_RULE``). A reference of a model or GPU neither table knows
cannot be held to a peak and is not refused here (every reference of config/references.yaml is
held: tests/test_references_schema.py).

Standard library only, as all of common/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerepro.common import gpu_peaks
from scalerepro.common.model_flops import flops_per_gpu_second

# No GPU trains faster than its dense peak: a figure that needs more is a typo or another metric.
MAX_SHARE_OF_PEAK = 1.0
# The rates a stated precision may have run at (the fastest of them is the bound).
RATES_OF = {
    "fp32": ("fp32", "tf32"),
    "tf32": ("tf32",),
    "fp16": ("fp16",),
    "bf16": ("bf16",),
    "fp8": ("fp8", "fp16"),
    "mixed": ("fp16", "bf16"),
    None: ("fp32", "tf32", "fp16", "bf16", "fp8"),
}


@dataclass(frozen=True)
class ImpliedShare:
    share: float  # of the GPU's dense peak
    flops_per_gpu_s: float
    part: str  # the GPU part whose peak it is against ("H100 SXM5")
    rate: str  # the precision of that peak ("fp16")
    peak_tflops: float


def implied_share(reference: Mapping[str, Any]) -> ImpliedShare | None:
    """The share of its GPU's peak a reference (an entry of references.yaml, anchors merged)
    implies; None where its model's FLOPs or its GPU's peak are not known."""
    conditions = reference.get("conditions") or {}
    flops = flops_per_gpu_second(
        str(reference.get("model")), str(reference.get("metric")), float(reference["value"]), int(reference["gpus"]), conditions.get("seq_len")
    )
    key = gpu_peaks.peaks_key(conditions.get("gpu"))
    if flops is None or key is None:
        return None
    peaks = gpu_peaks.PEAKS[key]
    rates = [(tflops, rate) for rate in RATES_OF.get(conditions.get("precision"), RATES_OF[None]) if (tflops := peaks.tflops(rate)) is not None]
    tflops, rate = max(rates)
    return ImpliedShare(flops / (tflops * gpu_peaks.TFLOPS), flops, peaks.model, rate, tflops)


def _source(source: Any) -> str:
    """A reference's source in a few words: repository@commit path, or page (table)."""
    if isinstance(source, Mapping):
        if "repository" in source:
            return f"{source['repository']}@{str(source['commit'])[:12]} {source['path']}"
        return f"{source.get('page')} ({source.get('table')})"
    return str(source)


def beyond_peak(references: Sequence[Mapping[str, Any]]) -> str | None:
    """The first reference that implies more than MAX_SHARE_OF_PEAK of its GPU's peak, as the one
    line that names it, its figure, its source and the share; None where every one is within."""
    for position, reference in enumerate(references):
        implied = implied_share(reference)
        if implied is None or implied.share <= MAX_SHARE_OF_PEAK:
            continue
        gpus = int(reference["gpus"])
        return (
            f"references[{position}] ({reference['id']}): value {float(reference['value']):g} {reference['metric']} "
            f"at {gpus} GPU{'s' if gpus != 1 else ''} ({_source(reference.get('source'))}) needs "
            f"{implied.flops_per_gpu_s / gpu_peaks.TFLOPS:,.0f} TFLOP/s a GPU at {reference['model']}'s training FLOPs, "
            f"{implied.share * 100:.0f} % of the {implied.part}'s dense {implied.rate} peak of {implied.peak_tflops:,.0f} TFLOP/s: "
            "no GPU runs above its peak, so the figure, its GPU count, precision or GPU is wrong"
        )
    return None
