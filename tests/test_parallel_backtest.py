"""The 3D-parallel step's back-test (benchmarks/predict_parallel.py) holds what issue 67 asks of it:
held-back rows within 10 % of the published figure, and on a series whose per-GPU figure falls by
more than 10 %, the model's median error at most half of ideal scaling's."""

from __future__ import annotations

import statistics

import pytest

from scalerepro.analysis.tables import network_model
from scalerepro.common import gpu_peaks

from analysis_fixtures import REPO, benchmark_module


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("predict_parallel")


@pytest.fixture(scope="module")
def presets():
    return network_model.read_clusters(REPO / "config" / "references.yaml")


def _holds(rows: list[dict], fall: float) -> None:
    held = [r for r in rows if r["role"] == "held back"]
    assert held and all(abs(r["error"]) <= 0.10 for r in held), [(r["gpus"], round(r["error"], 3)) for r in held]
    if fall > 0.10:
        assert statistics.median(abs(r["error"]) for r in held) <= statistics.median(abs(r["ideal_error"]) for r in held) / 2


def test_the_mlperf_series_on_eos_links(bench, presets):
    hbm = gpu_peaks.PEAKS["h100_sxm"].hbm_tbps * 1e12
    rows = bench.backtest_parallel(presets["dgx_h100"], hbm)
    for label, _, series in bench.PARALLEL_SERIES:
        if "links assumed" in label:
            continue  # another system on links taken as Eos's: its own line in the closing note
        fall = 1 - min(r.value for r in series) / series[0].value
        _holds([r for r in rows if r["source"] == label], fall)


def test_narayanans_table_1(bench, presets):
    hbm = gpu_peaks.PEAKS["a100_sxm_80gb"].hbm_tbps * 1e12
    rows = bench.backtest_weak(bench.TABLE_1, presets["dgx_a100"], hbm)
    assert [r["role"] for r in rows].count("held back") == 5
    fall = 1 - min(r.tflops for r in bench.TABLE_1) / bench.TABLE_1[0].tflops
    _holds(rows, fall)
    # the fitted figures are physical: the matmuls below the A100's 312 TFLOP/s, some traffic
    assert 0 < rows[0]["matmul_tflops"] < 312 and rows[0]["kappa"] > 0
