"""Evaluation: loss and top-1 accuracy over the held-out samples, summed over ranks (not timed, outside the energy window)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from scalerepro.data import loaders, sources
from scalerepro.parallel import pipeline_parallel
from scalerepro.training.distributed import DistContext, all_reduce_max, all_reduce_sum, max_over_ranks


@torch.no_grad()
def evaluate(
    module: torch.nn.Module,
    pipeline: pipeline_parallel.Pipeline | None,
    eval_source: sources.Source,
    batch_size: int,
    dp_size: int,
    dp_rank: int,
    ctx: DistContext,
    channels_last: bool,
    autocast: Callable[[], contextlib.AbstractContextManager],
    stop_requested: Callable[[], bool] = lambda: False,
    budget_s: float = 0.0,
) -> dict[str, float] | None:
    """Loss and top-1 accuracy over ``eval_source`` (--eval-samples) at ``batch_size`` per
    data-parallel rank, summed over ranks; None when a stop signal reached any rank during it
    (``stop_requested``, checked before each batch: a stop is honoured within one batch, not after
    the whole held-out set; the ranks agree before they sum, so all return None alike).

    Runs the plain module (not the DDP or compiled wrapper): evaluation is not measured, and
    this avoids recompiling for eval mode. Under --parallel pp the schedule's forward runs the
    stages (``pipeline``).

    ``budget_s`` (> 0, --eval-budget-s) bounds it by time: past the budget it stops after the batch
    in hand, at least one batch in, the ranks agreeing at every batch (the largest elapsed time
    decides) so that all evaluate the same batches; ``eval_samples`` says how many were evaluated.
    """
    device = ctx.device
    module.eval()
    # loss sum, correct, count; summed over all ranks, the ranks of a TP group adding the same
    # figures each: every total is tp x the data-parallel one, and the ratios are unchanged
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    stopped = False
    started = time.perf_counter()
    for index, (inputs, targets) in enumerate(loaders.eval_batches(eval_source.to(device), batch_size, dp_size, dp_rank, device, channels_last)):
        if stop_requested():
            stopped = True
            break
        if budget_s > 0 and index > 0 and max_over_ranks(ctx, time.perf_counter() - started) > budget_s:
            break
        with autocast():
            # --parallel pp: the logits exist on the last stage, whose figures alone are counted
            logits = module(*inputs) if pipeline is None else pipeline.forward_only(*inputs)
        if logits is None:
            continue
        logits, targets = logits.flatten(0, -2).float(), targets.flatten()
        totals[0] += F.cross_entropy(logits, targets, reduction="sum")
        totals[1] += (logits.argmax(dim=-1) == targets).sum()
        totals[2] += targets.numel()
    module.train()
    if all_reduce_max(ctx, torch.tensor([float(stopped)], device=device)).item():
        return None
    all_reduce_sum(ctx, totals)
    loss_sum, correct, count = totals.tolist()
    # eval_loss = sum of per-target losses / targets; eval_accuracy = correct / targets
    return {"eval_loss": loss_sum / count, "eval_accuracy": correct / count, "eval_samples": int(count)}
