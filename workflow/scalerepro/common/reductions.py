"""Reductions over several ranks' or GPUs' figures where one may be missing (None).

A figure over some of them would read as one over all, so a reduction with a term missing is
None. Standard library only: the rank's results and the NVML summaries both use it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

_T = TypeVar("_T")


def max_or_none(values: Sequence[_T | None]) -> _T | None:
    """Max, or None if any term is missing: the max of a subset is only a lower bound."""
    if not values or any(v is None for v in values):
        return None
    return max(values)  # type: ignore[type-var]
