"""Run records + the study matrix -> tidy tables for the plots and the report.

    python -m scalerepro.analysis.aggregate --matrix results/tables/matrix.csv \
        --comm results/comm/g2.json results/comm/g4.json --references config/references.yaml \
        --out results/tables --target strong_efficiency_min=0.7 --target strong_efficiency_gpus=8

Inputs: the matrix (one row per *expected* run, with the path of its record; relative paths are
resolved against the current directory, the workflow's working directory), the run records
(``workflow/schemas/run_record.schema.json``), one all-reduce benchmark file per GPU count
(``scalerepro.commbench``) and the published references (``config/references.yaml``). Only the
record fields listed below are read. Nothing is invented: a figure that cannot be computed is
empty (NaN) and a ``note``/``detail`` column says why.

Definitions. A *cell* is a group of matrix rows that differ only in ``repeat``. A run *counts*
when its status is ``ok`` and its record agrees with the matrix (``consistent`` is not false);
a cell's statistics, and the run-level checks, are over the runs that count (any other repeat
is in ``repeats_total`` only). thr = median samples/s of a cell, T = median time per epoch of a cell.

    speedup               S(N) = thr(N) / thr(1)             thr(1): same study and model at 1 GPU
    strong efficiency     E(N) = thr(N) / (N thr(1))         (= T(1) / (N T(N)), global batch fixed)
    weak efficiency       E(N) = T(1) / T(N)                 (per-GPU batch and data fixed)
    ablation gain         G    = thr(variant) / thr(baseline) - 1
    all-reduce bandwidth  algbw = size / t,  busbw = algbw * 2 (N - 1) / N   (nccl-tests)
    comparison ratio      measured / published
    weak variation        (max T - min T) / min T over the GPU counts of a model

Tables written to ``--out`` (CSV, one row per line described):

runs.csv -- one row per matrix row (a run without a record is ``missing``, never dropped).
    The matrix columns: run_id, study, model, gpus (world size), nodes, gpus_per_node, repeat,
    variant, precision, per_rank_batch, global_batch, bucket_cap_mb, runtime_min (time limit
    requested per run), record (path of its record), rerun (the command that reruns it); then
    status            ok | failed | preempted | missing
    error             the record's error message; for a missing run, why there is no record
    stop_signal       SIGTERM | SIGUSR1 when the run was stopped by one
    consistent        the record's world size and node count equal the matrix's gpus and nodes
                      (empty when the record does not say)
    samples_per_s, tokens_per_s                  measured window, global (measurements.*)
    step_time_median_s, step_time_p10_s, step_time_p90_s
    epoch_time_s      steps per epoch x median step time
    window_s          seconds of the measured window
    mfu, exposed_comm_fraction, data_stall_fraction          fractions (0..1)
    gpu_util_mean_pct, power_mean_w (sum over GPUs), energy_j, energy_per_sample_j   NVML
    nvml_reason       why NVML figures are empty (e.g. a CPU run)
    peak_memory_bytes peak CUDA allocated bytes, else the peak RSS of a rank
    peak_memory_kind  cuda_allocated | rss
    final_train_loss, final_eval_loss, final_eval_accuracy   the last history entry
    duration_s        ended_at - started_at of the record
    device_type       cuda | cpu
    device_name       hardware.gpu.name, else the CPU model
    world_size_recorded, nodes_recorded, slurm_job_id, git_commit, git_dirty, torch_version,
    started_at        ISO 8601, UTC
epochs.csv -- one row per history entry of every record: run_id, epoch, step, complete
    (false for a partial last epoch), train_loss, eval_loss, eval_accuracy.
loss_log.csv -- one row per logged step of every record: run_id, step, loss, samples_per_s.
scaling.csv -- one row per (study in strong|weak, model, gpus): study, model, gpus, nodes,
    repeats_ok, repeats_total, samples_per_s_median, samples_per_s_min, samples_per_s_max,
    samples_per_s_per_gpu (median / gpus), step_time_median_s, epoch_time_s (medians),
    speedup, ideal_speedup (= gpus), efficiency (strong or weak, above), note.
sensitivity.csv -- one row per (model, gpus, bucket_cap_mb, per_rank_batch, precision):
    those, repeats_ok, repeats_total, samples_per_s_median, samples_per_s_min,
    samples_per_s_max, step_time_median_s, exposed_comm_fraction (median), note.
ablation.csv -- one row per (model, gpus, variant), in matrix order (baseline first): those,
    repeats_ok, repeats_total, samples_per_s_median, samples_per_s_min, samples_per_s_max,
    gain (fraction; 0.25 = 25 % faster than the baseline), note.
communication.csv -- one row per (gpus, size_bytes): gpus, size_bytes, nodes, backend,
    time_us_median (slowest rank's median of single all-reduces: not nccl-tests' time, see
    scalerepro.commbench), algbw_gbps, busbw_gbps (GB = 1e9 bytes).
comparison.csv -- one row per reference in references.yaml: reference (its id), model, gpus,
    metric (samples_per_s | tokens_per_s_per_gpu), measured (the best median among the
    completed strong, weak and ablation-"all" cells of that model and GPU count; empty when
    none), published, ratio, measured_cell (which cell), measured_device, gpu, precision,
    source, conditions (the reference's), note.
checks.csv -- one row per check whose threshold is given (``--target``): check (the threshold's
    key), target (text: what is checked and against what), threshold (number), measured (number,
    in the threshold's unit), value (``measured`` as text), status (pass | fail | not measured),
    detail (which cells, or why it was not measured).
cost.csv -- one row per study plus a ``total`` row: study, runs (matrix rows),
    gpu_hours_used = sum(duration_s x gpus) / 3600 and node_hours_used = sum(duration_s x
    nodes) / 3600 over the runs with a record, gpu_hours_requested = sum(runtime_min / 60 x
    gpus) and node_hours_requested over every matrix row (what an allocation request states).
    On a CPU study "gpus" are ranks.
scaling_model.csv -- the alpha-beta model's predicted step time and efficiency beside the
    measured ones, and predictions alone beyond the study's hardware (``--predict-gpus``): see
    ``scalerepro.analysis.scaling_model``.
summary.json -- run counts by status, device names and types, git commits, torch versions,
    inconsistent runs and check counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from . import scaling_model

MATRIX_COLUMNS = (
    "run_id", "study", "model", "gpus", "nodes", "gpus_per_node", "repeat", "variant", "precision", "per_rank_batch",
    "global_batch", "bucket_cap_mb", "runtime_min", "record", "rerun",
)  # fmt: skip
STATUSES = ("ok", "failed", "preempted", "missing")

# runs.csv column <- path of the value in a run record.
RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "status": ("status",),
    "stop_signal": ("stop_signal",),
    "samples_per_s": ("measurements", "samples_per_s"),
    "tokens_per_s": ("measurements", "tokens_per_s"),
    "step_time_median_s": ("measurements", "step_time_s", "median"),
    "step_time_p10_s": ("measurements", "step_time_s", "p10"),
    "step_time_p90_s": ("measurements", "step_time_s", "p90"),
    "epoch_time_s": ("measurements", "epoch_time_s"),
    "window_s": ("measurements", "window_s"),
    "mfu": ("measurements", "mfu"),
    "exposed_comm_fraction": ("measurements", "exposed_communication", "fraction"),
    "data_stall_fraction": ("measurements", "data_stall_fraction"),
    "gpu_util_mean_pct": ("measurements", "nvml", "gpu_util_mean_pct"),
    "power_mean_w": ("measurements", "nvml", "power_mean_w"),
    "energy_j": ("measurements", "nvml", "energy_j"),
    "energy_per_sample_j": ("measurements", "energy_per_sample_j"),
    "nvml_reason": ("measurements", "nvml", "reason"),
    "device_type": ("parallel", "device_type"),
    "world_size_recorded": ("parallel", "world_size"),
    "nodes_recorded": ("parallel", "nodes"),
    "slurm_job_id": ("slurm", "job_id"),
    "git_commit": ("git", "commit"),
    "git_dirty": ("git", "dirty"),
    "torch_version": ("versions", "torch"),
    "started_at": ("started_at",),
    "ended_at": ("ended_at",),
}
# The columns read_record gives: those above and the ones it derives.
RECORD_COLUMNS = (
    "run_id", *RECORD_FIELDS, "error", "peak_memory_bytes", "peak_memory_kind", "final_train_loss", "final_eval_loss",
    "final_eval_accuracy", "device_name",
)  # fmt: skip
RUN_COLUMNS = (
    *MATRIX_COLUMNS, "status", "error", "stop_signal", "consistent", "samples_per_s", "tokens_per_s",
    "step_time_median_s", "step_time_p10_s", "step_time_p90_s", "epoch_time_s", "window_s", "mfu",
    "exposed_comm_fraction", "data_stall_fraction", "gpu_util_mean_pct", "power_mean_w", "energy_j",
    "energy_per_sample_j", "nvml_reason", "peak_memory_bytes", "peak_memory_kind", "final_train_loss",
    "final_eval_loss", "final_eval_accuracy", "duration_s", "device_type", "device_name", "world_size_recorded",
    "nodes_recorded", "slurm_job_id", "git_commit", "git_dirty", "torch_version", "started_at",
)  # fmt: skip
EPOCH_COLUMNS = ("run_id", "epoch", "step", "complete", "train_loss", "eval_loss", "eval_accuracy")
LOSS_COLUMNS = ("run_id", "step", "loss", "samples_per_s")
COMM_COLUMNS = ("gpus", "size_bytes", "nodes", "backend", "time_us_median", "algbw_gbps", "busbw_gbps")
REFERENCE_COLUMNS = ("id", "model", "gpus", "metric", "value", "gpu", "precision", "source", "conditions")
THROUGHPUT = ("samples_per_s_median", "samples_per_s_min", "samples_per_s_max")
SCALING_COLUMNS = (
    "study", "model", "gpus", "nodes", "repeats_ok", "repeats_total", *THROUGHPUT, "samples_per_s_per_gpu",
    "step_time_median_s", "epoch_time_s", "speedup", "ideal_speedup", "efficiency", "note",
)  # fmt: skip
SENSITIVITY_KEYS = ("model", "gpus", "bucket_cap_mb", "per_rank_batch", "precision")
SENSITIVITY_COLUMNS = (
    *SENSITIVITY_KEYS, "repeats_ok", "repeats_total", *THROUGHPUT, "step_time_median_s", "exposed_comm_fraction", "note",
)  # fmt: skip
ABLATION_COLUMNS = ("model", "gpus", "variant", "repeats_ok", "repeats_total", *THROUGHPUT, "gain", "note")
COMPARISON_COLUMNS = (
    "reference", "model", "gpus", "metric", "measured", "published", "ratio", "measured_cell", "measured_device",
    "gpu", "precision", "source", "conditions", "note",
)  # fmt: skip
CHECK_COLUMNS = ("check", "target", "threshold", "measured", "value", "status", "detail")
CHECK_STATUSES = ("pass", "fail", "not measured")
# What each check measures, by its target key (the target text starts with it).
CHECK_NAMES = {
    "strong_efficiency_min": "strong-scaling efficiency",
    "weak_variation_max": "weak-scaling time-per-epoch variation",
    "optimisation_gain_min": "optimisation gain (all vs baseline)",
    "gpu_util_min_pct": "GPU utilisation",
    "exposed_comm_max": "exposed communication",
    "data_stall_max": "data-loader stall",
}

# Targets: key -> what it sets.
TARGETS = {
    "strong_efficiency_min": "strong-scaling efficiency at least this (fraction) ...",
    "strong_efficiency_gpus": "... at this GPU count (default: the largest strong-scaling count)",
    "weak_variation_max": "weak-scaling time-per-epoch variation at most this (fraction)",
    "optimisation_gain_min": 'ablation "all" vs baseline throughput gain at least this (fraction)',
    "gpu_util_min_pct": "mean GPU utilisation above this (percent)",
    "exposed_comm_max": "exposed communication of every multi-GPU run below this (fraction)",
    "data_stall_max": "data-loader stall of every run below this (fraction)",
}


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


def _dig(document: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def read_record(run_id: str, path: str) -> tuple[dict[str, Any], list[tuple], list[tuple]]:
    """One record as (its runs.csv fields, its epochs.csv rows, its loss_log.csv rows).
    A record that is absent or unreadable gives status "missing" and the reason as its error."""
    try:
        document = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        return {"run_id": run_id, "status": "missing", "error": f"no run record at {path}"}, [], []
    except (OSError, ValueError) as error:
        return {"run_id": run_id, "status": "missing", "error": f"unreadable run record {path}: {error}"}, [], []
    fields = {column: _dig(document, where) for column, where in RECORD_FIELDS.items()}
    memory = _dig(document, ("measurements", "memory")) or {}
    allocated, rss = memory.get("allocated_bytes_max"), memory.get("rss_bytes_max")
    history = document.get("history") or []
    last = history[-1] if history else {}
    fields.update(
        run_id=run_id,
        error=_dig(document, ("error", "message")),
        peak_memory_bytes=rss if allocated is None else allocated,
        peak_memory_kind="cuda_allocated" if allocated is not None else "rss" if rss is not None else None,
        final_train_loss=last.get("train_loss"),
        final_eval_loss=last.get("eval_loss"),
        final_eval_accuracy=last.get("eval_accuracy"),
        device_name=_dig(document, ("hardware", "gpu", "name")) or _dig(document, ("hardware", "cpu_model")),
    )
    if fields["status"] == "ok" and not (_dig(document, ("measurements", "measured_steps")) and fields["samples_per_s"]):
        # A record with no measurements is a failure, whatever it says of itself.
        fields.update(status="failed", error="the record says ok but its measured window is empty (no steps, no throughput)")
    if fields["slurm_job_id"] is not None:
        fields["slurm_job_id"] = str(fields["slurm_job_id"])  # an integer or a string in the schema
    epochs = [(run_id, *map(entry.get, EPOCH_COLUMNS[1:])) for entry in history]
    losses = [(run_id, *map(entry.get, LOSS_COLUMNS[1:])) for entry in document.get("loss_log") or []]
    return fields, epochs, losses


def read_matrix(path: str | os.PathLike[str]) -> pd.DataFrame:
    matrix = pd.read_csv(path, dtype={"run_id": str, "variant": str, "record": str, "rerun": str})
    absent = [column for column in MATRIX_COLUMNS if column not in matrix.columns]
    if absent:
        raise ValueError(f"{path}: the study matrix lacks the columns {absent}")
    if matrix["run_id"].duplicated().any():
        raise ValueError(f"{path}: run_id repeats: {sorted(matrix.loc[matrix.run_id.duplicated(), 'run_id'])}")
    return matrix.assign(variant=matrix["variant"].fillna(""))


def read_runs(matrix: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """runs, epochs and loss_log tables: every matrix row left-joined with its record."""
    # Sequential on purpose: json.loads holds the GIL and a page-cached read is ~20 us, so a
    # thread pool was measured slower (10,000 records: 1.5-2.8 s with 2-8 threads vs 1.1 s).
    parsed = list(map(read_record, matrix["run_id"], matrix["record"]))
    fields = pd.DataFrame.from_records([p[0] for p in parsed], columns=RECORD_COLUMNS)
    runs = matrix.merge(fields, on="run_id", how="left", validate="one_to_one")
    ended = pd.to_datetime(runs["ended_at"], format="ISO8601", utc=True)
    started = pd.to_datetime(runs["started_at"], format="ISO8601", utc=True)
    runs["duration_s"] = (ended - started).dt.total_seconds()
    for column in ("world_size_recorded", "nodes_recorded", "peak_memory_bytes"):
        runs[column] = runs[column].astype("Int64")
    recorded = runs["world_size_recorded"].notna() & runs["nodes_recorded"].notna()
    matches = runs["world_size_recorded"].eq(runs["gpus"]) & runs["nodes_recorded"].eq(runs["nodes"])
    runs["consistent"] = matches.astype("boolean").where(recorded)
    runs["git_dirty"] = runs["git_dirty"].astype("boolean")
    epochs = pd.DataFrame.from_records([row for p in parsed for row in p[1]], columns=EPOCH_COLUMNS)
    losses = pd.DataFrame.from_records([row for p in parsed for row in p[2]], columns=LOSS_COLUMNS)
    return runs[list(RUN_COLUMNS)], epochs, losses


# --------------------------------------------------------------------------------------------
# Cells: statistics over the completed repeats
# --------------------------------------------------------------------------------------------


def _joined(values: pd.Series) -> str:
    return ", ".join(sorted(values.dropna().astype(str).unique()))


def counts(runs: pd.DataFrame) -> pd.Series:
    """The runs that count: completed, and the record agrees with the plan."""
    return (runs["status"].eq("ok") & runs["consistent"].ne(False).fillna(True)).astype(bool)


def cell_stats(runs: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """One row per cell (``keys``), in first-seen order: repeats planned and counted, and the
    median (and min/max of throughput) of each figure over the repeats that count."""
    ok = counts(runs)
    measures = ["samples_per_s", "tokens_per_s", "step_time_median_s", "epoch_time_s", "exposed_comm_fraction"]
    # a repeat that does not count gets NaN, which median/min/max skip
    frame = runs[list(keys)].join(runs[[*measures, "device_name"]].where(ok, axis=0)).assign(ok=ok)
    return (
        frame.groupby(list(keys), sort=False, dropna=False)
        .agg(
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
        )
        .reset_index()
    )


NO_REPEAT = "no completed repeat"


def scaling_table(runs: pd.DataFrame) -> pd.DataFrame:
    cells = cell_stats(runs[runs["study"].isin(["strong", "weak"])], ["study", "model", "gpus", "nodes"])
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
    cells["note"] = np.select(
        [cells["repeats_ok"].eq(0), thr1.isna()],
        [NO_REPEAT, "no completed 1-GPU run of this study and model: speedup and efficiency undefined"],
        "",
    )
    return cells.sort_values(["study", "model", "gpus"], kind="stable")[list(SCALING_COLUMNS)].reset_index(drop=True)


def sensitivity_table(runs: pd.DataFrame) -> pd.DataFrame:
    cells = cell_stats(runs[runs["study"].eq("sensitivity")], SENSITIVITY_KEYS)
    cells["note"] = np.where(cells["repeats_ok"].eq(0), NO_REPEAT, "")
    return cells[list(SENSITIVITY_COLUMNS)]


def ablation_table(runs: pd.DataFrame) -> pd.DataFrame:
    cells = cell_stats(runs[runs["study"].eq("ablation")], ["model", "gpus", "variant"])
    baseline = cells.loc[cells["variant"].eq("baseline"), ["model", "gpus", "samples_per_s_median"]]
    cells = cells.merge(baseline, on=["model", "gpus"], how="left", suffixes=("", "_baseline"))  # keeps matrix order
    # G = thr(variant) / thr(baseline) - 1
    cells["gain"] = cells["samples_per_s_median"] / cells["samples_per_s_median_baseline"] - 1
    cells["note"] = np.select(
        [cells["repeats_ok"].eq(0), cells["samples_per_s_median_baseline"].isna()],
        [NO_REPEAT, "no completed baseline run: gain undefined"],
        "",
    )
    return cells[list(ABLATION_COLUMNS)]


# --------------------------------------------------------------------------------------------
# Communication and published references
# --------------------------------------------------------------------------------------------


def communication_table(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """All-reduce results of every file; the bandwidths are checked against the times."""
    frames = []
    for path in paths:
        document = json.loads(Path(path).read_text())
        frame = pd.DataFrame(document["results"], columns=["size_bytes", "time_us_median", "algbw_gbps", "busbw_gbps"])
        n = document["world_size"]
        algbw = frame["size_bytes"] / (frame["time_us_median"] * 1e3)  # algbw = size / t, in GB/s
        busbw = algbw * 2 * (n - 1) / n  # busbw = algbw * 2 (N - 1) / N
        consistent = np.allclose(frame["algbw_gbps"], algbw, rtol=1e-6) and np.allclose(
            frame["busbw_gbps"], busbw, rtol=1e-6
        )
        if not consistent:
            raise ValueError(f"{path}: algbw_gbps/busbw_gbps disagree with size / time and 2 (N - 1) / N for N = {n}")
        frames.append(frame.assign(gpus=n, nodes=document["nodes"], backend=document["backend"]))
    if not frames:
        return pd.DataFrame(columns=COMM_COLUMNS)
    table = pd.concat(frames, ignore_index=True)[list(COMM_COLUMNS)]
    return table.sort_values(["gpus", "size_bytes"], ignore_index=True)


def read_references(path: str | os.PathLike[str]) -> pd.DataFrame:
    entries = (yaml.safe_load(Path(path).read_text()) or {}).get("references") or []
    return pd.DataFrame(entries).reindex(columns=REFERENCE_COLUMNS)


def comparison_table(runs: pd.DataFrame, references: pd.DataFrame) -> pd.DataFrame:
    """Each reference beside the best completed cell of the same model and GPU count."""
    eligible = runs["study"].isin(["strong", "weak"]) | (runs["study"].eq("ablation") & runs["variant"].eq("all"))
    cells = cell_stats(runs[eligible], ["model", "gpus", "study", "variant", "precision", "per_rank_batch"])
    cells = cells[cells["repeats_ok"].gt(0)]
    study = cells["study"].where(cells["variant"].eq(""), cells["study"] + " " + cells["variant"])
    batch = cells["precision"].astype(str) + ", batch " + cells["per_rank_batch"].astype(str) + "/GPU"
    cells = cells.assign(
        samples_per_s=cells["samples_per_s_median"],
        tokens_per_s_per_gpu=cells["tokens_per_s_median"] / cells["gpus"],
        measured_cell=study + ", " + batch + ", median of " + cells["repeats_ok"].astype(str),
        measured_device=cells["device_name"],
    )
    measured = (
        cells.melt(
            ["model", "gpus", "measured_cell", "measured_device"],
            ["samples_per_s", "tokens_per_s_per_gpu"],
            var_name="metric",
            value_name="measured",
        )
        .dropna(subset=["measured"])
        .sort_values("measured", ascending=False)
        .drop_duplicates(["model", "gpus", "metric"])  # the best cell per model, GPU count and metric
    )
    table = references.rename(columns={"id": "reference", "value": "published"}).merge(
        measured, on=["model", "gpus", "metric"], how="left"
    )
    table["ratio"] = table["measured"] / table["published"]
    table["note"] = np.where(
        table["measured"].isna(),
        "not measured: no completed strong, weak or ablation-all run of this model at this GPU count gives "
        + table["metric"].astype(str),
        "",
    )
    return table[list(COMPARISON_COLUMNS)]


# --------------------------------------------------------------------------------------------
# Checks against the targets
# --------------------------------------------------------------------------------------------


def _verdict(
    check: str,
    target: str,
    threshold: float,
    detail: str,
    measured: float | None = None,
    passed: bool = False,
    value: str = "",
) -> dict[str, Any]:
    """One checks.csv row; without ``measured`` the check is "not measured" and ``detail`` says why."""
    status = "not measured" if measured is None else "pass" if passed else "fail"
    target = f"{CHECK_NAMES[check]} {target}"
    return dict(zip(CHECK_COLUMNS, (check, target, threshold, measured, value, status, detail)))


def _listing(frame: pd.DataFrame, label: str, column: str, fmt: str) -> str:
    return ", ".join(f"{name} {value:{fmt}}" for name, value in zip(frame[label], frame[column]))


def _strong_efficiency(t: Mapping[str, pd.DataFrame], targets: Mapping[str, float]) -> dict:
    minimum = targets["strong_efficiency_min"]
    strong = t["scaling"][t["scaling"]["study"].eq("strong")]
    gpus = targets.get("strong_efficiency_gpus", strong["gpus"].max())
    if pd.isna(gpus):
        return _verdict("strong_efficiency_min", f">= {minimum:.0%}", minimum, "no strong-scaling cell in the study")
    target = f">= {minimum:.0%} at {gpus:g} GPUs"
    at = strong[strong["gpus"].eq(gpus)]
    done = at.dropna(subset=["efficiency"])
    if done.empty:
        why = "; ".join(at["model"] + ": " + at["note"]) or f"no strong-scaling cell at {gpus:g} GPUs"
        return _verdict("strong_efficiency_min", target, minimum, why)
    worst = done.loc[done["efficiency"].idxmin()]
    detail = f"worst model {worst['model']}; at {gpus:g} GPUs: {_listing(done, 'model', 'efficiency', '.1%')}"
    if len(done) < len(at):
        detail += "; not measured: " + ", ".join(at.loc[at["efficiency"].isna(), "model"])
    e = float(worst["efficiency"])
    return _verdict("strong_efficiency_min", target, minimum, detail, e, e >= minimum, f"{e:.1%}")


def _weak_variation(t: Mapping[str, pd.DataFrame], targets: Mapping[str, float]) -> dict:
    maximum = targets["weak_variation_max"]
    target = f"<= {maximum:.0%}"
    weak = t["scaling"][t["scaling"]["study"].eq("weak")].dropna(subset=["epoch_time_s"])
    spread = weak.groupby("model")["epoch_time_s"].agg(["min", "max", "count"]).query("count >= 2").reset_index()
    spread["variation"] = (spread["max"] - spread["min"]) / spread["min"]  # (max T - min T) / min T
    if spread.empty:
        why = "no model has completed weak-scaling runs at two or more GPU counts"
        return _verdict("weak_variation_max", target, maximum, why)
    worst = spread.loc[spread["variation"].idxmax()]
    v = float(worst["variation"])
    detail = f"worst model {worst['model']}; time-per-epoch variation: {_listing(spread, 'model', 'variation', '.1%')}"
    return _verdict("weak_variation_max", target, maximum, detail, v, v <= maximum, f"{v:.1%}")


def _optimisation_gain(t: Mapping[str, pd.DataFrame], targets: Mapping[str, float]) -> dict:
    minimum = targets["optimisation_gain_min"]
    target = f">= {minimum:.0%}"
    every = t["ablation"][t["ablation"]["variant"].eq("all")]
    done = every.dropna(subset=["gain"])
    if done.empty:
        why = "; ".join(every["model"] + ": " + every["note"]) or 'the study has no ablation "all" variant'
        return _verdict("optimisation_gain_min", target, minimum, why)
    worst = done.loc[done["gain"].idxmin()]
    g = float(worst["gain"])
    detail = f"worst model {worst['model']} at {worst['gpus']:g} GPUs; gain: {_listing(done, 'model', 'gain', '+.1%')}"
    return _verdict("optimisation_gain_min", target, minimum, detail, g, g >= minimum, f"{g:+.1%}")


def _run_maximum(check: str, column: str, multi_gpu: bool, what: str):
    """A check that every completed run's ``column`` stays below the target: the worst run counts."""

    def evaluate(t: Mapping[str, pd.DataFrame], targets: Mapping[str, float]) -> dict:
        maximum = targets[check]
        runs = t["runs"][counts(t["runs"]) & (t["runs"]["gpus"].gt(1) if multi_gpu else True)]
        done = runs.dropna(subset=[column])
        scope = "completed multi-GPU runs" if multi_gpu else "completed runs"
        target = f"< {maximum:.0%}"
        if done.empty:
            return _verdict(check, target, maximum, f"no {what} recorded by the {len(runs)} {scope}")
        worst = done.loc[done[column].idxmax()]
        m = float(worst[column])
        detail = f"max over {len(done)} {scope}: {worst['run_id']}; median {done[column].median():.1%}"
        return _verdict(check, target, maximum, detail, m, m < maximum, f"{m:.1%}")

    return evaluate


def _gpu_utilisation(t: Mapping[str, pd.DataFrame], targets: Mapping[str, float]) -> dict:
    minimum = targets["gpu_util_min_pct"]
    target = f"> {minimum:g}% (mean over completed runs)"
    ok = t["runs"][counts(t["runs"])]
    done = ok.dropna(subset=["gpu_util_mean_pct"])
    if done.empty:
        reasons = _joined(ok["nvml_reason"]) or "no completed run"
        return _verdict("gpu_util_min_pct", target, minimum, f"no NVML utilisation recorded: {reasons}")
    mean = float(done["gpu_util_mean_pct"].mean())
    lowest = done.loc[done["gpu_util_mean_pct"].idxmin()]
    detail = f"mean of {len(done)} runs with NVML; lowest {lowest['run_id']} {lowest['gpu_util_mean_pct']:.1f}%"
    return _verdict("gpu_util_min_pct", target, minimum, detail, mean, mean > minimum, f"{mean:.1f}%")


# target key -> the check it sets, evaluated in this order
CHECKS = {
    "strong_efficiency_min": _strong_efficiency,
    "weak_variation_max": _weak_variation,
    "optimisation_gain_min": _optimisation_gain,
    "gpu_util_min_pct": _gpu_utilisation,
    "exposed_comm_max": _run_maximum("exposed_comm_max", "exposed_comm_fraction", True, "exposed-communication share"),
    "data_stall_max": _run_maximum("data_stall_max", "data_stall_fraction", False, "data-stall fraction"),
}


def checks_table(tables: Mapping[str, pd.DataFrame], targets: Mapping[str, float]) -> pd.DataFrame:
    """One row per check whose threshold is among ``targets``, in the order of ``CHECKS``."""
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise ValueError(f"unknown targets {sorted(unknown)}; known: {list(TARGETS)}")
    rows = [evaluate(tables, targets) for check, evaluate in CHECKS.items() if check in targets]
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


# --------------------------------------------------------------------------------------------
# Cost, summary, entry points
# --------------------------------------------------------------------------------------------


def cost_table(runs: pd.DataFrame) -> pd.DataFrame:
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


def summarise(tables: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """The aggregation at a glance, for summary.json and the log."""
    runs, checks = tables["runs"], tables["checks"]
    statuses = runs["status"].value_counts()
    return {
        "runs": len(runs),
        "status": {status: int(statuses.get(status, 0)) for status in STATUSES},
        "inconsistent_runs": sorted(runs.loc[runs["consistent"].eq(False).fillna(False), "run_id"]),
        "device_names": sorted(runs["device_name"].dropna().unique()),
        "device_types": sorted(runs["device_type"].dropna().unique()),
        "git_commits": sorted(runs["git_commit"].dropna().unique()),
        "torch_versions": sorted(runs["torch_version"].dropna().unique()),
        "checks": {status: int(checks["status"].eq(status).sum()) for status in CHECK_STATUSES},
    }


def aggregate(
    matrix_path: str | os.PathLike[str],
    comm_paths: Iterable[str | os.PathLike[str]],
    references_path: str | os.PathLike[str],
    targets: Mapping[str, float],
    predict_gpus: Sequence[int] = scaling_model.DEFAULT_PREDICT_GPUS,
) -> dict[str, pd.DataFrame]:
    """Every table, by file stem (see the module docstring)."""
    comm_paths = list(comm_paths)
    runs, epochs, losses = read_runs(read_matrix(matrix_path))
    tables = {
        "runs": runs,
        "epochs": epochs,
        "loss_log": losses,
        "scaling": scaling_table(runs),
        "sensitivity": sensitivity_table(runs),
        "ablation": ablation_table(runs),
        "communication": communication_table(comm_paths),
        "comparison": comparison_table(runs, read_references(references_path)),
        "cost": cost_table(runs),
    }
    tables["checks"] = checks_table(tables, targets)
    tables["scaling_model"] = scaling_model.scaling_model_table(
        runs, tables["scaling"], comm_paths, references_path, predict_gpus
    )
    return tables


def write_tables(tables: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``<name>.csv`` per table and summary.json into ``out_dir``; returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    summary = summarise(tables)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _target(text: str) -> tuple[str, float]:
    key, _, value = text.partition("=")
    if key not in TARGETS:
        raise argparse.ArgumentTypeError(f"unknown target {key!r}; known: {', '.join(TARGETS)}")
    try:
        return key, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"target {key}: {value!r} is not a number") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalerepro.analysis.aggregate",
        description="Join the run records onto the study matrix and write the study's tidy tables.",
        epilog="targets: " + "; ".join(f"{key}: {what}" for key, what in TARGETS.items()),
    )
    parser.add_argument("--matrix", required=True, type=Path, help="matrix.csv, one row per expected run")
    parser.add_argument("--comm", nargs="*", default=[], type=Path, help="all-reduce benchmark JSON files")
    parser.add_argument("--references", required=True, type=Path, help="config/references.yaml")
    parser.add_argument("--out", required=True, type=Path, help="directory for the CSV tables and summary.json")
    parser.add_argument("--target", action="append", default=[], type=_target, metavar="KEY=VALUE", help="repeatable")
    parser.add_argument(
        "--predict-gpus", nargs="*", type=int, default=list(scaling_model.DEFAULT_PREDICT_GPUS), metavar="N",
        help="GPU counts the scaling model predicts beyond the study's hardware (links from --references)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    start = time.perf_counter()
    tables = aggregate(args.matrix, args.comm, args.references, dict(args.target), args.predict_gpus)
    summary = write_tables(tables, args.out)
    print(
        f"aggregate: {summary['runs']} runs {summary['status']}, checks {summary['checks']}, "
        f"{len(tables)} tables in {args.out} ({time.perf_counter() - start:.2f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
