"""Reductions over several ranks' or GPUs' figures where one may be missing (None).

A figure over some of them would read as one over all, so a reduction with a term missing is
None. Standard library only: the rank's results and the NVML summaries both use it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

_T = TypeVar("_T")


def max_or_none(values: Sequence[_T | None]) -> _T | None:
    """Max, or None if any term is missing: the max of a subset is only a lower bound."""
    if not values or any(v is None for v in values):
        return None
    return max(values)  # type: ignore[type-var]


def sum_or_none(values: Sequence[float | None]) -> float | None:
    """Sum, or None if any term is missing: a partial total would read as a smaller true total."""
    if not values or any(v is None for v in values):
        return None
    return math.fsum(v for v in values if v is not None)


def min_or_none(values: Sequence[float | None]) -> float | None:
    """Min, or None if any term is missing: the min of a subset is only an upper bound."""
    if not values or any(v is None for v in values):
        return None
    return min(v for v in values if v is not None)


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """Mean, or None if any term is missing: a mean of a subset would read as one of all."""
    total = sum_or_none(values)
    return None if total is None else total / len(values)
