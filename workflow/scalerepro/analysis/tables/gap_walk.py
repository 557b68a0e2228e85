"""The gap walk: from a measured cell's like-for-like published figure to the cell, a lever at a time
(``published_comparison`` pairs them).

The gap walk goes from the like-for-like reference's conditions to the measured cell's, one lever
(WALK_LEVERS) at a time. A step is a measured pair of cells that differ in that lever only (every
other field of the matrix's cell equal: the same model, device, GPU and node counts, sequence length,
PyTorch, and every knob of PAIR_ONLY), its ratio the two medians' (with the interval of that ratio
where both cells have 2 repeats or more). Steps chain where the study measured values between the
two ends (compile none -> default -> reduce-overhead). What no step measures is the unexplained rest:

    rest = (measured / published) / product of the measured steps

named with every difference no step covers (levers not measured, framework, software stack) and what
the product assumes: each step was measured with the other levers as its pair had them, so the steps
compose only as far as the levers do not interact. Where the best published figure is another than
the like-for-like one, the walk says where it stops short of it: the conditions the best differs in
that no measured step reaches.

The analysis side: pandas only, no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalerepro.analysis.tables import repeats
from scalerepro.analysis.tables.published_conditions import (
    CONDITION_TABLE,
    LABELS,
    WALK_LEVERS,
    MeasuredCell,
    compare,
    differing,
    measured_words,
    published_words,
    reference_conditions,
    state_of,
    words,
)


@dataclass
class Pairing:
    """A measured cell and the published figure its gap walk starts from (the like-for-like one)."""

    cell: MeasuredCell
    reference: Mapping[str, Any] | None


def _reached(best: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> set[str]:
    """The levers in which the best figure's value is one a measured step of the walk starts or ends at."""
    published = reference_conditions(best)
    return {s["lever"] for s in steps if s.get("status") == "measured" and words(s["lever"], published.get(s["lever"])) in (s["from"], s["to"])}


def stops_short(
    best: dict[str, Any] | None, like: dict[str, Any] | None, steps: Sequence[Mapping[str, Any]], best_ref: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Where the walk from the like-for-like figure stops short of the best published one: the
    conditions the best differs in from the measured cell that no measured step reaches."""
    if best is None or like is None or best["reference"] == like["reference"] or best_ref is None:
        return None
    reached = _reached(best_ref, steps)
    differ = [c for c in best["conditions"] if c["state"] == "differs"]
    return {
        "reference": best["reference"],
        "ratio": best["ratio"],
        "like": like["reference"],
        "unreached": [c["says"] for c in differ if c["condition"] not in reached],
        "reached": [c["label"] for c in differ if c["condition"] in reached],
    }


# --------------------------------------------------------------------------------------------
# The gap walk
# --------------------------------------------------------------------------------------------


def _one_lever_apart(a: MeasuredCell, b: MeasuredCell, lever: str) -> bool:
    """Same model and device, every field of the two cells equal but ``lever``, which differs."""
    return (a.model, a.device) == (b.model, b.device) and differing(a.conditions, b.conditions) == [lever]


def _closeness(pair: tuple[MeasuredCell, MeasuredCell], target: MeasuredCell) -> tuple:
    """Pairs whose other levers are the target cell's first, then those with more repeats."""
    a, b = pair
    return (len(differing(a.conditions, target.conditions)), -(len(a.runs) + len(b.runs)), a.key_text(), b.key_text())


def walk(pairing: Pairing, cells: Sequence[MeasuredCell]) -> list[dict[str, Any]]:
    """The gap walk of a pairing (module docstring): its steps in WALK_LEVERS order, measured or not,
    then the unexplained rest. Each a dict: lever, label, from, to, status ("measured", "not
    measured", "rest"), ratio with its interval and the two cells' medians, n and runs."""
    ref, target = pairing.reference, pairing.cell
    if ref is None:
        return []
    metric = str(ref["metric"])
    published = reference_conditions(ref)
    steps: list[dict[str, Any]] = []
    for lever in WALK_LEVERS:
        state = compare(lever, published.get(lever), target.conditions.get(lever))
        if state is None or state[0] != "differs":
            continue
        # values compared in lower case (Muon, muon), printed as one of the sides spelled them
        spelled = {str(v).lower(): v for v in (published[lever], target.conditions[lever])}
        start, end = str(published[lever]).lower(), str(target.conditions[lever]).lower()
        pairs: dict[tuple[str, str], list[tuple[MeasuredCell, MeasuredCell]]] = {}
        for a in cells:
            for b in cells:
                if a is not b and (a.model, a.device, a.gpus) == (target.model, target.device, target.gpus) and _one_lever_apart(a, b, lever):
                    spelled.setdefault(str(a.conditions[lever]).lower(), a.conditions[lever])
                    pairs.setdefault((str(a.conditions[lever]).lower(), str(b.conditions[lever]).lower()), []).append((a, b))
        # breadth first from our value over the measured pairs, toward the reference's
        parent: dict[str, str | None] = {end: None}
        queue = deque([end])
        while queue:
            here = queue.popleft()
            for x, y in pairs:
                if y == here and x not in parent:
                    parent[x] = here
                    queue.append(x)
        # where the reference's value is not reached: the value farthest from ours that is
        reached = start if start in parent else max(parent, key=lambda v: _depth(parent, v))
        if reached != start:
            steps.append(_unmeasured(lever, spelled[start], spelled[reached]))
        value = reached
        while (nxt := parent.get(value)) is not None:
            a, b = min(pairs[(value, nxt)], key=lambda p: _closeness(p, target))
            steps.append(_measured(lever, spelled[value], spelled[nxt], a, b, metric))
            value = nxt
    used = {id(target)} | {id(c) for step in steps for c in step.pop("cells", ())}
    others = [c for c in cells if id(c) not in used and (c.model, c.device, c.gpus) == (target.model, target.device, target.gpus)]
    unused = [_unused(c, target, metric) for c in others]
    # a cell the records say nothing different of (another study's, or knobs not recorded) is no lever at all
    return steps + [{**_rest(pairing, steps, published), "unused": [u for u in unused if u["levers"]]}]


def _unused(cell: MeasuredCell, target: MeasuredCell, metric: str) -> dict[str, Any]:
    """A cell of the model that no step uses: more than one lever from every other cell."""
    spread = cell.describe("per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s")
    apart = [f"{LABELS[k]} {words(k, cell.conditions.get(k))}" for k in differing(cell.conditions, target.conditions)]
    return {"runs": cell.run_ids(), "median": spread["median"], "n": spread["n"], "apart": "; ".join(apart), "levers": len(apart)}


def _depth(parent: Mapping[str, str | None], value: str) -> int:
    depth = 0
    while (up := parent.get(value)) is not None:
        value, depth = up, depth + 1
    return depth


def _unmeasured(lever: str, start: Any, end: Any) -> dict[str, Any]:
    return {"lever": lever, "label": LABELS[lever], "from": words(lever, start), "to": words(lever, end), "status": "not measured"}


def _measured(lever: str, start: Any, end: Any, a: MeasuredCell, b: MeasuredCell, metric: str) -> dict[str, Any]:
    metric = "per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s"
    low, high = repeats.ratio_interval(
        [(a.values(metric), ("nearest", a.key_text(), metric)), (b.values(metric), ("nearest", b.key_text(), metric))],
        lambda x, y: y / x,
    )
    da, db = a.describe(metric), b.describe(metric)
    commits = sorted(a.commits() | b.commits())
    return {
        "lever": lever,
        "label": LABELS[lever],
        "from": words(lever, start),
        "to": words(lever, end),
        "status": "measured",
        "ratio": db["median"] / da["median"],
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "from_median": da["median"],
        "from_n": da["n"],
        "from_runs": a.run_ids(),
        "to_median": db["median"],
        "to_n": db["n"],
        "to_runs": b.run_ids(),
        "held": "; ".join(f"{LABELS[k]} {words(k, v)}" for k, v in a.conditions.items() if k != lever and k in WALK_LEVERS and v is not None),
        "sessions": f"runs of {len(commits)} commits ({', '.join(commits)})" if len(commits) > 1 else "",
        "cells": (a, b),
    }


def _rest(pairing: Pairing, steps: Sequence[Mapping[str, Any]], published: Mapping[str, Any]) -> dict[str, Any]:
    """What the measured steps leave of the gap, and every difference they do not cover."""
    total = pairing_ratio(pairing)
    measured = [s for s in steps if s["status"] == "measured"]
    product = float(np.prod([s["ratio"] for s in measured])) if measured else 1.0
    unexplained = [f"{s['label']} {s['from']} \u2192 {s['to']} (not measured)" for s in steps if s["status"] == "not measured"]
    unstated: dict[str, list[str]] = {"not stated": [], "not recorded": []}
    ours = pairing.cell.compared()
    for key, label, lever in CONDITION_TABLE:
        state = state_of(key, published, ours)
        if state and state[0] == "differs" and not lever:
            if key == "software_stack" and (compare("framework", published.get("framework"), "PyTorch") or ("",))[0] == "differs":
                continue  # another framework says it
            unexplained.append(f"{label} {published_words(key, published)} \u2192 {measured_words(key, pairing.cell)}")
        elif state and state[0] in unstated:
            unstated[state[0]].append(label)
    if unstated["not stated"]:
        unexplained.append(f"whatever differs in what the reference does not state ({', '.join(unstated['not stated'])})")
    if unstated["not recorded"]:
        unexplained.append(f"whatever differs in what the runs' records do not state ({', '.join(unstated['not recorded'])})")
    if len(measured) > 1 or (measured and unexplained):
        unexplained.append("how the levers interact (each step was measured with the other levers as its pair had them)")
    return {
        "lever": "",
        "label": "unexplained rest",
        "status": "rest",
        "ratio": total / product if total == total else float("nan"),
        "explained": product,
        "total": total,
        "what": unexplained,
    }


def pairing_ratio(pairing: Pairing) -> float:
    """Measured median / published, in the reference's metric."""
    if pairing.reference is None:
        return float("nan")
    metric = "samples_per_s" if pairing.reference["metric"] == "samples_per_s" else "per_gpu"
    return pairing.cell.describe(metric)["median"] / float(pairing.reference["value"])


# --------------------------------------------------------------------------------------------
