"""DDP's gradient buckets and when each is ready in the backward pass: the input of the scaling
model (``scalerepro.analysis.scaling_model``), which replays a one-GPU run's backward with each
bucket's all-reduce started as soon as the bucket is ready.

After the measured window (like the exposed-communication probe, so no timed step carries a
hook), ``probe`` runs ``--bucket-probe-steps`` steps on cached batches, gradient synchronisation
off (compute only: what one GPU does), and times each phase:

    forward_s     forward and loss of one micro-batch
    backward_s    backward of one micro-batch (the scaled loss's .backward())
    optimizer_s   (unscale and clip,) optimizer and scaler step, zero_grad (not the LR scheduler's
                  step: microseconds, and OneCycleLR refuses steps past the run's end)
    ready_s[k]    backward start -> the moment every parameter of bucket k has its gradient
                  accumulated (``Tensor.register_post_accumulate_grad_hook``): bucket k's
                  all-reduce could start then

each the median over the probe's steps (the first one is a warm-up), the slowest rank's median
on several ranks.

The probe runs the eager model, also when the run is compiled (``--compile``): a compiled
backward without DDP is one graph that accumulates every gradient at its end (measured on the
CPU: first/median/last bucket ready at 1.00 of the backward, against 0.13/0.66/1.00 eager), so
it would tell the scaling model that no all-reduce can start before the backward ends. The eager
backward produces the gradients layer by layer, as DDP's bucketed graph does. Its phases are
slower than the compiled ones; where they add up to more than the measured step, the scaling
model scales them (ready times included) into it (``scalerepro.analysis.scaling_model``), which
keeps each bucket's place in the backward. On CUDA every mark is an event recorded on the current stream and read after
the probe (no host synchronisation inside a step); on the CPU the work is synchronous and
``time.perf_counter`` marks it.

The bucket layout is DDP's: after the first iteration DDP rebuilds its buckets in the order the
gradients became ready (``Reducer::rebuild_buckets``) with ``dist._compute_bucket_assignment_by_size``,
filling a bucket until it reaches its cap (the first bucket's cap is ``dist._DEFAULT_FIRST_BUCKET_BYTES``
= 1 MiB only when DDP gets no ``bucket_cap_mb``; the trainer always passes one, so every cap is
``--bucket-cap-mb``). One rank has no DDP wrapper, so the same function computes the layout
from the observed ready order; with DDP the rebuilt layout it reports is recorded instead, and
the two agree (tests/test_scaling_model.py).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from . import distributed

if TYPE_CHECKING:
    from .trainer import Trainer

MIB = 1024 * 1024


def bucket_caps_bytes(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket's cap, every other bucket's cap) in bytes, as DDP derives them: without a
    ``bucket_cap_mb`` the cap is 25 MiB and the first bucket 1 MiB; with one, both are it."""
    if bucket_cap_mb is None:
        return dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


def bucket_layout(
    sizes_bytes: Sequence[int], ready_order: Sequence[int], first_cap_bytes: int, cap_bytes: int
) -> list[list[int]]:
    """DDP's rebuilt buckets: parameter indices per bucket, in all-reduce order.

    ``sizes_bytes[i]`` is parameter i's gradient size; ``ready_order`` lists the indices in the
    order their gradients became ready. Each bucket takes parameters in that order until its
    size reaches its cap (``dist._compute_bucket_assignment_by_size``, the function DDP calls).
    """
    tensors = [torch.empty(sizes_bytes[i], dtype=torch.uint8, device="meta") for i in ready_order]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        tensors, [first_cap_bytes, cap_bytes], [False] * len(tensors), list(ready_order)
    )
    return [list(bucket) for bucket in buckets]


def ddp_rebuilt_layout(ddp: torch.nn.parallel.DistributedDataParallel) -> list[list[int]] | None:
    """The bucket layout DDP built after its first iteration, from its logging data (parameter
    indices per bucket, in all-reduce order), or None when it has not rebuilt its buckets."""
    data = ddp._get_ddp_logging_data()
    text = data.get("rebuilt_per_bucket_param_indices")
    if not data.get("has_rebuilt_buckets") or not text:
        return None
    return [[int(index) for index in bucket.split()] for bucket in str(text).split(",")]


class _Marks:
    """Time marks of one probe step: CUDA events or perf_counter readings, read after the probe."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start  # elapsed_time is in ms


@dataclass
class _StepMarks:
    start: Any
    forward_end: Any
    backward_end: Any
    optimizer_end: Any
    param_ready: dict[int, Any]  # parameter index -> mark when its gradient was accumulated


def not_measured(reason: str) -> dict[str, Any]:
    return {"steps": 0, "reason": reason, "buckets": []}


def probe(trainer: Trainer, steps: int) -> dict[str, Any]:
    """Time forward, backward (with each bucket's ready time) and the optimizer over ``steps``
    steps after a warm-up step; restore the model, optimizer, scheduler and scaler afterwards.
    A collective when the run has several ranks: every rank must call it."""
    if steps == 0:
        return not_measured("--bucket-probe-steps 0")
    if getattr(trainer, "mesh", None) is not None:  # sharded: no DDP buckets to time
        return not_measured(f"--parallel {trainer.config.parallel.parallel}: gradients are reduce-scattered per FSDP unit, not in DDP buckets")
    module, ddp, device = trainer.module, trainer.ddp, trainer.device
    params = [p for p in module.parameters() if p.requires_grad]  # DDP's parameter order
    sizes = [p.numel() * p.element_size() for p in params]  # gradients have the parameter's dtype
    saved = {
        "model": {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scheduler": copy.deepcopy(trainer.scheduler.state_dict()),
        "scaler": copy.deepcopy(trainer.scaler.state_dict()),
    }
    batch_iter = trainer.loader.epoch(trainer.progress.epoch)
    batches = [next(batch_iter) for _ in range(min(steps + 1, trainer.loader.micro_batches_per_epoch))]
    marks = _Marks(device.type == "cuda")
    recorded: list[_StepMarks] = []
    ready_order: list[int] = []  # host order of the hooks in the first step: the order DDP sees
    current: dict[int, Any] = {}

    def on_ready(index: int):
        def hook(_: torch.Tensor) -> None:
            current[index] = marks.now()
            if not recorded and index not in ready_order:
                ready_order.append(index)

        return hook

    handles = [p.register_post_accumulate_grad_hook(on_ready(i)) for i, p in enumerate(params)]
    optim = trainer.config.optim
    try:
        for step in range(steps + 1):
            inputs, targets = batches[step % len(batches)]
            current = {}
            start = marks.now()
            with ddp.no_sync() if ddp is not None else contextlib.nullcontext(), trainer._autocast():
                loss = trainer.eager_model(inputs, targets)  # never the compiled one: see the docstring
            forward_end = marks.now()
            with ddp.no_sync() if ddp is not None else contextlib.nullcontext():
                trainer.scaler.scale(loss).backward()
            backward_end = marks.now()
            if optim.clip_grad_norm > 0:
                trainer.scaler.unscale_(trainer.optimizer)
                torch.nn.utils.clip_grad_norm_(module.parameters(), optim.clip_grad_norm)
            trainer.scaler.step(trainer.optimizer)
            trainer.scaler.update()
            trainer.optimizer.zero_grad(set_to_none=True)
            recorded.append(_StepMarks(start, forward_end, backward_end, marks.now(), current))
    finally:
        for handle in handles:
            handle.remove()
        module.load_state_dict(saved["model"])
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scheduler.load_state_dict(saved["scheduler"])
        trainer.scaler.load_state_dict(saved["scaler"])
    if marks.cuda:
        torch.cuda.synchronize()
    if len(ready_order) != len(params):
        unused = len(params) - len(ready_order)
        return not_measured(f"{unused} parameters got no gradient in the backward: DDP's bucket timing needs every parameter used")

    first_cap, cap = bucket_caps_bytes(trainer.config.parallel.bucket_cap_mb)
    layout = bucket_layout(sizes, ready_order, first_cap, cap)
    source = "computed (dist._compute_bucket_assignment_by_size over the observed gradient-ready order)"
    if ddp is not None:
        rebuilt = ddp_rebuilt_layout(ddp)
        if rebuilt is not None:
            layout, source = rebuilt, "DDP's rebuilt buckets (_get_ddp_logging_data)"

    measured = recorded[1:]  # the first step is a warm-up
    per_step = [
        [
            marks.seconds(m.start, m.forward_end),
            marks.seconds(m.forward_end, m.backward_end),
            marks.seconds(m.backward_end, m.optimizer_end),
            # bucket k is ready when the last of its parameters is: max over its parameters
            *(max(marks.seconds(m.forward_end, m.param_ready[i]) for i in bucket) for bucket in layout),
        ]
        for m in measured
    ]
    medians = [statistics.median(column) for column in zip(*per_step)]
    slowest = distributed.all_reduce_max(trainer.ctx, torch.tensor(medians, dtype=torch.float64, device=device)).tolist()
    forward_s, backward_s, optimizer_s, ready_s = slowest[0], slowest[1], slowest[2], slowest[3:]
    return {
        "steps": len(measured),
        "reason": None,
        "layout_source": source,
        "first_bucket_cap_bytes": first_cap,
        "bucket_cap_bytes": cap,
        "gradient_bytes": sum(sizes),
        "micro_batches_per_step": trainer.config.optim.grad_accum_steps,
        "forward_s": forward_s,
        "backward_s": backward_s,
        "optimizer_s": optimizer_s,
        "buckets": [
            {"bytes": sum(sizes[i] for i in bucket), "parameters": len(bucket), "ready_s": ready}
            for bucket, ready in zip(layout, ready_s)
        ],
    }
