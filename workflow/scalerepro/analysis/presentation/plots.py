"""The study's figures, drawn from the aggregation's tables (``scalerepro.analysis.tables.aggregate``).

    python -m scalerepro.analysis.presentation.plots --tables results/tables --out results/plots

Every figure of ``figures.FIGURE_NAMES`` (the one list) is written as ``<name>.png`` and ``<name>.svg``. A figure whose
table has no data (sensitivity disabled, a CPU run without NVML energy, ...) is still written,
as a centred "not measured: <why>" note that its metadata repeats (``inputs.placeholder_metadata``),
so the report shows that one line rather than a missing or an empty image.
The figures show the tables' numbers as they are; only units change (fractions to percent).
"""

from __future__ import annotations

import itertools
import os
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from scalerepro.analysis import columns
from scalerepro.analysis.presentation.figures import FIGURE_NAMES
from scalerepro.analysis.presentation.inputs import placeholder_metadata, require_aggregation
from scalerepro.analysis.tables import loss_decomposition, scaling_model
from scalerepro.common.cli import OneLineErrorParser, error_boundary

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
    "scaling_model": scaling_model.SCALING_MODEL_COLUMNS,
    "loss_decomposition": loss_decomposition.LOSS_DECOMPOSITION_COLUMNS,
    "history": columns.HISTORY_COLUMNS,
    "versus_baseline": columns.VERSUS_COLUMNS,
}
MARKERS = ("D", "s", "^", "v", "P", "X", "*", "h")


class NotMeasured(Exception):
    """A figure has no data; the message says why."""


def read_tables(tables_dir: str | os.PathLike[str]) -> dict[str, pd.DataFrame]:
    """The tables the figures use; a missing or empty CSV reads as an empty frame with its columns."""
    tables = {}
    for name, names in COLUMNS.items():
        path = Path(tables_dir) / f"{name}.csv"
        empty = not path.is_file() or path.stat().st_size == 0
        frame = pd.DataFrame(columns=names) if empty else pd.read_csv(path, dtype={"variant": str})
        # a table written before a column was added reads it as empty, not as an error
        tables[name] = frame.reindex(columns=[*frame.columns, *(c for c in names if c not in frame.columns)])
    return tables


def _threshold(t: Tables, key: str) -> float | None:
    """The number a target line is drawn at, when the target ``key`` was given."""
    values = t["checks"].loc[t["checks"]["check"].eq(key), "threshold"].dropna()
    return float(values.iloc[0]) if len(values) else None


def _device(t: Tables) -> tuple[str, str]:
    """What the study's count counts, (one, many): ranks where every run with a record ran on a
    CPU (its "GPUs" are gloo ranks on one host's cores), else GPUs."""
    devices = set(t["runs"]["device_type"].dropna())
    return ("rank", "ranks") if devices == {"cpu"} else ("GPU", "GPUs")


def _count(n: float, device: tuple[str, str]) -> str:
    """2 -> "2 GPUs", 1 -> "1 rank"."""
    return f"{n:g} {device[0] if n == 1 else device[1]}"


def _gpu_axis(ax: plt.Axes, gpus: Sequence[float], device: tuple[str, str]) -> None:
    """A log2 GPU-count axis (ranks on a CPU), ticked at the counts measured."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(gpus))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(device[1])


def _plain_log_axis(axis: Axis) -> None:
    """A log axis labelled 1-2-5 in plain numbers (2,000, not 2 x 10^3)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
    axis.set_minor_formatter(NullFormatter())


def _bytes(value: float, _position: object = None) -> str:
    """1024 -> "1 KiB"."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = min(int(np.log2(max(value, 1)) // 10), len(units) - 1)
    return f"{value / 1024**power:g} {units[power]}"


def _panels(count: int, width: float = 5.2, height: float = 4.2) -> tuple[Figure, np.ndarray]:
    """``count`` panels side by side, the figure at least 7.5 in wide so that titles fit."""
    fig, axes = plt.subplots(1, count, figsize=(max(width * count, 7.5), height), squeeze=False, layout="constrained")
    return fig, axes[0]


def _legend_below(fig: Figure, axes: Sequence[plt.Axes], order: Callable[[str], object] = str) -> None:
    """One legend for all panels, below them; each label once, sorted by ``order``."""
    entries = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    labels = sorted(entries, key=order)
    # in columns, so that a legend of a dozen entries does not push the panels into a strip
    columns = max(1, min(len(labels), int(fig.get_figwidth() // 3.6)))  # about 3.6 in a column of these labels
    fig.legend([entries[label] for label in labels], labels, loc="outside lower center", frameon=False, ncol=columns, fontsize="small")


# --------------------------------------------------------------------------------------------
# The figures: each returns a Figure or raises NotMeasured
# --------------------------------------------------------------------------------------------


def throughput_vs_gpus(t: Tables) -> Figure:
    cells = t["scaling"].dropna(subset=["samples_per_s_median"])
    if cells.empty:
        raise NotMeasured("no completed strong- or weak-scaling run (scaling.csv has no throughput)")
    comparison = t["comparison"]
    # the references on the GPU the study ran on (a reference on another GPU is context only)
    published = comparison[comparison["metric"].eq("samples_per_s") & comparison["group"].eq("reproduction")]
    markers = dict(zip(sorted(published["source"].unique()), itertools.cycle(MARKERS)))
    colours = dict(zip(("strong", "weak"), sns.color_palette(n_colors=2)))
    models, device = sorted(cells["model"].unique()), _device(t)
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models):
        for study, group in cells[cells["model"].eq(model)].sort_values("gpus").groupby("study"):
            median, colour = group["samples_per_s_median"], colours[study]
            spread = [median - group["samples_per_s_min"], group["samples_per_s_max"] - median]
            label = f"{study} scaling: median, min-max over repeats"
            ax.errorbar(group["gpus"], median, yerr=spread, marker="o", capsize=4, color=colour, label=label)
            one = group.loc[group["gpus"].eq(1), "samples_per_s_median"]
            if len(one):  # ideal: thr(N) = N thr(1)
                label = f"{study} scaling: ideal linear from {_count(1, device)}"
                ax.plot(group["gpus"], one.iloc[0] * group["gpus"], ls="--", color=colour, alpha=0.6, label=label)
        for source, refs in published[published["model"].eq(model)].groupby("source"):
            label = f"published: {textwrap.shorten(source, 70, placeholder=' ...')}"
            ax.scatter(refs["gpus"], refs["published"], marker=markers[source], s=60, color="0.25", label=label)
        _gpu_axis(ax, [*cells["gpus"], *published.loc[published["model"].eq(model), "gpus"]], device)
        ax.set_yscale("log")
        _plain_log_axis(ax.yaxis)
        ax.set_ylabel(f"throughput (samples/s, all {device[1]})")
        ax.set_title(model)
    _legend_below(fig, axes, order=lambda label: (label.startswith("published"), "ideal" in label, label))
    fig.suptitle(f"Training throughput vs {device[1]}")
    return fig


def efficiency_vs_gpus(t: Tables) -> Figure:
    cells = t["scaling"].dropna(subset=["efficiency"])
    if cells.empty:
        raise NotMeasured("no scaling efficiency: it needs completed 1-GPU and N-GPU runs of a study and model")
    if cells["gpus"].max() <= 1:  # thr(1) / (1 x thr(1)) = 100 % by definition: nothing measured
        raise NotMeasured("every run used 1 GPU: efficiency at 1 GPU is 100 % by definition, so there is nothing to plot")
    fig, (ax,) = _panels(1, width=7.5, height=4.8)
    data = cells.assign(efficiency_pct=100 * cells["efficiency"])
    style = {"hue": "model", "style": "study", "markers": True, "markersize": 8, "errorbar": None}
    sns.lineplot(data, x="gpus", y="efficiency_pct", ax=ax, **style)
    ax.axhline(100, color="0.4", lw=1, label="ideal (100%)")
    target = _threshold(t, "strong_efficiency")
    if target is not None:
        ax.axhline(100 * target, color="tab:red", ls="--", lw=1.2, label=f"target, strong ({target:.0%})")
    _gpu_axis(ax, cells["gpus"], _device(t))
    ax.set_ylim(0, max(110, 100 * cells["efficiency"].max() + 10))
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Scaling efficiency: strong thr(N)/(N thr(1)), weak T(1)/T(N)")
    ax.legend(loc="lower left", fontsize="small")
    return fig


def weak_epoch_time(t: Tables) -> Figure:
    cells = t["scaling"][t["scaling"]["study"].eq("weak")].dropna(subset=["epoch_time_s"])
    if cells.empty:
        raise NotMeasured("no completed weak-scaling run (the weak study is disabled or did not finish)")
    fig, (ax,) = _panels(1, width=7.0, height=4.6)
    palette = dict(zip(sorted(cells["model"].unique()), sns.color_palette()))
    style = {"hue": "model", "palette": palette, "marker": "o", "markersize": 8, "errorbar": None}
    sns.lineplot(cells, x="gpus", y="epoch_time_s", ax=ax, **style)
    for model, one in cells[cells["gpus"].eq(1)].groupby("model"):  # ideal: T(N) = T(1)
        ax.axhline(one["epoch_time_s"].iloc[0], color=palette[model], ls="--", lw=1, label=f"{model}: ideal (constant)")
    device = _device(t)
    _gpu_axis(ax, cells["gpus"], device)
    ax.set_ylim(0, 1.15 * cells["epoch_time_s"].max())
    ax.set_ylabel("time per epoch (s, median)")
    ax.set_title(f"Weak scaling: time per epoch (per-{device[0]} batch and data fixed)")
    ax.legend(fontsize="small")
    return fig


def sensitivity_heatmap(t: Tables) -> Figure:
    if t["sensitivity"].empty:
        raise NotMeasured("the sensitivity study is not part of this study (sensitivity.csv is empty)")
    cells = t["sensitivity"].dropna(subset=["samples_per_s_median"])
    if cells.empty:
        raise NotMeasured("no sensitivity run completed")
    panels, device = list(cells.groupby(["model", "gpus", "precision"])), _device(t)
    fig, axes = _panels(len(panels), width=5.5, height=4.4)
    # One scale from 0 to the best cell, shared by the panels: a colour step is a share of the
    # throughput, so cells a few per cent apart (within their repeats' noise) read as alike, not
    # as the two ends of the colour map that a min-to-max scale would paint them.
    scale = {"vmin": 0.0, "vmax": cells["samples_per_s_median"].max()}
    for ax, ((model, gpus, precision), group) in zip(axes, panels):
        grid = group.pivot_table(index="per_gpu_batch", columns="bucket_cap_mb", values="samples_per_s_median")
        spread = group.pivot_table(index="per_gpu_batch", columns="bucket_cap_mb", values="samples_per_s_cv", dropna=False)
        spread = spread.reindex(index=grid.index, columns=grid.columns)
        labels = [[_cell_note(value, cv) for value, cv in zip(values, cvs)] for values, cvs in zip(grid.to_numpy(), spread.to_numpy())]
        grid.columns = [f"{bucket:g}" for bucket in grid.columns]
        colourbar = {"label": "samples/s (median; scale from 0)"}
        sns.heatmap(grid, annot=np.array(labels, dtype=object), fmt="", cmap="viridis", cbar_kws=colourbar, ax=ax, **scale)
        ax.invert_yaxis()
        ax.set_xlabel("DDP bucket size (MB)")
        ax.set_ylabel(f"batch per {device[0]} (samples)")
        ax.set_title(f"{model}, {_count(gpus, device)}, {precision}")
    fig.suptitle(f"Sensitivity: throughput by DDP bucket size and batch per {device[0]}")
    return fig


def _cell_note(median: float, cv: float) -> str:
    """A heatmap cell's text: the median, and the CV of its repeats where there are several."""
    if pd.isna(median):
        return ""
    return f"{median:,.0f}" + ("" if pd.isna(cv) else f"\nCV {100 * cv:.0f}%")


def ablation_gain(t: Tables) -> Figure:
    table = t["ablation"]
    if table.empty:
        raise NotMeasured("the ablation study is not part of this study (ablation.csv is empty)")
    if table["gain"].isna().all():
        raise NotMeasured("no gain over the baseline: " + "; ".join(sorted(set(table["note"].dropna()))))
    bars = table[table["variant"].ne("baseline")].assign(
        gain_pct=lambda f: 100 * f["gain"], low_pct=lambda f: 100 * f["gain_ci_low"], high_pct=lambda f: 100 * f["gain_ci_high"]
    )
    variants, models = list(dict.fromkeys(bars["variant"])), list(dict.fromkeys(bars["model"]))
    fig, (ax,) = _panels(1, width=max(6.0, 1.3 * len(variants) + 2), height=4.6)
    drawn = bars.assign(drawn=bars["gain_pct"].fillna(0))  # a variant without a gain: no bar, a label
    sns.barplot(drawn, x="variant", y="drawn", hue="model", order=variants, hue_order=models, ax=ax)
    interval = None
    for container, model in zip(ax.containers, models):
        cells = bars[bars["model"].eq(model)].set_index("variant").reindex(variants)
        # each bar with its 95 % interval (bootstrap over the repeats); one repeat has none: "n=1"
        for patch, cell in zip(container.patches, cells.itertuples()):
            if pd.notna(cell.gain_pct) and pd.notna(cell.low_pct) and pd.notna(cell.high_pct):
                x = patch.get_x() + patch.get_width() / 2
                yerr = [[cell.gain_pct - cell.low_pct], [cell.high_pct - cell.gain_pct]]
                interval = ax.errorbar(x, cell.gain_pct, yerr=yerr, fmt="none", ecolor="0.15", elinewidth=1.2, capsize=5, zorder=3)
        labels = [
            "not measured" if pd.isna(cell.gain_pct) else f"{cell.gain_pct:+.1f}%" + ("" if pd.notna(cell.low_pct) else " (n=1)")
            for cell in cells.itertuples()
        ]
        # in the bar, on a white ground: legible where the interval's line crosses it
        ax.bar_label(container, labels=labels, fontsize="small", label_type="center", bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
    if interval is not None:
        interval.set_label("95 % interval of the gain (bootstrap over repeats)")
    ax.axhline(0, color="0.3", lw=1)
    target = _threshold(t, "optimisation_gain")  # the check's name in checks.csv
    if target is not None:
        ax.axhline(100 * target, color="tab:red", ls="--", lw=1.2, label=f"target ({target:+.0%})")
    ax.set_xlabel('variant ("all": every optimisation together)')
    ax.set_ylabel("throughput gain over baseline (%)")
    ax.set_title(f"Ablation at {_count(bars['gpus'].iloc[0], _device(t))}: gain over the baseline")
    ax.tick_params(axis="x", labelrotation=20)
    if ax.get_legend() is not None:  # seaborn's, inside the axes, where the intervals reach
        ax.get_legend().remove()
    _legend_below(fig, [ax])
    return fig


def _curve_runs(runs: pd.DataFrame, device: tuple[str, str]) -> pd.DataFrame:
    """Strong scaling, repeat 1, at 1 GPU and at each model's largest GPU count, with a label."""
    strong = runs[runs["study"].eq("strong") & runs["repeat"].eq(1) & runs["status"].ne("missing")]
    chosen = strong[strong["gpus"].eq(1) | strong["gpus"].eq(strong.groupby("model")["gpus"].transform("max"))]
    # astype(str): with no such run the empty Series would keep gpus' integer dtype, which "+" refuses
    label = chosen["gpus"].map(lambda n: _count(n, device)).astype(str)
    return chosen.assign(curve=label.where(chosen["status"].eq("ok"), label + " (" + chosen["status"] + ")"))


# A run has shown learning when its training loss fell by this share of its first logged value. A
# fresh classifier starts near chance (ln C), so a loss still within 10 % of its start after the
# run's last step is chance-level noise: the run was too short to learn (or did not learn).
LEARNED_LOSS_DROP = 0.10


def _not_learning(t: Tables, run_ids: Sequence[str], detail: bool) -> str | None:
    """Why the curves of ``run_ids`` would show noise, not learning: none of their training losses
    fell by LEARNED_LOSS_DROP (with ``detail``, the figures run by run); None when one did, or
    none logged a loss."""
    losses = t["loss_log"].dropna(subset=["loss"])
    losses = losses[losses["run_id"].isin(run_ids)].sort_values("step")
    if losses.empty:
        return None
    spans = losses.groupby("run_id").agg(first=("loss", "first"), last=("loss", "last"), start=("step", "first"), end=("step", "last"))
    drop = 1 - spans["last"] / spans["first"]
    if (drop >= LEARNED_LOSS_DROP).any():
        return None
    most = f"at most {max(drop.max(), 0):.1%}"
    if not detail:
        return f"the runs are too short to learn (no training loss fell by {LEARNED_LOSS_DROP:.0%}, {most}: see the loss curves), so this would plot chance-level noise"
    runs = "; ".join(f"{run} {row.first:.3g} → {row.last:.3g} over steps {row.start:g}–{row.end:g}" for run, row in spans.iterrows())
    return (
        f"the runs are too short to learn (or did not learn): no training loss fell by {LEARNED_LOSS_DROP:.0%} of its first logged value "
        f"({most}: {runs}), so the curves would plot chance-level noise"
    )


def _curves(t: Tables, table: str, y: str, scale: float, ylabel: str, title: str) -> Figure:
    device = _device(t)
    chosen = _curve_runs(t["runs"], device)[["run_id", "model", "gpus", "curve"]]
    points = t[table].dropna(subset=[y]).merge(chosen, on="run_id")
    if points.empty:
        raise NotMeasured(
            f"no strong-scaling run (repeat 1, 1 {device[0]} or the largest count) recorded {y.replace('_', ' ')}"
        )
    short = _not_learning(t, points["run_id"].unique(), detail=table == "loss_log")
    if short:
        raise NotMeasured(short)
    models = sorted(points["model"].unique())
    fig, axes = _panels(len(models))
    for ax, model in zip(axes, models):
        group = points[points["model"].eq(model)].sort_values(["gpus", "step"])
        data = group.assign(value=scale * group[y])
        sns.lineplot(data, x="step", y="value", hue="curve", marker="o", errorbar=None, ax=ax)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.set_title(model)
        ax.legend(title=None, fontsize="small")
    fig.suptitle(title)
    return fig


def loss_curves(t: Tables) -> Figure:
    title = f"Training loss, strong scaling: 1 vs N {_device(t)[1]} (repeat 1)"
    return _curves(t, "loss_log", "loss", 1.0, "training loss", title)


def accuracy_curves(t: Tables) -> Figure:
    title = f"Evaluation accuracy, strong scaling: 1 vs N {_device(t)[1]} (repeat 1)"
    return _curves(t, "epochs", "eval_accuracy", 100.0, "evaluation accuracy (%)", title)


def energy_per_sample(t: Tables) -> Figure:
    runs = t["runs"]
    scaled = runs[runs["study"].isin(["strong", "weak"]) & runs["counts"].astype(bool)]
    measured = scaled.dropna(subset=["energy_per_sample_j"])
    if measured.empty:
        others = runs[runs["counts"].astype(bool) & runs["energy_per_sample_j"].notna()]
        if len(others):  # the energy is measured, only not over GPU counts: say where it is, not that it is not
            raise NotMeasured(f"not drawn: it sets energy against the GPU counts of the strong- and weak-scaling runs, and none of "
                              f"them recorded energy; the energy of the {len(others)} other counted runs is in the table below")
        reasons = "; ".join(sorted(set(scaled["nvml_reason"].dropna())))
        raise NotMeasured("no completed scaling run recorded GPU energy" + (f" ({reasons})" if reasons else ""))
    cells = measured.groupby(["study", "model", "gpus"], as_index=False)[["energy_per_sample_j", "energy_per_sample_net_j"]].median()
    # gross: all the GPUs drew over the measured steps; net: less their idle power x time
    long = cells.melt(["study", "model", "gpus"], ["energy_per_sample_j", "energy_per_sample_net_j"], var_name="energy",
                      value_name="joules").dropna(subset=["joules"])  # fmt: skip
    long["series"] = long["model"] + ", " + long["study"]
    long["energy"] = long["energy"].map({"energy_per_sample_j": "gross", "energy_per_sample_net_j": "net of idle"})
    fig, (ax,) = _panels(1, width=7.0, height=4.6)
    style = {"hue": "series", "style": "energy", "markers": True, "markersize": 8, "errorbar": None}
    sns.lineplot(long, x="gpus", y="joules", ax=ax, **style)
    _gpu_axis(ax, cells["gpus"], _device(t))
    ax.set_ylim(0, 1.15 * long["joules"].max())
    ax.set_ylabel("GPU energy per sample (J, median over repeats)")
    ax.set_title("Energy per training sample vs GPUs")
    return fig


def busbw_vs_size(t: Tables) -> Figure:
    comm = t["communication"].dropna(subset=["busbw_gbps"]).sort_values(["gpus", "size_bytes"])
    if comm.empty:
        raise NotMeasured("no all-reduce benchmark (no count of more than one GPU or rank, or the communication benchmark is disabled)")
    comm = comm[comm["gpus"] > 1]
    if comm.empty:  # one rank: busbw = algbw x 2(N-1)/N = 0, nothing crossed a link
        raise NotMeasured("only a 1-GPU all-reduce was measured: with one rank no byte crosses a link, its bus bandwidth is 0 by definition")
    where = comm["nodes"].map("{:g} node(s), ".format) + comm["backend"]
    device = _device(t)
    comm = comm.assign(series=comm["gpus"].map(lambda n: _count(n, device) + ", ") + where)
    fig, (ax,) = _panels(1, width=7.5, height=4.8)
    sns.lineplot(comm, x="size_bytes", y="busbw_gbps", hue="series", marker="o", errorbar=None, ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_bytes))
    ax.set_xlabel("message size (float32 all-reduce)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("All-reduce bus bandwidth vs message size (busbw = size/t x 2(N-1)/N)")
    ax.legend(title=None, fontsize="small")
    return fig


def profile_breakdown(t: Tables) -> Figure:
    if t["profiling"].empty:
        raise NotMeasured("no run was profiled: there is no profiling table (the profiling section says why)")
    runs = t["profiling"].dropna(subset=["window_s"]).reset_index(drop=True)
    if runs.empty:
        raise NotMeasured("no profiled run has a timeline to break down")
    fig, (ax,) = _panels(1, width=max(6.5, 1.6 * len(runs) + 3), height=5.0)
    colours = dict(zip(columns.CATEGORIES, ("tab:green", "tab:red", "tab:orange", "0.75")))
    names = {"compute": "compute", "exposed_comm": "exposed communication", "data_wait": "data wait", "idle": "idle"}
    bottom = np.zeros(len(runs))
    for category in columns.CATEGORIES:  # compute + exposed comm + data wait + idle = the whole window
        share = 100 * runs[f"{category}_fraction"].fillna(0).to_numpy()
        ax.bar(runs.index, share, width=0.6, bottom=bottom, color=colours[category], label=names[category])
        bottom += share
    for x, row in runs.iterrows():
        overlap = "no comm" if pd.isna(row["overlap_fraction"]) else f"overlap {row['overlap_fraction']:.0%}"
        # a whole-capture window (no step ranges) gives a guess, and the figure says so
        provisional = " (provisional)" if str(row.get("provisional")).lower() == "true" else ""
        ax.text(x, 101, f"{row['classification']}{provisional}\n{overlap}", ha="center", va="bottom", fontsize="x-small")
    ax.set_xticks(runs.index, [f"{r.run_id}\n{r.source}" for r in runs.itertuples()], fontsize="x-small")
    ax.set_ylim(0, 118)
    ax.set_xlim(-0.7, len(runs) - 0.3)
    ax.set_ylabel("share of the profiling window (%)")
    ax.set_title("Where the profiled steps went (overlap = comm hidden behind compute)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize="small", frameon=False)
    return fig


ROOFLINE_NAMED = 10  # kernels named in the roofline figure, the longest first


def _shortened(name: str, length: int) -> str:
    return name if len(name) <= length else name[: length - 1] + "…"


def roofline(t: Tables) -> Figure:
    roof = t["profiling_roofline"].dropna(subset=["arithmetic_intensity", "achieved_flops_per_s"])
    roof = roof[(roof["arithmetic_intensity"] > 0) & (roof["achieved_flops_per_s"] > 0)]
    if roof.empty and len(t["profiling_roofline"]):  # ncu profiled kernels, none with a FLOP roof: say so, not "no profile"
        raise NotMeasured(f"none of the {len(t['profiling_roofline'])} kernels Nsight Compute profiled has a FLOP roof to set it under "
                          "(no floating-point work, or tensor-core work not counted): see the roofline table")
    if roof.empty:
        raise NotMeasured(
            "no Nsight Compute kernel profile (the torch.profiler fallback has no hardware counters; "
            "ncu runs with profiling.tool auto or ncu on a GPU)"
        )
    fig, (ax,) = _panels(1, width=7.5, height=5.2)
    lo, hi = roof["arithmetic_intensity"].min() / 10, roof["arithmetic_intensity"].max() * 10
    for (peak, bandwidth), _ in roof.groupby(["peak_flops_per_s", "peak_dram_bytes_per_s"]):
        x = np.logspace(np.log10(min(lo, peak / bandwidth / 10)), np.log10(max(hi, peak / bandwidth * 10)), 200)
        ax.plot(x, np.minimum(peak, x * bandwidth), color="0.3", lw=1.2, label=f"roof: min({peak / 1e12:g} TFLOP/s, AI x {bandwidth / 1e12:g} TB/s)")
    # numbers on the longest kernels only: a step profiled whole has a couple of hundred, whose names
    # would cover one another, so each of these is numbered on the plot and named in a key below it
    # (the report's roofline table lists more of them, profiling_roofline.csv every one)
    longest = roof.nlargest(ROOFLINE_NAMED, "duration_s").index if "duration_s" in roof.columns else roof.index[:ROOFLINE_NAMED]
    number = {index: rank for rank, index in enumerate(longest, start=1)}
    for (run_id, kind), group in roof.groupby(["run_id", "flops_source"]):
        ax.scatter(group["arithmetic_intensity"], group["achieved_flops_per_s"], s=50, label=f"{run_id}: {kind}")
        for row in group.itertuples():
            if row.Index in number:
                ax.annotate(str(number[row.Index]), (row.arithmetic_intensity, row.achieved_flops_per_s),
                            fontsize="x-small", fontweight="bold", xytext=(4, 2), textcoords="offset points")  # fmt: skip
    key = [f"{rank}  {_shortened(roof.at[index, 'kernel'], 48)}" for index, rank in number.items()]
    blank = [Line2D([], [], linestyle="none")] * len(key)
    fig.legend(blank, key, loc="outside lower center", ncol=2, fontsize="x-small", frameon=False, handlelength=0, handletextpad=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"Roofline of the kernels (Nsight Compute): {len(roof)} kernels, the {min(len(roof), ROOFLINE_NAMED)} longest numbered")
    ax.legend(fontsize="x-small")
    return fig


def predicted_vs_measured_efficiency(t: Tables) -> Figure:
    table = t["scaling_model"]
    predicted = table.dropna(subset=["efficiency_predicted"])
    if predicted.empty:
        notes = "; ".join(sorted(set(table["note"].dropna()))) if len(table) else "scaling_model.csv has no rows"
        raise NotMeasured(f"no scaling-model prediction ({notes})")
    studies = sorted(predicted["study"].unique())
    fig, axes = _panels(len(studies), width=6.0, height=4.6)
    colours = dict(zip(sorted(table["model"].unique()), sns.color_palette()))
    for ax, study in zip(axes, studies):
        rows = table[table["study"].eq(study)].sort_values("gpus")
        for model, group in rows.groupby("model"):
            colour, line = colours[model], group.dropna(subset=["efficiency_predicted"])
            # one line through every predicted count: E = t(1) / (N t(N)) strong, t(1) / t(N) weak
            ax.plot(line["gpus"], 100 * line["efficiency_predicted"], color=colour, ls="--", marker=".", label=f"{model}: predicted (alpha-beta model)")
            measured = group.dropna(subset=["efficiency_measured"])
            ax.scatter(measured["gpus"], 100 * measured["efficiency_measured"], color=colour, s=60, zorder=3, label=f"{model}: measured")
        beyond = rows.loc[rows["basis"].eq("predicted"), "gpus"]
        if len(beyond):  # the counts beyond the study's hardware: prediction alone
            low = rows.loc[rows["basis"].eq("measured"), "gpus"].max()
            ax.axvspan(low * 1.2, beyond.max() * 1.2, color="0.9", zorder=0)
            clusters = sorted(set(rows["cluster"].dropna().astype(str)) - {""}) if "cluster" in rows.columns else []
            links = f"on the {', '.join(clusters)} preset" if clusters else "links from references.yaml"
            ax.text(np.sqrt(low * beyond.max()) * 1.1, 5, f"prediction only:\nbeyond the hardware measured,\n{links}",
                    ha="center", va="bottom", fontsize="small", color="0.3")  # fmt: skip
        ax.axhline(100, color="0.4", lw=1)
        _gpu_axis(ax, rows["gpus"], _device(t))
        top = 100 * np.nanmax(rows[["efficiency_measured", "efficiency_predicted"]].to_numpy(dtype=float))
        ax.set_ylim(0, max(110, top + 10))
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_title(f"{study} scaling")
    _legend_below(fig, axes)
    fig.suptitle("Scaling efficiency: measured vs the alpha-beta model's prediction")
    return fig


WATERFALL_STEPS = (
    ("compute_inflation", "compute\ninflation"), ("exposed_comm", "exposed\ncomm"), ("straggler_wait", "straggler\nwait"),
    ("data_stall", "data\nstall"), ("unexplained", "unex-\nplained"),
)  # fmt: skip


def loss_waterfall(t: Tables) -> Figure:
    """Per multi-rank cell, from the ideal step to the measured one in % of the measured step: each
    measured part of the loss (loss_decomposition.csv) stacked on the last, with the 95 % interval
    over repeats (the median run's parts); the largest named part is the bottleneck."""
    table = t["loss_decomposition"].dropna(subset=["compute_inflation"])
    if table.empty:
        notes = "; ".join(sorted(set(t["loss_decomposition"]["note"].dropna()))) or "no multi-rank strong or weak cell completed"
        raise NotMeasured(f"no loss split into parts ({notes})")
    table = table.sort_values(["study", "model", "gpus"])
    columns = min(len(table), 3)
    rows_n = -(-len(table) // columns)
    fig, axes = plt.subplots(rows_n, columns, figsize=(5.4 * columns, 4.4 * rows_n), squeeze=False, layout="constrained")
    device = _device(t)
    colours = dict(zip([key for key, _ in WATERFALL_STEPS], sns.color_palette("deep")[1:6]))
    for ax, row in zip(axes.flat, table.itertuples()):
        ideal = 100 * row.ideal_step_s / row.step_s  # the ideal step in % of the measured one
        labels, level = ["ideal"], ideal
        ax.bar(0, ideal, color="0.75")
        ax.text(0, ideal, f"{ideal:.0f}", ha="center", va="bottom", fontsize="small")
        for x, (key, label) in enumerate(WATERFALL_STEPS, start=1):
            height = 100 * getattr(row, key)  # the unexplained rest too: what takes the steps to 100 %
            bottom = level if height >= 0 else level + height
            ax.bar(x, abs(height), bottom=bottom, color=colours[key], hatch="//" if key == "unexplained" else None, edgecolor="white")
            low, high = getattr(row, f"{key}_ci_low"), getattr(row, f"{key}_ci_high")
            top = max(level, level + height)
            if np.isfinite(low) and np.isfinite(high):  # the part's interval over repeats, at its top
                below, above = 100 * max(getattr(row, key) - low, 0), 100 * max(high - getattr(row, key), 0)
                ax.errorbar(x, level + height, yerr=[[below], [above]], color="0.2", capsize=3, lw=1)
                top = max(top, level + height + above)
            ax.text(x, top + 1, f"{height:+.0f}", ha="center", va="bottom", fontsize="small")
            level += height
            labels.append(label)
        ax.bar(len(labels), 100, color="0.35")
        labels.append("measured")
        ax.set_xticks(range(len(labels)), labels, fontsize="x-small")
        ax.set_ylim(0, 120)
        ax.set_ylabel("% of the measured step")
        bottleneck = str(row.bottleneck).split(":")[0] if isinstance(row.bottleneck, str) else "no named part"
        ax.set_title(f"{row.model}, {row.study}, {_count(row.gpus, device)} (n={row.repeats:g})\n"
                     f"E = {row.efficiency:.0%}; {bottleneck}", fontsize="medium")  # fmt: skip
    for ax in list(axes.flat)[len(table):]:
        ax.set_axis_off()
    fig.suptitle("Why not faster: from the ideal step to the measured one, part by part")
    return fig


# name -> drawing function, for every name of the one list (a name without a function here
# fails this import with that name)
FIGURE_DRAWERS: dict[str, Callable[[Tables], Figure]] = {name: globals()[name] for name in FIGURE_NAMES}
PLOT_NAMES = tuple(FIGURE_DRAWERS)  # the workflow declares these as outputs


def _cell_label(row: Any) -> str:
    variant = f" {row.variant}" if isinstance(row.variant, str) and row.variant else ""
    return f"{row.model}, {row.gpus:g} GPU{'s' if row.gpus != 1 else ''} ({row.study}{variant}, {row.precision}, batch {row.per_gpu_batch:g}/GPU)"


def history(t: Tables) -> Figure:
    """Each headline cell's median samples/s (min-max bar) in every stored study up to this one,
    oldest first; marker and colour by cluster and device, so that studies on different hardware
    are never read as one series."""
    table = t["history"].dropna(subset=["samples_per_s_median"])
    if table["study_id"].nunique() < 2:
        raise NotMeasured("fewer than two stored studies have this study's headline cells (on a first study there is no history yet)")
    table = table.assign(
        _started=pd.to_datetime(table["started_at"], utc=True, format="ISO8601"),
        _where=table["cluster"].astype(str) + " · " + table["device_name"].astype(str),
    )
    order = table.drop_duplicates("study_id").sort_values("_started")["study_id"].tolist()
    table["_x"] = table["study_id"].map({study: index for index, study in enumerate(order)})
    labels = table.drop_duplicates("study_id").set_index("study_id")
    ticks = [
        f"{labels.loc[s, '_started']:%Y-%m-%d %H:%M:%S}\n{str(labels.loc[s, 'git_commit'])[:7]}" for s in order
    ]  # fmt: skip
    cells = list(table.groupby(list(columns.CELL_KEYS), sort=True, dropna=False))
    fig, axes = _panels(len(cells), width=max(4.0, 0.9 * len(order) + 2.5), height=4.4)
    styles = dict(zip(sorted(table["_where"].unique()), zip(itertools.cycle(MARKERS), sns.color_palette(n_colors=8))))
    for ax, (_, cell) in zip(axes, cells):
        for where, group in cell.groupby("_where"):
            marker, colour = styles[where]
            error = [group["samples_per_s_median"] - group["samples_per_s_min"], group["samples_per_s_max"] - group["samples_per_s_median"]]
            ax.errorbar(group["_x"], group["samples_per_s_median"], yerr=error, fmt=marker, color=colour, capsize=3, label=where)
        this = cell[cell["this_study"].astype(str).str.lower().eq("true")]
        ax.scatter(this["_x"], this["samples_per_s_median"], s=160, facecolors="none", edgecolors="black", label="this study")
        ax.set_xticks(range(len(order)), ticks, fontsize="x-small", rotation=30, ha="right")
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("samples/s (median; bar: min-max)")
        ax.set_title(_cell_label(cell.iloc[0]), fontsize="small")
    _legend_below(fig, axes)
    fig.suptitle("Headline cells across the stored studies (x: study start, commit)")
    return fig


def versus_baseline(t: Tables) -> Figure:
    """Candidate / baseline ratio of median samples/s per matched cell, with its bootstrap
    interval; the band is the threshold within which no change is reported."""
    table = t["versus_baseline"].dropna(subset=["ratio"]).reset_index(drop=True)
    if table.empty:
        raise NotMeasured("no cell was measured in both studies (or the compare rule did not run)")
    fig, (ax,) = _panels(1, width=9.0, height=max(3.2, 0.55 * len(table) + 2.0))
    colours = {"faster": "tab:green", "slower": "tab:red"}
    threshold = float(table["threshold"].iloc[0])
    ax.axvspan(1 - threshold, 1 + threshold, color="0.9", label=f"within ±{threshold:.0%}: no change reported")
    ax.axvline(1.0, color="0.3", lw=1)
    for y, row in table.iterrows():
        colour = colours.get(row["verdict"], "0.35")
        if pd.notna(row["ratio_low"]):
            ax.errorbar(row["ratio"], y, xerr=[[row["ratio"] - row["ratio_low"]], [row["ratio_high"] - row["ratio"]]],
                        fmt="o", color=colour, capsize=3)  # fmt: skip
        else:
            ax.plot(row["ratio"], y, "x", color=colour)  # too few repeats: no interval
        ax.annotate(f"{row['verdict']} (n {row['baseline_repeats']:g} vs {row['candidate_repeats']:g})", (row["ratio"], y),
                    xytext=(0, 7), textcoords="offset points", ha="center", fontsize="x-small", color=colour)  # fmt: skip
    ax.set_yticks(table.index, [_cell_label(row) for row in table.itertuples()], fontsize="x-small")
    ax.set_ylim(len(table) - 0.5, -0.8)  # first cell on top, room for its label
    level = 100 * float(table["confidence"].iloc[0])
    ax.set_xlabel(f"candidate / baseline, median samples/s\n(bar: {level:g} % bootstrap interval)")
    ax.set_title("Versus baseline (> 1: faster)")
    _legend_below(fig, [ax])
    return fig


# Figures of the results store (scalerepro.analysis.history.store, scalerepro.analysis.history.compare): drawn by their own
# rules (--only), since they read the store's tables, which the aggregation does not write.
STORE_FIGURES: dict[str, Callable[[Tables], Figure]] = {"history": history, "versus_baseline": versus_baseline}


def placeholder(name: str, why: str) -> Figure:
    fig, ax = plt.subplots(figsize=(7.5, 3.0), layout="constrained")
    ax.set_axis_off()
    ax.set_title(name.replace("_", " "))
    note = textwrap.fill(f"not measured: {why}", 70)
    ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.35")
    return fig


def draw(
    tables: Tables, out_dir: str | os.PathLike[str], figures: Mapping[str, Callable[[Tables], Figure]] = FIGURE_DRAWERS
) -> dict[str, str]:
    """Write each of ``figures`` as PNG and SVG into ``out_dir``; returns name -> "drawn" or the note."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt.switch_backend("agg")  # files only, no display
    sns.set_theme(context="notebook", style="whitegrid")
    plt.rcParams["svg.hashsalt"] = "scalerepro"  # the same SVG ids on every run
    outcome = {}
    for name, figure in figures.items():
        metadata = {"svg": {"Date": None}, "png": {"Software": None}}
        try:
            fig, outcome[name] = figure(tables), "drawn"
        except NotMeasured as hole:
            fig, outcome[name] = placeholder(name, str(hole)), f"not measured: {hole}"
            metadata = placeholder_metadata(str(hole))  # the report shows it as one line, not an empty image
        fig.savefig(out / f"{name}.png", dpi=150, metadata=metadata["png"])
        fig.savefig(out / f"{name}.svg", metadata=metadata["svg"])
        plt.close(fig)
    return outcome


_PROG = "scalerepro.analysis.presentation.plots"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--tables", required=True, type=Path, help="directory of the aggregation's CSV tables")
    parser.add_argument("--out", required=True, type=Path, help="directory for <figure>.png and <figure>.svg")
    parser.add_argument("--only", nargs="+", choices=[*FIGURE_DRAWERS, *STORE_FIGURES], help="draw these figures only")
    args = parser.parse_args(argv)
    every = {**FIGURE_DRAWERS, **STORE_FIGURES}
    figures = {name: every[name] for name in args.only} if args.only else FIGURE_DRAWERS
    require_aggregation(args.tables, runs=any(name in FIGURE_DRAWERS for name in figures))
    for name, outcome in draw(read_tables(args.tables), args.out, figures).items():
        print(f"plots: {name}: {outcome}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
