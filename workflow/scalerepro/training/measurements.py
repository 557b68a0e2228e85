"""The record's ``measurements``: what this rank measured, reduced over ranks, with the memory and sharding accounting.

The loop, the energy window and the probes fill a ``RankMeasurements``; ``results`` turns it,
with the run's fixed facts (its config, model spec, steps per epoch, history) and, when sharded,
the model as this rank holds it (``ShardedModel``), into every figure of the run. ``results`` is
a collective unless handed a context without a process group (a failed run's rank 0 alone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from scalerepro.common.cuda_graphs import replays_cuda_graphs
from scalerepro.common.reductions import max_or_none
from scalerepro.models import registry
from scalerepro.parallel import blocks, comm_bytes, parallelize, pipeline_parallel, tensor_parallel
from scalerepro.record.measured import Measurements
from scalerepro.record.peak import peak_for
from scalerepro.telemetry import metrics
from scalerepro.telemetry.nvml_summary import combine_ranks, one_per_card, unavailable_summary
from scalerepro.trainer_flags import TrainConfig
from scalerepro.training import allreduce_timing, buckets, compilation, kernel_profile, probes
from scalerepro.training.distributed import DistContext, all_reduce_max, gather_objects
from scalerepro.training.energy_window import EnergyWindow


@dataclass
class RankMeasurements:
    """What this rank measured of its process's segment of the run: each field as it stands
    where the run stopped (the defaults say "not measured" and why)."""

    timer: metrics.StepTimer  # step times and each step's input wait
    nvml_summary: dict[str, Any]  # the energy window's NVML summary of this rank's GPU
    measured_samples: int = 0
    host_activity: dict[str, Any] | None = None  # the energy window's host load
    # the measured window's peak memory (metrics.peak_memory), taken when it ends; None until then
    window_peak_memory: metrics.PeakMemory | None = None
    # this rank's bytes of parameters, gradients and optimizer state, counted after the optimizer
    # of this process's first step, before the gradients are freed (memory_split)
    state_bytes: dict[str, int] | None = None
    exposed_comm: dict[str, Any] = field(default_factory=lambda: probes.exposed_not_measured("not measured: the run stopped before its end"))
    bucket_profile: dict[str, Any] = field(default_factory=lambda: buckets.not_measured("the run stopped before its end"))
    # why the window's all-reduce waits are not timed (allreduce_timing.install); None where they are
    window_split_reason: str | None = "not timed"
    # how the probes were sized within --probe-budget-s (probes.ProbeSizes.record); None without a budget
    probe_budget: dict[str, Any] | None = None
    # the wall seconds the probes after the window took on this rank (sizing, both probes); None
    # where they did not run (a stopped run). The study budget predicts a later repeat, which runs
    # none (scalerepro.planning.study), as its repeat 1's job less these.
    probes_s: float | None = None
    # a few steps after the probes under torch.profiler (kernel_profile): where a step's device time goes
    step_kernels: dict[str, Any] = field(default_factory=lambda: kernel_profile.not_measured("the run stopped before its end"))
    # how the run compiled: its scope, the first step's wall time, the compile cache (compilation)
    compile_facts: compilation.CompileFacts | None = None

    @classmethod
    def before_training(cls, device: torch.device, nvml_interval_s: float, compile_facts: compilation.CompileFacts | None = None) -> RankMeasurements:
        return cls(metrics.StepTimer(device), unavailable_summary("no measured steps", interval_s=nvml_interval_s), compile_facts=compile_facts)

    def take_window(self, window: EnergyWindow) -> None:
        """The energy window's figures, once it has stopped (none if it never started)."""
        if window.nvml_summary is not None:
            self.nvml_summary, self.host_activity = window.nvml_summary, window.host_activity
            self.window_peak_memory = window.peak_memory


@dataclass(frozen=True)
class ShardedModel:
    """A sharded run's model as this rank holds it (--parallel fsdp, tp, fsdp+tp, pp)."""

    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    module: torch.nn.Module  # local shards, or this rank's pipeline stage
    optimizer: torch.optim.Optimizer
    pipeline: pipeline_parallel.Pipeline | None  # pp only
    global_batch: int


def _peak_memory(measured: RankMeasurements, device: torch.device) -> metrics.PeakMemory:
    """Peak memory of the measured window; of the whole process where no window ended (a run
    that failed before its first measured step)."""
    return measured.window_peak_memory or metrics.peak_memory(device)


def sharding_figures(ctx: DistContext, config: TrainConfig, spec: registry.ModelSpec, sharded: ShardedModel | None) -> dict[str, Any] | None:
    """Under --parallel fsdp, tp, fsdp+tp, pp: the mesh, the bytes of parameters and optimizer
    state each rank holds at the end (local shards, or this rank's stage; gradients are freed
    by then), and the analytic bytes sent per step by collective (formulas in
    scalerepro.parallel); under pp also the schedule and its bubble fraction."""
    if sharded is None:
        return None
    p = config.parallel
    module, device_mesh = sharded.module, sharded.mesh
    held = gather_objects(ctx, parallelize.local_state_bytes(module, sharded.optimizer))
    param_bytes = 2 if config.perf.precision == "bf16" else 4  # MixedPrecisionPolicy param_dtype
    figures: dict[str, Any] = {
        "mesh": {"shape": list(device_mesh.shape), "dims": list(device_mesh.mesh_dim_names or ())},
        "reshard_after_forward": p.reshard_after_forward if p.parallel in ("fsdp", "fsdp+tp") else None,
        "state_bytes_per_rank_max": max(sum(h.values()) for h in held),
        "state_bytes_per_rank_min": min(sum(h.values()) for h in held),
        "comm_bytes_per_step_analytic": None,
        "comm_reason": None,
    }
    if p.parallel == "fsdp":
        figures["comm_bytes_per_step_analytic"] = comm_bytes.fsdp_comm_bytes_per_step(
            module, ctx.world_size, p.reshard_after_forward, param_bytes, 4, config.optim.grad_accum_steps
        )
    elif p.parallel == "pp":
        assert sharded.pipeline is not None  # pp's ShardedModel holds its pipeline
        stage = sharded.pipeline.stage_module
        figures["comm_bytes_per_step_analytic"] = comm_bytes.pipeline_comm_bytes_per_step(
            sharded.global_batch, registry.required(spec.seq_len), stage.hidden_size, stage.vocab_size, ctx.world_size
        )
        # bubble = (p - 1) / (m + p - 1): the idle fraction of GPipe and of 1F1B alike
        figures["pipeline"] = {
            "schedule": p.pp_schedule,
            "stages": ctx.world_size,
            "microbatches": p.microbatches,
        }
        figures["pipeline_bubble_fraction"] = pipeline_parallel.pipeline_bubble_fraction(ctx.world_size, p.microbatches)
    else:  # tp, fsdp+tp: TP's activation collectives over "tp", plus FSDP's over "dp"
        tp_size = device_mesh["tp"].size() if p.parallel == "fsdp+tp" else ctx.world_size
        block_stack = blocks.transformer_blocks(module)
        first_block = next(iter(block_stack.children()))
        norms = [m for m in first_block.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
        final_norm = getattr(module, "final_norm", None) or getattr(module, "norm", None)
        count = lambda modules: sum(q.numel() for m in modules for q in m.parameters())  # noqa: E731
        tensor = comm_bytes.tp_comm_bytes_per_step(
            len(block_stack),
            config.run.per_gpu_batch,
            registry.required(spec.seq_len),
            registry.required(spec.shape.hidden_size),
            tp_size,
            config.optim.grad_accum_steps,
            norm_bytes=4,
            matmul_bytes=param_bytes,
            norm_parameters_per_block=count(norms),
            final_norm_parameters=count([final_norm] if final_norm is not None else []),
        )
        figures["comm_bytes_per_step_analytic"] = {f"tp_{k}": v for k, v in tensor.items()}
        if p.parallel == "fsdp+tp":
            # FSDP over "dp" gathers and reduces each TP rank's shard of every parameter
            data = comm_bytes.fsdp_comm_bytes_per_step(
                module,
                device_mesh["dp"].size(),
                p.reshard_after_forward,
                param_bytes,
                4,
                config.optim.grad_accum_steps,
                numel=tensor_parallel.tp_local_numel,
            )
            figures["comm_bytes_per_step_analytic"].update({f"dp_{k}": v for k, v in data.items()})
    return figures


def memory_split(ctx: DistContext, measured: RankMeasurements, compile_mode: str) -> dict[str, Any]:
    """Every rank's memory by kind: the bytes of parameters, gradients and optimizer state it
    holds (local shards, or its pipeline stage; parallelize.local_state_bytes, counted at its
    first step), and on CUDA its activations:

        activations = peak allocated - (parameters + gradients + optimizer state)

    the state bytes being the same at every step, hence at the peak's. It includes what else
    a step allocates beside activations (FSDP's gathered parameters, communication buffers).
    A collective."""
    device = ctx.device
    peak = _peak_memory(measured, device)["allocated_bytes"]
    state = measured.state_bytes
    graphs = replays_cuda_graphs(device.type, compile_mode)
    activations = peak - sum(state.values()) if peak is not None and state is not None and not graphs else None
    per_rank = gather_objects(ctx, {**(state or {"parameters": None, "gradients": None, "optimizer_state": None}), "activations": activations})
    reason = None
    if device.type != "cuda":
        reason = "not measured on the CPU: only the CUDA caching allocator reports a peak of allocated bytes (RSS counts the whole process)"
    elif graphs:  # scalerepro.common.cuda_graphs
        reason = f"not measured under --compile {compile_mode}: CUDA graph replays allocate from private pools the allocated peak does not count"
    elif state is None:
        reason = "not measured: this process took no step"
    return {"per_rank": per_rank, "activations_reason": reason}


def window_split(ctx: DistContext, measured: RankMeasurements) -> dict[str, Any]:
    """The measured window's steps split into compute, input wait, and the waits at the
    all-reduce, over every rank (scalerepro.training.allreduce_timing). A collective where the
    all-reduce was timed (on every rank alike, or on none)."""
    if measured.window_split_reason is not None:
        return allreduce_timing.not_measured(measured.window_split_reason)
    timer = measured.timer
    per_step: dict[str, Sequence[float | None]] = {"step": timer.durations_s(), "data": timer.data_waits_s(), "allreduce": timer.allreduce_waits_s()}
    mine = {name: [value for value, step in zip(values, timer.steps) if step.measured] for name, values in per_step.items()}
    return allreduce_timing.window_split(gather_objects(ctx, mine), "cuda events" if ctx.device.type == "cuda" else "host")


def results(
    ctx: DistContext,
    config: TrainConfig,
    spec: registry.ModelSpec,
    steps_per_epoch: int,
    history: list[dict[str, Any]],
    measured: RankMeasurements,
    sharded: ShardedModel | None,
) -> Measurements:
    """Every figure of the run, reduced over ranks: a collective where ``ctx`` has a process
    group (all ranks must call it); with ``backend=None`` this rank's figures alone."""
    device = ctx.device
    stats = metrics.window_stats(measured.timer)
    slowest_window = all_reduce_max(
        ctx, torch.tensor([stats.seconds, stats.data_wait_s, stats.warmup_data_wait_s], dtype=torch.float64, device=device)
    ).tolist()
    window_s = slowest_window[0]
    samples = measured.measured_samples
    samples_per_s = metrics.throughput(samples, window_s)
    peak, peak_reason = peak_for(torch.cuda.get_device_name(device) if device.type == "cuda" else None, config.perf.precision, config.run.peak_tflops)
    memory = gather_objects(ctx, _peak_memory(measured, device))
    # each card once: ranks sharing one (--dist-backend gloo, distributed.card_of_rank) sampled the same card
    cards = list(zip(ctx.hostnames if ctx.distributed else ctx.hostnames[:1], gather_objects(ctx, device.index), strict=True))
    nvml = combine_ranks(one_per_card(cards, gather_objects(ctx, measured.nvml_summary)))
    # the devices whose peak the run had: its cards (fewer than its ranks where they share them), or each CPU rank
    devices = len(set(cards)) if device.type == "cuda" else ctx.world_size
    # one entry per node (its first rank's view: every rank of a node sees the same host)
    per_node: dict[str, dict[str, Any]] = {}
    for host, activity in zip(ctx.hostnames if ctx.distributed else ctx.hostnames[:1], gather_objects(ctx, measured.host_activity)):
        if activity is not None:
            per_node.setdefault(host, {"node": host, **activity})
    if device.type == "cpu":
        nvml.update(gpus=0, reason="CPU run: NVML measures NVIDIA GPUs only")
    total_time = sum(stats.epoch_seconds.values())
    return Measurements.model_validate(
        {
            "measured_steps": stats.steps,
            "measured_samples": samples,
            "window_s": window_s,
            # throughput = global samples in the window / window seconds (slowest rank's window)
            "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * spec.tokens_per_sample if samples_per_s and spec.tokens_per_sample else None,
            "step_time_s": {
                "median": stats.step_time_median_s,
                "p10": stats.step_time_p10_s,
                "p90": stats.step_time_p90_s,
                "mean": stats.step_time_mean_s,
            },
            # epoch_time_s = steps per epoch x median step time: the steady-state time of one epoch
            "epoch_time_s": steps_per_epoch * stats.step_time_median_s if stats.step_time_median_s else None,
            "epoch_wall_times_s": [
                {"epoch": epoch, "seconds": seconds, "complete": any(h["epoch"] == epoch and h["complete"] for h in history)}
                for epoch, seconds in sorted(stats.epoch_seconds.items())
            ],
            "train_time_s": total_time,
            # data-loader stall = host seconds the measured steps waited for their batches / window
            # seconds (slowest rank's of each); a warm-up step's wait is outside the window
            "data_stall_fraction": slowest_window[1] / window_s if window_s else None,
            "data_wait_s": slowest_window[1],
            # which clock the waits are read on (metrics.StepTimer): the device's events on CUDA, so that a
            # host running ahead of the GPU and blocking in the fetch is no stall; the host's elsewhere
            "data_wait_clock": "device" if device.type == "cuda" else "host",
            "data_wait_warmup_s": slowest_window[2],  # not in the stall fraction: before the window
            "mfu": metrics.model_flops_utilization(spec.train_flops_per_sample, samples_per_s, peak.flops_per_s if peak is not None else None, devices),
            "peak": peak,
            "peak_reason": peak_reason,
            "achieved_flops": spec.train_flops_per_sample * samples_per_s if samples_per_s else None,
            "memory": {
                # the same device type on every rank: each figure is on all of them, or on none
                "allocated_bytes_max": max_or_none([m["allocated_bytes"] for m in memory]),
                "reserved_bytes_max": max_or_none([m["reserved_bytes"] for m in memory]),
                "rss_bytes_max": max_or_none([m["rss_bytes"] for m in memory]),
            },
            "exposed_communication": measured.exposed_comm,
            "window_split": window_split(ctx, measured),
            "sharding": sharding_figures(ctx, config, spec, sharded),
            "memory_split": memory_split(ctx, measured, config.perf.compile),
            "backward_buckets": measured.bucket_profile,  # see scalerepro.training.buckets
            "probe_budget": measured.probe_budget,
            "probes_s": measured.probes_s,
            "step_kernels": measured.step_kernels,
            "compile": dataclasses.asdict(measured.compile_facts) if measured.compile_facts is not None else None,
            "nvml": nvml,
            "host_activity": {
                "intra_op_threads_per_rank": torch.get_num_threads(),
                # each rank's cores (scalerepro.training.distributed.pin_to_own_cores), in rank order
                "cores_per_rank": gather_objects(ctx, list(ctx.cores)),
                "other_cpu_fraction_max": max((n["other_cpu_fraction"] for n in per_node.values() if n["other_cpu_fraction"] is not None), default=None),
                "nodes": list(per_node.values()),
            },
            # energy per sample = GPU energy over the measured steps (all GPUs; evaluation paused
            # out) / samples measured; net: the same less idle power x active time
            "energy_per_sample_j": nvml["energy_j"] / samples if nvml["energy_j"] is not None and samples else None,
            "energy_per_sample_net_j": nvml["energy_net_j"] / samples if nvml.get("energy_net_j") is not None and samples else None,
        }
    )
