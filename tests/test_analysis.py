"""The analysis side: every table checked against numbers computed by hand from the fixture study
(``analysis_fixtures``), the checks' pass / fail / not-measured logic, the figures (placeholders
included), the command lines without torch, and the record reader's speed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from analysis_fixtures import (
    CPU_NVML_REASON,
    FAILED_MESSAGE,
    H100,
    VALIDATOR,
    make_record,
    write_comm,
    write_cpu_study,
    write_gpu_study,
    write_many_records,
)
from scalerepro.analysis import aggregate, plots

TARGETS = {
    "strong_efficiency_min": 0.7,
    "strong_efficiency_gpus": 4,
    "weak_variation_max": 0.10,
    "optimisation_gain_min": 0.20,
    "gpu_util_min_pct": 80,
    "exposed_comm_max": 0.20,
    "data_stall_max": 0.05,
}
NO_TORCH = "import sys; sys.modules['torch'] = None  # importing torch now raises ImportError\n"


@pytest.fixture(scope="module")
def gpu(tmp_path_factory) -> tuple[dict[str, pd.DataFrame], dict, Path]:
    root = tmp_path_factory.mktemp("gpu")
    args = write_gpu_study(root)
    return aggregate.aggregate(**args, targets=TARGETS), args, root


@pytest.fixture(scope="module")
def cpu(tmp_path_factory) -> tuple[dict[str, pd.DataFrame], dict, Path]:
    root = tmp_path_factory.mktemp("cpu")
    args = write_cpu_study(root)
    return aggregate.aggregate(**args, targets=TARGETS), args, root


def row(frame: pd.DataFrame, **where) -> pd.Series:
    match = frame.loc[(frame[list(where)] == pd.Series(where)).all(axis=1)]
    assert len(match) == 1, f"{len(match)} rows match {where}"
    return match.iloc[0]


def check(tables: dict[str, pd.DataFrame], key: str) -> pd.Series:
    return row(tables["checks"], check=key)


def test_fixture_records_match_the_schema(gpu):
    _, _, root = gpu
    records = sorted((root / "runs").glob("*.json"))
    assert len(records) == 21  # 22 planned runs, one missing
    for path in records:
        assert not list(VALIDATOR.iter_errors(json.loads(path.read_text()))), path


def test_runs_keep_every_planned_run(gpu):
    tables, _, _ = gpu
    runs = tables["runs"]
    assert list(runs.columns) == list(aggregate.RUN_COLUMNS)
    assert len(runs) == 22
    assert runs["status"].value_counts().to_dict() == {"ok": 19, "failed": 1, "preempted": 1, "missing": 1}
    missing = row(runs, run_id="strong_resnet50_g4_r3")
    assert (
        missing["status"] == "missing" and "no run record at" in missing["error"] and pd.isna(missing["samples_per_s"])
    )
    assert pd.isna(missing["consistent"]) and missing["rerun"].startswith("snakemake")
    failed = row(runs, run_id="strong_resnet50_g4_r2")
    assert failed["status"] == "failed" and failed["error"] == FAILED_MESSAGE
    assert row(runs, run_id="ablation_resnet50_g2_channels_last_r1")["stop_signal"] == "SIGTERM"
    assert not row(runs, run_id="weak_resnet50_g2_r3")["consistent"]  # the record says world size 1
    assert runs["consistent"].eq(False).sum() == 1
    one = row(runs, run_id="strong_resnet50_g4_r1")
    assert one["duration_s"] == 360.0 and one["world_size_recorded"] == 4 and one["nodes_recorded"] == 2
    assert one["device_name"] == H100 and one["device_type"] == "cuda" and one["slurm_job_id"] == "4182000"
    assert one["peak_memory_bytes"] == 4_000_000_000 and one["peak_memory_kind"] == "cuda_allocated"
    assert one["energy_per_sample_j"] == pytest.approx(500 * 2 / (340 * 2))  # power x window / samples
    assert (one["final_train_loss"], one["final_eval_loss"], one["final_eval_accuracy"]) == (1.5, 1.6, 0.4)


def test_long_tables(gpu):
    tables, _, _ = gpu
    assert list(tables["epochs"].columns) == list(aggregate.EPOCH_COLUMNS)
    assert list(tables["loss_log"].columns) == list(aggregate.LOSS_COLUMNS)
    assert len(tables["epochs"]) == 21 * 2 and len(tables["loss_log"]) == 21 * 6
    last = tables["loss_log"].query("run_id == 'strong_resnet50_g1_r1'").iloc[-1]
    assert (last["step"], last["loss"]) == (24, pytest.approx(2.5 - 0.04 * 24))


def test_strong_scaling(gpu):
    scaling = gpu[0]["scaling"]
    g1 = row(scaling, study="strong", gpus=1)
    assert (g1["samples_per_s_median"], g1["samples_per_s_min"], g1["samples_per_s_max"]) == (100, 90, 110)
    g2 = row(scaling, study="strong", gpus=2)
    assert g2["speedup"] == pytest.approx(1.8) and g2["efficiency"] == pytest.approx(0.9)  # 180 / (2 x 100)
    assert g2["samples_per_s_per_gpu"] == pytest.approx(90) and g2["ideal_speedup"] == 2
    g4 = row(scaling, study="strong", gpus=4)
    assert (g4["repeats_ok"], g4["repeats_total"], g4["nodes"]) == (1, 3, 2)  # one failed, one missing
    assert g4["samples_per_s_median"] == 340 and g4["efficiency"] == pytest.approx(0.85)
    assert g2["step_time_median_s"] == pytest.approx(16 * 2 / 180)  # median over repeats of each run's median


def test_weak_scaling_uses_epoch_time_and_skips_inconsistent_runs(gpu):
    g2 = row(gpu[0]["scaling"], study="weak", gpus=2)
    assert (g2["repeats_ok"], g2["repeats_total"]) == (2, 3)
    assert g2["epoch_time_s"] == pytest.approx(11.5)  # median of 11 and 12; the 100 s record is not counted
    assert g2["efficiency"] == pytest.approx(10 / 11.5)  # T(1) / T(N)
    assert g2["samples_per_s_max"] == 160


def test_missing_baseline_gives_nan_and_says_why(tmp_path):
    args = write_gpu_study(tmp_path)
    matrix = pd.read_csv(args["matrix_path"], dtype={"variant": str})
    matrix = matrix[~((matrix["study"] == "strong") & (matrix["gpus"] == 1))]
    matrix.to_csv(args["matrix_path"], index=False)
    tables = aggregate.aggregate(**args, targets=TARGETS)
    g2 = row(tables["scaling"], study="strong", gpus=2)
    assert pd.isna(g2["speedup"]) and pd.isna(g2["efficiency"]) and "no completed 1-GPU run" in g2["note"]
    assert check(tables, "strong_efficiency_min")["status"] == "not measured"
    assert "no completed 1-GPU run" in check(tables, "strong_efficiency_min")["detail"]


def test_sensitivity(gpu):
    sensitivity = gpu[0]["sensitivity"]
    assert len(sensitivity) == 4
    cell = row(sensitivity, bucket_cap_mb=25.0, per_rank_batch=64, precision="bf16")
    assert (cell["samples_per_s_median"], cell["repeats_ok"], cell["gpus"]) == (260, 1, 2)
    assert cell["exposed_comm_fraction"] == pytest.approx(0.1)


def test_ablation_gain(gpu):
    ablation = gpu[0]["ablation"]
    assert list(ablation["variant"]) == ["baseline", "bf16", "channels_last", "all"]  # matrix order
    assert list(ablation["gain"].round(6)[[0, 1, 3]]) == [0.0, 0.5, 0.3]  # 150 / 100 - 1, 130 / 100 - 1
    preempted = row(ablation, variant="channels_last")
    assert pd.isna(preempted["gain"]) and preempted["repeats_ok"] == 0 and preempted["note"] == "no completed repeat"


def test_communication_bandwidths(gpu, tmp_path):
    comm = gpu[0]["communication"]
    assert list(comm.columns) == list(aggregate.COMM_COLUMNS) and len(comm) == 6
    cell = row(comm, gpus=4, size_bytes=1048576)
    assert cell["algbw_gbps"] == pytest.approx(1048576 / 80e-6 / 1e9)  # size / t
    assert cell["busbw_gbps"] == pytest.approx(cell["algbw_gbps"] * 2 * 3 / 4)  # algbw x 2 (N - 1) / N
    assert (cell["nodes"], cell["backend"]) == (2, "nccl")
    assert (comm.query("gpus == 2")["busbw_gbps"] == comm.query("gpus == 2")["algbw_gbps"]).all()  # 2 (2-1)/2 = 1
    wrong = write_comm(tmp_path / "g4.json", 4, 2, {1024: 30.0})
    document = json.loads(wrong.read_text())
    document["results"][0]["busbw_gbps"] = document["results"][0]["algbw_gbps"]  # forgot 2 (N - 1) / N
    wrong.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="disagree"):
        aggregate.communication_table([wrong])


def test_comparison_with_references(gpu):
    comparison = gpu[0]["comparison"]
    assert len(comparison) == 3  # every reference, matched or not
    matched = row(comparison, reference="ref-r50-2")
    # strong 180 beats weak 155 and ablation "all" 130 at 2 GPUs
    assert matched["measured"] == 180 and matched["published"] == 200 and matched["ratio"] == pytest.approx(0.9)
    assert matched["measured_cell"] == "strong, bf16, batch 16/GPU, median of 3"
    assert matched["measured_device"] == H100 and matched["source"] == "a paper, table 3" and matched["note"] == ""
    for reference in ("ref-r50-4-tokens", "ref-gpt2-8"):
        unmatched = row(comparison, reference=reference)
        assert pd.isna(unmatched["measured"]) and pd.isna(unmatched["ratio"])
        assert unmatched["note"].startswith("not measured")


def test_checks_pass_and_fail(gpu):
    tables = gpu[0]
    assert list(tables["checks"]["check"]) == list(aggregate.CHECKS)
    strong = check(tables, "strong_efficiency_min")
    assert (strong["status"], strong["measured"], strong["target"]) == (
        "pass",
        pytest.approx(0.85),
        "strong-scaling efficiency >= 70% at 4 GPUs",
    )
    weak = check(tables, "weak_variation_max")
    assert weak["status"] == "fail" and weak["measured"] == pytest.approx(0.15)  # (11.5 - 10) / 10
    assert check(tables, "optimisation_gain_min")["measured"] == pytest.approx(0.3)
    assert check(tables, "optimisation_gain_min")["status"] == "pass"
    assert check(tables, "gpu_util_min_pct")[["status", "measured"]].tolist() == ["pass", 90.0]
    exposed = check(tables, "exposed_comm_max")
    assert exposed["status"] == "pass" and exposed["measured"] == 0.15 and "strong_resnet50_g4_r1" in exposed["detail"]
    stall = check(tables, "data_stall_max")
    assert stall["status"] == "pass" and stall["measured"] == 0.03 and "strong_resnet50_g1_r2" in stall["detail"]


def test_checks_follow_the_thresholds(gpu):
    tables = gpu[0]
    strict = {
        "strong_efficiency_min": 0.9,
        "strong_efficiency_gpus": 4,
        "weak_variation_max": 0.2,
        "optimisation_gain_min": 0.35,
        "gpu_util_min_pct": 90,
        "exposed_comm_max": 0.15,
        "data_stall_max": 0.03,
    }
    statuses = aggregate.checks_table(tables, strict).set_index("check")["status"].to_dict()
    # pass at equality for >= / <= targets, fail at equality for the strict > / < ones
    assert statuses == {
        "strong_efficiency_min": "fail",
        "weak_variation_max": "pass",
        "optimisation_gain_min": "fail",
        "gpu_util_min_pct": "fail",
        "exposed_comm_max": "fail",
        "data_stall_max": "fail",
    }
    at_8 = aggregate.checks_table(tables, {"strong_efficiency_min": 0.7, "strong_efficiency_gpus": 8}).iloc[0]
    assert at_8["status"] == "not measured" and "no strong-scaling cell at 8 GPUs" in at_8["detail"]
    default_gpus = aggregate.checks_table(tables, {"strong_efficiency_min": 0.7}).iloc[0]
    assert default_gpus["target"].endswith(">= 70% at 4 GPUs")  # the largest strong-scaling count
    assert aggregate.checks_table(tables, {}).empty


def test_cpu_study_checks_not_measured(cpu):
    tables = cpu[0]
    gpu_util = check(tables, "gpu_util_min_pct")
    assert gpu_util["status"] == "not measured" and CPU_NVML_REASON in gpu_util["detail"]
    assert check(tables, "weak_variation_max")["status"] == "not measured"
    assert check(tables, "optimisation_gain_min")["status"] == "not measured"
    assert check(tables, "strong_efficiency_min")["status"] == "not measured"  # 4 GPUs asked, 2 ranks ran
    assert check(tables, "exposed_comm_max")["status"] == "fail"  # 0.4 on the 2-rank run
    runs = tables["runs"]
    assert runs["device_name"].tolist() == ["AMD EPYC", "AMD EPYC"] and runs["peak_memory_kind"].eq("rss").all()
    assert tables["sensitivity"].empty and tables["ablation"].empty and tables["communication"].empty


def test_cost(gpu):
    cost = gpu[0]["cost"].set_index("study")
    # strong: records of 3 x 1, 3 x 2 and 2 x 4 GPUs (one missing) at 360 s; 30 min requested for all 9
    assert cost.loc["strong"].tolist() == pytest.approx(
        [9, (3 + 6 + 8) * 0.1, (3 + 3 + 2 * 2) * 0.1, 0.5 * 21, 0.5 * 12]
    )
    assert cost.loc["total"].tolist() == pytest.approx(cost.drop(index="total").sum().tolist())
    assert list(cost.index) == ["strong", "weak", "sensitivity", "ablation", "total"]


def test_cli_writes_tables_and_summary_without_torch(gpu, tmp_path):
    tables, args, _ = gpu
    targets = [f"--target={key}={value}" for key, value in TARGETS.items()]
    command = [
        "--matrix",
        args["matrix_path"],
        "--comm",
        *args["comm_paths"],
        "--references",
        args["references_path"],
        "--out",
        tmp_path,
        *targets,
    ]
    code = (
        NO_TORCH
        + "import runpy; sys.argv[0] = 'aggregate'; runpy.run_module('scalerepro.analysis.aggregate', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, command)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for name, table in tables.items():
        written = pd.read_csv(tmp_path / f"{name}.csv")
        assert list(written.columns) == list(table.columns) and len(written) == len(table), name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == {"ok": 19, "failed": 1, "preempted": 1, "missing": 1}
    assert summary["device_names"] == [H100] and summary["inconsistent_runs"] == ["weak_resnet50_g2_r3"]
    assert summary["checks"] == {"pass": 5, "fail": 1, "not measured": 0}
    bad = subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.aggregate", *map(str, command), "--target", "speed=1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown target 'speed'" in bad.stderr


def test_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import scalerepro.analysis, scalerepro.analysis.aggregate, scalerepro.analysis.plots, scalerepro.analysis.scaling_model\n"
        "assert 'torch' not in sys.modules, 'the analysis side imported torch'\n"
        "trainer = {'scalerepro.train', 'scalerepro.trainer', 'scalerepro.models', 'scalerepro.data'} & set(sys.modules)\n"
        "assert not trainer, f'the analysis side imported {trainer}'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _plot(tables_dir: Path, out: Path) -> str:
    code = (
        NO_TORCH
        + "import runpy; sys.argv[0] = 'plots'; runpy.run_module('scalerepro.analysis.plots', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--tables", str(tables_dir), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for name in plots.PLOT_NAMES:
        for extension in ("png", "svg"):
            assert (out / f"{name}.{extension}").stat().st_size > 1000, f"{name}.{extension}"
    return done.stderr


def _write_profiling_tables(tables_dir: Path, scratch: Path) -> None:
    """The profiling tables of one run profiled with nsys and ncu (the tests/fixtures profiles)."""
    import importlib.util
    import shutil

    import yaml

    from scalerepro.analysis import profile

    fixtures = Path(__file__).parent / "fixtures"
    spec = importlib.util.spec_from_file_location("make_nsys_sqlite", fixtures / "nsys" / "make_nsys_sqlite.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    run = scratch / "strong_resnet50_g8_r1"
    for tool in ("nsys", "ncu"):
        (run / tool).mkdir(parents=True)
        (run / tool / "capture.json").write_text(json.dumps({"tool": tool, "fallback_reason": None}))
    builder.build(run / "nsys" / "rank0.sqlite")
    shutil.copy(fixtures / "ncu" / "kernels.csv", run / "ncu" / "kernels.csv")
    peaks = profile.gpu_peaks(yaml.safe_load((Path(__file__).parents[1] / "config/references.yaml").read_text()), "h100_sxm")
    summary = json.loads(json.dumps(profile.summarize(run, run.name, profile.DEFAULT_THRESHOLDS, peaks), default=str))
    for name, table in profile.tables([summary]).items():
        table.to_csv(tables_dir / f"{name}.csv", index=False)


def test_plots_gpu_study(gpu, tmp_path):
    tables, _, root = gpu
    aggregate.write_tables(tables, root / "tables")
    _write_profiling_tables(root / "tables", tmp_path / "profiles")
    log = _plot(root / "tables", tmp_path)
    assert "not measured" not in log, log
    assert (tmp_path / "throughput_vs_gpus.png").read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in (tmp_path / "busbw_vs_size.svg").read_bytes()[:2000]


def test_plots_cpu_study_shows_holes(cpu, tmp_path):
    tables, _, root = cpu
    aggregate.write_tables(tables, root / "tables")
    log = _plot(root / "tables", tmp_path)
    holes = {line.split(":")[1].strip() for line in log.splitlines() if "not measured" in line}
    assert holes == {"weak_epoch_time", "sensitivity_heatmap", "ablation_gain", "energy_per_sample", "busbw_vs_size", "profile_breakdown", "roofline"}
    assert CPU_NVML_REASON in log


def test_reading_2000_records(tmp_path):
    matrix = write_many_records(tmp_path, 2000)
    (tmp_path / "references.yaml").write_text("references: []\n")
    start = time.perf_counter()
    tables = aggregate.aggregate(matrix, [], tmp_path / "references.yaml", {"data_stall_max": 0.05})
    seconds = time.perf_counter() - start
    print(f"aggregated 2,000 records in {seconds:.2f} s")
    assert len(tables["runs"]) == 2000 and tables["runs"]["status"].eq("ok").all()
    assert len(tables["scaling"]) == 4 and tables["scaling"]["repeats_ok"].sum() == 2000


def test_a_record_that_says_ok_but_measured_nothing_counts_as_failed(tmp_path):
    record = make_record("empty")
    record["measurements"].update(measured_steps=0, samples_per_s=None)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    fields, _, _ = aggregate.read_record("empty", str(path))
    assert fields["status"] == "failed" and "measured window is empty" in fields["error"]
