"""What every figure of the study shares: the tables it reads (with the columns an absent one gets),
its markers, the GPU-count axis, panels and the legend below them; ``NotMeasured`` for a figure
without data."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from scalerepro.analysis import columns
from scalerepro.analysis.tables import loss_decomposition, table_digests

Tables = Mapping[str, pd.DataFrame]
# The tables the figures read, with the columns an absent or empty one gets.
COLUMNS = {
    "runs": columns.RUN_COLUMNS,
    "epochs": columns.EPOCH_COLUMNS,
    "loss_log": columns.LOSS_COLUMNS,
    "scaling": columns.SCALING_COLUMNS,
    "sensitivity": columns.SENSITIVITY_COLUMNS,
    "ablation": columns.ABLATION_COLUMNS,
    "communication": columns.COMM_COLUMNS,
    "comparison": columns.COMPARISON_COLUMNS,
    "checks": columns.CHECK_COLUMNS,
    "profiling": columns.PROFILING_COLUMNS,
    "profiling_roofline": columns.ROOFLINE_COLUMNS,
    "scaling_model": columns.SCALING_MODEL_COLUMNS,
    "loss_decomposition": loss_decomposition.LOSS_DECOMPOSITION_COLUMNS,
    "history": columns.HISTORY_COLUMNS,
    "versus_baseline": columns.VERSUS_COLUMNS,
}
MARKERS = ("D", "s", "^", "v", "P", "X", "*", "h")


class NotMeasured(Exception):
    """A figure has no data; the message says why."""


def read_tables(tables_dir: str | os.PathLike[str]) -> dict[str, pd.DataFrame]:
    """The tables the figures use; a missing or empty CSV reads as an empty frame with its columns.
    The aggregation's must be the ones it wrote (table_digests.check: else one line, no figure)."""
    table_digests.check(tables_dir)
    tables = {}
    for name, names in COLUMNS.items():
        path = Path(tables_dir) / f"{name}.csv"
        empty = not path.is_file() or path.stat().st_size == 0
        frame = pd.DataFrame(columns=names) if empty else pd.read_csv(path, dtype={"variant": str})
        # a table written before a column was added reads it as empty, not as an error
        tables[name] = frame.reindex(columns=[*frame.columns, *(c for c in names if c not in frame.columns)])
    return tables


def threshold_of(t: Tables, key: str) -> float | None:
    """The number a target line is drawn at, when the target ``key`` was given."""
    values = t["checks"].loc[t["checks"]["check"].eq(key), "threshold"].dropna()
    return float(values.iloc[0]) if len(values) else None


def device_of(t: Tables) -> tuple[str, str]:
    """What the study's count counts, (one, many): ranks where every run with a record ran on a
    CPU (its "GPUs" are gloo ranks on one host's cores), else GPUs."""
    devices = set(t["runs"]["device_type"].dropna())
    return ("rank", "ranks") if devices == {"cpu"} else ("GPU", "GPUs")


def count_label(n: float, device: tuple[str, str]) -> str:
    """2 -> "2 GPUs", 1 -> "1 rank"."""
    return f"{n:g} {device[0] if n == 1 else device[1]}"


def gpu_axis(ax: plt.Axes, gpus: Sequence[float], device: tuple[str, str]) -> None:
    """A log2 GPU-count axis (ranks on a CPU), ticked at the counts measured."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(gpus))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(device[1])


def plain_log_axis(axis: Axis) -> None:
    """A log axis labelled 1-2-5 in plain numbers (2,000, not 2 x 10^3)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
    axis.set_minor_formatter(NullFormatter())


def bytes_label(value: float, _position: object = None) -> str:
    """1024 -> "1 KiB"."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = min(int(np.log2(max(value, 1)) // 10), len(units) - 1)
    return f"{value / 1024**power:g} {units[power]}"


def make_panels(count: int, width: float = 5.2, height: float = 4.2) -> tuple[Figure, np.ndarray]:
    """``count`` panels side by side, the figure at least 7.5 in wide so that titles fit."""
    fig, axes = plt.subplots(1, count, figsize=(max(width * count, 7.5), height), squeeze=False, layout="constrained")
    return fig, axes[0]


def panel_grid(count: int, columns: int, width: float, height: float) -> tuple[Figure, list[plt.Axes]]:
    """``count`` panels in rows of at most ``columns``, so that many models make a grid that keeps
    its text legible where the report fits it to the page, not a strip; the spare cells are hidden."""
    across = max(1, min(count, columns))
    down = -(-count // across)
    fig, axes = plt.subplots(down, across, figsize=(max(width * across, 7.5), height * down), squeeze=False, layout="constrained")
    for ax in axes.flat[count:]:
        ax.set_axis_off()
    return fig, list(axes.flat[:count])


def legend_below(fig: Figure, axes: Iterable[plt.Axes], order: Callable[[str], Any] = str) -> None:
    """One legend for all panels, below them; each label once, sorted by ``order``."""
    entries = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    labels = sorted(entries, key=order)
    # in columns, so that a legend of a dozen entries does not push the panels into a strip
    columns = max(1, min(len(labels), int(fig.get_figwidth() // 3.6)))  # about 3.6 in a column of these labels
    while True:
        legend = fig.legend([entries[label] for label in labels], labels, loc="outside lower center", frameon=False, ncol=columns, fontsize="small")
        # long labels (a published source's name) in fewer columns, so that none is cut at the figure's edges
        if columns == 1 or legend.get_window_extent().width <= fig.bbox.width:
            return
        legend.remove()
        columns -= 1
