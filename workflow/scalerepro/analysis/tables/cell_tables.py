"""Cells of repeats and the tables built from them: scaling (strong and weak), sensitivity,
ablation, parallelism and cost, each figure a median with its spread over the cell's repeats.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import (
    ABLATION_COLUMNS,
    CELL_FACTS,
    CELL_SETTINGS,
    CELLS_COLUMNS,
    DEFAULT_NOISE_CV_MAX,
    PARALLELISM_COLUMNS,
    PARALLELISM_KEYS,
    SCALING_COLUMNS,
    SENSITIVITY_COLUMNS,
    SENSITIVITY_KEYS,
    SHARDING_FIGURES,
    WEAK_VARIATION,
)
from scalerepro.analysis.tables import repeats

# --------------------------------------------------------------------------------------------
# Cells: statistics over the completed repeats
# --------------------------------------------------------------------------------------------


def _joined(values: pd.Series) -> str:
    return ", ".join(sorted(values.dropna().astype(str).unique()))


def counts(runs: pd.DataFrame) -> pd.Series:
    """The runs that count: completed, the record agrees with its plan (a machine of its own
    included) and its cell's other repeats (``consistent``), and the run was a measurement (not
    a smoke run, whose figures are by-products of checking a code path). The ``counts`` column of
    runs.csv: read that column, do not call this again."""
    measurement = runs["purpose"].fillna("measurement").eq("measurement") if "purpose" in runs.columns else True
    return (runs["status"].eq("ok") & runs["consistent"].ne(False).fillna(True) & measurement).astype(bool)


def _values(runs: pd.DataFrame, column: str) -> pd.Series:
    """``column`` of the runs that count, NaN for the others (which median, min and max skip)."""
    return runs[column].where(runs["counts"])


def _seed(group: pd.DataFrame, shown: Sequence[str]) -> tuple[Any, ...]:
    """A cell's bootstrap key: the settings its table shows of it, as plain values."""
    return tuple(value.item() if isinstance(value, np.generic) else value for value in (group[column].iloc[0] for column in shown))


def cell_stats(runs: pd.DataFrame, shown: Sequence[str], noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    """One row per cell (the runs' ``cell``: the plan's, as scalerepro.record.cell holds its
    repeats to one configuration), in first-seen order: the settings of it a table ``shown``s (a
    cell's runs share them), repeats planned and counted, the median of each figure over the
    repeats that count, and the spread of the throughput (min, max, CV, the bootstrap 95 %
    interval of the median: scalerepro.analysis.tables.repeats, its resamples seeded by the shown
    settings); ``noisy`` when the CV exceeds ``noise_cv_max``."""
    ok = runs["counts"]
    measures = ["samples_per_s", "tokens_per_s", "step_time_median_s", "epoch_time_s", "exposed_comm_fraction"]
    # a repeat that does not count gets NaN, which median/min/max skip
    frame = runs[["cell", *shown]].join(runs[[*measures, "device_name"]].where(ok, axis=0)).assign(ok=ok)
    groups = frame.groupby("cell", sort=False)
    cells = groups.agg(
        **{column: (column, "first") for column in shown},
        repeats_ok=("ok", "sum"),
        repeats_total=("ok", "size"),
        samples_per_s_median=("samples_per_s", "median"),
        samples_per_s_min=("samples_per_s", "min"),
        samples_per_s_max=("samples_per_s", "max"),
        tokens_per_s_median=("tokens_per_s", "median"),
        step_time_median_s=("step_time_median_s", "median"),
        epoch_time_s=("epoch_time_s", "median"),
        exposed_comm_fraction=("exposed_comm_fraction", "median"),
        device_name=("device_name", _joined),
    ).reset_index()
    spread = [
        (repeats.describe(group["samples_per_s"], _seed(group, shown)), repeats.describe(group["epoch_time_s"], ("epoch", _seed(group, shown))))
        for _, group in groups
    ]
    cells["samples_per_s_cv"] = [thr["cv"] for thr, _ in spread]
    cells["samples_per_s_ci_low"] = [thr["ci_low"] for thr, _ in spread]
    cells["samples_per_s_ci_high"] = [thr["ci_high"] for thr, _ in spread]
    cells["epoch_time_cv"] = [epoch["cv"] for _, epoch in spread]
    # noisy: the throughput's CV over the repeats above the target (never with fewer than 2)
    cells["noisy"] = cells["samples_per_s_cv"].gt(noise_cv_max)
    return cells


# What each study's table shows of its cells (and so the key its bootstrap resamples are seeded
# by); another study's cells (reproduce, rebuild --records) show DEFAULT_SHOWN.
STUDY_SHOWN: dict[str, tuple[str, ...]] = {
    "strong": ("study", "model", "gpus", "nodes"),
    "weak": ("study", "model", "gpus", "nodes"),
    "sensitivity": SENSITIVITY_KEYS,
    "ablation": ("model", "gpus", "variant"),
    "parallelism": PARALLELISM_KEYS,
}
DEFAULT_SHOWN = ("study", "model", "gpus", "nodes", "variant")


def cells_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    """cells.csv: every cell of the study, each study's as its table states it (cell_stats over
    the cell's counted runs: the same medians, spread and intervals), with the settings that tell
    one configuration from another, MFU (median), the largest peak memory over the repeats (a
    figure a record holds wrongly is withheld by the reader, so never the largest), and the facts
    its records share (the peak MFU is against, the card's memory). What the headline reads."""
    frames = [cell_stats(group, STUDY_SHOWN.get(str(study), DEFAULT_SHOWN), noise_cv_max) for study, group in runs.groupby("study", sort=False)]
    if not frames:
        return pd.DataFrame(columns=list(CELLS_COLUMNS))
    cells = pd.concat(frames, ignore_index=True)
    settings = [c for c in CELL_SETTINGS if c in runs.columns]
    cells = cells.drop(columns=[c for c in settings if c in cells.columns]).merge(runs.groupby("cell", sort=False)[settings].first().reset_index(), on="cell")
    counted = runs[runs["counts"].astype(bool)].groupby("cell", sort=False)
    figures = counted.agg(
        mfu=("mfu", "median"), peak_memory_bytes=("peak_memory_bytes", "max"), **{fact: (fact, "first") for fact in CELL_FACTS if fact in runs.columns}
    )
    cells = cells.merge(figures.reset_index(), on="cell", how="left")
    return cells.reindex(columns=list(CELLS_COLUMNS))


def _cell_values(runs: pd.DataFrame, column: str, where: pd.Series) -> np.ndarray:
    return _values(runs, column)[where].dropna().to_numpy(dtype=float)


NO_REPEAT = "no completed repeat"


def _noise_note(cells: pd.DataFrame) -> pd.Series:
    return "noisy: throughput CV " + (100 * cells["samples_per_s_cv"]).round(1).astype(str) + " % over the repeats"


def scaling_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    scaled = runs[runs["study"].isin(["strong", "weak"])]
    cells = cell_stats(scaled, STUDY_SHOWN["strong"], noise_cv_max)
    one = cells.loc[cells["gpus"].eq(1), ["study", "model", "samples_per_s_median", "epoch_time_s"]]
    cells = cells.merge(one, on=["study", "model"], how="left", suffixes=("", "_1gpu"))
    thr, thr1 = cells["samples_per_s_median"], cells["samples_per_s_median_1gpu"]
    cells["samples_per_s_per_gpu"] = thr / cells["gpus"]
    cells["speedup"] = thr / thr1  # S(N) = thr(N) / thr(1)
    cells["ideal_speedup"] = cells["gpus"]
    cells["efficiency"] = np.where(
        cells["study"].eq("strong"),
        thr / (cells["gpus"] * thr1),  # strong: E = thr(N) / (N thr(1))
        cells["epoch_time_s_1gpu"] / cells["epoch_time_s"],  # weak: E = T(1) / T(N)
    )
    # the efficiency's 95 % interval: the same formula on paired bootstrap medians of the two cells
    low, high = [], []
    for study, model, gpus in zip(cells["study"], cells["model"], cells["gpus"]):
        at = scaled["study"].eq(study) & scaled["model"].eq(model)
        column = "samples_per_s" if study == "strong" else "epoch_time_s"
        n_cell = (_cell_values(scaled, column, at & scaled["gpus"].eq(gpus)), (study, model, gpus, column))
        one_cell = (_cell_values(scaled, column, at & scaled["gpus"].eq(1)), (study, model, 1, column))
        if study == "strong":
            bounds = repeats.ratio_interval([n_cell, one_cell], lambda n, one, g=gpus: n / (g * one))
        else:
            bounds = repeats.ratio_interval([n_cell, one_cell], lambda n, one: one / n)
        low.append(bounds[0])
        high.append(bounds[1])
    cells["efficiency_ci_low"], cells["efficiency_ci_high"] = low, high
    cells = cells.merge(weak_variation(scaled, cells), on=["study", "model"], how="left")
    cells["note"] = np.select(
        [cells["repeats_ok"].eq(0), thr1.isna(), cells["noisy"]],
        [NO_REPEAT, "no completed 1-GPU run of this study and model: speedup and efficiency undefined", _noise_note(cells)],
        "",
    )
    _say_whose_runs(cells, scaled)
    return cells.sort_values(["study", "model", "gpus"], kind="stable")[list(SCALING_COLUMNS)].reset_index(drop=True)


def _add_note(cells: pd.DataFrame, position: int, words: str) -> None:
    """Append ``words`` to the note of the cell at ``position`` ("; " between parts)."""
    cells.loc[cells.index[position], "note"] = "; ".join(filter(None, [cells["note"].iloc[position], words]))


def _runs_of_each_cell(cells: pd.DataFrame, runs: pd.DataFrame) -> Iterator[tuple[int, pd.Series]]:
    """Each cell's position in ``cells`` and the mask of its runs in ``runs``."""
    for index, cell in enumerate(cells["cell"]):
        yield index, runs["cell"].eq(cell)


def _say_whose_runs(cells: pd.DataFrame, runs: pd.DataFrame) -> None:
    """A cell whose runs another cell runs (one trainer run, run once: the strong and weak cells at
    the largest count at one batch, or an ablation's "all" that is a sensitivity cell) says whose,
    in its note."""
    if "record_of" not in runs.columns:
        return
    for index, at in _runs_of_each_cell(cells, runs):
        read = sorted({owner.rsplit("_r", 1)[0] for owner in runs.loc[at, "record_of"].fillna("") if owner})
        if read:
            said = f"the runs of {', '.join(read)} (one configuration: run once, read by both cells)"
            _add_note(cells, index, said)


def _say_probed_runs(cells: pd.DataFrame, runs: pd.DataFrame) -> None:
    """A cell whose exposed communication comes from fewer of its counted runs than its throughput
    (under a study budget only repeat 1 runs the probe: scalerepro.planning.study) says how many."""
    for index, of_cell in _runs_of_each_cell(cells, runs):
        at = of_cell & runs["counts"].astype(bool)
        probed, counted = int(runs.loc[at, "exposed_comm_fraction"].notna().sum()), int(at.sum())
        if 0 < probed < counted:
            _add_note(cells, index, f"exposed communication from the probe of {probed} of its {counted} runs (a budgeted study probes each configuration once)")


def weak_variation(scaled: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Per weak-scaling model with epoch times at two or more GPU counts: the variation
    (max T - min T) / min T over those counts, and its 95 % interval from paired bootstrap medians
    of every count's epoch time. One row per (study, model); the scaling table repeats it on each
    of the model's weak rows (a derived column, so a check on it is a plain select + reduce)."""
    weak = cells[cells["study"].eq("weak")].dropna(subset=["epoch_time_s"])
    rows = []
    for model, group in weak.groupby("model", sort=False):
        if len(group) < 2:
            continue
        times = group["epoch_time_s"]
        at = scaled["study"].eq("weak") & scaled["model"].eq(model)
        per_count = [(_cell_values(scaled, "epoch_time_s", at & scaled["gpus"].eq(g)), ("weak", model, g, "epoch_time_s")) for g in sorted(group["gpus"])]
        low, high = repeats.ratio_interval(per_count, lambda *m: (np.max(m, axis=0) - np.min(m, axis=0)) / np.min(m, axis=0))
        rows.append(("weak", model, (times.max() - times.min()) / times.min(), low, high))
    return pd.DataFrame(rows, columns=["study", "model", *WEAK_VARIATION])


def sensitivity_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    sensitivity = runs[runs["study"].eq("sensitivity")]
    cells = cell_stats(sensitivity, STUDY_SHOWN["sensitivity"], noise_cv_max)
    cells["note"] = np.select([cells["repeats_ok"].eq(0), cells["noisy"]], [NO_REPEAT, _noise_note(cells)], "")
    _say_whose_runs(cells, sensitivity)
    _say_probed_runs(cells, sensitivity)
    return cells[list(SENSITIVITY_COLUMNS)]


def ablation_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    ablation = runs[runs["study"].eq("ablation")]
    cells = cell_stats(ablation, STUDY_SHOWN["ablation"], noise_cv_max)
    baseline = cells.loc[cells["variant"].eq("baseline"), ["model", "gpus", "samples_per_s_median"]]
    cells = cells.merge(baseline, on=["model", "gpus"], how="left", suffixes=("", "_baseline"))  # keeps matrix order
    # G = thr(variant) / thr(baseline) - 1
    cells["gain"] = cells["samples_per_s_median"] / cells["samples_per_s_median_baseline"] - 1
    low, high = [], []
    for model, gpus, variant in zip(cells["model"], cells["gpus"], cells["variant"]):
        at = ablation["model"].eq(model) & ablation["gpus"].eq(gpus)
        this = (_cell_values(ablation, "samples_per_s", at & ablation["variant"].eq(variant)), (model, gpus, variant))
        base = (_cell_values(ablation, "samples_per_s", at & ablation["variant"].eq("baseline")), (model, gpus, "baseline"))
        if variant != "baseline":
            bounds = repeats.ratio_interval([this, base], lambda v, b: v / b - 1)
        else:  # the baseline against itself: exactly 0, where it has a completed repeat at all
            bounds = (0.0, 0.0) if len(this[0]) else (np.nan, np.nan)
        low.append(bounds[0])
        high.append(bounds[1])
    cells["gain_ci_low"], cells["gain_ci_high"] = low, high
    cells["note"] = np.select(
        [cells["repeats_ok"].eq(0), cells["samples_per_s_median_baseline"].isna(), cells["noisy"]],
        [NO_REPEAT, "no completed baseline run: gain undefined", _noise_note(cells)],
        "",
    )
    # The trainer's fp32 is IEEE fp32 on the GPU for convolutions too (training.trainer:
    # _precision_setup), where stock PyTorch lets cuDNN run fp32 convolutions as TF32: a baseline
    # stricter than stock, so each gain against it is larger than against stock PyTorch.
    strict = _strict_fp32_baselines(ablation)
    for index, (model, gpus) in enumerate(zip(cells["model"], cells["gpus"])):
        if (model, gpus) in strict and (cells["variant"].iloc[index] == "baseline" or pd.notna(cells["gain"].iloc[index])):
            words = STRICT_FP32 if cells["variant"].iloc[index] == "baseline" else "a gain against that stricter baseline"
            _add_note(cells, index, words)
    _say_whose_runs(cells, ablation)
    # "all" is the study's preset as it resolved where it ran (on a CPU that emulates bf16 it trains
    # fp32): its row names the levers its records state
    for index, (model, gpus, variant) in enumerate(zip(cells["model"], cells["gpus"], cells["variant"])):
        if variant == "all":
            levers = _resolved_levers(
                ablation[
                    ablation["counts"].fillna(False).astype(bool) & ablation["model"].eq(model) & ablation["gpus"].eq(gpus) & ablation["variant"].eq("all")
                ]
            )
            if levers:
                _add_note(cells, index, f"the study's preset as it resolved here: {levers}")
    # A bf16 cell on a CPU that emulates bf16 loses against fp32 by the emulation, not by a fault of
    # the lever: its records say so (knobs.precision_reason), and so does its row.
    emulated = _emulated_bf16(ablation)
    for index, (model, gpus, variant) in enumerate(zip(cells["model"], cells["gpus"], cells["variant"])):
        reason = emulated.get((model, gpus, variant))
        if reason:
            _add_note(cells, index, f"bf16 emulated on this CPU: {reason}")
    return cells[list(ABLATION_COLUMNS)]


LEVER_WORDS = {
    "precision_recorded": "precision",
    "channels_last": "channels_last",
    "compile_mode": "compile",
    "loader": "loader",
    "optimizer_impl": "optimizer",
    "cudnn_benchmark": "cuDNN benchmark",
}


def _resolved_levers(runs: pd.DataFrame) -> str:
    """The levers a cell's records state, "precision fp32, channels_last True, ...", each value
    the runs agree on (a cell mixing them is not counted: readers._mixed_cells)."""
    said = []
    for column, word in LEVER_WORDS.items():
        values = sorted({str(v) for v in runs[column].dropna()}) if column in runs.columns else []
        if len(values) == 1:
            said.append(f"{word} {values[0]}")
    return ", ".join(said)


STRICT_FP32 = "a baseline stricter than stock PyTorch: fp32 with TF32 off for convolutions as for matmuls (stock PyTorch runs fp32 convolutions as TF32)"


def _strict_fp32_baselines(runs: pd.DataFrame) -> set[tuple]:
    """(model, gpus) of the ablations whose counted baseline runs trained fp32 on a GPU."""
    base = runs[runs["counts"].fillna(False).astype(bool) & runs["variant"].eq("baseline")]
    base = base[base["precision_recorded"].eq("fp32") & base["device_type"].eq("cuda")]
    return set(zip(base["model"], base["gpus"]))


def _emulated_bf16(runs: pd.DataFrame) -> dict[tuple, str]:
    """(model, gpus, variant) -> the records' reason, for the cells whose completed runs trained bf16
    on a CPU without native bf16 (scalerepro.common.cpu_features, as the trainer recorded it)."""
    done = runs[runs["counts"].fillna(False).astype(bool) & runs["precision_recorded"].eq("bf16")]
    reasons = done["precision_reason"].astype("string").fillna("")  # records before the field: a column of NaN floats
    hit = done[reasons.str.contains("emulate", regex=False)]
    return {key: str(group["precision_reason"].iloc[0]).split(": ", 1)[-1] for key, group in hit.groupby(["model", "gpus", "variant"])}


def parallelism_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    """One row per (model, gpus, strategy) of the ``parallelism`` study, in matrix order: the
    throughput's statistics (cell_stats), tokens/s with its interval, and the medians over the
    counted repeats of MFU, peak memory per GPU and the sharding figures. Every empty figure of a
    cell with a completed repeat is named in ``note`` as "not measured: <figure> (<why>)"."""
    study = runs[runs["study"].eq("parallelism")]
    shown = STUDY_SHOWN["parallelism"]
    cells = cell_stats(study, shown, noise_cv_max)
    groups = study.assign(**{c: _values(study, c) for c in ("tokens_per_s", "mfu", "peak_memory_bytes", *SHARDING_FIGURES)}).groupby("cell", sort=False)
    tokens = [repeats.describe(group["tokens_per_s"], ("tokens", *_seed(group, shown))) for _, group in groups]
    cells["tokens_per_s_ci_low"] = [t["ci_low"] for t in tokens]
    cells["tokens_per_s_ci_high"] = [t["ci_high"] for t in tokens]
    # tokens/s per GPU = tokens/s (global, median over the repeats) / gpus
    cells["tokens_per_s_per_gpu"] = cells["tokens_per_s_median"] / cells["gpus"]
    # MFU = achieved FLOP/s / (gpus x peak FLOP/s per GPU), as each record computed it; median here
    figures = groups[["mfu", "peak_memory_bytes", *SHARDING_FIGURES]].median().reset_index(drop=True)
    for column in figures:
        cells[column] = figures[column].to_numpy()
    counted = study[study["counts"]].groupby("cell", sort=False)
    text = {
        c: counted[c].agg(_joined)
        for c in ("peak_memory_kind", "mesh", "reshard_after_forward", "peak_flops_source", "comm_reason", "comm_by_collective", "activations_reason")
    }
    for column, values in text.items():
        cells[column] = [values.get(cell, "") for cell in cells["cell"]]
    cells["note"] = [_parallelism_note(cell) for cell in cells.to_dict("records")]
    return cells[list(PARALLELISM_COLUMNS)]


def _parallelism_note(cell: Mapping[str, Any]) -> str:
    """Why each empty figure of a parallelism cell is empty, so a hole never reads as a zero."""
    if not cell["repeats_ok"]:
        return f"not measured: {NO_REPEAT} of {cell['repeats_total']} planned (see the failed or missing runs)"
    notes, sharded = [], cell["parallel"] != "ddp"
    if pd.isna(cell["tokens_per_s_median"]):
        notes.append("not measured: tokens/s (the model has no tokens per sample)")
    if pd.isna(cell["mfu"]):
        notes.append(f"not measured: MFU ({cell['peak_flops_source'] or 'the records give no peak FLOP/s'})")
    if pd.isna(cell["peak_memory_bytes"]):
        notes.append("not measured: peak memory (the records give none)")
    elif cell["peak_memory_kind"] == "rss":
        notes.append("peak memory is a rank's peak RSS (host memory, no GPU), not device memory")
    elif cell["peak_memory_kind"] == "cuda_reserved":
        notes.append(
            "peak memory is the CUDA allocator's reserved peak: the run replayed CUDA graphs, whose private pools its allocated count misses (an upper bound)"
        )
    if pd.isna(cell["state_bytes_per_rank_max"]):
        notes.append(
            "not measured: state bytes per rank (the trainer records them for sharded runs; under ddp every rank holds the whole model and optimizer state)"
            if not sharded
            else "not measured: state bytes per rank (the records have no sharding entry)"
        )
    if pd.isna(cell["comm_bytes_per_step"]):
        why = cell["comm_reason"] or (
            "not counted under ddp: the trainer counts it for the sharded strategies (fsdp, tp, fsdp+tp, pp)"
            if not sharded
            else "the records have no analytic volume"
        )
        notes.append(f"not measured: communication per step ({why})")
    if pd.isna(cell["activations_bytes_per_rank"]) and not pd.isna(cell["params_bytes_per_rank"]):
        notes.append(f"not measured: activation memory ({cell['activations_reason'] or 'the records give none'})")
    if cell["noisy"]:
        notes.append(f"noisy: throughput CV {100 * cell['samples_per_s_cv']:.1f} % over the repeats")
    return "; ".join(notes)


# --------------------------------------------------------------------------------------------
# Cost, summary, entry points
# --------------------------------------------------------------------------------------------


def cost_table(runs: pd.DataFrame) -> pd.DataFrame:
    # a row that reads another cell's run (record_of) is no job of its own: it uses and requests nothing
    own = runs["record_of"].fillna("").eq("") if "record_of" in runs.columns else pd.Series(True, index=runs.index)
    runs = runs.assign(duration_s=runs["duration_s"].where(own), runtime_min=runs["runtime_min"].where(own))
    hours = runs.assign(
        gpu_hours_used=runs["duration_s"] * runs["gpus"] / 3600,  # runs without a record add nothing
        node_hours_used=runs["duration_s"] * runs["nodes"] / 3600,
        gpu_hours_requested=runs["runtime_min"] / 60 * runs["gpus"],
        node_hours_requested=runs["runtime_min"] / 60 * runs["nodes"],
    )
    columns = ["gpu_hours_used", "node_hours_used", "gpu_hours_requested", "node_hours_requested"]
    per_study = hours.groupby("study", sort=False).agg(runs=("run_id", "size"), **{c: (c, "sum") for c in columns})
    per_study.loc["total"] = per_study.sum()
    return per_study.rename_axis("study").reset_index().astype({"runs": int})
