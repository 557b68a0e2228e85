"""Each model measured on a GPU beside two published figures: the best one published for that model's
class on that GPU part, and the best like-for-like one (or none, and why); both ratios, every
condition that differs from each named with both values, and the gap walk from the like-for-like
figure to the measured one.

    measured       per model and device, one row: the best cell (the matrix's: its repeats, never
                   pooled with another cell), the one with the highest median per-GPU throughput over
                   its counted repeats, with n and its spread (cell_facts.spread: n >= 3 min - max,
                   n = 2 the two runs, n = 1 the run's own p10 - p90 steps), per GPU
    figures        references (config/references.yaml) that are measurements (MEASURED_KINDS), each
                   as a per-GPU figure: a whole-job figure (samples_per_s) / its GPU count. At more
                   than one GPU under data parallelism (the reference's conditions.parallelism) that
                   includes each step's all-reduce: a lower bound on what one of its GPUs does alone;
                   sharded or model parallel, or parallelism not stated: no bound (``per_gpu_note``).
                   None above its GPU's peak: the loader refuses such a file
                   (scalerepro.common.share_of_peak)
    model class    the model itself and a model the references file declares as standing in for it
                   (`stands_for`: the nearest shape, another model)
    best published the figure of the model's class on the same GPU part (gpu_part: H100 SXM5, PCIe
                   and NVL are three parts; a figure that states no form factor is taken for the SXM
                   part, and its row says the part is not stated), whatever the framework or GPU
                   count, that makes the measured figure look worst: the lowest ratio ours / theirs
    like for like  a figure of the same model (never a stand-in), on the same GPU part (the name
                   NVML reports) at the same GPU count, in the same framework (PyTorch, as the
                   reference states it), on the same kind of data (synthetic or real, as stated), at
                   the same precision class (fp16 and bf16 are one: the same tensor-core rate, another
                   format), at the same sequence length, memory format and compile mode, and with the
                   same optimizer where the reference states one (LIKE_FOR_LIKE). What may differ,
                   each named on the row: the batch per GPU, loader, PyTorch release, power cap, fp16
                   against bf16, and the optimizer where the reference leaves it unstated. The best
                   like-for-like figure is the highest of them (the lowest ratio); none where no
                   reference passes, with why for each that fails
    nearest        where none is like for like: the figure of the model that fails the rule only in
                   levers a gap walk steps (memory format, compile, ...), the fewest first, then as
                   the best; shown as the "nearest PyTorch figure" with those levers first, never as
                   like for like
    ratio          measured median per GPU / published per GPU, in the reference's metric (images or
                   sequences per second, or tokens per second)

The gap walk from the like-for-like figure (else the nearest) to the measured one is ``gap_walk``'s; the conditions
and the measured cells are ``published_conditions``'. The aggregation writes the result as two
tables (``comparison_tables``), which the report reads:

    published_comparison.csv  a row per measured model and device and ROLE: its "best published"
                   and "like for like" figures (per GPU, the ratio, what differs, what is unknown
                   and the conditions the source states, list cells as JSON), or "no like for like"
                   (why, and each figure of the model that fails the rule: ``failed``) and its
                   "nearest PyTorch figure" where one fails the rule only in levers (why: which), or
                   "no published figure" (why); the measured cell's median, n and spread on each of
                   its rows; and a row per reference beside no run here ("beside no run", why)
    gap_walk.csv   each walk in order, from the like-for-like figure or else the nearest
                   (start_role, start_reference): its steps ("measured", "not measured"), the
                   unexplained rest ("rest"), and each cell of the model that no step uses ("not a
                   step")

The analysis side: pandas only, no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence, Set
from typing import Any, NamedTuple

import pandas as pd

from scalerepro.analysis.columns import GAP_WALK_COLUMNS, PUBLISHED_COMPARISON_COLUMNS, REFERENCE_COLUMNS
from scalerepro.analysis.tables.gap_walk import Pairing, stops_short, walk, walk_metric
from scalerepro.analysis.tables.published_conditions import (
    CONDITION_TABLE,
    EXTRA_COLUMNS,
    LABELS,
    LIKE_FOR_LIKE,
    LOWER_BOUND,
    MEASURED_KINDS,
    WALK_LEVERS,
    MeasuredCell,
    best_cell,
    gpu_model,
    gpu_part,
    measured_cells,
    measured_words,
    plain_value,
    published_words,
    reference_conditions,
    same_rate,
    state_of,
    words,
)
from scalerepro.analysis.tables.reproduction import _same_device

# What a row of published_comparison.csv is
BEST, LIKE, NO_LIKE, NO_FIGURE, BESIDE_NO_RUN = "best published", "like for like", "no like for like", "no published figure", "beside no run"
# the figure of the model itself nearest to like for like where none is: it fails the rule only in levers
# a gap walk steps (compile, memory format, ...), named first on its row
NEAREST = "nearest PyTorch figure"
NOT_A_STEP = "not a step"  # a gap_walk.csv row: a cell of the model more than one lever from every other

# --------------------------------------------------------------------------------------------
# The best published figure and the like-for-like one
# --------------------------------------------------------------------------------------------


def per_gpu_published(ref: Mapping[str, Any]) -> float:
    """A reference's figure per GPU: a whole-job figure / its GPU count."""
    value = float(ref["value"])
    return value / int(plain_value(ref["gpus"])) if ref["metric"] == "samples_per_s" else value


def figure_ratio(ref: Mapping[str, Any], cell: MeasuredCell) -> float:
    """Measured median per GPU / published per GPU, in the reference's metric."""
    metric = "samples_per_gpu" if ref["metric"] == "samples_per_s" else "tokens_per_s_per_gpu"
    return cell.describe(metric)["median"] / per_gpu_published(ref)


def class_figures(references: pd.DataFrame, cell: MeasuredCell) -> list[Mapping[str, Any]]:
    """The measurements of the cell's model class (the model, or one standing in for it) on its GPU
    part (gpu_part: an H100 PCIe figure is never set beside an H100 SXM5 run), at any GPU count."""
    refs = references.to_dict("records") if not references.empty else []
    part = gpu_part(cell.device)
    return [
        ref
        for ref in refs
        if cell.model in (ref.get("model"), plain_value(ref.get("stands_for")))
        and ref.get("kind") in MEASURED_KINDS
        and part is not None
        and gpu_part(ref.get("gpu")) == part
    ]


def _stand_in(ref: Mapping[str, Any], cell: MeasuredCell) -> str | None:
    """What makes a stand-in another model ("another model (MPT-1B: ...)"); None for the model itself."""
    if ref.get("model") == cell.model:
        return None
    return f"another model ({plain_value(ref.get('stands_for_differs')) or ref.get('model')})"


def conditions_table(ref: Mapping[str, Any] | None, cell: MeasuredCell) -> list[dict[str, Any]]:
    """Every condition of a reference beside a cell's: label, measured and published values, state,
    cost, and the words the row says of it. A stand-in's model comes first, as a condition that differs."""
    if ref is None:
        return []
    published, ours = reference_conditions(ref), cell.compared()
    rows = []
    if (stand_in := _stand_in(ref, cell)) is not None:
        rows.append(
            {
                "condition": "model",
                "label": "model",
                "measured": cell.model,
                "published": str(ref.get("model")),
                "state": "differs",
                "cost": 1.0,
                "says": stand_in,
            }
        )
    for key, label, _ in CONDITION_TABLE:
        state = state_of(key, published, ours)
        if state is None:
            continue
        theirs, mine = published_words(key, published), measured_words(key, cell)
        if state[0] == "differs":
            says = f"{label}: {theirs}, ours {mine}" + (" (the same tensor-core rate)" if state[1] == 0.5 else "")
        elif state[0] == "not stated":
            says = f"{label}: not stated, ours {mine}"
        elif state[0] == "not recorded":
            says = f"{label}: {theirs}, ours not recorded"
        else:
            says = f"{label} {mine}"
        rows.append({"condition": key, "label": label, "measured": mine, "published": theirs, "state": state[0], "cost": state[1], "says": says})
    return rows


def _failing(ref: Mapping[str, Any], cell: MeasuredCell) -> list[tuple[str, str]]:
    """(condition, words) of each condition that keeps a reference from being like for like with a
    cell (the module docstring's rule, LIKE_FOR_LIKE); empty where it is like for like."""
    published, ours = reference_conditions(ref), cell.compared()
    failures = []
    if (stand_in := _stand_in(ref, cell)) is not None:
        failures.append(("model", stand_in))
    if not _same_device(ref.get("gpu"), cell.device):
        failures.append(("sku", f"GPU: {published.get('sku') or ref.get('gpu')}, ours {cell.device}"))
    if published.get("gpus") != cell.gpus:
        failures.append(("gpus", f"GPUs: {words('gpus', published.get('gpus'))}, ours {words('gpus', cell.gpus)}"))
    for key, unstated in LIKE_FOR_LIKE.items():
        state = state_of(key, published, ours)
        if state is None or state[0] == "same":
            continue
        if key == "precision" and state[0] == "differs" and same_rate(published.get(key), ours.get(key)):
            continue  # the same precision class
        if unstated == "unknown" and state[0] in ("not stated", "not recorded"):
            continue  # named as unknown on the row, not a failure
        mine = words(key, ours.get(key)) if state[0] != "not recorded" else "not recorded"
        failures.append((key, f"{LABELS[key]}: {words(key, published.get(key))}, ours {mine}"))
    return failures


def like_for_like_failures(ref: Mapping[str, Any], cell: MeasuredCell) -> list[str]:
    """Why a reference is not like for like with a cell (the module docstring's rule), in words;
    empty where it is."""
    return [text for _, text in _failing(ref, cell)]


def nearest_levers(ref: Mapping[str, Any], cell: MeasuredCell) -> list[str] | None:
    """The levers (WALK_LEVERS) a figure fails like for like in, where it fails in nothing else: a
    nearest figure, which a gap walk can still start from; None where it fails in anything no measured
    lever steps (another model, GPU part, GPU count, framework or sequence length), or in nothing."""
    failures = _failing(ref, cell)
    if not failures or any(key not in WALK_LEVERS for key, _ in failures):
        return None
    return [key for key, _ in failures]


def per_gpu_note(ref: Mapping[str, Any]) -> str | None:
    """What a reference's per-GPU figure is at more than one GPU: a lower bound on one of its GPUs
    alone only under data parallelism (LOWER_BOUND), where every GPU holds the whole model; under
    sharding or model parallelism, or where the source states no parallelism, no bound at all."""
    gpus = int(plain_value(ref["gpus"]))
    if gpus == 1:
        return None
    kind, stated = plain_value(ref.get("parallelism")), plain_value(ref.get("parallelism_stated"))
    job = f", {float(ref['value']):,.0f} for the job" if ref["metric"] == "samples_per_s" else ""
    if kind is None:
        return f"per GPU of {gpus}{job} (the source states no parallelism): no bound on what one GPU does alone"
    if LOWER_BOUND[kind]:
        return f"per GPU of {gpus}{job} ({stated}: each GPU holds the whole model): a lower bound on what one of its GPUs does alone"
    return f"per GPU of {gpus}{job} ({stated}; one GPU alone need not hold the model): no bound on what one GPU does alone"


def _figure(ref: Mapping[str, Any], cell: MeasuredCell, first: Sequence[str] = ()) -> dict[str, Any]:
    """One published figure as the row shows it: per GPU (and what that is at more than one GPU), its
    ratio, its conditions and those that differ from the cell's (``first`` first: the levers a nearest
    figure fails like for like in), its source."""
    conditions = conditions_table(ref, cell)
    differs = [c for c in conditions if c["state"] == "differs"]
    return {
        "reference": ref["id"],
        "kind": ref.get("kind"),
        "published": per_gpu_published(ref),
        "published_value": float(ref["value"]),
        "published_gpus": int(plain_value(ref["gpus"])),
        "metric": ref["metric"],
        "per_gpu_note": per_gpu_note(ref),
        "ratio": figure_ratio(ref, cell),
        "source": ref.get("source"),
        "framework": plain_value(ref.get("framework")),
        "metric_notes": plain_value(ref.get("metric_notes")),
        "stand_in": _stand_in(ref, cell),
        # its reproduction conditions, as the source states them
        "stated": [
            c["published"] if c["condition"] == "gpus" else f"{c['label']} {c['published']}"
            for c in conditions
            if c["condition"] != "model" and c["state"] != "not stated"
        ],
        "differs": [c["says"] for c in sorted(differs, key=lambda c: c["condition"] not in first)],
        "unknown": [c["says"] for c in conditions if c["state"] in ("not stated", "not recorded")],
        "conditions": conditions,
    }


class Chosen(NamedTuple):
    """A cell's published figures (the module docstring's rules): the best published, the best like
    for like, the nearest (only where none is like for like) with the levers it fails the rule in,
    and why each figure of the model's class that is not like for like fails."""

    best: Mapping[str, Any] | None
    like: Mapping[str, Any] | None
    nearest: Mapping[str, Any] | None
    nearest_levers: list[str]
    failed: list[tuple[str, list[str]]]


def choose(references: pd.DataFrame, cell: MeasuredCell) -> Chosen:
    """A cell's figures (``Chosen``): the lowest ratio wins, the model itself before a stand-in, then
    the fewest conditions that differ, then the id; a nearest figure with the fewest levers first."""
    figures = class_figures(references, cell)

    def order(ref: Mapping[str, Any]) -> tuple:
        differ = sum(c["cost"] for c in conditions_table(ref, cell) if c["state"] == "differs")
        return (figure_ratio(ref, cell), ref.get("model") != cell.model, differ, str(ref["id"]))

    failures = {ref["id"]: like_for_like_failures(ref, cell) for ref in figures}
    alike = [ref for ref in figures if not failures[ref["id"]]]
    best = min(figures, key=order) if figures else None
    like = min(alike, key=order) if alike else None
    levers = {ref["id"]: found for ref in figures if like is None and (found := nearest_levers(ref, cell)) is not None}
    near = [ref for ref in figures if ref["id"] in levers]
    nearest = min(near, key=lambda ref: (len(levers[ref["id"]]), order(ref))) if near else None
    failed = [(ref["id"], failures[ref["id"]]) for ref in sorted(figures, key=order) if failures[ref["id"]]]
    return Chosen(best, like, nearest, [] if nearest is None else levers[nearest["id"]], failed)


def _why_no_like(cell: MeasuredCell, failed: Sequence[tuple[str, Sequence[str]]]) -> dict[str, Any]:
    """Why a row has no like-for-like figure: ``text``, and each figure of the model itself with the
    conditions that fail the rule (``failed``)."""
    own = [{"reference": ref, "why": list(why)} for ref, why in failed if not why[0].startswith("another model")]
    text = f"no figure of {cell.model} itself on the {gpu_part(cell.device)}" if not own else "no figure of the model passes the rule"
    stand_ins = sorted({re.sub(r"-\d+$", "-*", ref) for ref, why in failed if why[0].startswith("another model")})
    if stand_ins:
        text += f"; {', '.join(stand_ins)}: another model, never like for like"
    return {"text": text, "failed": own}


def _why_none(references: pd.DataFrame, model: str, device: str) -> str:
    """Why a model has no published figure beside it, naming the GPUs it was published on and the
    expectations that are no measurement."""
    text = f"No published figure for {model} on {device}"
    if references.empty:
        return text + ": no references."
    same_model = references[references["model"].eq(model)]
    measured = same_model["kind"].isin(MEASURED_KINDS)
    part = gpu_part(device)
    elsewhere = sorted({str(g) for g in same_model.loc[measured, "gpu"].dropna() if gpu_part(g) != part})
    expected = sorted({f"{kind} on {gpu}" for kind, gpu in same_model.loc[~measured, ["kind", "gpu"]].itertuples(index=False)})
    if elsewhere:
        text += f"; published on {'; '.join(elsewhere)}"
    if expected:
        text += f"; an expectation, not a measurement: {'; '.join(expected)}"
    return text + "."


# The tables
# --------------------------------------------------------------------------------------------


def published_table(runs: pd.DataFrame, references: pd.DataFrame, inventory: Any = None) -> list[dict[str, Any]]:
    """One row per measured model and device: the best cell (median per GPU, n, spread, runs), the
    best published figure of its class (``best``), the best like-for-like one (``like``, else
    ``like_none`` says why), each with its ratio, conditions and those that differ (``_figure``), the
    gap walk from the like-for-like figure (``walk``) and where it stops short of the best
    (``stops_short``); ``why_none`` where there is no figure at all."""
    cells = measured_cells(runs, inventory)
    pairs = list(dict.fromkeys((c.model, c.device) for c in cells))
    rows = []
    for model, device in pairs:
        cell = best_cell([c for c in cells if (c.model, c.device) == (model, device)])
        chosen = choose(references, cell)
        best_ref, like_ref = chosen.best, chosen.like
        best = None if best_ref is None else _figure(best_ref, cell)
        like = None if like_ref is None else _figure(like_ref, cell)
        nearest = None
        if chosen.nearest is not None:
            nearest = {**_figure(chosen.nearest, cell, chosen.nearest_levers), "levers": [LABELS[k] for k in chosen.nearest_levers]}
        # the walk starts from the like-for-like figure, else from the nearest, which it names as such
        start_ref, start = (like_ref, like) if like_ref is not None else (chosen.nearest, nearest)
        # the metric of the figure shown; without one, the one the model is published in elsewhere, else
        # a language model's tokens per GPU
        elsewhere = references.loc[references["model"].eq(model), "metric"] if not references.empty else pd.Series(dtype=object)
        metric = (best_ref or like_ref or {}).get("metric") or (elsewhere.iloc[0] if len(elsewhere) else None)
        tokens = metric == "tokens_per_s_per_gpu" if metric else bool(cell.conditions.get("seq_len"))
        spread = cell.describe("tokens_per_s_per_gpu" if tokens else "samples_per_gpu")
        steps = walk(Pairing(cell, start_ref), cells) if start_ref is not None else []
        rows.append(
            {
                "model": model,
                "device": device,
                "gpus": cell.gpus,
                "study": cell.study,
                "metric": "tokens_per_s_per_gpu" if tokens else "samples_per_s",
                "measured": spread["median"],
                "repeats": spread["n"],
                "spread": cell.spread(tokens),
                "measured_runs": cell.run_ids(),
                "best": best,
                "like": like,
                "like_none": None if like is not None or best is None else _why_no_like(cell, chosen.failed),
                "nearest": nearest,
                "walk_from": None if start is None else LIKE if like is not None else NEAREST,
                "walk_reference": None if start is None else start["reference"],
                "why_none": _why_none(references, model, device) if best is None else "",
                "walk": steps,
                "stops_short": stops_short(best, start, steps, best_ref),
                # the walk's figures are in its first reference's metric, at the cell's GPU count
                "walk_published": None if start_ref is None else float(start_ref["value"]),
                "walk_measured": None if start_ref is None else cell.describe(walk_metric(str(start_ref["metric"])))["median"],
                "walk_metric": None if start_ref is None else start_ref["metric"],
            }
        )
    return rows


def reproduction_shown(comparison: pd.DataFrame) -> bool:
    """Whether the reproduce study planned a run for any reference: then its table is shown as it
    is; else every reference of it would read "not comparable: no run scheduled", and they go to the
    one folded table instead."""
    if comparison.empty or "verdict" not in comparison.columns:
        return False
    cells = comparison.get("measured_cell", pd.Series("", index=comparison.index)).astype("string").fillna("")
    return bool(cells.ne("").any() or comparison["verdict"].astype(str).eq("not measured").any())


def unshown_references(
    references: pd.DataFrame, rows: Sequence[Mapping[str, Any]], runs: pd.DataFrame, shown: Set[str] = frozenset(), inventory: Any = None
) -> list[dict[str, Any]]:
    """The references beside no measurement here (neither a row's best nor its like-for-like figure,
    not in ``shown``), each with why: like for like but below the one shown, below the best published
    and not like for like (and why), a model not measured on this GPU part, another GPU part or GPU, or an
    expectation."""
    cells = measured_cells(runs, inventory)
    chips = {gpu_model(cell.device) for cell in cells} - {None}
    parts = {gpu_part(cell.device) for cell in cells} - {None}
    shown_ids = {figure["reference"] for row in rows for figure in (row["best"], row["like"], row["nearest"]) if figure}
    best_of = {(row["model"], gpu_part(row["device"])): row for row in rows}
    out = []
    for ref in references.to_dict("records") if not references.empty else []:
        if ref["id"] in shown_ids or ref["id"] in shown:
            continue
        part = gpu_part(ref.get("gpu"))
        models = [m for m in (ref.get("model"), plain_value(ref.get("stands_for"))) if m]
        row = next((best_of[(m, part)] for m in models if (m, part) in best_of), None)
        if ref.get("kind") not in MEASURED_KINDS:
            why = f"{ref.get('kind')}: not a measurement"
        elif part not in parts:
            why = "no run completed here" if not cells else f"another GPU part ({part})" if gpu_model(ref.get("gpu")) in chips else "another GPU"
        elif row is None:
            why = f"no {ref.get('model')} measured on this GPU part"
        else:
            cell = best_cell([c for c in cells if (c.model, c.device) == (row["model"], row["device"])])
            failures = like_for_like_failures(ref, cell)
            if not failures and row["like"]:
                why = f"like for like, below the one shown ({row['like']['reference']}, {figure_ratio(ref, cell):.2f}× against {row['like']['ratio']:.2f}×)"
            elif row["best"]:
                why = f"below the best published shown ({row['best']['reference']}); not like for like: {'; '.join(failures)}"
            else:
                why = f"not of {row['model']}'s class on this GPU part; not like for like: {'; '.join(failures)}"
        out.append(
            {
                "id": ref["id"],
                "model": ref.get("model"),
                "gpu": ref.get("gpu"),
                "gpus": plain_value(ref.get("gpus")),
                "metric": ref.get("metric"),
                "value": float(ref["value"]),
                "kind": ref.get("kind"),
                "why": why,
            }
        )
    order = ("like for like", "below the best", "another GPU part", "no ", "another GPU", "expected")
    group = {r["id"]: next((i for i, w in enumerate(order) if r["why"].startswith(w)), len(order)) for r in out}
    return sorted(out, key=lambda r: (group[r["id"]], str(r["gpu"]), str(r["model"]), r["gpus"] or 0))


def comparison_tables(runs: pd.DataFrame, references: pd.DataFrame, comparison: pd.DataFrame, inventory: Any = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """published_comparison.csv and gap_walk.csv (module docstring): per measured model and device,
    a row for each figure set beside it (BEST, LIKE) or why none (NO_LIKE, NO_FIGURE), and the
    references beside no run here with why; the gap walks' steps. ``comparison`` is the reproduction table (comparison.csv): a reference
    it shows is not listed again as beside no run."""
    if references.empty:
        references = pd.DataFrame(columns=[*REFERENCE_COLUMNS, *EXTRA_COLUMNS])
    rows = published_table(runs, references, inventory)
    shown: set[str] = set()
    if reproduction_shown(comparison) and "group" in comparison.columns:
        shown = set(comparison.loc[comparison["group"].eq("reproduction"), "reference"].astype(str))
    unshown = unshown_references(references, rows, runs, shown, inventory)
    figures = [record for row in rows for record in _role_records(row)]
    figures += [{"role": BESIDE_NO_RUN, **_beside_no_run(ref)} for ref in unshown]
    steps = [
        {**_where(row), "start_role": row["walk_from"], "start_reference": row["walk_reference"], "step": i, **_step_record(step)}
        for row in rows
        if row["walk_from"]
        for i, step in enumerate(_steps(row["walk"]))
    ]
    return _counts(pd.DataFrame(figures, columns=list(PUBLISHED_COMPARISON_COLUMNS))), _counts(pd.DataFrame(steps, columns=list(GAP_WALK_COLUMNS)))


# A figure's fields (``_figure``) as a row's columns, and a reference beside no run's
# (``unshown_references``): column -> field; the report reads them back by the same maps.
FIGURE_FIELDS = {
    "reference": "reference",
    "kind": "kind",
    "published": "published",
    "published_value": "published_value",
    "published_gpus": "published_gpus",
    "published_metric": "metric",
    "ratio": "ratio",
    "per_gpu_note": "per_gpu_note",
    "stand_in": "stand_in",
    "framework": "framework",
    "metric_notes": "metric_notes",
    "source": "source",
    "stated": "stated",
    "differs": "differs",
    "unknown": "unknown",
}
FIGURE_LISTS = ("stated", "differs", "unknown")
# the cells that hold a list, written as JSON (their items may hold any separator)
LIST_COLUMNS = (*FIGURE_LISTS, "unreached", "reached", "what", "failed")
UNSHOWN_FIELDS = {
    "model": "model",
    "device": "gpu",
    "reference": "id",
    "kind": "kind",
    "published_value": "value",
    "published_gpus": "gpus",
    "published_metric": "metric",
    "why": "why",
}

# the columns that count something, written as whole numbers though some rows leave them empty
WHOLE_COLUMNS = ("gpus", "repeats", "spread_n", "spread_steps", "published_gpus", "step", "from_n", "to_n", "n", "levers")


def _counts(frame: pd.DataFrame) -> pd.DataFrame:
    for column in WHOLE_COLUMNS:
        if column in frame.columns:
            frame[column] = pd.to_numeric(frame[column]).round().astype("Int64")
    return frame


def _where(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": row["model"], "device": row["device"], "gpus": row["gpus"]}


def _role_records(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A measured model's rows: its best published figure and its like-for-like one, or why none."""
    spread = row["spread"]
    measured = {
        **_where(row),
        "study": row["study"],
        "metric": row["metric"],
        "measured": row["measured"],
        "repeats": row["repeats"],
        "spread_kind": spread.get("kind"),
        "spread_n": spread.get("n"),
        "spread_low": spread.get("low"),
        "spread_high": spread.get("high"),
        "spread_steps": spread.get("steps"),
        "measured_runs": row["measured_runs"],
    }
    if row["best"] is None:
        return [{"role": NO_FIGURE, **measured, "why": row["why_none"]}]
    short = row["stops_short"] or {}
    records = [
        {"role": BEST, **measured, **_figure_record(row["best"]), "unreached": _listed(short.get("unreached")), "reached": _listed(short.get("reached"))}
    ]
    if row["like"] is not None:
        records.append({"role": LIKE, **measured, **_figure_record(row["like"]), "walk_measured": row["walk_measured"]})
    else:
        records.append({"role": NO_LIKE, **measured, "why": row["like_none"]["text"], "failed": _listed(row["like_none"]["failed"])})
    if row["nearest"] is not None:
        nearest = row["nearest"]
        why = f"not like for like in {', '.join(nearest['levers'])} only: levers the gap walk steps"
        records.append({"role": NEAREST, **measured, **_figure_record(nearest), "walk_measured": row["walk_measured"], "why": why})
    return records


def _figure_record(figure: Mapping[str, Any]) -> dict[str, Any]:
    return {column: _listed(figure[key]) if key in FIGURE_LISTS else figure[key] for column, key in FIGURE_FIELDS.items()}


def _beside_no_run(ref: Mapping[str, Any]) -> dict[str, Any]:
    return {column: ref[key] for column, key in UNSHOWN_FIELDS.items()}


def _steps(walk: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A walk's steps, its rest, then each cell no step used (status NOT_A_STEP)."""
    return [step for step in walk if step["status"] != "rest"] + [
        item
        for step in walk
        if step["status"] == "rest"
        for item in ({k: v for k, v in step.items() if k != "unused"}, *({"status": NOT_A_STEP, **u} for u in step["unused"]))
    ]


def _step_record(step: Mapping[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in step.items() if k != "what"}, "what": _listed(step.get("what"))}


def _listed(items: Sequence[Any] | None) -> str | None:
    """A cell of LIST_COLUMNS, as JSON."""
    return None if items is None else json.dumps(list(items))
