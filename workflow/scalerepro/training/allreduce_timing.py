"""The measured window's steps split where their time goes: computing, waiting for the slowest
rank, waiting for the gradient all-reduce; timed inside the window's own steps.

A DDP communication hook runs DDP's own all-reduce (``ranges.nvtx_allreduce_hook``: the default
hook, sum then divide by the world size, in a named range when profiling) and marks, on the step
timer's clock, each bucket's launch (its gradients are ready) and its completion
(``StepTimer.allreduce_launched``; ``StepTimer.allreduce_waits_s`` reads the rank's wait at the
end of each step's backward). After the window every rank's steps are gathered and, with S the
step, D its input wait and W its all-reduce wait on rank r at measured step i:

    step_rank_mean_s            = mean_i mean_r S_r,i
    data_wait_rank_mean_s       = mean_i mean_r D_r,i
    compute_rank_mean_s         = mean_i mean_r (S_r,i - D_r,i - W_r,i)   (the typical rank's work)
    exposed_allreduce_wait_s    = mean_i min_r W_r,i
        the rank that finishes its backward last waits for the all-reduce alone: the
        communication its backward did not hide
    straggler_wait_s            = mean_i (mean_r W_r,i - min_r W_r,i)
        the others wait besides for that rank: no bucket completes before every rank launched it

so that compute + straggler wait + exposed wait + data wait = the typical rank's mean step,
each part taken from the same steps (means, not medians: the parts of a mean add up). The
exposed-communication probe after the window (``probes``) times the same step without the
all-reduce; the analysis takes from it only what the overlapped all-reduce costs the backward
(``loss_decomposition``).

On CUDA the marks are events on the current stream: a launch's on the backward's stream, a
completion's on the stream a CUDA future's callback runs on, which waits for the collective
(``torch.futures.Future.then``). The hook is not installed under CUDA graphs (a replay runs no Python), and costs one Python
call per bucket.
"""

# No "from __future__ import annotations": DDP checks the hook's annotations at runtime.
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scalerepro.common.cuda_graphs import replays_cuda_graphs
from scalerepro.record.measured import WindowSplit
from scalerepro.telemetry import metrics, ranges


class AllReduceTiming:
    """The hook's state: the step timer whose open step the all-reduce marks go to (the
    trainer's during the loop; the exposed-communication probe's during its sync steps)."""

    def __init__(self, timer: metrics.StepTimer):
        self.timer = timer

    @contextlib.contextmanager
    def marking(self, timer: metrics.StepTimer) -> Iterator[None]:
        """The marks go to ``timer`` inside, back to the one before on exit."""
        previous, self.timer = self.timer, timer
        try:
            yield
        finally:
            self.timer = previous


def timed_allreduce_hook(state: AllReduceTiming, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce of ``bucket``, with a mark at its launch and one at its completion."""
    marks = state.timer.allreduce_launched()
    future = ranges.nvtx_allreduce_hook(None, bucket)
    if marks is None:  # no step open (DDP's warm-up inside a probe's untimed step)
        return future
    clock = state.timer.clock

    def completed(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        marks.completed.append(clock.now())
        return done.value()

    return future.then(completed)


def install(
    ddp: DistributedDataParallel | None, timer: metrics.StepTimer, device: torch.device, compile_mode: str, profiling: bool
) -> tuple[AllReduceTiming | None, str | None]:
    """Register the timing hook on ``ddp``; (its state, None), or (None, why it is not timed).
    Where it is not timed, a profiled run still gets its all-reduces in named ranges."""
    if ddp is None:
        return None, "no DDP all-reduce (one process, or a sharded --parallel)"
    if replays_cuda_graphs(device.type, compile_mode):
        if profiling:
            ddp.register_comm_hook(None, ranges.nvtx_allreduce_hook)
        return None, f"not timed under --compile {compile_mode}: a CUDA graph replay runs no Python hook"
    timing = AllReduceTiming(timer)
    ddp.register_comm_hook(timing, timed_allreduce_hook)
    return timing, None


def not_measured(reason: str) -> dict[str, Any]:
    """The record's ``window_split`` where the window's steps were not split, and why: each of its
    fields null but these."""
    return {**dict.fromkeys(WindowSplit.model_fields), "steps": 0, "reason": reason}


def window_split(ranks: Sequence[dict[str, list[float | None]]], clock: str) -> dict[str, Any]:
    """The record's ``window_split`` (module docstring) from every rank's measured steps, in rank
    order: each a dict of equally long lists ``step``, ``data`` and ``allreduce`` (None where a
    step ran no timed all-reduce)."""
    counts = {len(rank["step"]) for rank in ranks}
    if len(counts) > 1:
        return not_measured("the ranks measured different numbers of steps")
    if counts == {0}:
        return not_measured("no measured steps")
    if any(wait is None for rank in ranks for wait in rank["allreduce"]):
        return not_measured("a measured step ran no timed all-reduce")
    step, data, wait = (np.array([rank[name] for rank in ranks], dtype=float) for name in ("step", "data", "allreduce"))  # ranks x steps
    return {
        "steps": int(step.shape[1]),
        "step_rank_mean_s": float(step.mean()),
        "data_wait_rank_mean_s": float(data.mean()),
        "compute_rank_mean_s": float((step - data - wait).mean()),
        "exposed_allreduce_wait_s": float(wait.min(axis=0).mean()),
        "straggler_wait_s": float((wait.mean(axis=0) - wait.min(axis=0)).mean()),
        "clock": clock,
        "reason": None,
    }
