"""GPU telemetry over a measured window: utilisation, memory, power against its limit, energy, SM
clock against its maximum, temperature, and why the clocks were held down.

One :class:`NvmlSampler` per rank watches that rank's GPU from a background thread while the
timed part of a benchmark runs. The reduction from samples to numbers, and the folding of the
per-GPU summaries into one for the run, are the pure functions of ``nvml_summary``, so the
arithmetic is tested without a GPU.

Nothing here raises because NVML or a GPU is missing: the summary then says ``available: False``,
every measured field is None and ``reason`` says why. That keeps a CPU smoke run and a cluster
run on the same code path and the same record shape.

What the NVML numbers mean (NVML API reference, "Device Queries"):

* utilisation (``nvmlDeviceGetUtilizationRates().gpu``) is the percentage of the driver's last
  sample period (1/6 s to 1 s) during which *any* kernel was executing. It says the GPU was busy,
  not how much of it was busy: one tiny kernel at a time reads 100 %.
* power (``nvmlDeviceGetPowerUsage``, mW) is an instantaneous reading on GA100 and older, and a
  1 s moving average on later architectures (Hopper included), so it lags fast load changes.
* energy (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver was last loaded, Volta and
  newer) is the driver's own integral, so it is preferred to integrating sampled power.
* the power limit (``nvmlDeviceGetEnforcedPowerLimit``, mW) is the one the card enforces, the least
  of every limit set on it; the maximum SM clock (``nvmlDeviceGetMaxClockInfo``, MHz) is the
  highest the card may run at. Both are read once per window: a card whose mean power sits at its
  limit and whose SM clock sits below its maximum is power capped.
* the clock-event reasons (``nvmlDeviceGetCurrentClocksEventReasons``, a bitmask; before nvidia-ml-py
  12.535 ``...ClocksThrottleReasons``) say why the clocks are below their maximum at the moment of
  the reading: ``sw_power_cap`` is the driver lowering them to hold the power limit,
  ``hw_slowdown`` and its kin are the hardware's emergency brakes, ``gpu_idle`` is nothing to do.

The window is the measured training steps only: the trainer pauses the sampler around what is
not training (evaluation, checkpoints) and the energy is summed over the active segments; the
window's seconds run from the first counter read to the last, less the pauses, so that energy /
seconds is the window's mean power (the power samples, 1 s moving averages on Hopper, lag it).
The GPU's power before the window (:func:`idle_power`, read after this process created its CUDA
context, with nothing queued: not the card's idle, which nvidia-smi reads lower with no context
up) is reported beside it, and the energy above it, ``E - P_before x active seconds``, with it.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from scalerepro.telemetry.nvml_summary import Sample, summarise, unavailable_summary

_T = TypeVar("_T")

# The clock-event reasons by the suffix of their constant in pynvml (nvmlClocksEventReason<suffix>,
# before nvidia-ml-py 12.535 nvmlClocksThrottleReason<suffix>), with the name the record gives them.
# The bits are the library's, read where decoded (clock_event_reason_bits), never written here.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
    # pynvml names these two under the older prefix only: decoded where the library has them
    ("board_limit", "BoardLimit"),
    ("reliability", "Reliability"),
)

# How long stop() waits for the sampling thread: generous, because a query can block on a busy
# driver, but bounded, so a wedged NVML call cannot hang the end of a benchmark.
_JOIN_TIMEOUT_S = 10.0


def format_nvml_uuid(cuda_uuid: str) -> str:
    """NVML's spelling of a GPU UUID, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``.

    CUDA (and so torch) prints the same 16 bytes as bare lower-case 8-4-4-4-12 hex; NVML prefixes
    ``GPU-``. Accepts either form so the conversion is idempotent.
    """
    bare = cuda_uuid.strip().lower()
    if bare.startswith("gpu-"):
        bare = bare[len("gpu-") :]
    return f"GPU-{bare}"


def nvml_uuid_for_torch_device(index: int) -> str:
    """NVML UUID of the CUDA device torch calls ``cuda:index``.

    Why a UUID and not the index: CUDA numbers devices after ``CUDA_VISIBLE_DEVICES`` (and, by
    default, fastest first), NVML numbers them by PCI bus id ignoring it, so ``cuda:0`` is often
    not NVML device 0. The UUID names the same physical GPU in both.

    Under MIG the CUDA UUID names a MIG instance, not the GPU; NVML then either does not find it
    or cannot report power and energy for it, and the sampler says so in ``reason``.
    """
    import torch  # Deferred: importing this module must not need torch.

    return format_nvml_uuid(str(torch.cuda.get_device_properties(index).uuid))


def clock_event_reason_bits(nvml: Any) -> tuple[tuple[str, int], ...]:
    """(record name, bit) of each clock-event reason the pynvml module ``nvml`` defines, by its own
    constants: ``nvmlClocksEventReason*``, else the older ``nvmlClocksThrottleReason*``."""
    bits = []
    for name, suffix in CLOCK_EVENT_REASONS:
        bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
        if bit is None:
            bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None)
        if bit:
            bits.append((name, int(bit)))
    return tuple(bits)


def decode_clock_event_reasons(mask: int, bits: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    """The names of the reasons set in ``mask`` by ``bits`` (:func:`clock_event_reason_bits`: one
    bit each), lowest bit first; a set bit the library does not name is ``unknown_0x<bit>``, kept."""
    names = dict((bit, name) for name, bit in reversed(bits))  # one bit named twice: the first listed
    return tuple(names.get(1 << k, f"unknown_{1 << k:#x}") for k in range(mask.bit_length()) if mask >> k & 1)


def _is_function_not_found(nvml: Any, error: BaseException) -> bool:
    """Whether NVML said the driver's library has no such function (an older driver)."""
    not_found = getattr(nvml, "NVMLError_FunctionNotFound", None)
    return not_found is not None and isinstance(error, not_found)


def clock_event_reasons_function(nvml: Any, handle: Any) -> Callable[[Any], int] | None:
    """The pynvml function that reads the current clock-event reasons on this driver, or None.

    ``nvmlDeviceGetCurrentClocksEventReasons`` (nvidia-ml-py 12.535 and newer) where the library
    has it and the driver's libnvidia-ml answers it; NVML_ERROR_FUNCTION_NOT_FOUND from a driver
    older than the name sends the read to ``nvmlDeviceGetCurrentClocksThrottleReasons``, the same
    query under its deprecated name. Any other refusal keeps the current name (each sample then
    reads None).
    """
    current = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    older = getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    if current is None or older is None:
        return current or older
    try:
        current(handle)
    except nvml.NVMLError as error:
        if _is_function_not_found(nvml, error):
            return older
    return current


def _read_card_limits(nvml: Any, handle: Any) -> tuple[float | None, float | None, list[str]]:
    """(enforced power limit W, maximum SM clock MHz, why either is missing) of an open device."""
    why: list[str] = []
    try:
        power_limit_w: float | None = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0  # mW -> W
    except nvml.NVMLError as error:
        power_limit_w = None
        why.append(f"NVML did not report the enforced power limit: {error}")
    try:
        sm_clock_max_mhz: float | None = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
    except nvml.NVMLError as error:
        sm_clock_max_mhz = None
        why.append(f"NVML did not report the maximum SM clock: {error}")
    return power_limit_w, sm_clock_max_mhz, why


def _open_device(device_uuid: str | None) -> tuple[Any, Any, str | None, str | None]:
    """(pynvml, handle, device name, None) for the GPU, or (None, None, None, why it cannot be sampled)."""
    if device_uuid is None:
        return None, None, None, "device_uuid is None (no CUDA device assigned to this rank)"
    try:
        import pynvml
    except ImportError:
        return None, None, None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        # e.g. "NVML Shared Library Not Found" on a machine without the NVIDIA driver.
        return None, None, None, f"NVML could not be initialised: {exc}"
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(device_uuid)
        name = pynvml.nvmlDeviceGetName(handle)
    except pynvml.NVMLError as exc:
        pynvml.nvmlShutdown()
        return None, None, None, f"NVML has no device with UUID {device_uuid}: {exc}"
    return pynvml, handle, name, None


def idle_power(device_uuid: str | None, seconds: float, interval_s: float = 0.1) -> dict[str, Any]:
    """The GPU's power while it runs nothing: the median of its power readings over the last half
    of ``seconds`` of sampling (call it with the GPU idle: no kernel queued). The trainer calls it
    with its CUDA context up, which draws more than a card with none (the kept H100 records:
    120-146 W, where nvidia-smi read 76-78 W with no context): the record's ``idle_power_w`` is the power before step
    1 with the context up, not the card's idle.

    The second half only, because on Hopper and later NVML's power reading is a 1 s moving
    average (module docstring), so the first readings still carry the last kernels' draw. The
    median, because a reading can catch a short burst (a neighbour's context, a clock change).
    Returns ``idle_power_w`` (None when not measured), ``samples``, ``seconds`` and ``reason``.
    """
    if seconds <= 0:
        return {"idle_power_w": None, "samples": 0, "seconds": 0.0, "reason": "idle power sampling off (--nvml-idle-s 0)"}
    nvml, handle, _, why = _open_device(device_uuid)
    if why is not None:
        return {"idle_power_w": None, "samples": 0, "seconds": 0.0, "reason": why}
    readings: list[tuple[float, float]] = []
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            with contextlib.suppress(nvml.NVMLError):  # a reading refused this time; the others still count
                readings.append((elapsed, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0))
            time.sleep(interval_s)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    late = sorted(power for t, power in readings if t >= seconds / 2)
    if not late:
        return {"idle_power_w": None, "samples": 0, "seconds": seconds, "reason": "NVML gave no power reading in the idle window"}
    return {"idle_power_w": statistics.median(late), "samples": len(late), "seconds": seconds, "reason": None}


def card_limits(device_uuid: str | None) -> dict[str, Any]:
    """The GPU's enforced power limit (``power_limit_w``) and maximum SM clock
    (``sm_clock_max_supported_mhz``) from NVML, each None where not readable, and ``reason``
    (None when both were read). Never raises for a missing NVML or GPU."""
    nvml, handle, _, why = _open_device(device_uuid)
    if why is not None:
        return {"power_limit_w": None, "sm_clock_max_supported_mhz": None, "reason": why}
    try:
        power_limit_w, sm_clock_max_mhz, refused = _read_card_limits(nvml, handle)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return {"power_limit_w": power_limit_w, "sm_clock_max_supported_mhz": sm_clock_max_mhz, "reason": "; ".join(refused) or None}


class NvmlSampler:
    """Samples one GPU every ``interval_s`` on a background thread between start() and stop(),
    except between pause() and resume() (evaluation, checkpoints: not training).

    ``device_uuid`` is NVML's UUID of the GPU (:func:`nvml_uuid_for_torch_device`), or None when
    the rank has no GPU, which yields an unavailable summary. pynvml calls NVML through ctypes,
    which releases the GIL for each call, so sampling does not stall the training thread.
    ``idle`` is the GPU's :func:`idle_power`, reported with the summary.
    """

    def __init__(self, device_uuid: str | None, interval_s: float = 0.1, idle: dict[str, Any] | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.device_uuid = device_uuid
        self.interval_s = interval_s
        self._nvml: Any = None  # the pynvml module once NVML is initialised
        self._handle: Any = None
        self._device_name: str | None = None
        self._unavailable_reason: str | None = None
        self._samples: list[Sample] = []
        self._energy_start_mj: int | None = None
        self._segments: list[tuple[int | None, int | None]] = []  # energy counter (start, end) per active segment
        self._segment = 0
        self._paused_at: float | None = None
        self._paused_s = 0.0
        self._not_paused = threading.Event()
        self._not_paused.set()
        self._idle = idle
        self._power_limit_w: float | None = None  # the card's, read once when sampling starts
        self._sm_clock_max_supported_mhz: float | None = None
        self._read_reasons: Callable[[Any], int] | None = None  # clock_event_reasons_function
        self._reason_bits: tuple[tuple[str, int], ...] = ()
        self._t_start = 0.0
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._summary: dict[str, Any] | None = None

    def start(self) -> None:
        """Open NVML, read the energy counter, begin sampling. Never raises for a missing GPU."""
        if self._started:
            raise RuntimeError("NvmlSampler.start() called twice; use one sampler per window")
        self._started = True
        self._unavailable_reason = self._open()
        if self._unavailable_reason is not None:
            return
        self._power_limit_w, self._sm_clock_max_supported_mhz, _ = _read_card_limits(self._nvml, self._handle)
        self._read_reasons = clock_event_reasons_function(self._nvml, self._handle)
        self._reason_bits = clock_event_reason_bits(self._nvml)
        self._energy_start_mj = self._energy_counter_mj()
        self._t_start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="scalerepro-nvml", daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """End the current active segment: what follows until resume() is not in the window.
        Does nothing before start(), after stop(), when paused already or without NVML."""
        if self._thread is None or self._summary is not None or self._paused_at is not None:
            return
        self._not_paused.clear()
        self._segments.append((self._energy_start_mj, self._energy_counter_mj()))
        self._paused_at = time.monotonic()

    def resume(self) -> None:
        """Start a new active segment (does nothing unless paused)."""
        if self._paused_at is None or self._summary is not None:
            return
        self._paused_s += time.monotonic() - self._paused_at
        self._paused_at = None
        self._segment += 1
        self._energy_start_mj = self._energy_counter_mj()
        self._not_paused.set()

    def stop(self) -> dict[str, Any]:
        """Stop sampling, close NVML and return the summary (``nvml_summary.summarise``).

        Idempotent: a second call returns the same summary.
        """
        if self._summary is None:
            self._summary = self._finish()
        return self._summary

    def _finish(self) -> dict[str, Any]:
        if not self._started:
            return unavailable_summary("sampler was never started", interval_s=self.interval_s)
        if self._unavailable_reason is not None:
            return unavailable_summary(self._unavailable_reason, interval_s=self.interval_s)
        assert self._thread is not None
        # The window ends where its energy does: at the last active segment's counter read, not
        # after the sampling thread has joined, so that energy / window_s is the window's power.
        paused_inside = self._paused_s
        if self._paused_at is None:  # the last active segment ends now
            self._segments.append((self._energy_start_mj, self._energy_counter_mj()))
            active_end = time.monotonic()
        else:
            active_end = self._paused_at
            self._paused_s += time.monotonic() - self._paused_at
        self._stop_requested.set()
        self._not_paused.set()  # a paused thread wakes up to see the stop
        self._thread.join(timeout=_JOIN_TIMEOUT_S)
        # the window = the active segments: start to the last counter read, less the pauses inside
        window_s = active_end - self._t_start - paused_inside
        samples = list(self._samples)  # a copy, in case a wedged thread is still appending
        self._close()
        return summarise(
            samples,
            self._segments,
            device_name=self._device_name,
            interval_s=self.interval_s,
            window_s=window_s,
            idle=self._idle,
            paused_s=self._paused_s,
            power_limit_w=self._power_limit_w,
            sm_clock_max_supported_mhz=self._sm_clock_max_supported_mhz,
        )

    def _open(self) -> str | None:
        """Initialise NVML and find the device; the reason it cannot be sampled, or None."""
        self._nvml, self._handle, self._device_name, why = _open_device(self.device_uuid)
        return why

    def _close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):  # nothing left to measure; a failed shutdown must not lose the summary
            self._nvml.nvmlShutdown()

    def _query(self, read: Callable[[], _T]) -> _T | None:
        """One NVML query, or None if this GPU does not support it or it failed this time."""
        try:
            return read()
        except self._nvml.NVMLError:
            return None

    def _energy_counter_mj(self) -> int | None:
        nvml, handle = self._nvml, self._handle
        return self._query(lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)))

    def _clock_event_reasons(self) -> tuple[str, ...] | None:
        read_reasons, handle = self._read_reasons, self._handle
        if read_reasons is None:  # the library has neither name
            return None
        mask = self._query(lambda: int(read_reasons(handle)))
        return None if mask is None else decode_clock_event_reasons(mask, self._reason_bits)

    def _read_sample(self) -> Sample:
        nvml, handle = self._nvml, self._handle
        segment = self._segment
        power_mw = self._query(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return Sample(
            segment=segment,
            t_s=time.monotonic(),  # taken right after the power reading, which the integral uses
            gpu_util_pct=self._query(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            memory_used_bytes=self._query(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used)),
            power_w=None if power_mw is None else power_mw / 1000.0,
            sm_clock_mhz=self._query(lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
            temperature_c=self._query(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            clock_event_reasons=self._clock_event_reasons(),
        )

    def _run(self) -> None:
        """Sample at t0 + k * interval for k = 0, 1, ..., then once more when stop is requested.

        Deadlines are fixed offsets from t0 on the monotonic clock, so query latency does not
        accumulate into drift; a deadline already missed (a slow query) is skipped, not made up
        in a burst. The closing sample makes the samples span the whole window.
        """
        t0 = time.monotonic()
        tick = 0
        while True:
            if not self._not_paused.is_set():
                self._not_paused.wait()  # paused: no sample until resume() or stop()
                if self._stop_requested.is_set():
                    break
                # a new segment: its first sample now, the schedule continues from here
                t0, tick = time.monotonic(), 0
            self._samples.append(self._read_sample())
            elapsed = time.monotonic() - t0
            tick = max(tick + 1, math.floor(elapsed / self.interval_s) + 1)
            # A deadline that passed while computing this gives a non-positive wait, which polls.
            if self._stop_requested.wait(timeout=t0 + tick * self.interval_s - time.monotonic()):
                break
        if self._paused_at is None:  # stopped while paused: the pause is not in the window
            self._samples.append(self._read_sample())
