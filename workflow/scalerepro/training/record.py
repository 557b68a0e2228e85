"""The run record rank 0 writes: a ``scalerepro.record.model.RunRecord``, built from the run's
config and what its trainer and process group know, and validated as it is built (a field the
model does not declare, or a value outside its type or bound, fails here, before any file is
written).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path
from typing import Any

from scalerepro import schedulers
from scalerepro.common import host_heap
from scalerepro.common.files import utc_now, write_json_atomically
from scalerepro.record.measured import Measurements
from scalerepro.record.model import (
    RECORD_SCHEMA_VERSION,
    Batch,
    DataFacts,
    Epochs,
    Git,
    Hardware,
    Knobs,
    ModelFacts,
    OptimizerFacts,
    Parallel,
    RunError,
    RunPrecision,
    RunRecord,
    Scheduler,
    Steps,
)
from scalerepro.telemetry import hardware
from scalerepro.trainer_flags import TrainConfig, precision_reason, preset_overrides


def build(
    *,
    run_id: str,
    status: str,
    config: TrainConfig,
    started_at: str,
    argv: list[str],
    error: dict[str, Any] | None = None,
    trainer: Any = None,
    ctx: Any = None,
    measurements: Measurements | None = None,
    measurements_scope: str | None = None,
    stop_signal: str | None = None,
    checkpoint_path: str | None = None,
    import_torch: bool = True,
) -> RunRecord:
    """The record. ``trainer``/``ctx`` are None when the run failed before they existed; the
    fields they would fill are then null, never invented. ``import_torch=False`` (the launcher's
    record of ranks that wrote none) leaves the facts only torch can read null."""
    return RunRecord.model_validate(
        {
            "schema_version": RECORD_SCHEMA_VERSION,
            "run_id": run_id,
            # a smoke run checks a code path: the analysis must not pool it with a measurement (--purpose)
            "purpose": config.run.purpose,
            "status": status,
            "error": RunError.model_validate(error) if error is not None else None,
            "stop_signal": stop_signal,
            "started_at": started_at,
            "ended_at": utc_now(),
            "command_line": [sys.executable, "-m", "scalerepro.training.train", *argv],
            "seed": config.run.seed,
            "precision": _precision(config),
            "knobs": _knobs(config),
            "config": dataclasses.asdict(config),
            "git": Git.model_validate(hardware.git_info(Path(__file__).resolve().parent)),
            "versions": hardware.software_versions(import_torch),
            "hardware": Hardware.model_validate(hardware.host_facts(import_torch)),
            "scheduler": Scheduler.model_validate(schedulers.current().job_facts(os.environ)),
            "parallel": _parallel(config, ctx),
            "measurements": measurements,
            "measurements_scope": measurements_scope,
            "checkpoint": checkpoint_path,
            **_trainer_fields(config, trainer),
        }
    )


def write(path: str | os.PathLike[str], record: RunRecord) -> None:
    """Write ``record`` atomically (readers see the old file or the new one)."""
    write_json_atomically(path, record.model_dump(mode="json"))


def _precision(config: TrainConfig) -> RunPrecision:
    """The arithmetic of --precision in this trainer: master parameters and optimizer state in
    fp32 always; fp32 computes IEEE fp32 (TF32 off), tf32 on the TF32 tensor cores, fp16 and
    bf16 under autocast (fp16 with dynamic loss scaling)."""
    precision = config.perf.precision
    return RunPrecision(
        name=precision,
        param_dtype="fp32",
        compute_dtype=precision,
        optimizer_state_dtype="fp32",
        loss_scaling=precision == "fp16",
        # on a CPU: why this precision (bf16 is native on some CPUs, emulated on others)
        reason=precision_reason(config, config.parallel.device),
    )


def _knobs(config: TrainConfig) -> Knobs:
    """The settings the analysis compares across runs, each under one name."""
    return Knobs(
        preset=config.perf.preset,
        # the flags given explicitly on top of the preset, with the values they set
        preset_overrides=preset_overrides(config),
        cudnn_benchmark=config.perf.cudnn_benchmark,
        channels_last=config.perf.channels_last,
        compile=config.perf.compile,
        # the levers beside the preset (scalerepro.training.compilation, the ResNets' stem)
        compile_scope=config.perf.compile_scope,
        attention_backend=config.perf.attention_backend,
        stem_channels=config.model.stem_channels,
        loader=config.data.loader,
        optimizer_impl=config.optim.optimizer_impl,
        bucket_cap_mb=config.parallel.bucket_cap_mb,
        gradient_as_bucket_view=config.parallel.gradient_as_bucket_view,
        static_graph=config.parallel.static_graph,
        sync_batchnorm=config.parallel.sync_batchnorm,
        # the rank's malloc thresholds (scalerepro.common.host_heap); null where no rank set them (the launcher's record)
        host_heap=host_heap.SETTING,
    )


def _parallel(config: TrainConfig, ctx: Any) -> Parallel:
    """Where the run ran: the launcher, the backend and the ranks (a failed start: this host only)."""
    if ctx is None:
        # the card counts named: mypy reads no default in their Field(None, ...)
        return Parallel(strategy=config.parallel.parallel, hostnames=[socket.gethostname()])
    gpus_per_node = 0
    if ctx.device.type == "cuda":
        gpus_per_node = ctx.env.local_world_size
        if ctx.backend == "gloo":  # the node's ranks may share its cards (distributed.card_of_rank)
            import torch

            gpus_per_node = min(gpus_per_node, torch.cuda.device_count())
    return Parallel(
        strategy=config.parallel.parallel,
        launcher=ctx.env.launcher,
        backend=ctx.backend,
        device_type=ctx.device.type,
        world_size=ctx.world_size,
        nodes=ctx.num_nodes,
        ranks_per_node=ctx.env.local_world_size,
        gpus_per_node=gpus_per_node,
        gpus=gpus_per_node * ctx.num_nodes,
        hostnames=sorted(set(ctx.hostnames)),
    )


def _trainer_fields(config: TrainConfig, trainer: Any) -> dict[str, Any]:
    """The model, optimizer, batch, data, steps and history: each flag's part always, what only a
    built trainer knows where there is one (null where the run failed before)."""
    micro, accumulation = config.run.per_gpu_batch, config.optim.grad_accum_steps
    if trainer is None:
        return {
            # the flag's model, validated against the models the record knows
            "model": ModelFacts.model_validate({**dict.fromkeys(ModelFacts.model_fields), "name": config.model.model}),
            "batch": Batch(micro_batch=micro, grad_accum_steps=accumulation, samples_per_gpu_step=None, global_batch=None),
            **dict.fromkeys(("optimizer", "data", "steps", "epochs")),
            "history": [],
            "loss_log": [],
        }
    spec, progress = trainer.spec, trainer.progress
    shape = {key: value for key, value in dataclasses.asdict(spec.shape).items() if key != "stem_channels"}  # a lever: knobs.stem_channels
    return {
        "model": ModelFacts.model_validate(
            {
                "name": spec.name,
                "task": spec.task,
                "family": spec.family,
                "num_parameters": spec.num_parameters,
                "tokens_per_sample": spec.tokens_per_sample,
                "train_flops_per_sample": spec.train_flops_per_sample,
                "flops_source": spec.flops_source,
                "shape": shape,
            }
        ),
        "optimizer": OptimizerFacts.model_validate({**dataclasses.asdict(trainer.optim_resolved), "schedule": config.optim.lr_schedule}),
        "batch": Batch(
            micro_batch=micro,
            grad_accum_steps=accumulation,
            # samples per GPU a step = global batch / ranks (micro-batch x accumulation where every rank is a data-parallel replica)
            samples_per_gpu_step=trainer.global_batch / trainer.ctx.world_size,
            # global batch = per-rank micro-batch x data-parallel ranks (all but TP's) x accumulation steps
            global_batch=trainer.global_batch,
        ),
        "data": DataFacts(
            kind="synthetic" if config.data.data == "synthetic" else "cifar10",
            path=None if config.data.data == "synthetic" else str(Path(config.data.data).resolve()),
            train_samples=trainer.train_source.num_samples,
            eval_samples=trainer.eval_source.num_samples,
        ),
        "steps": Steps.model_validate(
            {
                "total": trainer.total_steps,
                # the LR schedule's steps; fewer than total when --min-window-s lengthened the run
                "scheduled": trainer.scheduled_steps,
                "completed": progress.step,
                "warmup": trainer.warmup.steps,  # this process's: --warmup-steps, or more where the step time settled later
                "warmup_reason": trainer.warmup.reason,
                "per_epoch": trainer.steps_per_epoch,
                "resumed_from": trainer.resumed_from,
                # newer checkpoints passed over on resume, each with why (scalerepro.training.checkpoint_store)
                "checkpoints_skipped": trainer.checkpoints.skipped if trainer.checkpoints is not None else [],
            }
        ),
        "epochs": Epochs(
            # planned epochs = total steps / steps per epoch (fractional for runs counted in steps)
            planned=trainer.total_steps / trainer.steps_per_epoch,
            completed=sum(1 for h in progress.history if h["complete"]),
        ),
        "history": progress.history,
        "loss_log": trainer.loss_log,
    }
