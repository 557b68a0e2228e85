"""Why not faster: each multi-rank cell's loss against ideal scaling, split into measured parts.

Per run at N ranks (a repeat of a strong or weak cell), from its record (runs.csv) and the
median of the same study's one-GPU repeats:

    t_N     = window_s / measured_steps        the run's mean step (its throughput's step)
    t_1     = the one-GPU cell's median of the same
    ideal   = t_1 / N (strong: the global batch split N ways)  |  t_1 (weak: the per-GPU batch kept)

and from the exposed-communication probe after its window (``measurements.exposed_communication``:
the same step on pre-built batches, with and without DDP's all-reduce, every rank timed):

    compute inflation  = nosync_rank_mean_s - ideal
        the typical rank's step without communication against ideal: ranks sharing a node's
        memory bandwidth and cores, clocks under a power cap, a smaller per-GPU batch whose fixed
        per-step cost (optimizer, launches) does not shrink (strong scaling)
    straggler wait     = straggler_wait_s
        what a typical rank waits at a synchronisation for the slowest (the spread of one step
        over the ranks without the all-reduce)
    exposed comm       = max(sync_step_s - nosync_rank_mean_s - straggler wait, 0)
        the all-reduce that the backward does not hide
    data stall         = data_wait_s / measured_steps
        the input wait of a step in the window (the probe's batches are pre-built: it has none)
    unexplained        = t_N - ideal - the four above  (= t_N - sync_step_s - data stall, exposed comm above 0)
        what the parts do not account for: the probe's moment against the window's, its cached
        batches, the loop's own cost, noise (benchmarks/probe_against_window.py measures the
        probe's sync step against the window's: on the development VM -0.6 % of a step, sd 2.6 %)

A cell's parts come from the medians over its repeats of the measured seconds (t_N, the sync
step, the typical rank's no-sync step, the straggler wait, the data wait per step), put through
the formulas above, each stated as a fraction of the median t_N: so the cell's parts and its rest
add up to its loss 1 - ideal / t_N exactly, which is scaling.csv's 1 - E(N) (``aggregate``: E =
thr(N) / (N thr(1)) strong, T(1) / T(N) weak, both t_1 / t_N in step terms) up to the mean against
the median of the steps. (Medians of each part taken apart would not add up: one repeat's probe
catching a slow moment moves one part in one repeat only.) Each part's 95 % interval comes from
the same derivation on bootstrap resamples of the repeats, each resample drawing whole runs
(``repeats.BOOTSTRAP_RESAMPLES``, seeded by the cell), t_1 held at its median; with one repeat
there is none. The row holds ``parts_sum`` (the four named parts) beside ``loss`` (1 - E from
scaling.csv), and the bottleneck: the largest named part, with the lever that addresses it
(``BOTTLENECKS``). A run whose record lacks a part (a record from before the probe timed every
rank, a probe switched off) gives no parts; the cell says why.

Table ``loss_decomposition.csv``: one row per (study, model, gpus > 1) of scaling.csv: study,
model, gpus, nodes, repeats (runs with every part), step_s, ideal_step_s (medians), loss,
efficiency, then per part ``<part>`` (median fraction), ``<part>_ci_low``, ``<part>_ci_high`` and
``<part>_s`` (median seconds), parts_sum, sum_error (parts_sum - loss), bottleneck, lever, note.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.tables import repeats
from scalerepro.analysis.values import finite_number

NAMED_PARTS = ("compute_inflation", "exposed_comm", "straggler_wait", "data_stall")
PARTS = (*NAMED_PARTS, "unexplained")
# What the loss is to, when a part is the largest, and the lever that addresses it.
BOTTLENECKS: dict[str, tuple[str, str]] = {
    "compute_inflation": (
        "compute-bound: each rank computes slower than one alone",
        "on one node, pin each rank to its own cores and memory (NUMA) and check clocks under the power cap; in "
        "strong scaling, a larger global batch keeps each rank's batch where its step is efficient",
    ),
    "exposed_comm": (
        "communication-bound: the all-reduce outlasts the backward",
        "overlap more (a smaller --bucket-cap-mb starts the first all-reduce sooner), all-reduce bf16 gradients, "
        "accumulate gradients over micro-batches, or a faster interconnect",
    ),
    "straggler_wait": (
        "straggler-bound: ranks wait for the slowest at every synchronisation",
        "find the slow rank (host load, throttling, a shared core) in the per-rank step times; keep other work "
        "off the nodes",
    ),
    "data_stall": (
        "input-bound: steps wait for their batches",
        "more loader workers, pinned memory and prefetching, or the device-resident loader (--loader device)",
    ),
}
LOSS_DECOMPOSITION_COLUMNS = (
    "study", "model", "gpus", "nodes", "repeats", "step_s", "ideal_step_s", "loss", "efficiency",
    *(f"{part}{suffix}" for part in PARTS for suffix in ("", "_ci_low", "_ci_high", "_s")),
    "parts_sum", "sum_error", "bottleneck", "lever", "note",
)  # fmt: skip


def mean_step_s(run: pd.Series) -> float | None:
    """window_s / measured_steps: the step of the run's throughput."""
    window, steps = finite_number(run.get("window_s")), finite_number(run.get("measured_steps"))
    return window / steps if window and steps else None


QUANTITIES = ("step", "sync", "nosync", "straggler", "data")


def run_quantities(run: pd.Series) -> dict[str, float] | str:
    """The seconds one run measured that its parts come from (module docstring), or why it has none."""
    step = mean_step_s(run)
    if step is None:
        return "no measured window"
    probe = {key: finite_number(run.get(key)) for key in ("sync_step_s", "nosync_rank_mean_s", "straggler_wait_s")}
    missing = [key for key, value in probe.items() if value is None]
    if missing:
        return f"its record has no {', '.join(missing)} (a probe from before every rank was timed, or --comm-probe-steps 0)"
    return {
        "step": step,
        "sync": probe["sync_step_s"],
        "nosync": probe["nosync_rank_mean_s"],
        "straggler": max(probe["straggler_wait_s"], 0.0),
        "data": (finite_number(run.get("data_wait_s")) or 0.0) / float(run["measured_steps"]),
    }


def parts_of(q: dict[str, Any], ideal_s: float) -> dict[str, Any]:
    """The parts in seconds from the measured seconds ``q`` (numbers, or arrays of resamples)."""
    parts = {
        "compute_inflation": q["nosync"] - ideal_s,
        "straggler_wait": q["straggler"],
        "exposed_comm": np.maximum(q["sync"] - q["nosync"] - q["straggler"], 0.0),
        "data_stall": q["data"],
    }
    parts["unexplained"] = q["step"] - ideal_s - sum(parts.values())
    return parts


def loss_decomposition_table(runs: pd.DataFrame, scaling: pd.DataFrame) -> pd.DataFrame:
    """loss_decomposition.csv (module docstring) from the aggregation's runs.csv and scaling.csv."""
    rows = []
    counted = runs[runs["counts"].astype(bool) & runs["study"].isin(["strong", "weak"])]
    for _, cell in scaling[scaling["gpus"].gt(1) & scaling["study"].isin(["strong", "weak"])].iterrows():
        study, model, gpus = cell["study"], cell["model"], int(cell["gpus"])
        base = {"study": study, "model": model, "gpus": gpus, "nodes": cell.get("nodes"), "efficiency": cell.get("efficiency")}
        efficiency = finite_number(cell.get("efficiency"))
        base["loss"] = 1 - efficiency if efficiency is not None else None
        ones = [mean_step_s(run) for _, run in counted[counted["study"].eq(study) & counted["model"].eq(model) & counted["gpus"].eq(1)].iterrows()]
        ones = [step for step in ones if step is not None]
        if not ones:
            rows.append({**base, "repeats": 0, "note": "no completed one-GPU run of this study and model: no ideal to measure against"})
            continue
        ideal = float(pd.Series(ones).median()) / (gpus if study == "strong" else 1)
        found = [run_quantities(run) for _, run in counted[counted["study"].eq(study) & counted["model"].eq(model) & counted["gpus"].eq(gpus)].iterrows()]
        measured = [parts for parts in found if isinstance(parts, dict)]
        why = sorted({parts for parts in found if isinstance(parts, str)})
        row: dict[str, Any] = {**base, "repeats": len(measured), "ideal_step_s": ideal}
        if not measured:
            row["note"] = "; ".join(why) or "no completed run in this cell"
            rows.append(row)
            continue
        values = {name: np.array([q[name] for q in measured]) for name in QUANTITIES}
        medians = {name: float(np.median(array)) for name, array in values.items()}
        row["step_s"] = medians["step"]
        parts = parts_of(medians, ideal)
        intervals: dict[str, tuple[float, float]] = {}
        if len(measured) >= 2:  # resample whole runs, so that each resample's parts add up too
            draws = repeats._rng(("loss", study, model, gpus)).integers(0, len(measured), size=(repeats.BOOTSTRAP_RESAMPLES, len(measured)))
            resampled = {name: np.median(array[draws], axis=1) for name, array in values.items()}
            for part, seconds in parts_of(resampled, ideal).items():
                intervals[part] = repeats.interval(seconds / resampled["step"])
        for part in PARTS:
            low, high = intervals.get(part, (math.nan, math.nan))
            row.update({part: float(parts[part]) / medians["step"], f"{part}_ci_low": low, f"{part}_ci_high": high,
                        f"{part}_s": float(parts[part])})  # fmt: skip
        row["parts_sum"] = sum(row[part] for part in NAMED_PARTS)
        if row["loss"] is not None:
            row["sum_error"] = row["parts_sum"] - row["loss"]
        largest = max(NAMED_PARTS, key=lambda part: row[part])
        if row[largest] > 0:
            row["bottleneck"], row["lever"] = BOTTLENECKS[largest]
        row["note"] = "; ".join(
            [f"{len(found) - len(measured)} of {len(found)} runs without parts: {'; '.join(why)}"] if why else []
        ) or None
        rows.append(row)
    return pd.DataFrame(rows, columns=LOSS_DECOMPOSITION_COLUMNS)
