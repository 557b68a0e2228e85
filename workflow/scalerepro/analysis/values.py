"""A table's cells as plain Python values: the one conversion for every module that turns a frame into rows or JSON.

A pandas frame hands out numpy and pandas scalars (``numpy.int64``, ``numpy.float64``, ``pd.NA``,
``pd.NaT``); a template, ``json.dumps`` and a comparison with a Python value want ``int``,
``float``, ``str``, ``bool`` or None. ``plain`` gives that, with every kind of missing value as
None; ``absent`` says whether a value is missing.

On the analysis side, and below its parts (``tables``, ``history`` and ``presentation`` may all
import it): it imports pandas and nothing of the package.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def absent(value: Any) -> bool:
    """None, blank text, NaN, ±inf, NA or NaT: a cell with no value."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() == ""
    if isinstance(value, float):
        return not math.isfinite(value)
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def plain(value: Any, keep_blank_text: bool = False) -> Any:
    """numpy/pandas scalars -> Python scalars; a missing value (``absent``) -> None. Blank text is
    missing too, unless ``keep_blank_text`` (the store keeps a cell's text as it was, so that its
    rows compare with the ones earlier studies stored)."""
    if keep_blank_text and isinstance(value, str):
        return value
    if absent(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            return None  # a numpy float narrower than Python's (float32) that is ±inf
    return value


def finite_number(value: Any) -> float | None:
    """A table's value as a finite float; None for a missing, non-numeric or non-finite one
    (and for a bool, which is a flag, not a figure)."""
    value = plain(value)
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
