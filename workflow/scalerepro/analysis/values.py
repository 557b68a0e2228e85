"""A table's cells as plain Python values: the one conversion for every module that turns a frame into rows or JSON.

A pandas frame hands out numpy and pandas scalars (``numpy.int64``, ``numpy.float64``, ``pd.NA``,
``pd.NaT``); a template, ``json.dumps`` and a comparison with a Python value want ``int``,
``float``, ``str``, ``bool`` or None. ``plain`` gives that, with every kind of missing value as
None (±inf too, unless asked to keep it: a ratio over a zero is a figure where a view shows it);
``absent`` says whether a value is missing; ``finite_number`` is a value as a figure.

On the analysis side, and below its parts (``tables``, ``history`` and ``presentation`` may all
import it): it imports numpy, pandas and nothing of the package.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
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


def plain(value: Any, keep_blank_text: bool = False, keep_infinite: bool = False, text_flags: bool = False, whole_as_int: bool = False) -> Any:
    """numpy/pandas scalars -> Python scalars; a missing value (``absent``) -> None. Blank text is
    missing too, unless ``keep_blank_text`` (the store keeps a cell's text as it was, so that its
    rows compare with the ones earlier studies stored). ``keep_infinite``: ±inf stays a float
    instead of None. ``text_flags``: the text "True" and "False" (a flag column read back from a
    CSV with gaps) as bools. ``whole_as_int``: a float with no fraction (an integer column that
    pandas widened to float for its gaps) as an int."""
    if keep_blank_text and isinstance(value, str):
        return value
    if keep_infinite and isinstance(value, (float, np.floating)) and math.isinf(value):
        return float(value)
    if absent(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            return None  # a numpy float narrower than Python's (float32) that is ±inf
    if text_flags and value in ("True", "False"):
        return value == "True"
    if whole_as_int and isinstance(value, float) and value.is_integer():
        return int(value)
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
