"""NVML samples reduced to numbers: one GPU's samples over a window (:func:`summarise`), the
summary of a GPU that could not be read (:func:`unavailable_summary`), and the per-GPU summaries
folded into one for the run (:func:`combine_ranks`). Pure functions of the samples, so the
arithmetic is tested without a GPU; ``scalerepro.telemetry.nvml`` takes the samples, and says
what each NVML reading means."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from scalerepro.common.reductions import max_or_none, mean_or_none, min_or_none, sum_or_none

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
    "temperature_start_c",
    "temperature_end_c",
    "sm_clock_start_mhz",
    "sm_clock_end_mhz",
    "power_limit_w",
    "clock_event_reasons",
    "idle_power_w",
    "energy_net_j",
)


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
        energy_j, energy_method = math.fsum(b - a for a, b in segments) / 1000.0, ENERGY_COUNTER
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
        # the first and last readings: a window of a few seconds on a card that started cool ends
        # hotter, and on a power-capped card at a lower clock, than a long run holds
        "temperature_start_c": temperature[0] if temperature else None,
        "temperature_end_c": temperature[-1] if temperature else None,
        "sm_clock_start_mhz": clock[0] if clock else None,
        "sm_clock_end_mhz": clock[-1] if clock else None,
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


def one_per_card(cards: Sequence[Any], summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first rank's summary of each card, in rank order: ``cards[i]`` names rank i's card
    (its host and device index). Ranks that share a card (``--dist-backend gloo`` on one GPU)
    sampled the same card, and combine_ranks must see it once."""
    first: dict[Any, dict[str, Any]] = {}
    for card, summary in zip(cards, summaries, strict=True):
        first.setdefault(card, summary)
    return list(first.values())


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
    * ``temperature_start_c``, ``temperature_end_c`` = the highest over GPUs of each GPU's first
      and last reading; ``sm_clock_start_mhz``, ``sm_clock_end_mhz`` = the lowest;
    * ``power_limit_w`` = sum of per-GPU enforced limits (beside ``power_mean_w``, the total draw);
      ``power_limit_per_gpu_w`` and ``sm_clock_max_supported_mhz`` = the value every GPU shares,
      else None (the cards differ: read the per-GPU summaries);
    * ``clock_event_reasons`` = per reason, the mean over GPUs of its share of each GPU's samples
      (a reason a GPU never showed counts 0 there).

    Pass one summary per physical GPU (one_per_card): two ranks sampling the same GPU would count it twice.
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
        "gpu_util_mean_pct": mean_or_none(column("gpu_util_mean_pct")),
        "gpu_util_max_pct": max_or_none(column("gpu_util_max_pct")),
        "memory_used_max_bytes": max_or_none(column("memory_used_max_bytes")),
        "power_mean_w": sum_or_none(power_means),
        "power_mean_per_gpu_w": mean_or_none(power_means),
        "power_max_per_gpu_w": max_or_none(column("power_max_w")),
        "energy_j": sum_or_none(column("energy_j")),
        "energy_method": _common(column("energy_method")),
        "sm_clock_mean_mhz": mean_or_none(column("sm_clock_mean_mhz")),
        "sm_clock_min_mhz": min_or_none(column("sm_clock_min_mhz")),
        "sm_clock_max_mhz": max_or_none(column("sm_clock_max_mhz")),
        "sm_clock_max_supported_mhz": _common(column("sm_clock_max_supported_mhz")),
        "temperature_mean_c": mean_or_none(column("temperature_mean_c")),
        "temperature_max_c": max_or_none(column("temperature_max_c")),
        # the hottest GPU's reading and the slowest GPU's clock at each end of the window
        "temperature_start_c": max_or_none(column("temperature_start_c")),
        "temperature_end_c": max_or_none(column("temperature_end_c")),
        "sm_clock_start_mhz": min_or_none(column("sm_clock_start_mhz")),
        "sm_clock_end_mhz": min_or_none(column("sm_clock_end_mhz")),
        # the run's GPUs' enforced limits together (the sum), and one GPU's where all agree
        "power_limit_w": sum_or_none(column("power_limit_w")),
        "power_limit_per_gpu_w": _common(column("power_limit_w")),
        "clock_event_reasons": _mean_shares(column("clock_event_reasons")),
        "paused_s": max_or_none(column("paused_s")),
        # idle power of all GPUs (sum), and energy net of it (sum of each GPU's E - P_idle x t)
        "idle_power_w": sum_or_none(column("idle_power_w")),
        "idle_power_reason": next((r for r in column("idle_power_reason") if r), None) if n else None,
        "energy_net_j": sum_or_none(column("energy_net_j")),
    }
