"""Profiling: the analysis of Nsight Systems / Nsight Compute / torch.profiler output against
hand-computed answers on the fixtures (tests/fixtures/*/README.md), and the torch.profiler
fallback run for real on the CPU (2 gloo ranks)."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil

import markupsafe
import pandas as pd
import pytest

from scalerepro.analysis import columns
from scalerepro.analysis.profiles import captures, classify, intervals, ncu, nsys, roofline, torch_trace
from scalerepro.common import gpu_peaks
from scalerepro.launching import nsight

from conftest import REPO, launch_ranks

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
    return roofline.gpu_peaks("h100_sxm", "bf16")


# ---- interval arithmetic ---------------------------------------------------------------------


def test_union_merges_overlapping_and_touching_intervals():
    assert intervals.union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]
    assert intervals.length([(0, 2), (1, 3)]) == 3


def test_overlap_of_two_known_intervals():
    assert intervals.intersect([(0, 10)], [(6, 14)]) == [(6, 10)]
    assert intervals.length(intervals.intersect([(0, 2), (4, 8)], [(1, 5), (7, 9)])) == 1 + 1 + 1
    assert intervals.intersect([(0, 1)], [(2, 3)]) == []


def test_subtract_leaves_the_uncovered_parts():
    assert intervals.subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert intervals.subtract([(0, 2)], [(0, 5)]) == []


# ---- Nsight Systems ----------------------------------------------------------------------------


def test_nsys_breakdown_matches_the_hand_computed_answers(nsys_sqlite):
    (timeline,) = nsys.read_nsys_sqlite(nsys_sqlite)
    b = intervals.breakdown(timeline)
    assert b["steps"] == 2 and b["window_s"] == pytest.approx(20_000 * NS)
    assert b["compute_s"] == pytest.approx(11_000 * NS)
    assert b["communication_s"] == pytest.approx(4_500 * NS)
    assert b["overlap_s"] == pytest.approx(1_500 * NS)
    assert b["overlap_fraction"] == pytest.approx(1 / 3)
    assert b["exposed_comm_s"] == pytest.approx(3_000 * NS)
    assert b["data_wait_s"] == pytest.approx(3_500 * NS)  # the other process's data range does not count
    assert b["idle_s"] == pytest.approx(2_500 * NS)
    assert b["busy_fraction"] == pytest.approx(0.7)
    parts = [b[f"{c}_fraction"] for c in columns.CATEGORIES]
    assert parts == pytest.approx([0.55, 0.15, 0.175, 0.125]) and sum(parts) == pytest.approx(1.0)
    assert b["compute_kernel_time_s"] == pytest.approx(11_000 * NS)
    assert b["comm_kernel_time_s"] == pytest.approx(4_500 * NS)


def test_nsys_top_kernels_by_total_time(nsys_sqlite):
    (timeline,) = nsys.read_nsys_sqlite(nsys_sqlite)
    top = intervals.top_calls(timeline.calls)
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
    (timeline,) = nsys.read_nsys_sqlite(nsys_sqlite)
    b = intervals.breakdown(timeline)
    verdict = classify.classify(b, classify.DEFAULT_THRESHOLDS)
    assert verdict["class"] == "input-bound"  # data wait 17.5 % / 10 % is the largest score
    assert "data wait 17.5% ≥ 10%" in verdict["evidence"] and "exposed communication 15.0% < 20%" in verdict["evidence"]
    assert classify.classify(b, {"exposed_comm_min": 0.10, "data_wait_min": 0.5, "idle_min": 0.5})["class"] == "communication-bound"
    assert classify.classify(b, {"exposed_comm_min": 0.5, "data_wait_min": 0.5, "idle_min": 0.10})["class"] == "launch/latency-bound"
    assert classify.classify(b, {"exposed_comm_min": 0.5, "data_wait_min": 0.5, "idle_min": 0.5})["class"] == "compute-bound"


@pytest.fixture(scope="module", params=["2022.1", "2025.3"])
def nsys_export(request, tmp_path_factory):
    """The fixture in the column set of a real export of that version (README.md)."""
    builder = _load(FIXTURES / "nsys" / "make_nsys_sqlite.py")
    return builder.build(tmp_path_factory.mktemp("nsys") / f"rank0-{request.param}.sqlite", request.param), request.param


def test_the_window_ends_with_the_last_kernel_launched_in_the_steps(nsys_export):
    """The last step's range closes at 20 000 ns on the host; a kernel it launched (at 19 500)
    runs 20 000-21 000 on the GPU. Window [0, 21 000): compute 11 000 + 1 000, the rest as in
    the generated fixture."""
    (timeline,) = nsys.read_nsys_sqlite(nsys_export[0])
    b = intervals.breakdown(timeline)
    assert b["window_s"] == pytest.approx(21_000 * NS) and b["compute_s"] == pytest.approx(12_000 * NS)
    assert b["exposed_comm_s"] == pytest.approx(3_000 * NS) and b["data_wait_s"] == pytest.approx(3_500 * NS)
    assert b["idle_s"] == pytest.approx(2_500 * NS) and b["busy_fraction"] == pytest.approx(15_000 / 21_000)
    assert b["steps"] == 2 and not b["provisional"] and b["window"].startswith("2 scalerepro:step ranges")


def test_capture_metadata_is_read_where_the_export_has_it(nsys_export):
    path, version = nsys_export
    meta = nsys.read_nsys_metadata(path)
    assert meta["tool_version"].startswith(f"NVIDIA Nsight Systems {version}")
    assert meta["traced"] == ["Cuda", "NvtxEvents", "OSRuntime"] and meta["cuda_api_calls"] == 7
    gpu = {"2022.1": "NVIDIA A100-SXM4-80GB (compute capability 8.0)", "2025.3": "NVIDIA H100 80GB HBM3 (compute capability 9.0)"}
    assert meta["gpus"] == [gpu[version]]
    assert meta.get("driver") == ("12080" if version == "2025.3" else None)  # 2022.1's export has no TARGET_INFO_SYSTEM_ENV here


def test_a_timeline_without_step_ranges_is_labelled_whole_capture_and_provisional(tmp_path, peaks):
    builder = _load(FIXTURES / "nsys" / "make_nsys_sqlite.py")
    run = tmp_path / "run"
    (run / "nsys").mkdir(parents=True)
    builder.build(run / "nsys" / "rank0.sqlite", "2025.3", steps=False)
    (run / "nsys" / "capture.json").write_text(json.dumps({"tool": "nsys", "fallback_reason": None}))
    summary = captures.summarize(run, "run", classify.DEFAULT_THRESHOLDS, peaks)
    assert summary["breakdown"]["window"] == "whole capture (no step ranges)" and summary["breakdown"]["provisional"]
    assert summary["classification"]["provisional"] and summary["classification"]["evidence"].startswith("provisional: window is the whole capture")
    assert any("no scalerepro:step ranges: window: whole capture (no step ranges)" in w for w in summary["warnings"])
    row = captures.tables([json.loads(json.dumps(summary, default=str))])["profiling"].iloc[0]
    assert row["window"] == "whole capture (no step ranges)" and row["provisional"]


def test_no_kernel_under_cuda_tracing_says_what_the_capture_shows(tmp_path):
    builder = _load(FIXTURES / "nsys" / "make_nsys_sqlite.py")
    path = builder.build(tmp_path / "rank0.sqlite", "2025.3", kernels=False)
    with pytest.raises(intervals.ProfileError) as error:
        nsys.read_nsys_sqlite(path)
    message = str(error.value)
    assert "no CUPTI_ACTIVITY_KIND_KERNEL table, though CUDA was traced (capture metadata traces Cuda" in message
    assert "7 CUDA API calls recorded" in message and "--trace=cuda" not in message and "\n" not in message


def test_a_file_that_is_not_an_nsys_export_is_one_clear_error(tmp_path):
    bad = tmp_path / "rank0.sqlite"
    bad.write_text("not a database")
    with pytest.raises(intervals.ProfileError, match="rank0.sqlite: not an SQLite export"):
        nsys.read_nsys_sqlite(bad)


# ---- Nsight Compute ----------------------------------------------------------------------------

RECORDED = FIXTURES / "ncu" / "recorded"
V100_2019 = RECORDED / "ncu-2019.5_V100-SXM2_cfd_details-display-names.csv"
CC100_2025 = RECORDED / "ncu-2025.x_CC10.0-152SM_cublaslt-gemm_details-display-names.csv"


@pytest.fixture(scope="module", params=["2022", "2025"])
def raw_csv(request, tmp_path_factory):
    """The raw-metric layout scalerepro.launching.nsight asks for, as each ncu generation prints it."""
    builder = _load(FIXTURES / "ncu" / "make_kernels_csv.py")
    path = tmp_path_factory.mktemp("ncu") / f"kernels-{request.param}.csv"
    builder.write(str(path), request.param)
    return path


def test_the_committed_ncu_fixture_is_what_its_generator_writes(tmp_path):
    _load(FIXTURES / "ncu" / "make_kernels_csv.py").write(str(tmp_path / "kernels.csv"), "2025")
    assert (tmp_path / "kernels.csv").read_text() == (FIXTURES / "ncu" / "kernels.csv").read_text()


def test_ncu_raw_metric_layout_is_read_per_launch_in_base_units(raw_csv):
    reading = ncu.read_ncu_csv(raw_csv)
    assert reading.layout == "raw metric names" and reading.problems == []
    launches = reading.launches.set_index("id")
    assert list(launches.index) == [0, 1, 2, 3]
    assert launches.loc[0, "duration"] == pytest.approx(10e-6) and launches.loc[1, "duration"] == pytest.approx(2e-3)
    assert launches.loc[0, "dram_bytes"] == 12e6 and launches.loc[1, "dram_bytes"] == pytest.approx(5e8)
    assert launches.loc[1, "flops"] == pytest.approx(1e9 + 2 * 4e10)  # FADD + 2 FFMA
    assert launches.loc[2, "flops"] == 0 and launches.loc[2, "tensor_pipe_pct"] == 60  # Hopper: the hmma pipe counter
    assert launches.loc[1, "achieved_occupancy_pct"] == 45 and launches.loc[1, "theoretical_occupancy_pct"] == 50


def test_roofline_positions_match_the_hand_computed_answers(raw_csv, peaks):
    roof = {row["kernel"][:20]: row for row in roofline.roofline(ncu.read_ncu_csv(raw_csv).launches, peaks)}
    add, conv, gemm = roof["void at::native::vec"], roof["implicit_convolve_sg"], roof["sm90_xmma_gemm_bf16b"]
    assert add["achieved_flops_per_s"] == pytest.approx(1e11)
    assert add["flops_fraction"] == pytest.approx(1e11 / 66.9e12)
    assert add["dram_fraction"] == pytest.approx(1.2 / 3.35)
    assert add["arithmetic_intensity"] == pytest.approx(1 / 12) and add["bound"] == "memory"
    assert add["attainable_flops_per_s"] == pytest.approx(3.35e12 / 12)
    assert conv["flops_fraction"] == pytest.approx(4.05e13 / 66.9e12) and conv["arithmetic_intensity"] == pytest.approx(162)
    assert conv["bound"] == "compute" and conv["ridge_intensity"] == pytest.approx(66.9 / 3.35)
    assert gemm["launches"] == 2 and gemm["flops"] == pytest.approx(1.1e-3 * 989.4e12)
    assert gemm["flops_fraction"] == pytest.approx(0.55) and "tensor cores: estimate" in gemm["flops_source"]
    assert gemm["dram_bytes_per_s"] == pytest.approx(1e11) and gemm["bound"] == "compute"
    assert {row["missing"] for row in roof.values()} == {None}


@pytest.mark.parametrize(
    ("key", "precision", "tensor_tflops"),
    [
        ("h100_sxm", "bf16", 989.4),
        ("h100_sxm", "fp8", 1978.9),
        ("h100_sxm", "tf32", 494.7),
        ("h100_pcie", "bf16", 756.0),
        ("h100_nvl", "fp16", 835.5),
        ("h200", "bf16", 989.4),
        ("a100_sxm_80gb", "bf16", 312.0),
    ],
)
def test_the_tensor_roof_is_the_gpus_and_the_precisions(raw_csv, key, precision, tensor_tflops):
    # the GEMM: counters 0 FLOPs (the tensor cores are invisible to them), tensor pipe 55 % of 2 ms;
    # its name made to state no precision, so that its roof is the run's (a name's own is tested
    # in test_report_profile_predict.py)
    launches = ncu.read_ncu_csv(raw_csv).launches
    launches["kernel"] = launches["kernel"].str.replace("gemm_bf16bf16_bf16f32_f32", "gemm", regex=False)
    roof = {row["kernel"][:20]: row for row in roofline.roofline(launches, roofline.gpu_peaks(key, precision))}
    gemm, conv = roof["sm90_xmma_gemm_tn_n_"], roof["implicit_convolve_sg"]
    assert gemm["cuda_core_flops"] == 0 and gemm["tensor_flops"] == pytest.approx(1.1e-3 * tensor_tflops * 1e12)
    assert gemm["peak_flops_per_s"] == pytest.approx(tensor_tflops * 1e12) and gemm["flops_fraction"] == pytest.approx(0.55)
    assert f"{precision} dense tensor" in gemm["peak"] and gemm["tensor_work"].startswith("estimate")
    assert conv["peak"].endswith("FP32 CUDA cores") and conv["tensor_work"] == "none: the tensor pipe was idle"


def test_a_kernel_with_cuda_core_and_tensor_work_counts_both(raw_csv):
    # the GEMM's epilogue on the CUDA cores (1 GFLOP by the SASS counters) beside its tensor-core
    # main loop (55 % of 2 ms at 989.4 TFLOP/s): the counters alone would see 1 GFLOP of 1.09 TFLOP
    launches = ncu.read_ncu_csv(raw_csv).launches
    launches.loc[launches["kernel"].str.startswith("sm90_xmma"), "flops"] = 0.5e9
    gemm = {row["kernel"][:20]: row for row in roofline.roofline(launches, roofline.gpu_peaks("h100_sxm", "bf16"))}["sm90_xmma_gemm_bf16b"]
    assert gemm["cuda_core_flops"] == pytest.approx(1e9) and gemm["tensor_flops"] == pytest.approx(1.1e-3 * 989.4e12)
    assert gemm["flops"] == pytest.approx(1e9 + 1.1e-3 * 989.4e12) and gemm["peak_flops_per_s"] == pytest.approx(989.4e12)


def test_tensor_work_that_cannot_be_counted_says_why(raw_csv):
    launches = ncu.read_ncu_csv(raw_csv).launches
    # a GEMM whose name states no precision: its tensor roof is the run's precision's
    launches["kernel"] = launches["kernel"].str.replace("gemm_bf16bf16_bf16f32_f32", "gemm", regex=False)
    for peaks, why in (
        (roofline.gpu_peaks("a100_sxm_80gb", "fp8"), "has no fp8 tensor cores"),
        (roofline.gpu_peaks("h100_sxm", None), "the run's precision is unknown"),
        (roofline.gpu_peaks("h100_sxm", "fp32"), "a fp32 run uses no tensor-core precision"),
    ):
        gemm = {row["kernel"][:20]: row for row in roofline.roofline(launches, peaks)}["sm90_xmma_gemm_tn_n_"]
        assert gemm["tensor_flops"] is None and why in gemm["tensor_work"] and gemm["tensor_work"].startswith("not counted")
        # what the counters saw, and said so; not set under the CUDA cores' roof as if that were all its work
        assert gemm["flops"] == 0 and gemm["peak"].startswith("none: tensor-core work not counted") and gemm["flops_fraction"] is None
    # a capture without a tensor-pipe metric (sections only, sm_100): nothing counted, and said so
    (row,) = roofline.roofline(ncu.read_ncu_csv(CC100_2025).launches, roofline.gpu_peaks("h100_sxm", "bf16"))
    assert row["tensor_work"] == "not counted: the capture has no tensor-pipe metric for this kernel" and row["flops"] is None


def test_hopper_tensor_work_without_wgmma_is_not_set_against_the_wgmma_peak(peaks):
    """Hopper's tensor-pipe counter is busy for mma.sync (cuDNN's ``s16816`` kernels: m16n8k16
    HMMA) and for HFMA2.MMA (elementwise bf16 kernels) too; the dense peak is wgmma's. The H100
    recording has the pipe utilisation of real kernels; the wgmma instruction counts (asked for
    since) are planted as such kernels have them: none but in the sm90 GEMM."""
    launches = ncu.read_ncu_csv(H100_NCU).launches
    rows = lambda frame: {row["kernel"][:25]: row for row in roofline.roofline(frame, peaks)}  # noqa: E731
    before = rows(launches)  # no instruction counts in the capture: utilisation x peak, as before
    # an elementwise kernel does no matrix work: never a tensor estimate, whatever the pipe counter shows
    assert before["void cutlass__5x_cudnn::K"]["tensor_flops"] > 0 and before["void at::elementwise_kern"]["tensor_flops"] == 0
    assert before["void at::elementwise_kern"]["tensor_work"].startswith("none: elementwise (ATen) kernels do no matrix work")
    launches["wgmma_instructions"] = launches["kernel"].str.startswith("nvjet_sm90").astype(float) * 1e6
    after = rows(launches)
    assert after["nvjet_sm90_tst_64x512_64x"]["tensor_flops"] == before["nvjet_sm90_tst_64x512_64x"]["tensor_flops"] > 0
    row = after["void cutlass__5x_cudnn::K"]
    assert row["tensor_flops"] is None and "no wgmma instruction" in row["tensor_work"] and "tensor-core FLOPs" in row["missing"]
    assert row["flops"] == row["cuda_core_flops"] and row["peak"].startswith("none: tensor-core work not counted")


def test_the_peaks_follow_the_gpu_the_capture_names(tmp_path):
    assert gpu_peaks.peaks_key("NVIDIA H100 80GB HBM3 (compute capability 9.0)") == "h100_sxm"
    assert [gpu_peaks.peaks_key(n) for n in ("NVIDIA H100 PCIe", "nvidia h100 nvl", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB")] == [
        "h100_pcie",
        "h100_nvl",
        "h200",
        "a100_sxm_80gb",
        "a100_pcie_40gb",
    ]
    peaks, basis = roofline.resolve_peaks(["NVIDIA H100 PCIe"], "h100_sxm", "bf16")
    assert peaks["key"] == "h100_pcie" and peaks["tensor_flops"] == 756e12 and "from the capture's device name" in basis
    assert roofline.resolve_peaks([], "h100_sxm", "bf16")[1].endswith("as configured: the capture names no GPU), bf16")
    unknown, why = roofline.resolve_peaks(["NVIDIA B200"], "h100_sxm", "bf16")
    assert unknown is None and "no entry of the GPU peak table (scalerepro.common.gpu_peaks) names NVIDIA B200" in why
    # summarize: the nsys export's GPU (H100 SXM) and the capture's --precision
    run = tmp_path / "run"
    (run / "nsys").mkdir(parents=True)
    (run / "ncu").mkdir()
    _load(FIXTURES / "nsys" / "make_nsys_sqlite.py").build(run / "nsys" / "rank0.sqlite", "2025.3")  # names its GPU
    shutil.copy(FIXTURES / "ncu" / "kernels.csv", run / "ncu" / "kernels.csv")
    (run / "nsys" / "capture.json").write_text(json.dumps({"tool": "nsys", "fallback_reason": None}))
    (run / "ncu" / "capture.json").write_text(
        json.dumps({"tool": "ncu", "fallback_reason": None, "command": ["python", "-m", "scalerepro.training.train", "--precision", "fp16"]})
    )
    summary = captures.summarize(run, "run", classify.DEFAULT_THRESHOLDS, None, "a100_sxm_80gb")
    assert summary["gpu_peaks"]["key"] == "h100_sxm" and summary["gpu_peaks"]["precision"] == "fp16"
    assert summary["peaks_basis"].startswith("NVIDIA H100 SXM5 80GB (gpu_peaks.h100_sxm, from the capture's device name")


H100_NCU = RECORDED / "ncu-2025.3.1_H100-SXM5-80GB_resnet50-bf16_raw-metrics.csv"


def test_recorded_h100_ncu_of_the_projects_own_command_is_read_whole(peaks):
    """What ncu 2025.3.1 wrote on an H100 SXM for the project's own profile command (fixture
    README: command, driver): it holds exactly the metrics the command asks for on Hopper (a
    metric ncu does not know, such as a gmma cycles counter, loses the whole profile), read in base
    units; cuDNN's bf16 fprop convolution is compute-bound at 64 % of the dense bf16 peak."""

    reading = ncu.read_ncu_csv(H100_NCU)
    assert reading.layout == "raw metric names" and reading.problems == [] and reading.compute_capabilities == ["9.0"]
    assert len(reading.launches) == 40
    with open(H100_NCU) as stream:
        written = {row["Metric Name"] for row in csv.DictReader(line for line in stream if not line.startswith("=="))}
    # what the command asked for on Hopper on 2026-11-25 (the wgmma instruction count was added since)
    assert written == set(nsight.NCU_METRICS) | {"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"}
    conv = next(row for row in roofline.roofline(reading.launches, peaks) if "fprop" in row["kernel"])
    assert conv["duration_s"] == pytest.approx(1913.888e-6) and conv["bound"] == "compute"
    assert conv["flops_fraction"] == pytest.approx(0.6437, abs=1e-3) and conv["theoretical_occupancy_pct"] == 12.5


H100_NCU_PER_CONFIG = RECORDED / "ncu-2025.3.1_H100-SXM5-80GB_resnet50-bf16-cudagraphs_per-launch-config.csv"


def test_recorded_h100_ncu_with_the_new_flags_counts_tensor_flops_only_for_wgmma(peaks):
    """What ncu 2025.3.1 wrote on an H100 for today's command (fixture README: one launch of each
    launch configuration, clocks as the run had them, the wgmma instruction count): it holds every
    metric asked for on Hopper, each launch configuration once, and the roofline counts tensor FLOPs
    against the wgmma peak only for kernels that issued wgmma; cuDNN's mma.sync stem convolution
    (s16816) is left uncounted, saying why, not credited with 64 % of the dense peak."""

    reading = ncu.read_ncu_csv(H100_NCU_PER_CONFIG)
    assert reading.layout == "raw metric names" and reading.problems == [] and reading.compute_capabilities == ["9.0"]
    assert len(reading.launches) == 231
    with open(H100_NCU_PER_CONFIG) as stream:
        rows = list(csv.DictReader(line for line in stream if line.startswith('"')))
    assert {row["Metric Name"] for row in rows} == set(nsight.NCU_METRICS) | set(nsight.tensor_pipe_metrics(9))
    configs = {(row["Kernel Name"], row["Grid Size"], row["Block Size"]) for row in rows}
    assert len(configs) == 231  # per-launch-config, launch count 1: no configuration twice
    table = roofline.roofline(reading.launches, peaks)
    stem = next(row for row in table if "s16816fprop" in row["kernel"])
    assert stem["duration_s"] == pytest.approx(1535.104e-6) and stem["tensor_flops"] is None
    assert "no wgmma instruction" in stem["tensor_work"]
    # the roofline's rows are kernels (names); 47 launch configurations of 37 kernels issued wgmma
    wgmma = [row for row in table if row["tensor_flops"]]
    issued = reading.launches[reading.launches["wgmma_instructions"] > 0]
    assert len(issued) == 47 and len(wgmma) == issued["kernel"].nunique() == 37
    assert all("sm90" in row["kernel"] for row in wgmma)
    assert all(row["flops_fraction"] <= 1.0 for row in table if row["flops_fraction"] is not None)


GH100_METRICS = RECORDED / "ncu-2025.3.1_gh100_query-metrics.txt"


def test_every_metric_asked_for_on_hopper_is_one_ncu_knows():
    """A metric ncu does not know fails the whole profile. Each one the command asks for on a
    Hopper GPU is in the real tool's gh100 list (ncu 2025.3.1 on an H100), or was read from a real
    H100 capture (derived metrics such as the theoretical occupancy are not in that list)."""

    known = {line.strip() for line in GH100_METRICS.read_text().splitlines() if line and not line.startswith("#")}
    with open(H100_NCU) as stream:
        captured = {row["Metric Name"] for row in csv.DictReader(line for line in stream if not line.startswith("=="))}
    asked = [*nsight.NCU_METRICS, *nsight.tensor_pipe_metrics(9)]
    unknown = [metric for metric in asked if metric.split(".")[0] not in known and metric not in captured]
    assert unknown == []


def test_recorded_ncu_2019_section_display_names_give_duration_occupancy_and_dram():
    """Real V100 output (README.md, source 1): every figure under a display name, "nsecond"."""
    reading = ncu.read_ncu_csv(V100_2019)
    assert reading.layout == "section display names" and reading.problems == []
    step, flux = reading.launches.set_index("kernel").loc[["cuda_compute_step_factor", "cuda_compute_flux"]].to_dict("records")
    assert step["duration"] == pytest.approx(10_720e-9) and flux["duration"] == pytest.approx(39_200e-9)
    assert step["achieved_occupancy_pct"] == 48.18 and step["theoretical_occupancy_pct"] == 93.75
    assert step["sm_throughput_pct"] == 18.70 and step["memory_throughput_pct"] == 40.07 and step["dram_throughput_pct"] == 40.07
    assert step["dram_bytes_per_s"] == pytest.approx(303_122_388_059.70)  # "Memory Throughput" in byte/second
    assert step["dram_bytes"] == pytest.approx(303_122_388_059.70 * 10_720e-9)  # bandwidth x duration
    assert step["dram_bytes_source"] == "DRAM bytes/s x duration"


def test_recorded_ncu_2025_ns_units_and_text_values_are_read_not_fatal(peaks):
    """Real sm_100 output (README.md, source 2): "ns", "hz", text-valued launch statistics
    ("PolicySpread", "CachePreferNone", "all"), rule rows and a trailing comma on metric rows."""
    reading = ncu.read_ncu_csv(CC100_2025)
    assert reading.layout == "section display names" and reading.problems == []
    (launch,) = reading.launches.to_dict("records")
    assert launch["duration"] == pytest.approx(406_240e-9)  # 406 µs, not 406 240 s
    assert launch["achieved_occupancy_pct"] == 15.53 and launch["theoretical_occupancy_pct"] == 18.75
    assert launch["sm_throughput_pct"] == 23.59 and launch["memory_throughput_pct"] == 21.68 and launch["dram_throughput_pct"] == 0.74
    assert reading.compute_capabilities == ["10.0"] and ncu.read_ncu_csv(V100_2019).compute_capabilities == []  # no CC column in 2019
    (row,) = roofline.roofline(reading.launches, peaks)
    assert row["duration_s"] == pytest.approx(406_240e-9) and row["achieved_flops_per_s"] is None
    assert row["missing"] == "FLOP count; DRAM bytes"  # sections only: no SASS counters, no DRAM byte count


def _edited(source, tmp_path, old, new):
    text = source.read_text()
    assert text.count(old) == 1
    path = tmp_path / source.name
    path.write_text(text.replace(old, new))
    return path


def test_an_unknown_unit_is_one_line_and_leaves_the_launch_untimed(tmp_path, peaks):
    path = _edited(CC100_2025, tmp_path, '"Duration","ns","406240"', '"Duration","fortnight","406240"')
    reading = ncu.read_ncu_csv(path)
    assert reading.launches.loc[0, "duration"] != reading.launches.loc[0, "duration"]  # NaN: not read as a number of anything
    unit_line, untimed_line = reading.problems
    assert "Duration: unit 'fortnight' not understood" in unit_line and "in 1 of 1 launches: not read" in unit_line
    assert "\n" not in unit_line and "1 of 1 launches have no duration" in untimed_line
    (row,) = roofline.roofline(reading.launches, peaks)
    assert row["duration_s"] is None and row["missing"].startswith("duration (1 of 1 launches)")


def test_a_metric_value_that_is_not_a_number_is_named_and_not_read(tmp_path):
    path = _edited(V100_2019, tmp_path, '"Achieved Occupancy","%","48.18"', '"Achieved Occupancy","%","n/a"')
    reading = ncu.read_ncu_csv(path)
    assert reading.problems == [f"{path.name}: Achieved Occupancy: value 'n/a' is not a number, in 1 of 2 launches: not read"]
    assert reading.launches["achieved_occupancy_pct"].isna().tolist() == [True, False]


def test_an_ncu_file_in_another_layout_is_one_clear_error(tmp_path):
    wide = tmp_path / "kernels.csv"
    wide.write_text('"ID","Kernel Name","gpu__time_duration.sum"\n"0","k","1"\n')
    with pytest.raises(intervals.ProfileError, match="not the long ncu CSV layout"):
        ncu.read_ncu_csv(wide)


# ---- the ncu command: raw metrics, base units, never an NCCL kernel --------------------------------

NCCL_KERNELS = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_Generic"]


def _ncu_command(names=None):
    return nsight.command("ncu", "0", "/out", 0, ["python", "-m", "scalerepro.training.train"], names, nsight.tensor_pipe_metrics(9))


def _kernel_regex(command):
    """The --kernel-name filter of a composed ncu command, as a Python regex (ncu's is ECMAScript:
    the lookahead and anchors used here mean the same in both)."""
    assert command[command.index("--kernel-name-base") + 1] == "function"
    value = command[command.index("--kernel-name") + 1]
    assert value.startswith("regex:")
    return re.compile(value.removeprefix("regex:"))


@pytest.mark.parametrize("names", [None, ["elementwise_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]])
def test_no_ncu_command_the_workflow_builds_can_replay_an_nccl_kernel(names):
    regex = _kernel_regex(_ncu_command(names))
    assert not any(regex.search(kernel) for kernel in NCCL_KERNELS)
    assert regex.search("elementwise_kernel")
    assert bool(regex.search("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")) is (names is None)


def test_the_top_kernels_for_ncu_leave_out_nccl(nsys_sqlite):

    # by total time: gemm 8000 ns, NCCL 4500, elementwise 2000, vectorized 1000
    assert nsight.top_kernel_names(nsys_sqlite, 2) == ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "elementwise_kernel"]


def test_the_ncu_command_asks_for_raw_metrics_in_base_units():
    command = _ncu_command()
    assert "--section" not in command
    assert command[command.index("--print-metric-name") + 1] == "name"
    assert command[command.index("--print-units") + 1] == "base"
    # clocks as the run has them, not locked at base clock (the roofline's peaks are boost-clock)
    assert command[command.index("--clock-control") + 1] == "none"
    # one launch of each launch configuration, so that no frequent kernel takes every slot
    assert command[command.index("--filter-mode") + 1] == "per-launch-config" and command[command.index("--launch-count") + 1] == "1"
    metrics = command[command.index("--metrics") + 1].split(",")
    needed = {
        "gpu__time_duration.sum",
        "dram__bytes.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        *ncu.FLOP_COUNTERS,
    }
    assert needed <= set(metrics)
    assert set(metrics) <= set(ncu.NCU_RAW) | set(ncu.FLOP_COUNTERS)  # the reader knows every one it asks for


def test_the_tensor_pipe_metric_follows_the_gpu_generation(capsys):

    assert nsight.tensor_pipe_metrics(8) == ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",)
    # Hopper: one cycles counter for wgmma and mma.sync (ncu 2025.3 knows no gmma cycles counter on an
    # H100), and the wgmma instruction count that tells them apart
    assert nsight.tensor_pipe_metrics(9) == (
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__inst_executed_pipe_tensor_op_gmma.sum",
    )
    assert nsight.tensor_pipe_metrics(12) == ()
    (line,) = capsys.readouterr().err.splitlines()
    assert "no tensor-pipe metric known for compute capability 12.x" in line


# ---- a run's summary and the tables --------------------------------------------------------------


def test_summary_and_tables_of_an_nsys_and_ncu_run(nsys_sqlite, peaks, tmp_path):
    run = tmp_path / "strong_resnet50_g8_r1"
    (run / "nsys").mkdir(parents=True)
    (run / "ncu").mkdir()
    shutil.copy(nsys_sqlite, run / "nsys" / "rank0.sqlite")
    shutil.copy(FIXTURES / "ncu" / "kernels.csv", run / "ncu" / "kernels.csv")
    for tool in ("nsys", "ncu"):
        (run / tool / "capture.json").write_text(json.dumps({"tool": tool, "fallback_reason": None}))
    summary = captures.summarize(run, run.name, classify.DEFAULT_THRESHOLDS, peaks)
    assert summary["tools"] == ["ncu", "nsys"] and not summary["fallback"]
    assert summary["classification"]["class"] == "input-bound"
    assert summary["breakdown"]["overlap_fraction"] == pytest.approx(1 / 3)
    assert len(summary["roofline"]) == 3 and len(summary["top_kernels"]) == 4
    t = captures.tables([json.loads(json.dumps(summary, default=str))])
    assert t["profiling"].loc[0, "classification"] == "input-bound"
    assert t["profiling"].loc[0, "busy_fraction"] == pytest.approx(0.7)
    assert len(t["profiling_kernels"]) == 4 and len(t["profiling_roofline"]) == 3
    assert set(t["profiling_files"]["description"]) >= {"Nsight Systems SQLite export", "Nsight Compute metrics (CSV)"}
    assert summary["warnings"] == [] and t["profiling"].loc[0, "window"] == "2 scalerepro:step ranges, to the end of their last kernel"


def test_summarize_warns_one_line_per_problem_and_the_report_shows_it(tmp_path, peaks, capsys):
    from scalerepro.analysis.presentation import report

    builder = _load(FIXTURES / "nsys" / "make_nsys_sqlite.py")
    run = tmp_path / "strong_resnet50_g8_r1"
    (run / "nsys").mkdir(parents=True)
    (run / "ncu").mkdir()
    builder.build(run / "nsys" / "rank0.sqlite", "2025.3")
    _edited(CC100_2025, run / "ncu", '"Duration","ns","406240"', '"Duration","fortnight","406240"').rename(run / "ncu" / "kernels.csv")
    (run / "nsys" / "capture.json").write_text(json.dumps({"tool": "nsys", "fallback_reason": None}))
    (run / "ncu" / "capture.json").write_text(
        json.dumps({"tool": "ncu", "fallback_reason": None, "tool_version": "Version 2025.3.1.0 (build 36398880) (public-release)"})
    )
    code = captures.main(
        ["summarize", "--run-dir", str(run), "--run-id", run.name, "--gpu-peaks", "h100_sxm", "--thresholds", "{}", "--out", str(tmp_path / "summary.json")]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["warnings"]) == 3 and all("\n" not in w for w in summary["warnings"])
    assert "unit 'fortnight' not understood" in summary["warnings"][0]
    assert summary["warnings"][2].startswith("roofline: 1 of 1 kernels have no duration (1 of 1 launches): cutlass3x_sm100_tensorop")
    printed = [line for line in capsys.readouterr().err.splitlines() if ": warning: " in line]
    assert [line.split(": warning: ", 1)[1] for line in printed] == summary["warnings"]
    tables_dir = tmp_path / "tables"
    tables_dir.mkdir()
    for name, table in captures.tables([summary]).items():
        table.to_csv(tables_dir / f"{name}.csv", index=False)
    row = pd.read_csv(tables_dir / "profiling.csv").iloc[0]
    assert "NVIDIA Nsight Systems 2025.3.2.474" in row["tool_versions"] and "Version 2025.3.1.0" in row["tool_versions"]
    assert row["gpus"] == "NVIDIA H100 80GB HBM3 (compute capability 9.0); compute capability 10.0 (ncu)" and str(row["driver"]) == "12080"
    assert pd.read_csv(tables_dir / "profiling_roofline.csv").loc[0, "missing"].startswith("duration (1 of 1 launches)")
    page = report.render(tables_dir, tmp_path / "no-plots", tmp_path / "none.json", tmp_path / "none.json", REPO / "config/references.yaml", REPO / "report")
    shown = page[page.index('id="profile-strong-resnet50-g8-r1"') :]
    for warning in summary["warnings"]:
        assert f"<li>{markupsafe.escape(warning)}</li>" in shown
    assert "Not measured</th>" in shown and "<td>duration (1 of 1 launches)</td>" in shown


# ---- the torch.profiler fallback, for real on the CPU ---------------------------------------------


@pytest.mark.slow
def test_the_torch_fallback_profiles_two_gloo_ranks_on_the_cpu(tmp_path):
    out = tmp_path / "torch"
    args = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        "16",
        "--synthetic-samples",
        "512",
        "--steps",
        "5",
        "--warmup-steps",
        "2",
        "--num-workers",
        "1",
        "--no-eval",
        "--comm-probe-steps",
        "0",
        "--progress",
        "off",
        "--profile-mode",
        "torch",
        "--profile-window-start",
        "2",
        "--profile-window-steps",
        "3",
        "--profile-dir",
        str(out),
    ]
    result = launch_ranks(2, args, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "window.json").read_text())["captured_steps"] == 3
    operators = pd.read_csv(out / "operators.csv")
    assert {"scalerepro:forward", "scalerepro:backward", "scalerepro:optimizer", "scalerepro:data"} <= set(operators["name"])
    timeline = torch_trace.read_torch_trace(out / "trace.json")
    assert timeline.source == "torch.profiler (CPU operators)" and timeline.steps == 3
    b = intervals.breakdown(timeline)
    assert b["communication_s"] > 0  # gloo's all-reduce of the two ranks' gradients
    assert sum(b[f"{c}_fraction"] for c in columns.CATEGORIES) == pytest.approx(1.0)
    assert classify.classify(b, classify.DEFAULT_THRESHOLDS)["class"] in columns.BOTTLENECK_CLASSES


@pytest.mark.slow
def test_a_window_past_the_end_of_the_run_is_a_usage_error(tmp_path):
    from conftest import python_train

    result = python_train(
        [
            "--model",
            "cnn",
            "--steps",
            "4",
            "--warmup-steps",
            "1",
            "--synthetic-samples",
            "256",
            "--no-eval",
            "--progress",
            "off",
            "--profile-mode",
            "torch",
            "--profile-window-start",
            "3",
            "--profile-window-steps",
            "3",
            "--profile-dir",
            str(tmp_path),
        ]
    )
    assert result.returncode == 2
    assert "the profiling window (steps 3..5) ends after the run's 4 steps" in result.stderr


@pytest.mark.slow
def test_cuda_api_mode_on_the_cpu_is_a_one_line_usage_error_naming_the_fallback(tmp_path):
    """It used to fail at the window's first step with torch's "Torch not compiled with CUDA"."""
    from conftest import load_record, python_train

    result = python_train(
        [
            "--model",
            "cnn",
            "--device",
            "cpu",
            "--num-workers",
            "0",
            "--steps",
            "4",
            "--warmup-steps",
            "1",
            "--synthetic-samples",
            "256",
            "--no-eval",
            "--progress",
            "off",
            "--profile-mode",
            "cuda_api",
            "--profile-window-start",
            "1",
            "--profile-window-steps",
            "2",
            "--record",
            str(tmp_path / "r.json"),
        ]
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--profile-mode cuda_api" in result.stderr and "use --profile-mode torch" in result.stderr
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "failed" and record["error"]["type"] == "TrainerConfigError"
