"""The profiles' figures: the step broken down by kernel class, and the roofline of its kernels."""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text

from scalerepro.analysis.presentation.plot_basics import (
    MARKERS,
    NotMeasured,
    Tables,
    make_panels,
)
from scalerepro.analysis.profiles import step as step_parts

# the colour of each part of a step (profiles.step): one per class, the launches not captured one
# by one and the GPU's waiting in greys, so that a bar reads the same in every run
STEP_COLOURS = {
    "convolution": "tab:blue",
    "GEMM": "tab:purple",
    "attention": "tab:pink",
    "normalisation and elementwise": "tab:orange",
    "optimizer": "tab:olive",
    "communication": "tab:red",
    "copies": "tab:brown",
    "other": "tab:cyan",
    step_parts.RELAUNCHED: "0.55",
    step_parts.DATA_WAIT: "gold",
    step_parts.IDLE: "0.85",
}


def profile_breakdown(t: Tables) -> Figure:
    """Each profiled run's step, part by part (profiles.step.step_breakdown): the kernel classes,
    the launches not captured one by one or the data wait, and the idle time, as shares of the step;
    the parts add up to the step."""
    if t["profiling"].empty:
        raise NotMeasured("no run was profiled: there is no profiling table (the profiling section says why)")
    measured = {str(row["run_id"]): row for row in t["runs"].to_dict("records")} if "run_id" in t["runs"] else {}
    bars = []
    for row in t["profiling"].to_dict("records"):
        breakdown = step_parts.step_breakdown(row, measured.get(str(row["run_id"])))
        if breakdown and breakdown.get("rows"):
            bars.append((row, breakdown))
    if not bars:
        raise NotMeasured("no profiled run has a breakdown of its step (no kernels captured, or no measured step to split)")
    fig, (ax,) = make_panels(1, width=max(8.0, 1.6 * len(bars) + 5.0), height=5.6)
    seen: dict[str, Any] = {}
    dropped = []
    for x, (row, breakdown) in enumerate(bars):
        bottom = 0.0
        for part in breakdown["rows"]:
            share = 100 * part["share"]
            if share <= 0:  # more captured than the step's kernel time: a part a stack cannot show
                if share < 0:
                    dropped.append(f"{row['run_id']}: {part['part']} {share:.1f} %")
                continue
            key = part["step_class"] or part["part"]
            colour = STEP_COLOURS.get(key, STEP_COLOURS[step_parts.RELAUNCHED] if key.startswith(step_parts.RELAUNCHED) else "0.7")
            seen[key] = ax.bar(
                x,
                share,
                width=0.55,
                bottom=bottom,
                color=colour,
                edgecolor="white",
                linewidth=0.6,
                hatch="//" if key.startswith(step_parts.RELAUNCHED) else None,
            )
            if share >= 5:
                ax.text(x, bottom + share / 2, f"{share:.0f} %", ha="center", va="center", fontsize="x-small")
            bottom += share
        verdict = row.get("classification")
        if isinstance(verdict, str) and verdict:  # a timeline's classification, above its bar
            ax.text(x, 101, verdict, ha="center", va="bottom", fontsize="x-small")
    step = [
        f"{r['run_id']}\n{b['step_s'] * 1e3:.3g} ms step (the measured run's); classes:\none launch of each configuration, {b['captured_s'] * 1e3:.3g} ms"
        if b["coverage"] == step_parts.ONE_PER_CONFIGURATION
        else f"{r['run_id']}\n{b['step_s'] * 1e3:.3g} ms step (the profiled window's)"
        for r, b in bars
    ]
    ax.set_xticks(range(len(bars)), step, fontsize="x-small")
    ax.set_xlim(-0.7, len(bars) - 0.3)
    ax.set_ylim(0, 108)
    ax.set_ylabel("share of the step (%)")
    note = f"\nnot drawn (negative): {'; '.join(dropped)}" if dropped else ""
    fig.suptitle(f"Where each profiled step's time goes (shares of the step; the parts add up to it){note}", fontsize="medium")
    labels = [key for key in STEP_COLOURS if key in seen] + [key for key in seen if key not in STEP_COLOURS]
    fig.legend([seen[key] for key in labels], [textwrap.fill(key, 34) for key in labels], loc="outside right center", frameon=False, fontsize="small")
    return fig


ROOFLINE_NUMBERED = 15  # the kernels numbered in the roofline figure: the longest, as many as the report's roofline table lists


def _roof_reason(row: Mapping[str, Any]) -> str:
    """Why a roofline row is not drawn, short: its roof's "none: <why> (...)", or what it lacks."""
    roof = str(row.get("roof") if isinstance(row.get("roof"), str) else row.get("peak") or "")
    if roof.startswith("none: "):
        return roof.removeprefix("none: ").split(" (")[0].split(", a rate")[0]
    return "no DRAM bytes or duration measured" if pd.isna(row.get("arithmetic_intensity")) else "no FLOP rate"


def _place_labels(
    ax: plt.Axes, points: Sequence[tuple[float, float, str]], colour: Callable[[str], Any], obstacles: Sequence[tuple[float, float]]
) -> list[Any]:
    """Each point's number beside it, where it covers no label placed before it and no marker
    (``obstacles``: every point drawn), in display space, greedily: twelve directions, further out
    ring by ring, a leader line from the second ring on; where no place is free, the place that
    covers the fewest (a label before a marker). The axes' limits must be final."""
    fig = cast(Figure, ax.figure)
    fig.canvas.draw()  # the layout, then kept as it is: drawn again at the file's dpi it would move the points under their labels
    fig.set_layout_engine("none")
    renderer = cast(Any, fig.canvas).get_renderer()  # the Agg canvas the figures draw on has one; its base class declares none
    marker = 4.0 * fig.dpi / 72  # half a marker's width (s=36: 6 pt), in pixels
    taken = [ax.transData.transform(xy) for xy in obstacles]
    frame = ax.get_window_extent(renderer).padded(-4)  # a label inside the axes, clear of their frame
    boxes: list[Any] = []
    placed: list[Any] = []
    angles = np.deg2rad([30, 150, -30, -150, 90, -90, 0, 180, 60, 120, -60, -120])
    points_to_pixels = fig.dpi / 72

    def annotation(text: str, xy: tuple[float, float], offset: tuple[float, float], leader: bool) -> Any:
        label = ax.annotate(
            text,
            xy,
            xytext=offset,
            textcoords="offset points",
            fontsize="x-small",
            fontweight="bold",
            ha="center",
            va="center",
            color=colour(text),
            bbox={"boxstyle": "round,pad=0.12", "fc": "white", "ec": colour(text), "lw": 0.5, "alpha": 0.9},
            arrowprops={"arrowstyle": "-", "color": colour(text), "lw": 0.5} if leader else None,
        )
        label.set_in_layout(False)  # a label must not move the axes it was placed in
        return label

    for x, y, text in points:
        # A label's box is the same at every place tried, moved by its offset: measured once (the
        # text alone, an annotation's own extent adds its leader line, with room for its frame).
        probe = annotation(text, (x, y), (0.0, 0.0), leader=False)
        probe.update_positions(renderer)  # else its extent is measured from the display's origin, not the point
        here = Text.get_window_extent(probe, renderer).padded(3)
        probe.remove()
        best: tuple[float, tuple[float, float], Any, int] | None = None
        for ring in range(1, 13):
            distance = 7 + 9 * (ring - 1)
            for angle in angles:
                offset = (1.3 * distance * np.cos(angle), distance * np.sin(angle))  # wider than high, as the labels are
                box = here.translated(offset[0] * points_to_pixels, offset[1] * points_to_pixels)
                markers = sum(box.x0 - marker < px < box.x1 + marker and box.y0 - marker < py < box.y1 + marker for px, py in taken)
                cost = 100 * sum(box.overlaps(other) for other in boxes) + markers + (1000 if not frame.contains(*box.p0) or not frame.contains(*box.p1) else 0)
                if best is None or cost < best[0]:
                    best = (cost, offset, box, ring)
                if cost == 0:
                    break
            if best is not None and best[0] == 0:
                break
        assert best is not None  # the first place tried is always kept
        boxes.append(best[2])
        placed.append(annotation(text, (x, y), best[1], leader=best[3] > 1))  # a leader line from the second ring on
    return placed


def _shortened(name: str, length: int) -> str:
    return name if len(name) <= length else name[: length - 1] + "…"


def roofline(t: Tables) -> Figure:
    """Every kernel that has a FLOP roof, achieved FLOP/s against arithmetic intensity, in the colour
    of the roof it is set under (profiles.roofline: the tensor cores of its precision, or the CUDA
    cores of its precision); the roofs min(peak, AI x DRAM bandwidth), each named; the longest
    numbered as the report's roofline table numbers them (rank_in_run); how many are left out, and why."""
    table = t["profiling_roofline"]
    drawn_mask = table["arithmetic_intensity"].gt(0) & table["achieved_flops_per_s"].gt(0) & table["peak_flops_per_s"].notna()
    roof = table[drawn_mask]
    if roof.empty and len(table):  # ncu profiled kernels, none with a FLOP roof: say so, not "no profile"
        raise NotMeasured(
            f"none of the {len(table)} kernels Nsight Compute profiled has a FLOP roof to set it under "
            "(no floating-point work, or tensor-core work not counted): see the roofline table"
        )
    if roof.empty:
        raise NotMeasured(
            "no Nsight Compute kernel profile (the torch.profiler fallback has no hardware counters; ncu runs with profiling.tool auto or ncu on a GPU)"
        )
    left_out: dict[str, int] = {}
    for row in table[~drawn_mask].to_dict("records"):
        left_out[_roof_reason(row)] = left_out.get(_roof_reason(row), 0) + 1
    fig, (ax,) = make_panels(1, width=9.0, height=6.2)
    roofs = roof.drop_duplicates("roof").sort_values("peak_flops_per_s", ascending=False)
    colours = dict(zip(roofs["roof"], ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:olive"]))
    bandwidth = float(roof["peak_dram_bytes_per_s"].dropna().max())
    lo = min(roof["arithmetic_intensity"].min(), (roofs["peak_flops_per_s"] / bandwidth).min()) / 4
    hi = max(roof["arithmetic_intensity"].max(), (roofs["peak_flops_per_s"] / bandwidth).max()) * 4
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    top = float(roofs["peak_flops_per_s"].max())
    slope = x[x * bandwidth <= top]
    ax.plot(slope, slope * bandwidth, color="0.2", lw=1.3, label=f"DRAM bandwidth: AI x {bandwidth / 1e12:g} TB/s")
    for entry in roofs.itertuples():
        ridge = entry.peak_flops_per_s / bandwidth  # where the compute roof meets the bandwidth roof
        ax.plot(
            [ridge, hi], [entry.peak_flops_per_s] * 2, color=colours[entry.roof], lw=1.6, label=f"{entry.roof}: {entry.peak_flops_per_s / 1e12:,.1f} TFLOP/s"
        )
    runs = list(dict.fromkeys(roof["run_id"]))
    for marker, run_id in zip(itertools.cycle(MARKERS), runs):
        mine = roof[roof["run_id"].eq(run_id)]
        ax.scatter(
            mine["arithmetic_intensity"],
            mine["achieved_flops_per_s"],
            s=36,
            marker=marker,
            c=[colours[r] for r in mine["roof"]],
            edgecolors="white",
            linewidths=0.5,
            label=f"{run_id + ': ' if len(runs) > 1 else ''}kernels (colour: their roof)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(roof["achieved_flops_per_s"].min() / 4, top * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.legend(fontsize="x-small", loc="lower right")
    # numbers as the roofline table gives them (rank_in_run: the kernels by time), a run's letter before them where there are several
    prefix = {run_id: (chr(ord("A") + i) if len(runs) > 1 else "") for i, run_id in enumerate(runs)}
    numbered = roof[roof["rank_in_run"].le(ROOFLINE_NUMBERED)] if "rank_in_run" in roof else roof.iloc[0:0]
    numbered = numbered.sort_values(["run_id", "rank_in_run"])
    # the key: each number the table gives, the ones not drawn with why, so that the two never disagree
    listed = table[table["run_id"].isin(runs) & table["rank_in_run"].le(ROOFLINE_NUMBERED)] if "rank_in_run" in table else table.iloc[0:0]
    key = []
    for index, r in listed.sort_values(["run_id", "rank_in_run"]).iterrows():
        name = str(r["kernel"]).removeprefix("void ")
        key.append(f"{prefix[r['run_id']]}{r['rank_in_run']:g}  " + _shortened(name if index in roof.index else f"not drawn, {_roof_reason(r)}: {name}", 58))
    blank = [Line2D([], [], linestyle="none")] * len(key)
    if key:
        fig.legend(blank, key, loc="outside lower center", ncol=2, fontsize="x-small", frameon=False, handlelength=0, handletextpad=0)
    reasons = "; ".join(f"{count} {why}" for why, count in sorted(left_out.items(), key=lambda item: -item[1]))
    ax.set_title(
        f"Roofline of the kernels (Nsight Compute): {len(roof)} of {len(table)} kernels drawn, the longest numbered as in the table\n"
        + (f"left out, with no FLOP roof to set them under: {reasons}" if reasons else "none left out"),
        fontsize="small",
    )
    colour_of = {f"{prefix[r.run_id]}{r.rank_in_run:g}": colours[r.roof] for r in numbered.itertuples()}
    _place_labels(
        ax,
        [(r.arithmetic_intensity, r.achieved_flops_per_s, f"{prefix[r.run_id]}{r.rank_in_run:g}") for r in numbered.itertuples()],
        lambda text: colour_of.get(text, "black"),
        list(zip(roof["arithmetic_intensity"], roof["achieved_flops_per_s"])),
    )
    return fig
