"""``python -m scalerepro.analysis.predict --record`` replays only what a record is evidence of: a
completed one-GPU step, on a GPU, the preset's GPU unless ``--other-gpu`` says otherwise. Each
hostile record is a copy of a kept H100 record (benchmarks/gpu/, never edited) with one field
changed, run through the real command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from scalerepro.analysis import predict
from scalerepro.analysis.tables import aggregate

from conftest import REPO, clean_env

KEPT = REPO / "benchmarks/gpu/h100-2026-11-27/study-results/runs/strong_resnet50_g1_r1/record.json"
REFERENCES = REPO / "config" / "references.yaml"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def _predict(record: Path, *flags: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.predict", "--record", str(record), "--references", str(REFERENCES), "--gpus", "8", "16", *flags],
        cwd=cwd,
        env=clean_env(PYTHONPATH=str(REPO / "workflow")),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy(tmp_path: Path, change: Callable[[dict[str, Any]], None], name: str = "record.json") -> Path:
    record = json.loads(KEPT.read_text())
    change(record)
    path = tmp_path / name
    path.write_text(json.dumps(record, indent=1))
    return path


def _set(*path_and_value: Any) -> Callable[[dict[str, Any]], None]:
    *path, value = path_and_value

    def change(record: dict[str, Any]) -> None:
        node = record
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _on_a_cpu(record: dict[str, Any]) -> None:
    record["parallel"]["device_type"] = "cpu"
    record["hardware"]["gpu"].update(name=None, count=0, memory_bytes=None)  # as the trainer writes it on a CPU


# (id, the one field changed, the preset, what the one line of refusal says)
REFUSED = [
    ("a failed run", _set("status", "failed"), "dgx_h100", "the record's status is 'failed', not 'ok'"),
    ("a CPU run", _on_a_cpu, "dgx_h100", "the step was measured on 'cpu' (parallel.device_type), not a GPU"),
    ("two ranks", _set("parallel", "world_size", 2), "dgx_h100", "the record is of 2 ranks (parallel.world_size 2), not one GPU's step"),
    (
        "an A100 step on a DGX H100",
        _set("hardware", "gpu", "name", A100),
        "dgx_h100",
        f"the step was measured on {A100}, and NVIDIA DGX H100 (dgx_h100) has {H100}: the model does not scale compute between GPU models",
    ),
    ("an H100 step on a DGX A100", lambda record: None, "dgx_a100", f"the step was measured on {H100}, and NVIDIA DGX A100 (dgx_a100) has {A100}"),
    (
        "a window beside busy neighbours",
        _set("measurements", "host_activity", "other_cpu_fraction_max", 0.56),
        "dgx_h100",
        "the record is no evidence: it did not have its machine to itself: other processes used 56 % of the node's CPUs during its measured window",
    ),
    (
        "a negative throughput",
        _set("measurements", "samples_per_s", -5.0),
        "dgx_h100",
        "the record is no evidence: the record's figures are no measurement (samples_per_s is -5.0, where a measured one is above 0 samples/s",
    ),
]


@pytest.mark.parametrize(("name", "change", "cluster", "said"), REFUSED, ids=[case[0] for case in REFUSED])
def test_predict_refuses_a_record_that_is_not_one_gpus_step_on_the_presets_gpu(name, change, cluster, said, tmp_path):
    """Each of these was predicted on the preset with exit 0, beside the model's typical error."""
    record = _copy(tmp_path, change)
    done = _predict(record, "--cluster", cluster, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (name, done.returncode, done.stderr[-2000:])
    assert lines[0].startswith(f"scalerepro.analysis.predict: error: {record}: ") and said in lines[0], (name, lines[0])
    assert done.stdout == "", name  # no prediction printed


def test_predict_names_the_gpu_and_replays_another_gpus_step_only_when_told(tmp_path):
    """The output says which GPU the step was measured on; with --other-gpu a step measured on an
    A100 is replayed on the DGX H100's network with its compute unchanged (the same table as the
    same step named an H100's), and says so."""
    own = _predict(KEPT, "--cluster", "dgx_h100", "--csv", str(tmp_path / "h100.csv"), cwd=tmp_path)
    assert own.returncode == 0, own.stderr
    assert own.stdout.splitlines()[0] == f"profile: {KEPT}, one GPU's step measured on {H100}"
    assert "as if its compute were unchanged" not in own.stdout and "typical error" in own.stdout
    a100 = _copy(tmp_path, _set("hardware", "gpu", "name", A100))
    told = _predict(a100, "--cluster", "dgx_h100", "--other-gpu", "--csv", str(tmp_path / "a100.csv"), cwd=tmp_path)
    assert told.returncode == 0, told.stderr
    assert told.stdout.splitlines()[:2] == [
        f"profile: {a100}, one GPU's step measured on {A100}",
        f"the step was measured on {A100} and is replayed on NVIDIA DGX H100's network as if its compute were unchanged "
        f"(no scaling of compute between GPU models: {H100} would compute at its own speed)",
    ]
    assert pd.read_csv(tmp_path / "a100.csv").equals(pd.read_csv(tmp_path / "h100.csv"))
    # the flag is --record's: with --study it is refused, not ignored
    alone = subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.predict", "--study", str(tmp_path), "--other-gpu", "--references", str(REFERENCES)],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(REPO / "workflow")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 2 and "--other-gpu applies to --record only" in alone.stderr, alone.stderr


# ---- --study: the records of the study the tables are of ---------------------------------------

KEPT_STUDY = REPO / "benchmarks/gpu/h100-2026-11-27/study-results"
OTHER_STUDY = REPO / "benchmarks/gpu/h100-2026-11-26/study-results"  # the same run ids, other records


def _study_with_tables(root: Path) -> Path:
    """A copy of the kept 11-27 study with the aggregate rule's tables (made in this process)."""
    study = root / "study"
    shutil.copytree(KEPT_STUDY, study, ignore=shutil.ignore_patterns("report", "plots", "profiles"))
    tables, left_out = aggregate.aggregate_study(study / "tables" / "matrix.csv", [], REFERENCES, {})
    aggregate.write_tables(tables, study / "tables", left_out)
    return study


def _predict_study(tables: str, out: Path, capsys) -> tuple[int, str]:
    code = predict.main(["--study", tables, "--references", str(REFERENCES), "--gpus", "8", "--csv", str(out)])
    return code, capsys.readouterr().err.strip()


def test_predict_study_reads_the_study_the_tables_are_in_from_any_folder(tmp_path, monkeypatch, capsys):
    # the cause: the records were resolved against the tables' path as typed: --study . inside
    # tables/ looked for them in tables/runs/
    study = _study_with_tables(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert _predict_study(str(study / "tables"), tmp_path / "absolute.csv", capsys) == (0, "")
    monkeypatch.chdir(study / "tables")
    assert _predict_study(".", tmp_path / "here.csv", capsys) == (0, "")
    expected = pd.read_csv(tmp_path / "absolute.csv")
    assert not expected.empty and pd.read_csv(tmp_path / "here.csv").equals(expected)


def test_predict_study_never_reads_another_studys_records(tmp_path, monkeypatch, capsys):
    # the cause: tables beside another study's runs/ (the 11-26 session's, the same run ids) were
    # predicted from that study's records, exit 0
    study = _study_with_tables(tmp_path / "made")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(OTHER_STUDY / "runs", elsewhere / "runs")
    shutil.copytree(study / "tables", elsewhere / "tables")
    monkeypatch.chdir(tmp_path)
    code, err = _predict_study(str(elsewhere / "tables"), tmp_path / "out.csv", capsys)
    assert code == 2 and "\n" not in err and not (tmp_path / "out.csv").exists(), err
    assert (
        err.startswith(f"scalerepro.analysis.predict: error: {elsewhere / 'tables' / 'runs.csv'}: the record at {elsewhere / 'runs'}/")
        and "is not the one run" in err
    ), err
    # the tables alone, without their study's runs/: refused, naming the record that is not there
    alone = tmp_path / "alone"
    shutil.copytree(study / "tables", alone / "tables")
    code, err = _predict_study(str(alone / "tables"), tmp_path / "out.csv", capsys)
    assert code == 2 and "\n" not in err and f"counted a record that is not at {alone / 'runs'}/" in err, err


def test_predict_study_holds_the_global_batch_the_reports_table_holds(tmp_path, capsys):
    # the cause: `predict --study` split a one-GPU study's batch over N GPUs (Llama-1B's 8
    # sequences, one a GPU at 8), where the report's scaling model holds a batch one would run
    # (the batch is held over the largest count predicted: ask for the counts the report predicts)
    study = _study_with_tables(tmp_path)
    report = pd.read_csv(study / "tables" / "scaling_model.csv")
    counts = sorted({int(g) for g in report.loc[report["basis"].eq("predicted"), "gpus"]})
    code = predict.main(["--study", str(study / "tables"), "--references", str(REFERENCES), "--gpus", *map(str, counts), "--csv", str(tmp_path / "p.csv")])
    assert code == 0 and len(counts) > 1
    out = capsys.readouterr().out
    mine = pd.read_csv(tmp_path / "p.csv")
    strong = mine[mine["study"].eq("strong") & mine["gpus"].gt(1)]
    assert not strong.empty
    for row in strong.itertuples():
        theirs = report[report["study"].eq("strong") & report["model"].eq(row.model) & report["gpus"].eq(row.gpus)]
        assert len(theirs) == 1 and int(theirs["global_batch"].iloc[0]) == row.global_batch, (row.model, row.gpus)
        assert f"strong {row.model}: global batch {row.global_batch}" in out
    # at the largest count each GPU runs the batch the study ran on one GPU, not a sliver of it
    runs = pd.read_csv(study / "tables" / "runs.csv")
    for row in strong[strong["gpus"].eq(max(counts))].itertuples():
        one_gpu = runs[runs["study"].eq("strong") & runs["model"].eq(row.model) & runs["gpus"].eq(1)]["per_gpu_batch"].iloc[0]
        capped = "capped" in row.global_batch_basis or "no multiple" in row.global_batch_basis
        assert capped or row.per_gpu_batch * row.grad_accum_steps == one_gpu, (row.model, row.per_gpu_batch, one_gpu)
