"""Run records + the study matrix -> tidy tables for the plots and the report.

    python -m scalerepro.analysis.aggregate --matrix results/tables/matrix.csv \
        --comm results/comm/g2.json results/comm/g4.json --references config/references.yaml \
        --out results/tables --targets "$(yq -o json .targets config/config.yaml)"

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
Every cell with repeats has n (repeats_ok), median, min, max, CV and the seeded bootstrap 95 %
interval of its median, and every ratio of cells (efficiency, gain) an interval from paired
bootstrap medians (``scalerepro.analysis.repeats``). A cell whose throughput CV exceeds the
``noise_cv_max`` target (default 0.05) is ``noisy``.

    speedup               S(N) = thr(N) / thr(1)             thr(1): same study and model at 1 GPU
    strong efficiency     E(N) = thr(N) / (N thr(1))         (= T(1) / (N T(N)), global batch fixed)
    weak efficiency       E(N) = T(1) / T(N)                 (per-GPU batch and data fixed)
    ablation gain         G    = thr(variant) / thr(baseline) - 1
    all-reduce bandwidth  algbw = size / t,  busbw = algbw * 2 (N - 1) / N   (nccl-tests)
    comparison ratio      measured / published  (reproduced when |ratio - 1| <= reproduce_tolerance)
    weak variation        (max T - min T) / min T over the GPU counts of a model

Tables written to ``--out`` (CSV, one row per line described):

runs.csv -- one row per matrix row (a run without a record is ``missing``, never dropped).
    The matrix columns: run_id, study, model, gpus (world size), nodes, gpus_per_node, repeat,
    variant, precision, per_rank_batch, global_batch, bucket_cap_mb, runtime_min (time limit
    requested per run), record (path of its record), rerun (the command that reruns it),
    reference (the reference a ``reproduce`` run is for; empty in other studies and in matrices
    from before the column), grad_accum_steps (1 in matrices from before it), parallel (the
    --parallel strategy; ddp in matrices from before it), data_parallel (replicas reading
    different data; gpus in matrices from before it); then
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
    gpu_util_mean_pct, power_mean_w (sum over GPUs), energy_j, energy_per_sample_j   NVML, over
                      the measured steps (records since energy_per_sample_net_j: evaluation
                      paused out); energy_per_sample_net_j: the same less the GPUs' idle power
                      x time, idle_power_w (empty in older records)
    nvml_reason       why NVML figures are empty (e.g. a CPU run)
    peak_memory_bytes peak CUDA allocated bytes, else the peak RSS of a rank
    peak_memory_kind  cuda_allocated | rss
    final_train_loss, final_eval_loss, final_eval_accuracy   the last history entry
    duration_s        ended_at - started_at of the record
    device_type       cuda | cpu
    device_name       hardware.gpu.name, else the CPU model
    world_size_recorded, nodes_recorded, slurm_job_id, git_commit, git_dirty, torch_version,
    started_at        ISO 8601, UTC
    precision_recorded, per_rank_batch_recorded, grad_accum_recorded, tokens_per_sample,
    channels_last, data_kind, optimizer_kind, compile_mode    the conditions the record states
    peak_flops_source why mfu is empty, when it is
    parallel_recorded the strategy the record ran (measurements.sharding.strategy; ddp where the
                      entry is null; a completed run that names another than the plan does not count)
    mesh, reshard_after_forward, state_bytes_per_rank_max, state_bytes_per_rank_min (parameters +
                      optimizer state held by a rank at the end), comm_bytes_per_step (analytic, bytes
                      each rank sends per optimizer step, summed over its collectives), comm_by_collective
                      (the same by collective, as text), comm_reason, pipeline_bubble_fraction (pp:
                      (p-1)/(m+p-1))    measurements.sharding of a sharded run, empty under ddp
    params_bytes_per_rank, grads_bytes_per_rank, optimizer_bytes_per_rank, activations_bytes_per_rank,
    activations_reason    measurements.memory_split: each the largest over the ranks (activations =
                      CUDA peak allocated - the model state; not measured on a CPU, the reason says why)
epochs.csv -- one row per history entry of every record: run_id, epoch, step, complete
    (false for a partial last epoch), train_loss, eval_loss, eval_accuracy.
loss_log.csv -- one row per logged step of every record: run_id, step, loss, samples_per_s.
scaling.csv -- one row per (study in strong|weak, model, gpus): study, model, gpus, nodes,
    repeats_ok (n), repeats_total, samples_per_s_median, samples_per_s_min, samples_per_s_max,
    samples_per_s_cv, samples_per_s_ci_low, samples_per_s_ci_high (95 % interval of the
    median), noisy, samples_per_s_per_gpu (median / gpus), step_time_median_s, epoch_time_s
    (medians), epoch_time_cv, speedup, ideal_speedup (= gpus), efficiency (strong or weak,
    above), efficiency_ci_low, efficiency_ci_high, weak_variation, weak_variation_ci_low,
    weak_variation_ci_high (weak rows: the model's variation over its GPU counts, above), note.
sensitivity.csv -- one row per (model, gpus, bucket_cap_mb, per_rank_batch, precision):
    those, repeats_ok, repeats_total, the throughput's median, min, max, CV, interval and noisy
    flag (as scaling.csv), step_time_median_s, exposed_comm_fraction (median), note.
ablation.csv -- one row per (model, gpus, variant), in matrix order (baseline first): those,
    repeats_ok, repeats_total, the throughput's median, min, max, CV, interval and noisy flag,
    gain (fraction; 0.25 = 25 % faster than the baseline), gain_ci_low, gain_ci_high, note.
parallelism.csv -- one row per (model, gpus, strategy) of the ``parallelism`` study, in matrix
    order: model, gpus, nodes, parallel, variant, data_parallel, per_rank_batch (per replica),
    global_batch (the same for every strategy at a GPU count), repeats_ok, repeats_total, the
    throughput's median, min, max, CV, interval and noisy flag (as scaling.csv),
    tokens_per_s_median with tokens_per_s_ci_low/high, tokens_per_s_per_gpu (= tokens/s / gpus),
    mfu, peak_memory_bytes (a GPU's peak, the largest over ranks), peak_memory_kind, mesh,
    reshard_after_forward, state_bytes_per_rank_max/min, comm_bytes_per_step, comm_by_collective,
    pipeline_bubble_fraction, the memory split per rank (params, grads, optimizer, activations),
    all medians over the counted repeats; device_name, cell (names the row in a check), note
    ("not measured: <figure> (<why>)" for each empty figure).
communication.csv -- one row per (gpus, size_bytes): gpus, size_bytes, nodes, backend,
    time_us_median (slowest rank's median of single all-reduces: not nccl-tests' time, see
    scalerepro.commbench), algbw_gbps, busbw_gbps (GB = 1e9 bytes).
comparison.csv -- one row per reference in references.yaml, the reproduction group first, then
    the context (another GPU): reference (its id), group (reproduction | context), kind
    (published | expected (seed document) | mlperf), model, gpus, metric (samples_per_s |
    tokens_per_s_per_gpu), published, measured (the median of the ``reproduce`` runs of this
    reference, in its metric), measured_ci_low, measured_ci_high, repeats, measured_cv, noisy,
    ratio, verdict (reproduced | above | below | not comparable: <condition> | not measured: see
    comparison_table), differs (the condition that differs, with both values), measured_cell
    (the runs), measured_device, measured_conditions and published_conditions (side by side,
    one line each), the reference's conditions (gpu, precision, per_gpu_batch, seq_len,
    memory_format, data, optimizer), framework, metric_notes, source, note.
checks.csv -- one row per entry of ``targets.checks`` (``--targets``; each entry is data: which
    table, which rows (where), which metric column, how reduced, threshold, direction, unit; see
    parse_checks, evaluated by the one ``evaluate``): check (the entry's name), target (text:
    what is checked and against what), threshold (number), measured (number, in the unit),
    interval_low, interval_high (the worst row's 95 % interval, where its table has one), value
    (``measured`` as text), status (pass | fail | inconclusive: the interval holds the
    threshold | not measured), detail (which rows, or why; on a CPU study what a CPU study judges), unit.
cost.csv -- one row per study plus a ``total`` row: study, runs (matrix rows),
    gpu_hours_used = sum(duration_s x gpus) / 3600 and node_hours_used = sum(duration_s x
    nodes) / 3600 over the runs with a record, gpu_hours_requested = sum(runtime_min / 60 x
    gpus) and node_hours_requested over every matrix row (what an allocation request states).
    On a CPU study "gpus" are ranks.
scaling_model.csv -- the alpha-beta model's predicted step time and efficiency beside the
    measured ones, and predictions alone beyond the study's hardware (``--predict-gpus``): see
    ``scalerepro.analysis.scaling_model``.
summary.json -- run counts by status, device names and types, git commits, torch versions,
    inconsistent runs, check counts, comparison verdict counts, cpu_study, noisy_cells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ..cli import OneLineErrorParser
from . import repeats, scaling_model

MATRIX_COLUMNS = (
    "run_id", "study", "model", "gpus", "nodes", "gpus_per_node", "repeat", "variant", "precision", "per_rank_batch",
    "global_batch", "bucket_cap_mb", "runtime_min", "record", "rerun",
)  # fmt: skip
# Matrix columns that older matrices lack, and what their absence means.
OPTIONAL_MATRIX_COLUMNS = {"reference": "", "grad_accum_steps": 1, "parallel": "ddp", "data_parallel": None}
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
    "energy_per_sample_net_j": ("measurements", "energy_per_sample_net_j"),
    "idle_power_w": ("measurements", "nvml", "idle_power_w"),
    "nvml_reason": ("measurements", "nvml", "reason"),
    "device_type": ("parallel", "device_type"),
    "world_size_recorded": ("parallel", "world_size"),
    "nodes_recorded": ("parallel", "nodes"),
    "slurm_job_id": ("scheduler", "job_id"),  # the batch job (any scheduler; the name is the store's column)
    "git_commit": ("git", "commit"),
    "git_dirty": ("git", "dirty"),
    "torch_version": ("versions", "torch"),
    "started_at": ("started_at",),
    "ended_at": ("ended_at",),
    # the conditions a run ran under, as its record says (the comparison sets them beside a reference's)
    "precision_recorded": ("precision",),
    "per_rank_batch_recorded": ("batch", "per_rank"),
    "grad_accum_recorded": ("batch", "grad_accum_steps"),
    "tokens_per_sample": ("model", "tokens_per_sample"),
    "channels_last": ("knobs", "channels_last"),
    "data_kind": ("data", "kind"),
    "optimizer_kind": ("optimizer", "kind"),
    "compile_mode": ("knobs", "compile"),
    # why mfu is empty, when it is (e.g. no peak FLOP/s tabulated for a CPU)
    "peak_flops_source": ("measurements", "peak_flops_source"),
    # sharded runs (--parallel fsdp, tp, fsdp+tp): measurements.sharding, null under ddp
    "state_bytes_per_rank_max": ("measurements", "sharding", "state_bytes_per_rank_max"),
    "state_bytes_per_rank_min": ("measurements", "sharding", "state_bytes_per_rank_min"),
    "comm_reason": ("measurements", "sharding", "comm_reason"),
    "pipeline_bubble_fraction": ("measurements", "sharding", "pipeline_bubble_fraction"),
    "activations_reason": ("measurements", "memory_split", "activations_reason"),
    "reshard_after_forward": ("measurements", "sharding", "reshard_after_forward"),
}
# The columns read_record gives: those above and the ones it derives.
RECORD_COLUMNS = (
    "run_id", *RECORD_FIELDS, "error", "peak_memory_bytes", "peak_memory_kind", "final_train_loss", "final_eval_loss",
    "final_eval_accuracy", "device_name", "parallel_recorded", "mesh", "comm_bytes_per_step", "comm_by_collective",
    "params_bytes_per_rank", "grads_bytes_per_rank", "optimizer_bytes_per_rank", "activations_bytes_per_rank",
)  # fmt: skip
RUN_COLUMNS = (
    *MATRIX_COLUMNS, *OPTIONAL_MATRIX_COLUMNS, "status", "error", "stop_signal", "consistent", "counts", "samples_per_s",
    "tokens_per_s", "step_time_median_s", "step_time_p10_s", "step_time_p90_s", "epoch_time_s", "window_s", "mfu",
    "exposed_comm_fraction", "data_stall_fraction", "gpu_util_mean_pct", "power_mean_w", "energy_j",
    "energy_per_sample_j", "energy_per_sample_net_j", "idle_power_w", "nvml_reason", "peak_memory_bytes",
    "peak_memory_kind", "final_train_loss", "final_eval_loss", "final_eval_accuracy", "duration_s", "device_type",
    "device_name", "world_size_recorded", "nodes_recorded", "slurm_job_id", "git_commit", "git_dirty",
    "torch_version", "started_at", "precision_recorded", "per_rank_batch_recorded", "grad_accum_recorded",
    "tokens_per_sample", "channels_last", "data_kind", "optimizer_kind", "compile_mode", "peak_flops_source",
    "parallel_recorded", "mesh", "reshard_after_forward", "state_bytes_per_rank_max", "state_bytes_per_rank_min",
    "comm_bytes_per_step", "comm_by_collective", "comm_reason", "pipeline_bubble_fraction", "params_bytes_per_rank",
    "grads_bytes_per_rank", "optimizer_bytes_per_rank", "activations_bytes_per_rank", "activations_reason",
)  # fmt: skip
EPOCH_COLUMNS = ("run_id", "epoch", "step", "complete", "train_loss", "eval_loss", "eval_accuracy")
LOSS_COLUMNS = ("run_id", "step", "loss", "samples_per_s")
COMM_COLUMNS = ("gpus", "size_bytes", "nodes", "backend", "time_us_median", "algbw_gbps", "busbw_gbps")
# The conditions of a reference (config/references.yaml), compared with a run's in this order.
CONDITIONS = ("gpu", "precision", "per_gpu_batch", "seq_len", "memory_format", "data", "optimizer")
REFERENCE_COLUMNS = (
    "id", "model", "gpus", "metric", "value", "kind", "source", *CONDITIONS, "framework", "metric_notes",
    "trainer_model", "trainer_per_gpu_batch", "trainer_flags", "unmatched", "note",
)  # fmt: skip
REFERENCE_KINDS = ("published", "expected (seed document)", "mlperf")
REFERENCE_METRICS = ("samples_per_s", "tokens_per_s_per_gpu")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "mixed")
# Spread of a cell's throughput over its repeats (scalerepro.analysis.repeats): n is repeats_ok.
SPREAD = ("samples_per_s_cv", "samples_per_s_ci_low", "samples_per_s_ci_high", "noisy")
THROUGHPUT = ("samples_per_s_median", "samples_per_s_min", "samples_per_s_max", *SPREAD)
# (max T - min T) / min T over a weak-scaling model's GPU counts, on each of its weak rows
WEAK_VARIATION = ("weak_variation", "weak_variation_ci_low", "weak_variation_ci_high")
SCALING_COLUMNS = (
    "study", "model", "gpus", "nodes", "repeats_ok", "repeats_total", *THROUGHPUT, "samples_per_s_per_gpu",
    "step_time_median_s", "epoch_time_s", "epoch_time_cv", "speedup", "ideal_speedup", "efficiency",
    "efficiency_ci_low", "efficiency_ci_high", *WEAK_VARIATION, "note",
)  # fmt: skip
SENSITIVITY_KEYS = ("model", "gpus", "bucket_cap_mb", "per_rank_batch", "precision")
SENSITIVITY_COLUMNS = (
    *SENSITIVITY_KEYS, "repeats_ok", "repeats_total", *THROUGHPUT, "step_time_median_s", "exposed_comm_fraction", "note",
)  # fmt: skip
ABLATION_COLUMNS = (
    "model", "gpus", "variant", "repeats_ok", "repeats_total", *THROUGHPUT, "gain", "gain_ci_low", "gain_ci_high", "note",
)  # fmt: skip
# runs.csv column -> the key of measurements.memory_split.per_rank it is the largest over the ranks of
MEMORY_SPLIT = {
    "params_bytes_per_rank": "parameters", "grads_bytes_per_rank": "gradients",
    "optimizer_bytes_per_rank": "optimizer_state", "activations_bytes_per_rank": "activations",
}  # fmt: skip
# A parallelism cell: a model under one --parallel strategy at one GPU count (its batch follows).
PARALLELISM_KEYS = ("model", "gpus", "nodes", "parallel", "variant", "data_parallel", "per_rank_batch", "global_batch")
# The sharding figures of a record (measurements.sharding), medians over a cell's counted repeats.
SHARDING_FIGURES = (
    "state_bytes_per_rank_max", "state_bytes_per_rank_min", "comm_bytes_per_step", "pipeline_bubble_fraction",
    *MEMORY_SPLIT,
)  # fmt: skip
PARALLELISM_COLUMNS = (
    *PARALLELISM_KEYS, "repeats_ok", "repeats_total", *THROUGHPUT, "tokens_per_s_median", "tokens_per_s_ci_low",
    "tokens_per_s_ci_high", "tokens_per_s_per_gpu", "mfu", "peak_memory_bytes", "peak_memory_kind", "mesh",
    "reshard_after_forward", *SHARDING_FIGURES, "comm_by_collective", "device_name", "cell", "note",
)  # fmt: skip
VERDICTS = ("reproduced", "above", "below", "not comparable", "not measured")
COMPARISON_COLUMNS = (
    "reference", "group", "kind", "model", "gpus", "metric", "published", "measured", "measured_ci_low",
    "measured_ci_high", "repeats", "measured_cv", "noisy", "ratio", "verdict", "differs", "measured_cell",
    "measured_device", "measured_conditions", "published_conditions", *CONDITIONS, "framework", "metric_notes",
    "source", "note",
)  # fmt: skip
CHECK_COLUMNS = (
    "check", "target", "threshold", "measured", "interval_low", "interval_high", "value", "status", "detail", "unit",
)  # fmt: skip
CHECK_STATUSES = ("pass", "fail", "inconclusive", "not measured")
CPU_STUDY = (
    "a CPU study, judged at CPU scale (the thresholds of cpu_overrides): ranks pinned to one host's cores judge "
    "the pipeline and the instrument (the code path, the collectives, the bookkeeping), not a cluster"
)
# Targets: key -> what it sets (``checks``: see parse_checks and config/README.md).
TARGETS = {
    "checks": "name -> {description, table, where, metric, reduce, direction, strict, threshold, unit}",
    "reproduce_tolerance": "a reference is reproduced when |measured / published - 1| is at most this (default 0.10)",
    "noise_cv_max": "a cell whose throughput varies more than this over its repeats (CV) is flagged noisy (default 0.05)",
}
DEFAULT_REPRODUCE_TOLERANCE = 0.10
DEFAULT_NOISE_CV_MAX = 0.05


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
        **_sharding(_dig(document, ("measurements",))),
    )
    if fields["status"] == "ok" and not (_dig(document, ("measurements", "measured_steps")) and fields["samples_per_s"]):
        # A record with no measurements is a failure, whatever it says of itself.
        fields.update(status="failed", error="the record says ok but its measured window is empty (no steps, no throughput)")
    if fields["slurm_job_id"] is not None:
        fields["slurm_job_id"] = str(fields["slurm_job_id"])  # an integer or a string in the schema
    epochs = [(run_id, *map(entry.get, EPOCH_COLUMNS[1:])) for entry in history]
    losses = [(run_id, *map(entry.get, LOSS_COLUMNS[1:])) for entry in document.get("loss_log") or []]
    return fields, epochs, losses


def _sharding(measurements: Any) -> dict[str, Any]:
    """The strategy a record says it ran (parallel_recorded: measurements.sharding.strategy, "ddp"
    where the entry is there and null, None where the record predates it or measured nothing),
    its device mesh as text ("2x2 (dp_shard, tp)"), its communication per step and its memory
    split per rank."""
    measurements = measurements if isinstance(measurements, dict) else {}
    split = _memory_split(measurements.get("memory_split"))
    unsharded = {"mesh": None, "comm_bytes_per_step": None, "comm_by_collective": None, **split}
    if "sharding" not in measurements:
        return {"parallel_recorded": None, **unsharded}
    sharding = measurements["sharding"]
    if not isinstance(sharding, dict):
        return {"parallel_recorded": "ddp", **unsharded}
    mesh = sharding.get("mesh") or {}
    shape = "x".join(str(n) for n in mesh.get("shape") or ())
    dims = ", ".join(mesh.get("dims") or ())
    # the analytic bytes a rank sends per optimizer step, by collective (the keys differ by strategy:
    # all_gather/reduce_scatter under fsdp, tp_* and dp_* under tp and fsdp+tp, send_* under pp)
    volume = sharding.get("comm_bytes_per_step_analytic")
    volume = {k: v for k, v in volume.items() if isinstance(v, (int, float))} if isinstance(volume, dict) else {}
    return {
        "parallel_recorded": sharding.get("strategy"),
        "mesh": f"{shape} ({dims})" if dims else shape or None,
        # communication per step = the sum over the collectives of the bytes each rank sends
        "comm_bytes_per_step": float(sum(volume.values())) if volume else None,
        "comm_by_collective": "; ".join(f"{k} {v:,.0f} B" for k, v in volume.items()) or None,
        **split,
    }


def _memory_split(split: Any) -> dict[str, Any]:
    """measurements.memory_split: bytes of parameters, gradients, optimizer state and activations,
    each the largest over the ranks (the rank that sets a GPU's memory need)."""
    ranks = split.get("per_rank") if isinstance(split, dict) else None
    if not isinstance(ranks, list) or not ranks:
        return dict.fromkeys(MEMORY_SPLIT)
    values = {column: [r.get(kind) for r in ranks if isinstance(r, dict) and r.get(kind) is not None] for column, kind in MEMORY_SPLIT.items()}
    return {column: max(found) if found else None for column, found in values.items()}


def read_matrix(path: str | os.PathLike[str]) -> pd.DataFrame:
    matrix = pd.read_csv(path, dtype={"run_id": str, "variant": str, "record": str, "rerun": str, "reference": str})
    absent = [column for column in MATRIX_COLUMNS if column not in matrix.columns]
    if absent:
        raise ValueError(f"{path}: the study matrix lacks the columns {absent}")
    if matrix["run_id"].duplicated().any():
        raise ValueError(f"{path}: run_id repeats: {sorted(matrix.loc[matrix.run_id.duplicated(), 'run_id'])}")
    for column, default in OPTIONAL_MATRIX_COLUMNS.items():  # a matrix from before the column
        matrix[column] = matrix[column].fillna(default) if column in matrix.columns else default
    # data_parallel: the replicas reading different data; every rank is one under DDP (older matrices)
    matrix["data_parallel"] = matrix["data_parallel"].fillna(matrix["gpus"]).astype(int)
    return matrix.assign(variant=matrix["variant"].fillna(""), grad_accum_steps=matrix["grad_accum_steps"].astype(int))


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
    for column in ("world_size_recorded", "nodes_recorded", "peak_memory_bytes", "per_rank_batch_recorded",
                   "grad_accum_recorded", "tokens_per_sample"):  # fmt: skip
        runs[column] = runs[column].astype("Int64")
    runs["channels_last"] = runs["channels_last"].astype("boolean")
    for column in ("state_bytes_per_rank_max", "state_bytes_per_rank_min", *MEMORY_SPLIT):
        runs[column] = runs[column].astype("Int64")
    recorded = runs["world_size_recorded"].notna() & runs["nodes_recorded"].notna()
    matches = runs["world_size_recorded"].eq(runs["gpus"]) & runs["nodes_recorded"].eq(runs["nodes"])
    # ... and a completed run's record names the planned --parallel strategy (where it names one)
    matches &= runs["parallel_recorded"].isna() | runs["parallel_recorded"].eq(runs["parallel"]) | runs["status"].ne("ok")
    runs["consistent"] = matches.astype("boolean").where(recorded)
    runs["git_dirty"] = runs["git_dirty"].astype("boolean")
    epochs = pd.DataFrame.from_records([row for p in parsed for row in p[1]], columns=EPOCH_COLUMNS)
    losses = pd.DataFrame.from_records([row for p in parsed for row in p[2]], columns=LOSS_COLUMNS)
    # Whether a run counts is decided here, once, and read from runs.csv by every table, figure
    # and the report.
    runs["counts"] = counts(runs)
    return runs[list(RUN_COLUMNS)], epochs, losses


# --------------------------------------------------------------------------------------------
# Cells: statistics over the completed repeats
# --------------------------------------------------------------------------------------------


def _joined(values: pd.Series) -> str:
    return ", ".join(sorted(values.dropna().astype(str).unique()))


def counts(runs: pd.DataFrame) -> pd.Series:
    """The runs that count: completed, and the record agrees with the plan (the ``counts``
    column of runs.csv; read that column, do not call this again)."""
    return (runs["status"].eq("ok") & runs["consistent"].ne(False).fillna(True)).astype(bool)


def _values(runs: pd.DataFrame, column: str) -> pd.Series:
    """``column`` of the runs that count, NaN for the others (which median, min and max skip)."""
    return runs[column].where(runs["counts"])


def cell_stats(runs: pd.DataFrame, keys: Sequence[str], noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    """One row per cell (``keys``), in first-seen order: repeats planned and counted, the median
    of each figure over the repeats that count, and the spread of the throughput (min, max, CV,
    the bootstrap 95 % interval of the median: scalerepro.analysis.repeats); ``noisy`` when the
    CV exceeds ``noise_cv_max``."""
    ok = runs["counts"]
    measures = ["samples_per_s", "tokens_per_s", "step_time_median_s", "epoch_time_s", "exposed_comm_fraction"]
    # a repeat that does not count gets NaN, which median/min/max skip
    frame = runs[list(keys)].join(runs[[*measures, "device_name"]].where(ok, axis=0)).assign(ok=ok)
    groups = frame.groupby(list(keys), sort=False, dropna=False)
    cells = groups.agg(
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
        (repeats.describe(group["samples_per_s"], key), repeats.describe(group["epoch_time_s"], ("epoch", key)))
        for key, group in groups
    ]
    cells["samples_per_s_cv"] = [thr["cv"] for thr, _ in spread]
    cells["samples_per_s_ci_low"] = [thr["ci_low"] for thr, _ in spread]
    cells["samples_per_s_ci_high"] = [thr["ci_high"] for thr, _ in spread]
    cells["epoch_time_cv"] = [epoch["cv"] for _, epoch in spread]
    # noisy: the throughput's CV over the repeats above the target (never with fewer than 2)
    cells["noisy"] = cells["samples_per_s_cv"].gt(noise_cv_max)
    return cells


def _cell_values(runs: pd.DataFrame, column: str, where: pd.Series) -> np.ndarray:
    return _values(runs, column)[where].dropna().to_numpy(dtype=float)


NO_REPEAT = "no completed repeat"


def _noise_note(cells: pd.DataFrame) -> pd.Series:
    return "noisy: throughput CV " + (100 * cells["samples_per_s_cv"]).round(1).astype(str) + " % over the repeats"


def scaling_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    scaled = runs[runs["study"].isin(["strong", "weak"])]
    cells = cell_stats(scaled, ["study", "model", "gpus", "nodes"], noise_cv_max)
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
        [NO_REPEAT, "no completed 1-GPU run of this study and model: speedup and efficiency undefined",
         _noise_note(cells)],
        "",
    )  # fmt: skip
    return cells.sort_values(["study", "model", "gpus"], kind="stable")[list(SCALING_COLUMNS)].reset_index(drop=True)


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
        per_count = [(_cell_values(scaled, "epoch_time_s", at & scaled["gpus"].eq(g)), ("weak", model, g, "epoch_time_s"))
                     for g in sorted(group["gpus"])]  # fmt: skip
        low, high = repeats.ratio_interval(per_count, lambda *m: (np.max(m, axis=0) - np.min(m, axis=0)) / np.min(m, axis=0))
        rows.append(("weak", model, (times.max() - times.min()) / times.min(), low, high))
    return pd.DataFrame(rows, columns=["study", "model", *WEAK_VARIATION])


def sensitivity_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    cells = cell_stats(runs[runs["study"].eq("sensitivity")], SENSITIVITY_KEYS, noise_cv_max)
    cells["note"] = np.select([cells["repeats_ok"].eq(0), cells["noisy"]], [NO_REPEAT, _noise_note(cells)], "")
    return cells[list(SENSITIVITY_COLUMNS)]


def ablation_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    ablation = runs[runs["study"].eq("ablation")]
    cells = cell_stats(ablation, ["model", "gpus", "variant"], noise_cv_max)
    baseline = cells.loc[cells["variant"].eq("baseline"), ["model", "gpus", "samples_per_s_median"]]
    cells = cells.merge(baseline, on=["model", "gpus"], how="left", suffixes=("", "_baseline"))  # keeps matrix order
    # G = thr(variant) / thr(baseline) - 1
    cells["gain"] = cells["samples_per_s_median"] / cells["samples_per_s_median_baseline"] - 1
    low, high = [], []
    for model, gpus, variant in zip(cells["model"], cells["gpus"], cells["variant"]):
        at = ablation["model"].eq(model) & ablation["gpus"].eq(gpus)
        this = (_cell_values(ablation, "samples_per_s", at & ablation["variant"].eq(variant)), (model, gpus, variant))
        base = (_cell_values(ablation, "samples_per_s", at & ablation["variant"].eq("baseline")), (model, gpus, "baseline"))
        bounds = repeats.ratio_interval([this, base], lambda v, b: v / b - 1) if variant != "baseline" else (0.0, 0.0)
        low.append(bounds[0])
        high.append(bounds[1])
    cells["gain_ci_low"], cells["gain_ci_high"] = low, high
    cells["note"] = np.select(
        [cells["repeats_ok"].eq(0), cells["samples_per_s_median_baseline"].isna(), cells["noisy"]],
        [NO_REPEAT, "no completed baseline run: gain undefined", _noise_note(cells)],
        "",
    )
    return cells[list(ABLATION_COLUMNS)]


def parallelism_table(runs: pd.DataFrame, noise_cv_max: float = DEFAULT_NOISE_CV_MAX) -> pd.DataFrame:
    """One row per (model, gpus, strategy) of the ``parallelism`` study, in matrix order: the
    throughput's statistics (cell_stats), tokens/s with its interval, and the medians over the
    counted repeats of MFU, peak memory per GPU and the sharding figures. Every empty figure of a
    cell with a completed repeat is named in ``note`` as "not measured: <figure> (<why>)"."""
    study = runs[runs["study"].eq("parallelism")]
    keys = list(PARALLELISM_KEYS)
    cells = cell_stats(study, keys, noise_cv_max)
    groups = study.assign(**{c: _values(study, c) for c in ("tokens_per_s", "mfu", "peak_memory_bytes", *SHARDING_FIGURES)})
    groups = groups.groupby(keys, sort=False, dropna=False)
    tokens = [repeats.describe(group["tokens_per_s"], ("tokens", *key)) for key, group in groups]
    cells["tokens_per_s_ci_low"] = [t["ci_low"] for t in tokens]
    cells["tokens_per_s_ci_high"] = [t["ci_high"] for t in tokens]
    # tokens/s per GPU = tokens/s (global, median over the repeats) / gpus
    cells["tokens_per_s_per_gpu"] = cells["tokens_per_s_median"] / cells["gpus"]
    # MFU = achieved FLOP/s / (gpus x peak FLOP/s per GPU), as each record computed it; median here
    figures = groups[["mfu", "peak_memory_bytes", *SHARDING_FIGURES]].median().reset_index(drop=True)
    for column in figures:
        cells[column] = figures[column].to_numpy()
    counted = study[study["counts"]].groupby(keys, sort=False, dropna=False)
    text = {c: counted[c].agg(_joined) for c in ("peak_memory_kind", "mesh", "reshard_after_forward", "peak_flops_source",
                                                 "comm_reason", "comm_by_collective", "activations_reason")}  # fmt: skip
    for column, values in text.items():
        cells[column] = [values.get(tuple(key), "") for key in cells[keys].itertuples(index=False)]
    cells["note"] = [_parallelism_note(cell) for cell in cells.to_dict("records")]
    cells["cell"] = cells["model"] + " g" + cells["gpus"].astype(str) + " " + cells["parallel"]  # names it in a check
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
    if pd.isna(cell["state_bytes_per_rank_max"]):
        notes.append(
            "not measured: state bytes per rank (the trainer records them for sharded runs; under ddp every rank "
            "holds the whole model and optimizer state)" if not sharded else
            "not measured: state bytes per rank (the records have no sharding entry)"
        )  # fmt: skip
    if pd.isna(cell["comm_bytes_per_step"]):
        why = cell["comm_reason"] or (
            "not counted under ddp: the trainer counts it for the sharded strategies (fsdp, tp, fsdp+tp, pp)" if not sharded
            else "the records have no analytic volume"
        )  # fmt: skip
        notes.append(f"not measured: communication per step ({why})")
    if pd.isna(cell["activations_bytes_per_rank"]) and not pd.isna(cell["params_bytes_per_rank"]):
        notes.append(f"not measured: activation memory ({cell['activations_reason'] or 'the records give none'})")
    if cell["noisy"]:
        notes.append(f"noisy: throughput CV {100 * cell['samples_per_s_cv']:.1f} % over the repeats")
    return "; ".join(notes)


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


def _source_text(source: Any) -> str:
    """A reference's source as one line: repository@commit path (row), or page, table."""
    if isinstance(source, str):
        return source
    if not isinstance(source, Mapping):
        return ""
    if "repository" in source:
        text = f"{source['repository']}@{str(source.get('commit', ''))[:12]} {source.get('path', '')}".strip()
        return text + (f" (row {source['row']})" if source.get("row") else "")
    return ", ".join(str(source[key]) for key in ("page", "table") if source.get(key))


def read_references(path: str | os.PathLike[str]) -> pd.DataFrame:
    """config/references.yaml's ``references``, one row each, conditions flattened into columns
    (REFERENCE_COLUMNS). An entry that breaks the format is a one-line error naming it and what
    to fix."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    rows = []
    for index, entry in enumerate(document.get("references") or []):
        label = entry.get("id", "no id") if isinstance(entry, Mapping) else repr(entry)
        name = f"{path}: references[{index}] ({label})"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{name}: an entry is a mapping with id, model, gpus, metric, value, kind, source, conditions, trainer")
        missing = [key for key in ("id", "model", "gpus", "metric", "value", "kind", "source", "conditions", "trainer") if key not in entry]
        if missing:
            raise ValueError(f"{name}: add {', '.join(missing)} (trainer: null with `unmatched` where the trainer cannot match it)")
        if entry["kind"] not in REFERENCE_KINDS:
            raise ValueError(f"{name}: kind {entry['kind']!r} is not one of {', '.join(REFERENCE_KINDS)}")
        if entry["metric"] not in REFERENCE_METRICS:
            raise ValueError(f"{name}: metric {entry['metric']!r} is not one of {', '.join(REFERENCE_METRICS)}")
        conditions = entry["conditions"] or {}
        if not isinstance(conditions, Mapping) or not conditions.get("gpu"):
            raise ValueError(f"{name}: conditions must be a mapping naming at least the gpu (the device name NVML reports)")
        if conditions.get("precision") not in (None, *PRECISIONS):
            raise ValueError(f"{name}: conditions.precision {conditions['precision']!r} is not one of {', '.join(PRECISIONS)} (or null: not stated)")
        trainer = entry["trainer"]
        if trainer is None and not entry.get("unmatched"):
            raise ValueError(f"{name}: trainer is null, so say why in `unmatched: \"<condition>: <why>\"`")
        if trainer is not None and not (isinstance(trainer, Mapping) and {"model", "per_gpu_batch", "flags"} <= set(trainer)):
            raise ValueError(f"{name}: trainer needs model, per_gpu_batch and flags (a list), or null")
        rows.append(
            {
                **{key: entry.get(key) for key in ("id", "model", "gpus", "metric", "value", "kind", "unmatched", "note")},
                "source": _source_text(entry["source"]),
                **{key: conditions.get(key) for key in (*CONDITIONS, "framework", "metric_notes")},
                "trainer_model": None if trainer is None else trainer["model"],
                "trainer_per_gpu_batch": None if trainer is None else trainer["per_gpu_batch"],
                "trainer_flags": None if trainer is None else " ".join(map(str, trainer["flags"])),
            }
        )
    frame = pd.DataFrame(rows, columns=list(REFERENCE_COLUMNS))
    if frame["id"].duplicated().any():
        raise ValueError(f"{path}: reference ids repeat: {sorted(set(frame.loc[frame['id'].duplicated(), 'id']))}")
    return frame


def read_target_gpu(path: str | os.PathLike[str]) -> str | None:
    """``target_gpu`` of references.yaml: the GPU the set is for (see comparison_table)."""
    return (yaml.safe_load(Path(path).read_text()) or {}).get("target_gpu")


def _given(value: Any) -> bool:
    """Not None, NaN or an empty string."""
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and value != ""


def _same_device(a: Any, b: Any) -> bool:
    """Device names compared as NVML spells them, case and spacing aside."""
    return isinstance(a, str) and isinstance(b, str) and " ".join(a.lower().split()) == " ".join(b.lower().split())


def recorded_conditions(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run's conditions in the references' terms, from its record (runs.csv columns)."""
    tokens = run.get("tokens_per_sample")
    image = pd.isna(tokens) or tokens == 0
    per_rank, accum = run.get("per_rank_batch_recorded"), run.get("grad_accum_recorded")
    channels_last = run.get("channels_last")
    data = run.get("data_kind")
    return {
        "gpu": run.get("device_name") if run.get("device_type") == "cuda" else f"CPU ({run.get('device_name')})",
        "precision": run.get("precision_recorded"),
        # samples per GPU per optimizer step = per-rank micro-batch x micro-batches per step
        "per_gpu_batch": None if pd.isna(per_rank) else int(per_rank) * (1 if pd.isna(accum) else int(accum)),
        "seq_len": None if image else int(tokens),
        "memory_format": (None if pd.isna(channels_last) else "nhwc" if channels_last else "nchw") if image else None,
        "data": None if pd.isna(data) else "synthetic" if data == "synthetic" else "real",
        "optimizer": run.get("optimizer_kind"),
    }


def describe_conditions(conditions: Mapping[str, Any]) -> str:
    """Conditions as one line, in CONDITIONS order, the missing ones left out."""
    parts = []
    for key in CONDITIONS:
        value = conditions.get(key)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            continue
        parts.append(f"{key.replace('_', ' ')} {int(value) if isinstance(value, float) and value.is_integer() else value}")
    return "; ".join(parts)


def _differing_condition(reference: Mapping[str, Any], measured: Mapping[str, Any]) -> str | None:
    """The first condition (CONDITIONS order, GPU aside) that the reference states and the run
    does not share, as "<condition> (measured X, reference Y)"."""
    for key in CONDITIONS[1:]:
        wanted, got = reference.get(key), measured.get(key)
        if wanted is None or (isinstance(wanted, float) and np.isnan(wanted)):
            continue  # the reference does not state it: nothing to compare
        same = str(wanted).lower() == str(got).lower() if key == "optimizer" else wanted == got
        if isinstance(wanted, float) and got is not None:
            same = int(wanted) == got
        if not same:
            return f"{key.replace('_', ' ')} (measured {got}, reference {int(wanted) if isinstance(wanted, float) else wanted})"
    return None


def comparison_table(
    runs: pd.DataFrame,
    references: pd.DataFrame,
    tolerance: float = DEFAULT_REPRODUCE_TOLERANCE,
    noise_cv_max: float = DEFAULT_NOISE_CV_MAX,
    target_gpu: str | None = None,
) -> pd.DataFrame:
    """Each reference beside the cell run under its own conditions (the ``reproduce`` study's
    runs that name it in the matrix's ``reference`` column, or, where it has none, those of a
    reference with the same trainer run), with a verdict:

        reproduced      |measured / published - 1| <= tolerance
        above / below   outside the tolerance, measured higher / lower
        not comparable: <condition>   another GPU (its device name differs from the reference's),
                        a condition the trainer cannot match (the reference's ``unmatched``),
                        no run scheduled for it, or a recorded condition that differs
        not measured    a run was planned but none completed

    ``group`` is "reproduction" for references on the GPU the study ran on (on a study without
    such a GPU, a CPU study: those on ``target_gpu``), "context" for the others: shown apart,
    never a pass or fail. The measured figure is the cell's median with its bootstrap 95 %
    interval (scalerepro.analysis.repeats)."""
    ok = runs[runs["counts"]]
    study_gpus = sorted(set(ok.loc[ok["device_type"].eq("cuda"), "device_name"].dropna()))
    cpu_names = sorted(set(ok.loc[ok["device_type"].eq("cpu"), "device_name"].dropna()))
    ran_on = ", ".join(study_gpus) or (f"CPU ({', '.join(cpu_names)})" if cpu_names else "no completed run")
    reproduce = runs[runs["study"].eq("reproduce")]
    # references that the same trainer run serves (the same model, GPU count, batch and flags)
    by_trainer = {
        ref["id"]: (ref["trainer_model"], ref["gpus"], ref["trainer_per_gpu_batch"], ref["trainer_flags"])
        for ref in references.to_dict("records")
        if _given(ref["trainer_model"])
    }
    rows = []
    for ref in references.to_dict("records"):
        on_study_gpu = any(_same_device(ref["gpu"], g) for g in study_gpus)
        group = "reproduction" if on_study_gpu or (not study_gpus and _same_device(ref["gpu"], target_gpu)) else "context"
        planned = reproduce[reproduce["reference"].eq(ref["id"])]
        shared = ""
        if planned.empty and ref["id"] in by_trainer:
            same = [rid for rid, key in by_trainer.items() if key == by_trainer[ref["id"]] and rid != ref["id"]]
            planned = reproduce[reproduce["reference"].isin(same)]
            shared = f"; the run of {', '.join(sorted(set(planned['reference'])))} (the same trainer run)" if len(planned) else ""
        done = planned[planned["counts"]]
        value = "samples_per_s" if ref["metric"] == "samples_per_s" else "tokens_per_s"
        values = done[value] / (done["gpus"] if ref["metric"] == "tokens_per_s_per_gpu" else 1)
        spread = repeats.describe(values.to_numpy(dtype=float), ("reference", ref["id"]))
        measured = recorded_conditions(done.iloc[0].to_dict()) if len(done) else {}
        row = {
            "reference": ref["id"], "group": group, "kind": ref["kind"], "model": ref["model"], "gpus": ref["gpus"],
            "metric": ref["metric"], "published": ref["value"], "measured": spread["median"],
            "measured_ci_low": spread["ci_low"], "measured_ci_high": spread["ci_high"], "repeats": spread["n"],
            "measured_cv": spread["cv"], "noisy": bool(spread["cv"] > noise_cv_max),
            "measured_cell": f"reproduce: {', '.join(done['run_id'])}{shared}" if len(done) else "",
            "measured_device": measured.get("gpu", ""), "measured_conditions": describe_conditions(measured),
            "published_conditions": describe_conditions(ref),
            **{key: ref[key] for key in (*CONDITIONS, "framework", "metric_notes", "source", "note")},
        }  # fmt: skip
        row["ratio"] = spread["median"] / ref["value"] if len(done) else float("nan")
        differs = None
        if len(done) and not _same_device(measured["gpu"], ref["gpu"]):
            differs = f"GPU (measured on {measured['gpu']}, reference on {ref['gpu']})"
        elif not len(done) and not on_study_gpu:
            differs = f"GPU (this study ran on {ran_on}; the reference on {ref['gpu']})"
        elif _given(ref["unmatched"]):
            differs = str(ref["unmatched"])
        elif planned.empty:
            differs = "no run scheduled for it (the reproduce study has no run naming this reference)"
        elif len(done) and spread["n"]:  # runs without the metric are "not measured" below, whatever their conditions
            differs = _differing_condition(ref, measured)
        if differs is not None:
            row["verdict"], row["differs"] = f"not comparable: {differs.split(' (')[0].split(':')[0]}", differs
        elif not len(done):
            row["verdict"] = "not measured"
            row["differs"] = f"no completed run: {len(planned)} planned, {int(planned['counts'].sum())} counted"
        elif spread["n"] == 0:
            row["verdict"], row["differs"] = "not measured", f"its {len(done)} completed runs recorded no {value}"
        else:
            # reproduced when |measured / published - 1| <= tolerance
            ratio = row["ratio"]
            row["verdict"] = "reproduced" if abs(ratio - 1) <= tolerance else "above" if ratio > 1 else "below"
            row["differs"] = ""
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
    order = {"reproduction": 0, "context": 1}
    return table.sort_values(["group", "model", "gpus"], key=lambda c: c.map(order) if c.name == "group" else c,
                             kind="stable", ignore_index=True)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Checks against the targets: every check is data (config ``targets.checks``), one evaluator
# --------------------------------------------------------------------------------------------

# The tables a check may select from, and the numeric columns it may reduce (its metric).
CHECK_TABLES: dict[str, tuple[str, ...]] = {
    "scaling": (
        "samples_per_s_median", "samples_per_s_cv", "samples_per_s_per_gpu", "step_time_median_s", "epoch_time_s",
        "epoch_time_cv", "speedup", "efficiency", "weak_variation",
    ),
    "sensitivity": ("samples_per_s_median", "samples_per_s_cv", "step_time_median_s", "exposed_comm_fraction"),
    "ablation": ("samples_per_s_median", "samples_per_s_cv", "gain"),
    "parallelism": (
        "samples_per_s_median", "samples_per_s_cv", "tokens_per_s_median", "tokens_per_s_per_gpu", "mfu",
        "peak_memory_bytes", "state_bytes_per_rank_max", "comm_bytes_per_step",
    ),
    "runs": (
        "samples_per_s", "tokens_per_s", "step_time_median_s", "epoch_time_s", "mfu", "exposed_comm_fraction",
        "data_stall_fraction", "gpu_util_mean_pct", "power_mean_w", "energy_per_sample_j", "energy_per_sample_net_j",
        "peak_memory_bytes", "final_train_loss", "final_eval_loss", "final_eval_accuracy",
    ),
    "communication": ("time_us_median", "algbw_gbps", "busbw_gbps"),
    "comparison": ("ratio", "measured"),
}  # fmt: skip
# What names a selected row in a check's detail, by table.
CHECK_LABELS = {"scaling": "model", "sensitivity": "model", "ablation": "model", "parallelism": "cell", "runs": "run_id",
                "communication": "size_bytes", "comparison": "reference"}  # fmt: skip
# Why a row has no value, by table (shown when a check measured nothing).
CHECK_REASONS = {"scaling": "note", "sensitivity": "note", "ablation": "note", "parallelism": "note", "runs": "nvml_reason",
                 "comparison": "verdict"}  # fmt: skip
REDUCTIONS = ("worst", "best", "mean", "median")
DIRECTIONS = ("min", "max")  # min: the measured value must reach the threshold; max: stay under it
CHECK_UNITS = ("fraction", "percent", "signed fraction")


@dataclass(frozen=True)
class Check:
    """One entry of ``targets.checks`` (ReFrame's reference tuple as data): reduce ``metric``
    over the ``table`` rows that ``where`` selects, and hold it against ``threshold``."""

    name: str
    description: str
    table: str
    metric: str
    threshold: float
    direction: str
    where: Mapping[str, Any]
    reduce: str = "worst"
    strict: bool = False  # pass at equality unless strict
    unit: str = "fraction"

    @property
    def operator(self) -> str:
        return {"min": ">", "max": "<"}[self.direction] + ("" if self.strict else "=")

    def passes(self, value: float) -> bool:
        return {">": value > self.threshold, ">=": value >= self.threshold,
                "<": value < self.threshold, "<=": value <= self.threshold}[self.operator]  # fmt: skip

    def text(self, value: float) -> str:
        """A value of this check's metric as the report shows it."""
        return {"fraction": f"{value:.1%}", "percent": f"{value:.1f}%", "signed fraction": f"{value:+.1%}"}.get(
            self.unit, f"{value:.4g} {self.unit}"
        )


def parse_checks(targets: Mapping[str, Any]) -> list[Check]:
    """The checks of ``targets['checks']`` (name -> entry), in their order. A bad entry raises
    ValueError with one line naming the key and the fix (the config schema catches most first)."""
    entries = targets.get("checks") or {}
    known = set(Check.__dataclass_fields__) - {"name"}
    parsed = []
    for name, entry in entries.items():
        where = f"targets.checks.{name}"
        if not isinstance(entry, Mapping):
            raise ValueError(f"config error at '{where}': a check is a mapping of {sorted(known)}")
        unknown = set(entry) - known
        missing = {"table", "metric", "threshold", "direction"} - set(entry)
        if unknown or missing:
            what = f"unknown keys {sorted(unknown)}" if unknown else f"missing keys {sorted(missing)}"
            raise ValueError(f"config error at '{where}': {what}; a check has {sorted(known)}")
        table, metric = entry["table"], entry["metric"]
        if table not in CHECK_TABLES:
            raise ValueError(f"config error at '{where}.table': {table!r} is not one of {list(CHECK_TABLES)}")
        if metric not in CHECK_TABLES[table]:
            raise ValueError(f"config error at '{where}.metric': {metric!r} is not a metric of {table}.csv "
                             f"(one of {', '.join(CHECK_TABLES[table])})")  # fmt: skip
        for key, allowed in (("direction", DIRECTIONS), ("reduce", REDUCTIONS)):
            if key in entry and entry[key] not in allowed:
                raise ValueError(f"config error at '{where}.{key}': {entry[key]!r} is not one of {list(allowed)}")
        if isinstance(entry["threshold"], bool) or not isinstance(entry["threshold"], (int, float)):
            raise ValueError(f"config error at '{where}.threshold': {entry['threshold']!r} is not a number")
        parsed.append(Check(name=name, description=entry.get("description", f"{table} {metric}"), table=table,
                            metric=metric, threshold=float(entry["threshold"]), direction=entry["direction"],
                            where=dict(entry.get("where") or {}), reduce=entry.get("reduce", "worst"),
                            strict=bool(entry.get("strict", False)), unit=entry.get("unit", "fraction")))  # fmt: skip
    return parsed


_COMPARISONS = {">=": "ge", "<=": "le", ">": "gt", "<": "lt"}


def select(table: pd.DataFrame, where: Mapping[str, Any]) -> tuple[pd.DataFrame, str]:
    """The rows ``where`` selects, and the selection as text. A value is matched for equality (a
    list: any of it), a string ">1" / ">=2" / "<8" / "<=4" compares, and "max" / "min" keeps the
    rows at the largest / smallest value of the column among those the other keys select."""
    rows, said, extremes = table, [], []
    for column, wanted in where.items():
        if column not in table.columns:
            raise ValueError(f"a check selects on {column!r}, which the table lacks (it has {', '.join(table.columns)})")
        if wanted in ("max", "min"):
            extremes.append((column, wanted))
            continue
        if isinstance(wanted, str) and wanted[:1] in "<>":
            op = ">=" if wanted.startswith(">=") else "<=" if wanted.startswith("<=") else wanted[0]
            rows = rows[getattr(rows[column], _COMPARISONS[op])(float(wanted[len(op):]))]
            said.append(f"{column} {op} {wanted[len(op):]}")
        elif isinstance(wanted, list):
            rows = rows[rows[column].isin(wanted)]
            said.append(f"{column} in {', '.join(map(str, wanted))}")
        else:
            rows = rows[rows[column].eq(wanted)]
            said.append(f"{column} = {wanted}")
    for column, wanted in extremes:
        value = getattr(rows[column], wanted)()
        if pd.notna(value):
            rows = rows[rows[column].eq(value)]
        said.append(f"{column} = {value:g} ({wanted})" if pd.notna(value) else f"{column} = {wanted}")
    return rows, ", ".join(said)


def _verdict(
    check: Check, target: str, detail: str, measured: float | None = None,
    interval: tuple[float, float] = (float("nan"), float("nan")),
) -> dict[str, Any]:  # fmt: skip
    """One checks.csv row; without ``measured`` the check is "not measured" and ``detail`` says
    why. With an interval that has the threshold strictly inside it the check is "inconclusive":
    the repeats cannot say on which side the true value lies."""
    low, high = interval
    value = "" if measured is None else check.text(measured)
    if measured is None:
        status = "not measured"
    elif repeats.straddles(low, high, check.threshold):
        status = "inconclusive"
        detail = f"95 % interval {check.text(low)} to {check.text(high)} holds the threshold; " + detail
    else:
        status = "pass" if check.passes(measured) else "fail"
    row = (check.name, target, check.threshold, measured, low, high, value, status, detail, check.unit)
    return dict(zip(CHECK_COLUMNS, row))


def evaluate(check: Check, tables: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """One check on the tables: select its rows, reduce its metric (worst: the row furthest on
    the failing side, with its 95 % interval where the table has ``<metric>_ci_low/_high``;
    mean / median: over the rows), say which rows and why any were not measured."""
    table = tables[check.table]
    label = CHECK_LABELS[check.table]
    chosen, where = select(table, check.where)
    target = f"{check.description} {check.operator} {check.text(check.threshold)}" + (f" ({where})" if where else "")
    done = chosen.dropna(subset=[check.metric])
    if done.empty:
        reason = CHECK_REASONS.get(check.table)
        reasons = []  # each reason once, with the rows it is given for
        if reason in chosen.columns:
            for text, labels in chosen.dropna(subset=[reason]).groupby(reason, sort=False)[label]:
                who = ", ".join(map(str, labels)) if len(labels) <= 3 else f"{len(labels)} rows"
                reasons.append(f"{who}: {text}")
        why = f"no {check.table}.csv row where {where or 'any'}" if chosen.empty else \
            f"no {check.metric} in the {len(chosen)} {check.table}.csv rows where {where or 'any'}"  # fmt: skip
        return _verdict(check, target, why + (f": {'; '.join(reasons)}" if reasons else ""))
    worst_first = done.sort_values(check.metric, ascending=check.direction == "min", kind="stable")
    per_label = worst_first.drop_duplicates(subset=[label])  # a derived column may repeat on a model's rows
    listing = ", ".join(f"{name} {check.text(v)}" for name, v in zip(per_label[label], per_label[check.metric]))
    if len(per_label) > 6:
        listing = f"{len(per_label)} {label}s, median {check.text(float(done[check.metric].median()))}"
    interval = (float("nan"), float("nan"))
    if check.reduce in ("worst", "best"):
        picked = worst_first.iloc[0 if check.reduce == "worst" else -1]
        measured = float(picked[check.metric])
        detail = f"{check.reduce} {label} {picked[label]}: {listing}"
        if {f"{check.metric}_ci_low", f"{check.metric}_ci_high"} <= set(table.columns):
            interval = (float(picked[f"{check.metric}_ci_low"]), float(picked[f"{check.metric}_ci_high"]))
    else:
        measured = float(getattr(done[check.metric], check.reduce)())
        worst = worst_first.iloc[0]
        detail = f"{check.reduce} of {len(done)} rows; worst {worst[label]} {check.text(float(worst[check.metric]))}"
    absent = chosen.loc[chosen[check.metric].isna(), label].astype(str).unique()
    if len(absent):
        detail += "; not measured: " + ", ".join(absent)
    return _verdict(check, target, detail, measured, interval)


def cpu_study(runs: pd.DataFrame) -> bool:
    """Every run that counts ran on the CPU (and at least one did)."""
    types = set(runs.loc[runs["counts"], "device_type"].dropna())
    return types == {"cpu"}


def checks_table(tables: Mapping[str, pd.DataFrame], targets: Mapping[str, Any]) -> pd.DataFrame:
    """One row per entry of ``targets['checks']``, in their order, each judged against its
    threshold. On a CPU study the thresholds are the CPU's (the config's cpu_overrides set them)
    and each row says what a CPU study judges: ranks sharing one host's cores are not a cluster."""
    rows = [evaluate(check, tables) for check in parse_checks(targets)]
    if rows and cpu_study(tables["runs"]):
        for row in rows:
            if row["status"] != "not measured":
                row["detail"] = f"{CPU_STUDY}; {row['detail']}"
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
        "comparison": {
            verdict: int(tables["comparison"]["verdict"].str.startswith(verdict).sum()) for verdict in VERDICTS
        } if "comparison" in tables else {},
        "cpu_study": cpu_study(runs),
        "noisy_cells": int(sum(tables[name]["noisy"].fillna(False).astype(bool).sum()
                               for name in ("scaling", "sensitivity", "ablation", "parallelism") if name in tables)),
    }


def aggregate(
    matrix_path: str | os.PathLike[str],
    comm_paths: Iterable[str | os.PathLike[str]],
    references_path: str | os.PathLike[str],
    targets: Mapping[str, Any],
    predict_gpus: Sequence[int] = scaling_model.DEFAULT_PREDICT_GPUS,
) -> dict[str, pd.DataFrame]:
    """Every table, by file stem (see the module docstring)."""
    comm_paths = list(comm_paths)
    tolerance = targets.get("reproduce_tolerance", DEFAULT_REPRODUCE_TOLERANCE)
    noise = targets.get("noise_cv_max", DEFAULT_NOISE_CV_MAX)
    runs, epochs, losses = read_runs(read_matrix(matrix_path))
    references = read_references(references_path)
    tables = {
        "runs": runs,
        "epochs": epochs,
        "loss_log": losses,
        "scaling": scaling_table(runs, noise),
        "sensitivity": sensitivity_table(runs, noise),
        "ablation": ablation_table(runs, noise),
        "parallelism": parallelism_table(runs, noise),
        "communication": communication_table(comm_paths),
        "comparison": comparison_table(runs, references, tolerance, noise, read_target_gpu(references_path)),
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


def _targets(text: str) -> dict[str, Any]:
    """``--targets``: the config's ``targets`` mapping as JSON, checked here so that a bad entry
    stops the aggregation with one line before any table is written."""
    try:
        targets = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}): pass the config's targets mapping as JSON") from None
    if not isinstance(targets, dict) or set(targets) - set(TARGETS):
        raise argparse.ArgumentTypeError(f"a mapping of {', '.join(TARGETS)} is expected, got {text[:80]!r}")
    try:
        parse_checks(targets)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="python -m scalerepro.analysis.aggregate",
        description="Join the run records onto the study matrix and write the study's tidy tables.",
        epilog="targets: " + "; ".join(f"{key}: {what}" for key, what in TARGETS.items()),
    )
    parser.add_argument("--matrix", required=True, type=Path, help="matrix.csv, one row per expected run")
    parser.add_argument("--comm", nargs="*", default=[], type=Path, help="all-reduce benchmark JSON files")
    parser.add_argument("--references", required=True, type=Path, help="config/references.yaml")
    parser.add_argument("--out", required=True, type=Path, help="directory for the CSV tables and summary.json")
    parser.add_argument("--targets", default={}, type=_targets, metavar="JSON", help="the config's targets mapping")
    parser.add_argument(
        "--predict-gpus", nargs="*", type=int, default=list(scaling_model.DEFAULT_PREDICT_GPUS), metavar="N",
        help="GPU counts the scaling model predicts beyond the study's hardware (links from --references)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    start = time.perf_counter()
    tables = aggregate(args.matrix, args.comm, args.references, args.targets, args.predict_gpus)
    summary = write_tables(tables, args.out)
    print(
        f"aggregate: {summary['runs']} runs {summary['status']}, checks {summary['checks']}, "
        f"{len(tables)} tables in {args.out} ({time.perf_counter() - start:.2f} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
