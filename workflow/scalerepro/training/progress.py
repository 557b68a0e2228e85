"""Where the run is and what it shows of it: the position a checkpoint saves, the running loss, rank 0's progress bar.

``Progress`` is the run's position (saved in checkpoints, the record's history); ``RunningLoss``
the step losses summed on the device between log points (no host synchronisation inside a
step); ``progress_bar`` tqdm's bar on rank 0 when asked for (``--progress``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Progress:
    """Where the run is; saved in checkpoints."""

    step: int = 0  # optimizer steps completed
    epoch: int = 0
    micro_in_epoch: int = 0  # micro-batches of ``epoch`` already consumed
    epoch_steps: int = 0  # optimizer steps taken in ``epoch``
    epoch_loss_sum: float = 0.0  # sum over ranks and steps of ``epoch``'s step losses (at checkpoints)
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per evaluated epoch

    def close_epoch(self, entry: dict[str, Any], complete: bool, held_out: int, eval_budget_s: float) -> str:
        """Append the epoch's history ``entry`` (of ``held_out`` held-out samples, evaluated within
        --eval-budget-s ``eval_budget_s``), start the next epoch where this one is ``complete``, and
        return the epoch's log line."""
        self.history.append(entry)
        summary = ", ".join(f"{k} {v:.4f}" for k, v in entry.items() if isinstance(v, float))
        if "eval_samples" in entry and entry["eval_samples"] < held_out:
            summary += f" (over {entry['eval_samples']} of {held_out} held-out samples: --eval-budget-s {eval_budget_s:g})"
        line = f"epoch {self.epoch} {'done' if complete else 'so far'} at step {self.step}: {summary}"
        if complete:
            self.epoch, self.micro_in_epoch, self.epoch_steps, self.epoch_loss_sum = self.epoch + 1, 0, 0, 0.0
        return line


class RunningLoss:
    """Step losses summed on the device (no host synchronisation inside a step), read only at
    log points and epoch ends; the first step whose loss was not finite."""

    def __init__(self, device: torch.device, epoch_sum_so_far: float):
        self.epoch = torch.zeros((), device=device)
        self.epoch += epoch_sum_so_far
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self.interval = torch.zeros((), device=device)  # since the previous log point
        self.new_interval()

    def new_interval(self) -> None:
        self.interval.zero_()
        self.interval_steps = 0
        self.interval_started = time.perf_counter()  # host clock at the log point

    def add(self, loss: torch.Tensor, step: int) -> None:
        self.interval += loss
        self.epoch += loss
        self.first_bad_step = torch.where((self.first_bad_step < 0) & ~torch.isfinite(loss), step, self.first_bad_step)
        self.interval_steps += 1


class ProgressBar:
    """tqdm's bar on rank 0 when asked for (``--progress``), else nothing; log lines go through
    ``write`` so that they do not tear the bar."""

    def __init__(self, bar: Any, log: Callable[[str], Any]):
        self._bar, self._log = bar, log

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def write(self, line: str) -> None:
        (self._bar.write if self._bar is not None else self._log)(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextlib.contextmanager
def progress_bar(mode: str, is_main: bool, total_steps: int, initial_step: int, log: Callable[[str], Any]) -> Iterator[ProgressBar]:
    """The bar of ``--progress`` ``mode`` (on; off; auto: where stderr is a terminal), on rank 0
    only; closed on exit."""
    bar = None
    if is_main and (mode == "on" or (mode == "auto" and sys.stderr.isatty())):
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True)
    shown = ProgressBar(bar, log)
    try:
        yield shown
    finally:
        shown.close()
