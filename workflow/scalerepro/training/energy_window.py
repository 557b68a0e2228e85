"""The measured window's GPU energy, host load and peak memory, from the first measured step to the last.

The window is opened when training starts (``EnergyWindow.for_device``: this rank's GPU's power
before step 1 is read first, with its CUDA context up and nothing queued on it: not the card's
idle, which reads lower with no context), started at the first measured step and stopped after
the last one (before the end-of-run evaluation and the probes) or when training fails; it is
paused around anything inside it that is not a training step (evaluation, checkpoints). It is
stopped and paused with the device synchronised, so that the steps' work lies inside it. It still
holds the host's time between steps (log points), which the steps' own seconds (``window_s``,
CUDA events) do not: energy per sample in the runs table is the window's mean power x the steps'
seconds / their samples (scalerepro.record.columns.energy_per_sample), one window for both.

At the start the device is synchronised (the warm-up steps' queued work must not fall inside
the energy window) and the allocator's peaks are reset, so that the peak memory of the record
is the measured steps' own: not warm-up autotuning, evaluation, or the probes after training
(on an H100 the eager bucket probe raised llama_1b's peak from 42.7 to 65.0 GiB).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from scalerepro.telemetry import hostload, metrics
from scalerepro.telemetry.nvml import NvmlSampler, idle_power, nvml_uuid_for_torch_device


class EnergyWindow:
    """NVML's sampler of this rank's GPU, the host's other CPU load and the device's peak memory
    over the measured steps; their figures are set when the window stops."""

    def __init__(self, sampler: NvmlSampler, host_load: hostload.HostLoad, device: torch.device):
        self.sampler, self.host_load, self.device = sampler, host_load, device
        self.sampling = False
        self.nvml_summary: dict[str, Any] | None = None  # all three set when the window stops
        self.host_activity: dict[str, Any] | None = None
        self.peak_memory: metrics.PeakMemory | None = None

    @classmethod
    def for_device(cls, device: torch.device, nvml_interval_s: float, nvml_idle_s: float) -> EnergyWindow:
        """The window of this rank's device, not yet started. Its GPU's power before step 1
        (scalerepro.telemetry.nvml.idle_power) is read now, with the CUDA context up and nothing
        queued on the GPU; the energy figures are reported above it too."""
        gpu_uuid = nvml_uuid_for_torch_device(device.index) if device.type == "cuda" else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        idle = idle_power(gpu_uuid, nvml_idle_s, nvml_interval_s)
        # what else used this node's CPUs during the window
        return cls(NvmlSampler(gpu_uuid, nvml_interval_s, idle), hostload.HostLoad(), device)

    def start(self) -> None:
        if not self.sampling:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            self.sampler.start()
            self.host_load.start()
            self.sampling = True

    def stop(self) -> None:
        if self.sampling:
            if self.device.type == "cuda":  # the measured steps' queued work ends inside the window
                torch.cuda.synchronize(self.device)
            self.nvml_summary = self.sampler.stop()
            self.host_activity = self.host_load.stop()
            self.peak_memory = metrics.peak_memory(self.device)
            self.sampling = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """What runs inside is not a training step: the sampler pauses (a no-op when it is not
        sampling), so energy per sample covers the measured steps only; the steps' queued work
        ends before the pause."""
        if self.sampling and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.sampler.pause()
        try:
            yield
        finally:
            self.sampler.resume()
