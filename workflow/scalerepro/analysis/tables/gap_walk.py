"""The gap walk: from a measured cell's like-for-like published figure (else the nearest: one of the
model that differs from it only in levers) to the cell, a lever at a time (``published_comparison``
pairs them).

The gap walk goes from the reference's conditions to the measured cell's, one lever
(WALK_LEVERS) at a time. A step is a measured pair of cells that differ in that lever only (every
other field of the matrix's cell equal: the same model, device, GPU and node counts, sequence length,
PyTorch, and every knob of PAIR_ONLY), its ratio the two medians' (with the interval of that ratio
where both cells have 2 repeats or more). Steps chain where the study measured values between the
two ends (compile none -> default -> reduce-overhead). A step whose effect is within the spread of
the runs it compares (its ratio's interval holds 1, or without one the two cells' own spreads
overlap) is no lever's effect, and says so; a step whose runs span commits, days or cards says that
too. What no step measures, or measures within the spread, is the unexplained rest:

    rest = (measured / published) / product of the measured steps beyond the spread

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
from scalerepro.analysis.values import plain


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
    best: dict[str, Any] | None, start: dict[str, Any] | None, steps: Sequence[Mapping[str, Any]], best_ref: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Where the walk from its first figure (``start``: the like-for-like one, else the nearest) stops
    short of the best published one: the conditions the best differs in from the measured cell that
    no measured step reaches."""
    if best is None or start is None or best["reference"] == start["reference"] or best_ref is None:
        return None
    reached = _reached(best_ref, steps)
    differ = [c for c in best["conditions"] if c["state"] == "differs"]
    return {
        "reference": best["reference"],
        "ratio": best["ratio"],
        "start": start["reference"],
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
    noise = day_to_day(cells, target, walk_metric(metric))
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
            steps.append(_measured(lever, spelled[value], spelled[nxt], a, b, metric, noise))
            value = nxt
    used = {id(target)} | {id(c) for step in steps for c in step.pop("cells", ())}
    others = [c for c in cells if id(c) not in used and (c.model, c.device, c.gpus) == (target.model, target.device, target.gpus)]
    unused = [_unused(c, target, metric) for c in others]
    # a cell the records say nothing different of (another study's, or knobs not recorded) is no lever at all
    return steps + [{**_rest(pairing, steps, published), "unused": [u for u in unused if u["levers"]]}]


def walk_metric(metric: str) -> str:
    """A reference's metric as MeasuredCell.values reads it: a whole job's samples, or tokens per GPU."""
    return "per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s"


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


def _measured(lever: str, start: Any, end: Any, a: MeasuredCell, b: MeasuredCell, metric: str, noise: dict[str, Any] | None) -> dict[str, Any]:
    metric = walk_metric(metric)
    low, high = repeats.ratio_interval(
        [(a.values(metric), ("nearest", a.key_text(), metric)), (b.values(metric), ("nearest", b.key_text(), metric))],
        lambda x, y: y / x,
    )
    da, db = a.describe(metric), b.describe(metric)
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
        "sessions": _sessions(a, b, noise),
        "within_spread": _within_spread(a, b, metric, low, high, noise),
        "cells": (a, b),
    }


def _sittings(cells: Sequence[MeasuredCell]) -> tuple[set[str], set[str], set[str]]:
    """The commits, days and recorded GPU UUIDs the runs of ``cells`` span."""
    runs = [run for cell in cells for run in cell.runs]
    days = {str(run.get("started_at"))[:10] for run in runs if plain(run.get("started_at"))}
    cards = {str(run.get("gpu_uuid")) for run in runs if plain(run.get("gpu_uuid"))}
    return set().union(*(cell.commits() for cell in cells)), days, cards


def _spans(cells: Sequence[MeasuredCell]) -> bool:
    return any(len(group) > 1 for group in _sittings(cells))


def day_to_day(cells: Sequence[MeasuredCell], target: MeasuredCell, metric: str) -> dict[str, Any] | None:
    """The day-to-day spread on the target's device: the widest relative range (highest / lowest - 1)
    of any one cell of it whose repeats span commits, days or cards; None where no cell was repeated
    so. A step between runs of two sittings is a lever's effect only beyond it."""
    widest = None
    for cell in cells:
        if cell.device != target.device or not _spans([cell]):
            continue
        values = cell.values(metric)
        if len(values) > 1 and (widest is None or values.max() / values.min() - 1 > widest["spread"]):
            widest = {"spread": float(values.max() / values.min() - 1), "cell": f"{cell.model}: {cell.run_ids()}"}
    return widest


def _within_spread(a: MeasuredCell, b: MeasuredCell, metric: str, low: float, high: float, noise: dict[str, Any] | None) -> bool | None:
    """Whether a step's effect is within the spread of the runs it compares, and so no lever's
    effect. Runs of several sittings (commits, days, cards): within the day-to-day spread
    (``day_to_day``). Else its ratio's interval holds 1 (both cells of 2 repeats or more), or without
    one the two cells' own spreads overlap (cell_facts.spread: their repeats, or one run's p10 - p90
    steps). None where the spread it needs is not measured."""
    if _spans([a, b]):
        if noise is None:
            return None
        ratio = b.describe(metric)["median"] / a.describe(metric)["median"]
        return bool(max(ratio, 1 / ratio) - 1 <= noise["spread"])
    if low == low and high == high:
        return bool(low <= 1 <= high)
    tokens = metric == "per_gpu" and bool(a.conditions.get("seq_len"))
    sa, sb = a.spread(tokens), b.spread(tokens)
    if None in (sa["low"], sa["high"], sb["low"], sb["high"]):
        return None
    return bool(sa["low"] <= sb["high"] and sb["low"] <= sa["high"])


def _sessions(a: MeasuredCell, b: MeasuredCell, noise: dict[str, Any] | None) -> str:
    """What a step's runs span beyond one card in one sitting, in words: the commits, the days and
    the cards (their GPU UUIDs; where a record holds none, another card cannot be ruled out), and the
    day-to-day spread its effect is set against."""
    runs = [*a.runs, *b.runs]
    commits, days, cards = (sorted(group) for group in _sittings([a, b]))
    spans = []
    if len(commits) > 1:
        spans.append(f"{len(commits)} commits ({', '.join(commits)})")
    if len(days) > 1:
        spans.append(f"{len(days)} days ({', '.join(days)})")
    if len(cards) > 1:
        spans.append(f"{len(cards)} cards")
    if not spans:
        return ""
    unrecorded = any(not plain(run.get("gpu_uuid")) for run in runs)
    card = "; which card each ran on is not recorded (no GPU UUID): perhaps another card" if unrecorded and len(days) > 1 else ""
    spread = (
        "; no cell repeated across sittings gives a day-to-day spread"
        if noise is None
        else f"; the day-to-day spread: {100 * noise['spread']:.1f} % (the widest of a cell repeated across sittings, {noise['cell']})"
    )
    return f"runs of {' and '.join(spans)}{card}{spread}"


def _rest(pairing: Pairing, steps: Sequence[Mapping[str, Any]], published: Mapping[str, Any]) -> dict[str, Any]:
    """What the measured steps leave of the gap, and every difference they do not cover."""
    total = pairing_ratio(pairing)
    # a step within the spread of the runs it compares is no lever's effect: it explains nothing
    measured = [s for s in steps if s["status"] == "measured" and not s["within_spread"]]
    product = float(np.prod([s["ratio"] for s in measured])) if measured else 1.0
    unexplained = [f"{s['label']} {s['from']} \u2192 {s['to']} (not measured)" for s in steps if s["status"] == "not measured"]
    unexplained += [f"{s['label']} {s['from']} \u2192 {s['to']} (within the spread)" for s in steps if s["status"] == "measured" and s["within_spread"]]
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
