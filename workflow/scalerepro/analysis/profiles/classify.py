"""What bounds a profiled step: compute, communication, input or launch latency, from the
step's breakdown and configurable thresholds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalerepro.analysis.profiles.intervals import WHOLE_CAPTURE

# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------

DEFAULT_THRESHOLDS = {"exposed_comm_min": 0.20, "data_wait_min": 0.10, "idle_min": 0.25}
_CANDIDATES = (
    ("communication-bound", "exposed_comm_fraction", "exposed_comm_min", "exposed communication"),
    ("input-bound", "data_wait_fraction", "data_wait_min", "data wait"),
    ("launch/latency-bound", "idle_fraction", "idle_min", "idle"),
)


def classify(figures: Mapping[str, Any], thresholds: Mapping[str, float]) -> dict[str, Any]:
    """The run's bottleneck: the candidate whose fraction / threshold is largest and at least 1,
    else compute-bound; with the evidence (every fraction against its threshold)."""
    scores, evidence = {}, []
    for name, column, key, what in _CANDIDATES:
        value, limit = figures.get(column), thresholds[key]
        if value is None:
            evidence.append(f"{what} not measured")
            continue
        scores[name] = float(value / limit)
        evidence.append(f"{what} {value:.1%} {'≥' if value >= limit else '<'} {limit:.0%}")
    compute = figures.get("compute_fraction")
    evidence.append(f"compute {compute:.1%}" if compute is not None else "compute not measured")
    if figures.get("overlap_fraction") is not None:
        evidence.append(f"overlap {figures['overlap_fraction']:.1%} of communication")
    if figures.get("median_call_us") is not None:
        evidence.append(f"median kernel/op {figures['median_call_us']:.1f} µs")
    over = {name: score for name, score in scores.items() if score >= 1}
    verdict = max(over, key=over.__getitem__) if over else "compute-bound"
    provisional = bool(figures.get("provisional"))
    if provisional:  # the fractions are of a window that is not the trainer's steps
        evidence.insert(0, f"provisional: window is the {figures.get('window') or WHOLE_CAPTURE}")
    return {"class": verdict, "provisional": provisional, "evidence": "; ".join(evidence), "scores": scores, "thresholds": dict(thresholds)}
