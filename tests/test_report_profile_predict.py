"""Issue 33, points 4 and 5, on the real H100 output: the one-H100 study this project kept
(benchmarks/gpu/h100-2026-11-26/study-results: five completed runs and the Nsight Compute capture
of ResNet-50's CUDA-graph step, 231 launch configurations) rebuilt with today's code.

Point 4, profiling shows the step: the kernels that took the profiled step's time, by time and
by kind, with what their shares are of; each kernel under the roof of its pipe and precision; a
failed capture said in the report with its error; no "no Nsight Compute kernel profile" above an
ncu table. Point 5, predictions on the shape a GPU user has: with no preset named, the preset of
the study's GPU (an H100 SXM5 on dgx_h100), said so; no one-GPU box predicted as eight one-GPU
nodes; no 100 % at one GPU; the part of a predicted loss that is fixed per-step cost named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scalerepro.analysis.presentation import plots, profile_plots, report
from scalerepro.analysis.profiles import captures, classify, ncu, roofline
from scalerepro.analysis.profiles.kernels import MATRIX_KINDS
from scalerepro.analysis.tables import scaling_model
from scalerepro.common import study_layout

from conftest import REPO, free_port
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, rebuild_kept_study, section, table_rows, visible

STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-26" / "study-results"
PROFILED = "strong_resnet50_g1_r1"
REFERENCES = REPO / "config" / "references.yaml"
RECORDED_NCU = REPO / "tests" / "fixtures" / "ncu" / "recorded"
H100_NCU_2025_11_25 = RECORDED_NCU / "ncu-2025.3.1_H100-SXM5-80GB_resnet50-bf16_raw-metrics.csv"  # no wgmma count in it


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> RebuiltStudy:
    """The kept study rebuilt (``rebuild --results``) in a process where torch cannot be imported,
    its config's ``scaling.predict_cluster`` (dgx_h100 as it ran) set to null: a GPU study that
    names no cluster preset, the path of point 5."""

    def no_cluster(config: dict) -> None:
        assert config["scaling"]["predict_cluster"] == "dgx_h100"
        config["scaling"]["predict_cluster"] = None

    return rebuild_kept_study(STUDY, tmp_path_factory.mktemp("h100-study"), no_cluster)


# ---- point 4: profiling shows the step ---------------------------------------------------------


@REBUILDS_A_STUDY
def test_ncu_alone_lists_the_steps_kernels_by_time_and_says_what_their_share_is_of(study):
    """The capture is ncu alone (no nsys timeline): the kernels by time are ncu's, every one of
    them, their sum one launch of each launch configuration (25.2 ms); the report's shares are of
    the run's measured 45.3 ms step, with the launches not captured one by one and the idle time
    as rows of their own (tests/test_step_breakdown.py has the breakdown's sums)."""
    kernels = pd.read_csv(study.results / "tables" / "profiling_kernels.csv")
    assert len(kernels) == 211 and kernels["calls"].sum() == 231  # every kernel, every launch configuration once
    assert kernels["total_s"].is_monotonic_decreasing and kernels["share"].sum() == pytest.approx(1.0)
    assert kernels["total_s"].sum() == pytest.approx(25.229152e-3)
    by_kind = kernels.groupby("kind")["total_s"].sum() / kernels["total_s"].sum()
    assert by_kind["convolution"] == pytest.approx(0.2192, abs=1e-4) and by_kind["GEMM"] == pytest.approx(0.0833, abs=1e-4)
    profiling = pd.read_csv(study.results / "tables" / "profiling.csv").iloc[0]
    assert "one launch of each of 231 launch configurations (211 kernels)" in profiling["kernel_basis"]

    shown = section(study.html, f"profile-{PROFILED.replace('_', '-')}")
    text = visible(shown)
    assert "No kernel or operator recorded" not in text
    assert "Nsight Compute captured one launch of each of the 231 launch configurations (kernel, grid and block) of the step, 25.2 ms in all" in text
    assert (
        "45.3 ms a step, the measured run's median step (runs.csv step_time_median_s), without the profiler "
        "(the measured run: p10–p90 45.3–46.9 ms over n = 67 measured steps)"
    ) in text
    assert "Each share is of the 45.3 ms step" in text
    rows = {row[0]: row for row in table_rows(shown) if row}
    assert rows["convolution"][1:] == ["23", "33", "5.53 ms", "12.2 %"]  # kernels, configurations, one launch each, share of the step
    assert rows["normalisation and elementwise"][3:] == ["16.9 ms", "37.3 %"]
    assert rows["launches of the same configurations again, not captured one by one"][3:] == ["19.0 ms", "41.9 %"]
    first = next(row for row in table_rows(shown) if row and row[0] == "1")  # the kernels' table's (the roofline's numbers them too)
    assert first[1].startswith("cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop") and first[2] == "convolution"
    assert first[5:] == ["1.54 ms", "3.4 %"]  # one launch, and its part of the 45.3 ms step


@REBUILDS_A_STUDY
def test_each_kernel_is_set_under_the_roof_of_its_pipe_and_precision(study):
    """On the real capture: tensor-core work under the dense tensor roof, nothing that does no
    matrix work under a tensor roof, and the 41 kernels with no floating-point work (integer
    gathers, copies, ReLU's compare-and-select) under no FLOP roof at all, not at intensity 0
    as memory-bound under the FP32 roof."""
    roof = pd.read_csv(study.results / "tables" / "profiling_roofline.csv")
    matrix = roof["kind"].isin(MATRIX_KINDS)
    assert not roof.loc[~matrix, "roof"].str.contains("dense tensor").any()
    on_tensor = roof[roof["tensor_flops"] > 0]
    assert len(on_tensor) == 37 and (on_tensor["roof"] == "bf16 dense tensor cores").all()
    no_fp = roof[(roof["cuda_core_flops"] == 0) & (roof["tensor_flops"] == 0)]
    assert len(no_fp) == 41 and no_fp["kernel"].str.contains("gather_kernel<16, long>").any()
    assert no_fp["peak_flops_per_s"].isna().all() and no_fp["arithmetic_intensity"].isna().all() and no_fp["bound"].isna().all()
    assert (no_fp["roof"] == "none: no floating-point work (integer, copy or data movement)").all()
    assert no_fp["dram_fraction"].notna().all()  # their memory traffic is still measured
    # the 2026-11-25 capture has no wgmma count: an elementwise kernel whose tensor pipe the
    # counter shows busy (HFMA2.MMA) is still not given tensor-core FLOPs
    old = roofline.roofline(ncu.read_ncu_csv(H100_NCU_2025_11_25).launches, roofline.gpu_peaks("h100_sxm", "bf16"))
    elementwise = [row for row in old if row["kind"] not in MATRIX_KINDS]
    assert elementwise and all(row["tensor_flops"] == 0 and "tensor" not in (row["peak"] or "") for row in elementwise)
    assert any("do no matrix work; its tensor pipe was busy" in row["tensor_work"] for row in elementwise)


def test_a_kernels_tensor_roof_is_the_precision_its_name_states():
    """cuDNN's sm90 kernels name their precision (bf16bf16_bf16f32); cuBLAS's nvjet kernels do not.
    Read against an fp16 run's peaks, the named ones keep their bf16 roof, the unnamed take the run's."""
    launches = ncu.read_ncu_csv(STUDY / "profiles" / PROFILED / "ncu" / "kernels.csv").launches
    rows = [row for row in roofline.roofline(launches, roofline.gpu_peaks("h100_sxm", "fp16")) if row["tensor_flops"]]
    named = [row for row in rows if "bf16bf16" in row["kernel"]]
    unnamed = [row for row in rows if row["kernel"].startswith("nvjet")]
    assert named and all(row["roof"] == "bf16 dense tensor cores" for row in named)
    assert unnamed and all(row["roof"] == "fp16 dense tensor cores" for row in unnamed)


@REBUILDS_A_STUDY
def test_no_no_ncu_profile_placeholder_above_an_ncu_table(study):
    """A capture whose kernels have no FLOP roof (as the 2026-11-25 study's: integer kernels only)
    is not called "no Nsight Compute kernel profile" above its own table; this study's capture
    has kernels on the roofline, and the figure is drawn."""
    assert "no Nsight Compute kernel profile" not in section(study.html, "profiling")
    tables = plots.read_tables(study.results / "tables")
    without_roof = tables["profiling_roofline"][tables["profiling_roofline"]["arithmetic_intensity"].isna()]
    # 41 without floating-point work, 5 whose tensor-core work is not counted (mma.sync); the half-
    # precision ones on the CUDA cores are under the BF16 CUDA-core roof, and the matrix kernels
    # whose tensor pipe ran only HFMA2.MMA under the FP32 one (tests/test_step_breakdown.py)
    assert len(without_roof) == 46
    with pytest.raises(plots.NotMeasured, match=r"none of the 46 kernels Nsight Compute profiled has a FLOP roof"):
        profile_plots.roofline({**tables, "profiling_roofline": without_roof})


def _failed_ncu_capture(run: Path) -> None:
    """The ncu folder a failed capture leaves: capture.json as scalerepro.launching.profile_job
    writes it for a non-zero exit, ncu's --log-file with the error line ncu prints for a metric
    it does not know (no table), the job's log."""
    (run / "ncu").mkdir(parents=True)
    (run / "ncu" / "capture.json").write_text(
        json.dumps({"tool": "ncu", "requested": "ncu", "fallback_reason": None, "command": [], "tool_version": None, "status": "failed", "exit_code": 1})
    )
    (run / "ncu" / "kernels.csv").write_text(
        "==PROF== Connected to process 725 (/usr/bin/python3.12)\n"
        "==ERROR== Failed to find metric sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed\n"
    )
    (run / "ncu" / "profile.log").write_text("$ python -m scalerepro.launching.launch ...\n[default0]:step 10/21 | loss 7.69\n")


def test_a_failed_capture_is_in_the_report_with_its_error(tmp_path):
    run = tmp_path / "profiles" / PROFILED
    _failed_ncu_capture(run)
    summary = captures.summarize(run, PROFILED, classify.DEFAULT_THRESHOLDS, None, "h100_sxm", "bf16", "NVIDIA H100 80GB HBM3")
    error = "==ERROR== Failed to find metric sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"
    assert summary["failed_captures"]["ncu"]["error"].startswith(f"{error} (exit 1; log: ")
    assert summary["top_kernels"] == [] and summary["roofline"] == [] and summary["warnings"][0].startswith(f"ncu capture failed: {error}")
    tables = tmp_path / "tables"
    tables.mkdir()
    for name, table in captures.tables([summary]).items():
        table.to_csv(tables / f"{name}.csv", index=False)
    page = report.render(tables, None, None, None, REFERENCES, REPO / "report")
    shown = section(page, f"profile-{PROFILED.replace('_', '-')}")
    assert '<span class="badge failed">capture failed</span>' in shown
    assert f"<li><code>ncu: {error} (exit 1; log: {run}/ncu/profile.log)</code></li>" in shown
    assert "this run has no profile" in visible(shown) and "No kernel or operator recorded" not in shown
    assert "<code>snakemake --cores all --forcerun results/profiles/strong_resnet50_g1_r1/ncu/capture.json</code>" in shown


def test_a_profiling_job_that_fails_writes_its_failure_and_the_report_shows_the_error(tmp_path):
    """The real job on this CPU: the torch.profiler capture of a trainer that rejects its flags.
    The job exits 0 with capture.json saying failed (the workflow goes on to the report, as for a
    failed training run), and the error is the trainer's own line from the job's log."""
    capture = tmp_path / "profiles" / "run" / "torch" / "capture.json"
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalerepro.launching.profile_job",
            "--tool",
            "torch",
            "--capture",
            str(capture),
            "--log",
            str(capture.parent / "profile.log"),
            "--window-start",
            "2",
            "--window-steps",
            "1",
            "--launch",
            "--nodes=1",
            "--ranks-per-node=1",
            "--cpus-per-node=1",
            f"--port={free_port()}",
            "--name=profile_run",
            "--",
            "--model",
            "cnn",
            "--data",
            "synthetic",
            "--per-gpu-batch",
            "4",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--device",
            "cpu",
            "--precision",
            "fp8",
            "--record",
            str(tmp_path / "record.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stderr[-2000:]
    written = json.loads(capture.read_text())
    assert written["status"] == "failed" and written["exit_code"] == 2 and "capture.json says so" in job.stderr
    summary = captures.summarize(capture.parent.parent, "run", classify.DEFAULT_THRESHOLDS, None, "h100_sxm")
    assert "error: argument --precision: invalid choice: 'fp8'" in summary["failed_captures"]["torch"]["error"]
    assert summary["breakdown"] is None and summary["top_kernels"] == []


# ---- point 5: predictions on the shape a GPU user has ----------------------------------------------


@REBUILDS_A_STUDY
def test_a_gpu_study_naming_no_preset_predicts_on_its_gpus_preset_and_says_so(study):
    model = pd.read_csv(study.results / "tables" / "scaling_model.csv")
    predicted = model[model["basis"].eq("predicted") & model["step_time_predicted_s"].notna()]
    assert set(predicted["study"]) == {"strong", "weak"} and (predicted["cluster"] == "dgx_h100").all()
    # weak: every model at its one-GPU batch at 8, 16, 64 GPUs; strong: 5 models x 8, 16, 64, each holding a
    # global batch that splits over all three (scaling_model.held_global_batch)
    assert predicted["study"].value_counts().to_dict() == {"weak": 15, "strong": 15}
    predicted = predicted.set_index(["model", "gpus"])
    # a one-H100 box: 8 GPUs are one DGX H100 node on NVLink, not 8 one-GPU nodes on InfiniBand
    assert predicted.xs(8, level="gpus")["nodes"].eq(1).all() and predicted.xs(64, level="gpus")["nodes"].eq(8).all()
    assert (predicted["cluster_basis"] == "the preset of the study's GPU, NVIDIA H100 80GB HBM3 = H100 SXM5: scaling.predict_cluster is not set").all()
    text = visible(section(study.html, "scaling-model"))
    assert (
        "Predictions beyond the study's hardware run on dgx_h100 (the preset of the study's GPU, NVIDIA H100 80GB HBM3 = H100 SXM5: "
        "scaling.predict_cluster is not set): NVIDIA DGX H100, 8 GPUs/node;"
    ) in text


def _model_inputs(study: RebuiltStudy) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """The scaling model's tables, and each run's record inside the study folder (study_layout's one rule)."""
    tables = study.results / "tables"
    runs = pd.read_csv(tables / "runs.csv")
    runs["counts"] = runs["counts"].astype(bool)
    files = {run_id: str(study_layout.record_file(record, study.results)) for run_id, record in zip(runs["run_id"], runs["record"])}
    return runs, pd.read_csv(tables / "scaling.csv"), files


@REBUILDS_A_STUDY
def test_a_named_preset_wins_and_a_gpu_no_preset_has_is_not_predicted_as_one_gpu_nodes(study, tmp_path):
    runs, scaling, files = _model_inputs(study)
    named = scaling_model.scaling_model_table(runs, scaling, [], REFERENCES, [8, 16], "dgx_a100", files).set_index(["study", "model", "gpus"])
    assert named.loc[("strong", "resnet50", 8), "cluster"] == "dgx_a100" and named.loc[("strong", "resnet50", 8), "cluster_basis"] == "scaling.predict_cluster"
    document = yaml.safe_load(REFERENCES.read_text())
    document.pop("clusters")  # no preset has the study's GPU
    references = tmp_path / "references.yaml"
    references.write_text(yaml.safe_dump(document))
    table = scaling_model.scaling_model_table(runs, scaling, [], references, [8, 16], None, files).set_index(["study", "model", "gpus"])
    row = table.loc[("strong", "resnet50", 8)]
    assert pd.isna(row["step_time_predicted_s"]) and pd.isna(row["nodes"])
    assert row["note"].startswith("no prediction beyond the one-GPU node the study ran on: no cluster preset in config/references.yaml has the study's GPU")


@REBUILDS_A_STUDY
def test_no_efficiency_at_one_gpu_and_a_loss_from_fixed_cost_says_so(study):
    model = pd.read_csv(study.results / "tables" / "scaling_model.csv")
    predicted = model[model["basis"].eq("predicted") & model["efficiency_predicted"].notna()]
    # the parts of the loss add up to it
    parts = predicted[["loss_fixed_cost", "loss_exposed_comm", "loss_compute_inflation", "loss_straggler"]].fillna(0).sum(axis=1)
    assert parts.to_numpy() == pytest.approx(1 - predicted["efficiency_predicted"].to_numpy())
    # ViT at 64 GPUs, its held global batch 8,192 (128 a GPU, the one-GPU micro-batch): what it loses
    # is mostly the optimizer and loop overhead every GPU still spends
    vit = predicted.set_index(["study", "model", "gpus"]).loc[("strong", "vit_b_16", 64)]
    assert vit["loss_fixed_cost"] == pytest.approx(0.016, abs=1e-3) and vit["loss_exposed_comm"] == pytest.approx(0.003, abs=1e-3)
    shown = section(study.html, "scaling-model")
    text = visible(shown)
    assert (
        "Where the fixed per-step cost is most of it, a faster network would not win it back: vit_b_16 at 64 GPUs (1.6 % lost to "
        "0.7 ms a step of optimizer and loop overhead that every GPU still spends, 0.3 % to the exposed all-reduce)"
    ) in text
    rows = table_rows(shown)
    header = rows[0]
    by_cell = {(row[header.index("Study")], row[header.index("Model")], row[header.index("GPUs")]): dict(zip(header, row)) for row in rows[1:]}
    assert by_cell[("strong", "vit_b_16", "64")]["Loss mostly from"] == "fixed per-step cost"
    assert by_cell[("strong", "gpt2_small", "64")]["Loss mostly from"].startswith("exposed all-reduce")
    for name in ("bert_base", "gpt2_small", "resnet18_cifar", "resnet50", "vit_b_16"):
        one = by_cell[("strong", name, "1")]
        # the one-GPU step is the model's input and every efficiency's denominator: no 100 %, no +0 %
        # (a column no row has a value in is left out)
        assert [one.get(column, "—") for column in ("Efficiency measured", "Efficiency predicted", "Predicted vs measured")] == ["—"] * 3
        assert one["Note"].startswith("the reference: every efficiency and speed-up is against this measured one-GPU step")
