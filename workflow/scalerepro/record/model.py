"""The run record: one JSON document per run, written atomically by rank 0 (``scalerepro.training.record``).

This model is the record's one definition. The rank builds a ``RunRecord`` and writes it; the
analysis reads a record file into one (``scalerepro.record.read``, through the upgrade chain
for older schemas); ``workflow/schemas/run_record.schema.json`` and the field table of
docs/run-record.md are generated from it (``python -m scalerepro.record.schema --write``), and
tests fail when either differs.

Each measured figure declares its bound (pydantic's ``gt``/``ge``/``le``: a record with a figure
outside it is no measurement, ``scalerepro.record.evidence``) and, where the runs table has it as
a column, that column and its unit (``Column``). Units are in the key names: ``_s`` seconds,
``_bytes``, ``_w`` watts, ``_j`` joules, ``_pct`` percent, ``_mhz``.

Raise ``RECORD_SCHEMA_VERSION`` with any change a reader must know about, and add the step from
the previous layout to ``scalerepro.record.upgrade``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scalerepro.record.base import (
    AttentionBackend,
    Bytes,
    Column,
    CompileMode,
    CompileScope,
    Count,
    Loader,
    OptimizerImpl,
    Part,
    Positive,
    Precision,
    Preset,
    Purpose,
    Status,
    Strategy,
)
from scalerepro.record.measured import Measurements

# The record's layout: 5 adds the structured MFU peak, the precision's dtypes and the batch's
# samples per GPU a step, and states each fact once; 6 adds the temperature and SM clock at each
# end of the window (scalerepro.record.upgrade has the steps).
RECORD_SCHEMA_VERSION = 6


# --- what ran it --------------------------------------------------------------------------------


class RankFailure(Part):
    rank: Count
    local_rank: Count
    host: str
    exit_code: int = Field(description="negative: the signal that ended the rank")
    signal: str | None


class RunError(Part):
    """Why the run failed. The launcher (scalerepro.launching.rank_failure) adds the failed ranks
    and their last lines where the ranks wrote no record."""

    type: str
    message: Annotated[str, Column("error")]
    traceback: str
    launcher_exit_code: int | None = None
    ranks: list[RankFailure] | None = Field(None, description="the failed ranks torchrun reported (launcher records)")
    log_tails: dict[str, list[str]] | None = Field(None, description="the last lines each rank printed, by local rank (launcher records)")


class Git(Part):
    commit: Annotated[str | None, Column("git_commit")]
    dirty: Annotated[bool | None, Column("git_dirty")] = Field(description="modified, staged or untracked files beside the commit")
    reason: str | None = Field(description="why commit or dirty is null")


class Gpu(Part):
    """The visible CUDA devices, described by device 0 (rank 0's); uuid, power_limit_w and
    sm_clock_max_mhz only where torch saw a CUDA device."""

    name: str | None = None
    count: Count | None = None
    memory_bytes: Annotated[Bytes | None, Column("gpu_memory_bytes", "bytes")] = None
    compute_capability: str | None = None
    driver_version: Annotated[str | None, Column("gpu_driver")] = None
    reason: str | None = Field(None, description="why a fact above is null")
    uuid: Annotated[str | None, Column("gpu_uuid")] = Field(None, description="device 0's NVML UUID (GPU-...)")
    power_limit_w: float | None = Field(None, description="the power limit the card enforces (nvmlDeviceGetEnforcedPowerLimit)")
    sm_clock_max_mhz: float | None = Field(None, description="the card's maximum SM clock (nvmlDeviceGetMaxClockInfo)")


class Hardware(Part):
    hostname: str
    cpu_model: Annotated[str | None, Column("cpu_model")]
    logical_cpus: Count | None
    usable_cpus: Annotated[Count | None, Column("usable_cpus")] = Field(None, description="the CPUs this process may run on (affinity)")
    memory_total_bytes: Bytes | None
    gpu: Gpu


class Scheduler(BaseModel):
    """The batch job the run ran in (scalerepro.schedulers): ``local`` outside any; each backend
    adds its own facts beside these four."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    job_id: Annotated[int | str | None, Column("scheduler_job_id")]
    cluster_name: str | None
    partition: str | None


class Parallel(Part):
    """Where the run ran: the launcher, the backend and the ranks (a run that failed before its
    process group formed: this host only)."""

    strategy: Annotated[Strategy, Column("parallel_recorded")] = Field(description="the --parallel strategy")
    launcher: Literal["local", "torchrun", "slurm", "single"] | None = None
    backend: Annotated[Literal["nccl", "gloo"] | None, Column("backend")] = None
    device_type: Annotated[Literal["cuda", "cpu"] | None, Column("device_type")] = None
    world_size: Annotated[Positive | None, Column("world_size_recorded")] = None
    nodes: Annotated[Positive | None, Column("nodes_recorded")] = None
    ranks_per_node: Positive | None = None
    gpus_per_node: Count | None = Field(None, description="distinct cards per node (ranks may share one under gloo)")
    gpus: Count | None = Field(None, description="distinct cards of the run: gpus_per_node x nodes")
    hostnames: list[str] = Field(min_length=1)


# --- what was planned -------------------------------------------------------------------------


class RunPrecision(Part):
    """The arithmetic of the run (--precision): the master parameters' dtype, what the matmuls and
    convolutions compute in, the optimizer state's dtype."""

    name: Annotated[Precision, Column("precision_recorded")]
    param_dtype: Literal["fp32"] = Field(description="the master parameters (bf16 FSDP keeps fp32 shards and gathers bf16 copies to compute)")
    compute_dtype: Precision = Field(description="fp32: IEEE matmuls and convolutions (TF32 off); tf32: TF32 tensor cores; fp16, bf16: autocast")
    optimizer_state_dtype: Literal["fp32"]
    loss_scaling: bool = Field(description="fp16's dynamic loss scaling (GradScaler)")
    reason: Annotated[str | None, Column("precision_reason")] = Field(
        description="on a CPU, why this precision (bf16 is native on some CPUs, emulated on others); null on a GPU"
    )


class Knobs(Part):
    """The levers as resolved: the preset, the flags that depart from it, and each lever's value."""

    preset: Preset | None = Field(None, description="null: a record written before presets")
    preset_overrides: dict[str, Any] = Field(default_factory=dict, description="flag (dest name) -> value, where the run departs from its preset")
    channels_last: Annotated[bool, Column("channels_last")]
    cudnn_benchmark: Annotated[bool, Column("cudnn_benchmark")]
    compile: Annotated[CompileMode, Column("compile_mode")]
    compile_scope: Annotated[CompileScope, Column("compile_scope")] = Field(description="--compile-scope: the whole model or each repeated block")
    attention_backend: Annotated[AttentionBackend, Column("attention_backend")]
    stem_channels: Annotated[int, Column("stem_channels")] = Field(description="the ResNets' first convolution's input channels (3: the plain stem)")
    loader: Annotated[Loader, Column("loader")]
    optimizer_impl: Annotated[OptimizerImpl, Column("optimizer_impl")]
    bucket_cap_mb: float = Field(gt=0)
    gradient_as_bucket_view: bool
    static_graph: bool
    sync_batchnorm: bool
    host_heap: str | None = Field(None, description="what the rank set of glibc malloc's thresholds, or why nothing; null where no rank set it")


class ModelShape(Part):
    image_size: Annotated[int | None, Column("image_size")] = None
    num_classes: int | None = None
    seq_len: Annotated[int | None, Column("seq_len")] = None
    vocab_size: int | None = None
    num_layers: Annotated[int | None, Column("num_layers")] = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    dropout: float | None = None


class ModelFacts(Part):
    """The model: its name always (the trainer's --model), the rest once it was built (null where
    the run failed before)."""

    name: str = Field(min_length=1, description="the model the run was asked to train (--model): scalerepro.models.registry's name for it")
    task: Literal["image_classification", "masked_lm", "causal_lm"] | None
    family: Literal["cnn", "transformer"] | None
    num_parameters: Annotated[Positive | None, Column("num_parameters")]
    tokens_per_sample: Annotated[Count | None, Column("tokens_per_sample")]
    train_flops_per_sample: float | None = Field(gt=0, description="forward + backward FLOPs of one sample (one sequence)")
    flops_source: str | None
    shape: ModelShape | None


class OptimizerFacts(Part):
    kind: Annotated[Literal["sgd", "adamw"], Column("optimizer_kind")]
    base_lr: float
    lr: float = Field(description="the peak LR at the run's global batch")
    weight_decay: float
    lr_scaling: str
    schedule: str


class Batch(Part):
    """The batch: each rank's micro-batch and the micro-batches a step accumulates (the flags), and
    what they make over the ranks (null where the run failed before its ranks formed)."""

    micro_batch: Annotated[Positive, Column("per_gpu_batch_recorded")] = Field(description="samples per rank per micro-batch (--per-gpu-batch)")
    grad_accum_steps: Annotated[Positive, Column("grad_accum_recorded")]
    samples_per_gpu_step: Annotated[float | None, Column("samples_per_gpu_step")] = Field(
        gt=0, description="global batch / world size: the samples each GPU's optimizer step takes (micro-batch x accumulation under DDP and FSDP)"
    )
    global_batch: Positive | None = Field(description="micro-batch x data-parallel ranks x accumulation steps")


class DataFacts(Part):
    kind: Annotated[Literal["synthetic", "cifar10"], Column("data_kind")]
    path: str | None
    train_samples: Count
    eval_samples: Count


class SkippedCheckpoint(Part):
    path: str
    reason: str


class Steps(Part):
    total: Positive
    scheduled: Positive | None = Field(None, description="the LR schedule's steps: fewer than total where --min-window-s lengthened the run")
    completed: Count
    warmup: Count = Field(description="this process's warm-up steps: --warmup-steps, or more where --warmup-max-steps waited for the step time to settle")
    warmup_reason: str | None = Field(None, description="why that many")
    per_epoch: Positive
    resumed_from: str | None
    checkpoints_skipped: list[SkippedCheckpoint] | None = Field(None, description="newer checkpoints passed over on resume, each with why")


class Epochs(Part):
    planned: float = Field(ge=0, description="total steps / steps per epoch")
    completed: Count


class EpochEntry(Part):
    """One evaluated epoch; complete=false for the partial last epoch of a run counted in steps."""

    epoch: Count
    step: Count
    complete: bool
    train_loss: float | None
    eval_loss: float | None = None
    eval_accuracy: float | None = Field(None, ge=0, le=1)
    eval_samples: Positive | None = Field(None, description="held-out samples evaluated (fewer where --eval-budget-s stopped the evaluation)")


class LossEntry(Part):
    step: int
    loss: float
    samples_per_s: float


# --- the record ---------------------------------------------------------------------------------


class RunRecord(Part):
    """One run: what was planned, what ran it, what it measured, what it was for and how it ended."""

    model_config = ConfigDict(
        title="scalerepro run record",
        json_schema_extra={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://scalerepro.invalid/schemas/run_record.schema.json",
        },
    )

    schema_version: Literal[6]
    run_id: str = Field(min_length=1)
    purpose: Purpose = Field(description="a smoke run checks a code path: the analysis never pools it with a measurement")
    status: Annotated[Status, Column("status")]
    error: RunError | None
    stop_signal: Annotated[Literal["SIGTERM", "SIGUSR1"] | None, Column("stop_signal")]
    started_at: Annotated[str, Column("started_at"), Field(json_schema_extra={"format": "date-time"})]
    ended_at: Annotated[str, Column("ended_at"), Field(json_schema_extra={"format": "date-time"})]
    command_line: list[str] = Field(min_length=3)
    seed: int
    precision: RunPrecision
    knobs: Knobs
    config: dict[str, dict[str, Any]] = Field(description="the resolved trainer config, section by section (scalerepro.trainer_flags.TrainConfig)")
    git: Git
    versions: dict[str, str | int | None] = Field(description="python, torch, cuda, cudnn, nccl, torchvision, scalerepro, ...")
    hardware: Hardware
    scheduler: Scheduler
    model: ModelFacts
    optimizer: OptimizerFacts | None
    parallel: Parallel
    batch: Batch
    data: DataFacts | None
    steps: Steps | None
    epochs: Epochs | None
    measurements: Measurements | None
    measurements_scope: Literal["all ranks", "rank 0 only"] | None
    history: list[EpochEntry]
    loss_log: list[LossEntry]
    checkpoint: str | None
