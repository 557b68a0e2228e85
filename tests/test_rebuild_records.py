"""A report from any folder of run records (issue 33): `python -m scalerepro.analysis.rebuild
--records DIR... --out OUT`, on the H100 records the project kept, and its one-line errors."""

from __future__ import annotations

import datetime
import json
import shutil
import statistics
import subprocess
import sys
from typing import Any

import pandas as pd
import pytest

from conftest import REPO
from h100_report import H100_RECORDS, REBUILDS_A_STUDY, rebuild_from_records


def test_the_kept_h100_records_give_a_report_with_every_record_a_run(h100_report):
    matrix = pd.read_csv(h100_report.out / "tables" / "matrix.csv")
    runs = pd.read_csv(h100_report.out / "tables" / "runs.csv")
    records = sorted(p for folder in H100_RECORDS for p in folder.glob("*.json") if "comm_" not in p.name and p.name != "system.json")
    assert len(matrix) == len(records) == 22 and matrix["study"].eq("records").all()
    # the record that failed in its probe is a failure, not a result; every other one is ok
    assert runs["status"].value_counts().to_dict() == {"ok": 21, "failed": 1}
    failed = runs[runs["status"].eq("failed")].iloc[0]
    assert failed["run_id"].endswith("failed-in-the-probe") and "OutOfMemoryError" in failed["error"]
    # a lever record is its own cell, named by what departs from its preset
    assert "optimised, precision=fp16" in set(matrix["variant"])
    # one preset label that resolved differently (the preset compiles conv nets with CUDA graphs
    # since 2026-11-26) is two cells, each named by the knob that differs
    resnet50 = set(matrix.loc[matrix["model"].eq("resnet50") & matrix["variant"].str.startswith("optimised ("), "variant"])
    assert resnet50 == {"optimised (compile default)", "optimised (compile reduce-overhead)"}
    # the all-reduce result beside the records is copied as the workflow names it; at one rank it moves
    # no data (its "9,998 GB/s" was a no-op's), so it is left out of the table, and said to be
    assert (h100_report.out / "comm" / "g1.json").is_file() and pd.read_csv(h100_report.out / "tables" / "communication.csv").empty
    left_out = json.loads((h100_report.out / "tables" / "summary.json").read_text())["left_out"]
    assert left_out == ["comm/g1.json: an all-reduce at one rank moves no data: its time and bandwidth are a no-op's, not a link's"]
    # the output is a study folder of its own: every record copied into runs/, so it rebuilds with --results
    assert sorted(p.parent.name for p in (h100_report.out / "runs").glob("*/record.json")) == sorted(matrix["run_id"])
    assert (h100_report.out / "report" / "index.html").stat().st_size > 10_000
    # the inventory beside them (scalerepro.telemetry.inventory's system.json) describes the system
    inventory = json.loads((h100_report.out / "inventory" / "system.json").read_text())
    assert inventory["gpus"][0]["power_limit_w"] == 700 and "GPU0" in inventory["nvidia_smi_topo"]
    system = h100_report.html.split('<section id="system">')[1].split("</section>")[0]
    assert "No inventory" not in system and "GPU-decde575-c257-69ae-0f43-c505c5bc60e3" in system


@REBUILDS_A_STUDY
def test_records_only_errors_are_one_line_and_name_the_fix(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.json").write_text(json.dumps({"hello": 1}))
    for records, fragment in ((tmp_path / "nowhere",), "no such folder of run records"), ((empty,), "no run record among the JSON files"):
        done = rebuild_from_records(records, tmp_path / "out")
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and fragment in done.stderr, done.stderr
    # a JSON beside the records that is not one is named and left out, not fatal
    mixed = tmp_path / "mixed"
    shutil.copytree(H100_RECORDS[1], mixed, ignore=shutil.ignore_patterns("study-results", "*.log", "*.txt"))
    (mixed / "notes.json").write_text(json.dumps({"hello": 1}))
    done = rebuild_from_records((mixed,), tmp_path / "mixed-out")
    assert done.returncode == 0 and "left out 1 JSON files: notes.json (not a run record)" in done.stderr, done.stderr


@REBUILDS_A_STUDY
def test_run_from_any_folder_it_finds_its_checkouts_references_and_a_missing_config_is_named(tmp_path):
    """The defaults (config/references.yaml, report/, config/config.yaml) are the checkout's where
    the command runs outside a workflow folder; a --config that is not there is refused, not ignored."""
    code = "import runpy, sys; sys.argv[0] = 'rebuild'; runpy.run_module('scalerepro.analysis.rebuild', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", code, "--records", str(H100_RECORDS[1]), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and (tmp_path / "out" / "report" / "index.html").is_file(), done.stderr[-2000:]
    missing = subprocess.run(
        [sys.executable, "-c", code, "--records", str(H100_RECORDS[1]), "--out", str(tmp_path / "o2"), "--config", str(tmp_path / "nowhere.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nowhere.yaml: no such file" in missing.stderr, missing.stderr


def _later(record: dict[str, Any], minutes: int) -> dict[str, Any]:
    """Another run of ``record``, ``minutes`` later."""
    again = json.loads(json.dumps(record))
    for stamp in ("started_at", "ended_at"):
        again[stamp] = (datetime.datetime.fromisoformat(again[stamp]) + datetime.timedelta(minutes=minutes)).isoformat()
    return again


def _faster(record: dict[str, Any], factor: float) -> None:
    """The record's window run ``factor`` times as fast, every figure agreeing as the trainer's would."""
    m = record["measurements"]
    for figure in ("samples_per_s", "achieved_flops", "mfu"):
        m[figure] *= factor
    for figure in ("window_s", "epoch_time_s", "data_wait_s"):
        m[figure] /= factor
    m["step_time_s"] = {key: value / factor for key, value in m["step_time_s"].items()}


@REBUILDS_A_STUDY
def test_a_lever_record_beside_preset_records_is_a_cell_of_its_own_and_the_preset_keeps_its_row(tmp_path):
    # the cause: the levers (stem channels, attention kernel, compile scope) were no part of a
    # cell, so a lever run joined the preset's cell, and ResNet-50's "Measured vs published" row
    # was lost when a folder of lever runs was rebuilt
    kept = json.loads((REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "resnet50-optimised-frontier.json").read_text())
    folder = tmp_path / "records"
    folder.mkdir()
    for minutes in (0, 1, 2):
        (folder / f"resnet50-preset-{minutes}.json").write_text(json.dumps(_later(kept, minutes)))
    lever = _later(kept, 3)
    # --stem-channels 4, as the trainer records it: the lever's value (no preset sets it, so no
    # preset override), and another window (slower: the preset stays the model's fastest cell)
    lever["knobs"]["stem_channels"] = 4
    _faster(lever, 0.9)
    (folder / "resnet50-stem4.json").write_text(json.dumps(lever))
    done = rebuild_from_records((folder,), tmp_path / "out")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "out" / "tables" / "runs.csv").set_index("run_id")
    assert runs["counts"].all() and runs["consistency"].isna().all(), runs["consistency"].tolist()
    preset = runs.drop(index="resnet50-stem4")
    assert preset["cell"].nunique() == 1 and runs.loc["resnet50-stem4", "cell"] not in set(preset["cell"])
    assert "stem_channels 4" in runs.loc["resnet50-stem4", "variant"]
    published = pd.read_csv(tmp_path / "out" / "tables" / "published_comparison.csv")
    measured = published[published["model"].eq("resnet50") & published["measured"].notna()]
    assert not measured.empty, "ResNet-50 has no measured row beside the published figures"
    assert (measured["repeats"] == 3).all() and measured["measured"].tolist() == pytest.approx([statistics.median(preset["samples_per_s"])] * len(measured))
    assert all(set(str(named).replace(",", " ").split()) == set(preset.index) for named in measured["measured_runs"]), measured["measured_runs"].tolist()
