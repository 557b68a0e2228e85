"""The prescreen in the results store (issue 68): table node_checks, one row per study, node and
device, added by schema version 7 (a store of version 6 migrates with its studies kept); ``append
--prescreen`` stores a study's screen with it, all or nothing; ``store.node_history`` reads one node
across studies, oldest check first, so a node getting slower over weeks shows; a bundle of version 6
rows still reads."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import duckdb
import pytest

from scalerepro.analysis.history import bundle, store, store_file, study_rows
from scalerepro.planning import node_screen
from scalerepro.record.node_check import AllReduceFigure, DeviceFigures, DeviceState, LinkCheck, NodeCheck, NodeScreen

from conftest import REPO, clean_env

README_STUDY = REPO / "tests/fixtures/studies/cpu-readme-243d324"


def _check(node: str, tflops: float, started_at: str, busbw: float | None = 150.0) -> NodeCheck:
    """A two-GPU node as its check records it (the second card's state unreported, with why)."""
    cards = [
        DeviceFigures(
            index=i, name="NVIDIA H100 80GB HBM3", matmul_tflops=tflops * (1 - 0.01 * i), matmul_size=8192, memory_gbps=2900.0,
            memory_bytes=1 << 30, repeats=9, spread=0.01,
            state=DeviceState(clock_mhz=1980.0, temperature_c=60.0, power_w=680.0) if i == 0 else DeviceState(reason="NVML did not answer"),
        )
        for i in range(2)
    ]  # fmt: skip
    allreduce = AllReduceFigure(ranks=2, size_bytes=1 << 28, backend="nccl", busbw_gbps=busbw, time_s=0.004) if busbw is not None else None
    return NodeCheck(
        schema_version=1, node=node, started_at=started_at, device_type="cuda", precision="bf16", cores=16, seconds=40.0, devices=cards,
        allreduce=allreduce, allreduce_reason=None if allreduce else "one rank on the node: no all-reduce within it",
    )  # fmt: skip


def _screen(node01_tflops: float, started_at: str) -> NodeScreen:
    checks = [_check("node01", node01_tflops, started_at), _check("node02", 700.0, started_at), _check("node03", 705.0, started_at, busbw=None)]
    link = LinkCheck(
        schema_version=1, node="node03", reference="node01", hostnames=["node01", "node03"], started_at=started_at, ranks=4,
        backend="nccl", size_bytes=1 << 28, busbw_gbps=48.0, time_s=0.01,
    )  # fmt: skip
    return node_screen.judge(checks, 0.9, "a slow node holds back every step", links=[link])


def _study(study_id: str, started_at: str) -> study_rows.StoredStudy:
    """A study row without runs: the store keys its node checks by the study, whatever it ran."""
    row: dict = dict.fromkeys(store_file.STUDY_COLUMNS)
    row.update(study_id=study_id, config_hash="ab" * 32, started_at=started_at, cluster="test", runs=0, runs_ok=0, appended_at=started_at)
    return study_rows.StoredStudy(row, [])


def test_two_studies_appended_with_the_same_node_come_back_oldest_first(tmp_path):
    """The screen of each is stored in the study's own append; the later study, appended first,
    still reads after the earlier one (ordered by the check's start, as instants)."""
    late, early = ("b-20261208", "2026-12-08T09:00:00+00:00"), ("a-20261120", "2026-11-20T10:00:00+01:00")
    with contextlib.closing(store_file.connect(tmp_path / "history.duckdb")) as connection:
        for (study_id, started), tflops in ((late, 520.0), (early, 700.0)):
            rows = store.node_check_rows(study_id, _screen(tflops, started))
            store.append(connection, _study(study_id, started), before_commit=lambda c, s=study_id, r=rows: store.replace_node_checks(c, s, r))
        node01 = store.node_history(connection, "node01")
        node03 = store.node_history(connection, "node03")
        assert store.node_history(connection, "node09").empty
    assert list(node01.columns) == list(store_file.NODE_CHECK_COLUMNS)
    assert list(zip(node01["study_id"], node01["device_index"])) == [("a-20261120", 0), ("a-20261120", 1), ("b-20261208", 0), ("b-20261208", 1)]
    assert list(node01["matmul_tflops"]) == pytest.approx([700.0, 693.0, 520.0, 514.8])
    # passed in the first study; excluded in the second, with the figure that did it and the fraction
    first, second = node01.iloc[0], node01.iloc[2]
    assert node01["excluded_because"].isna().tolist() == [True, True, False, False]
    assert str(second["excluded_because"]).startswith("matmul_tflops 515 TFLOP/s, 0.74 of the median") and second["fraction"] == 0.9
    assert (first["clock_mhz"], first["temperature_c"], first["power_w"], first["memory_gbps"], first["allreduce_busbw_gbps"]) == (
        1980.0,
        60.0,
        680.0,
        2900.0,
        150.0,
    )
    unreported = node01.iloc[1]  # the second card said nothing of its state: null, not zero
    assert node01.loc[1, ["clock_mhz", "temperature_c", "power_w"]].isna().all() and unreported["device_name"] == "NVIDIA H100 80GB HBM3"
    # one rank on node03: no all-reduce figure, a null
    assert node03["allreduce_busbw_gbps"].isna().all() and set(node03["device_name"]) == {"NVIDIA H100 80GB HBM3"}
    assert set(node03["link_busbw_gbps"]) == {48.0} and set(node03["link_reference"]) == {"node01"}


def test_a_store_of_schema_version_6_migrates_with_its_studies_and_gains_node_checks(tmp_path):
    history = tmp_path / "history.duckdb"
    with duckdb.connect(str(history)) as connection:  # a store as version 6 wrote it
        store_file.migrate(connection, 0, to=6)
        store.append(connection, _study("s-6", "2026-11-01T00:00:00+00:00"))
        before = connection.execute("SELECT * FROM studies").fetchall()
        assert "node_checks" not in {row[0] for row in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    with pytest.raises(store_file.StoreError, match="has schema version 6 .*migrate it with"):
        store_file.connect(history, read_only=True)
    migrated = subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.history.store", "migrate", "--store", str(history)],
        env=clean_env(PYTHONPATH=str(REPO / "workflow")), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    with contextlib.closing(store_file.connect(history, read_only=True)) as connection:
        assert store_file.schema_version(connection) == store_file.STORE_SCHEMA_VERSION == 7
        assert connection.execute("SELECT * FROM studies").fetchall() == before
        assert connection.execute("SELECT count(*) FROM node_checks").fetchone() == (0,)
        keys = connection.execute(
            "SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = 'node_checks' AND constraint_type = 'PRIMARY KEY'"
        )
        assert keys.fetchall() == [(["study_id", "node", "device_index"],)]


def _append(study: Path, store_path: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["--matrix", "results/tables/matrix.csv", "--config", "results/tables/config.json", "--inventory", "results/inventory/system.json"]
    return subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.history.store", "append", "--store", str(store_path), *args, "--receipt", "results/tables/store.json", *extra],
        cwd=study, env=clean_env(PYTHONPATH=str(REPO / "workflow")), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_append_with_the_prescreen_stores_its_rows_with_the_study_and_refuses_a_bad_screen_whole(tmp_path):
    """The README's study appended with its screen: the rows carry its id; the same screen again
    changes nothing; a rerun screen replaces the old one whole; a file that is no screen is one
    line naming it, and nothing of the study is stored."""
    study = tmp_path / "study"
    shutil.copytree(README_STUDY, study / "results")
    screen = study / "results/prescreen/screen.json"
    screen.parent.mkdir(parents=True)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fraction": 0.9, "medians": {}, "nodes": [{"node": "node01"}]}))
    refused = _append(study, tmp_path / "refused.duckdb", "--prescreen", str(bad))
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert str(bad) in refused.stderr and "not a prescreen screen" in refused.stderr and not (tmp_path / "refused.duckdb").exists()
    history = tmp_path / "history.duckdb"
    for tflops in (700.0, 700.0, 500.0):
        screen.write_text(json.dumps(_screen(tflops, "2026-12-08T08:00:00+00:00").model_dump(mode="json")))
        done = _append(study, history, "--prescreen", str(screen))
        assert done.returncode == 0, done.stderr
        receipt = json.loads((study / "results/tables/store.json").read_text())
        assert receipt["node_checks"] == 6
        with contextlib.closing(store_file.connect(history, read_only=True)) as connection:
            rows = connection.execute("SELECT study_id, node, device_index, matmul_tflops FROM node_checks ORDER BY node, device_index").fetchall()
        assert {row[0] for row in rows} == {receipt["study_id"]} and len(rows) == 6
        assert rows[0][1:] == ("node01", 0, tflops)
    plain = _append(study, history)  # the prescreen off: the study's stored screen is left as it was
    assert plain.returncode == 0, plain.stderr
    assert json.loads((study / "results/tables/store.json").read_text())["node_checks"] is None


def _bundle(path: Path, rows: dict) -> Path:
    """A bundle as far as import reads it: its rows and the manifest of their checksum."""
    data = json.dumps(rows).encode("utf-8")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(bundle.STUDY_ROWS, data)
        archive.writestr(bundle.MANIFEST, f"{hashlib.sha256(data).hexdigest()}  {bundle.STUDY_ROWS}\n")
    return path


def test_a_bundle_of_version_6_rows_imports_and_brings_no_node_checks(tmp_path):
    """Version 7 added a table bundles do not carry: a bundle written by version 6 holds the rows a
    version 7 store takes; one of a version not yet made is refused by name."""
    row = _study("s-6", "2026-11-01T00:00:00+00:00").row
    history = tmp_path / "history.duckdb"
    read, _ = bundle.import_bundle(_bundle(tmp_path / "v6.zip", {"schema_version": 6, "study": row, "runs": []}), history)
    assert read.study.row == row
    with contextlib.closing(store_file.connect(history, read_only=True)) as connection:
        assert store.load_study(connection, "s-6").row == row and connection.execute("SELECT count(*) FROM node_checks").fetchone() == (0,)
    with pytest.raises(bundle.BundleError, match="rows of store schema version 8, this scalerepro reads 7"):
        bundle.read_bundle(_bundle(tmp_path / "v8.zip", {"schema_version": 8, "study": row, "runs": []}))
