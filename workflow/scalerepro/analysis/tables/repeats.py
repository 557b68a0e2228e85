"""How sure a figure is: statistics over the repeats of a cell, and intervals of ratios of cells.

For the n values x_1..x_n of a cell (one per completed repeat):

    median, min, max
    CV                  s / mean, s the sample standard deviation (ddof = 1); n >= 2
    95 % CI of the median   the 2.5th and 97.5th percentiles of the medians of B = 2000
                        bootstrap resamples (n values drawn with replacement); n >= 2. The
                        resampling is seeded by the cell's key, so the same records give the
                        same interval, whatever else the study holds.

A ratio of two cells' medians (efficiency, gain, the variation over GPU counts) gets its interval
the same way: the statistic computed on each of the B pairs of bootstrap medians, the cells
resampled independently (each with its own seed), then the 2.5th and 97.5th percentiles. With
fewer than 2 values in any cell there is no interval (NaN): one repeat says nothing of spread.

With n = 2 the interval of the median is the two values' span; with n = 3 it spans min..max,
since a bootstrap median of 3 draws is always one of the values. Intervals from few repeats are
wide: that is what they should say.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 14  # any fixed number: the intervals are reproducible from the records alone
CONFIDENCE = 0.95


def _rng(key: Any) -> np.random.Generator:
    """A generator seeded by the cell's key (its text), so each cell's resamples are its own."""
    return np.random.default_rng([BOOTSTRAP_SEED, zlib.crc32(repr(key).encode())])


def values_of(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite values, as floats."""
    array = np.asarray(values, dtype=float)
    return array[np.isfinite(array)]


def bootstrap_medians(values: Sequence[float] | np.ndarray, key: Any) -> np.ndarray | None:
    """B medians of resamples (with replacement) of ``values``; None with fewer than 2 values."""
    x = values_of(values)
    if len(x) < 2:
        return None
    draws = _rng(key).integers(0, len(x), size=(BOOTSTRAP_RESAMPLES, len(x)))
    return np.median(x[draws], axis=1)


def interval(samples: np.ndarray | None) -> tuple[float, float]:
    """The central 95 % of ``samples`` (percentiles 2.5 and 97.5); NaNs without samples."""
    if samples is None or not len(samples):
        return float("nan"), float("nan")
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def describe(values: Sequence[float] | np.ndarray, key: Any) -> dict[str, float]:
    """n, median, min, max, cv, ci_low, ci_high of one cell's values (module docstring)."""
    x = values_of(values)
    n = len(x)
    if n == 0:
        nan = float("nan")
        return {"n": 0, "median": nan, "min": nan, "max": nan, "cv": nan, "ci_low": nan, "ci_high": nan}
    mean = float(np.mean(x))
    # CV = sample standard deviation / mean
    cv = float(np.std(x, ddof=1) / mean) if n >= 2 and mean != 0 else float("nan")
    low, high = interval(bootstrap_medians(x, key))
    return {"n": n, "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max()), "cv": cv, "ci_low": low, "ci_high": high}


def ratio_interval(
    cells: Sequence[tuple[Sequence[float] | np.ndarray, Any]],
    statistic: Callable[..., np.ndarray],
) -> tuple[float, float]:
    """The 95 % interval of ``statistic(*medians)`` over paired bootstrap medians of ``cells``
    ((values, key) each, resampled independently); NaNs when a cell has fewer than 2 values."""
    medians = [bootstrap_medians(values, key) for values, key in cells]
    if any(m is None for m in medians):
        return float("nan"), float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = np.asarray(statistic(*medians), dtype=float)
    return interval(samples[np.isfinite(samples)])


def straddles(low: float, high: float, threshold: float) -> bool:
    """True when the interval has the threshold strictly inside it: the data cannot say on which
    side the true value lies (a target check is then inconclusive)."""
    return bool(np.isfinite(low) and np.isfinite(high) and low < threshold < high)
