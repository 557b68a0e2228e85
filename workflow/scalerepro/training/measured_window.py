"""The measured window's ends: this process's warm-up (--warmup-steps, or more until the step time
settles: --warmup-max-steps, --warmup-settle), and the steps a window shorter than --min-window-s
or --min-window-steps is missing. Each process warms up anew, a resumed one too: compilation happens per process."""

from __future__ import annotations

import math

import torch

from scalerepro.telemetry import metrics
from scalerepro.telemetry.metrics import StepTimer
from scalerepro.trainer_flags import RunConfig
from scalerepro.training.distributed import DistContext, all_reduce_max, max_over_ranks


class Warmup:
    """``steps`` and ``reason`` say what was decided (the record's steps); ``done`` once the
    measured window has started."""

    def __init__(self, run: RunConfig):
        self.run = run
        self.steps = run.warmup_steps
        self.reason = f"{run.warmup_steps} steps (--warmup-steps)"
        self.done = False

    def measured(self, taken: int, timer: StepTimer, ctx: DistContext) -> bool:
        """Whether the next step is measured, ``taken`` steps into this process's run. Past
        --warmup-steps, with --warmup-max-steps, the warm-up goes on while the last two steps' times
        differ by more than --warmup-settle (relative), up to --warmup-max-steps: a collective, so
        that every rank starts its window at one step (the largest change over the ranks decides)."""
        run = self.run
        if self.done:
            return True
        if taken < self.steps:
            return False
        if run.warmup_max_steps > run.warmup_steps and taken < run.warmup_max_steps:
            times = timer.durations_s()[-2:]  # the last two warm-up steps (synchronises the device)
            change = abs(times[1] - times[0]) / max(times[0], 1e-12) if len(times) == 2 else math.inf
            change = max_over_ranks(ctx, change)
            if change > run.warmup_settle:
                self.steps = taken + 1
                self.reason = f"{self.steps} steps: the step time still changed {100 * change:.0f} % > {100 * run.warmup_settle:g} % after {taken}"
                return False
            self.reason = f"{taken} steps: settled within {100 * run.warmup_settle:g} % (at least {run.warmup_steps}, at most {run.warmup_max_steps})"
        elif run.warmup_max_steps > run.warmup_steps:
            self.reason = f"{taken} steps: the most --warmup-max-steps allows (the step time had not settled within {100 * run.warmup_settle:g} %)"
        self.done = True
        return True


def steps_missing(wanted_s: float, wanted_steps: int, timer: StepTimer, ctx: DistContext) -> tuple[int, float]:
    """At the last step: the steps a window shorter than ``wanted_s`` (--min-window-s) or of fewer
    than ``wanted_steps`` steps (--min-window-steps) is missing, or 0, and the window's seconds.
    The seconds' shortfall is counted in median steps (at least one; the new last step is checked
    again). A collective: every rank takes the slowest rank's window and median, so all agree."""
    if wanted_s <= 0 and wanted_steps <= 0:
        return 0, 0.0
    stats = metrics.window_stats(timer)  # synchronises the device once
    window_s, median_s = all_reduce_max(ctx, torch.tensor([stats.seconds, stats.step_time_median_s or 0.0], dtype=torch.float64, device=ctx.device)).tolist()
    # every rank times the same steps, so the count needs no agreement
    short_of_steps = max(wanted_steps - stats.steps, 0)
    if window_s >= wanted_s or median_s <= 0:
        return short_of_steps, window_s
    return max(1, short_of_steps, math.ceil((wanted_s - window_s) / median_s)), window_s
