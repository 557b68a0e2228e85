"""The run record: one self-describing JSON document per run, written atomically by rank 0.

This is the only thing the analysis side reads. Its schema is
``workflow/schemas/run_record.schema.json``; bump ``RECORD_SCHEMA_VERSION`` with any change a reader
must know about.
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
from scalerepro.common.files import utc_now
from scalerepro.telemetry import hardware
from scalerepro.trainer_flags import precision_reason, preset_overrides

# The record's layout: raised whenever a field moves or changes meaning, so that a reader of kept
# records tells the layouts apart.
RECORD_SCHEMA_VERSION = 4


def build(
    *,
    run_id: str,
    status: str,
    config: Any,
    started_at: str,
    argv: list[str],
    error: dict[str, str] | None = None,
    trainer: Any = None,
    ctx: Any = None,
    measurements: dict[str, Any] | None = None,
    measurements_scope: str | None = None,
    stop_signal: str | None = None,
    checkpoint_path: str | None = None,
    import_torch: bool = True,
) -> dict[str, Any]:
    """Assemble the record. ``trainer``/``ctx`` are None when the run failed before they existed;
    the fields they would fill are then null, never invented. ``import_torch=False`` (the
    launcher's record of ranks that wrote none) leaves the facts only torch can read null."""
    record: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "run_id": run_id,
        # a smoke run checks a code path: the analysis must not pool it with a measurement (--purpose)
        "purpose": config.run.purpose,
        "status": status,
        "error": error,
        "stop_signal": stop_signal,
        "started_at": started_at,
        "ended_at": utc_now(),
        "command_line": [sys.executable, "-m", "scalerepro.training.train", *argv],
        "seed": config.run.seed,
        "precision": config.perf.precision,
        "knobs": _knobs(config),
        "config": dataclasses.asdict(config),
        "git": hardware.git_info(Path(__file__).resolve().parent),
        "versions": hardware.software_versions(import_torch),
        "hardware": hardware.host_facts(import_torch),
        "scheduler": schedulers.current().job_facts(os.environ),
        "model": None,
        "optimizer": None,
        "parallel": None,
        "batch": None,
        "data": None,
        "steps": None,
        "epochs": None,
        "measurements": measurements,
        "measurements_scope": measurements_scope,
        "history": [],
        "loss_log": [],
        "checkpoint": checkpoint_path,
    }
    record["parallel"] = _parallel(ctx)
    if trainer is not None:
        record.update(_trainer_fields(config, trainer))
    return record


def _knobs(config: Any) -> dict[str, Any]:
    """The settings the analysis compares across runs, each under one name."""
    return {
        "preset": config.perf.preset,
        # the flags given explicitly on top of the preset, with the values they set
        "preset_overrides": preset_overrides(config),
        # on a CPU: why this precision (bf16 is native on some CPUs, emulated on others)
        "precision_reason": precision_reason(config, config.parallel.device),
        "cudnn_benchmark": config.perf.cudnn_benchmark,
        "channels_last": config.perf.channels_last,
        "compile": config.perf.compile,
        # the levers beside the preset (scalerepro.training.compilation, the ResNets' stem)
        "compile_scope": config.perf.compile_scope,
        "attention_backend": config.perf.attention_backend,
        "stem_channels": config.model.stem_channels,
        "loader": config.data.loader,
        "optimizer_impl": config.optim.optimizer_impl,
        "bucket_cap_mb": config.parallel.bucket_cap_mb,
        "gradient_as_bucket_view": config.parallel.gradient_as_bucket_view,
        "static_graph": config.parallel.static_graph,
        "sync_batchnorm": config.parallel.sync_batchnorm,
        "grad_accum_steps": config.optim.grad_accum_steps,
        # the rank's malloc thresholds (scalerepro.common.host_heap); null where no rank set them (the launcher's record)
        "host_heap": host_heap.SETTING,
    }


def _parallel(ctx: Any) -> dict[str, Any]:
    """Where the run ran: the launcher, the backend and the ranks (a failed start: this host only)."""
    if ctx is None:
        return {"hostnames": [socket.gethostname()]}
    gpus_per_node = 0
    if ctx.device.type == "cuda":
        gpus_per_node = ctx.env.local_world_size
        if ctx.backend == "gloo":  # the node's ranks may share its cards (distributed.card_of_rank)
            import torch

            gpus_per_node = min(gpus_per_node, torch.cuda.device_count())
    return {
        "launcher": ctx.env.launcher,
        "backend": ctx.backend,
        "device_type": ctx.device.type,
        "world_size": ctx.world_size,
        "nodes": ctx.num_nodes,
        "ranks_per_node": ctx.env.local_world_size,
        "gpus_per_node": gpus_per_node,
        "gpus": gpus_per_node * ctx.num_nodes,
        "hostnames": sorted(set(ctx.hostnames)),
    }


def _trainer_fields(config: Any, trainer: Any) -> dict[str, Any]:
    """What only a built trainer knows: the model, optimizer, batch, data, steps and history."""
    spec, progress = trainer.spec, trainer.progress
    fields: dict[str, Any] = {}
    fields["model"] = {
        "name": spec.name,
        "task": spec.task,
        "family": spec.family,
        "num_parameters": spec.num_parameters,
        "tokens_per_sample": spec.tokens_per_sample,
        "train_flops_per_sample": spec.train_flops_per_sample,
        "flops_source": spec.flops_source,
        "shape": dataclasses.asdict(spec.shape),
    }
    fields["optimizer"] = {**dataclasses.asdict(trainer.optim_resolved), "schedule": config.optim.lr_schedule}
    fields["batch"] = {
        "per_gpu": config.run.per_gpu_batch,
        "grad_accum_steps": config.optim.grad_accum_steps,
        # global batch = per-rank micro-batch x data-parallel ranks (all but TP's) x accumulation steps
        "global": trainer.global_batch,
    }
    fields["data"] = {
        "kind": "synthetic" if config.data.data == "synthetic" else "cifar10",
        "path": None if config.data.data == "synthetic" else str(Path(config.data.data).resolve()),
        "train_samples": trainer.train_source.num_samples,
        "eval_samples": trainer.eval_source.num_samples,
        "loader": config.data.loader,
    }
    fields["steps"] = {
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
    fields["epochs"] = {
        # planned epochs = total steps / steps per epoch (fractional for runs counted in steps)
        "planned": trainer.total_steps / trainer.steps_per_epoch,
        "completed": sum(1 for h in progress.history if h["complete"]),
    }
    fields["history"] = progress.history
    fields["loss_log"] = trainer.loss_log
    return fields
