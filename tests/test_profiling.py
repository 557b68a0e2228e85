"""Profiling: the analysis of Nsight Systems / Nsight Compute / torch.profiler output against
hand-computed answers on the fixtures (tests/fixtures/*/README.md), and the torch.profiler
fallback run for real on the CPU (2 gloo ranks)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pandas as pd
import pytest
import yaml

from conftest import REPO, torchrun
from scalerepro.analysis import profile

FIXTURES = REPO / "tests" / "fixtures"
NS = 1e-9


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nsys_sqlite(tmp_path_factory):
    builder = _load(FIXTURES / "nsys" / "make_nsys_sqlite.py")
    return builder.build(tmp_path_factory.mktemp("nsys") / "rank0.sqlite")


@pytest.fixture(scope="module")
def peaks():
    return profile.gpu_peaks(yaml.safe_load((REPO / "config/references.yaml").read_text()), "h100_sxm")


# ---- interval arithmetic ---------------------------------------------------------------------


def test_union_merges_overlapping_and_touching_intervals():
    assert profile.union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]
    assert profile.length([(0, 2), (1, 3)]) == 3


def test_overlap_of_two_known_intervals():
    assert profile.intersect([(0, 10)], [(6, 14)]) == [(6, 10)]
    assert profile.length(profile.intersect([(0, 2), (4, 8)], [(1, 5), (7, 9)])) == 1 + 1 + 1
    assert profile.intersect([(0, 1)], [(2, 3)]) == []


def test_subtract_leaves_the_uncovered_parts():
    assert profile.subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert profile.subtract([(0, 2)], [(0, 5)]) == []


# ---- Nsight Systems ----------------------------------------------------------------------------


def test_nsys_breakdown_matches_the_hand_computed_answers(nsys_sqlite):
    (timeline,) = profile.read_nsys_sqlite(nsys_sqlite)
    b = profile.breakdown(timeline)
    assert b["steps"] == 2 and b["window_s"] == pytest.approx(20_000 * NS)
    assert b["compute_s"] == pytest.approx(11_000 * NS)
    assert b["communication_s"] == pytest.approx(4_500 * NS)
    assert b["overlap_s"] == pytest.approx(1_500 * NS)
    assert b["overlap_fraction"] == pytest.approx(1 / 3)
    assert b["exposed_comm_s"] == pytest.approx(3_000 * NS)
    assert b["data_wait_s"] == pytest.approx(3_500 * NS)  # the other process's data range does not count
    assert b["idle_s"] == pytest.approx(2_500 * NS)
    assert b["busy_fraction"] == pytest.approx(0.7)
    parts = [b[f"{c}_fraction"] for c in profile.CATEGORIES]
    assert parts == pytest.approx([0.55, 0.15, 0.175, 0.125]) and sum(parts) == pytest.approx(1.0)
    assert b["compute_kernel_time_s"] == pytest.approx(11_000 * NS)
    assert b["comm_kernel_time_s"] == pytest.approx(4_500 * NS)


def test_nsys_top_kernels_by_total_time(nsys_sqlite):
    (timeline,) = profile.read_nsys_sqlite(nsys_sqlite)
    top = profile.top_calls(timeline.calls)
    assert [k["name"] for k in top] == [
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "elementwise_kernel",
        "vectorized_elementwise_kernel",
    ]
    assert top[0]["calls"] == 2 and top[0]["total_s"] == pytest.approx(8_000 * NS)
    assert top[0]["share"] == pytest.approx(8_000 / 15_500) and top[1]["kind"] == "communication"
    assert top[0]["mean_us"] == pytest.approx(4.0)


def test_classification_follows_the_thresholds(nsys_sqlite):
    (timeline,) = profile.read_nsys_sqlite(nsys_sqlite)
    b = profile.breakdown(timeline)
    verdict = profile.classify(b, profile.DEFAULT_THRESHOLDS)
    assert verdict["class"] == "input-bound"  # data wait 17.5 % / 10 % is the largest score
    assert "data wait 17.5% ≥ 10%" in verdict["evidence"] and "exposed communication 15.0% < 20%" in verdict["evidence"]
    assert profile.classify(b, {"exposed_comm_min": 0.10, "data_wait_min": 0.5, "idle_min": 0.5})["class"] == "communication-bound"
    assert profile.classify(b, {"exposed_comm_min": 0.5, "data_wait_min": 0.5, "idle_min": 0.10})["class"] == "launch/latency-bound"
    assert profile.classify(b, {"exposed_comm_min": 0.5, "data_wait_min": 0.5, "idle_min": 0.5})["class"] == "compute-bound"


def test_a_file_that_is_not_an_nsys_export_is_one_clear_error(tmp_path):
    bad = tmp_path / "rank0.sqlite"
    bad.write_text("not a database")
    with pytest.raises(profile.ProfileError, match="rank0.sqlite: not an SQLite export"):
        profile.read_nsys_sqlite(bad)


# ---- Nsight Compute ----------------------------------------------------------------------------


def test_ncu_csv_is_read_per_launch_in_base_units():
    launches = profile.read_ncu_csv(FIXTURES / "ncu" / "kernels.csv").set_index("id")
    assert list(launches.index) == [0, 1, 2, 3]
    assert launches.loc[0, "duration"] == pytest.approx(10e-6) and launches.loc[1, "duration"] == pytest.approx(2e-3)
    assert launches.loc[0, "dram_bytes"] == 12e6 and launches.loc[1, "dram_bytes"] == pytest.approx(5e8)
    assert launches.loc[0, "dram_bytes_per_s"] == pytest.approx(1.2e12)
    assert launches.loc[1, "flops"] == pytest.approx(1e9 + 2 * 4e10)  # FADD + 2 FFMA
    assert launches.loc[2, "flops"] == 0 and launches.loc[2, "tensor_pipe_pct"] == 60
    assert launches.loc[1, "achieved_occupancy_pct"] == 45 and launches.loc[1, "theoretical_occupancy_pct"] == 50


def test_roofline_positions_match_the_hand_computed_answers(peaks):
    roof = {row["kernel"][:20]: row for row in profile.roofline(profile.read_ncu_csv(FIXTURES / "ncu" / "kernels.csv"), peaks)}
    add, conv, gemm = roof["void at::native::vec"], roof["implicit_convolve_sg"], roof["sm90_xmma_gemm_bf16b"]
    assert add["achieved_flops_per_s"] == pytest.approx(1e11)
    assert add["flops_fraction"] == pytest.approx(1e11 / 66.9e12)
    assert add["dram_fraction"] == pytest.approx(1.2 / 3.35)
    assert add["arithmetic_intensity"] == pytest.approx(1 / 12) and add["bound"] == "memory"
    assert add["attainable_flops_per_s"] == pytest.approx(3.35e12 / 12)
    assert conv["flops_fraction"] == pytest.approx(4.05e13 / 66.9e12) and conv["arithmetic_intensity"] == pytest.approx(162)
    assert conv["bound"] == "compute" and conv["ridge_intensity"] == pytest.approx(66.9 / 3.35)
    assert gemm["launches"] == 2 and gemm["flops"] == pytest.approx(1.1e-3 * 989.4e12)
    assert gemm["flops_fraction"] == pytest.approx(0.55) and gemm["flops_source"].startswith("estimate")
    assert gemm["dram_bytes_per_s"] == pytest.approx(1e11) and gemm["bound"] == "compute"


def test_an_ncu_file_in_another_layout_is_one_clear_error(tmp_path):
    wide = tmp_path / "kernels.csv"
    wide.write_text('"ID","Kernel Name","gpu__time_duration.sum"\n"0","k","1"\n')
    with pytest.raises(profile.ProfileError, match="not the long ncu CSV layout"):
        profile.read_ncu_csv(wide)


# ---- a run's summary and the tables --------------------------------------------------------------


def test_summary_and_tables_of_an_nsys_and_ncu_run(nsys_sqlite, peaks, tmp_path):
    run = tmp_path / "strong_resnet50_g8_r1"
    (run / "nsys").mkdir(parents=True)
    (run / "ncu").mkdir()
    shutil.copy(nsys_sqlite, run / "nsys" / "rank0.sqlite")
    shutil.copy(FIXTURES / "ncu" / "kernels.csv", run / "ncu" / "kernels.csv")
    for tool in ("nsys", "ncu"):
        (run / tool / "capture.json").write_text(json.dumps({"tool": tool, "fallback_reason": None}))
    summary = profile.summarize(run, run.name, profile.DEFAULT_THRESHOLDS, peaks)
    assert summary["tools"] == ["ncu", "nsys"] and not summary["fallback"]
    assert summary["classification"]["class"] == "input-bound"
    assert summary["breakdown"]["overlap_fraction"] == pytest.approx(1 / 3)
    assert len(summary["roofline"]) == 3 and len(summary["top_kernels"]) == 4
    t = profile.tables([json.loads(json.dumps(summary, default=str))])
    assert t["profiling"].loc[0, "classification"] == "input-bound"
    assert t["profiling"].loc[0, "busy_fraction"] == pytest.approx(0.7)
    assert len(t["profiling_kernels"]) == 4 and len(t["profiling_roofline"]) == 3
    assert set(t["profiling_files"]["description"]) >= {"Nsight Systems SQLite export", "Nsight Compute metrics (CSV)"}


# ---- the torch.profiler fallback, for real on the CPU ---------------------------------------------


def test_the_torch_fallback_profiles_two_gloo_ranks_on_the_cpu(tmp_path):
    out = tmp_path / "torch"
    args = ["--model", "cnn", "--batch-size", "16", "--synthetic-samples", "512", "--steps", "5", "--warmup-steps", "2",
            "--num-workers", "1", "--no-eval", "--comm-probe-steps", "0", "--progress", "off",
            "--profile-mode", "torch", "--profile-window-start", "2", "--profile-window-steps", "3", "--profile-dir", str(out)]  # fmt: skip
    result = torchrun(2, args, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "window.json").read_text())["captured_steps"] == 3
    operators = pd.read_csv(out / "operators.csv")
    assert {"scalerepro:forward", "scalerepro:backward", "scalerepro:optimizer", "scalerepro:data"} <= set(operators["name"])
    timeline = profile.read_torch_trace(out / "trace.json")
    assert timeline.source == "torch.profiler (CPU operators)" and timeline.steps == 3
    b = profile.breakdown(timeline)
    assert b["communication_s"] > 0  # gloo's all-reduce of the two ranks' gradients
    assert sum(b[f"{c}_fraction"] for c in profile.CATEGORIES) == pytest.approx(1.0)
    assert profile.classify(b, profile.DEFAULT_THRESHOLDS)["class"] in profile.CLASSES


def test_a_window_past_the_end_of_the_run_is_a_usage_error(tmp_path):
    from conftest import python_train

    result = python_train(["--model", "cnn", "--steps", "4", "--warmup-steps", "1", "--synthetic-samples", "256",
                           "--no-eval", "--progress", "off", "--profile-mode", "torch", "--profile-window-start", "3",
                           "--profile-window-steps", "3", "--profile-dir", str(tmp_path)])  # fmt: skip
    assert result.returncode == 2
    assert "the profiling window (steps 3..5) ends after the run's 4 steps" in result.stderr


def test_cuda_api_mode_on_the_cpu_is_a_one_line_usage_error_naming_the_fallback(tmp_path):
    """It used to fail at the window's first step with torch's "Torch not compiled with CUDA"."""
    from conftest import load_record, python_train

    result = python_train(["--model", "cnn", "--device", "cpu", "--num-workers", "0", "--steps", "4", "--warmup-steps", "1", "--synthetic-samples", "256",
                           "--no-eval", "--progress", "off", "--profile-mode", "cuda_api", "--profile-window-start", "1",
                           "--profile-window-steps", "2", "--record", str(tmp_path / "r.json")])  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--profile-mode cuda_api" in result.stderr and "use --profile-mode torch" in result.stderr
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "failed" and record["error"]["type"] == "ConfigError"
