"""What the report's "Measured vs published" section shows of published_comparison.csv and
gap_walk.csv: a row per measured model and device (its best published and like-for-like figures,
or why none, and its gap walk), whether the reproduction table is shown, and the references beside
no run here.

The figures are the tables' (``scalerepro.analysis.tables.published_comparison`` wrote them); this
module only puts each model's rows back together as the section lays them out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from scalerepro.analysis.presentation.inputs import Row, rows
from scalerepro.analysis.tables.published_comparison import (
    BESIDE_NO_RUN,
    BEST,
    FIGURE_FIELDS,
    FIGURE_LISTS,
    LIKE,
    LIST_COLUMNS,
    NEAREST,
    NO_FIGURE,
    NO_LIKE,
    NOT_A_STEP,
    UNSHOWN_FIELDS,
    WHOLE_COLUMNS,
    reproduction_shown,
)
from scalerepro.analysis.tables.published_conditions import LABELS, LIKE_FOR_LIKE, MAY_DIFFER
from scalerepro.analysis.values import plain


def anchor(model: str, device: str, devices: int) -> str:
    """A row's id: published-<model>, with the device where the report has several."""

    def token(text: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")

    return f"published-{token(model)}" + (f"-{token(device)}" if devices > 1 else "")


def _read(frame: pd.DataFrame) -> list[Row]:
    """The table's rows in the order written, whole numbers as ints and list cells as lists."""
    out = []
    for row in rows(frame):
        for key in WHOLE_COLUMNS:  # pandas reads a column with gaps as floats
            row[key] = plain(row[key], whole_as_int=True)
        for key in LIST_COLUMNS:
            if isinstance(row.get(key), str):
                row[key] = json.loads(row[key])
        out.append(row)
    return out


def _figure(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: (row[column] or []) if key in FIGURE_LISTS else row[column] for column, key in FIGURE_FIELDS.items()}


def _walk(steps: list[Row]) -> list[Row]:
    """A walk as the section reads it: its steps, then the rest with the cells no step used."""
    unused = [step for step in steps if step["status"] == NOT_A_STEP]
    walk = [step for step in steps if step["status"] != NOT_A_STEP]
    for step in walk:
        # a step within the spread of its runs: True only where the walk said so (empty: not measured)
        step["within_spread"] = plain(step.get("within_spread"), text_flags=True) is True
        if step["status"] == "rest":
            step["unused"] = unused
            step["what"] = step["what"] or []
    return walk


def _model_row(figures: list[Row], steps: list[Row], devices: int) -> dict[str, Any]:
    first = figures[0]
    by_role = {row["role"]: row for row in figures}
    best, like, nearest = by_role.get(BEST), by_role.get(LIKE), by_role.get(NEAREST)
    # the walk starts from the like-for-like figure, else from the nearest
    start = like if like is not None else nearest
    short = None
    if best is not None and start is not None and best["reference"] != start["reference"] and best["unreached"] is not None:
        short = {
            "reference": best["reference"],
            "ratio": best["ratio"],
            "start": start["reference"],
            "unreached": best["unreached"],
            "reached": best["reached"] or [],
        }
    no_like = by_role.get(NO_LIKE)
    return {
        "model": first["model"],
        "device": first["device"],
        "gpus": first["gpus"],
        "study": first["study"],
        "anchor": anchor(first["model"], first["device"], devices),
        "metric": first["metric"],
        "measured": first["measured"],
        "repeats": first["repeats"],
        "spread": {
            "kind": first["spread_kind"],
            "n": first["spread_n"],
            "low": first["spread_low"],
            "high": first["spread_high"],
            "steps": first["spread_steps"],
        },
        "measured_runs": first["measured_runs"],
        "best": None if best is None else _figure(best),
        "like": None if like is None else _figure(like),
        "like_none": None if no_like is None else {"text": no_like["why"], "failed": no_like["failed"] or []},
        "nearest": None if nearest is None else {**_figure(nearest), "why": nearest["why"]},
        "walk_from": None if start is None else start["role"],
        "why_none": by_role[NO_FIGURE]["why"] if NO_FIGURE in by_role else "",
        "walk": _walk(steps),
        "stops_short": short,
        "walk_start": None if start is None else _figure(start),
        "walk_published": None if start is None else start["published_value"],
        "walk_measured": None if start is None else start["walk_measured"],
        "walk_metric": None if start is None else start["published_metric"],
    }


def published_section(published: pd.DataFrame, gap_walk: pd.DataFrame, comparison: pd.DataFrame) -> dict[str, Any]:
    """The section's context from published_comparison.csv, gap_walk.csv and comparison.csv: ``rows``
    (per measured model, as the template reads them), ``reproduction_shown``, the like-for-like
    rule's conditions (``like_same``, ``like_where_stated``, ``like_may_differ``), ``unshown`` (the
    references beside no run here, with why) and ``missing`` (no row at all: the aggregation wrote
    none, which a references file with any reference never leaves)."""
    figures, steps = _read(published), _read(gap_walk)
    measured = [row for row in figures if row["role"] != BESIDE_NO_RUN]
    pairs = list(dict.fromkeys((row["model"], row["device"]) for row in measured))
    devices = len({device for _, device in pairs})
    return {
        "missing": published.empty,
        "rows": [
            _model_row(
                [row for row in measured if (row["model"], row["device"]) == pair],
                [step for step in steps if (step["model"], step["device"]) == pair],
                devices,
            )
            for pair in pairs
        ],
        "reproduction_shown": reproduction_shown(comparison),
        # the like-for-like rule's conditions, from the one place that holds it
        "like_same": [LABELS[key] for key, unstated in LIKE_FOR_LIKE.items() if unstated == "fails"],
        "like_where_stated": [LABELS[key] for key, unstated in LIKE_FOR_LIKE.items() if unstated != "fails"],
        "like_may_differ": [LABELS[key] for key in MAY_DIFFER],
        "unshown": [{key: row[column] for column, key in UNSHOWN_FIELDS.items()} for row in figures if row["role"] == BESIDE_NO_RUN],
    }
