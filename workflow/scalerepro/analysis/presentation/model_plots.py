"""The scaling model's figures: its predicted efficiency beside the measured one, and the measured
loss of efficiency part by part (the "why not faster" waterfall)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.figure import Figure

from scalerepro.analysis.presentation.plot_basics import (
    NotMeasured,
    Tables,
    count_label,
    device_of,
    gpu_axis,
    legend_below,
    make_panels,
)


def predicted_vs_measured_efficiency(t: Tables) -> Figure:
    table = t["scaling_model"]
    predicted = table.dropna(subset=["efficiency_predicted"])
    if predicted.empty:
        notes = "; ".join(sorted(set(table["note"].dropna()))) if len(table) else "scaling_model.csv has no rows"
        raise NotMeasured(f"no scaling-model prediction ({notes})")
    studies = sorted(predicted["study"].unique())
    fig, axes = make_panels(len(studies), width=6.0, height=4.6)
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
            ax.text(
                np.sqrt(low * beyond.max()) * 1.1,
                5,
                f"prediction only:\nbeyond the hardware measured,\n{links}",
                ha="center",
                va="bottom",
                fontsize="small",
                color="0.3",
            )
        ax.axhline(100, color="0.4", lw=1)
        gpu_axis(ax, rows["gpus"], device_of(t))
        top = 100 * np.nanmax(rows[["efficiency_measured", "efficiency_predicted"]].to_numpy(dtype=float))
        ax.set_ylim(0, max(110, top + 10))
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_title(f"{study} scaling")
    legend_below(fig, axes)
    fig.suptitle("Scaling efficiency: measured vs the alpha-beta model's prediction")
    return fig


WATERFALL_STEPS = (
    ("compute_inflation", "compute\ninflation"),
    ("exposed_comm", "exposed\ncomm"),
    ("straggler_wait", "straggler\nwait"),
    ("data_stall", "data\nstall"),
    ("unexplained", "unex-\nplained"),
)


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
    device = device_of(t)
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
        ax.set_title(
            f"{row.model}, {row.study}, {count_label(row.gpus, device)} (n={row.repeats:g})\nE = {row.efficiency:.0%}; {bottleneck}", fontsize="medium"
        )
    for ax in list(axes.flat)[len(table) :]:
        ax.set_axis_off()
    fig.suptitle("Why not faster: from the ideal step to the measured one, part by part")
    return fig
