"""The analysis side: every table checked against numbers computed by hand from the fixture study
(``analysis_fixtures``), the checks' pass / fail / not-measured logic, the figures (placeholders
included), the command lines without torch, and the record reader's speed."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml

from scalerepro.analysis import columns
from scalerepro.analysis.presentation import plots
from scalerepro.analysis.tables import aggregate, cell_tables, checking, readers, reproduction

from analysis_fixtures import (
    CPU_NVML_REASON,
    FAILED_MESSAGE,
    H100,
    REPO,
    TOKENS,
    TP_COMM_REASON,
    VALIDATOR,
    Study,
    make_record,
    validate,
    write_comm,
    write_cpu_study,
    write_gpu_study,
    write_many_records,
    write_parallelism_study,
)


def targets(strong_gpus: int | str = 4, only: tuple[str, ...] = (), **thresholds: float) -> dict:
    """config/config.yaml's targets (the checks as shipped), with the strong-scaling check at
    ``strong_gpus``, the given thresholds by check name, and only the checks ``only`` names."""
    shipped = yaml.safe_load((REPO / "config/config.yaml").read_text())["targets"]
    checks = {name: dict(entry) for name, entry in shipped["checks"].items() if not only or name in only}
    if "strong_efficiency" in checks:
        checks["strong_efficiency"]["where"] = {**checks["strong_efficiency"]["where"], "gpus": strong_gpus}
    for name, threshold in thresholds.items():
        checks[name]["threshold"] = threshold
    return {**shipped, "checks": checks}


TARGETS = targets()
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
    assert list(runs.columns) == list(columns.RUN_COLUMNS)
    assert len(runs) == 22
    assert runs["status"].value_counts().to_dict() == {"ok": 19, "failed": 1, "preempted": 1, "missing": 1}
    missing = row(runs, run_id="strong_resnet50_g4_r3")
    assert missing["status"] == "missing" and "no run record at" in missing["error"] and pd.isna(missing["samples_per_s"])
    assert pd.isna(missing["consistent"]) and missing["rerun"].startswith("snakemake")
    failed = row(runs, run_id="strong_resnet50_g4_r2")
    assert failed["status"] == "failed" and failed["error"] == FAILED_MESSAGE
    assert row(runs, run_id="ablation_resnet50_g2_channels_last_r1")["stop_signal"] == "SIGTERM"
    assert not row(runs, run_id="weak_resnet50_g2_r3")["consistent"]  # the record says world size 1
    assert runs["consistent"].eq(False).sum() == 1
    one = row(runs, run_id="strong_resnet50_g4_r1")
    assert one["duration_s"] == 360.0 and one["world_size_recorded"] == 4 and one["nodes_recorded"] == 2
    assert one["device_name"] == H100 and one["device_type"] == "cuda" and one["scheduler_job_id"] == "4182000"
    assert one["peak_memory_bytes"] == 4_000_000_000 and one["peak_memory_kind"] == "cuda_allocated"
    assert one["energy_per_sample_j"] == pytest.approx(500 * 2 / (340 * 2))  # power x window / samples
    # the last logged loss (step 24: 2.5 - 0.04 x 24), not the history's mean over the epoch (1.5)
    assert (one["final_train_loss"], one["final_eval_loss"], one["final_eval_accuracy"]) == (pytest.approx(1.54), 1.6, 0.4)


def test_long_tables(gpu):
    tables, _, _ = gpu
    assert list(tables["epochs"].columns) == list(columns.EPOCH_COLUMNS)
    assert list(tables["loss_log"].columns) == list(columns.LOSS_COLUMNS)
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


def test_cells_carry_their_spread(gpu):
    scaling = gpu[0]["scaling"]
    g1 = row(scaling, study="strong", gpus=1)  # 90, 100, 110
    assert g1["repeats_ok"] == 3 and g1["samples_per_s_cv"] == pytest.approx(0.10)  # sample sd 10 / mean 100
    # bootstrap 95 % interval of the median of 3 values: min..max (a resampled median is min with p = 7/27)
    assert (g1["samples_per_s_ci_low"], g1["samples_per_s_ci_high"]) == (90, 110)
    assert g1["noisy"] and "noisy: throughput CV 10.0 %" in g1["note"]  # above the default 0.05
    g2 = row(scaling, study="strong", gpus=2)  # 170, 180, 190
    assert g2["samples_per_s_cv"] == pytest.approx(10 / 180) and g2["noisy"]
    # E = thr(2) / (2 thr(1)) on paired bootstrap medians: 170 / 220 and 190 / 180 have p = (7/27)^2 > 2.5 % each
    assert (g2["efficiency_ci_low"], g2["efficiency_ci_high"]) == (pytest.approx(170 / 220), pytest.approx(190 / 180))
    g4 = row(scaling, study="strong", gpus=4)  # one repeat: no spread, no interval, not flagged
    assert pd.isna(g4["samples_per_s_cv"]) and pd.isna(g4["efficiency_ci_low"]) and not g4["noisy"]
    weak = row(scaling, study="weak", gpus=2)  # epoch times 10, 10 and 11, 12: E = 10 / T(2)
    assert (weak["efficiency_ci_low"], weak["efficiency_ci_high"]) == (pytest.approx(10 / 12), pytest.approx(10 / 11))
    # the same records give the same intervals: the bootstrap is seeded by the cell
    again = cell_tables.scaling_table(gpu[0]["runs"])
    pd.testing.assert_frame_equal(again, scaling)
    # a looser noise target flags fewer cells
    loose = cell_tables.scaling_table(gpu[0]["runs"], noise_cv_max=0.08)
    assert not row(loose, study="strong", gpus=2)["noisy"] and row(loose, study="strong", gpus=1)["noisy"]


def test_a_check_whose_interval_holds_the_threshold_is_inconclusive(gpu):
    tables = gpu[0]
    # efficiency at 2 GPUs: 0.9, interval 0.77-1.06
    at_2 = checking.checks_table(tables, targets(2, ("strong_efficiency",), strong_efficiency=0.85)).iloc[0]
    assert at_2["status"] == "inconclusive" and at_2["measured"] == pytest.approx(0.9)
    assert (at_2["interval_low"], at_2["interval_high"]) == (pytest.approx(170 / 220), pytest.approx(190 / 180))
    assert at_2["detail"].startswith("95 % interval 77.3% to 105.6% holds the threshold")
    assert checking.checks_table(tables, targets(2, ("strong_efficiency",), strong_efficiency=0.7)).iloc[0]["status"] == "pass"
    assert checking.checks_table(tables, targets(2, ("strong_efficiency",), strong_efficiency=1.1)).iloc[0]["status"] == "fail"
    # weak variation 15 %, interval 10-20 % (T(1) = 10 always; T(2) 11, 11.5 or 12)
    weak = checking.checks_table(tables, targets(only=("weak_variation",), weak_variation=0.15)).iloc[0]
    assert weak["status"] == "inconclusive" and (weak["interval_low"], weak["interval_high"]) == (pytest.approx(0.1), pytest.approx(0.2))
    assert checking.checks_table(tables, targets(only=("weak_variation",), weak_variation=0.10)).iloc[0]["status"] == "fail"  # at the edge: outside
    assert checking.checks_table(tables, targets(only=("weak_variation",), weak_variation=0.25)).iloc[0]["status"] == "pass"


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
    assert check(tables, "strong_efficiency")["status"] == "not measured"
    assert "no completed 1-GPU run" in check(tables, "strong_efficiency")["detail"]


def test_sensitivity(gpu):
    sensitivity = gpu[0]["sensitivity"]
    assert len(sensitivity) == 4
    cell = row(sensitivity, bucket_cap_mb=25.0, per_gpu_batch=64, precision="bf16")
    assert (cell["samples_per_s_median"], cell["repeats_ok"], cell["gpus"]) == (260, 1, 2)
    assert cell["exposed_comm_fraction"] == pytest.approx(0.1)


def test_ablation_gain(gpu):
    ablation = gpu[0]["ablation"]
    assert list(ablation["variant"]) == ["baseline", "bf16", "channels_last", "all"]  # matrix order
    assert list(ablation["gain"].round(6)[[0, 1, 3]]) == [0.0, 0.5, 0.3]  # 150 / 100 - 1, 130 / 100 - 1
    preempted = row(ablation, variant="channels_last")
    assert pd.isna(preempted["gain"]) and preempted["repeats_ok"] == 0 and preempted["note"] == "no completed repeat"
    assert (row(ablation, variant="baseline")[["gain_ci_low", "gain_ci_high"]] == 0).all()  # itself, exactly
    # a baseline with no completed repeat has no interval either (the one-H100 study showed "+0.0 % – +0.0 %")
    runs = gpu[0]["runs"]
    runs = runs.assign(counts=runs["counts"] & ~(runs["study"].eq("ablation") & runs["variant"].eq("baseline")))
    baseline = row(cell_tables.ablation_table(runs), variant="baseline")
    assert baseline["repeats_ok"] == 0 and pd.isna(baseline["gain_ci_low"]) and pd.isna(baseline["gain_ci_high"])


def test_communication_bandwidths(gpu, tmp_path):
    comm = gpu[0]["communication"]
    assert list(comm.columns) == list(columns.COMM_COLUMNS) and len(comm) == 6
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
        readers.communication_table([wrong])


def test_every_cell_table_states_its_cells_as_the_cells_table_does(gpu):
    """One definition of a cell: scaling, sensitivity and ablation are views of cells.csv (the
    headline's), each cell's throughput statistics the same, its bootstrap interval included."""
    tables, _, _ = gpu
    cells = tables["cells"].set_index("cell")
    assert cells.index.is_unique and set(cells.index) == set(tables["runs"]["cell"])
    for name, keys in (("scaling", ["study", "model", "gpus"]), ("sensitivity", list(columns.SENSITIVITY_KEYS)), ("ablation", ["model", "gpus", "variant"])):
        table = tables[name]
        study = cells[cells["study"].isin(["strong", "weak"] if name == "scaling" else [name])]
        assert len(table) == len(study) > 0, name
        joined = table.merge(study.reset_index(), on=keys, suffixes=("", "_of_cells"), validate="one_to_one")
        for column in (*columns.THROUGHPUT, "repeats_ok", "repeats_total"):
            pd.testing.assert_series_equal(joined[column], joined[f"{column}_of_cells"], check_names=False, check_dtype=False)


@pytest.fixture(scope="module")
def parallelism(tmp_path_factory) -> dict[str, pd.DataFrame]:
    return aggregate.aggregate(**write_parallelism_study(tmp_path_factory.mktemp("parallelism")), targets={})


def test_parallelism_table_compares_strategies_at_the_same_global_batch(parallelism):
    table = parallelism["parallelism"]
    assert list(table.columns) == list(columns.PARALLELISM_COLUMNS)
    assert list(zip(table["gpus"], table["parallel"])) == [(2, "ddp"), (2, "fsdp"), (2, "tp"), (4, "fsdp+tp")]  # matrix order
    ddp, fsdp, tp, failed = (row(table, parallel=p) for p in ("ddp", "fsdp", "tp", "fsdp+tp"))
    assert ddp["global_batch"] == fsdp["global_batch"] == tp["global_batch"] == 16
    assert (tp["data_parallel"], tp["per_gpu_batch"]) == (1, 16)
    # ddp: median of 40, 44; tokens/s = samples/s x 1024; per GPU = tokens/s / 2
    assert (ddp["repeats_ok"], ddp["samples_per_s_median"], ddp["samples_per_s_ci_low"], ddp["samples_per_s_ci_high"]) == (2, 42, 40, 44)
    assert ddp["tokens_per_s_median"] == 42 * TOKENS and ddp["tokens_per_s_per_gpu"] == 42 * TOKENS / 2
    assert (ddp["tokens_per_s_ci_low"], ddp["tokens_per_s_ci_high"]) == (40 * TOKENS, 44 * TOKENS)
    assert ddp["mfu"] == pytest.approx(0.4) and ddp["peak_memory_bytes"] == 4e9 and ddp["peak_memory_kind"] == "cuda_allocated"
    # a hole is said to be one, never left blank: ddp records no sharding figures
    assert pd.isna(ddp["state_bytes_per_rank_max"]) and pd.isna(ddp["comm_bytes_per_step"])
    assert "not measured: state bytes per rank" in ddp["note"] and "not counted under ddp" in ddp["note"]
    # fsdp: the repeat whose record ran ddp does not count (2 of 3); sharding figures from the records
    assert (fsdp["repeats_ok"], fsdp["repeats_total"], fsdp["samples_per_s_median"]) == (2, 3, 39)
    assert (fsdp["mesh"], fsdp["state_bytes_per_rank_max"], fsdp["state_bytes_per_rank_min"]) == ("2 (dp_shard)", 7e8, 6.9e8)
    assert fsdp["comm_bytes_per_step"] == 5e8 + 3e8 and fsdp["note"] == ""
    # tp: communication not counted, and the record's reason is the note's; one repeat: no interval
    assert pd.isna(tp["comm_bytes_per_step"]) and tp["note"] == f"not measured: communication per step ({TP_COMM_REASON})"
    assert tp["samples_per_s_median"] == 30 and pd.isna(tp["samples_per_s_ci_low"])
    assert failed["repeats_ok"] == 0 and pd.isna(failed["samples_per_s_median"])
    assert failed["note"].startswith("not measured: no completed repeat of 1 planned")


def test_a_completed_run_whose_record_ran_another_strategy_does_not_count(parallelism):
    runs = parallelism["runs"].set_index("run_id")
    wrong = runs.loc["parallelism_gpt2_small_g2_fsdp_r3"]
    assert (wrong["parallel"], wrong["parallel_recorded"], wrong["consistent"], wrong["counts"]) == ("fsdp", "ddp", False, False)
    assert runs.loc["parallelism_gpt2_small_g2_fsdp_r1", "counts"] and runs.loc["parallelism_gpt2_small_g2_ddp_r1", "counts"]
    # a failed run is failed, not inconsistent, whatever it recorded
    assert runs.loc["parallelism_gpt2_small_g4_fsdp-tp_r1", "consistent"]


def test_a_check_can_read_the_parallelism_table(parallelism):
    entry = {"table": "parallelism", "metric": "tokens_per_s_per_gpu", "where": {"gpus": 2}, "direction": "min", "threshold": 16000, "unit": "tokens/s"}
    result = checking.checks_table(parallelism, {"checks": {"tokens": entry}}).iloc[0]
    assert result["status"] == "fail" and result["measured"] == 15 * TOKENS  # tp's 30 samples/s / 2 GPUs
    assert "worst cell parallelism_gpt2_small_g2_tp" in result["detail"]
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    jsonschema.validate({"targets": {"checks": {"tokens": entry}}}, {**schema, "required": []})  # a valid config entry


def test_comparison_without_reproduce_runs_says_why(gpu):
    # The GPU study has no reproduce runs: no reference is set beside a strong, weak or ablation
    # cell of other conditions (the defect of issue 14), each says why it has no measurement.
    comparison = gpu[0]["comparison"].set_index("reference")
    assert len(comparison) == 4 and comparison["measured"].isna().all() and comparison["ratio"].isna().all()
    assert comparison.loc["ref-r50-2", "verdict"] == "not comparable: no run scheduled for it"
    assert comparison.loc["ref-r50-4-tokens", "verdict"] == "not comparable: data"
    assert comparison.loc["ref-gpt2-8", "verdict"] == "not comparable: optimizer"
    a100 = comparison.loc["ref-r50-a100-2"]
    assert a100["group"] == "context" and a100["verdict"] == "not comparable: GPU" and H100 in a100["differs"]
    assert (comparison.drop(index="ref-r50-a100-2")["group"] == "reproduction").all()


VERDICT_REFERENCES = """\
target_gpu: NVIDIA H100 80GB HBM3
_conditions: &c {gpu: NVIDIA H100 80GB HBM3, precision: bf16, per_gpu_samples_per_step: 32, seq_len: null, memory_format: nchw,
                 data: synthetic, optimizer: null, framework: PyTorch DDP, metric_notes: img/s}
_trainer: &t {model: resnet50, per_gpu_batch: 32, flags: [--precision, bf16]}
references:
  - {id: reproduced, model: resnet50, gpus: 2, metric: samples_per_s, value: 200, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: at-the-edge, model: resnet50, gpus: 2, metric: samples_per_s, value: 182, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: above, model: resnet50, gpus: 2, metric: samples_per_s, value: 150, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: below, model: resnet50, gpus: 2, metric: samples_per_s, value: 260, kind: mlperf, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: fp16, model: resnet50, gpus: 2, metric: samples_per_s, value: 200, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, precision: fp16}, trainer: *t}
  - {id: batch-1280, model: resnet50, gpus: 2, metric: samples_per_s, value: 200, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, per_gpu_samples_per_step: 1280}, trainer: *t}
  - {id: nhwc, model: resnet50, gpus: 2, metric: samples_per_s, value: 200, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, memory_format: nhwc}, trainer: *t}
  - {id: real-data, model: resnet50, gpus: 2, metric: samples_per_s, value: 200, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, data: real}, trainer: *t}
  - {id: fp8, model: resnet50, gpus: 2, metric: samples_per_s, value: 200, kind: mlperf, source: {page: p, table: t},
     conditions: {<<: *c, precision: fp8}, trainer: null, unmatched: "precision: FP8 layers; the trainer has no FP8"}
  - {id: unscheduled, model: resnet50, gpus: 4, metric: samples_per_s, value: 400, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: shares-a-run, model: resnet50, gpus: 2, metric: samples_per_s, value: 190, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: failed, model: resnet50, gpus: 1, metric: samples_per_s, value: 100, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: ran-on-pcie, model: resnet50, gpus: 1, metric: samples_per_s, value: 100, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: noisy, model: resnet50, gpus: 1, metric: samples_per_s, value: 100, kind: published, source: {page: p, table: t}, conditions: *c, trainer: *t}
  - {id: gpt2-tokens, model: gpt2_small, gpus: 2, metric: tokens_per_s_per_gpu, value: 51200, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, seq_len: 1024, memory_format: null, optimizer: AdamW}, trainer: {model: gpt2_small, per_gpu_batch: 32, flags: []}}
  - {id: no-tokens, model: gpt2_small, gpus: 1, metric: tokens_per_s_per_gpu, value: 51200, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, seq_len: 1024, memory_format: null}, trainer: {model: gpt2_small, per_gpu_batch: 32, flags: [--seq-len, "1024"]}}
  - {id: a100, model: resnet50, gpus: 2, metric: samples_per_s, value: 150, kind: published, source: {page: p, table: t},
     conditions: {<<: *c, gpu: NVIDIA A100-SXM4-80GB}, trainer: *t}
  - {id: seed, model: resnet50, gpus: 2, metric: samples_per_s, value: 3800, kind: expected (seed document), source: {page: seed, table: expected},
     conditions: {<<: *c, gpu: NVIDIA H100 (form factor not stated), precision: null}, trainer: null, unmatched: "precision: not stated"}
"""


def _verdict_study(root: Path) -> dict:
    """Reproduce runs that match their references and runs that do not (see the test)."""
    s = Study(root)
    for reference in ("reproduced", "at-the-edge", "above", "below", "fp16", "batch-1280", "nhwc", "real-data", "a100"):
        for repeat, thr in enumerate((195, 205), 1):  # median 200, CV 3.5 %
            s.add("reproduce", 2, repeat, reference=reference, samples_per_s=thr)
    s.add("reproduce", 1, 1, reference="failed", status="failed", error=FAILED_MESSAGE)
    s.add("reproduce", 1, 1, reference="ran-on-pcie", device_name="NVIDIA H100 PCIe")
    for repeat, thr in enumerate((80, 120), 1):  # CV 28 %: noisy
        s.add("reproduce", 1, repeat, reference="noisy", samples_per_s=thr)
    for repeat in (1, 2):  # 100 samples/s x 1024 tokens / 2 GPUs = 51,200 tokens/s per GPU
        run_id = f"reproduce_gpt2_small_g2_gpt2-tokens_r{repeat}"
        record = make_record(run_id, model="gpt2_small", world_size=2, optimizer="adamw", samples_per_s=100)
        record["model"]["tokens_per_sample"] = 1024
        record["measurements"]["tokens_per_s"] = 100 * 1024
        s.add("reproduce", 2, repeat, model="gpt2_small", reference="gpt2-tokens", record=validate(record))
    s.add("reproduce", 1, 1, model="gpt2_small", reference="no-tokens")  # a record without tokens/s
    (root / "references.yaml").write_text(VERDICT_REFERENCES)
    return {"matrix_path": s.write_matrix(), "comm_paths": [], "references_path": root / "references.yaml"}


def test_comparison_verdicts(tmp_path):
    args = _verdict_study(tmp_path)
    table = aggregate.aggregate(**args, targets={"reproduce_tolerance": 0.10})["comparison"].set_index("reference")
    verdicts = table["verdict"].to_dict()
    assert verdicts == {
        "reproduced": "reproduced",  # 200 / 200
        "at-the-edge": "reproduced",  # 200 / 182 = 1.099: within 10 %
        "above": "above",  # 200 / 150 = 1.33
        "below": "below",  # 200 / 260 = 0.77
        "fp16": "not comparable: precision",  # recorded bf16
        "batch-1280": "not comparable: per gpu samples per step",
        "nhwc": "not comparable: memory format",  # the run's record: channels_last false
        "real-data": "not comparable: data",  # synthetic
        "fp8": "not comparable: precision",  # what the trainer lacks, from `unmatched`
        "unscheduled": "not comparable: no run scheduled for it",
        "shares-a-run": "reproduced",  # no run of its own: the run of a reference with the same trainer run
        "failed": "not measured",
        "ran-on-pcie": "not comparable: GPU",
        "noisy": "reproduced",  # median 100
        "gpt2-tokens": "reproduced",  # 51,200 tokens/s per GPU
        "no-tokens": "not measured",  # its run completed but recorded no tokens/s: never read as a result
        "a100": "not comparable: GPU",
        "seed": "not comparable: GPU",  # "H100 (form factor not stated)" is no device the study ran on
    }
    assert table.loc["reproduced", "ratio"] == pytest.approx(1.0) and table.loc["above", "ratio"] == pytest.approx(200 / 150)
    assert table.loc["at-the-edge", "ratio"] == pytest.approx(200 / 182)
    assert (table.loc["reproduced", "measured_ci_low"], table.loc["reproduced", "measured_ci_high"]) == (195, 205)
    assert table.loc["reproduced", "repeats"] == 2 and not table.loc["reproduced", "noisy"]
    assert table.loc["noisy", "noisy"] and table.loc["noisy", "measured_cv"] == pytest.approx(28.28 / 100, rel=1e-3)
    # each differing condition is named with both values; both sets of conditions are printed
    assert table.loc["fp16", "differs"] == "precision (measured bf16, reference fp16)"
    assert table.loc["batch-1280", "differs"] == "per gpu samples per step (measured 32, reference 1280)"
    assert table.loc["ran-on-pcie", "differs"] == f"GPU (measured on NVIDIA H100 PCIe, reference on {H100})"
    assert table.loc["fp8", "differs"].startswith("precision: FP8 layers")
    assert "no completed run" in table.loc["failed", "differs"]
    assert "(the same trainer run)" in table.loc["shares-a-run", "measured_cell"] and table.loc["shares-a-run", "ratio"] == pytest.approx(200 / 190)
    assert table.loc["reproduced", "measured_conditions"] == (
        f"gpu {H100}; precision bf16; per gpu samples per step 32; memory format nchw; data synthetic; optimizer sgd"
    )
    assert table.loc["fp16", "published_conditions"].startswith(f"gpu {H100}; precision fp16; per gpu samples per step 32")
    assert table.loc["gpt2-tokens", "measured_conditions"].startswith(f"gpu {H100}; precision bf16; per gpu samples per step 32; seq len 1024")
    # another GPU (or an H100 of unknown form factor) is context, shown apart, never a pass or fail
    assert sorted(table.index[table["group"].eq("context")]) == ["a100", "seed"]
    assert list(table["group"])[-2:] == ["context", "context"]  # context rows last
    assert table.loc["seed", "kind"] == "expected (seed document)"
    # the tolerance is the config's: at 5 % the edge case is above
    strict = aggregate.aggregate(**args, targets={"reproduce_tolerance": 0.05})["comparison"].set_index("reference")
    assert strict.loc["at-the-edge", "verdict"] == "above"


def test_on_a_cpu_every_h100_reference_is_not_comparable_gpu(cpu):
    comparison = cpu[0]["comparison"].set_index("reference")
    assert comparison["verdict"].eq("not comparable: GPU").all()
    assert comparison.loc["ref-r50-2", "differs"] == f"GPU (this study ran on CPU (AMD EPYC); the reference on {H100})"
    # the set's target GPU (H100 SXM) is the reproduction table; the A100 reference is context
    assert comparison["group"].to_dict() == {
        "ref-r50-2": "reproduction",
        "ref-r50-4-tokens": "reproduction",
        "ref-gpt2-8": "reproduction",
        "ref-r50-a100-2": "context",
    }


def test_references_file_errors_are_one_line(tmp_path):
    path = tmp_path / "references.yaml"
    for text, message in (
        (
            "references: [{id: x, model: m, gpus: 1, metric: samples_per_s, value: 1, kind: guess, source: s, conditions: {gpu: g}, trainer: null}]",
            "kind 'guess' is not one of published, expected (seed document), mlperf",
        ),
        (
            "references: [{id: x, model: m, gpus: 1, metric: samples_per_s, value: 1, kind: mlperf, source: s, conditions: {gpu: g}, trainer: null}]",
            "trainer is null, so say why in `unmatched",
        ),
        (
            "references: [{id: x, model: m, gpus: 1, metric: samples_per_s, value: 1, kind: mlperf, source: s, conditions: {gpu: g, precision: amp}, trainer: null, unmatched: u}]",
            "conditions.precision 'amp' is not one of",
        ),
        ("references: [{id: x, model: m, gpus: 1}]", "add metric, value, kind, source, conditions, trainer"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match="references\\[0\\] \\(x\\)") as error:
            reproduction.read_references(path)
        assert message in str(error.value) and "\n" not in str(error.value)


def test_the_reference_set_reads_and_keeps_its_labels():
    references = reproduction.read_references(REPO / "config" / "references.yaml")
    by_id = references.set_index("id")
    assert set(references["kind"]) == {"published", "expected (seed document)", "mlperf"}
    assert (by_id.filter(like="seed-", axis=0)["kind"] == "expected (seed document)").all()
    # AMP / mixed precision in NVIDIA's tables is fp16, and their "FP32" on A100/H100 is TF32
    assert by_id.loc["dle-rn50-a100-fp16-1", "precision"] == "fp16" and by_id.loc["dle-rn50-a100-tf32-1", "precision"] == "tf32"
    lambda_sxm = by_id.filter(regex=r"^lambda-rn50-h100sxm-fp16-\d$", axis=0)
    assert list(lambda_sxm["gpus"]) == [1, 2, 4, 8] and set(lambda_sxm["per_gpu_samples_per_step"]) == {1280}
    assert set(lambda_sxm["memory_format"]) == {"nchw"} and set(lambda_sxm["data"]) == {"synthetic"}
    assert set(lambda_sxm["trainer_flags"]) == {"--precision fp16 --no-channels-last --compile none --loader device --data synthetic"}
    assert set(by_id.filter(like="lambda-rn50-h100sxm-tf32", axis=0)["per_gpu_samples_per_step"]) == {640}
    mlperf = by_id[by_id["kind"].eq("mlperf")]
    assert {"fp8"} <= set(mlperf["precision"]) and mlperf["framework"].str.contains("DALI|FP8 layers").all()
    assert mlperf["trainer_model"].isna().all() and mlperf["unmatched"].notna().all()
    assert references["source"].str.len().gt(10).all()


def test_torchtitan_and_mpt_references_parse_and_are_not_comparable_on_an_h100_sxm(gpu):
    """torchtitan's Llama 3.1 8B FSDP cells have a trainer run (llama3_8b, --parallel fsdp) but ran on
    the H100 96GB HBM2e; MPT-1B is no model of the trainer. On an H100 80GB study both are context."""
    by_id = reproduction.read_references(REPO / "config" / "references.yaml").set_index("id")
    titan = by_id.filter(regex=r"^torchtitan-llama31-8b-fsdp-(compile-)?(8|128)$", axis=0)
    assert len(titan) == 4 and set(titan["trainer_model"]) == {"llama3_8b"} and set(titan["trainer_per_gpu_batch"]) == {2}
    assert titan["trainer_flags"].str.contains("--parallel fsdp --activation-checkpointing selective --precision bf16 --seq-len 8192").all()
    assert titan["unmatched"].str.startswith("gpu: torchtitan's H100 is the 96 GB HBM2e part at 500 W").all()
    assert by_id.filter(like="float8", axis=0)["trainer_model"].isna().all()
    mpt = by_id.filter(regex=r"^mosaicml-mpt-1b-fsdp-h100-\d+$", axis=0)
    assert list(mpt["gpus"]) == [8, 16, 32, 64] and mpt["trainer_model"].isna().all() and mpt["unmatched"].str.contains("llama_1b").all()
    comparison = reproduction.comparison_table(gpu[0]["runs"], by_id.reset_index(), target_gpu=H100).set_index("reference")
    for reference in [*titan.index, *mpt.index]:
        assert comparison.loc[reference, "group"] == "context" and comparison.loc[reference, "verdict"] == "not comparable: GPU"
    assert "the reference on NVIDIA H100 96GB HBM2e" in comparison.loc["torchtitan-llama31-8b-fsdp-8", "differs"]


def test_checks_pass_and_fail(gpu):
    tables = gpu[0]
    assert list(tables["checks"]["check"]) == sorted(TARGETS["checks"])  # by name: one order in every report, whatever the config's
    strong = check(tables, "strong_efficiency")
    assert (strong["status"], strong["measured"], strong["target"]) == (
        "pass",
        pytest.approx(0.85),
        "strong-scaling efficiency: the worst efficiency >= 70.0% over the scaling rows where study = strong, gpus = 4",
    )
    weak = check(tables, "weak_variation")
    assert weak["status"] == "fail" and weak["measured"] == pytest.approx(0.15)  # (11.5 - 10) / 10
    assert check(tables, "optimisation_gain")["measured"] == pytest.approx(0.3)
    assert check(tables, "optimisation_gain")["status"] == "pass"
    assert check(tables, "gpu_utilisation")[["status", "measured"]].tolist() == ["pass", 90.0]
    exposed = check(tables, "exposed_communication")
    assert exposed["status"] == "pass" and exposed["measured"] == 0.15 and "strong_resnet50_g4_r1" in exposed["detail"]
    stall = check(tables, "data_stall")
    assert stall["status"] == "pass" and stall["measured"] == 0.03 and "strong_resnet50_g1_r2" in stall["detail"]


def test_checks_follow_the_thresholds(gpu):
    tables = gpu[0]
    strict = targets(
        4,
        strong_efficiency=0.9,
        weak_variation=0.2,
        optimisation_gain=0.35,
        gpu_utilisation=90,
        exposed_communication=0.15,
        data_stall=0.03,
    )
    statuses = checking.checks_table(tables, strict).set_index("check")["status"].to_dict()
    # pass at equality for >= / <= targets, fail at equality for the strict > / < ones
    assert statuses == {
        "strong_efficiency": "fail",
        "weak_variation": "pass",
        "optimisation_gain": "fail",
        "gpu_utilisation": "fail",
        "exposed_communication": "fail",
        "data_stall": "fail",
    }
    at_8 = checking.checks_table(tables, targets(8, ("strong_efficiency",))).iloc[0]
    assert at_8["status"] == "not measured" and "no scaling.csv row where study = strong, gpus = 8" in at_8["detail"]
    default_gpus = checking.checks_table(tables, targets("max", ("strong_efficiency",))).iloc[0]
    assert default_gpus["target"].endswith(">= 70.0% over the scaling rows where study = strong, gpus = 4 (max)")  # the largest strong-scaling count
    assert checking.checks_table(tables, {}).empty


def test_cpu_study_checks_are_judged_at_cpu_scale_and_say_so(cpu):
    tables = cpu[0]
    gpu_util = check(tables, "gpu_utilisation")
    assert gpu_util["status"] == "not measured" and CPU_NVML_REASON in gpu_util["detail"]
    assert check(tables, "weak_variation")["status"] == "not measured"
    assert check(tables, "optimisation_gain")["status"] == "not measured"
    assert check(tables, "strong_efficiency")["status"] == "not measured"  # 4 GPUs asked, 2 ranks ran
    # judged against the thresholds the study gave (on a real CPU study, cpu_overrides' own), and
    # said to be a CPU study's verdict: ranks on one host's cores are not a cluster
    exposed = check(tables, "exposed_communication")
    assert exposed["status"] == "fail" and exposed["measured"] == 0.4
    assert exposed["detail"].startswith("a CPU study, judged at CPU scale (the thresholds of cpu_overrides): ranks pinned to one host's cores")
    assert check(tables, "data_stall")["status"] in ("pass", "fail", "inconclusive")
    runs = tables["runs"]
    assert runs["device_name"].tolist() == ["AMD EPYC", "AMD EPYC"] and runs["peak_memory_kind"].eq("rss").all()
    assert tables["sensitivity"].empty and tables["ablation"].empty and tables["communication"].empty


def test_cost(gpu):
    cost = gpu[0]["cost"].set_index("study")
    # strong: records of 3 x 1, 3 x 2 and 2 x 4 GPUs (one missing) at 360 s; 30 min requested for all 9
    assert cost.loc["strong"].tolist() == pytest.approx([9, (3 + 6 + 8) * 0.1, (3 + 3 + 2 * 2) * 0.1, 0.5 * 21, 0.5 * 12])
    assert cost.loc["total"].tolist() == pytest.approx(cost.drop(index="total").sum().tolist())
    assert list(cost.index) == ["strong", "weak", "sensitivity", "ablation", "total"]


def test_cli_writes_tables_and_summary_without_torch(gpu, tmp_path):
    tables, args, _ = gpu
    targets = ["--targets", json.dumps(TARGETS)]
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
    code = NO_TORCH + "import runpy; sys.argv[0] = 'aggregate'; runpy.run_module('scalerepro.analysis.tables.aggregate', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code, *map(str, command)], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for name, table in tables.items():
        written = pd.read_csv(tmp_path / f"{name}.csv")
        assert list(written.columns) == list(table.columns) and len(written) == len(table), name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == {"ok": 19, "failed": 1, "preempted": 1, "missing": 1}
    assert summary["device_names"] == [H100] and summary["inconsistent_runs"] == ["weak_resnet50_g2_r3"]
    assert summary["checks"] == {"pass": 5, "fail": 1, "inconclusive": 0, "not measured": 0}
    speed = {"table": "runs", "metric": "speed", "direction": "min", "threshold": 1}
    unknown_metric = {**TARGETS, "checks": {**TARGETS["checks"], "speed": speed}}
    bad = subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.tables.aggregate", *map(str, command[:-2]), "--targets", json.dumps(unknown_metric)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "config error at 'targets.checks.speed.metric': 'speed' is not a metric of runs.csv" in bad.stderr


def test_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import scalerepro.analysis, scalerepro.analysis.tables.aggregate, scalerepro.analysis.presentation.plots, scalerepro.analysis.tables.scaling_model\n"
        "import scalerepro.analysis.tables.repeats, scalerepro.analysis.rebuild, scalerepro.analysis.presentation.report\n"
        "assert 'torch' not in sys.modules, 'the analysis side imported torch'\n"
        "trainer = {'scalerepro.training.train', 'scalerepro.training.trainer', 'scalerepro.models', 'scalerepro.data'} & set(sys.modules)\n"
        "assert not trainer, f'the analysis side imported {trainer}'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _plot(tables_dir: Path, out: Path) -> str:
    code = NO_TORCH + "import runpy; sys.argv[0] = 'plots'; runpy.run_module('scalerepro.analysis.presentation.plots', run_name='__main__')"
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

    from scalerepro.analysis.profiles import captures, classify, roofline

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
    peaks = roofline.gpu_peaks("h100_sxm", "bf16")
    summary = json.loads(json.dumps(captures.summarize(run, run.name, classify.DEFAULT_THRESHOLDS, peaks), default=str))
    for name, table in captures.tables([summary]).items():
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
    tables = aggregate.aggregate(matrix, [], tmp_path / "references.yaml", {"data_stall": 0.05})
    seconds = time.perf_counter() - start
    print(f"aggregated 2,000 records in {seconds:.2f} s")
    assert len(tables["runs"]) == 2000 and tables["runs"]["status"].eq("ok").all()
    assert len(tables["scaling"]) == 4 and tables["scaling"]["repeats_ok"].sum() == 2000


def test_a_record_that_says_ok_but_measured_nothing_counts_as_failed(tmp_path):
    record = make_record("empty")
    record["measurements"].update(measured_steps=0, samples_per_s=None)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    fields = readers.read_record("empty", str(path)).fields
    assert fields["status"] == "failed" and "measured window is empty" in fields["error"]


def test_rebuild_regenerates_tables_figures_and_report_from_the_records_alone(tmp_path):
    # a results folder as the workflow leaves it: the matrix with relative record paths, the
    # records, the resolved config; the tables, figures and report are not there yet
    results = tmp_path / "study" / "results"
    args = write_cpu_study(results / "runs")
    matrix = pd.read_csv(args["matrix_path"], dtype=str, keep_default_na=False)
    matrix["record"] = [str(Path(r).relative_to(tmp_path / "study")) for r in matrix["record"]]
    (results / "tables").mkdir()
    matrix.to_csv(results / "tables" / "matrix.csv", index=False)
    config = {"targets": {**TARGETS, "noise_cv_max": 0.05, "reproduce_tolerance": 0.1}, "scaling": {"predict_gpus": [4]}}
    (results / "tables" / "config.json").write_text(json.dumps(config))
    code = NO_TORCH + "import runpy; sys.argv[0] = 'rebuild'; runpy.run_module('scalerepro.analysis.rebuild', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", code, "--results", str(results), "--references", str(args["references_path"]), "--templates", str(REPO / "report")],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    runs = pd.read_csv(results / "tables" / "runs.csv")
    assert runs["status"].eq("ok").all()  # the relative record paths were found from the results' folder
    assert (results / "plots" / "throughput_vs_gpus.svg").is_file() and (results / "tables" / "comparison.csv").is_file()
    page = (results / "report" / "index.html").read_text()
    assert 'id="cpu-study"' in page and "not comparable: GPU" in page
    assert "rebuild: 2 runs" in done.stderr and str(results / "report" / "index.html") in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.rebuild", "--results", str(tmp_path / "nowhere")], check=False, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no study matrix" in missing.stderr


def test_a_matrix_from_before_the_reference_column_reads_as_no_reference(tmp_path):
    args = write_cpu_study(tmp_path)
    old = pd.read_csv(args["matrix_path"]).drop(columns=["reference", "grad_accum_steps", "parallel", "data_parallel"])
    old.to_csv(args["matrix_path"], index=False)
    matrix = readers.read_matrix(args["matrix_path"])
    assert matrix["reference"].eq("").all() and matrix["grad_accum_steps"].eq(1).all()
    assert matrix["parallel"].eq("ddp").all() and matrix["data_parallel"].eq(matrix["gpus"]).all()
    tables = aggregate.aggregate(**args, targets={})
    assert tables["runs"]["status"].eq("ok").all() and tables["comparison"]["verdict"].eq("not comparable: GPU").all()


def test_a_new_check_is_one_config_entry_evaluated_and_listed_in_the_report(gpu, tmp_path):
    """No code names the check below: its entry alone has it evaluated and shown."""
    from scalerepro.analysis.presentation import report

    throughput = {
        "description": "strong-scaling throughput at the largest count",
        "table": "scaling",
        "where": {"study": "strong", "gpus": "max"},
        "metric": "samples_per_s_median",
        "reduce": "worst",
        "direction": "min",
        "threshold": 1000,
        "unit": "samples/s",
    }
    config = {**TARGETS, "checks": {**TARGETS["checks"], "strong_throughput": throughput}}
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    jsonschema.validate({"targets": config}, {**schema, "required": []})  # the entry is a valid config entry
    tables = dict(gpu[0], checks=checking.checks_table(gpu[0], config))
    added = check(tables, "strong_throughput")
    # resnet50 at 4 GPUs: median of its strong 4-GPU runs, below 1000 samples/s
    at_4 = row(tables["scaling"], study="strong", gpus=4)["samples_per_s_median"]
    assert (added["measured"], added["status"], added["unit"]) == (at_4, "fail" if at_4 < 1000 else "pass", "samples/s")
    assert added["target"] == (
        "strong-scaling throughput at the largest count: the worst samples_per_s_median >= 1000 samples/s over the scaling rows where "
        "study = strong, gpus = 4 (max)"
    )
    assert list(tables["checks"]["check"]) == sorted([*TARGETS["checks"], "strong_throughput"])
    aggregate.write_tables(tables, tmp_path)
    page = report.render(tmp_path, None, None, None, None, REPO / "report")
    summary = page.split('id="checks"')[1].split('id="headline"')[0]
    assert "strong_throughput" in summary and html.escape(added["target"]) in summary and added["value"] in summary


@pytest.mark.parametrize(
    ("name", "strategy", "sent", "bubble"),
    [("gpt2_tiny_tp2", "tp", 524288 + 393216 + 2560, None), ("gpt2_tiny_pp2", "pp", 3 * 131072 + 4, 0.2)],
)
def test_records_the_trainer_wrote_under_tp_and_pp_read_into_their_sharding_figures(name, strategy, sent, bubble):
    """Records written by `python -m scalerepro.training.train --parallel tp|pp` on 2 gloo ranks (a tiny
    GPT, tests/fixtures/records): each strategy names its collectives differently, and the
    communication per step is their sum."""

    fields = readers.read_record(name, str(Path(__file__).parent / "fixtures/records" / f"{name}.json")).fields
    assert fields["status"] == "ok" and fields["parallel_recorded"] == strategy and fields["mesh"] == f"2 ({strategy})"
    assert fields["comm_bytes_per_step"] == sent and fields["comm_by_collective"].count(" B") >= 3
    assert fields["pipeline_bubble_fraction"] == bubble
    assert fields["params_bytes_per_rank"] > 0 and fields["optimizer_bytes_per_rank"] == 2 * fields["params_bytes_per_rank"]
    assert fields["activations_bytes_per_rank"] is None and "not measured on the CPU" in fields["activations_reason"]


H100_2026_11_26 = REPO / "benchmarks" / "gpu" / "h100-2026-11-26"


@pytest.mark.parametrize(
    ("model", "kind", "gib"),
    # the preset replays CUDA graphs for the conv nets: their allocated peak read 0.56 and 0.11 GiB,
    # their reserved 12.72 and 3.76 GiB; the transformers compile without graphs
    [("resnet50", "cuda_reserved", 12.72), ("resnet18_cifar", "cuda_reserved", 3.76), ("gpt2_small", "cuda_allocated", 15.14)],
)
def test_a_cuda_graph_runs_peak_memory_is_its_reserved_peak_on_the_h100_records(model, kind, gib):
    """Records an H100 wrote (2026-11-26): a run that replays CUDA graphs allocates its activations
    from the graphs' private pools, which the window's allocated peak does not count; its peak
    memory is the reserved peak, named as such."""

    fields = readers.read_record(model, str(H100_2026_11_26 / f"{model}-optimised-frontier.json")).fields
    assert fields["status"] == "ok" and fields["peak_memory_kind"] == kind
    assert fields["peak_memory_bytes"] / 2**30 == pytest.approx(gib, abs=0.01)
