"""Why not faster: each multi-rank cell's loss against ideal scaling, split into measured parts.

Per run at N ranks (a repeat of a strong or weak cell), from its record (runs.csv) and the
median of the same study's one-GPU repeats:

    t_N     = window_s / measured_steps        the run's mean step (its throughput's step)
    t_1     = the one-GPU cell's median of the same
    ideal   = t_1 / N (strong: the global batch split N ways)  |  t_1 (weak: the per-GPU batch kept)

The parts come from the window's own steps, every rank timed (``measurements.window_split``,
scalerepro.training.allreduce_timing: each step less its input wait and its wait for the
all-reduce at the backward's end, means over the window), and, for one correction, from the
exposed-communication probe after the window (``measurements.exposed_communication``: the same
step on pre-built batches, with and without the all-reduce, in alternating short runs):

    overlap cost       = max(sync_compute_rank_mean_s - nosync_rank_mean_s, 0)   (the probe; its
                         standard error over the probe's steps, overlap_cost_se_s, is the column
                         overlap_cost_se as a share of the step: how far compute inflation and
                         exposed comm may move between each other for the probe's few steps)
        what the all-reduce running beside the backward costs the backward (on the CPU gloo's
        threads share the ranks' cores; on a GPU NCCL's kernels share its SMs): the probe's sync
        step less its wait, against its no-sync step, both at one moment
    compute inflation  = window_compute_rank_mean_s - overlap cost - ideal
        the typical rank's step without communication against ideal: ranks sharing a node's
        memory bandwidth and cores, clocks under a power cap, a smaller per-GPU batch whose fixed
        per-step cost (optimizer, launches) does not shrink (strong scaling)
    straggler wait     = window_straggler_wait_s
        what a typical rank waits at the backward's end for the rank that finishes it last
    exposed comm       = window_exposed_wait_s + overlap cost
        what the all-reduce costs the step: the wait of the last rank, for the communication its
        backward did not hide, and the overlap cost
    data stall         = window_data_wait_rank_mean_s
        the typical rank's input wait per step in the window
    unexplained        = t_N - ideal - the four above
        what the parts do not account for: the loop between the step timer's marks, the slowest
        rank's window against the typical rank's, an overlap cost the probe measured below 0

The window's parts and the probe are measured at different moments only in the overlap cost,
which moves time between compute inflation and exposed comm and leaves their sum as the window
measured it. A kept record with no window_split (its trainer did not split the window) gives its
parts from the probe alone: compute inflation = nosync_rank_mean_s - ideal, straggler wait =
straggler_wait_s, exposed comm = max(sync_step_s - nosync_rank_mean_s - straggler wait, 0), data
stall = data_wait_s / measured_steps; there the rest holds the probe's moment against the
window's (benchmarks/probe_against_window.py: +0.7 % of a step, sd 1.3-2.8 % a run on the
development VM), and the cell's note says so.

A cell's parts are those of its median run: the repeat whose t_N is the median over the cell's
repeats (with an even number, the mean of the two middle repeats, whose mean is the median), put
through the formulas above and stated as fractions of that t_N. Each run's parts add up to its
own step, so the cell's parts and its rest add up to its loss, 1 - E with E = ideal / t_N: the
efficiency of mean steps, the throughput's. The row's ``efficiency`` and ``loss`` are that E and
that loss, so that the parts split the loss they were measured in. For a strong cell E is
scaling.csv's (``aggregate``: thr(N) / (N thr(1)) is t_1 / t_N in mean steps). A weak cell's E in
scaling.csv, T(1) / T(N), is in epoch times from each window's median step, which leaves out the
window's occasional slow steps; the row keeps it as ``scaling_efficiency`` and its note states the
difference where it exceeds half a point. (Set against that E, the parts missed the loss by 2.1
points in a README study and 4.6 slowed: benchmarks/README.md, issue 50.) (Medians of each part
taken apart do not add up: over three repeats whose step moved by 6 %, they left 1-2 points of a
README study's loss unexplained where every run's own rest was under 0.1 ms.) Each part's 95 % interval comes from
the same derivation on bootstrap resamples of the repeats, each resample drawing whole runs and
taking its median run (``repeats.BOOTSTRAP_RESAMPLES``, seeded by the cell), t_1 held at its
median; with one repeat there is none. The row holds ``parts_sum`` (the four named parts) beside
``loss`` (1 - E from scaling.csv), and the bottleneck: the largest named part, with the lever
that addresses it (``BOTTLENECKS``). A run whose record lacks a part (a probe switched off, a run
under CUDA graphs whose window is not split) gives no parts; the cell says why. Under a study
budget only a configuration's repeat 1 runs the probe; its later repeats take its overlap-cost
figures (``readers.cell_probes``: the row's ``probe_of``), and the cell's note says how many did.

Table ``loss_decomposition.csv``: one row per (study, model, gpus > 1) of scaling.csv: study,
model, gpus, nodes, repeats (runs with every part), step_s (the median run's), ideal_step_s (the one-GPU median), loss,
efficiency (ideal_step_s / step_s where the cell has parts, else scaling.csv's), scaling_efficiency
(scaling.csv's E), then per part ``<part>`` (median fraction), ``<part>_ci_low``, ``<part>_ci_high`` and
``<part>_s`` (median seconds), parts_sum, sum_error (parts_sum - loss), bottleneck, lever, note.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

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
        "find the slow rank (host load, throttling, a shared core) in the per-rank step times; keep other work off the nodes",
    ),
    "data_stall": (
        "input-bound: steps wait for their batches",
        "more loader workers, pinned memory and prefetching, or the device-resident loader (--loader device)",
    ),
}
LOSS_DECOMPOSITION_COLUMNS = (
    "study",
    "model",
    "gpus",
    "nodes",
    "repeats",
    "step_s",
    "ideal_step_s",
    "loss",
    "efficiency",
    "scaling_efficiency",
    *(f"{part}{suffix}" for part in PARTS for suffix in ("", "_ci_low", "_ci_high", "_s")),
    "parts_sum",
    "sum_error",
    "overlap_cost_se",
    "bottleneck",
    "lever",
    "note",
)


def mean_step_s(run: pd.Series) -> float | None:
    """window_s / measured_steps: the step of the run's throughput."""
    window, steps = finite_number(run.get("window_s")), finite_number(run.get("measured_steps"))
    return window / steps if window and steps else None


QUANTITIES = ("step", "compute", "exposed", "straggler", "data")
WINDOW_FIELDS = ("window_compute_rank_mean_s", "window_exposed_wait_s", "window_straggler_wait_s", "window_data_wait_rank_mean_s")
PROBE_FIELDS = ("sync_step_s", "nosync_rank_mean_s", "straggler_wait_s")
FROM_PROBE = "parts from the probe after the window"  # the note of a cell with such runs, with why (probe_reason)


def probe_reason(run: pd.Series) -> str:
    """Why a run's parts come from its probe: the record's reason its window is not split (CUDA
    graphs), else its age."""
    reason = run.get("window_split_reason")
    return reason if isinstance(reason, str) and reason else "a record whose trainer did not split the window's steps"


def _figures(run: pd.Series, names: tuple[str, ...]) -> dict[str, float | None]:
    return {name: finite_number(run.get(name)) for name in names}


def _all_measured(figures: dict[str, float | None]) -> TypeGuard[dict[str, float]]:
    return all(value is not None for value in figures.values())


def run_quantities(run: pd.Series) -> dict[str, Any] | str:
    """The seconds one run measured that its parts come from (module docstring), with where they
    were measured (``measured_in``), or why it has none."""
    step = mean_step_s(run)
    if step is None:
        return "no measured window"
    window, probe = _figures(run, WINDOW_FIELDS), _figures(run, PROBE_FIELDS)
    if _all_measured(window):
        nosync, sync_compute = probe["nosync_rank_mean_s"], finite_number(run.get("sync_compute_rank_mean_s"))
        overlap = max(sync_compute - nosync, 0.0) if nosync is not None and sync_compute is not None else None
        se = finite_number(run.get("overlap_cost_se_s"))
        return {
            "step": step,
            "compute": window["window_compute_rank_mean_s"] - (overlap or 0.0),
            "exposed": window["window_exposed_wait_s"] + (overlap or 0.0),
            "straggler": window["window_straggler_wait_s"],
            "data": window["window_data_wait_rank_mean_s"],
            # the probe's own precision, moved between compute inflation and exposed comm with the overlap cost
            "overlap_se": se if overlap is not None and se is not None else math.nan,
            "measured_in": "window" if overlap is not None else "window, no overlap cost",
        }
    if not _all_measured(probe):
        missing = [key for key, value in probe.items() if value is None]
        return f"its window is not split ({probe_reason(run)}) and it has no {', '.join(missing)} (--comm-probe-steps 0, or a record whose trainer did not time every rank)"
    straggler = max(probe["straggler_wait_s"], 0.0)
    return {
        "step": step,
        "compute": probe["nosync_rank_mean_s"],
        "exposed": max(probe["sync_step_s"] - probe["nosync_rank_mean_s"] - straggler, 0.0),
        "straggler": straggler,
        "data": (finite_number(run.get("data_wait_s")) or 0.0) / float(run["measured_steps"]),
        "measured_in": "probe",
        "probe_reason": probe_reason(run),
    }


def parts_of(q: dict[str, Any], ideal_s: float) -> dict[str, Any]:
    """The parts in seconds from the measured seconds ``q`` (numbers, or arrays of resamples)."""
    parts = {
        "compute_inflation": q["compute"] - ideal_s,
        "straggler_wait": q["straggler"],
        "exposed_comm": q["exposed"],
        "data_stall": q["data"],
    }
    parts["unexplained"] = q["step"] - ideal_s - sum(parts.values())
    return parts


def at_median_step(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each measured quantity (runs on the last axis) of the run whose step is the median: the
    middle run's, or with an even number of runs the mean of the two middle runs' (the median step
    is their mean); so that the quantities, like each run's, add up to the median step."""
    step = values["step"]
    count = step.shape[-1]
    middle = np.argsort(step, axis=-1, kind="stable")[..., [(count - 1) // 2, count // 2]]
    return {name: np.take_along_axis(array, middle, axis=-1).mean(axis=-1) for name, array in values.items()}


BASIS_NOTE_POINTS = 0.005  # the row's E and scaling.csv's differ by more: the note says so


def _basis_note(study: str, efficiency: float, scaling_efficiency: float) -> str:
    """Why the row's E (the median run's mean step against ideal) is not scaling.csv's."""
    why = (
        "epoch times at each window's median step, which leave out its slow steps"
        if study == "weak"
        else "the repeats' median throughputs, not the median run's"
    )
    return (
        f"E here {100 * efficiency:.1f} %, of the mean step, which the parts split; the scaling table's "
        f"{100 * scaling_efficiency:.1f} % ({100 * (scaling_efficiency - efficiency):+.1f} points) is from {why}"
    )


def loss_decomposition_table(runs: pd.DataFrame, scaling: pd.DataFrame) -> pd.DataFrame:
    """loss_decomposition.csv (module docstring) from the aggregation's runs.csv and scaling.csv."""
    rows = []
    counted = runs[runs["counts"].astype(bool) & runs["study"].isin(["strong", "weak"])]
    for _, cell in scaling[scaling["gpus"].gt(1) & scaling["study"].isin(["strong", "weak"])].iterrows():
        study, model, gpus = cell["study"], cell["model"], int(cell["gpus"])
        scaling_efficiency = finite_number(cell.get("efficiency"))
        base = {
            "study": study,
            "model": model,
            "gpus": gpus,
            "nodes": cell.get("nodes"),
            "efficiency": scaling_efficiency,
            "scaling_efficiency": scaling_efficiency,
        }
        base["loss"] = 1 - scaling_efficiency if scaling_efficiency is not None else None
        ones = [mean_step_s(run) for _, run in counted[counted["study"].eq(study) & counted["model"].eq(model) & counted["gpus"].eq(1)].iterrows()]
        ones = [step for step in ones if step is not None]
        if not ones:
            rows.append({**base, "repeats": 0, "note": "no completed one-GPU run of this study and model: no ideal to measure against"})
            continue
        ideal = float(pd.Series(ones).median()) / (gpus if study == "strong" else 1)
        cell_runs = counted[counted["study"].eq(study) & counted["model"].eq(model) & counted["gpus"].eq(gpus)]
        found = [run_quantities(run) for _, run in cell_runs.iterrows()]
        measured = [parts for parts in found if isinstance(parts, dict)]
        why = sorted({parts for parts in found if isinstance(parts, str)})
        row: dict[str, Any] = {**base, "repeats": len(measured), "ideal_step_s": ideal}
        if not measured:
            row["note"] = "; ".join(why) or "no completed run in this cell"
            rows.append(row)
            continue
        values = {name: np.array([q[name] for q in measured]) for name in QUANTITIES}
        median_run = {name: float(value) for name, value in at_median_step(values).items()}
        row["step_s"] = median_run["step"]
        # the loss the parts split: the median run's mean step against ideal (module docstring)
        row["efficiency"] = ideal / median_run["step"]
        row["loss"] = 1 - row["efficiency"]
        parts = parts_of(median_run, ideal)
        intervals: dict[str, tuple[float, float]] = {}
        if len(measured) >= 2:  # resample whole runs, so that each resample's parts add up too
            draws = repeats._rng(("loss", study, model, gpus)).integers(0, len(measured), size=(repeats.BOOTSTRAP_RESAMPLES, len(measured)))
            resampled = at_median_step({name: array[draws] for name, array in values.items()})
            for part, seconds in parts_of(resampled, ideal).items():
                intervals[part] = repeats.interval(seconds / resampled["step"])
        for part in PARTS:
            low, high = intervals.get(part, (math.nan, math.nan))
            row.update({part: float(parts[part]) / median_run["step"], f"{part}_ci_low": low, f"{part}_ci_high": high, f"{part}_s": float(parts[part])})
        row["parts_sum"] = sum(row[part] for part in NAMED_PARTS)
        # the probe's precision where the parts hold its overlap cost: its standard error, a share of
        # the step, by which compute inflation and exposed comm may move between each other
        se = [q["overlap_se"] for q in measured if math.isfinite(q.get("overlap_se", math.nan))]
        row["overlap_cost_se"] = float(np.median(se)) / median_run["step"] if se else None
        row["sum_error"] = row["parts_sum"] - row["loss"]
        largest = max(NAMED_PARTS, key=lambda part: row[part])
        if row[largest] > 0:
            row["bottleneck"], row["lever"] = BOTTLENECKS[largest]
        where = {q["measured_in"] for q in measured}
        notes = [f"{len(found) - len(measured)} of {len(found)} runs without parts: {'; '.join(why)}"] if why else []
        if scaling_efficiency is not None and abs(row["efficiency"] - scaling_efficiency) > BASIS_NOTE_POINTS:
            notes.append(_basis_note(study, row["efficiency"], scaling_efficiency))
        if "probe" in where:
            reasons = sorted({q["probe_reason"] for q in measured if q["measured_in"] == "probe"})
            notes.append(f"{FROM_PROBE} ({'; '.join(reasons)})")
        lent = cell_runs[cell_runs["probe_of"].notna() & cell_runs["probe_of"].ne(cell_runs["run_id"])] if "probe_of" in cell_runs else cell_runs.iloc[:0]
        if len(lent):
            notes.append(
                f"the overlap cost of {len(lent)} of {len(cell_runs)} runs is {', '.join(sorted(set(lent['probe_of'])))}'s probe"
                " (under the study budget each configuration is probed once, in its repeat 1)"
            )
        if "window, no overlap cost" in where:
            notes.append("no probe after the window (--comm-probe-steps 0): what the overlapped all-reduce costs the backward is in compute inflation")
        row["note"] = "; ".join(notes) or None
        rows.append(row)
    return pd.DataFrame(rows, columns=LOSS_DECOMPOSITION_COLUMNS)
