"""A figure is published only from this study's own records, each agreeing with itself and with
its plan: copies of real studies (the README's CPU study as the workflow wrote it, the one-H100
studies and records kept from GPU sessions) with one change each, read by the real commands.

Each case names the cause it tests; the run it touches is refused (missing or failed, or not
counted with the reason), the rest still count, and no figure of it reaches a table."""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from scalerepro.analysis import rebuild
from scalerepro.analysis.tables import aggregate, readers
from scalerepro.record import evidence

from conftest import REPO, clean_env
from h100_report import REBUILDS_A_STUDY

CPU_STUDY = REPO / "tests" / "fixtures" / "studies" / "cpu-readme-a0f872f"
H100_STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "study-results"
H100_STUDY_26 = REPO / "benchmarks" / "gpu" / "h100-2026-11-26" / "study-results"
H100_RECORDS = REPO / "benchmarks" / "gpu" / "h100-2026-11-27"
REFERENCES = str(REPO / "config" / "references.yaml")
NO_TORCH = "import sys; sys.modules['torch'] = None\nimport runpy; sys.argv[0] = 'scalerepro'; runpy.run_module(sys.argv.pop(1), run_name='__main__')"


def _run(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command of the analysis side as its user runs it, in a process where torch cannot load."""
    return subprocess.run([sys.executable, "-c", NO_TORCH, module, *argv], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=300)


def _rebuild(study: Path) -> subprocess.CompletedProcess:
    return _run("scalerepro.analysis.rebuild", "--results", str(study), "--references", REFERENCES, "--templates", str(REPO / "report"), cwd=study.parent)


def _aggregate(study: Path) -> subprocess.CompletedProcess:
    """The aggregate rule's command on a study folder, as the workflow runs it (the tables alone: a
    second, not a rebuild's report)."""
    config = json.loads((study / "tables" / "config.json").read_text())
    return _run(
        "scalerepro.analysis.tables.aggregate",
        "--matrix",
        str(study / "tables" / "matrix.csv"),
        "--references",
        REFERENCES,
        "--out",
        str(study / "tables"),
        "--targets",
        json.dumps(config.get("targets") or {}),
        "--comm",
        *map(str, sorted((study / "comm").glob("g*.json"))),
        cwd=study.parent,
    )


def _copy(kept: Path, root: Path, name: str = "study") -> Path:
    study = root / name
    shutil.copytree(kept, study, ignore=shutil.ignore_patterns("report", "plots"))
    return study


def _edit(study: Path, run_id: str, change: Callable[[dict], None]) -> None:
    path = study / "runs" / run_id / "record.json"
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _runs(study: Path) -> pd.DataFrame:
    return pd.read_csv(study / "tables" / "runs.csv").set_index("run_id")


def _record(path: Path) -> dict:
    return json.loads(path.read_text())


# ---- records resolve inside the study's own folder ---------------------------------------------


@REBUILDS_A_STUDY
def test_a_kept_study_in_a_folder_of_any_name_is_rebuilt_from_its_own_records(tmp_path):
    # the defect: the matrix's results/runs/... resolved against the folder's parent: "16 planned: 16 missing"
    study = _copy(H100_STUDY, tmp_path, "study-results")
    done = _rebuild(study)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = _runs(study)
    assert runs["status"].value_counts().to_dict() == {"ok": 9, "missing": 7}
    resnet50 = _record(H100_STUDY / "runs" / "strong_resnet50_g1_r1" / "record.json")["measurements"]["samples_per_s"]
    assert runs.loc["strong_resnet50_g1_r1", "samples_per_s"] == pytest.approx(resnet50)


@REBUILDS_A_STUDY
def test_a_study_beside_another_studys_results_reads_its_own_records(tmp_path):
    # the defect: the 11-27 study rebuilt beside the 11-26 study's results/ took 11-26's ResNet-50 (5,627, not 5,630)
    study = _copy(H100_STUDY, tmp_path, "study-results")
    _copy(H100_STUDY_26, tmp_path, "results")
    assert _rebuild(study).returncode == 0
    own = _record(H100_STUDY / "runs" / "strong_resnet50_g1_r1" / "record.json")
    other = _record(H100_STUDY_26 / "runs" / "strong_resnet50_g1_r1" / "record.json")
    runs = _runs(study)
    assert own["measurements"]["samples_per_s"] != other["measurements"]["samples_per_s"]
    assert runs.loc["strong_resnet50_g1_r1", "samples_per_s"] == pytest.approx(own["measurements"]["samples_per_s"])
    assert runs.loc["strong_resnet50_g1_r1", "started_at"] == own["started_at"]
    html = (study / "report" / "index.html").read_text()
    assert f"{round(own['measurements']['samples_per_s']):,}" in html and f"{round(other['measurements']['samples_per_s']):,}" not in html


@REBUILDS_A_STUDY
@pytest.mark.parametrize("recorded", ["../elsewhere/runs/strong_resnet50_g1_r1/record.json", "/tmp/strong_resnet50_g1_r1/record.json"])
def test_a_matrix_whose_record_lies_outside_the_study_is_refused_in_one_line(tmp_path, recorded):
    study = _copy(H100_STUDY, tmp_path, "study-results")
    matrix = pd.read_csv(study / "tables" / "matrix.csv")
    matrix.loc[matrix["run_id"].eq("strong_resnet50_g1_r1"), "record"] = recorded
    matrix.to_csv(study / "tables" / "matrix.csv", index=False)
    done = _rebuild(study)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert f"the record of run strong_resnet50_g1_r1, {recorded} (" in done.stderr and "lies outside the study folder" in done.stderr
    assert not (study / "tables" / "runs.csv").exists()


@REBUILDS_A_STUDY
def test_store_append_reads_the_studys_own_records_beside_another_studys(tmp_path):
    # store append resolved the records against the working directory: run from
    # beside another study's results/, it stored that study's records
    study = _copy(CPU_STUDY, tmp_path, "kept")
    other = _copy(CPU_STUDY, tmp_path, "results")
    (other / "runs" / "strong_resnet18_cifar_g1_r1" / "record.json").unlink()  # what the other study lacks, this one has
    assert _rebuild(study).returncode == 0
    store = tmp_path / "store.duckdb"
    shutil.copy(study / "inventory" / "system.json", tmp_path / "system.json")
    done = _run(
        "scalerepro.analysis.history.store",
        "append",
        "--store",
        str(store),
        "--matrix",
        "kept/tables/matrix.csv",
        "--config",
        "kept/tables/config.json",
        "--inventory",
        "system.json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with duckdb.connect(str(store), read_only=True) as connection:
        stored = connection.execute("SELECT run_id, record_sha256 FROM runs WHERE run_id = 'strong_resnet18_cifar_g1_r1'").fetchall()
    text = (study / "runs" / "strong_resnet18_cifar_g1_r1" / "record.json").read_text(encoding="utf-8")
    assert stored == [("strong_resnet18_cifar_g1_r1", hashlib.sha256(text.encode("utf-8")).hexdigest())]


# ---- a record's figures agree with each other -------------------------------------------------


def _scaled(path: tuple[str, ...], factor: float) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        parent = record
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = parent[path[-1]] * factor

    return change


def _set(path: tuple[str, ...], value) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        parent = record
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value

    return change


def _ended_before_started(record: dict) -> None:
    record["ended_at"], record["started_at"] = record["started_at"], record["ended_at"]


CPU_RUN = "strong_resnet18_cifar_g2_r1"
GPU_RUN = "strong_resnet50_g1_r1"
DISAGREEING = [
    # (cause, kept study, run, change, status, what the error says)
    ("throughput ten times samples over window", CPU_STUDY, CPU_RUN, _scaled(("measurements", "samples_per_s"), 10), "failed", "samples_per_s is"),
    (
        "an epoch time shorter than its steps",
        CPU_STUDY,
        CPU_RUN,
        _scaled(("measurements", "epoch_time_s"), 0.5),
        "failed",
        "where steps.per_epoch x step_time_s.median gives",
    ),
    ("p10 above the median", CPU_STUDY, CPU_RUN, _set(("measurements", "step_time_s", "p10"), 99.0), "failed", "step_time_s.p10 99 is above its median"),
    ("energy per sample not energy over samples", H100_STUDY, GPU_RUN, _scaled(("measurements", "energy_per_sample_j"), 3), "failed", "energy_per_sample_j is"),
    ("an MFU on a CPU run", CPU_STUDY, CPU_RUN, _set(("measurements", "mfu"), 0.999), "failed", "mfu is stated without peak:"),
    (
        "a 500 GiB peak on an 80 GiB card",
        H100_STUDY,
        GPU_RUN,
        _set(("measurements", "memory", "reserved_bytes_max"), 500 * 2**30),
        "failed",
        "500.0 GiB is more than the card holds (79.2 GiB)",
    ),
    ("ended before it started", CPU_STUDY, CPU_RUN, _ended_before_started, "failed", "is before started_at"),
    ("a schema newer than the code", CPU_STUDY, CPU_RUN, _set(("schema_version",), 99), "missing", "newer than this scalerepro reads"),
]


@pytest.mark.parametrize(("cause", "kept", "run_id", "change", "status", "said"), DISAGREEING, ids=[case[0] for case in DISAGREEING])
def test_a_record_whose_figures_disagree_is_no_evidence(cause, kept, run_id, change, status, said, tmp_path):
    study = _copy(kept, tmp_path)
    _edit(study, run_id, change)
    done = _aggregate(study)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = _runs(study)
    run = runs.loc[run_id]
    assert run["status"] == status and said in run["error"] and not run["counts"], (cause, run["status"], run["error"])
    assert pd.isna(run["samples_per_s"]), cause  # no figure of it in any table
    others = runs.drop(index=run_id)  # the rest count, but those the kept study ran beside busy neighbours
    assert others.loc[others["status"].eq("ok") & others["consistency"].isna(), "counts"].all(), cause


def test_short_epoch_times_in_two_of_three_repeats_do_not_move_weak_efficiency(tmp_path):
    # the cause: two repeats' epoch_time_s cut to a tenth moved weak efficiency 0.660 -> 65.064
    study = _copy(CPU_STUDY, tmp_path)
    # the third repeat as a quiet machine's (the kept one ran beside other processes: not counted)
    _edit(study, "weak_resnet18_cifar_g2_r3", _set(("measurements", "host_activity", "other_cpu_fraction_max"), 0.01))
    assert _aggregate(study).returncode == 0
    before = pd.read_csv(study / "tables" / "scaling.csv").set_index(["study", "gpus"]).loc[("weak", 2), "efficiency"]
    for repeat in (1, 2):
        _edit(study, f"weak_resnet18_cifar_g2_r{repeat}", _scaled(("measurements", "epoch_time_s"), 0.1))
    assert _aggregate(study).returncode == 0
    weak = pd.read_csv(study / "tables" / "scaling.csv").set_index(["study", "gpus"]).loc[("weak", 2)]
    assert weak["repeats_ok"] == 1 and 0 < weak["efficiency"] <= 1.5 and weak["efficiency"] != pytest.approx(before * 10, rel=0.05)


# ---- a record against its plan: every knob the plan sets, stated and equal --------------------


def _drop(path: tuple[str, ...]) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        parent = record
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]

    return change


def _global_batch(size: int) -> Callable[[dict], None]:
    """The record of a run at another global batch, its figures agreeing with it as the trainer's would."""

    def change(record: dict) -> None:
        m = record["measurements"]
        record["batch"]["global"] = size
        m["measured_samples"] = m["measured_steps"] * size
        m["samples_per_s"] = m["measured_samples"] / m["window_s"]
        m["achieved_flops"] = record["model"]["train_flops_per_sample"] * m["samples_per_s"]

    return change


def _one_rank_record_as(run_id: str) -> Callable[[Path], None]:
    """The 1-rank cell's record copied into a 2-rank run's place, its run id rewritten to fit."""

    def change(study: Path) -> None:
        record = _record(study / "runs" / "strong_resnet18_cifar_g1_r1" / "record.json")
        record["run_id"] = run_id
        (study / "runs" / run_id / "record.json").write_text(json.dumps(record))

    return change


PLAN = [
    # (cause, change, what the consistency says)
    ("a record without its world size", _drop(("parallel", "world_size")), "its record states no world size"),
    ("a record without its node count", _drop(("parallel", "nodes")), "its record states no node count"),
    ("another precision", _set(("precision",), "fp32"), "precision 'fp32', where the plan's is 'bf16'"),
    ("another accumulation", _set(("batch", "grad_accum_steps"), 4), "accumulation steps 4, where the plan's is 1"),
    ("another bucket cap", _set(("knobs", "bucket_cap_mb"), 1.0), "DDP bucket cap 1, where the plan's is 25"),
    ("another global batch", _global_batch(64), "global batch 64, where the plan's is 16"),
    (
        "another strategy",
        lambda r: r["measurements"].update(
            sharding={"strategy": "fsdp", "mesh": {"shape": [2], "dims": ["dp_shard"]}, "state_bytes_per_rank_max": 1000, "comm_bytes_per_step_analytic": None}
        ),
        "strategy 'fsdp', where the plan's is 'ddp'",
    ),
    ("another image size", _set(("model", "shape", "image_size"), 64), "its repeats differ in image size (32, 64)"),
    ("another data", _set(("data", "kind"), "cifar10"), "its repeats differ in data (cifar10, synthetic)"),
    # the kept study's records predate these knobs: they read as the levers' defaults
    ("a padded stem", _set(("knobs", "stem_channels"), 4), "its repeats differ in ResNet stem channels (3, 4)"),
    ("its blocks compiled alone", _set(("knobs", "compile_scope"), "blocks"), "its repeats differ in compile scope (blocks, model)"),
    (
        "an A100's record",
        lambda r: (r["parallel"].update(device_type="cuda"), r["hardware"].update(gpu={"name": "NVIDIA A100-SXM4-80GB"})),
        "differ in device (Intel(R) Xeon(R) Processor, NVIDIA A100-SXM4-80GB)",
    ),
]


@pytest.mark.parametrize(("cause", "change", "said"), PLAN, ids=[case[0] for case in PLAN])
def test_a_record_that_departs_from_its_plan_is_not_counted(cause, change, said, tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, change)
    done = _aggregate(study)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = _runs(study)
    run = runs.loc[CPU_RUN]
    assert not run["counts"] and said in str(run["consistency"]), (cause, run["status"], run["consistency"], run["error"])
    cell = pd.read_csv(study / "tables" / "scaling.csv").set_index(["study", "gpus"]).loc[("strong", 2)]
    assert cell["repeats_ok"] < 3, cause
    assert runs.loc["strong_resnet18_cifar_g1_r1", "counts"] and runs.loc["weak_resnet18_cifar_g2_r1", "counts"], cause


LACKING = [
    ("a record without a run id", ("run_id",), "run_id: Field required"),
    ("a record without its per-GPU batch", ("batch", "per_gpu"), "batch.micro_batch: Field required"),
]


@pytest.mark.parametrize(("cause", "path", "said"), LACKING, ids=[case[0] for case in LACKING])
def test_a_record_that_lacks_what_its_schema_requires_is_no_record(cause, path, said, tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, _drop(path))
    assert _aggregate(study).returncode == 0
    run = _runs(study).loc[CPU_RUN]
    assert run["status"] == "missing" and "is no run record of schema 3" in run["error"] and said in run["error"], (cause, run["error"])


def test_a_one_rank_record_is_not_counted_in_a_two_rank_cell(tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    _one_rank_record_as(CPU_RUN)(study)
    assert _aggregate(study).returncode == 0
    run = _runs(study).loc[CPU_RUN]
    assert not run["counts"] and "world size 1, where the plan's is 2" in run["consistency"]


def test_an_a100_record_in_the_cpu_studys_cell_moves_neither_its_median_nor_the_predictions(tmp_path):
    # the cause: one A100 record in the 2-rank cell moved its median and switched the predictions to dgx_a100
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, PLAN[-1][1])
    assert _aggregate(study).returncode == 0
    model = pd.read_csv(study / "tables" / "scaling_model.csv", dtype={"cluster": "string"})  # empty on a CPU study: read as floats
    assert not model.get("cluster", pd.Series(dtype="string")).str.contains("a100", na=False).any()


# ---- a measured window on a machine of its own --------------------------------------------------


def _tables(study: Path) -> dict[str, pd.DataFrame]:
    """The aggregate rule's tables of a study folder, in this process (what its command writes)."""
    config = json.loads((study / "tables" / "config.json").read_text())
    comm = sorted((study / "comm").glob("g*.json"))
    return aggregate.aggregate_study(study / "tables" / "matrix.csv", comm, REFERENCES, config.get("targets") or {})[0]


def _busy(share: float | None) -> Callable[[dict], None]:
    return _set(("measurements", "host_activity", "other_cpu_fraction_max"), share)


def test_a_run_measured_beside_busy_neighbours_is_not_counted_and_says_why(tmp_path):
    # the cause: nothing read other_cpu_fraction_max: a 2-rank repeat whose window other processes
    # held 56 % of the CPUs in counted like a quiet one, and moved its cell's median with it
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, _busy(0.56))
    quiet = "strong_resnet18_cifar_g2_r2"
    _edit(study, quiet, _drop(("measurements", "host_activity")))  # as a record before the field: not judged by it
    tables = _tables(study)
    runs = tables["runs"].set_index("run_id")
    run = runs.loc[CPU_RUN]
    assert run["status"] == "ok" and not run["counts"] and not run["consistent"]
    said = str(run["consistency"])
    assert "other processes used 56 % of the node's CPUs during its measured window" in said and said.endswith(": rerun it on a quiet machine"), said
    assert f"at most {evidence.QUIET[0].most:g}" in said and "\n" not in said
    # its figures stay where they were written: runs.csv keeps them, no median takes them
    own = _record(study / "runs" / CPU_RUN / "record.json")["measurements"]["samples_per_s"]
    assert run["samples_per_s"] == pytest.approx(own)
    assert runs.loc[quiet, "counts"] and pd.isna(runs.loc[quiet, "consistency"])
    counted = runs[runs["study"].eq("strong") & runs["gpus"].eq(2) & runs["counts"]]
    assert list(counted.index) == [quiet]  # the kept third repeat ran beside busy neighbours too (85 %)
    cell = tables["scaling"].set_index(["study", "gpus"]).loc[("strong", 2)]
    assert cell["repeats_ok"] == 1 and cell["samples_per_s_median"] == pytest.approx(runs.loc[quiet, "samples_per_s"])


def test_a_share_at_the_bound_counts(tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, _busy(evidence.QUIET[0].most))
    run = _tables(study)["runs"].set_index("run_id").loc[CPU_RUN]
    assert run["counts"] and pd.isna(run["consistency"]), run["consistency"]


def test_a_study_sets_its_own_bound_in_its_targets(tmp_path):
    # targets.other_cpu_fraction_max: a study that knows it shares its machine (the suite's CI
    # study) allows more; one that asks for a quieter machine allows less, and says its bound
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, _busy(0.56))
    config = json.loads((study / "tables" / "config.json").read_text())
    matrix, comm = study / "tables" / "matrix.csv", sorted((study / "comm").glob("g*.json"))
    targets = config.get("targets") or {}
    shared = aggregate.aggregate_study(matrix, comm, REFERENCES, {**targets, "other_cpu_fraction_max": 0.6})[0]["runs"].set_index("run_id")
    assert shared.loc[CPU_RUN, "counts"]
    strict = aggregate.aggregate_study(matrix, comm, REFERENCES, {**targets, "other_cpu_fraction_max": 0.1})[0]["runs"].set_index("run_id")
    assert not strict.loc[CPU_RUN, "counts"] and "where a counted run has at most 0.1)" in str(strict.loc[CPU_RUN, "consistency"])


@REBUILDS_A_STUDY
def test_the_report_names_the_share_and_the_fix(tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    _edit(study, CPU_RUN, _busy(0.56))
    done = _rebuild(study)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (study / "report" / "index.html").read_text()
    rows = [line for line in page.replace("<wbr>", "").split("<tr") if f"<td>{CPU_RUN}</td>" in line]  # the run's rows, table by table
    said = "other processes used 56 % of the node&#39;s CPUs during its measured window"
    assert any(said in row and "rerun it on a quiet machine" in row for row in rows), rows


# ---- ranks that share a card: MFU over the cards --------------------------------------------


def _two_ranks_on_one_card(record: dict, run_id: str) -> dict:
    """A one-card record as the trainer writes two gloo ranks on that card: each rank half the
    batch, and MFU over the distinct cards (one) as the trainer computes it (training.measurements)."""
    shared = json.loads(json.dumps(record))
    shared["run_id"] = run_id
    shared["parallel"].update(world_size=2, ranks_per_node=2, gpus=1, gpus_per_node=1, backend="gloo")
    shared["batch"]["per_gpu"] //= 2
    m = shared["measurements"]
    m["mfu"] = shared["model"]["train_flops_per_sample"] * m["samples_per_s"] / (1 * m["peak_flops_per_device"])
    return shared


def test_two_ranks_on_one_card_are_read_as_a_measurement_and_counted(tmp_path):
    # the cause: MFU checked over the ranks (2 x peak) where the trainer takes the cards (1): every
    # shared-card record was "no measurement, rerun it"
    study = _copy(H100_STUDY, tmp_path)
    one = "strong_resnet18_cifar_g1_r1"
    run_id = "strong_resnet18_cifar_g2_r1"
    shared = _two_ranks_on_one_card(_record(study / "runs" / one / "record.json"), run_id)
    (study / "runs" / run_id).mkdir()
    (study / "runs" / run_id / "record.json").write_text(json.dumps(shared))
    matrix = pd.read_csv(study / "tables" / "matrix.csv", dtype=str, keep_default_na=False)
    row = matrix[matrix["run_id"].eq(one)].assign(run_id=run_id, gpus="2", per_gpu_batch=str(shared["batch"]["per_gpu"]))
    pd.concat([matrix, row.assign(record=f"results/runs/{run_id}/record.json")]).to_csv(study / "tables" / "matrix.csv", index=False)
    tables = _tables(study)
    run = tables["runs"].set_index("run_id").loc[run_id]
    assert run["status"] == "ok" and run["counts"] and pd.isna(run["error"]), (run["status"], run["error"], run["consistency"])
    assert run["mfu"] == pytest.approx(shared["measurements"]["mfu"])
    scaling = tables["scaling"].set_index(["study", "model", "gpus"]).loc[("strong", "resnet18_cifar", 2)]
    assert scaling["repeats_ok"] == 1 and scaling["efficiency"] == pytest.approx(0.5)  # one card's throughput over 2 ranks


def test_a_records_folder_plans_two_ranks_on_one_card_as_two_ranks(tmp_path):
    # the cause: rebuild --records planned the record's cards (1) as its GPUs, which every reader
    # takes as the ranks: "world size 2, where the plan's is 1", not counted
    folder = tmp_path / "records"
    folder.mkdir()
    kept = _record(H100_RECORDS / "resnet18_cifar-optimised-frontier.json")
    (folder / "shared.json").write_text(json.dumps(_two_ranks_on_one_card(kept, kept["run_id"])))
    matrix, files, *_ = rebuild.record_matrix([folder])
    runs, _, _ = readers.read_runs(matrix.assign(record_file=[str(files[run]) for run in matrix["run_id"]]))
    run = runs.set_index("run_id").loc["shared"]
    assert run["counts"] and pd.isna(run["consistency"]) and run["gpus"] == 2, (run["status"], run["consistency"], run["gpus"])


# ---- files beside the records ---------------------------------------------------------------


def test_an_nccl_result_beside_gloo_runs_is_left_out_and_named(tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    comm = study / "comm" / "g2.json"
    document = _record(comm)
    document["backend"] = "nccl"
    comm.write_text(json.dumps(document))
    done = _aggregate(study)
    assert done.returncode == 0 and "left out comm/g2.json: it used nccl, where the runs' process groups used gloo" in done.stderr, done.stderr
    assert pd.read_csv(study / "tables" / "communication.csv").empty
    assert any("comm/g2.json" in line for line in _record(study / "tables" / "summary.json")["left_out"])


@REBUILDS_A_STUDY
def test_another_studys_profiling_tables_are_not_shown_as_this_studys(tmp_path):
    study = _copy(CPU_STUDY, tmp_path)
    for name in ("profiling", "profiling_kernels", "profiling_roofline", "profiling_files"):
        shutil.copy(H100_STUDY / "tables" / f"{name}.csv", study / "tables" / f"{name}.csv")
    done = _rebuild(study)
    said = "left out tables/profiling.csv, run strong_resnet18_cifar_g1_r1: an Nsight (ncu) profile of run strong_resnet18_cifar_g1_r1, which ran on the cpu"
    assert done.returncode == 0 and said in done.stderr, done.stderr[-2000:]
    for name in ("profiling", "profiling_kernels", "profiling_roofline"):
        assert pd.read_csv(study / "tables" / f"{name}.csv").empty, name


# ---- --records: a cell is every condition that changes the figure, each run once ------------


def _records_folder(root: Path, *names: str) -> Path:
    folder = root / "records"
    folder.mkdir()
    for name in names:
        shutil.copy(H100_RECORDS / name, folder / name)
    return folder


def _rebuild_records(folder: Path) -> subprocess.CompletedProcess:
    return _run(
        "scalerepro.analysis.rebuild",
        "--records",
        str(folder),
        "--out",
        str(folder.parent / "out"),
        "--references",
        REFERENCES,
        "--templates",
        str(REPO / "report"),
        "--config",
        str(REPO / "config" / "config.yaml"),
        cwd=folder.parent,
    )


def _variant_copy(folder: Path, source: str, name: str, change: Callable[[dict], None]) -> None:
    """Another run of the record in ``source`` (a minute later), changed."""
    record = _record(folder / source)
    change(record)
    for stamp in ("started_at", "ended_at"):
        record[stamp] = (datetime.datetime.fromisoformat(record[stamp]) + datetime.timedelta(minutes=1)).isoformat()
    (folder / name).write_text(json.dumps(record))


GROUPING = [
    ("ResNet-50 at 224 and at 64 px", "resnet50-optimised-frontier.json", _set(("model", "shape", "image_size"), 64), "image 64"),
    ("GPT-2 at sequence 1024 and 128", "gpt2_small-optimised-frontier.json", _set(("model", "shape", "seq_len"), 128), "sequence 128"),
    (
        "DDP beside FSDP",
        "gpt2_small-optimised-frontier.json",
        lambda r: r["measurements"].update(
            sharding={"strategy": "fsdp", "mesh": {"shape": [2], "dims": ["dp_shard"]}, "state_bytes_per_rank_max": 1000, "comm_bytes_per_step_analytic": None}
        ),
        None,
    ),
]


@REBUILDS_A_STUDY
@pytest.mark.parametrize(("cause", "source", "change", "label"), GROUPING, ids=[case[0] for case in GROUPING])
def test_records_of_different_conditions_are_different_cells(cause, source, change, label, tmp_path):
    folder = _records_folder(tmp_path, source)
    _variant_copy(folder, source, "other.json", change)
    done = _rebuild_records(folder)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "out" / "tables" / "runs.csv")
    keys = ["model", "gpus", "nodes", "parallel", "variant"]
    assert runs.groupby(keys).ngroups == 2, (cause, runs[keys].to_dict("records"))
    if label:
        assert runs["variant"].str.contains(label).any(), runs["variant"].tolist()


@REBUILDS_A_STUDY
def test_the_same_record_under_two_names_counts_once_and_is_named(tmp_path):
    folder = _records_folder(tmp_path, "resnet50-optimised-frontier.json")
    shutil.copy(folder / "resnet50-optimised-frontier.json", folder / "resnet50-copy.json")
    done = _rebuild_records(folder)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "out" / "tables" / "runs.csv")
    assert len(runs) == 1 and "resnet50-optimised-frontier.json (a copy of resnet50-copy.json" in done.stderr, done.stderr


@REBUILDS_A_STUDY
def test_a_smoke_run_is_not_a_repeat_of_a_measured_cell(tmp_path):
    # record_g1 (a smoke run with the probes at one rank) was pooled into the 11-25 ResNet-50 cell
    folder = tmp_path / "records"
    folder.mkdir()
    for name in ("record_g1.json", "record_ddp_w1.json", "resnet50-optimised-frontier.json"):
        shutil.copy(REPO / "benchmarks" / "gpu" / "h100-2026-11-25" / name, folder / name)
    assert _rebuild_records(folder).returncode == 0
    runs = pd.read_csv(tmp_path / "out" / "tables" / "runs.csv").set_index("run_id")
    assert runs.loc["record_g1", "purpose"] == "smoke" and runs.loc["record_ddp_w1", "purpose"] == "smoke"
    assert not runs.loc["record_g1", "counts"] and not runs.loc["record_ddp_w1", "counts"]
    assert runs.loc["resnet50-optimised-frontier", "counts"] and runs.loc["record_g1", "variant"] != runs.loc["resnet50-optimised-frontier", "variant"]
    checks = pd.read_csv(tmp_path / "out" / "tables" / "checks.csv").set_index("check")
    assert "record_ddp_w1" not in str(checks.loc["gpu_utilisation", "detail"])


@REBUILDS_A_STUDY
def test_another_machines_inventory_is_not_shown_as_this_studys_system(tmp_path):
    # the H100 session's inventory in the CPU study's folder was shown as the CPU study's system
    study = _copy(CPU_STUDY, tmp_path)
    shutil.copy(REPO / "benchmarks" / "gpu" / "h100-2026-11-25" / "system.json", study / "inventory" / "system.json")
    assert _rebuild(study).returncode == 0
    page = (study / "report" / "index.html").read_text()
    system = page.split('<section id="system">')[1].split("</section>")[0]
    assert "The inventory beside the records is not shown: it lists GPUs (NVIDIA H100 80GB HBM3) where every run ran on the CPU" in system
    assert "GPU-decde575" not in system and "Intel(R) Xeon(R) Processor" in system  # the hosts the records name, still listed
