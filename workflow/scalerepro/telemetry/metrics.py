"""What a run measures, and the formula of each figure beside its code.

Step timing never synchronises the host inside the loop: on CUDA each step, and each fetch of its
input, is bracketed by two CUDA events recorded on the current stream and read once, after the
loop; on the CPU the work is synchronous and ``time.perf_counter`` brackets it. Anything outside
the brackets (evaluation, checkpointing) is outside every figure below.
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import TypedDict, cast

import torch


@dataclass
class StepRecord:
    epoch: int
    measured: bool  # inside the measured window (after --warmup-steps)
    data_waits: list[tuple[object, object]] = field(default_factory=list)  # clock marks around each fetch of an input batch
    allreduce: AllReduceMarks | None = None  # the step's gradient all-reduce, where one ran and was timed


@dataclass
class AllReduceMarks:
    """One step's gradient all-reduce on the step timer's clock: a mark as each DDP bucket is
    launched (its gradients are ready: the last launch is where the backward's compute ends) and
    one as each completes (scalerepro.training.allreduce_timing marks them)."""

    launched: list[object] = field(default_factory=list)
    completed: list[object] = field(default_factory=list)


class DeviceClock:
    """Time marks that never synchronise the host: on CUDA an event recorded on the current
    stream, on the CPU (synchronous work) a ``time.perf_counter`` reading. Read marks with
    ``seconds`` only after ``synchronize``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, start: object, end: object) -> float:
        # the marks are now()'s: CUDA events on CUDA, perf_counter readings elsewhere
        if self.cuda:
            return cast(torch.cuda.Event, start).elapsed_time(cast(torch.cuda.Event, end)) / 1e3  # elapsed_time is in ms
        return cast(float, end) - cast(float, start)


class StepTimer:
    """Start/end marks per step; durations are read after the loop with one synchronisation."""

    def __init__(self, device: torch.device):
        self.clock = DeviceClock(device)
        self.steps: list[StepRecord] = []
        self._marks: list[tuple[object, object]] = []
        self._open: object | None = None
        self._open_waits: list[tuple[object, object]] = []
        self._open_allreduce: AllReduceMarks | None = None

    def start(self) -> None:
        self._open = self.clock.now()
        self._open_waits = []
        self._open_allreduce = None

    def allreduce_launched(self) -> AllReduceMarks | None:
        """A mark as a bucket's all-reduce is launched inside the open step; the step's marks are
        returned for the bucket's completion mark (which may come on another thread: gloo
        completes a collective on its own). None outside an open step."""
        if self._open is None:
            return None
        if self._open_allreduce is None:
            self._open_allreduce = AllReduceMarks()
        self._open_allreduce.launched.append(self.clock.now())
        return self._open_allreduce

    def data_wait_started(self) -> object | None:
        """A clock mark before the open step fetches an input batch; None outside an open step (a
        probe after the loop, timed by a timer of its own: its waits belong to no step here)."""
        return self.clock.now() if self._open is not None else None

    def data_wait_ended(self, started: object | None) -> None:
        """The mark after the fetch. The wait is read on the device clock: on CUDA the two events
        complete on the stream, so their gap is what the device spent between the step's work
        before the fetch and the batch's first work after it: the loader's own kernels, and the
        idle time only where the host was still fetching when the device ran dry. A host that
        runs ahead of the device (CUDA graphs, a full launch queue) can block inside the fetch
        while the device is busy; that is no stall and is not counted. On the CPU the
        work is synchronous and the gap is the host's wait."""
        if started is not None and self._open is not None:
            self._open_waits.append((started, self.clock.now()))

    def stop(self, epoch: int, measured: bool) -> None:
        self._marks.append((self._open, self.clock.now()))
        self.steps.append(StepRecord(epoch, measured, self._open_waits, self._open_allreduce))
        self._open, self._open_waits, self._open_allreduce = None, [], None

    def durations_s(self) -> list[float]:
        """Seconds per step, in step order (synchronises the device once)."""
        self.clock.synchronize()
        return [self.clock.seconds(start, end) for start, end in self._marks]

    def data_waits_s(self) -> list[float]:
        """Seconds each step waited for its input (the sum over its fetches), in step order; read
        after ``durations_s`` (which synchronises)."""
        return [sum(self.clock.seconds(start, end) for start, end in step.data_waits) for step in self.steps]

    def allreduce_waits_s(self) -> list[float | None]:
        """Seconds each step waited at the end of its backward for its gradient all-reduce, in step
        order (None for a step that ran none, or untimed); read after ``durations_s``:

            wait = max(0, last bucket's completion - last bucket's launch)

        the last launch being where the step's gradients are all computed. It holds the
        all-reduce the backward did not hide and, at several ranks, the time this rank finished
        its backward before the slowest one did (no bucket completes before every rank has
        launched it)."""
        waits: list[float | None] = []
        for step in self.steps:
            marks = step.allreduce
            if marks is None or not marks.launched or len(marks.completed) < len(marks.launched):
                waits.append(None)  # none ran, or a bucket never completed inside the step
                continue
            last = marks.launched[-1]
            waits.append(max(0.0, max(self.clock.seconds(last, done) for done in marks.completed)))
        return waits


@dataclass
class WindowStats:
    """Throughput and step-time figures over the measured window of one rank."""

    steps: int
    seconds: float
    step_time_median_s: float | None
    step_time_p10_s: float | None
    step_time_p90_s: float | None
    step_time_mean_s: float | None
    epoch_seconds: dict[int, float] = field(default_factory=dict)  # every step's time, warm-up included
    data_wait_s: float = 0.0  # input waits of the measured steps only, device clock (a warm-up step's are not in the window)
    warmup_data_wait_s: float = 0.0  # input waits of the steps before the window


def window_stats(timer: StepTimer) -> WindowStats:
    durations = timer.durations_s()
    measured = [d for d, s in zip(durations, timer.steps) if s.measured]
    epoch_seconds: dict[int, float] = {}
    for duration, step in zip(durations, timer.steps):
        epoch_seconds[step.epoch] = epoch_seconds.get(step.epoch, 0.0) + duration
    # data wait of the window = sum of the waits of its steps; warm-up waits (DataLoader workers
    # starting, first batches) are apart, so that the stall fraction is over the window only
    waits = timer.data_waits_s()
    data_wait = sum(wait for wait, step in zip(waits, timer.steps) if step.measured)
    warmup_wait = sum(wait for wait, step in zip(waits, timer.steps) if not step.measured)
    if not measured:
        return WindowStats(0, 0.0, None, None, None, None, epoch_seconds, 0.0, warmup_wait)
    # Deciles with the 'inclusive' method: p10 and p90 interpolate between observed step times.
    deciles = statistics.quantiles(measured, n=10, method="inclusive") if len(measured) > 1 else [measured[0]] * 9
    return WindowStats(
        steps=len(measured),
        seconds=sum(measured),
        step_time_median_s=statistics.median(measured),
        step_time_p10_s=deciles[0],
        step_time_p90_s=deciles[8],
        step_time_mean_s=statistics.fmean(measured),
        epoch_seconds=epoch_seconds,
        data_wait_s=data_wait,
        warmup_data_wait_s=warmup_wait,
    )


def throughput(samples: int, seconds: float) -> float | None:
    """Samples per second over a window: samples / seconds (None for an empty window)."""
    return samples / seconds if seconds > 0 else None


def model_flops_utilization(flops_per_sample: float, samples_per_s: float | None, peak_flops_per_device: float | None, devices: int) -> float | None:
    """MFU = achieved model FLOP/s / (devices x peak dense FLOP/s per device), where achieved
    FLOP/s = analytic training FLOPs per sample x samples/s (Chowdhery et al. 2022, PaLM, App. B)."""
    if samples_per_s is None or not peak_flops_per_device:
        return None
    return flops_per_sample * samples_per_s / (devices * peak_flops_per_device)


class PeakMemory(TypedDict):
    allocated_bytes: int | None  # CUDA only
    reserved_bytes: int | None  # CUDA only
    rss_bytes: int


def peak_memory(device: torch.device) -> PeakMemory:
    """Peak memory of this process: CUDA caching-allocator peaks on a GPU, peak RSS on the CPU."""
    if device.type == "cuda":
        return {
            "allocated_bytes": torch.cuda.max_memory_allocated(device),
            "reserved_bytes": torch.cuda.max_memory_reserved(device),
            "rss_bytes": _peak_rss_bytes(),
        }
    return {"allocated_bytes": None, "reserved_bytes": None, "rss_bytes": _peak_rss_bytes()}


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
