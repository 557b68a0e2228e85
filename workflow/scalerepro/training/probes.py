"""The probes after training: exposed communication and the backward's DDP buckets, each timing the trainer's own step function.

Both run after the measured window (no timed step carries a probe's hooks), on identical,
pre-built batches (the loader is out of their timings), and take real optimizer steps inside
``preserved_state``, which puts the run's final state back as training left it. They are handed
what they need (``ProbedRun``: the step function, the run's state, its batches, its
parallel form), never the trainer. Both are collectives when the run has several ranks: every
rank must call them.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map

from scalerepro.common.probe_off import PROBE_OFF_REASON
from scalerepro.data import sources
from scalerepro.record.measured import ExposedCommunication
from scalerepro.telemetry import metrics
from scalerepro.trainer_flags import RunConfig
from scalerepro.training import buckets, checkpoint_store
from scalerepro.training.allreduce_timing import AllReduceTiming
from scalerepro.training.distributed import DistContext, all_reduce_max, gather_objects, max_over_ranks
from scalerepro.training.run_state import RunState


class StepFunction(Protocol):
    """The trainer's optimizer step as the probes take it (``Trainer.probe_step``): one step over
    the micro-batches it is given, returning the mean loss on the device, never stepping the LR
    scheduler."""

    def __call__(
        self,
        micro_batches: Iterator[sources.Batch],
        *,
        sync_gradients: bool,
        eager: bool = False,
        marks: buckets.PhaseRecorder | None = None,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class ProbedRun:
    """What the probes need of the run they probe."""

    step: StepFunction
    state: RunState  # what the probe's steps change, restored afterwards (preserved_state)
    batches: Callable[[int], list[list[sources.Batch]]]  # the micro-batches of up to n steps, held in memory
    ctx: DistContext
    ddp: DistributedDataParallel | None  # None on one process and when sharded
    sharded_by: str | None  # the --parallel strategy whose mesh holds the model (fsdp, tp, fsdp+tp, pp); None under DDP
    bucket_cap_mb: float
    grad_accum_steps: int
    stop_requested: Callable[[], bool] = lambda: False  # a stop signal reached this rank
    # the all-reduce timing hook's state (allreduce_timing), None where it is not installed: the
    # probe's timed sync steps mark their all-reduce on the probe's timer
    allreduce_timing: AllReduceTiming | None = None


STOPPED = "stopped by a signal during the probe"


def stop_agreed(run: ProbedRun) -> bool:
    """Whether a stop signal reached any rank (a collective: every rank calls it at the same
    point, so all leave a probe's loop together). As an all-reduce it also lines the ranks up."""
    flag = torch.tensor([float(run.stop_requested())], device=run.ctx.device)
    return bool(all_reduce_max(run.ctx, flag).item())


def exposed_not_measured(reason: str, fraction: float | None = None) -> dict[str, Any]:
    """The record's ``exposed_communication`` where the probe did not time anything: each of its
    fields null but these."""
    return {**dict.fromkeys(ExposedCommunication.model_fields), "fraction": fraction, "steps": 0, "reason": reason}


@contextlib.contextmanager
def preserved_state(state: RunState) -> Iterator[None]:
    """Everything a step changes (model, optimizer, LR scheduler, loss scaler, this rank's
    RNG states) as it was on entry, restored on exit: the probes after training take real
    steps and must leave the run's final state as training left it."""
    # the model's and the optimizer's copies go to host memory: on the GPU a second model and
    # a second AdamW state (8 bytes a parameter: 10 GB for llama_1b) may not fit beside the
    # run's own; load_state_dict moves the optimizer's back to each parameter's device
    to_host = lambda value: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else copy.deepcopy(value)  # noqa: E731
    saved = {
        "model": {k: to_host(v) for k, v in state.module.state_dict().items()},
        "optimizer": tree_map(to_host, state.optimizer.state_dict()),
        "scheduler": copy.deepcopy(state.scheduler.state_dict()),
        "scaler": copy.deepcopy(state.scaler.state_dict()),
        "rng": checkpoint_store.rng_state(),
    }
    try:
        yield
    finally:
        state.module.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        state.scheduler.load_state_dict(saved["scheduler"])
        state.scaler.load_state_dict(saved["scaler"])
        checkpoint_store.set_rng_state(saved["rng"])


def buffers_broadcast_like_a_training_step(ddp: DistributedDataParallel, sync: bool) -> None:
    """Whether the next step's forward broadcasts the module's buffers (BatchNorm's running
    statistics, ``broadcast_buffers``) from rank 0: yes for a step with the all-reduce, as every
    training step does, no for one without it (compute alone).

    DDP decides at a forward from what the step before did (``require_forward_param_sync``,
    set after each forward: true when it synchronised gradients). Left alone, a sync step right
    after a no-sync step would skip the broadcast and a no-sync step right after a sync step would
    pay it: the probe alternates the two, which moved a broadcast's time from the one to the other."""
    ddp.require_forward_param_sync = sync


# Measured steps of one kind in a row: short runs, so that a burst of load from elsewhere on the
# host or GPU falls on both kinds alike, not on one kind's long block.
PROBE_RUN = 3


def probe_schedule(steps: int) -> list[tuple[bool, bool]]:
    """The exposed-communication probe's steps in order, each (sync, timed): a warm-up step, then
    runs of ``PROBE_RUN`` no-sync steps, each followed by an untimed sync step and the same
    batches' sync steps, until ``steps`` of each kind are timed.

    A timed sync step follows a sync step, as every step of the window does: the all-reduce of
    the step before lined the ranks up. A sync step right after a no-sync step would count the
    ranks' drift during it (the last step's straggler) as its own communication; one right after
    a barrier times faster than the window's steps (benchmarks/README.md): neither is the step the
    window measures."""
    schedule = [(False, False)]
    for first in range(0, steps, PROBE_RUN):
        run = min(PROBE_RUN, steps - first)
        schedule += [(False, True)] * run + [(True, False)] + [(True, True)] * run
    return schedule


# What each probe's statistics need at least: the communication probe one run of each kind (a
# median of 3), the bucket probe one timed step (after its warm-up step).
COMM_PROBE_FLOOR = PROBE_RUN
BUCKET_PROBE_FLOOR = 1


def comm_probe_length(steps: int) -> int:
    """Steps the communication probe takes for ``steps`` timed of each kind (probe_schedule)."""
    return len(probe_schedule(steps)) if steps else 0


@dataclass(frozen=True)
class ProbeSizes:
    """How many steps each probe takes within a time budget, and why."""

    comm_steps: int
    bucket_steps: int
    reason: str

    def record(self, budget_s: float, step_s: float) -> dict[str, Any]:
        return {"budget_s": budget_s, "step_s": step_s, "comm_probe_steps": self.comm_steps, "bucket_probe_steps": self.bucket_steps, "reason": self.reason}


def sized_by_time(budget_s: float, step_s: float, comm_wanted: int, bucket_wanted: int, communicates: bool) -> ProbeSizes:
    """The probes' step counts within ``budget_s`` at ``step_s`` a step: each first gets its floor
    (COMM_PROBE_FLOOR, BUCKET_PROBE_FLOOR, or what was asked where that is less), then the
    communication probe grows up to ``comm_wanted`` while the two fit, then the bucket probe up to
    ``bucket_wanted``. The bucket probe takes steps + 1 steps (its warm-up), the communication probe
    comm_probe_length(steps); one that does not run (no gradient communication) takes none. Floors
    are kept over the budget: fewer steps would measure nothing worth the time."""
    comm = min(comm_wanted, COMM_PROBE_FLOOR) if communicates else 0
    bucket = min(bucket_wanted, BUCKET_PROBE_FLOOR)
    cost = lambda c, b: (comm_probe_length(c) + (b + 1 if b else 0)) * step_s  # noqa: E731
    while communicates and comm < comm_wanted and cost(comm + 1, bucket) <= budget_s:
        comm += 1
    while bucket < bucket_wanted and cost(comm, bucket + 1) <= budget_s:
        bucket += 1
    over = cost(comm, bucket) > budget_s
    reason = (
        f"{comm} timed steps of each kind and {bucket} bucket steps: {cost(comm, bucket):.2f} s at {step_s * 1e3:.0f} ms a step, "
        f"{'over' if over else 'within'} the probes' {budget_s:g} s{' (their floors)' if over else ''}"
    )
    return ProbeSizes(comm, bucket, reason)


def sized_for_run(run: RunConfig, timer: metrics.StepTimer, ctx: DistContext, communicates: bool) -> tuple[ProbeSizes, dict[str, Any] | None]:
    """The probes' step counts: --comm-probe-steps and --bucket-probe-steps, or as many as fit
    --probe-budget-s at the window's median step (the slowest rank's: every rank agrees), with
    the record's account of the budget (measurements.probe_budget; None without one). A
    collective where a budget is set."""
    if run.probe_budget_s <= 0:
        return ProbeSizes(run.comm_probe_steps, run.bucket_probe_steps, "the step counts asked for (no --probe-budget-s)"), None
    step_s = max_over_ranks(ctx, metrics.window_stats(timer).step_time_median_s or 0.0)
    sizes = sized_by_time(run.probe_budget_s, step_s, run.comm_probe_steps, run.bucket_probe_steps, communicates)
    return sizes, sizes.record(run.probe_budget_s, step_s)


def exposed_communication(run: ProbedRun, steps: int) -> dict[str, Any]:
    """Exposed communication and the wait for the slowest rank: the same steps timed with and
    without the gradient all-reduce, on identical, pre-built batches (the loader is out of the
    picture), in short runs of each kind (``probe_schedule``). Every rank's step times are
    gathered; with t_r,i rank r's time of step i and med_i the median over the probe's ``steps``
    (``--comm-probe-steps``) steps of each kind:

        sync_step_s          = med_i max_r t_r,i(sync)        (every rank leaves the all-reduce together)
        nosync_step_s        = max_r med_i t_r,i(no sync)     (the slowest rank's median, as before)
        nosync_rank_mean_s   = med_i mean_r t_r,i(no sync)    (the typical rank's compute alone)
        straggler_wait_s     = med_i (max_r - mean_r) t_r,i(no sync)
                               (what a typical rank waits at a synchronisation for the slowest: the
                               ranks' steps without sync are independent draws, so the spread of one
                               step over the ranks is the wait the all-reduce imposes)
        sync_compute_rank_mean_s = med_i mean_r (t_r,i(sync) - w_r,i)
                               (the typical rank's sync step less its wait at the backward's end for
                               the all-reduce, w (allreduce_timing): the work of a step whose backward
                               the all-reduce overlaps; against nosync_rank_mean_s, what the overlap
                               costs the backward. None where the all-reduce is not timed)
        exposed_fraction     = (sync_step_s - nosync_step_s) / sync_step_s

    The ranks agree whether to stop (a collective, so a barrier) before every step but a timed
    sync step, whose predecessor's all-reduce lines them up instead: a stop is honoured within
    ``PROBE_RUN`` + 1 steps. Each no-sync step starts from that barrier, so that the ranks' times
    of one step are independent draws. The steps leave the LR scheduler alone (OneCycleLR refuses
    steps past the run's end); the run's state is restored afterwards.
    """
    if run.sharded_by is not None:  # the probe switches DDP's all-reduce off; FSDP has no such switch
        return exposed_not_measured(f"not measured under --parallel {run.sharded_by}: the probe times DDP with and without no_sync")
    if run.ddp is None or steps == 0:
        reason = "single process: no gradient communication" if run.ddp is None else PROBE_OFF_REASON
        return exposed_not_measured(reason, 0.0 if run.ddp is None else None)
    device = run.ctx.device
    timers = {True: metrics.StepTimer(device), False: metrics.StepTimer(device)}
    with preserved_state(run.state):
        groups = run.batches(steps)  # inside: reading them may draw random numbers
        done = {True: 0, False: 0}  # timed steps of each kind so far: the i-th of each takes batch i
        for sync, timed in probe_schedule(steps):
            if not (sync and timed) and stop_agreed(run):
                return exposed_not_measured(STOPPED)
            buffers_broadcast_like_a_training_step(run.ddp, sync)
            batch = iter(groups[done[sync] % len(groups)])
            if not timed:
                run.step(batch, sync_gradients=sync)
                continue
            timers[sync].start()
            with run.allreduce_timing.marking(timers[sync]) if run.allreduce_timing else contextlib.nullcontext():
                run.step(batch, sync_gradients=sync)
            timers[sync].stop(0, measured=True)
            done[sync] += 1
        # rank -> kind -> seconds of its timed steps
        mine: dict[bool | str, list[float] | list[float | None]] = {sync: timers[sync].durations_s() for sync in (True, False)}
        mine["wait"] = timers[True].allreduce_waits_s()
    ranks = gather_objects(run.ctx, mine)
    sync_steps = np.array([rank[True] for rank in ranks])  # ranks x steps
    nosync_steps = np.array([rank[False] for rank in ranks])
    timed = all(wait is not None for rank in ranks for wait in rank["wait"])
    per_step_compute = (sync_steps - np.array([rank["wait"] for rank in ranks], dtype=float)).mean(axis=0) if timed else None
    sync_compute = float(np.median(per_step_compute)) if per_step_compute is not None else None
    # the probe's own precision: the standard error of the overlap cost (sync compute - no-sync
    # step, typical rank), sqrt(s_sync^2 / n + s_nosync^2 / n) over its n timed steps of each kind
    nosync_means = nosync_steps.mean(axis=0)
    overlap_se = (
        float(math.sqrt(np.var(per_step_compute, ddof=1) / len(per_step_compute) + np.var(nosync_means, ddof=1) / len(nosync_means)))
        if per_step_compute is not None and len(nosync_means) >= 2
        else None
    )
    t_sync = float(np.median(sync_steps.max(axis=0)))
    t_nosync = float(np.median(nosync_steps, axis=1).max())
    return {
        "fraction": max(t_sync - t_nosync, 0.0) / t_sync,
        "sync_step_s": t_sync,
        "nosync_step_s": t_nosync,
        "nosync_rank_mean_s": float(np.median(nosync_steps.mean(axis=0))),
        "straggler_wait_s": float(np.median(nosync_steps.max(axis=0) - nosync_steps.mean(axis=0))),
        "sync_compute_rank_mean_s": sync_compute,
        "overlap_cost_se_s": overlap_se,
        "steps": steps,
        "reason": None,
    }


def backward_buckets(run: ProbedRun, steps: int) -> dict[str, Any]:
    """Forward, backward (with each DDP bucket's ready time) and optimizer of this run's own
    step, timed over ``steps`` (``--bucket-probe-steps``) steps after a warm-up step, eager and
    without gradient synchronisation (scalerepro.training.buckets says why); the run's state is
    restored afterwards."""
    if steps == 0:
        return buckets.not_measured("--bucket-probe-steps 0")
    if run.sharded_by is not None:  # sharded: no DDP buckets to time
        return buckets.not_measured(f"--parallel {run.sharded_by}: gradients are reduce-scattered per FSDP unit, not in DDP buckets")
    module, optimizer, device = run.state.module, run.state.optimizer, run.ctx.device
    params = [p for p in module.parameters() if p.requires_grad]  # DDP's parameter order
    sizes = [p.numel() * p.element_size() for p in params]  # gradients have the parameter's dtype
    recorder = buckets.PhaseRecorder(metrics.DeviceClock(device))
    out_of_memory = None
    with preserved_state(run.state):
        groups = run.batches(steps + 1)  # inside: reading them may draw random numbers
        try:
            with recorder.watching(params):
                for step in range(steps + 1):
                    if stop_agreed(run):
                        return buckets.not_measured(STOPPED)
                    batches = iter(groups[step % len(groups)])
                    run.step(batches, sync_gradients=False, eager=True, marks=recorder)
        except torch.OutOfMemoryError as error:
            # The eager model can need more memory than the compiled one the run trained
            # (llama_1b at 8 x 2048 on an H100: fp32 logits the compiled loss never holds).
            # The run's figures are complete; the probe is not measured, and says why.
            out_of_memory = ". ".join(str(error).split(". ")[:2])  # "CUDA out of memory. Tried to allocate 7.83 GiB"
            optimizer.zero_grad(set_to_none=True)
    # The probe's steps run no collective, so a rank out of memory cannot strand its peers;
    # all learn here whether any rank ran out, and all leave the probe alike.
    anywhere = all_reduce_max(run.ctx, torch.tensor([float(out_of_memory is not None)], device=device)).item()
    if anywhere:
        where = out_of_memory or "on another rank"
        return buckets.not_measured(f"the eager probe steps ran out of device memory ({where}): lower --per-gpu-batch, or --bucket-probe-steps 0")
    if len(recorder.ready_order) != len(params):
        unused = len(params) - len(recorder.ready_order)
        return buckets.not_measured(f"{unused} parameters got no gradient in the backward: DDP's bucket timing needs every parameter used")
    layout, source = buckets.choose_layout(sizes, recorder.ready_order, run.bucket_cap_mb, run.ddp)
    medians = torch.tensor(recorder.medians(layout), dtype=torch.float64, device=device)
    slowest = all_reduce_max(run.ctx, medians).tolist()
    return buckets.profile(slowest, layout, source, sizes, run.bucket_cap_mb, steps, run.grad_accum_steps)
