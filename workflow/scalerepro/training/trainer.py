"""The training loop: build everything from a TrainConfig, train for a measured window, report.

Reading order: ``Trainer.__init__`` (model, data, optimizer, DDP, precision, resume), ``fit``
and ``_train`` (the loop), ``_timed_step`` and ``_train_step`` (one optimizer step of
``grad_accum_steps`` micro-batches: the one step function, which the probes after training run
too), ``_log_point``, ``_evaluate``, ``preserved_state``, the probes, ``results``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map

from scalerepro import models
from scalerepro.common.cuda_graphs import CUDA_GRAPH_MODES
from scalerepro.config import ConfigError, TrainConfig
from scalerepro.data import builders, loaders, sources
from scalerepro.parallel import activation_checkpointing, blocks, comm_bytes, mesh, parallelize, pipeline_parallel, tensor_parallel
from scalerepro.schedulers import cores
from scalerepro.telemetry import hardware, hostload, metrics, ranges
from scalerepro.telemetry.nvml import NvmlSampler, combine_ranks, idle_power, nvml_uuid_for_torch_device, unavailable_summary
from scalerepro.training import buckets, checkpoint, distributed, optim
from scalerepro.training.distributed import DistContext, all_reduce_max, all_reduce_sum, barrier, gather_objects
from scalerepro.training.objective import ModelWithLoss, cross_entropy

DEFAULT_STEPS = 100


class NonFiniteLossError(RuntimeError):
    pass


class StopRequest:
    """SIGTERM / SIGUSR1 (Slurm's preemption warning, ``--signal=USR1@...``) set a flag; the loop
    finishes the current step, checkpoints and exits with EXIT_PREEMPTED.

    Installed for the whole life of the process (``scalerepro.training.train.main``): a launcher that
    stops the ranks after a peer failed sends SIGTERM, and a rank that is still writing its
    failure record must not be killed by it half-way."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum: int, frame: object) -> None:
        self.signal_name = signal.Signals(signum).name

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


@dataclass
class Progress:
    """Where the run is; saved in checkpoints."""

    step: int = 0  # optimizer steps completed
    epoch: int = 0
    micro_in_epoch: int = 0  # micro-batches of ``epoch`` already consumed
    epoch_steps: int = 0  # optimizer steps taken in ``epoch``
    epoch_loss_sum: float = 0.0  # sum over ranks and steps of ``epoch``'s step losses (at checkpoints)
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per evaluated epoch


class _RunningLoss:
    """Step losses summed on the device (no host synchronisation inside a step), read only at
    log points and epoch ends; the first step whose loss was not finite."""

    def __init__(self, device: torch.device, epoch_sum_so_far: float):
        self.epoch = torch.zeros((), device=device)
        self.epoch += epoch_sum_so_far
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self.interval = torch.zeros((), device=device)  # since the previous log point
        self.new_interval()

    def new_interval(self) -> None:
        self.interval.zero_()
        self.interval_steps = 0
        self.interval_started = time.perf_counter()  # host clock at the log point

    def add(self, loss: torch.Tensor, step: int) -> None:
        self.interval += loss
        self.epoch += loss
        self.first_bad_step = torch.where((self.first_bad_step < 0) & ~torch.isfinite(loss), step, self.first_bad_step)
        self.interval_steps += 1


class _ProgressBar:
    """tqdm's bar on rank 0 when asked for (``--progress``), else nothing; log lines go through
    ``write`` so that they do not tear the bar."""

    def __init__(self, bar: Any, log: Any):
        self._bar, self._log = bar, log

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def write(self, line: str) -> None:
        (self._bar.write if self._bar is not None else self._log)(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _EnergyWindow:
    """GPU energy (NVML), the host's other CPU load and peak memory over the measured steps:
    started at the first measured step, stopped after the last one (before the end-of-run
    evaluation and the probes) or when training fails; paused around anything inside that is not
    a training step.

    At the start the device is synchronised (the warm-up steps' queued work must not fall inside
    the energy window) and the allocator's peaks are reset, so that the peak memory of the record
    is the measured steps' own: not warm-up autotuning, evaluation, or the probes after training
    (on an H100 the eager bucket probe raised llama_1b's peak from 42.7 to 65.0 GiB)."""

    def __init__(self, sampler: NvmlSampler, host_load: hostload.HostLoad, device: torch.device):
        self.sampler, self.host_load, self.device = sampler, host_load, device
        self.sampling = False
        self.nvml_summary: dict[str, Any] | None = None  # all three set when the window stops
        self.host_activity: dict[str, Any] | None = None
        self.peak_memory: dict[str, int | None] | None = None

    def start(self) -> None:
        if not self.sampling:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            self.sampler.start()
            self.host_load.start()
            self.sampling = True

    def stop(self) -> None:
        if self.sampling:
            self.nvml_summary = self.sampler.stop()
            self.host_activity = self.host_load.stop()
            self.peak_memory = metrics.peak_memory(self.device)
            self.sampling = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.sampler.pause()  # a no-op when it is not sampling
        try:
            yield
        finally:
            self.sampler.resume()


@dataclass
class Outcome:
    status: str  # "ok" | "preempted"
    stop_signal: str | None = None
    checkpoint_path: str | None = None


def _precision_setup(precision: str) -> torch.dtype | None:
    """Set the fp32 arithmetic of the matmul and cuDNN convolution paths (TF32 for tf32, IEEE fp32
    for every other precision); return the autocast dtype (or None).

    fp32 turns TF32 off for convolutions too (cuDNN allows it by default), so fp32 means fp32.
    torch 2.9 and later set this through ``fp32_precision``: the older ``allow_tf32`` switches are
    deprecated there and do not reach the new settings (after ``cudnn.allow_tf32 = False`` the
    convolutions' ``fp32_precision`` still reads "none"), so the new API is used where it exists.
    """
    tf32 = precision == "tf32"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        mode = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:  # torch before 2.9 (an older NGC container)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)


class Trainer:
    _energy: _EnergyWindow | None = None  # the measured window's energy sampling (fit), paused outside training steps
    pipeline: pipeline_parallel.Pipeline | None = None  # --parallel pp: this rank's stage and schedule (_build_pipeline)
    # this rank's bytes of parameters, gradients and optimizer state, counted after the optimizer
    # of this process's first step, before the gradients are freed (_memory_split)
    state_bytes: dict[str, int] | None = None
    # the measured window's peak memory (metrics.peak_memory), taken when it ends; None until then
    window_peak_memory: dict[str, int | None] | None = None

    def __init__(self, config: TrainConfig, ctx: DistContext, stop: StopRequest, log: Any = print):
        if config.data.num_workers is None:  # what the rank's cores leave (scalerepro.schedulers.cores); the record says how many
            workers = cores.loader_workers(len(ctx.cores) or len(os.sched_getaffinity(0)))
            config = dataclasses.replace(config, data=dataclasses.replace(config.data, num_workers=workers))
        self.config, self.ctx, self.stop, self.log = config, ctx, stop, log
        run, perf = config.run, config.perf
        self.device = ctx.device
        torch.manual_seed(run.seed)
        # Until the warm-up steps are done (fit), collectives may wait for a peer that is still
        # compiling or autotuning: they get the long warm-up timeout.
        distributed.set_collective_timeout(ctx, config.parallel.warmup_dist_timeout_s)

        # ---- model and data ------------------------------------------------------------
        self.spec = self._resolve_model()
        # The ranks of one TP group read the same batch: the data is split over data-parallel
        # ranks only (all ranks under ddp and fsdp).
        p = config.parallel
        self.tp_size = mesh.default_tp_size(p.parallel, ctx.world_size, ctx.env.local_world_size, p.tp_size)
        try:
            self.dp_rank, self.dp_size = mesh.data_parallel_coordinates(p.parallel, ctx.rank, ctx.world_size, self.tp_size)
        except mesh.ParallelError as error:
            raise ConfigError(str(error)) from None
        if config.data.eval_samples is None:  # a few batches (scalerepro.data); the record says how many
            eval_samples = builders.default_eval_samples(run.eval_batch_size or run.per_gpu_batch, self.dp_size)
            config = self.config = dataclasses.replace(config, data=dataclasses.replace(config.data, eval_samples=eval_samples))
        self.train_source, self.eval_source = builders.make_sources(config.data, self.spec, run.seed)
        self.global_batch = run.per_gpu_batch * self.dp_size * config.optim.grad_accum_steps
        self.loader = builders.make_train_loader(
            config.data,
            self.train_source,
            run.per_gpu_batch,
            self.dp_size,
            self.dp_rank,
            run.seed,
            self.device,
            self._channels_last,
        )
        self.steps_per_epoch = self.loader.micro_batches_per_epoch // config.optim.grad_accum_steps
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"an epoch of {self.train_source.num_samples} samples over {ctx.world_size} ranks gives no full step of "
                f"{run.per_gpu_batch} x {config.optim.grad_accum_steps}: lower --per-gpu-batch or raise --synthetic-samples"
            )
        self.total_steps = run.epochs * self.steps_per_epoch if run.epochs else (run.steps or DEFAULT_STEPS)
        # the LR schedule's length; total_steps grows past it when --min-window-s asks for more
        self.scheduled_steps = self.total_steps
        if run.warmup_steps >= self.total_steps:
            raise ConfigError(f"--warmup-steps ({run.warmup_steps}) must be smaller than the run's {self.total_steps} steps")

        with torch.device("cpu"):
            module = models.build(self.spec)
        if config.parallel.sync_batchnorm and ctx.distributed:
            module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
        self.module = module.to(self.device, memory_format=torch.channels_last if self._channels_last else torch.preserve_format)
        # ---- a sharded form (--parallel, scalerepro.parallel) replaces the parameters, so it
        # comes before the optimizer is built; DDP (the default) wraps the model below ----------
        self.mesh = self._parallelize(config, ctx)

        # ---- optimizer, schedule, precision ----------------------------------------------
        self.optim_resolved = optim.resolve(config.optim, self.spec.family, self.global_batch)
        self.optimizer = optim.build_optimizer(self.module, config.optim, self.optim_resolved)
        self.scheduler = optim.build_scheduler(self.optimizer, config.optim, self.optim_resolved, self.total_steps)
        self.autocast_dtype = _precision_setup(perf.precision)
        torch.backends.cudnn.benchmark = perf.cudnn_benchmark
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=perf.precision == "fp16")

        # ---- DDP, then compile the wrapped model (Dynamo's DDPOptimizer splits the graph at
        # bucket boundaries so all-reduce still overlaps backward). Both wrap the model with its
        # loss (scalerepro.training.objective), so the loss is compiled with the model ------------------
        self.ddp: DistributedDataParallel | None = None
        model: torch.nn.Module = ModelWithLoss(self.module, config.optim.label_smoothing)
        if ctx.distributed and self.mesh is None:
            p = config.parallel
            self.ddp = DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=p.bucket_cap_mb,
                gradient_as_bucket_view=p.gradient_as_bucket_view,
                static_graph=p.static_graph,
            )
            model = self.ddp
        # model(inputs, targets) -> mean loss. eager_model is the same without compilation: the
        # bucket probe times it (a compiled backward fires every gradient hook at its end).
        self.eager_model = model
        self.model = torch.compile(model, mode=perf.compile) if perf.compile != "none" else model

        # ---- profiling (--profile-mode): ranges, the all-reduce hook and the window; with the
        # default "none" none of it is installed --------------------------------------------------
        prof = config.profile
        if prof.profile_mode == "cuda_api" and self.device.type != "cuda":
            raise ConfigError(
                f"--profile-mode cuda_api drives the CUDA profiler API for Nsight, and this run is on the {self.device.type}: "
                "use --profile-mode torch (the torch.profiler fallback) there"
            )
        ranges.enable_ranges(prof.profile_mode, self.device)
        if self.ddp is not None and prof.profile_mode != "none":
            self.ddp.register_comm_hook(None, ranges.nvtx_allreduce_hook)
        self.profile_window = ranges.ProfileWindow(
            prof.profile_mode, prof.profile_window_start, prof.profile_window_steps,
            Path(prof.profile_dir) if prof.profile_dir else None, self.device, ctx.is_main,
        )  # fmt: skip
        if prof.profile_mode != "none" and self.profile_window.end > self.total_steps:
            raise ConfigError(
                f"the profiling window (steps {prof.profile_window_start}..{self.profile_window.end - 1}) ends after the "
                f"run's {self.total_steps} steps: raise --steps or lower --profile-window-start/--profile-window-steps"
            )

        # ---- resume ----------------------------------------------------------------------
        self.progress = Progress()
        self.resumed_from: str | None = None
        # Sharded state (FSDP) is checkpointed by every rank with DCP (scalerepro.training.sharded_checkpoint).
        if self.mesh is None:
            store = checkpoint.CheckpointStore
        else:  # imported here: DCP pulls in torch.distributed.tensor, 0.6 s of every rank's start-up a DDP run never uses
            from scalerepro.training import sharded_checkpoint

            store = sharded_checkpoint.ShardedCheckpointStore
        self.checkpoints = store(Path(run.checkpoint_dir), self._fingerprint(), run.keep_checkpoints) if run.checkpoint_dir else None
        if run.resume and self.checkpoints is not None:
            self._resume()
        self.start_step = self.progress.step  # this process's first step (warm-up counts from here)

        # Measurements of this process's segment of the run.
        self.timer = metrics.StepTimer(self.device)  # step times and each step's input wait
        self.measured_samples = 0
        self.loss_log: list[dict[str, float]] = []
        self.exposed_comm: dict[str, Any] = {
            "fraction": None, "sync_step_s": None, "nosync_step_s": None, "steps": 0,
            "reason": "not measured: the run stopped before its end",
        }  # fmt: skip
        self.bucket_profile: dict[str, Any] = buckets.not_measured("the run stopped before its end")
        self.nvml_summary: dict[str, Any] = unavailable_summary("no measured steps", interval_s=run.nvml_interval_s)
        self.host_load = hostload.HostLoad()  # what else used this node's CPUs during the window
        self.host_activity: dict[str, Any] | None = None
        self._checkpoint_path: str | None = None

    # ---- construction helpers -------------------------------------------------------------

    @property
    def _channels_last(self) -> bool:
        return self.config.perf.channels_last and self.spec.task == "image_classification"

    def _parallelize(self, config: TrainConfig, ctx: DistContext) -> Any:
        """The device mesh of --parallel fsdp, tp, fsdp+tp or pp (None under ddp), with the model
        sharded on it (pp: cut into stages); activation checkpointing under any strategy."""
        p = config.parallel
        try:
            if p.parallel == "ddp":
                if p.activation_checkpointing != "none":
                    activation_checkpointing.apply_activation_checkpointing(self.module, p.activation_checkpointing)
                return None
            if p.parallel == "pp":
                return self._build_pipeline(config, ctx)
            if p.parallel == "tp" and config.optim.optimizer_impl != "for-loop":
                # Under TP alone the replicated embeddings and head stay plain tensors beside the
                # blocks' DTensors, and a foreach or fused kernel cannot take both in one list
                # (fsdp+tp makes every parameter a DTensor).
                raise ConfigError(
                    f"--parallel tp needs --optimizer-impl for-loop (the {config.optim.optimizer_impl} kernels cannot mix the "
                    "replicated plain-tensor embeddings with the sharded DTensor blocks): add --optimizer-impl for-loop, or use fsdp+tp"
                )
            if not ctx.distributed:
                raise ConfigError(f"--parallel {p.parallel} needs at least 2 ranks (launch with scalerepro.launching.launch or torchrun)")
            device_mesh = parallelize.build_mesh(p.parallel, ctx.world_size, self.device.type, self.tp_size)
            parallelize.parallelize(
                self.module, p.parallel, device_mesh,
                reshard_after_forward=p.reshard_after_forward,
                param_dtype=torch.bfloat16 if config.perf.precision == "bf16" else None,
                activation_checkpointing=p.activation_checkpointing,
            )  # fmt: skip
            return device_mesh
        except mesh.ParallelError as error:
            raise ConfigError(str(error)) from None

    def _build_pipeline(self, config: TrainConfig, ctx: DistContext) -> Any:
        """--parallel pp: this rank's stage of GPT (``self.module`` becomes the stage, so the
        optimizer, checkpoints and byte counts see this stage's parameters only) and its schedule
        (``self.pipeline``). What the pipeline step does not do is refused here, one line each."""
        p, run = config.parallel, config.run
        refusals = {
            "--grad-accum-steps": (config.optim.grad_accum_steps != 1, "the pipeline's --microbatches are its gradient accumulation: use --microbatches instead"),
            "--clip-grad-norm": (config.optim.clip_grad_norm > 0, "the global norm would need the stages' norms combined, which is not done: leave it 0"),
            "--precision fp16": (config.perf.precision == "fp16", "the schedule's backward does not take GradScaler's scaled loss: use --precision bf16"),
            "--compile": (config.perf.compile != "none", "the stages are run eagerly by the schedule: leave --compile off"),
        }
        for flag, (refused, fix) in refusals.items():
            if refused:
                raise ConfigError(f"--parallel pp does not support {flag}: {fix}")
        if run.per_gpu_batch % p.microbatches:
            raise ConfigError(f"--per-gpu-batch {run.per_gpu_batch} does not split into --microbatches {p.microbatches}: make it a multiple")
        if not ctx.distributed:
            raise ConfigError("--parallel pp needs at least 2 ranks (launch with scalerepro.launching.launch or torchrun)")
        activation_checkpointing.apply_activation_checkpointing(self.module, p.activation_checkpointing)
        device_mesh = parallelize.build_mesh("pp", ctx.world_size, self.device.type)
        label_smoothing = config.optim.label_smoothing
        self.pipeline = pipeline_parallel.build_pipeline(
            self.module, device_mesh, p.pp_schedule, p.microbatches,
            lambda logits, targets: cross_entropy(logits, targets, label_smoothing), self.device,
        )  # fmt: skip
        self.module = self.pipeline.stage_module
        return device_mesh

    def _resolve_model(self) -> models.ModelSpec:
        """The model spec from the flags; CIFAR-10 data fixes 32x32 images and 10 classes."""
        m = self.config.model
        shape = models.ModelShape(**{k: v for k, v in dataclasses.asdict(m).items() if k != "model"})
        try:
            if not builders.is_synthetic(self.config.data):
                if models.resolve(m.model).task != "image_classification":
                    raise ConfigError(f"--data {self.config.data} is CIFAR-10 and needs an image model, not {m.model}")
                for flag, given, needed in (("--image-size", m.image_size, 32), ("--num-classes", m.num_classes, 10)):
                    if given not in (None, needed):
                        raise ConfigError(f"{flag} {given} does not fit CIFAR-10 ({needed})")
                shape = dataclasses.replace(shape, image_size=32, num_classes=10)
            return models.resolve(m.model, shape)
        except ConfigError:
            raise
        except ValueError as error:  # the model zoo's one-line messages name the flag
            raise ConfigError(str(error)) from None

    def _fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must share with this run to continue it exactly.

        A DTensor-sharded checkpoint (fsdp, tp, fsdp+tp: DCP stores global shapes and reshards on
        load) continues on another world size: there the global batch must match, not the world
        size and the per-rank batch. A single-file (ddp) checkpoint and a pipeline's (one
        stage's blocks per rank: the cut depends on the world size) keep both."""
        c = self.config
        fingerprint = {
            "model": dataclasses.asdict(c.model),
            "data": c.data.data,
            "synthetic_samples": c.data.synthetic_samples,
            "per_gpu_batch": c.run.per_gpu_batch,
            "world_size": self.ctx.world_size,
            "grad_accum_steps": c.optim.grad_accum_steps,
            "seed": c.run.seed,
            "total_steps": self.total_steps,
            "optim": dataclasses.asdict(c.optim),
            "precision": c.perf.precision,
            "code": checkpoint.code_hash(),
        }
        if self.mesh is not None and self.pipeline is None:
            del fingerprint["per_gpu_batch"], fingerprint["world_size"]
            fingerprint["global_batch"] = self.global_batch
        return fingerprint

    def _resume(self) -> None:
        """Continue from the newest usable checkpoint; name every newer one passed over, so the
        log and the record say why a run started fresh or went back (checkpoint.unusable_reason)."""
        last_resumable = self.total_steps - self.config.run.warmup_steps - 1
        state = self.checkpoints.load_newest(last_resumable)
        for skipped in self.checkpoints.skipped:
            self.log(f"passing over checkpoint {skipped['path']}: {skipped['reason']}")
        if state is None:
            self.log(f"no usable checkpoint in {self.checkpoints.directory}: starting from step 0")
            return
        if self.mesh is not None:  # this rank's shards of the model and optimizer
            from scalerepro.training import sharded_checkpoint  # (see the store above)

            sharded_checkpoint.load(state["path"], self.module, self.optimizer)
        else:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        saved_rng = state["rng"]  # one per rank that wrote the checkpoint
        if len(saved_rng) != self.ctx.world_size:  # a sharded checkpoint resumed on another world size
            self.log(f"the checkpoint was written by {len(saved_rng)} ranks, this run has {self.ctx.world_size}: rank r takes rank r mod {len(saved_rng)}'s RNG state")
        checkpoint.set_rng_state(saved_rng[self.ctx.rank % len(saved_rng)])
        self.resumed_from = state["path"]
        self.log(f"resumed from {state['path']} at step {self.progress.step}")

    # ---- the loop ----------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _train_step(
        self,
        micro_batches: Iterator[sources.Batch],
        *,
        sync_gradients: bool = True,
        eager: bool = False,
        step_scheduler: bool = True,
        marks: buckets.PhaseRecorder | None = None,
    ) -> torch.Tensor:
        """One optimizer step over grad_accum_steps micro-batches; returns the mean loss (on device).

        DDP all-reduces gradients during the backward of the last micro-batch only: the others
        run under ``no_sync`` and accumulate locally. The probes after training run this same
        step with: ``sync_gradients=False`` (no all-reduce on any micro-batch), ``eager`` (the
        uncompiled model: see scalerepro.training.buckets), ``step_scheduler=False`` (OneCycleLR refuses
        steps past the run's end) and ``marks``, told when each phase is done (device-clock
        marks: no host synchronisation in the step).
        """
        accum = self.config.optim.grad_accum_steps
        model = self.eager_model if eager else self.model
        total = torch.zeros((), device=self.device)
        for micro in range(accum):
            waited = time.perf_counter()
            with ranges.annotate("data"):
                inputs, targets = next(micro_batches)
            self.timer.add_data_wait(time.perf_counter() - waited)  # the step's own: window_stats sums the measured ones
            if self.pipeline is not None:  # --parallel pp: the schedule runs forward and backward of all
                # --microbatches (accumulation is refused under pp: one loader batch per step)
                with self._autocast(), ranges.annotate("pipeline"):
                    total += self.pipeline.step(*inputs, targets)  # the loss, broadcast from the last stage
                continue
            if marks is not None:
                marks.micro_batch_started()
            skip_sync = self.ddp is not None and (not sync_gradients or micro < accum - 1)
            with self.ddp.no_sync() if skip_sync else contextlib.nullcontext():
                with self._autocast(), ranges.annotate("forward"):
                    loss = model(inputs, targets) / accum
                total += loss.detach()
                if marks is not None:
                    marks.forward_done()
                with ranges.annotate("backward"):
                    self.scaler.scale(loss).backward()
                if marks is not None:
                    marks.backward_done()
        with ranges.annotate("optimizer"):
            if self.config.optim.clip_grad_norm > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.config.optim.clip_grad_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.state_bytes is None:  # once: the sizes are the same every step (host-only arithmetic, no sync)
                self.state_bytes = parallelize.local_state_bytes(self.module, self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            if marks is not None:
                marks.optimizer_done()
            if step_scheduler:
                self.scheduler.step()
        return total

    @contextlib.contextmanager
    def preserved_state(self) -> Iterator[None]:
        """Everything a step changes (model, optimizer, LR scheduler, loss scaler, this rank's
        RNG states) as it was on entry, restored on exit: the probes after training take real
        steps and must leave the run's final state as training left it."""
        # the model's and the optimizer's copies go to host memory: on the GPU a second model and
        # a second AdamW state (8 bytes a parameter: 10 GB for llama_1b) may not fit beside the
        # run's own; load_state_dict moves the optimizer's back to each parameter's device
        to_host = lambda value: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else copy.deepcopy(value)  # noqa: E731
        saved = {
            "model": {k: to_host(v) for k, v in self.module.state_dict().items()},
            "optimizer": tree_map(to_host, self.optimizer.state_dict()),
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "scaler": copy.deepcopy(self.scaler.state_dict()),
            "rng": checkpoint.rng_state(),
        }
        try:
            yield
        finally:
            self.module.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
            self.scaler.load_state_dict(saved["scaler"])
            checkpoint.set_rng_state(saved["rng"])

    def fit(self) -> Outcome:
        """Train from ``self.progress`` to the run's last step or a stop signal. A finished run
        then probes what the scaling analysis needs (exposed communication, backward buckets):
        after the measured window, so no timed step carries a probe's hooks."""
        try:
            with self._energy_window() as energy, self._progress_bar() as bar:
                outcome = self._train(energy, bar)
            if outcome.status == "ok":
                self._probe_exposed_communication()
                self.bucket_profile = self._probe_backward_buckets(self.config.run.bucket_probe_steps)
            return outcome
        finally:
            self.loader.close()

    def _train(self, energy: _EnergyWindow, bar: _ProgressBar) -> Outcome:
        """The training loop: epochs of steps, a log point every ``--log-interval`` steps, a
        checkpoint every ``--checkpoint-interval`` steps or on a stop signal."""
        run, p = self.config.run, self.progress
        micro_per_epoch = self.steps_per_epoch * self.config.optim.grad_accum_steps
        # a resumed epoch continues its global loss sum (held by rank 0 alone: summed over ranks)
        losses = _RunningLoss(self.device, p.epoch_loss_sum if self.ctx.is_main else 0.0)
        while p.step < self.total_steps:
            batches = self.loader.epoch(p.epoch, start=p.micro_in_epoch)
            while p.micro_in_epoch < micro_per_epoch and p.step < self.total_steps:
                # Each process warms up anew, a resumed one too: compilation happens per process.
                measured = p.step - self.start_step >= run.warmup_steps
                if measured:
                    energy.start()  # at the first measured step; a no-op after
                self._timed_step(batches, measured, losses)
                if p.step % run.log_interval == 0 or p.step == self.total_steps:
                    stop_signal = self._log_point(p, losses, bar)
                    if p.step == self.total_steps and stop_signal is None:
                        self._extend_to_min_window()
                else:
                    stop_signal = self._stop_signal_between_log_points()
                self.profile_window.after_step(p.step - 1)  # the step just taken
                if measured:
                    self.measured_samples += self.global_batch
                bar.update()
                if stop_signal is not None:
                    self._checkpoint_mid_run(losses)
                    return Outcome("preempted", stop_signal, self._checkpoint_path)
                if self.checkpoints is not None and run.checkpoint_interval and p.step % run.checkpoint_interval == 0:
                    self._checkpoint_mid_run(losses)
            if p.micro_in_epoch >= micro_per_epoch:
                self._finish_epoch(p, self._global_sum(losses.epoch), complete=True)
                losses.epoch.zero_()
        energy.stop()  # the energy window ends with the last step, before evaluation
        if run.eval and (not p.history or p.history[-1]["step"] != p.step):
            # A run counted in steps usually ends inside an epoch: evaluate there too.
            self._finish_epoch(p, self._global_sum(losses.epoch), complete=False)
        # A finished run needs no checkpoint to continue: the final one is written only on
        # request, marked final so that no rerun resumes from it (checkpoint.unusable_reason).
        p.epoch_loss_sum = self._global_sum(losses.epoch)
        self._checkpoint_path = None
        if run.keep_final_checkpoint:
            self._save_checkpoint(final=True)
        return Outcome("ok", None, self._checkpoint_path)

    def _timed_step(self, batches: Iterator[sources.Batch], measured: bool, losses: _RunningLoss) -> None:
        """One training step between the step timer's marks, and the progress it makes. The
        step's bookkeeping stays on the device (no host synchronisation inside a step)."""
        p = self.progress
        self.profile_window.before_step(p.step)
        self.timer.start()
        with ranges.annotate("step"):
            # past the schedule's end (--min-window-s) the LR stays at its last value: a cosine
            # scheduler stepped past T_max climbs again, OneCycleLR refuses
            loss = self._train_step(batches, step_scheduler=p.step < self.scheduled_steps)
        losses.add(loss, p.step)
        p.step += 1
        if p.step == self.start_step + max(self.config.run.warmup_steps, 1):
            # Warmed up (the first step a process runs compiles, a resumed one's too): collectives
            # get the steady-state timeout.
            distributed.set_collective_timeout(self.ctx, self.config.parallel.dist_timeout_s)
        p.micro_in_epoch += self.config.optim.grad_accum_steps
        p.epoch_steps += 1
        # The step ends here: the log point's host syncs, all-reduces and print are not part of
        # any step's time.
        self.timer.stop(p.epoch, measured)

    def _extend_to_min_window(self) -> None:
        """At the last step: if the measured steps add up to less than --min-window-s, add the
        steps that the median step time says are missing (at least one; the new last step is
        checked again). A collective: every rank takes the slowest rank's window and median, so
        all agree."""
        wanted = self.config.run.min_window_s
        if wanted <= 0:
            return
        stats = metrics.window_stats(self.timer)  # synchronises the device once
        window_s, median_s = all_reduce_max(self.ctx, torch.tensor([stats.seconds, stats.step_time_median_s or 0.0], dtype=torch.float64, device=self.device)).tolist()
        if window_s >= wanted or median_s <= 0:
            return
        added = max(1, math.ceil((wanted - window_s) / median_s))
        self.total_steps += added
        self.log(f"measured {window_s:.2f} s of --min-window-s {wanted:g}: {added} more steps (to {self.total_steps}) at the schedule's last learning rate")

    def _stop_signal_between_log_points(self) -> str | None:
        """Ranks must agree on the step they stop after, so several ranks decide only at log
        points (``_log_point``); a single rank can stop after any step."""
        return None if self.ctx.distributed else self.stop.signal_name

    def _log_point(self, p: Progress, losses: _RunningLoss, bar: _ProgressBar) -> str | None:
        """Read the interval's loss (the one host sync of the interval), check it is finite, log a
        line, start the next interval, and agree across ranks whether to stop now: any rank
        signalled, all stop. Returns the name of the signal that stops the run (the
        highest-numbered one any rank received, so every rank, rank 0 among them, records it
        even when it reached another rank only)."""
        received = signal.Signals[self.stop.signal_name].value if self.stop.signal_name else 0
        flags = torch.tensor([float(losses.first_bad_step.item()), float(received)], device=self.device)
        all_reduce_max(self.ctx, flags)
        bad_step, agreed = int(flags[0].item()), int(flags[1].item())
        if bad_step >= 0:
            raise NonFiniteLossError(
                f"the loss became non-finite at step {bad_step}: lower --lr, add --clip-grad-norm, or use --precision bf16"
            )
        # Interval loss = sum over ranks and steps of the step loss / (ranks x steps).
        mean_loss = self._global_sum(losses.interval) / (losses.interval_steps * self.ctx.world_size)
        elapsed = time.perf_counter() - losses.interval_started
        # Logged rate (host clock between log points, both synchronised): samples / seconds.
        rate = losses.interval_steps * self.global_batch / elapsed
        self.loss_log.append({"step": p.step, "loss": mean_loss, "samples_per_s": rate})
        if self.ctx.is_main:
            memory = metrics.peak_memory(self.device)
            peak = memory["allocated_bytes"] if memory["allocated_bytes"] is not None else memory["rss_bytes"]
            bar.write(
                f"step {p.step}/{self.total_steps} | epoch {p.epoch} | loss {mean_loss:.4f} | "
                f"{rate:,.1f} samples/s | lr {self.scheduler.get_last_lr()[0]:.3g} | peak mem {peak / 2**30:.2f} GiB"
            )
        losses.new_interval()
        return signal.Signals(agreed).name if agreed else None

    def _global_sum(self, value: torch.Tensor) -> float:
        return all_reduce_sum(self.ctx, value.detach().clone()).item()

    def _finish_epoch(self, p: Progress, epoch_loss_sum: float, complete: bool) -> None:
        """Close the epoch's history entry: mean training loss and, if enabled, evaluation."""
        entry: dict[str, Any] = {
            "epoch": p.epoch,
            "step": p.step,
            "complete": complete,
            # mean train loss = sum over ranks and steps of step losses / (ranks x steps)
            "train_loss": epoch_loss_sum / (p.epoch_steps * self.ctx.world_size) if p.epoch_steps else None,
        }
        if self.config.run.eval:
            batch_size = self.config.run.eval_batch_size or self.config.run.per_gpu_batch
            self.log(f"evaluating {self.eval_source.num_samples} held-out samples at batch {batch_size} per rank (not timed)")
            with self._outside_energy_window():
                entry.update(self._evaluate())
        p.history.append(entry)
        summary = ", ".join(f"{k} {v:.4f}" for k, v in entry.items() if isinstance(v, float))
        self.log(f"epoch {p.epoch} {'done' if complete else 'so far'} at step {p.step}: {summary}")
        if complete:
            p.epoch += 1
            p.micro_in_epoch = 0
            p.epoch_steps = 0
            p.epoch_loss_sum = 0.0

    @torch.no_grad()
    def _evaluate(self) -> dict[str, float]:
        """Loss and top-1 accuracy over the held-out samples (--eval-samples), summed over ranks.

        Runs the plain module (not the DDP or compiled wrapper): evaluation is not measured, and
        this avoids recompiling for eval mode.
        """
        self.module.eval()
        # loss sum, correct, count; summed over all ranks, the ranks of a TP group adding the same
        # figures each: every total is tp x the data-parallel one, and the ratios are unchanged
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        batch_size = self.config.run.eval_batch_size or self.config.run.per_gpu_batch
        for inputs, targets in loaders.eval_batches(self.eval_source.to(self.device), batch_size, self.dp_size, self.dp_rank, self.device, self._channels_last):
            with self._autocast():
                # --parallel pp: the logits exist on the last stage, whose figures alone are counted
                logits = self.module(*inputs) if self.pipeline is None else self.pipeline.forward_only(*inputs)
            if logits is None:
                continue
            logits, targets = logits.flatten(0, -2).float(), targets.flatten()
            totals[0] += F.cross_entropy(logits, targets, reduction="sum")
            totals[1] += (logits.argmax(dim=-1) == targets).sum()
            totals[2] += targets.numel()
        all_reduce_sum(self.ctx, totals)
        self.module.train()
        loss_sum, correct, count = totals.tolist()
        # eval_loss = sum of per-target losses / targets; eval_accuracy = correct / targets
        return {"eval_loss": loss_sum / count, "eval_accuracy": correct / count}

    # ---- checkpoints ---------------------------------------------------------------------------

    def _checkpoint_mid_run(self, losses: _RunningLoss) -> None:
        """A checkpoint inside the run also carries the epoch's loss sum so far, over all ranks
        (a collective: every rank calls this at the same step). Writing it is not training: the
        energy window pauses around it."""
        with self._outside_energy_window():
            self.progress.epoch_loss_sum = self._global_sum(losses.epoch)
            self._save_checkpoint()

    def _save_checkpoint(self, final: bool = False) -> None:
        if self.checkpoints is None:
            return
        rng = gather_objects(self.ctx, checkpoint.rng_state())  # every rank's, in rank order
        if self.mesh is not None:  # every rank writes its shards (a collective)
            state = {
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "progress": dataclasses.asdict(self.progress),
                "rng": rng,
                "fingerprint": self._fingerprint(),
            }
            path = self.checkpoints.save(self.progress.step, self.module, self.optimizer, state, final=final)
            self._checkpoint_path = str(path)
            return
        if self.ctx.is_main:
            state = {
                "model": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "progress": dataclasses.asdict(self.progress),
                "rng": rng,
                "fingerprint": self._fingerprint(),
            }
            self._checkpoint_path = str(self.checkpoints.save(self.progress.step, state, final=final))
        barrier(self.ctx)

    def discard_checkpoints(self) -> None:
        """After the ``ok`` record is written: remove the run's checkpoints (but a final one kept
        on request). Rank 0 alone; the others hold no files."""
        if self.checkpoints is not None and self.ctx.is_main:
            kept = Path(self._checkpoint_path) if self._checkpoint_path else None
            for path in self.checkpoints.discard(keep=kept):
                self.log(f"removed checkpoint {path}: the run is finished and recorded")

    # ---- measurements ---------------------------------------------------------------------------

    def _idle_power(self, gpu_uuid: str | None) -> dict[str, Any]:
        """This rank's GPU's idle power (scalerepro.telemetry.nvml.idle_power), read before the first step
        with nothing queued on the GPU; the energy figures are reported net of it too."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return idle_power(gpu_uuid, self.config.run.nvml_idle_s, self.config.run.nvml_interval_s)

    @contextlib.contextmanager
    def _energy_window(self) -> Iterator[_EnergyWindow]:
        """The energy window of ``fit``: this rank's GPU's idle power is read first; the window's
        summaries become the run's on exit, also when training fails (the failure record has
        them)."""
        gpu_uuid = nvml_uuid_for_torch_device(self.device.index) if self.device.type == "cuda" else None
        sampler = NvmlSampler(gpu_uuid, self.config.run.nvml_interval_s, self._idle_power(gpu_uuid))
        window = self._energy = _EnergyWindow(sampler, self.host_load, self.device)
        try:
            yield window
        finally:
            window.stop()
            if window.nvml_summary is not None:
                self.nvml_summary, self.host_activity = window.nvml_summary, window.host_activity
                self.window_peak_memory = window.peak_memory

    def _outside_energy_window(self) -> contextlib.AbstractContextManager:
        """What runs inside is not a training step: the energy sampler pauses (a no-op when it is
        not sampling), so energy per sample covers the measured steps only."""
        return self._energy.paused() if self._energy is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _progress_bar(self) -> Iterator[_ProgressBar]:
        mode = self.config.run.progress
        bar = None
        if self.ctx.is_main and (mode == "on" or (mode == "auto" and sys.stderr.isatty())):
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps, initial=self.progress.step, unit="step", dynamic_ncols=True)
        progress_bar = _ProgressBar(bar, self.log)
        try:
            yield progress_bar
        finally:
            progress_bar.close()

    def _cached_step_batches(self, steps: int) -> list[list[sources.Batch]]:
        """The micro-batches of up to ``steps`` steps from the start of the current epoch, held
        in memory: a probe reuses them, so the loader is out of its timings."""
        micro = self.config.optim.grad_accum_steps
        batch_iter = self.loader.epoch(self.progress.epoch)
        return [[next(batch_iter) for _ in range(micro)] for _ in range(min(steps, self.steps_per_epoch))]

    def _probe_exposed_communication(self) -> None:
        """Exposed communication: the same steps timed with and without the gradient all-reduce.

            exposed_fraction = (t_sync - t_nosync) / t_sync

        with t the median step time over ``comm_probe_steps`` steps on identical, pre-built
        batches (so the loader is out of the picture), the two kinds of step interleaved, the
        slowest rank's median taken for each. The steps leave the LR scheduler alone (OneCycleLR
        refuses steps past the run's end); the run's state is restored afterwards.
        """
        steps = self.config.run.comm_probe_steps
        if self.mesh is not None:  # the probe switches DDP's all-reduce off; FSDP has no such switch
            self.exposed_comm = {"fraction": None, "sync_step_s": None, "nosync_step_s": None, "steps": 0,
                                 "reason": f"not measured under --parallel {self.config.parallel.parallel}: the probe times DDP with and without no_sync"}
            return
        if self.ddp is None or steps == 0:
            reason = "single process: no gradient communication" if self.ddp is None else "--comm-probe-steps 0"
            self.exposed_comm = {"fraction": 0.0 if self.ddp is None else None, "sync_step_s": None, "nosync_step_s": None, "steps": 0, "reason": reason}
            return
        timers = {True: metrics.StepTimer(self.device), False: metrics.StepTimer(self.device)}
        with self.preserved_state():
            groups = self._cached_step_batches(steps)  # inside: reading them may draw random numbers
            # Interleaved, sync then no-sync on the same batch: a burst of load from elsewhere on
            # the host or GPU falls on both modes alike, not on one mode's block of steps. The
            # first pair is a warm-up.
            for repeat in range(steps + 1):
                for sync, timer in timers.items():
                    timer.start()
                    self._train_step(iter(groups[repeat % len(groups)]), sync_gradients=sync, step_scheduler=False)
                    timer.stop(0, measured=repeat > 0)
            medians = [metrics.window_stats(timers[sync]).step_time_median_s for sync in (True, False)]
            slowest = all_reduce_max(self.ctx, torch.tensor(medians, dtype=torch.float64, device=self.device)).tolist()
        t_sync, t_nosync = slowest
        self.exposed_comm = {
            "fraction": max(t_sync - t_nosync, 0.0) / t_sync,
            "sync_step_s": t_sync,
            "nosync_step_s": t_nosync,
            "steps": steps,
            "reason": None,
        }

    def _sharding_figures(self, ctx: DistContext) -> dict[str, Any] | None:
        """Under --parallel fsdp, tp, fsdp+tp, pp: the mesh, the bytes of parameters and optimizer
        state each rank holds at the end (local shards, or this rank's stage; gradients are freed
        by then), and the analytic bytes sent per step by collective (formulas in
        scalerepro.parallel); under pp also the schedule and its bubble fraction."""
        if self.mesh is None:
            return None
        p = self.config.parallel
        held = gather_objects(ctx, parallelize.local_state_bytes(self.module, self.optimizer))
        param_bytes = 2 if self.config.perf.precision == "bf16" else 4  # MixedPrecisionPolicy param_dtype
        figures: dict[str, Any] = {
            "strategy": p.parallel,
            "mesh": {"shape": list(self.mesh.shape), "dims": list(self.mesh.mesh_dim_names or ())},
            "reshard_after_forward": p.reshard_after_forward if p.parallel in ("fsdp", "fsdp+tp") else None,
            "state_bytes_per_rank_max": max(sum(h.values()) for h in held),
            "state_bytes_per_rank_min": min(sum(h.values()) for h in held),
            "comm_bytes_per_step_analytic": None,
            "comm_reason": None,
        }
        if p.parallel == "fsdp":
            figures["comm_bytes_per_step_analytic"] = comm_bytes.fsdp_comm_bytes_per_step(
                self.module, ctx.world_size, p.reshard_after_forward, param_bytes, 4, self.config.optim.grad_accum_steps
            )
        elif p.parallel == "pp":
            stage = self.pipeline.stage_module
            figures["comm_bytes_per_step_analytic"] = comm_bytes.pipeline_comm_bytes_per_step(
                self.global_batch, self.spec.seq_len, stage.hidden_size, stage.vocab_size, ctx.world_size
            )
            # bubble = (p - 1) / (m + p - 1): the idle fraction of GPipe and of 1F1B alike
            figures["pipeline"] = {
                "schedule": p.pp_schedule,
                "stages": ctx.world_size,
                "microbatches": p.microbatches,
            }
            figures["pipeline_bubble_fraction"] = pipeline_parallel.pipeline_bubble_fraction(ctx.world_size, p.microbatches)
        else:  # tp, fsdp+tp: TP's activation collectives over "tp", plus FSDP's over "dp"
            tp_size = self.mesh["tp"].size() if p.parallel == "fsdp+tp" else ctx.world_size
            block_stack = blocks.transformer_blocks(self.module)
            first_block = next(iter(block_stack.children()))
            norms = [m for m in first_block.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
            final_norm = getattr(self.module, "final_norm", None) or getattr(self.module, "norm", None)
            count = lambda modules: sum(q.numel() for m in modules for q in m.parameters())  # noqa: E731
            tensor = comm_bytes.tp_comm_bytes_per_step(
                len(block_stack), self.config.run.per_gpu_batch, self.spec.seq_len, self.spec.shape.hidden_size, tp_size,
                self.config.optim.grad_accum_steps, norm_bytes=4, matmul_bytes=param_bytes,
                norm_parameters_per_block=count(norms), final_norm_parameters=count([final_norm] if final_norm is not None else []),
            )  # fmt: skip
            figures["comm_bytes_per_step_analytic"] = {f"tp_{k}": v for k, v in tensor.items()}
            if p.parallel == "fsdp+tp":
                # FSDP over "dp" gathers and reduces each TP rank's shard of every parameter
                data = comm_bytes.fsdp_comm_bytes_per_step(
                    self.module, self.mesh["dp"].size(), p.reshard_after_forward, param_bytes, 4,
                    self.config.optim.grad_accum_steps, numel=tensor_parallel.tp_local_numel,
                )  # fmt: skip
                figures["comm_bytes_per_step_analytic"].update({f"dp_{k}": v for k, v in data.items()})
        return figures

    def _peak_memory(self) -> dict[str, int | None]:
        """Peak memory of the measured window; of the whole process where no window ended (a run
        that failed before its first measured step)."""
        return self.window_peak_memory or metrics.peak_memory(self.device)

    def _memory_split(self, ctx: DistContext) -> dict[str, Any]:
        """Every rank's memory by kind: the bytes of parameters, gradients and optimizer state it
        holds (local shards, or its pipeline stage; parallelize.local_state_bytes, counted at its
        first step), and on CUDA its activations:

            activations = peak allocated - (parameters + gradients + optimizer state)

        the state bytes being the same at every step, hence at the peak's. It includes what else
        a step allocates beside activations (FSDP's gathered parameters, communication buffers).
        A collective."""
        peak = self._peak_memory()["allocated_bytes"]
        state = self.state_bytes
        graphs = self.device.type == "cuda" and self.config.perf.compile in CUDA_GRAPH_MODES
        activations = peak - sum(state.values()) if peak is not None and state is not None and not graphs else None
        per_rank = gather_objects(ctx, {**(state or {"parameters": None, "gradients": None, "optimizer_state": None}), "activations": activations})
        reason = None
        if self.device.type != "cuda":
            reason = "not measured on the CPU: only the CUDA caching allocator reports a peak of allocated bytes (RSS counts the whole process)"
        elif graphs:  # scalerepro.common.cuda_graphs
            reason = f"not measured under --compile {self.config.perf.compile}: CUDA graph replays allocate from private pools the allocated peak does not count"
        elif state is None:
            reason = "not measured: this process took no step"
        return {"per_rank": per_rank, "activations_reason": reason}

    def _probe_backward_buckets(self, steps: int) -> dict[str, Any]:
        """Forward, backward (with each DDP bucket's ready time) and optimizer of this run's own
        step, timed over ``steps`` steps after a warm-up step, eager and without gradient
        synchronisation (scalerepro.training.buckets says why); the run's state is restored afterwards.
        A collective when the run has several ranks: every rank must call it."""
        if steps == 0:
            return buckets.not_measured("--bucket-probe-steps 0")
        if self.mesh is not None:  # sharded: no DDP buckets to time
            return buckets.not_measured(f"--parallel {self.config.parallel.parallel}: gradients are reduce-scattered per FSDP unit, not in DDP buckets")
        params = [p for p in self.module.parameters() if p.requires_grad]  # DDP's parameter order
        sizes = [p.numel() * p.element_size() for p in params]  # gradients have the parameter's dtype
        recorder = buckets.PhaseRecorder(metrics.DeviceClock(self.device))
        out_of_memory = None
        with self.preserved_state():
            groups = self._cached_step_batches(steps + 1)  # inside: reading them may draw random numbers
            try:
                with recorder.watching(params):
                    for step in range(steps + 1):
                        batches = iter(groups[step % len(groups)])
                        self._train_step(batches, sync_gradients=False, eager=True, step_scheduler=False, marks=recorder)
            except torch.OutOfMemoryError as error:
                # The eager model can need more memory than the compiled one the run trained
                # (llama_1b at 8 x 2048 on an H100: fp32 logits the compiled loss never holds).
                # The run's figures are complete; the probe is not measured, and says why.
                out_of_memory = ". ".join(str(error).split(". ")[:2])  # "CUDA out of memory. Tried to allocate 7.83 GiB"
                self.optimizer.zero_grad(set_to_none=True)
        # The probe's steps run no collective, so a rank out of memory cannot strand its peers;
        # all learn here whether any rank ran out, and all leave the probe alike.
        anywhere = all_reduce_max(self.ctx, torch.tensor([float(out_of_memory is not None)], device=self.device)).item()
        if anywhere:
            where = out_of_memory or "on another rank"
            return buckets.not_measured(f"the eager probe steps ran out of device memory ({where}): lower --per-gpu-batch, or --bucket-probe-steps 0")
        if len(recorder.ready_order) != len(params):
            unused = len(params) - len(recorder.ready_order)
            return buckets.not_measured(f"{unused} parameters got no gradient in the backward: DDP's bucket timing needs every parameter used")
        bucket_cap_mb = self.config.parallel.bucket_cap_mb
        layout, source = buckets.choose_layout(sizes, recorder.ready_order, bucket_cap_mb, self.ddp)
        medians = torch.tensor(recorder.medians(layout), dtype=torch.float64, device=self.device)
        slowest = all_reduce_max(self.ctx, medians).tolist()
        return buckets.profile(slowest, layout, source, sizes, bucket_cap_mb, steps, self.config.optim.grad_accum_steps)

    def results(self, local_only: bool = False) -> dict[str, Any]:
        """Every figure of the run, reduced over ranks (a collective: all ranks must call it).

        ``local_only`` reports this rank's figures without any collective, for failed runs whose
        peers may be gone.
        """
        ctx = dataclasses.replace(self.ctx, backend=None) if local_only else self.ctx
        stats = metrics.window_stats(self.timer)
        slowest_window = all_reduce_max(ctx, torch.tensor([stats.seconds, stats.data_wait_s, stats.warmup_data_wait_s], dtype=torch.float64, device=self.device)).tolist()
        window_s = slowest_window[0]
        spec = self.spec
        samples_per_s = metrics.throughput(self.measured_samples, window_s)
        peak_flops, peak_source = hardware.peak_flops(
            torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
            self.config.perf.precision,
            override_tflops=self.config.run.peak_tflops,
        )
        memory = gather_objects(ctx, self._peak_memory())
        nvml = combine_ranks(gather_objects(ctx, self.nvml_summary))
        # one entry per node (its first rank's view: every rank of a node sees the same host)
        per_node = {}
        for host, activity in zip(ctx.hostnames if ctx.distributed else ctx.hostnames[:1], gather_objects(ctx, self.host_activity)):
            if activity is not None:
                per_node.setdefault(host, {"node": host, **activity})
        if self.device.type == "cpu":
            nvml.update(gpus=0, reason="CPU run: NVML measures NVIDIA GPUs only")
        total_time = sum(stats.epoch_seconds.values())
        return {
            "measured_steps": stats.steps,
            "measured_samples": self.measured_samples,
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
            "epoch_time_s": self.steps_per_epoch * stats.step_time_median_s if stats.step_time_median_s else None,
            "epoch_wall_times_s": [
                {"epoch": epoch, "seconds": seconds, "complete": any(h["epoch"] == epoch and h["complete"] for h in self.progress.history)}
                for epoch, seconds in sorted(stats.epoch_seconds.items())
            ],
            "train_time_s": total_time,
            # data-loader stall = host seconds the measured steps waited for their batches / window
            # seconds (slowest rank's of each); a warm-up step's wait is outside the window
            "data_stall_fraction": slowest_window[1] / window_s if window_s else None,
            "data_wait_s": slowest_window[1],
            "data_wait_warmup_s": slowest_window[2],  # not in the stall fraction: before the window
            "mfu": metrics.model_flops_utilization(spec.train_flops_per_sample, samples_per_s, peak_flops, ctx.world_size),
            "peak_flops_per_device": peak_flops,
            "peak_flops_source": peak_source,
            "achieved_flops": spec.train_flops_per_sample * samples_per_s if samples_per_s else None,
            "memory": {
                "allocated_bytes_max": _max_or_none(m["allocated_bytes"] for m in memory),
                "reserved_bytes_max": _max_or_none(m["reserved_bytes"] for m in memory),
                "rss_bytes_max": _max_or_none(m["rss_bytes"] for m in memory),
            },
            "exposed_communication": self.exposed_comm,
            "sharding": self._sharding_figures(ctx),
            "memory_split": self._memory_split(ctx),
            "backward_buckets": self.bucket_profile,  # see scalerepro.training.buckets
            "nvml": nvml,
            "host_activity": {
                "intra_op_threads_per_rank": torch.get_num_threads(),
                # each rank's cores (scalerepro.training.distributed.pin_to_own_cores), in rank order
                "cores_per_rank": gather_objects(ctx, list(self.ctx.cores)),
                "other_cpu_fraction_max": max((n["other_cpu_fraction"] for n in per_node.values() if n["other_cpu_fraction"] is not None), default=None),
                "nodes": list(per_node.values()),
            },
            # energy per sample = GPU energy over the measured steps (all GPUs; evaluation paused
            # out) / samples measured; net: the same less idle power x active time
            "energy_per_sample_j": nvml["energy_j"] / self.measured_samples if nvml["energy_j"] is not None and self.measured_samples else None,
            "energy_per_sample_net_j": nvml["energy_net_j"] / self.measured_samples if nvml.get("energy_net_j") is not None and self.measured_samples else None,
        }


def _max_or_none(values: Iterator[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None

