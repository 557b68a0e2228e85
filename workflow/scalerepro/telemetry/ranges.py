"""Profiling instrumentation of the trainer: named ranges, the DDP all-reduce hook, the window.

Three modes (``--profile-mode``):

``none``      (default) nothing happens: :func:`annotate` hands back one shared no-op context
              manager (the all-reduce hook, which scalerepro.training.allreduce_timing wraps to
              time the window's waits, opens no range), no profiler API is called. The training loop
              pays one function call per range and nothing else (no host sync, no allocation).
``cuda_api``  for an external tool (Nsight Systems, Nsight Compute) started with a capture range
              on the CUDA profiler API: NVTX ranges (``torch.cuda.nvtx``) around data loading,
              forward, backward, optimizer step and each DDP bucket's all-reduce, and
              ``cudaProfilerStart``/``Stop`` (``torch.cuda.profiler``) around steps K .. K+M-1, so
              the tool records only steady-state steps.
``torch``     the fallback where no Nsight tool is available (a laptop, a CPU run, a cluster
              without Nsight): ``torch.profiler`` over the same steps on rank 0, the same ranges
              as ``record_function`` annotations, written as a Chrome/Perfetto trace
              (``trace.json``) and an operator table (``operators.csv``).

The ranges are named ``scalerepro:<what>`` (see :data:`scalerepro.common.range_names.RANGES`); the analysis side
(``scalerepro.analysis.profiles.captures``) finds them by these names in the Nsight SQLite export and in the
Chrome trace alike.
"""

# No "from __future__ import annotations": DDP checks the hook's annotations at runtime.
import contextlib
import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scalerepro.common.range_names import RANGE_PREFIX

_NO_RANGE = contextlib.nullcontext()
_open_range: Callable[[str], contextlib.AbstractContextManager] | None = None


def _nvtx_range(name: str) -> contextlib.AbstractContextManager:
    return torch.cuda.nvtx.range(name)


def _torch_range(name: str) -> contextlib.AbstractContextManager:
    return torch.profiler.record_function(name)


def annotate(what: str) -> contextlib.AbstractContextManager:
    """A named range around ``what`` (one of :data:`scalerepro.common.range_names.RANGES`) when profiling, else a shared no-op."""
    if _open_range is None:
        return _NO_RANGE
    return _open_range(RANGE_PREFIX + what)


def enable_ranges(mode: str, device: torch.device) -> None:
    """Turn the ranges on for ``mode``: NVTX under an external tool on CUDA, ``record_function``
    under the torch profiler. On a CPU under ``cuda_api`` there is nothing to mark for: no-op."""
    global _open_range
    if mode == "cuda_api" and device.type == "cuda":
        _open_range = _nvtx_range
    elif mode == "torch":
        _open_range = _torch_range
    else:
        _open_range = None


def nvtx_allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (``default_hooks.allreduce_hook``: sum, then divide by the world
    size) inside a range named after the bucket, so a timeline shows which bucket is in flight.
    The range covers the launch on the host; the collective itself is the NCCL kernel (Nsight) or
    the gloo op (torch profiler) that follows it."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    with annotate("allreduce"), annotate(f"allreduce_bucket_{bucket.index()}"):
        return default_hooks.allreduce_hook(state, bucket)


@dataclass
class ProfileWindow:
    """Steps ``start`` .. ``start + steps - 1`` (0-based optimizer steps) under the profiler.

    ``before_step``/``after_step`` are called around every step; outside the window they compare
    two integers and return."""

    mode: str  # none | cuda_api | torch
    start: int
    steps: int
    out_dir: Path | None
    device: torch.device
    is_main: bool
    _profiler: Any = None
    captured_steps: int = 0

    @property
    def end(self) -> int:
        return self.start + self.steps  # first step after the window

    def _synchronize(self) -> None:
        # The window holds whole steps: earlier steps' kernels finish before it opens, its own
        # finish before it closes. Only ever called at the window's two edges.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def before_step(self, step: int) -> None:
        if step != self.start or self.mode == "none":
            return
        self._synchronize()
        if self.mode == "cuda_api":
            torch.cuda.profiler.start()
        elif self.mode == "torch" and self.is_main:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
            self._profiler.start()

    def after_step(self, step: int) -> None:
        if self.mode == "none" or not self.start <= step < self.end:
            return
        self.captured_steps += 1
        if step != self.end - 1:
            return
        self._synchronize()
        if self.mode == "cuda_api":
            torch.cuda.profiler.stop()
        elif self._profiler is not None:
            self._profiler.stop()
            self._write_torch_outputs()

    def _write_torch_outputs(self) -> None:
        """rank 0 writes trace.json (Chrome/Perfetto trace), operators.csv and window.json."""
        assert self.out_dir is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._profiler.export_chrome_trace(str(self.out_dir / "trace.json"))
        averages = self._profiler.key_averages()
        device_time = "device_time_total" if hasattr(averages[0], "device_time_total") else "cuda_time_total"
        rows = sorted(
            (
                {
                    "name": event.key,
                    "calls": event.count,
                    # times in microseconds, as torch.profiler reports them
                    "cpu_time_total_us": event.cpu_time_total,
                    "self_cpu_time_total_us": event.self_cpu_time_total,
                    "device_time_total_us": getattr(event, device_time, 0.0),
                    "self_device_time_total_us": getattr(event, "self_" + device_time, 0.0),
                }
                for event in averages
            ),
            key=lambda row: (-row["self_device_time_total_us"], -row["self_cpu_time_total_us"], row["name"]),
        )
        with open(self.out_dir / "operators.csv", "w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        window = {"start_step": self.start, "steps": self.steps, "captured_steps": self.captured_steps, "device": self.device.type, "torch": torch.__version__}
        (self.out_dir / "window.json").write_text(json.dumps(window, indent=2) + "\n")
        self._profiler = None
