"""Each model measured on a GPU beside the nearest published figure for that GPU, every condition
that differs named with both values, and the gap walk from the published figure to the measured one.

    measured    per model, device and GPU count: the best cell, the configuration (the matrix's cell,
                split further by every recorded condition of CONDITION_TABLE and PAIR_ONLY) with the
                highest median per-GPU throughput over its counted repeats, with n and the bootstrap
                95 % interval of the median (tables.repeats)
    candidates  references (config/references.yaml) of the same model on the same device (the name
                NVML reports, compared as reproduction.py compares it) that are measurements
                (NEAREST_KINDS); a whole-job figure (samples_per_s) only at the cell's own GPU count
                (at another count it is another quantity), a per-GPU one (tokens_per_s_per_gpu) at
                any count, the count then a condition that differs. Never another model: a figure for
                another model is not "nearest" however alike the two are (MPT-1B is not Llama 1B).
    nearest     the candidate of the same framework (PyTorch) first, then with the fewest conditions
                that differ (fp16 against bf16 counts half: the same tensor-core rate, another
                format), then the fewest the reference leaves unstated, then the nearest PyTorch
                release
    ratio       measured median / published, in the reference's metric
    verdict     "like for like" only where no condition differs and none is unstated

The gap walk goes from the reference's conditions to the measured cell's one lever (WALK_LEVERS) at a
time. A step is a measured pair of cells that differ in that lever only (every other condition equal:
the same model, device, GPU count, sequence length, PyTorch, and every knob of PAIR_ONLY), its ratio the
two medians' (with the interval of that ratio where both cells have 2 repeats or more). Steps chain
where the study measured values between the two ends (compile none -> default -> reduce-overhead).
What no step measures is the unexplained rest:

    rest = (measured / published) / product of the measured steps

named with every difference no step covers (levers not measured, GPU count, framework, software stack)
and what the product assumes: each step was measured with the other levers as its pair had them, so
the steps compose only as far as the levers do not interact.

The analysis side: pandas only, no torch.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import REFERENCE_COLUMNS
from scalerepro.analysis.tables import repeats
from scalerepro.analysis.tables.reproduction import _same_device, read_references, recorded_conditions
from scalerepro.common.references import load_optional_references

# References that are measurements; "expected (seed document)" is a planning document's expectation.
NEAREST_KINDS = ("published", "mlperf")
# The conditions set side by side: (key, label, a lever the gap walk can step). Keys are those of
# reproduction.recorded_conditions and references.yaml's `conditions`, and four more: the GPU count,
# compile and loader (the reference's trainer flags), framework and software stack (its framework text).
CONDITION_TABLE = (
    ("gpus", "GPUs", False),
    ("precision", "precision", True),
    ("per_gpu_samples_per_step", "batch per GPU", True),
    ("seq_len", "sequence length", False),
    ("memory_format", "memory format", True),
    ("compile", "compile", True),
    ("loader", "loader", True),
    ("data", "data", True),
    ("optimizer", "optimizer", True),
    ("framework", "framework", False),
    ("software_stack", "software stack", False),
)
# Knobs no reference states, which a pair of cells must still share to be one lever apart.
PAIR_ONLY = {"optimizer_impl": "optimizer implementation", "cudnn_benchmark": "cuDNN benchmark", "parallel": "parallelism"}
LABELS = {**{key: label for key, label, _ in CONDITION_TABLE}, **PAIR_ONLY}
WALK_LEVERS = tuple(key for key, _, lever in CONDITION_TABLE if lever)
# Precisions that differ in format but run at the same tensor-core rate: half a difference.
SAME_RATE = ({"fp16", "bf16"},)
VALUE_WORDS = {"nchw": "NCHW", "nhwc": "NHWC (channels_last)", "none": "none (eager)"}


def _plain(value: Any) -> Any:
    """None for NaN or empty, Python scalars for numpy ones, bools for "True"/"False" text."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value == "":
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str) and value in ("True", "False"):
        return value == "True"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def words(key: str, value: Any) -> str:
    """A condition's value as the tables print it."""
    value = _plain(value)
    if value is None:
        return "not stated"
    if isinstance(value, bool):
        return "on" if value else "off"
    if key == "gpus":
        return f"{value} GPU" + ("s" if value != 1 else "")
    if isinstance(value, int):
        return f"{value:,}"
    return VALUE_WORDS.get(str(value).lower(), str(value))


def _flag(flags: Any, name: str) -> str | None:
    """The value after ``name`` in a reference's trainer flags ("--compile none ...")."""
    if not isinstance(flags, str):
        return None
    tokens = shlex.split(flags)
    return tokens[tokens.index(name) + 1] if name in tokens[:-1] else None


def _is_pytorch(text: str) -> bool:
    return bool(re.search(r"\b(py)?torch\b", text, re.I))


def _pytorch_version(text: Any) -> tuple[int, int] | None:
    match = re.search(r"pytorch\s+(\d+)\.(\d+)", str(text or ""), re.I)
    return (int(match.group(1)), int(match.group(2))) if match else None


def reference_conditions(ref: Mapping[str, Any]) -> dict[str, Any]:
    """A reference's conditions (a row of reproduction.read_references) under CONDITION_TABLE's keys."""
    framework = str(_plain(ref.get("framework")) or "")
    stack = re.search(r"PyTorch\s+\d[^\s,;]*(?:\s+\([^)]*\))?", framework)
    conditions = {key: _plain(ref.get(key)) for key, _, _ in CONDITION_TABLE if key in ref}
    conditions.update(
        gpus=_plain(ref.get("gpus")),
        compile=_flag(ref.get("trainer_flags"), "--compile"),
        loader=_flag(ref.get("trainer_flags"), "--loader"),
        framework=("PyTorch" if _is_pytorch(framework) else framework.split(", ")[0]) if framework else None,
        software_stack=stack.group(0) if stack else None,
    )
    return conditions


def run_conditions(run: Mapping[str, Any]) -> dict[str, Any]:
    """A counted run's conditions (a runs.csv row) under CONDITION_TABLE's keys, and PAIR_ONLY's."""
    recorded = {key: _plain(value) for key, value in recorded_conditions(run).items()}
    torch_version = _plain(run.get("torch_version"))
    return {
        **recorded,
        "gpus": _plain(run.get("gpus")),
        "compile": _plain(run.get("compile_mode")),
        "loader": _plain(run.get("loader")),
        "framework": "PyTorch",  # the trainer is PyTorch
        "software_stack": None if torch_version is None else f"PyTorch {torch_version}",
        "optimizer_impl": _plain(run.get("optimizer_impl")),
        "cudnn_benchmark": _plain(run.get("cudnn_benchmark")),
        "parallel": _plain(run.get("parallel_recorded")),
    }


def compare(key: str, published: Any, measured: Any) -> tuple[str, float] | None:
    """(state, cost) of one condition: "same" 0, "differs" 1 (fp16 against bf16: 0.5), "not stated"
    (by the reference) or "not recorded" (by the run) 0; None where neither side has it (a sequence
    length of an image model)."""
    published, measured = _plain(published), _plain(measured)
    if published is None and measured is None:
        return None
    if published is None:
        return "not stated", 0.0
    if measured is None:
        return "not recorded", 0.0
    if key == "software_stack":
        # the same PyTorch release (major.minor); builds, CUDA and drivers are rarely all stated
        same = _pytorch_version(published) is not None and _pytorch_version(published) == _pytorch_version(measured)
    elif isinstance(published, (int, float)) or isinstance(measured, (int, float)):
        same = str(published) == str(measured)
    else:
        same = str(published).lower() == str(measured).lower()
    if same:
        return "same", 0.0
    pair = {str(published).lower(), str(measured).lower()}
    return "differs", 0.5 if key == "precision" and any(pair == rate for rate in SAME_RATE) else 1.0


@dataclass
class Cell:
    """The counted runs of one recorded configuration."""

    study: str
    model: str
    device: str
    conditions: dict[str, Any]
    runs: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return int(self.conditions["gpus"])

    def values(self, metric: str) -> np.ndarray:
        """Each run's figure in ``metric``: samples_per_s (whole job), tokens_per_s_per_gpu, or
        per_gpu (tokens per GPU for a language model, samples per GPU otherwise: the ranking)."""
        if metric == "per_gpu":
            metric = "tokens_per_s_per_gpu" if self.conditions.get("seq_len") else "samples_per_gpu"
        column = "samples_per_s" if metric in ("samples_per_s", "samples_per_gpu") else "tokens_per_s"
        per_gpu = metric != "samples_per_s"
        return repeats.values_of([float(run.get(column, np.nan)) / (self.gpus if per_gpu else 1) for run in self.runs])

    def describe(self, metric: str) -> dict[str, float]:
        return repeats.describe(self.values(metric), ("nearest", self.key_text(), metric))

    def key_text(self) -> str:
        return f"{self.study}|{self.model}|{self.device}|{sorted((k, str(v)) for k, v in self.conditions.items())}"

    def run_ids(self) -> str:
        return ", ".join(str(run.get("run_id")) for run in self.runs)

    def commits(self) -> set[str]:
        return {str(run.get("git_commit"))[:12] for run in self.runs if _plain(run.get("git_commit"))}


def measured_cells(runs: pd.DataFrame) -> list[Cell]:
    """The counted runs grouped by study, model, device, the matrix's variant, precision and batch, and
    every recorded condition, in first-seen order."""
    cells: dict[tuple, Cell] = {}
    if runs.empty or "counts" not in runs.columns:
        return []
    for run in runs[runs["counts"].astype(bool)].to_dict("records"):
        conditions = run_conditions(run)
        device = conditions.pop("gpu")
        # never coarser than the matrix's cell (a record that leaves a knob out is not pooled with another variant)
        planned = tuple(str(run.get(k)) for k in ("variant", "precision", "per_gpu_batch"))
        key = (run.get("study"), run.get("model"), device, planned, tuple(sorted((k, str(v)) for k, v in conditions.items())))
        cells.setdefault(key, Cell(str(run.get("study")), str(run.get("model")), str(device), conditions)).runs.append(run)
    return [cell for cell in cells.values() if cell.describe("per_gpu")["n"]]


def _rank(ref: Mapping[str, Any], cell: Cell) -> tuple:
    """The order of candidates: another framework last, then the cost of the differing conditions,
    the number left unstated, the distance between PyTorch releases, and the id."""
    published = reference_conditions(ref)
    states = [compare(key, published.get(key), cell.conditions.get(key)) for key, _, _ in CONDITION_TABLE]
    cost = sum(state[1] for state in states if state)
    unstated = sum(1 for state in states if state and state[0] == "not stated")
    other_framework = compare("framework", published.get("framework"), "PyTorch")
    theirs, ours = _pytorch_version(published.get("software_stack")), _pytorch_version(cell.conditions.get("software_stack"))
    gap = abs((theirs[0] * 100 + theirs[1]) - (ours[0] * 100 + ours[1])) if theirs and ours else 10_000
    return (bool(other_framework and other_framework[0] == "differs"), cost, unstated, gap, str(ref["id"]))


def _candidates(references: pd.DataFrame, cell: Cell) -> list[Mapping[str, Any]]:
    refs = references.to_dict("records") if not references.empty else []
    return [
        ref
        for ref in refs
        if ref.get("model") == cell.model
        and ref.get("kind") in NEAREST_KINDS
        and _same_device(ref.get("gpu"), cell.device)
        and (ref.get("metric") != "samples_per_s" or _plain(ref.get("gpus")) == cell.gpus)
    ]


def _best(cells: Sequence[Cell]) -> Cell:
    """The cell of highest median per-GPU throughput (more repeats first on a tie)."""
    return max(cells, key=lambda c: (c.describe("per_gpu")["median"], c.describe("per_gpu")["n"]))


@dataclass
class Pairing:
    """One row of the nearest table: the measured cell and its nearest reference (or none)."""

    cell: Cell
    reference: Mapping[str, Any] | None
    why_none: str = ""


def pairings(cells: Sequence[Cell], references: pd.DataFrame) -> list[Pairing]:
    """Per model and device: the best cell at each GPU count that has a candidate reference, beside
    its nearest; where no count has one, the best cell of all and why there is none."""
    out: list[Pairing] = []
    for model, device in dict.fromkeys((c.model, c.device) for c in cells):
        mine = [c for c in cells if (c.model, c.device) == (model, device)]
        by_count = {gpus: _best([c for c in mine if c.gpus == gpus]) for gpus in sorted({c.gpus for c in mine})}
        paired = [(best, min(cands, key=lambda r, b=best: _rank(r, b))) for best in by_count.values() if (cands := _candidates(references, best))]
        if paired:
            out.extend(Pairing(best, ref) for best, ref in paired)
        else:
            out.append(Pairing(_best(mine), None, _why_none(references, model, device)))
    return out


def _why_none(references: pd.DataFrame, model: str, device: str) -> str:
    """Why a model has no published figure beside it, naming the references that mention the model
    in what they cannot match (another model that is only alike) and the GPUs it was published on."""
    text = f"No published figure for {model} on {device}"
    if references.empty:
        return text + ": no references."
    same_model = references[references["model"].eq(model)]
    measured = same_model["kind"].isin(NEAREST_KINDS)
    elsewhere = sorted({str(g) for g in same_model.loc[measured, "gpu"].dropna() if not _same_device(g, device)})
    expected = sorted({f"{kind} on {gpu}" for kind, gpu in same_model.loc[~measured, ["kind", "gpu"]].itertuples(index=False)})
    if elsewhere:
        text += f"; published on {'; '.join(elsewhere)}"
    if expected:
        text += f"; an expectation, not a measurement: {'; '.join(expected)}"
    mention = references[references["unmatched"].fillna("").astype(str).str.contains(rf"\b{re.escape(model)}\b", regex=True)]
    if len(mention):
        ids = sorted(mention["id"].astype(str))
        families = sorted({re.sub(r"-\d+$", "-*", i) for i in ids})
        # the entry's unmatched reads "<condition>: <why>"; the reader needs the why
        reason = str(mention["unmatched"].iloc[0]).split(": ", 1)[-1]
        text += f". Not set beside it: {', '.join(families)}, another model: {reason}"
    return text + "."


def conditions_table(pairing: Pairing) -> list[dict[str, Any]]:
    """Every condition of a pairing: label, measured and published values, state, cost."""
    if pairing.reference is None:
        return []
    published = reference_conditions(pairing.reference)
    rows = []
    for key, label, _ in CONDITION_TABLE:
        state = compare(key, published.get(key), pairing.cell.conditions.get(key))
        if state is None:
            continue
        rows.append({"condition": key, "label": label, "measured": words(key, pairing.cell.conditions.get(key)),
                     "published": words(key, published.get(key)), "state": state[0], "cost": state[1]})  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------
# The gap walk
# --------------------------------------------------------------------------------------------


def _one_lever_apart(a: Cell, b: Cell, lever: str) -> bool:
    """Same model and device, every condition equal but ``lever``, which differs."""
    if (a.model, a.device) != (b.model, b.device):
        return False
    keys = set(a.conditions) | set(b.conditions)
    return str(a.conditions.get(lever)) != str(b.conditions.get(lever)) and all(
        str(a.conditions.get(k)) == str(b.conditions.get(k)) for k in keys if k != lever
    )


def _closeness(pair: tuple[Cell, Cell], target: Cell) -> tuple:
    """Pairs whose other levers are the target cell's first, then those with more repeats."""
    a, b = pair
    apart = sum(str(a.conditions.get(k)) != str(target.conditions.get(k)) for k in a.conditions)
    return (apart, -(len(a.runs) + len(b.runs)), a.key_text(), b.key_text())


def walk(pairing: Pairing, cells: Sequence[Cell]) -> list[dict[str, Any]]:
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
        pairs: dict[tuple[str, str], list[tuple[Cell, Cell]]] = {}
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
            for (x, y) in pairs:
                if y == here and x not in parent:
                    parent[x] = here
                    queue.append(x)
        # where the reference's value is not reached: the value farthest from ours that is
        reached = start if start in parent else max(parent, key=lambda v: _depth(parent, v))
        if reached != start:
            steps.append(_unmeasured(lever, spelled[start], spelled[reached]))
        value = reached
        while parent.get(value) is not None:
            nxt = parent[value]
            a, b = min(pairs[(value, nxt)], key=lambda p: _closeness(p, target))
            steps.append(_measured(lever, spelled[value], spelled[nxt], a, b, metric))
            value = nxt
    used = {id(target)} | {id(c) for step in steps for c in step.pop("cells", ())}
    others = [c for c in cells if id(c) not in used and (c.model, c.device, c.gpus) == (target.model, target.device, target.gpus)]
    unused = [_unused(c, target, metric) for c in others]
    # a cell the records say nothing different of (another study's, or knobs not recorded) is no lever at all
    return steps + [{**_rest(pairing, steps, published), "unused": [u for u in unused if u["levers"]]}]


def _unused(cell: Cell, target: Cell, metric: str) -> dict[str, Any]:
    """A cell of the model that no step uses: more than one lever from every other cell."""
    spread = cell.describe("per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s")
    apart = [f"{LABELS[k]} {words(k, v)}" for k, v in cell.conditions.items()
             if str(v) != str(target.conditions.get(k))]  # fmt: skip
    return {"runs": cell.run_ids(), "median": spread["median"], "n": spread["n"], "apart": "; ".join(apart), "levers": len(apart)}


def _depth(parent: Mapping[str, str | None], value: str) -> int:
    depth = 0
    while parent.get(value) is not None:
        value, depth = parent[value], depth + 1
    return depth


def _unmeasured(lever: str, start: Any, end: Any) -> dict[str, Any]:
    return {"lever": lever, "label": LABELS[lever], "from": words(lever, start), "to": words(lever, end), "status": "not measured"}


def _measured(lever: str, start: Any, end: Any, a: Cell, b: Cell, metric: str) -> dict[str, Any]:
    metric = "per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s"
    low, high = repeats.ratio_interval(
        [(a.values(metric), ("nearest", a.key_text(), metric)), (b.values(metric), ("nearest", b.key_text(), metric))],
        lambda x, y: y / x,
    )
    da, db = a.describe(metric), b.describe(metric)
    commits = sorted(a.commits() | b.commits())
    return {
        "lever": lever, "label": LABELS[lever], "from": words(lever, start), "to": words(lever, end), "status": "measured",
        "ratio": db["median"] / da["median"], "ratio_ci_low": low, "ratio_ci_high": high,
        "from_median": da["median"], "from_n": da["n"], "from_runs": a.run_ids(),
        "to_median": db["median"], "to_n": db["n"], "to_runs": b.run_ids(),
        "held": "; ".join(f"{LABELS[k]} {words(k, v)}" for k, v in a.conditions.items()
                          if k != lever and k in WALK_LEVERS and v is not None),
        "sessions": f"runs of {len(commits)} commits ({', '.join(commits)})" if len(commits) > 1 else "",
        "cells": (a, b),
    }  # fmt: skip


def _rest(pairing: Pairing, steps: Sequence[Mapping[str, Any]], published: Mapping[str, Any]) -> dict[str, Any]:
    """What the measured steps leave of the gap, and every difference they do not cover."""
    total = pairing_ratio(pairing)
    measured = [s for s in steps if s["status"] == "measured"]
    product = float(np.prod([s["ratio"] for s in measured])) if measured else 1.0
    unexplained = [f"{s['label']} {s['from']} \u2192 {s['to']} (not measured)" for s in steps if s["status"] == "not measured"]
    unstated: dict[str, list[str]] = {"not stated": [], "not recorded": []}
    for key, label, lever in CONDITION_TABLE:
        state = compare(key, published.get(key), pairing.cell.conditions.get(key))
        if state and state[0] == "differs" and not lever:
            if key == "software_stack" and compare("framework", published.get("framework"), "PyTorch")[0] == "differs":
                continue  # another framework says it
            text = f"{label} {words(key, published.get(key))} \u2192 {words(key, pairing.cell.conditions.get(key))}"
            if key == "gpus":  # only per-GPU figures are set beside another count
                text += " (per-GPU figures: with more GPUs each step also all-reduces the gradients)"
            unexplained.append(text)
        elif state and state[0] in unstated:
            unstated[state[0]].append(label)
    if unstated["not stated"]:
        unexplained.append(f"whatever differs in what the reference does not state ({', '.join(unstated['not stated'])})")
    if unstated["not recorded"]:
        unexplained.append(f"whatever differs in what the runs' records do not state ({', '.join(unstated['not recorded'])})")
    if len(measured) > 1 or (measured and unexplained):
        unexplained.append("how the levers interact (each step was measured with the other levers as its pair had them)")
    return {"lever": "", "label": "unexplained rest", "status": "rest", "ratio": total / product if total == total else float("nan"),
            "explained": product, "total": total, "what": unexplained}  # fmt: skip


def pairing_ratio(pairing: Pairing) -> float:
    """Measured median / published, in the reference's metric."""
    if pairing.reference is None:
        return float("nan")
    metric = "samples_per_s" if pairing.reference["metric"] == "samples_per_s" else "per_gpu"
    return pairing.cell.describe(metric)["median"] / float(pairing.reference["value"])


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------


def nearest_table(runs: pd.DataFrame, references: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per pairing: the measured cell (median, interval, n, CV, runs), the nearest
    reference, the ratio, the verdict, every condition (``conditions``) and the gap walk (``walk``)."""
    cells = measured_cells(runs)
    rows = []
    for pairing in pairings(cells, references):
        cell, ref = pairing.cell, pairing.reference
        if ref is None:  # the metric the model is published in elsewhere; else a language model's tokens per GPU
            elsewhere = references.loc[references["model"].eq(cell.model), "metric"] if not references.empty else pd.Series()
            metric = elsewhere.iloc[0] if len(elsewhere) else "tokens_per_s_per_gpu" if cell.conditions.get("seq_len") else "samples_per_s"
        else:
            metric = "samples_per_s" if ref["metric"] == "samples_per_s" else "tokens_per_s_per_gpu"
        spread = cell.describe("samples_per_s" if metric == "samples_per_s" else "per_gpu")
        conditions = conditions_table(pairing)
        differ = [c for c in conditions if c["state"] == "differs"]
        unstated = [c for c in conditions if c["state"] in ("not stated", "not recorded")]
        if ref is None:
            verdict = "no published figure"
        elif not differ and not unstated:
            verdict = "like for like"
        elif not differ:
            verdict = "like for like as far as the reference states"
        else:
            verdict = f"not like for like: {len(differ)} condition{'s' if len(differ) != 1 else ''} differ{'' if len(differ) != 1 else 's'}"
            verdict += f", {len(unstated)} unknown" if unstated else ""
        rows.append({
            "model": cell.model, "device": cell.device, "gpus": cell.gpus, "study": cell.study, "metric": metric,
            "measured": spread["median"], "measured_ci_low": spread["ci_low"], "measured_ci_high": spread["ci_high"],
            "repeats": spread["n"], "measured_cv": spread["cv"], "measured_runs": cell.run_ids(),
            "reference": None if ref is None else ref["id"], "published": None if ref is None else float(ref["value"]),
            "published_gpus": None if ref is None else _plain(ref["gpus"]), "kind": None if ref is None else ref["kind"],
            "source": None if ref is None else ref.get("source"), "framework": None if ref is None else _plain(ref.get("framework")),
            "unmatched": None if ref is None else _plain(ref.get("unmatched")), "ref_note": None if ref is None else _plain(ref.get("note")),
            "ratio": pairing_ratio(pairing), "verdict": verdict, "why_none": pairing.why_none,
            "differs": "; ".join(f"{c['label']} {c['measured']} here, {c['published']} published" for c in differ),
            "conditions": conditions, "walk": walk(pairing, cells),
        })  # fmt: skip
    return rows


def reproduction_shown(comparison: pd.DataFrame) -> bool:
    """Whether the reproduce study planned a run for any reference: then its table is shown as it
    is; else every reference of it would read "not comparable: no run scheduled", and they go to the
    one folded table instead."""
    if comparison.empty or "verdict" not in comparison.columns:
        return False
    cells = comparison.get("measured_cell", pd.Series("", index=comparison.index)).astype("string").fillna("")
    return bool(cells.ne("").any() or comparison["verdict"].astype(str).eq("not measured").any())


def unshown_references(references: pd.DataFrame, nearest: Sequence[Mapping[str, Any]], runs: pd.DataFrame,
                       shown: set[str] = frozenset()) -> list[dict[str, Any]]:  # fmt: skip
    """The references beside no measurement here (not a nearest figure, not in ``shown``), each with
    why: an expectation, another GPU, a model not measured here, a whole-job figure at a GPU count not
    measured, or a nearer figure shown."""
    cells = measured_cells(runs)
    devices = sorted({c.device for c in cells})
    nearest_ids = {row["reference"] for row in nearest if row["reference"]}
    out = []
    for ref in references.to_dict("records") if not references.empty else []:
        if ref["id"] in nearest_ids or ref["id"] in shown:
            continue
        on_device = [c for c in cells if _same_device(ref.get("gpu"), c.device)]
        of_model = [c for c in on_device if c.model == ref.get("model")]
        if ref.get("kind") not in NEAREST_KINDS:
            why = f"{ref.get('kind')}: not a measurement"
        elif not on_device:
            why = "another GPU" if devices else "no run completed here"
        elif not of_model:
            why = f"no {ref.get('model')} measured on this GPU"
        elif ref.get("metric") == "samples_per_s" and not any(c.gpus == _plain(ref.get("gpus")) for c in of_model):
            counts = ", ".join(str(g) for g in sorted({c.gpus for c in of_model}))
            why = f"a whole-job figure at {_plain(ref.get('gpus'))} GPUs; {ref.get('model')} ran at {counts} here"
        else:
            near = [row for row in nearest if row["model"] == ref.get("model") and row["reference"] and _same_device(ref.get("gpu"), row["device"])]
            why = f"a nearer figure is shown: {', '.join(sorted({row['reference'] for row in near}))}"
        out.append({"id": ref["id"], "model": ref.get("model"), "gpu": ref.get("gpu"), "gpus": _plain(ref.get("gpus")),
                    "metric": ref.get("metric"), "value": float(ref["value"]), "kind": ref.get("kind"), "why": why})  # fmt: skip
    order = ("a nearer", "a whole-job", "no ", "another GPU", "expected")
    group = {r["id"]: next((i for i, w in enumerate(order) if r["why"].startswith(w)), len(order)) for r in out}
    return sorted(out, key=lambda r: (group[r["id"]], str(r["gpu"]), str(r["model"]), r["gpus"] or 0))


def references_document(references_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The references file for what else the report shows of it (the links), checked against its
    schema as everywhere; empty without one."""
    return load_optional_references(references_path)


def report_context(runs: pd.DataFrame, references_path: str | os.PathLike[str] | None, comparison: pd.DataFrame) -> dict[str, Any]:
    """What the report's "Measured vs published" section shows of this module: the nearest table (with
    each row's conditions and gap walk), whether the reproduction table is shown, and the references
    beside no measurement here. No references file: no reference."""
    if references_path is not None and Path(references_path).is_file():
        references = read_references(references_path)
    else:
        references = pd.DataFrame(columns=list(REFERENCE_COLUMNS))
    nearest = nearest_table(runs, references)
    shown_in_reproduction: set[str] = set()
    if reproduction_shown(comparison) and "group" in comparison.columns:
        shown_in_reproduction = set(comparison.loc[comparison["group"].eq("reproduction"), "reference"].astype(str))
    return {
        "nearest": nearest,
        "reproduction_shown": reproduction_shown(comparison),
        "unshown": unshown_references(references, nearest, runs, shown_in_reproduction),
    }
