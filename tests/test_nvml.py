"""The NVML summary arithmetic on hand-made samples, the sampler on a machine without a GPU, and
the sampler replaying a recorded NVML reply (tests/fixtures/nvml) through a fake pynvml."""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from scalerepro.telemetry.nvml import NvmlSampler, card_limits, clock_event_reason_bits, decode_clock_event_reasons, format_nvml_uuid, idle_power
from scalerepro.telemetry.nvml_summary import (
    ENERGY_COUNTER,
    ENERGY_POWER_INTEGRAL,
    MEASURED_KEYS,
    Sample,
    combine_ranks,
    one_per_card,
    summarise,
    trapezoid_energy_j,
    unavailable_summary,
)

UUID = "5d5b6c2b-1c4a-9e3f-0a21-7b3cdd1e8f40"
REPLY = Path(__file__).parent / "fixtures" / "nvml" / "h100_power_capped_reply.json"


def _sample(t_s: float, power_w: float | None, **fields: float | None) -> Sample:
    values: dict[str, float | None] = {
        "gpu_util_pct": None,
        "memory_used_bytes": None,
        "sm_clock_mhz": None,
        "temperature_c": None,
    }
    values.update(fields)
    return Sample(t_s=t_s, power_w=power_w, **values)  # type: ignore[arg-type]


# Power 100 W -> 300 W -> 200 W at t = 0, 1, 3 s (uneven spacing on purpose).
# Trapezoids: (100 + 300) / 2 * 1 = 200 J, (300 + 200) / 2 * 2 = 500 J; total 700 J.
TRACE = [
    _sample(0.0, 100.0, gpu_util_pct=50.0, memory_used_bytes=1_000, sm_clock_mhz=1000.0, temperature_c=40.0),
    _sample(1.0, 300.0, gpu_util_pct=100.0, memory_used_bytes=3_000, sm_clock_mhz=1980.0, temperature_c=61.0),
    _sample(3.0, 200.0, gpu_util_pct=90.0, memory_used_bytes=2_000, sm_clock_mhz=1500.0, temperature_c=55.0),
]


def test_trapezoid_integral_of_a_known_power_trace() -> None:
    assert trapezoid_energy_j(TRACE) == pytest.approx(700.0)


def test_trapezoid_bridges_a_missing_power_reading_and_needs_two_readings() -> None:
    # Without the 300 W reading the line runs 100 W -> 200 W over 3 s: (100 + 200) / 2 * 3 = 450 J.
    gap = [TRACE[0], _sample(1.0, None), TRACE[2]]
    assert trapezoid_energy_j(gap) == pytest.approx(450.0)
    assert trapezoid_energy_j([TRACE[0]]) is None
    assert trapezoid_energy_j([]) is None


def test_summarise_prefers_the_energy_counter_and_reduces_each_field() -> None:
    summary = summarise(
        TRACE,
        (5_000_000, 5_612_345),
        device_name="NVIDIA H100 80GB HBM3",
        interval_s=1.0,
        window_s=3.0,
    )
    assert summary["available"] is True and summary["reason"] is None
    assert summary["samples"] == 3
    assert summary["energy_method"] == ENERGY_COUNTER
    assert summary["energy_j"] == pytest.approx(612.345)  # (5_612_345 - 5_000_000) mJ / 1000
    assert summary["gpu_util_mean_pct"] == pytest.approx(80.0)  # (50 + 100 + 90) / 3
    assert summary["gpu_util_max_pct"] == 100.0
    assert summary["memory_used_max_bytes"] == 3_000
    assert summary["power_mean_w"] == pytest.approx(200.0)  # (100 + 300 + 200) / 3
    assert summary["power_max_w"] == 300.0
    assert summary["sm_clock_mean_mhz"] == pytest.approx(1493.333333)  # 4480 / 3
    assert summary["sm_clock_max_mhz"] == 1980.0
    assert summary["sm_clock_min_mhz"] == 1000.0
    assert summary["temperature_max_c"] == 61.0
    assert summary["temperature_mean_c"] == pytest.approx(52.0)  # (40 + 61 + 55) / 3
    # no reasons read, no card limits given: None, not {} or 0
    assert summary["clock_event_reasons"] is None
    assert summary["power_limit_w"] is None and summary["sm_clock_max_supported_mhz"] is None
    json.dumps(summary)


def test_summarise_gives_each_clock_event_reasons_share_of_the_samples_that_read_them() -> None:
    capped = [
        _sample(0.0, 690.0, clock_event_reasons=("sw_power_cap",)),
        _sample(0.1, 701.0, clock_event_reasons=("sw_power_cap", "hw_slowdown")),
        _sample(0.2, 640.0, clock_event_reasons=()),  # read, none active
        _sample(0.3, 650.0, clock_event_reasons=None),  # NVML refused this reading: not in any share
    ]
    summary = summarise(capped, (None, None), device_name=None, interval_s=0.1, window_s=0.3, power_limit_w=700.0, sm_clock_max_supported_mhz=1980.0)
    # 3 samples read the reasons: sw_power_cap in 2 of them, hw_slowdown in 1
    assert summary["clock_event_reasons"] == {"hw_slowdown": pytest.approx(1 / 3), "sw_power_cap": pytest.approx(2 / 3)}
    assert summary["power_limit_w"] == 700.0 and summary["sm_clock_max_supported_mhz"] == 1980.0
    none_active = summarise([_sample(0.0, 90.0, clock_event_reasons=())], (None, None), device_name=None, interval_s=0.1, window_s=0.1)
    assert none_active["clock_event_reasons"] == {}  # sampled, nothing held the clocks down
    json.dumps(summary)


@pytest.mark.parametrize(
    "counter_mj",
    [(None, 10_000), (10_000, None), (9_000_000, 1_000)],  # unreadable, or reset by a driver reload
    ids=["no-start", "no-end", "went-backwards"],
)
def test_summarise_falls_back_to_the_power_integral(
    counter_mj: tuple[int | None, int | None],
) -> None:
    summary = summarise(TRACE, counter_mj, device_name=None, interval_s=1.0, window_s=3.0)
    assert summary["energy_method"] == ENERGY_POWER_INTEGRAL
    assert summary["energy_j"] == pytest.approx(700.0)


def test_summarise_with_unsupported_fields_reports_none_not_zero() -> None:
    bare = [_sample(0.0, None), _sample(0.1, None)]  # e.g. every query NVMLError_NotSupported
    summary = summarise(bare, (None, None), device_name="x", interval_s=0.1, window_s=0.1)
    assert summary["available"] is True
    assert summary["energy_j"] is None and summary["energy_method"] is None
    for key in MEASURED_KEYS:
        if key != "window_s":
            assert summary[key] is None, key


def test_unavailable_summary_has_the_same_keys_as_a_measured_one() -> None:
    measured = summarise(TRACE, (None, None), device_name=None, interval_s=1.0, window_s=3.0)
    unavailable = unavailable_summary("why", interval_s=1.0)
    assert unavailable.keys() == measured.keys()
    power_capping = ("sm_clock_min_mhz", "temperature_mean_c", "power_limit_w", "sm_clock_max_supported_mhz", "clock_event_reasons")
    assert set(power_capping) <= set(MEASURED_KEYS) and all(unavailable[key] is None for key in power_capping)


def _gpu(power_mean_w: float, energy_j: float | None, **overrides: object) -> dict[str, object]:
    summary = {
        "available": True,
        "reason": None,
        "device_name": "NVIDIA H100 80GB HBM3",
        "samples": 10,
        "interval_s": 0.1,
        "window_s": 1.0,
        "gpu_util_mean_pct": 80.0,
        "gpu_util_max_pct": 95.0,
        "memory_used_max_bytes": 40_000,
        "power_mean_w": power_mean_w,
        "power_max_w": power_mean_w + 50.0,
        "energy_j": energy_j,
        "energy_method": ENERGY_COUNTER,
        "sm_clock_mean_mhz": 1900.0,
        "sm_clock_max_mhz": 1980.0,
        "temperature_max_c": 60.0,
    }
    summary.update(overrides)
    return summary


def test_combine_ranks_sums_energy_and_power_and_takes_max_of_maxima() -> None:
    a = _gpu(600.0, 600.0, gpu_util_mean_pct=70.0, memory_used_max_bytes=50_000, window_s=1.02)
    b = _gpu(400.0, 420.0, gpu_util_mean_pct=90.0, temperature_max_c=71.0, sm_clock_mean_mhz=1700.0)
    run = combine_ranks([a, b])
    assert run["available"] is True and run["reason"] is None
    assert run["gpus"] == 2
    assert run["samples"] == 20
    assert run["energy_j"] == pytest.approx(1020.0)  # 600 + 420
    assert run["energy_method"] == ENERGY_COUNTER
    assert run["power_mean_w"] == pytest.approx(1000.0)  # total draw: 600 + 400
    assert run["power_mean_per_gpu_w"] == pytest.approx(500.0)
    assert run["power_max_per_gpu_w"] == 650.0  # max(600 + 50, 400 + 50)
    assert run["gpu_util_mean_pct"] == pytest.approx(80.0)  # (70 + 90) / 2
    assert run["sm_clock_mean_mhz"] == pytest.approx(1800.0)  # (1900 + 1700) / 2
    assert run["memory_used_max_bytes"] == 50_000
    assert run["temperature_max_c"] == 71.0
    assert run["window_s"] == 1.02
    assert run["device_name"] == "NVIDIA H100 80GB HBM3"
    json.dumps(run)


def test_combine_ranks_reads_power_capping_over_the_gpus() -> None:
    a = _gpu(
        690.0,
        690.0,
        sm_clock_min_mhz=1400.0,
        temperature_mean_c=60.0,
        power_limit_w=700.0,
        sm_clock_max_supported_mhz=1980.0,
        clock_event_reasons={"sw_power_cap": 0.5, "hw_slowdown": 0.25},
    )
    b = _gpu(
        699.0,
        699.0,
        sm_clock_min_mhz=1300.0,
        temperature_mean_c=64.0,
        power_limit_w=700.0,
        sm_clock_max_supported_mhz=1980.0,
        clock_event_reasons={"sw_power_cap": 1.0},
    )
    run = combine_ranks([a, b])
    assert run["sm_clock_min_mhz"] == 1300.0  # min(1400, 1300)
    assert run["temperature_mean_c"] == pytest.approx(62.0)  # (60 + 64) / 2
    assert run["power_limit_w"] == pytest.approx(1400.0)  # 700 + 700, beside power_mean_w = 690 + 699
    assert run["power_limit_per_gpu_w"] == 700.0 and run["sm_clock_max_supported_mhz"] == 1980.0
    # sw_power_cap (0.5 + 1.0) / 2 = 0.75; hw_slowdown (0.25 + 0, absent on b) / 2 = 0.125
    assert run["clock_event_reasons"] == {"hw_slowdown": pytest.approx(0.125), "sw_power_cap": pytest.approx(0.75)}
    json.dumps(run)

    capped = _gpu(600.0, 600.0, power_limit_w=600.0, sm_clock_max_supported_mhz=1755.0, clock_event_reasons={})
    mixed = combine_ranks([a, capped])
    assert mixed["power_limit_w"] == pytest.approx(1300.0)  # 700 + 600: the total still holds
    assert mixed["power_limit_per_gpu_w"] is None and mixed["sm_clock_max_supported_mhz"] is None  # the cards differ
    assert mixed["clock_event_reasons"] == {"hw_slowdown": pytest.approx(0.125), "sw_power_cap": pytest.approx(0.25)}
    assert combine_ranks([capped, capped])["clock_event_reasons"] == {}
    # a GPU whose reasons or limit were not read (or an older summary without them): None, not a partial figure
    unread = combine_ranks([a, _gpu(600.0, 600.0)])
    assert unread["clock_event_reasons"] is None and unread["power_limit_w"] is None and unread["sm_clock_min_mhz"] is None
    assert unread["temperature_mean_c"] is None


def test_combine_ranks_does_not_sum_a_partial_set() -> None:
    mixed_methods = combine_ranks([_gpu(600.0, 600.0), _gpu(400.0, None, energy_method=None)])
    assert mixed_methods["energy_j"] is None
    assert mixed_methods["energy_method"] is None
    assert mixed_methods["power_mean_w"] == pytest.approx(1000.0)

    down = unavailable_summary("NVML could not be initialised: x", interval_s=0.1)
    run = combine_ranks([_gpu(600.0, 600.0), down])
    assert run["available"] is False
    assert run["reason"] == "GPU 1 of 2: NVML could not be initialised: x"
    assert run["energy_j"] is None and run["power_mean_w"] is None

    assert combine_ranks([])["available"] is False


def test_format_nvml_uuid_adds_the_prefix_once() -> None:
    assert format_nvml_uuid(UUID) == f"GPU-{UUID}"
    assert format_nvml_uuid(f"GPU-{UUID}") == f"GPU-{UUID}"
    assert format_nvml_uuid(UUID.upper()) == f"GPU-{UUID}"


def _assert_unavailable(summary: dict[str, object]) -> None:
    assert summary["available"] is False
    assert isinstance(summary["reason"], str) and summary["reason"]
    assert summary["energy_method"] is None and summary["device_name"] is None
    assert all(summary[key] is None for key in MEASURED_KEYS)
    json.dumps(summary)


def test_sampler_without_a_device_reports_why() -> None:
    sampler = NvmlSampler(None, interval_s=0.01)
    sampler.start()
    summary = sampler.stop()
    _assert_unavailable(summary)
    assert "device_uuid is None" in summary["reason"]
    assert sampler.stop() is summary


def test_sampler_where_nvml_is_absent_or_has_no_such_gpu_reports_why() -> None:
    # On this GPU-less machine NVML's library is missing; on a GPU machine this UUID is unknown.
    sampler = NvmlSampler(f"GPU-{UUID}", interval_s=0.01)
    sampler.start()
    summary = sampler.stop()
    _assert_unavailable(summary)
    assert "NVML" in summary["reason"] or "pynvml" in summary["reason"]


def test_stop_without_start_reports_why() -> None:
    _assert_unavailable(NvmlSampler(f"GPU-{UUID}").stop())


class _FakeNvml:
    """Just enough of pynvml for the sampling loop: memory and temperature are unsupported."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.energy_mj = 1_000_000
        self.initialised = 0

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "Fake GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        self.energy_mj += 2_500  # each read 2.5 J later than the last
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 250_000  # mW

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> object:
        return type("Utilization", (), {"gpu": 75, "memory": 30})()

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        return 1980

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        return 1980

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
        return 700_000  # mW

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> object:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        raise self.NVMLError("Not Supported")


def test_sampler_loop_tolerates_unsupported_fields_and_keeps_its_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    interval_s = 0.01
    sampler = NvmlSampler(f"GPU-{UUID}", interval_s=interval_s)
    sampler.start()
    time.sleep(0.1)
    summary = sampler.stop()

    assert summary["available"] is True, summary["reason"]
    assert summary["device_name"] == "Fake GPU"
    assert fake.initialised == 0  # every nvmlInit matched by nvmlShutdown
    # One sample per deadline t0 + k * interval within the window, plus the closing one; never a
    # catch-up burst, so never more than that.
    assert 2 <= summary["samples"] <= summary["window_s"] / interval_s + 2
    assert summary["power_mean_w"] == 250.0 and summary["power_max_w"] == 250.0
    assert summary["gpu_util_mean_pct"] == 75.0 and summary["sm_clock_max_mhz"] == 1980.0
    assert summary["memory_used_max_bytes"] is None and summary["temperature_max_c"] is None
    assert summary["energy_method"] == ENERGY_COUNTER
    assert summary["energy_j"] == pytest.approx(2.5)  # consecutive counter reads, 2_500 mJ apart
    assert summary["clock_event_reasons"] is None  # a library without either reasons query: None, no error


# ---- the measured window only: pauses, and the idle power beside it -------------------------------


def test_summarise_sums_active_segments_and_nets_out_idle_power() -> None:
    # two active segments, 1 s and 2 s long, with a pause between them (t = 1 .. 5 s not sampled)
    samples = [_sample(0.0, 300.0), _sample(1.0, 300.0), _sample(5.0, 400.0, segment=1), _sample(7.0, 400.0, segment=1)]
    counter = [(1_000_000, 1_300_000), (1_900_000, 2_700_000)]  # 300 J, then 800 J; 600 J were spent in the pause
    summary = summarise(samples, counter, device_name=None, interval_s=1.0, window_s=3.0, idle={"idle_power_w": 70.0, "reason": None}, paused_s=4.0)
    assert summary["energy_method"] == ENERGY_COUNTER
    assert summary["energy_j"] == pytest.approx(1100.0)  # 300 + 800: the pause's 600 J are not in it
    assert summary["energy_net_j"] == pytest.approx(1100.0 - 70.0 * 3.0)  # E - P_idle x active seconds
    assert summary["idle_power_w"] == 70.0 and summary["paused_s"] == 4.0
    # without counters the integral never bridges the pause: 300 x 1 + 400 x 2 = 1100 J (not + 350 x 4)
    integral = summarise(samples, [(None, None), (None, None)], device_name=None, interval_s=1.0, window_s=3.0)
    assert integral["energy_method"] == ENERGY_POWER_INTEGRAL and integral["energy_j"] == pytest.approx(1100.0)
    assert integral["energy_net_j"] is None and integral["idle_power_reason"] == "idle power not measured"


def test_combine_ranks_sums_idle_power_and_net_energy() -> None:
    run = combine_ranks([_gpu(600.0, 600.0, idle_power_w=70.0, energy_net_j=530.0), _gpu(400.0, 420.0, idle_power_w=75.0, energy_net_j=345.0)])
    assert run["idle_power_w"] == pytest.approx(145.0) and run["energy_net_j"] == pytest.approx(875.0)
    older = combine_ranks([_gpu(600.0, 600.0)])  # a summary from before idle power: None, not 0
    assert older["idle_power_w"] is None and older["energy_net_j"] is None


def test_a_paused_sampler_leaves_the_pause_out(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()  # every counter read is 2.5 J after the previous one
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = NvmlSampler(f"GPU-{UUID}", interval_s=0.01, idle={"idle_power_w": 100.0, "reason": None})
    sampler.start()  # read 1
    time.sleep(0.05)
    sampler.pause()  # read 2: segment 1 = 2.5 J
    during = len(sampler._samples)
    time.sleep(0.2)
    assert len(sampler._samples) <= during + 1  # at most the sample being read when it paused
    sampler.resume()  # read 3
    time.sleep(0.05)
    summary = sampler.stop()  # read 4: segment 2 = 2.5 J
    assert summary["energy_j"] == pytest.approx(5.0)  # not 7.5 J: the pause's counter difference is left out
    assert summary["paused_s"] == pytest.approx(0.2, abs=0.05)
    assert 0.08 <= summary["window_s"] <= 0.2  # about 0.1 s active, not the 0.3 s from start to stop
    assert summary["energy_net_j"] == pytest.approx(5.0 - 100.0 * summary["window_s"])
    assert fake.initialised == 0
    # pausing or resuming when not sampling is a no-op (the trainer's evaluation before the window)
    idle = NvmlSampler(None)
    idle.pause(), idle.resume()
    assert idle.stop()["available"] is False


class _CoolingNvml(_FakeNvml):
    """Power readings as after a burst of kernels (a 1 s moving average decaying): 500 W for the
    first 0.18 s, then 60 W."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.monotonic()

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 500_000 if time.monotonic() - self.t0 < 0.18 else 60_000


def test_idle_power_is_read_after_the_moving_average_settles(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _CoolingNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    idle = idle_power(f"GPU-{UUID}", seconds=0.3, interval_s=0.01)
    # the median of all readings would be 500 W (60 % of them); of the second half's, 60 W
    assert idle["idle_power_w"] == 60.0 and idle["reason"] is None and idle["samples"] >= 5
    assert fake.initialised == 0
    assert idle_power(None, 1.0)["reason"].startswith("device_uuid is None")
    assert idle_power(f"GPU-{UUID}", 0.0)["idle_power_w"] is None  # --nvml-idle-s 0: off, no sampling


# ---- power capping: the card's limits and the clock-event reasons, from a recorded NVML reply ------


def test_decode_names_each_bit_by_the_librarys_own_constants_and_keeps_an_unknown_bit() -> None:
    pynvml = pytest.importorskip("pynvml")
    bits = clock_event_reason_bits(pynvml)
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown | 0x800_0000  # a bit NVML may add later
    assert decode_clock_event_reasons(mask, bits) == ("sw_power_cap", "hw_slowdown", "unknown_0x8000000")  # lowest bit first
    assert decode_clock_event_reasons(pynvml.nvmlClocksEventReasonNone, bits) == ()
    assert decode_clock_event_reasons(pynvml.nvmlClocksEventReasonGpuIdle, bits) == ("gpu_idle",)
    # every reason the library defines has its name, none decodes as unknown
    assert not any(name.startswith("unknown") for name in decode_clock_event_reasons(pynvml.nvmlClocksEventReasonAll, bits))
    # a library with the older names only (nvidia-ml-py before 12.535) decodes the same bits the same way
    older = types.SimpleNamespace(**{name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith("nvmlClocksThrottleReason")})
    assert decode_clock_event_reasons(mask, clock_event_reason_bits(older)) == ("sw_power_cap", "hw_slowdown", "unknown_0x8000000")


class _RecordedReply:
    """The card of the recorded reply (tests/fixtures/nvml), answering each pynvml query as the real
    library does: ints in NVML's units, the reasons bitmask ORed from the installed nvidia-ml-py's
    constants, refusals as its own NVMLError classes. A sample begins with its power reading (the
    sampler reads power first); after the recorded readings every per-sample query answers
    NVML_ERROR_NOT_SUPPORTED (a refused field is None and in no figure), so the figures are the
    recorded readings' however many samples the sampler's thread took."""

    def __init__(self, reply: dict[str, Any]) -> None:
        import pynvml

        self.real, self.reply = pynvml, reply
        self.index = -1  # the reading of the sample being read
        self.energy_reads = 0
        self.initialised = 0
        self.all_read = threading.Event()  # the last recorded reading has been served
        self.reasons_calls: list[str] = []

    def _refuse(self, code: int) -> Exception:
        return self.real.NVMLError(code)  # pynvml maps the code to its subclass, e.g. NVMLError_FunctionNotFound

    def _reading(self) -> dict[str, Any]:
        if self.index >= len(self.reply["readings"]):
            raise self._refuse(self.real.NVML_ERROR_NOT_SUPPORTED)
        return self.reply["readings"][max(self.index, 0)]  # before the first sample: the card as at the first

    def _mask(self) -> int:
        mask = self.real.nvmlClocksEventReasonNone
        for constant in self._reading()["clock_event_reasons"]:
            mask |= getattr(self.real, constant)
        return mask

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != self.reply["uuid"]:
            raise self._refuse(self.real.NVML_ERROR_NOT_FOUND)
        return uuid

    def nvmlDeviceGetName(self, handle: str) -> str:
        return self.reply["device_name"]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
        return self.reply["enforced_power_limit_mw"]

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.real.NVML_CLOCK_SM
        return self.reply["max_sm_clock_mhz"]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        counter = self.reply["total_energy_consumption_mj"]  # at the window's start, then at its end
        self.energy_reads += 1
        return counter[min(self.energy_reads, len(counter)) - 1]

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self.index += 1
        if self.index == len(self.reply["readings"]) - 1:
            self.all_read.set()
        return self._reading()["power_mw"]

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> object:
        return types.SimpleNamespace(gpu=self._reading()["gpu_util_pct"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> object:
        return types.SimpleNamespace(used=self._reading()["memory_used_bytes"], total=85_520_809_984, free=0)

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.real.NVML_CLOCK_SM
        return self._reading()["sm_clock_mhz"]

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        assert sensor == self.real.NVML_TEMPERATURE_GPU
        return self._reading()["temperature_c"]

    def reasons_query(self, name: str, answers: bool) -> Any:
        """The reasons query under ``name``: the bitmask, or NVMLError_FunctionNotFound where the
        driver's libnvidia-ml lacks the symbol (pynvml raises it at the call, not at import)."""

        def query(handle: str) -> int:
            self.reasons_calls.append(name)
            if not answers:
                raise self._refuse(self.real.NVML_ERROR_FUNCTION_NOT_FOUND)
            return self._mask()

        return query


CURRENT, OLDER = "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"


def _recorded_pynvml(card: _RecordedReply, reasons_by: str) -> types.SimpleNamespace:
    """A pynvml module answering as ``card``. ``reasons_by``: "current" (nvidia-ml-py 12.535 and a
    driver that has its name), "older" (the library has the current name, the driver only the
    older one: the sampler must fall back), "neither" (a library with no reasons query)."""
    real = card.real
    module = types.SimpleNamespace(
        NVMLError=real.NVMLError,
        NVMLError_FunctionNotFound=real.NVMLError_FunctionNotFound,
        NVML_CLOCK_SM=real.NVML_CLOCK_SM,
        NVML_TEMPERATURE_GPU=real.NVML_TEMPERATURE_GPU,
        **{name: getattr(real, name) for name in dir(real) if name.startswith(("nvmlClocksEventReason", "nvmlClocksThrottleReason"))},
        **{name: getattr(card, name) for name in dir(card) if name.startswith("nvml")},
    )
    if reasons_by != "neither":
        setattr(module, CURRENT, card.reasons_query(CURRENT, answers=reasons_by == "current"))
        setattr(module, OLDER, card.reasons_query(OLDER, answers=reasons_by == "older"))
    return module


@pytest.mark.parametrize("reasons_by", ["older", "current", "neither"])
def test_sampler_reads_a_power_capped_h100_from_its_recorded_nvml_reply(reasons_by: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pynvml")
    reply = json.loads(REPLY.read_text())
    card = _RecordedReply(reply)
    monkeypatch.setitem(sys.modules, "pynvml", _recorded_pynvml(card, reasons_by))
    sampler = NvmlSampler(reply["uuid"], interval_s=0.01)
    sampler.start()
    assert card.all_read.wait(timeout=10), "the sampler did not read every recorded reading"
    summary = sampler.stop()

    assert summary["available"] is True, summary["reason"]
    assert card.initialised == 0
    assert summary["samples"] > len(reply["readings"])  # every recorded reading, and the closing sample (refused)
    # the card, read once: 700_000 mW -> 700 W; 1980 MHz
    assert summary["power_limit_w"] == 700.0 and summary["sm_clock_max_supported_mhz"] == 1980.0
    # SM clock: (1785 + 1620 + 1545 + 1500 + 1470 + 1530 + 1485 + 1465) / 8 = 12400 / 8 = 1550 MHz, 1465 .. 1785
    assert summary["sm_clock_mean_mhz"] == pytest.approx(1550.0)
    assert summary["sm_clock_min_mhz"] == 1465.0 and summary["sm_clock_max_mhz"] == 1785.0
    # power: (668.2 + 690.4 + 697.6 + 701.048 + 699.5 + 696.3 + 698.9 + 696.852) / 8 = 5548.8 / 8 = 693.6 W, at most 701.048 W
    assert summary["power_mean_w"] == pytest.approx(693.6) and summary["power_max_w"] == pytest.approx(701.048)
    # temperature: (61 + 63 + 64 + 65 + 65 + 66 + 66 + 66) / 8 = 516 / 8 = 64.5 C, at most 66 C
    assert summary["temperature_mean_c"] == pytest.approx(64.5) and summary["temperature_max_c"] == 66.0
    # each end of the window: the first reading 61 C at 1785 MHz, the last 66 C at 1465 MHz (the card
    # heated and the power cap pulled its clock down inside a window of a few seconds)
    assert (summary["temperature_start_c"], summary["temperature_end_c"]) == (61.0, 66.0)
    assert (summary["sm_clock_start_mhz"], summary["sm_clock_end_mhz"]) == (1785.0, 1465.0)
    assert summary["gpu_util_mean_pct"] == pytest.approx(99.75)  # (98 + 7 x 100) / 8
    assert summary["energy_method"] == ENERGY_COUNTER and summary["energy_j"] == pytest.approx(4441.088)  # (1_004_441_088 - 1_000_000_000) mJ
    if reasons_by == "neither":
        assert summary["clock_event_reasons"] is None  # not readable: None, and every other figure still there
        return
    # of the 8 readings: SwPowerCap in 7, HwSlowdown in 1 (the 701 W one), the first none
    assert summary["clock_event_reasons"] == {"hw_slowdown": pytest.approx(1 / 8), "sw_power_cap": pytest.approx(7 / 8)}
    answering = CURRENT if reasons_by == "current" else OLDER
    # the current name is tried once when sampling starts; each sample then asks the name that answers
    assert card.reasons_calls[0] == CURRENT and set(card.reasons_calls[1:]) == {answering}
    run = combine_ranks([summary])
    assert run["power_limit_w"] == run["power_limit_per_gpu_w"] == 700.0 and run["clock_event_reasons"] == summary["clock_event_reasons"]
    # two such cards: the hotter card's temperatures and the slower card's clocks at each end
    other = {**summary, "temperature_start_c": 50.0, "temperature_end_c": 70.0, "sm_clock_start_mhz": 1980.0, "sm_clock_end_mhz": 1400.0}
    both = combine_ranks([summary, other])
    assert (both["temperature_start_c"], both["temperature_end_c"], both["sm_clock_start_mhz"], both["sm_clock_end_mhz"]) == (61.0, 70.0, 1785.0, 1400.0)


def test_card_limits_read_the_recorded_card_and_say_why_when_they_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pynvml")
    reply = json.loads(REPLY.read_text())
    card = _RecordedReply(reply)
    module = _recorded_pynvml(card, "current")
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert card_limits(reply["uuid"]) == {"power_limit_w": 700.0, "sm_clock_max_supported_mhz": 1980.0, "reason": None}
    assert card.initialised == 0

    def refused(handle: str) -> int:  # e.g. a MIG instance or a virtualised GPU
        raise card.real.NVMLError(card.real.NVML_ERROR_NOT_SUPPORTED)

    module.nvmlDeviceGetEnforcedPowerLimit = refused
    limits = card_limits(reply["uuid"])
    assert limits["power_limit_w"] is None and limits["sm_clock_max_supported_mhz"] == 1980.0
    assert limits["reason"] == "NVML did not report the enforced power limit: Not Supported"
    assert card_limits(f"GPU-{UUID}")["reason"].startswith("NVML has no device with UUID")
    assert card_limits(None)["reason"].startswith("device_uuid is None")
    assert card.initialised == 0


def test_ranks_sharing_a_card_count_it_once():
    """Two ranks on one card (--dist-backend gloo) both sample it: the run's energy and power are
    the card's once, and a second host's card with the same index is another card."""
    shared = [_gpu(600.0, 3000.0), _gpu(610.0, 3050.0)]  # rank 0 and rank 1 read the same card
    cards = [("node-a", 0), ("node-a", 0)]
    once = combine_ranks(one_per_card(cards, shared))
    assert once["gpus"] == 1 and once["energy_j"] == 3000.0 and once["power_mean_w"] == 600.0
    two_hosts = combine_ranks(one_per_card([("node-a", 0), ("node-b", 0)], shared))
    assert two_hosts["gpus"] == 2 and two_hosts["energy_j"] == 6050.0
