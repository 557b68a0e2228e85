"""The model in the parallel form --parallel asks for: sharded on a device mesh (fsdp, tp,
fsdp+tp), cut into pipeline stages (pp), or left whole for DDP to wrap (ddp); activation
checkpointing (scalerepro.parallel.activation_recompute) under any of them.

A sharded form replaces the parameters, so it comes before the optimizer is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scalerepro.parallel import activation_recompute, mesh, parallelize, pipeline_parallel
from scalerepro.trainer_flags import TrainConfig, TrainerConfigError
from scalerepro.training.distributed import DistContext
from scalerepro.training.objective import cross_entropy


@dataclass(frozen=True)
class ParallelForm:
    module: torch.nn.Module  # what this rank trains: the whole model, its shards, or (pp) its stage
    mesh: Any  # the DeviceMesh the model is sharded on; None under ddp
    pipeline: pipeline_parallel.Pipeline | None  # --parallel pp: this rank's stage and schedule


def apply(module: torch.nn.Module, config: TrainConfig, ctx: DistContext, device: torch.device, tp_size: int | None) -> ParallelForm:
    """``module`` in --parallel's form on ``device``; a flag the form cannot take is refused with
    one line."""
    p = config.parallel
    try:
        if p.parallel == "ddp":
            if p.activation_checkpointing != "none":
                activation_recompute.apply_activation_checkpointing(module, p.activation_checkpointing)
            return ParallelForm(module, None, None)
        if p.parallel == "pp":
            return _pipeline(module, config, ctx, device)
        if not ctx.distributed:
            raise TrainerConfigError(f"--parallel {p.parallel} needs at least 2 ranks (launch with scalerepro.launching.launch or torchrun)")
        device_mesh = parallelize.build_mesh(p.parallel, ctx.world_size, device.type, tp_size)
        parallelize.parallelize(
            module,
            p.parallel,
            device_mesh,
            reshard_after_forward=p.reshard_after_forward,
            param_dtype=torch.bfloat16 if config.perf.precision == "bf16" else None,
            activation_checkpointing=p.activation_checkpointing,
        )
        return ParallelForm(module, device_mesh, None)
    except mesh.ParallelError as error:
        raise TrainerConfigError(str(error)) from None


def _pipeline(module: torch.nn.Module, config: TrainConfig, ctx: DistContext, device: torch.device) -> ParallelForm:
    """--parallel pp: this rank's stage of GPT (the form's module is the stage, so the optimizer,
    checkpoints and byte counts see this stage's parameters only) and its schedule. What the
    pipeline step does not do is refused here, one line each."""
    p, run = config.parallel, config.run
    refusals = {
        "--grad-accum-steps": (
            config.optim.grad_accum_steps != 1,
            "the pipeline's --microbatches are its gradient accumulation: use --microbatches instead",
        ),
        "--clip-grad-norm": (config.optim.clip_grad_norm > 0, "the global norm would need the stages' norms combined, which is not done: leave it 0"),
        "--precision fp16": (config.perf.precision == "fp16", "the schedule's backward does not take GradScaler's scaled loss: use --precision bf16"),
        "--compile": (config.perf.compile != "none", "the stages are run eagerly by the schedule: leave --compile off"),
    }
    for flag, (refused, fix) in refusals.items():
        if refused:
            raise TrainerConfigError(f"--parallel pp does not support {flag}: {fix}")
    if run.per_gpu_batch % p.microbatches:
        raise TrainerConfigError(f"--per-gpu-batch {run.per_gpu_batch} does not split into --microbatches {p.microbatches}: make it a multiple")
    if not ctx.distributed:
        raise TrainerConfigError("--parallel pp needs at least 2 ranks (launch with scalerepro.launching.launch or torchrun)")
    activation_recompute.apply_activation_checkpointing(module, p.activation_checkpointing)
    device_mesh = parallelize.build_mesh("pp", ctx.world_size, device.type)
    label_smoothing = config.optim.label_smoothing
    pipeline = pipeline_parallel.build_pipeline(
        module,
        device_mesh,
        p.pp_schedule,
        p.microbatches,
        lambda logits, targets: cross_entropy(logits, targets, label_smoothing),
        device,
    )
    return ParallelForm(pipeline.stage_module, device_mesh, pipeline)
