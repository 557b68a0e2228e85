"""The study's figures, drawn from the aggregation's tables (``scalerepro.analysis.tables.aggregate``).

    python -m scalerepro.analysis.presentation.plots --tables results/tables --out results/plots

Every figure of ``figure_names.FIGURE_NAMES`` (the one list) is written as ``<name>.png`` and ``<name>.svg``. A figure whose
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
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from scalerepro.analysis import columns
from scalerepro.analysis.presentation import model_plots, profile_plots
from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES
from scalerepro.analysis.presentation.inputs import placeholder_metadata, require_aggregation
from scalerepro.analysis.presentation.plot_basics import (
    MARKERS,
    NotMeasured,
    Tables,
    bytes_label,
    count_label,
    device_of,
    gpu_axis,
    legend_below,
    make_panels,
    panel_grid,
    plain_log_axis,
    read_tables,
    threshold_of,
)
from scalerepro.common.cli import OneLineErrorParser, error_boundary
from scalerepro.record.columns import LOSS_SPIKE_FACTOR

# --------------------------------------------------------------------------------------------
# The figures: each returns a Figure or raises NotMeasured
# --------------------------------------------------------------------------------------------


def throughput_vs_gpus(t: Tables) -> Figure:
    cells = t["scaling"].dropna(subset=["samples_per_s_median"])
    if cells.empty:
        raise NotMeasured("no completed strong- or weak-scaling run (scaling.csv has no throughput)")
    device = device_of(t)
    if cells["gpus"].nunique() < 2:  # one point a model: a line against the count would draw nothing
        raise NotMeasured(
            f"every scaling run used {count_label(cells['gpus'].iloc[0], device)}: throughput against the {device[0]} count needs "
            "two counts or more; each model's throughput is in the headline and the per-run table"
        )
    comparison = t["comparison"]
    # the references on the GPU the study ran on (a reference on another GPU is context only)
    published = comparison[comparison["metric"].eq("samples_per_s") & comparison["group"].eq("reproduction")]
    markers = dict(zip(sorted(published["source"].unique()), itertools.cycle(MARKERS)))
    colours = dict(zip(("strong", "weak"), sns.color_palette(n_colors=2)))
    models = sorted(cells["model"].unique())
    fig, axes = panel_grid(len(models), columns=2, width=5.2, height=4.2)
    for ax, model in zip(axes, models):
        for study, group in cells[cells["model"].eq(model)].sort_values("gpus").groupby("study"):
            median, colour = group["samples_per_s_median"], colours[study]
            spread = [median - group["samples_per_s_min"], group["samples_per_s_max"] - median]
            label = f"{study} scaling: median, min-max over repeats"
            ax.errorbar(group["gpus"], median, yerr=spread, marker="o", capsize=4, color=colour, label=label)
            one = group.loc[group["gpus"].eq(1), "samples_per_s_median"]
            if len(one):  # ideal: thr(N) = N thr(1)
                label = f"{study} scaling: ideal linear from {count_label(1, device)}"
                ax.plot(group["gpus"], one.iloc[0] * group["gpus"], ls="--", color=colour, alpha=0.6, label=label)
        for source, refs in published[published["model"].eq(model)].groupby("source"):
            label = f"published: {textwrap.shorten(source, 70, placeholder=' ...')}"
            ax.scatter(refs["gpus"], refs["published"], marker=markers[source], s=60, color="0.25", label=label)
        gpu_axis(ax, [*cells["gpus"], *published.loc[published["model"].eq(model), "gpus"]], device)
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
        ax.set_ylabel(f"throughput (samples/s, all {device[1]})")
        ax.set_title(model)
    legend_below(fig, axes, order=lambda label: (label.startswith("published"), "ideal" in label, label))
    fig.suptitle(f"Training throughput vs {device[1]}")
    return fig


def efficiency_vs_gpus(t: Tables) -> Figure:
    cells = t["scaling"].dropna(subset=["efficiency"])
    if cells.empty:
        raise NotMeasured("no scaling efficiency: it needs completed 1-GPU and N-GPU runs of a study and model")
    if cells["gpus"].max() <= 1:  # thr(1) / (1 x thr(1)) = 100 % by definition: nothing measured
        raise NotMeasured("every run used 1 GPU: efficiency at 1 GPU is 100 % by definition, so there is nothing to plot")
    fig, (ax,) = make_panels(1, width=7.5, height=4.8)
    data = cells.assign(efficiency_pct=100 * cells["efficiency"])
    style = {"hue": "model", "style": "study", "markers": True, "markersize": 8, "errorbar": None}
    sns.lineplot(data, x="gpus", y="efficiency_pct", ax=ax, **style)
    ax.axhline(100, color="0.4", lw=1, label="ideal (100%)")
    target = threshold_of(t, "strong_efficiency")
    if target is not None:
        ax.axhline(100 * target, color="tab:red", ls="--", lw=1.2, label=f"target, strong ({target:.0%})")
    gpu_axis(ax, cells["gpus"], device_of(t))
    ax.set_ylim(0, max(110, 100 * cells["efficiency"].max() + 10))
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Scaling efficiency: strong thr(N)/(N thr(1)), weak T(1)/T(N)")
    ax.legend(loc="lower left", fontsize="small")
    return fig


def weak_epoch_time(t: Tables) -> Figure:
    cells = t["scaling"][t["scaling"]["study"].eq("weak")].dropna(subset=["epoch_time_s"])
    if cells.empty:
        raise NotMeasured("no completed weak-scaling run (the weak study is disabled or did not finish)")
    fig, (ax,) = make_panels(1, width=7.0, height=4.6)
    palette = dict(zip(sorted(cells["model"].unique()), sns.color_palette()))
    style = {"hue": "model", "palette": palette, "marker": "o", "markersize": 8, "errorbar": None}
    sns.lineplot(cells, x="gpus", y="epoch_time_s", ax=ax, **style)
    for model, one in cells[cells["gpus"].eq(1)].groupby("model"):  # ideal: T(N) = T(1)
        ax.axhline(one["epoch_time_s"].iloc[0], color=palette[model], ls="--", lw=1, label=f"{model}: ideal (constant)")
    device = device_of(t)
    gpu_axis(ax, cells["gpus"], device)
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
    panels, device = list(cells.groupby(["model", "gpus", "precision"])), device_of(t)
    fig, axes = make_panels(len(panels), width=5.5, height=4.4)
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
        ax.set_title(f"{model}, {count_label(gpus, device)}, {precision}")
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
    fig, (ax,) = make_panels(1, width=max(6.0, 1.3 * len(variants) + 2), height=4.6)
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
            "not measured" if pd.isna(cell.gain_pct) else f"{cell.gain_pct:+.1f}%" + ("" if pd.notna(cell.low_pct) else " (n=1)") for cell in cells.itertuples()
        ]
        # in the bar, on a white ground: legible where the interval's line crosses it
        ax.bar_label(
            container, labels=labels, fontsize="small", label_type="center", bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}
        )
    if interval is not None:
        interval.set_label("95 % interval of the gain (bootstrap over repeats)")
    ax.axhline(0, color="0.3", lw=1)
    target = threshold_of(t, "optimisation_gain")  # the check's name in checks.csv
    if target is not None:
        ax.axhline(100 * target, color="tab:red", ls="--", lw=1.2, label=f"target ({target:+.0%})")
    ax.set_xlabel('variant ("all": every optimisation together)')
    ax.set_ylabel("throughput gain over baseline (%)")
    ax.set_title(f"Ablation at {count_label(bars['gpus'].iloc[0], device_of(t))}: gain over the baseline")
    ax.tick_params(axis="x", labelrotation=20)
    if ax.get_legend() is not None:  # seaborn's, inside the axes, where the intervals reach
        ax.get_legend().remove()
    legend_below(fig, [ax])
    return fig


def _curve_runs(runs: pd.DataFrame, device: tuple[str, str]) -> pd.DataFrame:
    """Strong scaling, repeat 1, at 1 GPU and at each model's largest GPU count, with a label."""
    strong = runs[runs["study"].eq("strong") & runs["repeat"].eq(1) & runs["status"].ne("missing")]
    chosen = strong[strong["gpus"].eq(1) | strong["gpus"].eq(strong.groupby("model")["gpus"].transform("max"))]
    # astype(str): with no such run the empty Series would keep gpus' integer dtype, which "+" refuses
    label = chosen["gpus"].map(lambda n: count_label(n, device)).astype(str)
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
    device = device_of(t)
    chosen = _curve_runs(t["runs"], device)[["run_id", "model", "gpus", "curve"]]
    points = t[table].dropna(subset=[y]).merge(chosen, on="run_id")
    if points.empty:
        raise NotMeasured(f"no strong-scaling run (repeat 1, 1 {device[0]} or the largest count) recorded {y.replace('_', ' ')}")
    short = _not_learning(t, points["run_id"].unique(), detail=table == "loss_log")
    if short:
        raise NotMeasured(short)
    models = sorted(points["model"].unique())
    # a grid of at most three across, each panel tall enough to read at the report's width (six
    # side by side made a strip 85 px high)
    fig, axes = panel_grid(len(models), columns=3, width=5.2, height=3.8)
    for ax, model in zip(axes, models):
        group = points[points["model"].eq(model)].sort_values(["gpus", "step"])
        data = group.assign(value=scale * group[y])
        sns.lineplot(data, x="step", y="value", hue="curve", marker="o", errorbar=None, ax=ax)
        _spikes_off_the_axis(ax, data)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.set_title(model)
        ax.legend(title=None, fontsize="small")
    fig.suptitle(title)
    return fig


def _spikes_off_the_axis(ax: plt.Axes, data: pd.DataFrame) -> None:
    """Points above LOSS_SPIKE_FACTOR x the panel's median (record.columns: a loss spike) left
    above the axis, each named at its top, so that the rest of the curve keeps the axis."""
    median = float(data["value"].median())
    spikes = data[data["value"] > LOSS_SPIKE_FACTOR * median] if median > 0 else data.iloc[0:0]
    rest = data.drop(spikes.index)
    if spikes.empty or rest.empty:
        return
    low, high = float(rest["value"].min()), float(rest["value"].max())
    margin = 0.1 * (high - low) or 0.1 * abs(high) or 0.1
    ax.set_ylim(low - margin, high + 2 * margin)
    for row in spikes.itertuples():
        ax.annotate(
            f"spike {row.value:.3g} at step {row.step:g} (off the axis)", (row.step, high + 1.6 * margin), ha="left", va="top", fontsize="small", color="C3"
        )


def loss_curves(t: Tables) -> Figure:
    title = f"Training loss, strong scaling: 1 vs N {device_of(t)[1]} (repeat 1)"
    return _curves(t, "loss_log", "loss", 1.0, "training loss", title)


def accuracy_curves(t: Tables) -> Figure:
    title = f"Evaluation accuracy, strong scaling: 1 vs N {device_of(t)[1]} (repeat 1)"
    return _curves(t, "epochs", "eval_accuracy", 100.0, "evaluation accuracy (%)", title)


# What a training sample is, by runs.csv's tokens_per_sample: a language model's sequence is
# read per token (a sequence of 2,048 tokens is not comparable with one of 128), every other
# model's sample is an image.
ENERGY_UNITS = (
    ("image", "Image models: GPU energy per training image"),
    ("token", "Language models: GPU energy per training token"),
    ("sample", "Models whose record gives no tokens per sample: energy per training sample"),
)
SPREAD_FOR_LOG = 10  # a panel's values spread over more than this factor: a log axis, so that the smallest stay readable


def _energy_rows(t: Tables) -> pd.DataFrame:
    """Each counted run with GPU energy: its energy per image or per token, gross and above the
    power before step 1 (runs.csv's energy_per_sample_j and energy_per_sample_net_j, divided by tokens_per_sample for
    a language model), and the row it is drawn on (the model, with its GPU count where the runs
    have several)."""
    runs = t["runs"]
    counted = runs[runs["counts"].astype(str).str.lower().eq("true")]
    measured = counted.dropna(subset=["energy_per_sample_j"])
    if measured.empty:
        reasons = "; ".join(sorted(set(counted["nvml_reason"].dropna())))
        raise NotMeasured("no counted run recorded GPU energy" + (f" ({reasons})" if reasons else ""))
    tokens = pd.to_numeric(measured["tokens_per_sample"], errors="coerce")
    unit = np.select([tokens > 0, tokens == 0], ["token", "image"], "sample")
    per = tokens.where(tokens > 0, 1.0).fillna(1.0)
    device = device_of(t)
    several = measured["gpus"].nunique() > 1
    label = measured["model"].astype(str) + (" · " + measured["gpus"].map(lambda n: count_label(n, device)) if several else "")
    return measured.assign(unit=unit, label=label, gross=measured["energy_per_sample_j"] / per, net=measured["energy_per_sample_net_j"] / per)


def _fastest_configurations(energy: pd.DataFrame) -> pd.DataFrame:
    """Per row of the figure (a model at a GPU count), the medians of the configuration the headline
    shows for it: the one with the highest median throughput (configurations told apart as the
    headline tells them: cells, scalerepro.record.cell). A median over every configuration would mix an
    fp32 baseline with a bf16 one, a figure no configuration measured."""
    cells = (
        energy.groupby(["model", "gpus", "cell"], dropna=False)
        .agg(label=("label", "first"), speed=("samples_per_s", "median"), gross=("gross", "median"), net=("net", "median"))
        .reset_index()
    )
    fastest = cells.loc[cells.assign(speed=cells["speed"].fillna(-np.inf)).groupby(["model", "gpus"])["speed"].idxmax()]
    return fastest.set_index("label").sort_index()


def energy_per_sample(t: Tables) -> Figure:
    """Per model (and GPU count), the GPU energy of a training image or token of the configuration
    the headline shows (the fastest: _fastest_configurations), gross and above the GPUs' power
    before step 1 (read with the CUDA context up: not the card's idle), each counted run of any configuration a dot; image and language models in panels of
    their own, on a log axis where a panel's values spread over more than SPREAD_FOR_LOG."""
    energy = _energy_rows(t)
    panels = [(unit, title, energy[energy["unit"].eq(unit)]) for unit, title in ENERGY_UNITS if energy["unit"].eq(unit).any()]
    sizes = [panel["label"].nunique() for _, _, panel in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(7.5, 1.0 + sum(0.55 * n + 1.1 for n in sizes)),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": [0.55 * n + 1.1 for n in sizes]},
    )
    gross_colour, net_colour = sns.color_palette(n_colors=2)
    for ax, (unit, title, panel) in zip(axes[:, 0], panels):
        values = panel[["gross", "net"]].to_numpy(dtype=float)
        values = values[np.isfinite(values) & (values > 0)]
        scale, prefix = (1e3, "mJ") if values.max() < 1 else (1.0, "J")
        medians = _fastest_configurations(panel)
        rows = {label: y for y, label in enumerate(medians.index)}
        # every run a dot, the median of its row a marker: gross filled, above the power before step 1 hollow, joined by that power's share
        for column, offset in (("gross", -0.12), ("net", 0.12)):
            runs = panel.dropna(subset=[column])
            ax.scatter(
                scale * runs[column],
                runs["label"].map(rows) + offset,
                s=14,
                color="0.45",
                alpha=0.6,
                zorder=2,
                label="any counted run (gross, above the power before step 1)",
            )
        for label, median in medians.iterrows():
            y = rows[label]
            if np.isfinite(median["net"]):
                ax.plot(scale * np.array([median["net"], median["gross"]]), [y + 0.12, y - 0.12], color="0.6", lw=1, zorder=1)
                ax.scatter(
                    scale * median["net"],
                    y + 0.12,
                    s=70,
                    facecolors="white",
                    edgecolors=net_colour,
                    linewidths=2,
                    zorder=3,
                    label="fastest configuration: above the power before step 1",
                )
            ax.scatter(scale * median["gross"], y - 0.12, s=70, color=gross_colour, zorder=3, label="fastest configuration: gross")
        ax.set_yticks(range(len(rows)), list(rows))
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first model on top
        # each row's medians as numbers at its right, clear of the dots whatever their spread
        numbers = ax.secondary_yaxis("right")
        numbers.set_yticks(
            range(len(rows)),
            [f"{scale * m.gross:,.3g} {prefix}" + (f"\nabove pre-step {scale * m.net:,.3g}" if np.isfinite(m.net) else "") for m in medians.itertuples()],
            fontsize="small",
        )
        numbers.tick_params(length=0)
        spread = values.max() / values.min()
        if spread > SPREAD_FOR_LOG:
            ax.set_xscale("log")
            plain_log_axis(ax.xaxis)
            ax.set_xlim(scale * values.min() / 1.6, scale * values.max() * 1.6)
            where = "log scale"
        else:
            ax.set_xlim(0, scale * values.max() * 1.15)
            where = "from 0"
        ax.set_xlabel(f"{prefix} per training {unit} ({where})")
        ax.set_title(title, fontsize="medium")
    legend_below(fig, list(axes[:, 0]), order=lambda label: (label.startswith("any counted run"), "above" in label))
    fig.suptitle("GPU energy per training image and per token")
    return fig


def busbw_vs_size(t: Tables) -> Figure:
    comm = t["communication"].dropna(subset=["busbw_gbps"]).sort_values(["gpus", "size_bytes"])
    if comm.empty:
        raise NotMeasured("no all-reduce benchmark (no count of more than one GPU or rank, or the communication benchmark is disabled)")
    comm = comm[comm["gpus"] > 1]
    if comm.empty:  # one rank: busbw = algbw x 2(N-1)/N = 0, nothing crossed a link
        raise NotMeasured("only a 1-GPU all-reduce was measured: with one rank no byte crosses a link, its bus bandwidth is 0 by definition")
    where = comm["nodes"].map("{:g} node(s), ".format) + comm["backend"]
    device = device_of(t)
    comm = comm.assign(series=comm["gpus"].map(lambda n: count_label(n, device) + ", ") + where)
    fig, (ax,) = make_panels(1, width=7.5, height=4.8)
    sns.lineplot(comm, x="size_bytes", y="busbw_gbps", hue="series", marker="o", errorbar=None, ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(bytes_label))
    ax.set_xlabel("message size (float32 all-reduce)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("All-reduce bus bandwidth vs message size (busbw = size/t x 2(N-1)/N)")
    ax.legend(title=None, fontsize="small")
    return fig


# name -> drawing function, for every name of the one list (a name without a function here or in
# the modules of the profiles' and the model's figures fails this import with that name)
_DRAWERS = {**vars(profile_plots), **vars(model_plots), **globals()}
FIGURE_DRAWERS: dict[str, Callable[[Tables], Figure]] = {name: _DRAWERS[name] for name in FIGURE_NAMES}
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
    ticks = [f"{labels.loc[s, '_started']:%Y-%m-%d %H:%M:%S}\n{str(labels.loc[s, 'git_commit'])[:7]}" for s in order]
    cells = list(table.groupby(list(columns.CELL_KEYS), sort=True, dropna=False))
    fig, axes = make_panels(len(cells), width=max(4.0, 0.9 * len(order) + 2.5), height=4.4)
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
    legend_below(fig, axes)
    fig.suptitle("Headline cells across the stored studies (x: study start, commit)")
    return fig


def versus_baseline(t: Tables) -> Figure:
    """Candidate / baseline ratio of median samples/s per matched cell, with its bootstrap
    interval; the band is the threshold within which no change is reported."""
    table = t["versus_baseline"].dropna(subset=["ratio"]).reset_index(drop=True)
    if table.empty:
        raise NotMeasured("no cell was measured in both studies (or the compare rule did not run)")
    fig, (ax,) = make_panels(1, width=9.0, height=max(3.2, 0.55 * len(table) + 2.0))
    colours = {"faster": "tab:green", "slower": "tab:red"}
    threshold = float(table["threshold"].iloc[0])
    ax.axvspan(1 - threshold, 1 + threshold, color="0.9", label=f"within ±{threshold:.0%}: no change reported")
    ax.axvline(1.0, color="0.3", lw=1)
    for y, row in table.iterrows():
        colour = colours.get(row["verdict"], "0.35")
        if pd.notna(row["ratio_low"]):
            ax.errorbar(row["ratio"], y, xerr=[[row["ratio"] - row["ratio_low"]], [row["ratio_high"] - row["ratio"]]], fmt="o", color=colour, capsize=3)
        else:
            ax.plot(row["ratio"], y, "x", color=colour)  # too few repeats: no interval
        ax.annotate(
            f"{row['verdict']} (n {row['baseline_repeats']:g} vs {row['candidate_repeats']:g})",
            (row["ratio"], y),
            xytext=(0, 7),
            textcoords="offset points",
            ha="center",
            fontsize="x-small",
            color=colour,
        )
    ax.set_yticks(table.index, [_cell_label(row) for row in table.itertuples()], fontsize="x-small")
    ax.set_ylim(len(table) - 0.5, -0.8)  # first cell on top, room for its label
    level = 100 * float(table["confidence"].iloc[0])
    ax.set_xlabel(f"candidate / baseline, median samples/s\n(bar: {level:g} % bootstrap interval)")
    ax.set_title("Versus baseline (> 1: faster)")
    legend_below(fig, [ax])
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


def draw(tables: Tables, out_dir: str | os.PathLike[str], figures: Mapping[str, Callable[[Tables], Figure]] = FIGURE_DRAWERS) -> dict[str, str]:
    """Write each of ``figures`` as PNG and SVG into ``out_dir``; returns name -> "drawn" or the note."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt.switch_backend("agg")  # files only, no display
    sns.set_theme(context="notebook", style="whitegrid")
    plt.rcParams["svg.hashsalt"] = "scalerepro"  # the same SVG ids on every run
    # Titles fixed at the axes' top, where matplotlib puts them when nothing is above the axes (no
    # figure has anything there): a fixed title is not placed anew at each draw, which measured
    # every tick label (a fifth of the plots job).
    plt.rcParams["axes.titley"] = 1.0
    outcome = {}
    for name, figure in figures.items():
        metadata = {"svg": {"Date": None}, "png": {"Software": None}}
        try:
            fig, outcome[name] = figure(tables), "drawn"
        except NotMeasured as hole:
            fig, outcome[name] = placeholder(name, str(hole)), f"not measured: {hole}"
            metadata = placeholder_metadata(str(hole))  # the report shows it as one line, not an empty image
        fig.savefig(out / f"{name}.png", dpi=150, metadata=metadata["png"])
        # The layout the PNG was drawn with, kept: the constrained layout measures every label
        # again at each draw (a third of the plots job), and would give the same in inches.
        fig.set_layout_engine("none")
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
    sys.exit(main(sys.argv[1:]))
