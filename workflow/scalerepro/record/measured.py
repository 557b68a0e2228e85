"""The record's measurements: every figure of the measured window, reduced over the ranks, and
the probes after it, each with its bound and, where the runs table has it, its column."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from scalerepro.record.base import Bytes, Column, Count, Fraction, Part, PeakPrecision, Positive, Seconds, Units

# --- what was measured ------------------------------------------------------------------------


class Peak(Part):
    """What an MFU is a fraction of: one device's dense peak, the precision and units it is
    quoted for, the SM clock the source quotes it at, and where it comes from
    (scalerepro.record.peak)."""

    flops_per_s: Annotated[float, Column("peak_flops_per_device", "FLOP/s")] = Field(gt=0)
    precision: PeakPrecision
    units: Units = Field(description="tensor cores, or the CUDA cores (fp32 with TF32 off)")
    clock_mhz: Annotated[float | None, Column("peak_clock_mhz", "MHz")] = Field(
        gt=0, description="the SM clock the figure is quoted at (H100 SXM: 1,830 MHz tensor, 1,980 CUDA-core); null where the source quotes none"
    )
    part: str | None = Field(description="the compute part ('H100 SXM5'); null for a user override")
    mig_profile: str | None = Field(description="a MIG instance's profile ('3g.40gb'): the peak is its slices' share of the GPU's")
    mig_slices: int | None = Field(ge=1, le=7, description="the instance's compute slices of 7")
    form_factor_assumed: bool = Field(description="the device name gives no form factor: the SXM part (the highest peak) is assumed")
    basis: Literal["table", "user override"]
    source: str


class StepTime(Part):
    median: Annotated[float | None, Column("step_time_median_s", "s")] = Field(gt=0)
    p10: Annotated[float | None, Column("step_time_p10_s", "s")] = Field(gt=0)
    p90: Annotated[float | None, Column("step_time_p90_s", "s")] = Field(gt=0)
    mean: float | None = Field(gt=0)


class EpochWallTime(Part):
    epoch: Count
    seconds: Seconds
    complete: bool


class Memory(Part):
    allocated_bytes_max: Bytes | None
    reserved_bytes_max: Bytes | None
    rss_bytes_max: Bytes | None


class Mesh(Part):
    shape: list[Positive]
    dims: list[str]


class PipelineFacts(Part):
    schedule: Literal["gpipe", "1f1b"]
    stages: Positive
    microbatches: Positive


class Sharding(Part):
    """Under fsdp, tp, fsdp+tp, pp: the mesh, the bytes of parameters + optimizer state each rank
    holds, and the analytic bytes each rank sends per step by collective (scalerepro.parallel.comm_bytes)."""

    mesh: Mesh | None
    reshard_after_forward: Annotated[bool | None, Column("reshard_after_forward")] = None
    state_bytes_per_rank_max: Annotated[Bytes | None, Column("state_bytes_per_rank_max", "bytes")]
    state_bytes_per_rank_min: Annotated[Bytes | None, Column("state_bytes_per_rank_min", "bytes")] = None
    comm_bytes_per_step_analytic: dict[str, Annotated[float, Field(ge=0)]] | None
    comm_reason: Annotated[str | None, Column("comm_reason")] = None
    pipeline: PipelineFacts | None = None
    pipeline_bubble_fraction: Annotated[Fraction | None, Column("pipeline_bubble_fraction")] = Field(
        None, description="(p - 1) / (m + p - 1) for p stages and m micro-batches (analytic)"
    )


class RankMemory(Part):
    parameters: Bytes | None
    gradients: Bytes | None
    optimizer_state: Bytes | None
    activations: int | None = Field(description="CUDA peak allocated - the state: includes FSDP's gathered parameters and other temporaries")


class MemorySplit(Part):
    """Every rank's bytes, in rank order, by kind (scalerepro.parallel.parallelize.local_state_bytes)."""

    per_rank: list[RankMemory]
    activations_reason: Annotated[str | None, Column("activations_reason")]


class ExposedCommunication(Part):
    """The same cached batches timed with and without the gradient all-reduce after training
    (scalerepro.training.probes)."""

    fraction: Annotated[Fraction | None, Column("exposed_comm_fraction")] = Field(description="(t_sync - t_nosync) / t_sync")
    sync_step_s: Annotated[float | None, Column("sync_step_s", "s")] = Field(gt=0)
    nosync_step_s: Annotated[float | None, Column("nosync_step_s", "s")] = Field(gt=0, description="the slowest rank's median step without the all-reduce")
    nosync_rank_mean_s: Annotated[float | None, Column("nosync_rank_mean_s", "s")] = Field(
        None, gt=0, description="median over the probe's steps of the ranks' mean step without the all-reduce"
    )
    straggler_wait_s: Annotated[float | None, Column("straggler_wait_s", "s")] = Field(
        None, ge=0, description="median over the probe's steps of (slowest rank - mean rank) without the all-reduce"
    )
    sync_compute_rank_mean_s: Annotated[float | None, Column("sync_compute_rank_mean_s", "s")] = Field(
        None, gt=0, description="median over the sync steps of the ranks' mean (step - its wait for the all-reduce)"
    )
    overlap_cost_se_s: Annotated[float | None, Column("overlap_cost_se_s", "s")] = Field(
        None, ge=0, description="the standard error of sync_compute_rank_mean_s - nosync_rank_mean_s over the timed steps"
    )
    steps: Count
    reason: Annotated[str | None, Column("exposed_comm_reason")]


class WindowSplit(Part):
    """The measured window's steps split on every rank (scalerepro.training.allreduce_timing):
    means over the window's steps and the ranks."""

    steps: Count
    step_rank_mean_s: Seconds | None
    data_wait_rank_mean_s: Annotated[Seconds | None, Column("window_data_wait_rank_mean_s", "s")]
    compute_rank_mean_s: Annotated[float | None, Column("window_compute_rank_mean_s", "s")] = Field(gt=0, description="step - input wait - all-reduce wait")
    exposed_allreduce_wait_s: Annotated[Seconds | None, Column("window_exposed_wait_s", "s")] = Field(
        description="the least all-reduce wait of any rank: the last rank to finish its backward waits for the communication alone"
    )
    straggler_wait_s: Annotated[Seconds | None, Column("window_straggler_wait_s", "s")] = Field(description="the ranks' mean all-reduce wait - the least")
    clock: Literal["host", "cuda events"] | None
    reason: Annotated[str | None, Column("window_split_reason")] = Field(description="why the window is not split")


class Nvml(Part):
    """GPU telemetry over the measured window, over all GPUs of the run; null figures with a
    reason where NVML is unavailable (a CPU)."""

    available: bool
    reason: Annotated[str | None, Column("nvml_reason")]
    gpus: Count
    device_name: str | None = None
    samples: Count
    interval_s: float | None = None
    window_s: Seconds | None = None
    gpu_util_mean_pct: Annotated[float | None, Column("gpu_util_mean_pct", "%")] = Field(None, ge=0, le=100)
    gpu_util_max_pct: float | None = Field(None, ge=0, le=100)
    memory_used_max_bytes: Bytes | None = None
    power_mean_w: Annotated[float | None, Column("power_mean_w", "W")] = Field(
        None,
        ge=0,
        description="sum over GPUs of each GPU's mean power sample (1 s moving averages on Hopper: low over a short window; the runs table's power_w is the energy counter's)",
    )
    power_mean_per_gpu_w: float | None = Field(None, ge=0)
    power_max_per_gpu_w: float | None = Field(None, ge=0)
    energy_j: Annotated[float | None, Column("energy_j", "J")] = Field(None, ge=0, description="sum over GPUs")
    energy_method: Literal["total_energy_counter", "power_integral"] | None = None
    sm_clock_mean_mhz: Annotated[float | None, Column("sm_clock_mean_mhz", "MHz")] = None
    sm_clock_min_mhz: Annotated[float | None, Column("sm_clock_min_mhz", "MHz")] = Field(None, description="the lowest SM clock sampled, min over GPUs")
    sm_clock_max_mhz: Annotated[float | None, Column("sm_clock_max_mhz", "MHz")] = None
    sm_clock_max_supported_mhz: Annotated[float | None, Column("sm_clock_max_supported_mhz", "MHz")] = Field(
        None, description="the highest SM clock the card may run at, where every GPU has the same"
    )
    temperature_mean_c: float | None = None
    temperature_max_c: Annotated[float | None, Column("temperature_max_c", "°C")] = None
    temperature_start_c: Annotated[float | None, Column("temperature_start_c", "°C")] = Field(
        None, description="the first reading of the window, the highest over GPUs"
    )
    temperature_end_c: Annotated[float | None, Column("temperature_end_c", "°C")] = Field(
        None, description="the last reading of the window, the highest over GPUs"
    )
    sm_clock_start_mhz: Annotated[float | None, Column("sm_clock_start_mhz", "MHz")] = Field(
        None, description="the first SM clock reading of the window, the lowest over GPUs"
    )
    sm_clock_end_mhz: Annotated[float | None, Column("sm_clock_end_mhz", "MHz")] = Field(
        None, description="the last SM clock reading of the window, the lowest over GPUs"
    )
    power_limit_w: Annotated[float | None, Column("power_limit_w", "W")] = Field(None, description="sum over GPUs of each card's enforced power limit")
    power_limit_per_gpu_w: float | None = None
    clock_event_reasons: dict[str, Fraction] | None = Field(
        None,
        description="why the clocks were held down: reason -> share of the window's samples it was active in, mean over GPUs; {} none; null not readable",
    )
    paused_s: Seconds | None = Field(None, description="seconds the sampler paused inside the window (evaluation)")
    idle_power_w: Annotated[float | None, Column("idle_power_w", "W")] = Field(
        None,
        ge=0,
        description="sum over GPUs of each GPU's power before step 1, read with the CUDA context up and nothing queued (not the card's idle: nvidia-smi reads less with no context)",
    )
    idle_power_reason: str | None = None
    energy_net_j: float | None = Field(None, description="energy_j - idle_power_w x window_s: the energy above the power before step 1")


class HostActivity(Part):
    """What else used the node's CPUs during the measured window (scalerepro.telemetry.hostload)."""

    intra_op_threads_per_rank: Positive
    cores_per_rank: list[list[Count]] | None = None
    other_cpu_fraction_max: float | None
    nodes: list[dict[str, Any]]


class Bucket(Part):
    bytes: Positive
    parameters: Positive
    ready_s: Seconds = Field(description="backward start -> every gradient of the bucket accumulated")


class BackwardBuckets(Part):
    """DDP's gradient buckets in all-reduce order and the compute phases of one step, timed after
    the window with gradient synchronisation off (scalerepro.training.buckets); steps 0 and a
    reason where not measured."""

    steps: Count
    reason: str | None
    buckets: list[Bucket]
    layout_source: str | None = None
    first_bucket_cap_bytes: Positive | None = None
    bucket_cap_bytes: Positive | None = None
    gradient_bytes: Bytes | None = None
    micro_batches_per_step: Positive | None = None
    forward_s: Seconds | None = None
    backward_s: Seconds | None = None
    optimizer_s: Seconds | None = None


class Kernel(Part):
    name: str
    launches: Count
    time_s: Seconds


class StepKernels(Part):
    """Steps after the probes under torch.profiler in the run's process (scalerepro.training.kernel_profile)."""

    steps: Count
    reason: str | None
    what: str | None = None
    wall_s: Seconds | None = None
    names: Count | None = None
    launches: Count | None = None
    time_s: Seconds | None = None
    kernels: list[Kernel] | None = None
    busy_s: Seconds | None = None
    span_s: Seconds | None = None
    idle_fraction: Fraction | None = None


class CompileFacts(Part):
    """How rank 0 compiled (scalerepro.training.compilation)."""

    scope: Literal["model", "blocks"] | None
    first_step_s: Seconds | None = Field(description="wall seconds of the process's first step: the compile, cold or warm")
    cache_file: str | None
    cache_loaded: dict[str, Count] | None
    cache_saved_bytes: Bytes | None
    cache_reason: str | None


class ProbeBudget(Part):
    budget_s: Seconds
    step_s: Seconds
    comm_probe_steps: Count
    bucket_probe_steps: Count
    reason: str


class Measurements(Part):
    """Every figure of the measured window, reduced over the ranks, and the probes after it."""

    measured_steps: Annotated[Count | None, Column("measured_steps")]
    measured_samples: Count = Field(description="global samples in the measured window: measured steps x global batch")
    window_s: Annotated[float, Column("window_s", "s")] = Field(
        ge=0, description="seconds of the measured steps, device-synchronised (CUDA events per step, read once after the loop); the slowest rank's"
    )
    samples_per_s: Annotated[float | None, Column("samples_per_s", "samples/s")] = Field(gt=0, description="global samples in the measured window / window_s")
    tokens_per_s: Annotated[float | None, Column("tokens_per_s", "tokens/s")] = Field(
        gt=0, description="samples_per_s x model.tokens_per_sample (language models)"
    )
    step_time_s: StepTime
    epoch_time_s: Annotated[float | None, Column("epoch_time_s", "s")] = Field(gt=0, description="steps per epoch x median step time")
    epoch_wall_times_s: list[EpochWallTime]
    train_time_s: Seconds
    data_stall_fraction: Annotated[Fraction | None, Column("data_stall_fraction")] = Field(description="data_wait_s / window_s")
    data_wait_s: Annotated[Seconds | None, Column("data_wait_s", "s")] = Field(
        None, description="seconds the measured steps spent fetching their batches (slowest rank), on data_wait_clock"
    )
    data_wait_warmup_s: Seconds | None = Field(None, description="the same for the warm-up steps, outside the window")
    data_wait_clock: Annotated[Literal["device", "host"] | None, Column("data_wait_clock")] = Field(
        None,
        description="device: CUDA events around each fetch; host: the host's wait (null: a GPU record from before the device clock, which holds the host's)",
    )
    mfu: Annotated[Fraction | None, Column("mfu")] = Field(
        description="achieved_flops / (devices x peak.flops_per_s): devices are the run's distinct cards (ranks sharing one count it once); null on a CPU"
    )
    peak: Peak | None
    peak_reason: str | None = Field(description="why there is no peak (a CPU, a GPU not in the table)")
    achieved_flops: float | None = Field(ge=0, description="train FLOPs per sample x samples_per_s")
    memory: Memory = Field(description="peak CUDA allocated and reserved bytes and peak RSS of the measured window, the largest over the ranks")
    exposed_communication: ExposedCommunication
    window_split: WindowSplit | None = None
    sharding: Sharding | None = Field(None, description="null under --parallel ddp")
    memory_split: MemorySplit | None = None
    backward_buckets: BackwardBuckets | None = None
    probe_budget: ProbeBudget | None = None
    probes_s: Seconds | None = Field(None, description="wall seconds the probes after the window took on rank 0")
    step_kernels: StepKernels | None = None
    compile: CompileFacts | None = None
    nvml: Nvml
    host_activity: HostActivity | None = Field(None, description="what else used the node's CPUs during the window (scalerepro.telemetry.hostload)")
    energy_per_sample_j: Annotated[float | None, Column("energy_per_sample_j", "J")] = Field(
        ge=0,
        description="nvml.energy_j / measured_samples: the NVML window's energy (evaluation paused out) over the steps' samples; the runs table's column divides one window's: nvml.energy_j / nvml.window_s x window_s / measured_samples",
    )
    energy_per_sample_net_j: Annotated[float | None, Column("energy_per_sample_net_j", "J")] = Field(
        None, description="nvml.energy_net_j / measured_samples (below 0 is noise); the runs table's column: of one window, as energy_per_sample_j"
    )
