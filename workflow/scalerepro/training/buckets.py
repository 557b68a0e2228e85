"""DDP's gradient buckets and when each is ready in the backward pass: the input of the scaling
model (``scalerepro.analysis.tables.scaling_model``), which replays a one-GPU run's backward with each
bucket's all-reduce started as soon as the bucket is ready.

After the measured window (like the exposed-communication probe, so no timed step carries a
hook), the bucket probe (``scalerepro.training.probes.backward_buckets``) runs
``--bucket-probe-steps`` steps of the trainer's own step function on cached batches, gradient
synchronisation off (compute only: what one GPU does), with a ``PhaseRecorder`` that the step
tells when each phase is done. This module holds the recorder and the arithmetic: the phases,

    forward_s     forward and loss of one micro-batch
    backward_s    backward of one micro-batch (the scaled loss's .backward())
    optimizer_s   (unscale and clip,) optimizer and scaler step, zero_grad (not the LR scheduler's
                  step: microseconds, and OneCycleLR refuses steps past the run's end)
    ready_s[k]    backward start -> the moment every parameter of bucket k has its gradient
                  accumulated (``Tensor.register_post_accumulate_grad_hook``): bucket k's
                  all-reduce could start then

each the median over the probe's micro-batches (optimizer_s: over its steps; the first step is a
warm-up), the slowest rank's median on several ranks; and the bucket layout.

The probe runs the eager model, also when the run is compiled (``--compile``): a compiled
backward without DDP is one graph that accumulates every gradient at its end (measured on the
CPU: first/median/last bucket ready at 1.00 of the backward, against 0.13/0.66/1.00 eager), so
it would tell the scaling model that no all-reduce can start before the backward ends. The eager
backward produces the gradients layer by layer, as DDP's bucketed graph does. Its phases are
slower than the compiled ones; where they add up to more than the measured step, the scaling
model scales them (ready times included) into it (``scalerepro.analysis.tables.scaling_model``), which
keeps each bucket's place in the backward. Every mark is a ``metrics.DeviceClock`` mark: on CUDA
an event recorded on the current stream and read after the probe (no host synchronisation inside
a step); on the CPU the work is synchronous and ``time.perf_counter`` marks it.

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
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from scalerepro.telemetry.metrics import DeviceClock

MIB = 1024 * 1024


def not_measured(reason: str) -> dict[str, Any]:
    return {"steps": 0, "reason": reason, "buckets": []}


# ---- DDP's bucket layout ------------------------------------------------------------------------


def bucket_caps_bytes(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket's cap, every other bucket's cap) in bytes, as DDP derives them: without a
    ``bucket_cap_mb`` the cap is 25 MiB and the first bucket 1 MiB; with one, both are it."""
    if bucket_cap_mb is None:
        return dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


def bucket_layout(sizes_bytes: Sequence[int], ready_order: Sequence[int], first_cap_bytes: int, cap_bytes: int) -> list[list[int]]:
    """DDP's rebuilt buckets: parameter indices per bucket, in all-reduce order.

    ``sizes_bytes[i]`` is parameter i's gradient size; ``ready_order`` lists the indices in the
    order their gradients became ready. Each bucket takes parameters in that order until its
    size reaches its cap (``dist._compute_bucket_assignment_by_size``, the function DDP calls).
    """
    tensors = [torch.empty(sizes_bytes[i], dtype=torch.uint8, device="meta") for i in ready_order]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [first_cap_bytes, cap_bytes], [False] * len(tensors), list(ready_order))
    return [list(bucket) for bucket in buckets]


def ddp_rebuilt_layout(ddp: torch.nn.parallel.DistributedDataParallel) -> list[list[int]] | None:
    """The bucket layout DDP built after its first iteration, from its logging data (parameter
    indices per bucket, in all-reduce order), or None when it has not rebuilt its buckets."""
    data = ddp._get_ddp_logging_data()
    text = data.get("rebuilt_per_bucket_param_indices")
    if not data.get("has_rebuilt_buckets") or not text:
        return None
    return [[int(index) for index in bucket.split()] for bucket in str(text).split(",")]


def choose_layout(
    sizes_bytes: Sequence[int],
    ready_order: Sequence[int],
    bucket_cap_mb: float | None,
    ddp: torch.nn.parallel.DistributedDataParallel | None,
) -> tuple[list[list[int]], str]:
    """The run's bucket layout and where it comes from: DDP's own rebuilt buckets when it has
    them, else the same computation DDP does, over the observed gradient-ready order."""
    if ddp is not None:
        rebuilt = ddp_rebuilt_layout(ddp)
        if rebuilt is not None:
            return rebuilt, "DDP's rebuilt buckets (_get_ddp_logging_data)"
    first_cap, cap = bucket_caps_bytes(bucket_cap_mb)
    layout = bucket_layout(sizes_bytes, ready_order, first_cap, cap)
    return layout, "computed (dist._compute_bucket_assignment_by_size over the observed gradient-ready order)"


# ---- the phases of the trainer's step --------------------------------------------------------------


@dataclass
class _MicroBatchMarks:
    start: Any  # the micro-batch's inputs in hand
    forward_end: Any = None  # = the backward's start
    backward_end: Any = None
    param_ready: dict[int, Any] = field(default_factory=dict)  # parameter index -> its gradient accumulated


@dataclass
class _StepMarks:
    micro_batches: list[_MicroBatchMarks] = field(default_factory=list)
    optimizer_end: Any = None  # the optimizer phase starts at the last micro-batch's backward_end


class PhaseRecorder:
    """Marks of the trainer's step phases (``Trainer.probe_step(..., marks=recorder)`` calls
    ``micro_batch_started``, ``forward_done``, ``backward_done``, ``optimizer_done``) and, while
    ``watching`` the parameters, the moment each parameter's gradient is accumulated.

    Marks are ``DeviceClock`` marks: nothing here synchronises the host inside a step."""

    def __init__(self, clock: DeviceClock):
        self.clock = clock
        self.steps: list[_StepMarks] = []  # completed steps
        self.ready_order: list[int] = []  # host order of the hooks in the first step: the order DDP sees
        self._open = _StepMarks()

    def micro_batch_started(self) -> None:
        self._open.micro_batches.append(_MicroBatchMarks(self.clock.now()))

    def forward_done(self) -> None:
        self._open.micro_batches[-1].forward_end = self.clock.now()

    def backward_done(self) -> None:
        self._open.micro_batches[-1].backward_end = self.clock.now()

    def optimizer_done(self) -> None:
        self._open.optimizer_end = self.clock.now()
        self.steps.append(self._open)
        self._open = _StepMarks()

    @contextlib.contextmanager
    def watching(self, params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
        """A post-accumulate-grad hook on every parameter (index = position in ``params``),
        removed on exit."""

        def on_ready(index: int):
            def hook(_: torch.Tensor) -> None:
                self._open.micro_batches[-1].param_ready[index] = self.clock.now()
                if not self.steps and index not in self.ready_order:
                    self.ready_order.append(index)

            return hook

        handles = [p.register_post_accumulate_grad_hook(on_ready(i)) for i, p in enumerate(params)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def medians(self, layout: Sequence[Sequence[int]]) -> list[float]:
        """[forward_s, backward_s, optimizer_s, ready_s of each bucket of ``layout``], each the
        median over the steps after the first (a warm-up): over their micro-batches, the
        optimizer over the steps. Synchronises the device once."""
        self.clock.synchronize()
        seconds = self.clock.seconds
        measured = self.steps[1:]
        micro = [m for step in measured for m in step.micro_batches]
        columns = [
            [seconds(m.start, m.forward_end) for m in micro],
            [seconds(m.forward_end, m.backward_end) for m in micro],
            [seconds(step.micro_batches[-1].backward_end, step.optimizer_end) for step in measured],
            # bucket k is ready when the last of its parameters is: max over its parameters
            *([max(seconds(m.forward_end, m.param_ready[i]) for i in bucket) for m in micro] for bucket in layout),
        ]
        return [statistics.median(column) for column in columns]


def profile(
    slowest_medians: Sequence[float],
    layout: Sequence[Sequence[int]],
    layout_source: str,
    sizes_bytes: Sequence[int],
    bucket_cap_mb: float | None,
    steps: int,
    micro_batches_per_step: int,
) -> dict[str, Any]:
    """The record's ``backward_buckets`` from ``PhaseRecorder.medians`` (the slowest rank's)."""
    first_cap, cap = bucket_caps_bytes(bucket_cap_mb)
    forward_s, backward_s, optimizer_s, *ready_s = slowest_medians
    return {
        "steps": steps,
        "reason": None,
        "layout_source": layout_source,
        "first_bucket_cap_bytes": first_cap,
        "bucket_cap_bytes": cap,
        "gradient_bytes": sum(sizes_bytes),
        "micro_batches_per_step": micro_batches_per_step,
        "forward_s": forward_s,
        "backward_s": backward_s,
        "optimizer_s": optimizer_s,
        "buckets": [{"bytes": sum(sizes_bytes[i] for i in bucket), "parameters": len(bucket), "ready_s": ready} for bucket, ready in zip(layout, ready_s)],
    }
