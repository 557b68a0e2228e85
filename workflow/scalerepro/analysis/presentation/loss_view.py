"""What the report's "Why not faster" section shows: each multi-rank cell's loss against ideal
scaling as measured parts, each the cell's median run's with its interval over repeats, whether the named
parts account for the loss, and the bottleneck with its lever.

The figures are loss_decomposition.csv's (``scalerepro.analysis.tables.loss_decomposition``); this
module only words them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from scalerepro.analysis.presentation.formatting import MISSING, fmt_percent
from scalerepro.analysis.tables.loss_decomposition import PARTS
from scalerepro.analysis.values import finite_number

RowT = TypeVar("RowT", bound=dict[str, Any])  # a table row; loss_rows returns its rows in the type it was given

# how far the named parts may miss the measured loss and still be said to account for it
ACCOUNTED_POINTS = 0.03


def part_text(row: Mapping[str, Any], part: str) -> str:
    """ "17.2 % (12.1–21.0 %)": the part's share of the measured step (the median run's) with its 95 % interval."""
    median = finite_number(row.get(part))
    if median is None:
        return MISSING
    low, high = finite_number(row.get(f"{part}_ci_low")), finite_number(row.get(f"{part}_ci_high"))
    spread = f" ({100 * low:.1f}–{100 * high:.1f} %)" if low is not None and high is not None else ""
    return f"{fmt_percent(median)}{spread}"


def loss_rows(rows: Sequence[RowT]) -> list[RowT]:
    """The table's rows: every part as text with its interval, and whether the parts add up."""
    shown = []
    for original in rows:
        row = type(original)(original)  # the report's row type: a missing column reads as None
        for part in PARTS:
            row[f"{part}_text"] = part_text(row, part)
        error = finite_number(row.get("sum_error"))
        if error is not None:
            low, high = finite_number(row.get("unexplained_ci_low")), finite_number(row.get("unexplained_ci_high"))
            if abs(error) <= ACCOUNTED_POINTS:
                row["accounted"] = "yes"
            elif low is not None and high is not None and low <= 0 <= high:
                # the rest is not told apart from 0 by the repeats: noise, not a missing part
                row["accounted"] = f"within the repeats' spread: {100 * error:+.1f} points, the rest's interval holds 0"
            else:
                row["accounted"] = f"no: {100 * error:+.1f} points"
        shown.append(row)
    return shown
