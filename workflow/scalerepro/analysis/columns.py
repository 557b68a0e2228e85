"""The columns and vocabularies of the tables that more than one module writes or reads: each list is written here once.

The aggregation's tables, the profiles' tables and the store's history and comparison tables,
with their vocabularies (run statuses, verdicts, check statuses) and defaults: their writers
(``tables``, ``profiles``, ``history``) and readers (``presentation``, ``rebuild``) import these
lists instead of writing their own. Not here: a table that one module writes and reads keeps its
columns beside its code (``tables.scaling_model``'s scaling_model.csv, ``predict``'s predictions,
the store's own files in ``history``, the columns a check may read in ``tables.check_definitions``), and a
module that reads a few columns of a table (the report, the plots, the store) names each where
it reads it, as a string.

Nothing but the record's own columns is imported here: the workflow reads ``AGGREGATE_TABLES``
when it parses, where pandas need not be installed.
"""

from __future__ import annotations

from scalerepro.record import columns as record_columns

# The tables the aggregation writes (results/tables/<name>.csv, with summary.json): the rule's
# outputs, what a bundle must hold.
AGGREGATE_TABLES = (
    "runs",
    "cells",
    "epochs",
    "loss_log",
    "scaling",
    "sensitivity",
    "ablation",
    "parallelism",
    "communication",
    "comparison",
    "checks",
    "cost",
    "scaling_model",
    "loss_decomposition",
    "published_comparison",
    "gap_walk",
)
MATRIX_COLUMNS = (
    "run_id",
    "study",
    "model",
    "gpus",
    "nodes",
    "gpus_per_node",
    "repeat",
    "variant",
    "precision",
    "per_gpu_batch",
    "global_batch",
    "bucket_cap_mb",
    "runtime_min",
    "record",
    "rerun",
)
# Matrix columns that older matrices lack, and what their absence means.
OPTIONAL_MATRIX_COLUMNS = {
    "reference": "",
    "grad_accum_steps": 1,
    "parallel": "ddp",
    "data_parallel": None,
    # what the plan sets beside its batches (matrices from before them leave them unset: ""), and
    # what a run is for: a study plans measurements; rebuild --records takes each record's own
    "device": "",
    "data": "",
    "purpose": "measurement",
    # the run whose record a row reads where another cell runs the same trainer run ("": its own)
    "record_of": "",
    # the planned cell the run repeats ("": the run id less its _r<repeat>, as older matrices name runs)
    "cell": "",
}
RUN_STATUSES = ("ok", "failed", "preempted", "missing")

# The columns a record gives (scalerepro.record.columns: the model's), and the ones the reader adds.
RECORD_COLUMNS = ("run_id", *record_columns.RECORD_ROW, "schema_version", "purpose_basis", "withheld", "consistency")
# runs.csv: the plan, whether the run counts (readers.read_runs), then what its record gives.
RUN_COLUMNS = (
    *MATRIX_COLUMNS,
    *OPTIONAL_MATRIX_COLUMNS,
    "consistent",
    "counts",
    # the run whose probe gave its overlap cost: its own, or its cell's repeat 1 where its probe
    # was off by plan (readers.cell_probes)
    "probe_of",
    "duration_s",
    *RECORD_COLUMNS[1:],
)
EPOCH_COLUMNS = ("run_id", "epoch", "step", "complete", "train_loss", "eval_loss", "eval_accuracy")
LOSS_COLUMNS = ("run_id", "step", "loss", "samples_per_s")
COMM_COLUMNS = ("gpus", "size_bytes", "nodes", "backend", "time_us_median", "algbw_gbps", "busbw_gbps")
# The conditions of a reference (config/references.yaml), compared with a run's in this order.
CONDITIONS = ("gpu", "precision", "per_gpu_samples_per_step", "seq_len", "memory_format", "data", "optimizer")
REFERENCE_COLUMNS = (
    "id",
    "model",
    "gpus",
    "metric",
    "value",
    "kind",
    "source",
    *CONDITIONS,
    "framework",
    "metric_notes",
    "trainer_model",
    "trainer_per_gpu_batch",
    "trainer_flags",
    "unmatched",
    "note",
)
REFERENCE_KINDS = ("published", "expected (seed document)", "mlperf")
REFERENCE_METRICS = ("samples_per_s", "tokens_per_s_per_gpu")
REFERENCE_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "mixed")
# Spread of a cell's throughput over its repeats (scalerepro.analysis.repeats): n is repeats_ok.
SPREAD = ("samples_per_s_cv", "samples_per_s_ci_low", "samples_per_s_ci_high", "noisy")
THROUGHPUT = ("samples_per_s_median", "samples_per_s_min", "samples_per_s_max", *SPREAD)
# (max T - min T) / min T over a weak-scaling model's GPU counts, on each of its weak rows
WEAK_VARIATION = ("weak_variation", "weak_variation_ci_low", "weak_variation_ci_high")
SCALING_COLUMNS = (
    "study",
    "model",
    "gpus",
    "nodes",
    "repeats_ok",
    "repeats_total",
    *THROUGHPUT,
    "samples_per_s_per_gpu",
    "step_time_median_s",
    "epoch_time_s",
    "epoch_time_cv",
    "speedup",
    "ideal_speedup",
    "efficiency",
    "efficiency_ci_low",
    "efficiency_ci_high",
    *WEAK_VARIATION,
    "note",
)
# cells.csv (tables.cell_tables.cells_table): one row per cell (scalerepro.record.cell: the plan's,
# its repeats held to one configuration), what the headline reads: the settings that tell one
# configuration from another, its statistics, and the facts its counted records share.
CELL_SETTINGS = (
    "study",
    "model",
    "gpus",
    "nodes",
    "variant",
    "precision",
    "per_gpu_batch",
    "grad_accum_steps",
    "global_batch",
    "bucket_cap_mb",
    "parallel",
    "reference",
)
CELL_FACTS = (
    "device_type",
    "data_kind",
    "image_size",
    "seq_len",
    "tokens_per_sample",
    "gpu_memory_bytes",
    "peak_memory_kind",
    "peak_rate",
    "peak_part",
    "peak_clock_mhz",
    "withheld",
)
CELLS_COLUMNS = (
    "cell",
    *CELL_SETTINGS,
    "repeats_ok",
    "repeats_total",
    *THROUGHPUT,
    "tokens_per_s_median",
    "step_time_median_s",
    "epoch_time_s",
    "epoch_time_cv",
    "exposed_comm_fraction",
    "mfu",
    "peak_memory_bytes",
    "device_name",
    *CELL_FACTS,
)
SENSITIVITY_KEYS = ("model", "gpus", "bucket_cap_mb", "per_gpu_batch", "precision")
SENSITIVITY_COLUMNS = (
    *SENSITIVITY_KEYS,
    "repeats_ok",
    "repeats_total",
    *THROUGHPUT,
    "step_time_median_s",
    "exposed_comm_fraction",
    "note",
)
ABLATION_COLUMNS = (
    "model",
    "gpus",
    "variant",
    "repeats_ok",
    "repeats_total",
    *THROUGHPUT,
    "gain",
    "gain_ci_low",
    "gain_ci_high",
    "note",
)
# A parallelism cell: a model under one --parallel strategy at one GPU count (its batch follows).
PARALLELISM_KEYS = ("model", "gpus", "nodes", "parallel", "variant", "data_parallel", "per_gpu_batch", "global_batch")
# The sharding figures of a record (measurements.sharding), medians over a cell's counted repeats.
SHARDING_FIGURES = (
    "state_bytes_per_rank_max",
    "state_bytes_per_rank_min",
    "comm_bytes_per_step",
    "pipeline_bubble_fraction",
    *record_columns.MEMORY_SPLIT,
)
PARALLELISM_COLUMNS = (
    *PARALLELISM_KEYS,
    "repeats_ok",
    "repeats_total",
    *THROUGHPUT,
    "tokens_per_s_median",
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_memory_bytes",
    "peak_memory_kind",
    "mesh",
    "reshard_after_forward",
    *SHARDING_FIGURES,
    "comm_by_collective",
    "device_name",
    "cell",
    "note",
)
VERDICTS = ("reproduced", "above", "below", "not comparable", "not measured")
COMPARISON_COLUMNS = (
    "reference",
    "group",
    "kind",
    "model",
    "gpus",
    "metric",
    "published",
    "measured",
    "measured_ci_low",
    "measured_ci_high",
    "repeats",
    "measured_cv",
    "noisy",
    "ratio",
    "verdict",
    "differs",
    "measured_cell",
    "measured_device",
    "measured_conditions",
    "published_conditions",
    *CONDITIONS,
    "framework",
    "metric_notes",
    "source",
    "note",
)
CHECK_COLUMNS = (
    "check",
    "target",
    "threshold",
    "measured",
    "interval_low",
    "interval_high",
    "value",
    "status",
    "detail",
    "unit",
)
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
    "other_cpu_fraction_max": "a run whose measured window saw other processes use more than this share of its node's CPUs is not counted (default 0.5)",
}
DEFAULT_REPRODUCE_TOLERANCE = 0.10
DEFAULT_NOISE_CV_MAX = 0.05

# --- profiles ---
CATEGORIES = ("compute", "exposed_comm", "data_wait", "idle")
BOTTLENECK_CLASSES = ("compute-bound", "communication-bound", "input-bound", "launch/latency-bound")


PROFILING_COLUMNS = (
    "run_id",
    "tools",
    "fallback",
    "fallback_reason",
    "source",
    "ranks",
    "steps",
    "window_s",
    "busy_fraction",
    "compute_fraction",
    "exposed_comm_fraction",
    "data_wait_fraction",
    "idle_fraction",
    "overlap_fraction",
    "compute_s",
    "communication_s",
    "overlap_s",
    "exposed_comm_s",
    "data_wait_s",
    "idle_s",
    "compute_kernel_time_s",
    "comm_kernel_time_s",
    "median_call_us",
    "window",
    "classification",
    "provisional",
    "evidence",
    "tool_versions",
    "gpus",
    "driver",
    "warnings",
    "kernel_basis",
    "capture_errors",  # what the kernels' times and shares are of; each failed capture's error
    # the kernels' time by class (profiles.step: every launch of the window, or one launch per configuration)
    "kernel_coverage",
    "kernel_launches",
    "kernel_time_s",
    "class_convolution_s",
    "class_gemm_s",
    "class_attention_s",
    "class_norm_elementwise_s",
    "class_optimizer_s",
    "class_communication_s",
    "class_copies_s",
    "class_other_s",
)
KERNEL_COLUMNS = ("run_id", "rank_in_run", "name", "kind", "class", "calls", "total_s", "mean_us", "share")
ROOFLINE_COLUMNS = (
    "run_id",
    "rank_in_run",
    "kernel",
    "kind",
    "launches",
    "duration_s",
    "flops",
    "flops_source",
    "cuda_core_flops",
    "tensor_flops",
    "tensor_work",
    "achieved_flops_per_s",
    "peak_flops_per_s",
    "peak",
    "roof",
    "flops_fraction",
    "dram_bytes",
    "dram_bytes_per_s",
    "dram_fraction",
    "arithmetic_intensity",
    "ridge_intensity",
    "attainable_flops_per_s",
    "bound",
    "sm_throughput_pct",
    "memory_throughput_pct",
    "achieved_occupancy_pct",
    "theoretical_occupancy_pct",
    "peak_dram_bytes_per_s",
    "dram_bytes_source",
    "peaks_basis",
    "missing",
)
FILE_COLUMNS = ("run_id", "path", "description", "bytes")

# --- the results store and study-vs-study comparisons ---
# A cell across studies: the study's cell (its matrix's name: scalerepro.record.cell), and the two
# planned settings another study's config may set otherwise under the same name.
CELL_KEYS = ("cell", "precision", "per_gpu_batch")
# What a history or comparison row shows of its cell beside its key.
CELL_SHOWN = ("study", "model", "variant", "gpus")
HISTORY_COLUMNS = (
    *CELL_KEYS,
    *CELL_SHOWN,
    "study_id",
    "started_at",
    "git_commit",
    "git_dirty",
    "cluster",
    "device_name",
    "repeats",
    "samples_per_s_median",
    "samples_per_s_min",
    "samples_per_s_max",
    "this_study",
)
# scalerepro.analysis.history.compare: one study against another, cell by cell.
VERSUS_VERDICTS = ("faster", "slower", "no significant change", "too few repeats", "only in baseline", "only in candidate")
VERSUS_COLUMNS = (
    *CELL_KEYS,
    *CELL_SHOWN,
    "baseline_repeats",
    "baseline_median",
    "candidate_repeats",
    "candidate_median",
    "ratio",
    "ratio_low",
    "ratio_high",
    "confidence",
    "threshold",
    "verdict",
    "differs",
)

# published_comparison.csv and gap_walk.csv (scalerepro.analysis.tables.published_comparison's docstring)
PUBLISHED_COMPARISON_COLUMNS = (
    "role",
    "model",
    "device",
    "gpus",
    "study",
    "metric",
    "measured",
    "repeats",
    "spread_kind",
    "spread_n",
    "spread_low",
    "spread_high",
    "spread_steps",
    "measured_runs",
    "reference",
    "kind",
    "published",
    "published_value",
    "published_gpus",
    "published_metric",
    "ratio",
    "per_gpu_note",
    "stand_in",
    "framework",
    "metric_notes",
    "source",
    "stated",
    "differs",
    "unknown",
    "walk_measured",
    "unreached",
    "reached",
    "why",
    "failed",
)
GAP_WALK_COLUMNS = (
    "model",
    "device",
    "gpus",
    "start_role",
    "start_reference",
    "step",
    "status",
    "lever",
    "label",
    "from",
    "to",
    "ratio",
    "ratio_ci_low",
    "ratio_ci_high",
    "from_median",
    "from_n",
    "from_runs",
    "to_median",
    "to_n",
    "to_runs",
    "held",
    "sessions",
    "within_spread",
    "explained",
    "total",
    "what",
    "runs",
    "median",
    "n",
    "levers",
    "apart",
)

# scaling_model.csv (scalerepro.analysis.tables.scaling_model's docstring)
SCALING_MODEL_COLUMNS = (
    "study",
    "model",
    "gpus",
    "nodes",
    "basis",
    "network",
    "alpha_step_us",
    "link_gbps",
    "global_batch",
    "per_gpu_batch",
    "grad_accum_steps",
    "compute_scale",
    "buckets",
    "gradient_bytes",
    "allreduce_s",
    "comm_share",
    "exposed_comm_s",
    "step_time_measured_s",
    "step_time_predicted_s",
    "step_time_error",
    "efficiency_measured",
    "efficiency_predicted",
    "efficiency_error",
    "cluster",
    "typical_error",
    "profile_run",
    "note",
    "cluster_basis",
    "fixed_step_s",
    "loss_fixed_cost",
    "loss_exposed_comm",
    "compute_inflation",
    "inflation_basis",
    "loss_compute_inflation",
    "batch_curve",
    "loss_straggler",
    "straggler_basis",
    "regime",
    "error_basis",
    "assumed_inputs",
    "bound",
    "derived_from",
    "cluster_note",
    "global_batch_basis",
)
