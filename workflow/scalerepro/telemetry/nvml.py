"""GPU telemetry over a measured window: utilisation, memory, power against its limit, energy, SM
clock against its maximum, temperature, and why the clocks were held down.

One :class:`NvmlSampler` per rank watches that rank's GPU from a background thread while the
timed part of a benchmark runs; :func:`combine_ranks` folds the per-GPU summaries into one for
the run. The reduction from samples to numbers is the pure function :func:`summarise`, so the
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
not training (evaluation, checkpoints) and the energy is summed over the active segments. The
GPU's idle power (:func:`idle_power`, read before the window while the GPU runs nothing) is
reported beside it, and the energy net of idle, ``E - P_idle x active seconds``, with it: the gross
figure includes the power the GPU draws doing nothing, which differs between GPU models.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from scalerepro.common.reductions import max_or_none

_T = TypeVar("_T")

ENERGY_COUNTER = "total_energy_counter"
ENERGY_POWER_INTEGRAL = "power_integral"

# Keys of a per-GPU summary whose values are measurements (None when not measured).
MEASURED_KEYS = (
    "window_s",
    "gpu_util_mean_pct",
    "gpu_util_max_pct",
    "memory_used_max_bytes",
    "power_mean_w",
    "power_max_w",
    "energy_j",
    "sm_clock_mean_mhz",
    "sm_clock_min_mhz",
    "sm_clock_max_mhz",
    "sm_clock_max_supported_mhz",
    "temperature_mean_c",
    "temperature_max_c",
    "power_limit_w",
    "clock_event_reasons",
    "idle_power_w",
    "energy_net_j",
)

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


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU. ``t_s`` is ``time.monotonic()``; a field NVML refused is None."""

    t_s: float
    gpu_util_pct: float | None
    memory_used_bytes: int | None
    power_w: float | None
    sm_clock_mhz: float | None
    temperature_c: float | None
    segment: int = 0  # the active segment of the window it was read in (pauses separate them)
    # the reasons active at the reading, decoded (decode_clock_event_reasons); () none, None not read
    clock_event_reasons: tuple[str, ...] | None = None


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


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _min(values: Sequence[_T]) -> _T | None:
    return min(values) if values else None  # type: ignore[type-var]


def _max(values: Sequence[_T]) -> _T | None:
    return max(values) if values else None  # type: ignore[type-var]


def reason_shares(samples: Sequence[Sample]) -> dict[str, float] | None:
    """Share of the samples whose reasons were read in which each reason was active (0..1), for
    the reasons seen: share(r) = samples with r active / samples with reasons read. ``{}`` where
    read and never active, None where never read."""
    read = [s.clock_event_reasons for s in samples if s.clock_event_reasons is not None]
    if not read:
        return None
    seen = Counter(name for reasons in read for name in set(reasons))
    return {name: seen[name] / len(read) for name in sorted(seen)}


def _present(values: Sequence[_T | None]) -> list[_T]:
    return [v for v in values if v is not None]


def trapezoid_energy_j(samples: Sequence[Sample]) -> float | None:
    """Energy from sampled power: E = sum_i (P_i + P_{i+1}) / 2 * (t_{i+1} - t_i), in J, within
    each active segment (a pause is never bridged).

    Samples without a power reading are skipped, so a gap is bridged by the straight line
    between its neighbours. None with fewer than two power readings (no interval to integrate).
    """
    powered = [(s.segment, s.t_s, s.power_w) for s in samples if s.power_w is not None]
    if len(powered) < 2:
        return None
    return math.fsum((p0 + p1) / 2.0 * (t1 - t0) for (g0, t0, p0), (g1, t1, p1) in zip(powered, powered[1:]) if g0 == g1)


def summarise(
    samples: Sequence[Sample],
    energy_counter_mj: tuple[int | None, int | None] | Sequence[tuple[int | None, int | None]],
    *,
    device_name: str | None,
    interval_s: float,
    window_s: float,
    idle: dict[str, Any] | None = None,
    paused_s: float = 0.0,
    power_limit_w: float | None = None,
    sm_clock_max_supported_mhz: float | None = None,
) -> dict[str, Any]:
    """Reduce one GPU's samples over a window into the summary dict (JSON-serialisable).

    ``energy_counter_mj`` is the total-energy counter read at the start and at the end of the
    window, or of each active segment of it (a list of pairs). Energy is the sum of their
    differences, ``(end - start) / 1000`` J, when every one was read and the counter never went
    backwards (it restarts at 0 when the driver reloads). Otherwise it is the trapezoid integral
    of sampled power (:func:`trapezoid_energy_j`), which covers only the span from the first to
    the last sample of each segment, and ``energy_method`` says which one was used.

    ``window_s`` is the active time (pauses excluded, ``paused_s`` says how long they were).
    With ``idle`` (:func:`idle_power`): ``idle_power_w`` and the energy net of it,
    ``energy_net_j = energy_j - idle_power_w x window_s``.

    Means are plain sample means: the sampler spaces samples evenly in time, so a sample mean is
    a time average. ``clock_event_reasons`` is :func:`reason_shares`. ``power_limit_w`` and
    ``sm_clock_max_supported_mhz`` are the card's, read once (None: not read), reported as given.
    """
    util = _present([s.gpu_util_pct for s in samples])
    memory = _present([s.memory_used_bytes for s in samples])
    power = _present([s.power_w for s in samples])
    clock = _present([s.sm_clock_mhz for s in samples])
    temperature = _present([s.temperature_c for s in samples])

    segments = [energy_counter_mj] if isinstance(energy_counter_mj, tuple) else list(energy_counter_mj)
    energy_j: float | None
    energy_method: str | None
    if segments and all(a is not None and b is not None and b >= a for a, b in segments):
        # E = sum over active segments of (counter at its end - counter at its start)
        energy_j, energy_method = math.fsum(b - a for a, b in segments) / 1000.0, ENERGY_COUNTER  # type: ignore[operator]
    else:
        energy_j = trapezoid_energy_j(samples)
        energy_method = ENERGY_POWER_INTEGRAL if energy_j is not None else None
    idle_w = (idle or {}).get("idle_power_w")
    # energy net of idle = E - P_idle x active seconds: what the work cost above an idle GPU
    energy_net_j = energy_j - idle_w * window_s if energy_j is not None and idle_w is not None else None

    return {
        "available": True,
        "reason": None,
        "device_name": device_name,
        "samples": len(samples),
        "interval_s": interval_s,
        "window_s": window_s,
        "gpu_util_mean_pct": _mean(util),
        "gpu_util_max_pct": _max(util),
        "memory_used_max_bytes": _max(memory),
        "power_mean_w": _mean(power),
        "power_max_w": _max(power),
        "energy_j": energy_j,
        "energy_method": energy_method,
        "sm_clock_mean_mhz": _mean(clock),
        "sm_clock_min_mhz": _min(clock),
        "sm_clock_max_mhz": _max(clock),
        "sm_clock_max_supported_mhz": sm_clock_max_supported_mhz,
        "temperature_mean_c": _mean(temperature),
        "temperature_max_c": _max(temperature),
        "power_limit_w": power_limit_w,
        "clock_event_reasons": reason_shares(samples),
        "paused_s": paused_s,
        "idle_power_w": idle_w,
        "idle_power_reason": (idle or {}).get("reason", "idle power not measured"),
        "energy_net_j": energy_net_j,
    }


def unavailable_summary(reason: str, *, interval_s: float) -> dict[str, Any]:
    """The summary when nothing could be measured: same keys, measurements None, ``reason`` set."""
    summary: dict[str, Any] = {
        "available": False,
        "reason": reason,
        "device_name": None,
        "samples": 0,
        "interval_s": interval_s,
        "energy_method": None,
        "paused_s": None,
        "idle_power_reason": reason,
    }
    summary.update(dict.fromkeys(MEASURED_KEYS))
    return summary


def _sum_or_none(values: Sequence[float | None]) -> float | None:
    """Sum, or None if any term is missing: a partial total would read as a smaller true total."""
    if not values or any(v is None for v in values):
        return None
    return math.fsum(v for v in values if v is not None)


def _min_or_none(values: Sequence[float | None]) -> float | None:
    """Min, or None if any term is missing: the min of a subset is only an upper bound."""
    present = _present(values)
    return min(present) if values and len(present) == len(values) else None


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    total = _sum_or_none(values)
    return None if total is None else total / len(values)


def _common(values: Sequence[_T]) -> _T | None:
    """The value all entries share, else None."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _mean_shares(shares: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Per reason, the mean of each GPU's share (a reason a GPU never showed counts 0 there);
    None if any GPU's reasons were not read."""
    if not shares or any(s is None for s in shares):
        return None
    names = sorted({name for s in shares if s is not None for name in s})
    return {name: math.fsum((s or {}).get(name, 0.0) for s in shares) / len(shares) for name in names}


def combine_ranks(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-GPU summaries (one per rank, each rank on its own GPU) into one for the run.

    Sums and means are over GPUs, and each is None if any GPU lacks the value, so a number in
    the result always covers every GPU:

    * ``energy_j`` = sum of per-GPU energies (the run's GPU energy);
    * ``power_mean_w`` = sum of per-GPU mean powers (the total draw of all GPUs);
      ``power_mean_per_gpu_w`` = their mean;
    * ``gpu_util_mean_pct``, ``sm_clock_mean_mhz`` = mean of per-GPU means (each per-GPU mean is a
      time average over nearly the same window, so this is the fleet's time average);
    * ``*_max_*`` = max of per-GPU maxima. ``power_max_per_gpu_w`` is the highest single-GPU draw,
      not the peak total draw, because the GPUs' peaks need not coincide;
      ``sm_clock_min_mhz`` = min of per-GPU minima; ``temperature_mean_c`` = mean of per-GPU means;
    * ``power_limit_w`` = sum of per-GPU enforced limits (beside ``power_mean_w``, the total draw);
      ``power_limit_per_gpu_w`` and ``sm_clock_max_supported_mhz`` = the value every GPU shares,
      else None (the cards differ: read the per-GPU summaries);
    * ``clock_event_reasons`` = per reason, the mean over GPUs of its share of each GPU's samples
      (a reason a GPU never showed counts 0 there).

    Pass one summary per physical GPU: two ranks sampling the same GPU would count it twice.
    """
    n = len(summaries)
    unavailable = [(i, s) for i, s in enumerate(summaries) if not s["available"]]
    if n == 0:
        reason: str | None = "no per-GPU summaries to combine"
    elif unavailable:
        index, first = unavailable[0]
        reason = f"GPU {index} of {n}: {first['reason']}"
    else:
        reason = None

    def column(key: str) -> list[Any]:
        return [s.get(key) for s in summaries]  # a key a summary lacks (an older one) reads None

    power_means = column("power_mean_w")
    return {
        "available": n > 0 and not unavailable,
        "reason": reason,
        "gpus": n,
        "device_name": _common(column("device_name")),
        "samples": sum(column("samples")),
        "interval_s": _common(column("interval_s")),
        "window_s": max_or_none(column("window_s")),
        "gpu_util_mean_pct": _mean_or_none(column("gpu_util_mean_pct")),
        "gpu_util_max_pct": max_or_none(column("gpu_util_max_pct")),
        "memory_used_max_bytes": max_or_none(column("memory_used_max_bytes")),
        "power_mean_w": _sum_or_none(power_means),
        "power_mean_per_gpu_w": _mean_or_none(power_means),
        "power_max_per_gpu_w": max_or_none(column("power_max_w")),
        "energy_j": _sum_or_none(column("energy_j")),
        "energy_method": _common(column("energy_method")),
        "sm_clock_mean_mhz": _mean_or_none(column("sm_clock_mean_mhz")),
        "sm_clock_min_mhz": _min_or_none(column("sm_clock_min_mhz")),
        "sm_clock_max_mhz": max_or_none(column("sm_clock_max_mhz")),
        "sm_clock_max_supported_mhz": _common(column("sm_clock_max_supported_mhz")),
        "temperature_mean_c": _mean_or_none(column("temperature_mean_c")),
        "temperature_max_c": max_or_none(column("temperature_max_c")),
        # the run's GPUs' enforced limits together (the sum), and one GPU's where all agree
        "power_limit_w": _sum_or_none(column("power_limit_w")),
        "power_limit_per_gpu_w": _common(column("power_limit_w")),
        "clock_event_reasons": _mean_shares(column("clock_event_reasons")),
        "paused_s": max_or_none(column("paused_s")),
        # idle power of all GPUs (sum), and energy net of it (sum of each GPU's E - P_idle x t)
        "idle_power_w": _sum_or_none(column("idle_power_w")),
        "idle_power_reason": next((r for r in column("idle_power_reason") if r), None) if n else None,
        "energy_net_j": _sum_or_none(column("energy_net_j")),
    }


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
    of ``seconds`` of sampling (call it with the GPU idle: no kernel queued).

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
        """Stop sampling, close NVML and return the summary (see :func:`summarise`).

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
        if self._paused_at is None:  # the last active segment ends now
            self._segments.append((self._energy_start_mj, self._energy_counter_mj()))
        else:
            self._paused_s += time.monotonic() - self._paused_at
        self._stop_requested.set()
        self._not_paused.set()  # a paused thread wakes up to see the stop
        self._thread.join(timeout=_JOIN_TIMEOUT_S)
        # the window = the active segments: wall time from start to stop less the pauses
        window_s = time.monotonic() - self._t_start - self._paused_s
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
