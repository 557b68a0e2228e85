"""A one-H100 study stopped part-way, as it came back from the GPU, kept as it is in
benchmarks/gpu/h100-2026-11-27/study-results: nine of its sixteen cells (the six frontier cells,
three of the ablation's), the Nsight Compute capture of ResNet-18's CUDA-graph step, one ablation
cell interrupted by the call's budget (its log, no record), six cells never started. Rebuilt with
today's code in a process where torch cannot be imported, as a later session's reader would.

What it pins: the report renders from a study stopped part-way; the cells that have no record are
failures or absent, never results, and the one that was stopped says so from its log; the frontier figures are the records' own; ResNet-18's profile
says what its step is made of (the convolutions against Inductor's fused normalisation kernels,
the stem's convolution on the CUDA cores)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, kept_study_rebuilt_once, section, section_element, table_rows, visible

KEPT = REPO / "benchmarks" / "gpu" / "h100-2026-11-27"
STUDY = KEPT / "study-results"
PROFILED = "strong_resnet18_cifar_g1_r1"
FRONTIER = ("resnet50", "resnet18_cifar", "gpt2_small", "bert_base", "vit_b_16", "llama_1b")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> RebuiltStudy:
    return kept_study_rebuilt_once(tmp_path_factory, STUDY)


def test_the_frontier_records_are_the_studys_cells_and_every_one_ran_on_the_h100():
    for model in FRONTIER:
        kept = json.loads((KEPT / f"{model}-optimised-frontier.json").read_text())
        cell = json.loads((STUDY / "runs" / f"strong_{model}_g1_r1" / "record.json").read_text())
        assert kept == cell, model
        assert kept["status"] == "ok" and kept["hardware"]["gpu"]["name"] == "NVIDIA H100 80GB HBM3", model
        assert kept["measurements"]["window_s"] >= 3.0, model  # the window of at least 3 s


@REBUILDS_A_STUDY
def test_only_the_nine_measured_cells_count_and_the_rest_are_not_results(study):
    runs = pd.read_csv(study.results / "tables" / "runs.csv")
    counted = set(runs.loc[runs["counts"].astype(bool), "run_id"])
    assert counted == {f"strong_{m}_g1_r1" for m in FRONTIER} | {f"ablation_resnet18_cifar_g1_{v}_r1" for v in ("baseline", "bf16", "cudnn_benchmark")}
    # the interrupted cell (a log, no record) and the six never started: no figure, and said so
    ablation = pd.read_csv(study.results / "tables" / "ablation.csv").set_index("variant")
    assert set(ablation.index[ablation["samples_per_s_median"].notna()]) == {"baseline", "bf16", "cudnn_benchmark"}
    summary = visible(section_element(study.html, "summary"))
    assert "Runs 16 planned: 9 ok 7 missing" in summary
    assert "ablation (3 of 8 ok), reproduce (0 of 2 ok), strong (6 of 6 ok)" in summary
    rows = {row[2]: row for row in table_rows(section(study.html, "ablation")) if len(row) > 2}
    assert rows["device_loader"][3] == "0 / 1" and rows["device_loader"][-1] == "no completed repeat"
    assert rows["bf16"][4] == "24,608"
    # why the interrupted cell has no record: its log's last line, beside the rerun command
    errors = runs.set_index("run_id")["error"]
    assert errors["ablation_resnet18_cifar_g1_device_loader_r1"].endswith(
        "record.json; its log ends: [default0]:scalerepro.training.train: interrupted: what it writes is written whole or not at all;"
        " run it again (results/runs/ablation_resnet18_cifar_g1_device_loader_r1/train.log)"  # as the study names it: no path of this machine
    )
    assert errors["ablation_resnet18_cifar_g1_compile_r1"].endswith("/runs/ablation_resnet18_cifar_g1_compile_r1/record.json")  # never started: no log
    failures = visible(section_element(study.html, "failures"))
    assert "its log ends: [default0]:scalerepro.training.train: interrupted" in failures


@REBUILDS_A_STUDY
def test_resnet18s_profile_names_the_normalisation_kernels_and_the_stem_on_the_cuda_cores(study):
    kernels = pd.read_csv(study.results / "tables" / "profiling_kernels.csv")
    assert len(kernels) == 128 and kernels["calls"].sum() == 137 and kernels["total_s"].sum() == pytest.approx(6.729984e-3)
    by_kind = kernels.groupby("kind")["total_s"].sum() / kernels["total_s"].sum()
    assert by_kind["convolution"] == pytest.approx(0.4696, abs=1e-3)
    assert by_kind["fused elementwise (Triton)"] + by_kind["fused reduction (Triton)"] == pytest.approx(0.5065, abs=1e-3)
    roof = pd.read_csv(study.results / "tables" / "profiling_roofline.csv")
    stem = roof[roof["kernel"].str.startswith("void convolve_common_engine_float_NHWC")].iloc[0]
    # no tensor-core work: its tensor pipe ran only the HFMA2.MMA its SASS counters hold, so it is under the FP32 CUDA-core roof
    assert stem["duration_s"] == pytest.approx(311.264e-6) and stem["tensor_flops"] == 0 and stem["roof"] == "FP32 CUDA cores"
    assert stem["cuda_core_flops"] == pytest.approx(4.4040192e9)
    shown = section(study.html, f"profile-{PROFILED.replace('_', '-')}")
    first = next(row for row in table_rows(shown) if row and row[0] == "1")  # the kernels' table's (the roofline's numbers them too)
    assert first[1].startswith("convolve_common_engine_float_NHWC<__nv_bfloat16") and first[2] == "convolution"
