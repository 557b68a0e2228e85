"""The results store, the comparison of studies and bundles, on real DuckDB files and real runs.

Two CPU studies are measured once per session with the real trainer (tests/slowed_trainer.py):
the same two cells (the tiny CNN and a tiny GPT-2, one rank each), six repeats each, the runs of
the two studies interleaved so that load on the machine falls on both alike. In the second study
every training step of the CNN takes twice as long (a sleep injected by the test wrapper, never
by the trainer): its samples/s ratio to the first study is 0.5, the GPT-2's is 1.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from scalerepro.analysis.history import bundle, compare, store, store_file, study_rows
from scalerepro.analysis.presentation import report
from scalerepro.analysis.tables import aggregate

import analysis_fixtures
from conftest import REPO, clean_env, load_record

# Tests of two studies the real trainer ran (``studies``: 24 runs, timed) start training processes:
# the slow tier's, as pyproject.toml's marker says.
TRAINS = pytest.mark.slow
# The studies' runs are timed and their ratios asserted: nothing runs beside this file's tests.
pytestmark = pytest.mark.measures
REPEATS = 6
SLOWDOWN = 2.0  # the CNN's steps in the candidate study take this many times as long
COMMON = [
    "--data",
    "synthetic",
    "--steps",
    "30",
    "--warmup-steps",
    "6",
    "--synthetic-samples",
    "512",
    "--no-eval",
    "--loader",
    "device",
    "--comm-probe-steps",
    "0",
    "--bucket-probe-steps",
    "0",
    "--progress",
    "off",
    "--device",
    "cpu",
]

CELLS = {
    "cnn": (8, ["--model", "cnn", "--per-gpu-batch", "8"]),
    "gpt2_small": (
        8,
        [
            "--model",
            "gpt2_small",
            "--per-gpu-batch",
            "8",
            "--num-layers",
            "2",
            "--hidden-size",
            "64",
            "--num-heads",
            "2",
            "--seq-len",
            "32",
            "--vocab-size",
            "256",
        ],
    ),
}
CONFIG = {
    "study_name": "store-test",
    "device": "cpu",
    "steps": 30,
    "warmup_steps": 6,
    "models": {"cnn": {"per_gpu_batch": 8}, "gpt2_small": {"per_gpu_batch": 8}},
    "container": {
        "enabled": False,
        "base_image": "nvcr.io/nvidia/pytorch:25.01-py3",
        "sif": "results/containers/scalerepro.sif",
    },
    "store": {"path": "results/history.duckdb"},
    "compare": {"baseline": None, "threshold": 0.03},
}


def _env() -> dict[str, str]:
    return clean_env(PYTHONPATH=str(REPO / "workflow"))


def _python(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _study_dir(root: Path, config: dict) -> Path:
    results = root / "results"
    (results / "tables").mkdir(parents=True)
    (results / "inventory").mkdir(parents=True)
    (results / "tables" / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    rows = []
    for model, (batch, _) in CELLS.items():
        for repeat in range(1, REPEATS + 1):
            run_id = f"strong_{model}_g1_r{repeat}"
            rows.append(
                {
                    "run_id": run_id,
                    "study": "strong",
                    "model": model,
                    "gpus": 1,
                    "nodes": 1,
                    "gpus_per_node": 1,
                    "repeat": repeat,
                    "variant": "",
                    "precision": "fp32",
                    "per_gpu_batch": batch,
                    "global_batch": batch,
                    "bucket_cap_mb": 25.0,
                    "runtime_min": 10,
                    "record": f"results/runs/{run_id}/record.json",
                    "rerun": f"snakemake --cores all --forcerun results/runs/{run_id}/record.json",
                }
            )
    with open(results / "tables" / "matrix.csv", "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root


@pytest.fixture(scope="session")
def studies(tmp_path_factory) -> dict[str, Path]:
    """The baseline and the candidate study directories (the layout the workflow writes)."""
    root = tmp_path_factory.mktemp("studies")
    dirs = {name: _study_dir(root / name, CONFIG) for name in ("baseline", "candidate")}
    inventory = _python("-m", "scalerepro.telemetry.inventory", "--out", str(dirs["baseline"] / "results/inventory/system.json"))
    assert inventory.returncode == 0, inventory.stderr
    shutil.copy(dirs["baseline"] / "results/inventory/system.json", dirs["candidate"] / "results/inventory/system.json")
    plan = []
    for repeat in range(1, REPEATS + 1):
        for model, (_, flags) in CELLS.items():
            # ABBA order: neither study always runs first after the other model
            for name, directory in sorted(dirs.items(), reverse=repeat % 2 == 0):
                run_id = f"strong_{model}_g1_r{repeat}"
                record = directory / f"results/runs/{run_id}/record.json"
                args = [*flags, *COMMON, "--seed", str(repeat), "--run-id", run_id, "--record", str(record)]
                plan.append({"args": args, "slowdown": {"cnn": SLOWDOWN} if name == "candidate" else {}})
    (root / "plan.json").write_text(json.dumps(plan))
    started = time.monotonic()
    runs = _python(str(REPO / "tests/slowed_trainer.py"), str(root / "plan.json"), timeout=300)
    assert runs.returncode == 0, runs.stdout[-2000:] + runs.stderr[-3000:]
    print(f"\n{len(plan)} trainer runs in {time.monotonic() - started:.1f} s")
    for directory in dirs.values():
        for path in (directory / "results/runs").glob("*/record.json"):
            assert load_record(path)["status"] == "ok"
    return dirs


def append(study_dir: Path, store_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return _python(
        "-m",
        "scalerepro.analysis.history.store",
        "append",
        "--store",
        str(store_path),
        "--matrix",
        "results/tables/matrix.csv",
        "--config",
        "results/tables/config.json",
        "--inventory",
        "results/inventory/system.json",
        "--receipt",
        "results/tables/store.json",
        "--history",
        "results/tables/history.csv",
        *extra,
        cwd=study_dir,
    )


def _appended(study_dir: Path, store_path: Path) -> dict:
    done = append(study_dir, store_path)
    assert done.returncode == 0, done.stderr
    return json.loads((study_dir / "results/tables/store.json").read_text())


def _dump(store_path: Path) -> dict[str, list]:
    """Every row of the store's tables, for before/after comparisons."""
    with duckdb.connect(str(store_path), read_only=True) as connection:
        return {table: sorted(map(repr, connection.execute(f"SELECT * FROM {table}").fetchall())) for table in ("store_meta", "studies", "runs", "imports")}


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


@TRAINS
def test_a_study_appended_twice_is_stored_once(studies, tmp_path):
    history = tmp_path / "history.duckdb"
    first = _appended(studies["baseline"], history)
    before = _dump(history)
    second = _appended(studies["baseline"], history)
    assert first["new_study"] and first["runs_added"] == 2 * REPEATS
    assert not second["new_study"] and (second["runs_added"], second["runs_replaced"], second["runs_unchanged"]) == (
        0,
        0,
        2 * REPEATS,
    )
    assert _dump(history) == before and len(before["studies"]) == 1 and len(before["runs"]) == 2 * REPEATS
    with duckdb.connect(str(history), read_only=True) as connection:
        row = connection.execute("SELECT study_id, config_hash, git_commit, cluster, node_list, runs, runs_ok FROM studies").fetchone()
        records = connection.execute("SELECT run_id, record, json_extract_string(record, '$.knobs.loader') FROM runs").fetchall()
    study_id, digest, commit, cluster, nodes, runs, runs_ok = row
    assert study_id == first["study_id"] and study_id.startswith(digest[:12] + "-") and (runs, runs_ok) == (12, 12)
    inventory = json.loads((studies["baseline"] / "results/inventory/system.json").read_text())
    assert cluster == inventory["hostname"] and nodes == inventory["hostname"] and len(commit) == 40
    for run_id, text, loader in records:  # the record exactly as the trainer wrote it, and queryable
        assert text == (studies["baseline"] / f"results/runs/{run_id}/record.json").read_text() and loader == "device"


@TRAINS
def test_two_processes_appending_at_once_both_land(studies, tmp_path):
    history = tmp_path / "history.duckdb"
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scalerepro.analysis.history.store",
                "append",
                "--store",
                str(history),
                "--matrix",
                "results/tables/matrix.csv",
                "--config",
                "results/tables/config.json",
                "--inventory",
                "results/inventory/system.json",
            ],
            cwd=directory,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for directory in studies.values()
    ]
    outputs = [writer.communicate(timeout=120) for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], outputs
    with duckdb.connect(str(history), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM studies").fetchone()[0] == 2
        assert connection.execute("SELECT count(*) FROM runs").fetchone()[0] == 4 * REPEATS


def _hold_lock(history: Path, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(history)!r}); print('held', flush=True); time.sleep({seconds})"],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


@TRAINS
def test_a_writer_waits_for_the_lock_and_lands_or_gives_up_with_one_line(studies, tmp_path):
    history = tmp_path / "history.duckdb"
    _appended(studies["baseline"], history)
    holder = _hold_lock(history, 2.0)
    waited = append(studies["candidate"], history)
    holder.wait()
    assert waited.returncode == 0, waited.stderr
    assert f"is locked by process {holder.pid}" in waited.stderr and "waiting up to 60 s" in waited.stderr
    before = _dump(history)

    holder = _hold_lock(history, 6.0)
    try:
        refused = append(studies["candidate"], history, "--lock-timeout", "1")
    finally:
        holder.kill()
        holder.wait()
    lines = refused.stderr.strip().splitlines()
    assert (
        refused.returncode == 2
        and lines[-1].startswith("scalerepro.analysis.history.store: error: the results store")
        and f"locked by process {holder.pid} (" in lines[-1]
    )
    assert lines[-1].endswith("for 1 s: let it finish (or stop it) and run again, or raise --lock-timeout")
    assert len(lines) == 2  # the waiting line and the error, nothing else
    assert _dump(history) == before


@TRAINS
def test_a_store_of_schema_version_1_is_migrated_with_its_studies(studies, tmp_path):
    history = tmp_path / "history.duckdb"
    cwd = os.getcwd()
    os.chdir(studies["baseline"])  # the matrix's record paths are relative to the study directory
    try:
        baseline = study_rows.read_study("results/tables/matrix.csv", "results/tables/config.json", "results/inventory/system.json")
    finally:
        os.chdir(cwd)
    with duckdb.connect(str(history)) as connection:  # a store as version 1 wrote it: its tables and column names
        store_file.migrate(connection, 0)
        store.append(connection, baseline)
        for new, old in store_file.RENAMED_RUN_COLUMNS.items():
            connection.execute(f'ALTER TABLE runs RENAME COLUMN "{new}" TO "{old}"')
        for added in store_file.ADDED_RUN_COLUMNS:
            connection.execute(f'ALTER TABLE runs DROP COLUMN "{added}"')
        connection.execute("DROP TABLE imports")
        connection.execute("DROP TABLE node_checks")  # version 7's
        connection.execute("UPDATE store_meta SET value = '1' WHERE key = 'schema_version'")
        assert {"per_rank_batch", "slurm_job_id"} <= {row[0] for row in connection.execute("DESCRIBE runs").fetchall()}
        old_rows = connection.execute("SELECT * FROM runs ORDER BY run_id").fetchall()
        old_study = connection.execute("SELECT * FROM studies").fetchall()
    refused = _python("-m", "scalerepro.analysis.history.compare", "latest", baseline.study_id, "--store", str(history))
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"scalerepro.analysis.history.compare: error: the results store {history} has schema version 1 (current: {store_file.STORE_SCHEMA_VERSION}): "
        f"migrate it with `python -m scalerepro.analysis.history.store migrate --store {history}`"
    ]
    receipt = _appended(studies["candidate"], history)  # a writable open migrates
    with duckdb.connect(str(history), read_only=True) as connection:
        assert store_file.schema_version(connection) == store_file.STORE_SCHEMA_VERSION == 7
        assert connection.execute("SELECT * FROM studies WHERE study_id = ?", [baseline.study_id]).fetchall() == old_study
        # version 1's rows as they were, each run its own (record_of "", the column version 5 added) and its
        # cell its run id less its repeat (version 6's column)
        stored = connection.execute("SELECT * FROM runs WHERE study_id = ? ORDER BY run_id", [baseline.study_id]).fetchall()
        assert stored == [(*row, "", re.sub(r"_r[0-9]+$", "", row[1])) for row in old_rows]
        assert {row[-1] for row in stored} == {"strong_cnn_g1", "strong_gpt2_small_g1"}
        assert connection.execute("SELECT count(*) FROM imports").fetchone() == (0,)
        assert connection.execute("SELECT count(*) FROM node_checks").fetchone() == (0,)
    assert receipt["new_study"] and receipt["studies_in_store"] == 2


def _sql(*statements: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with duckdb.connect(str(path)) as connection:
            for statement in statements:
                connection.execute(statement)

    return damage


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# A damaged or foreign store: (case, how it is damaged, what the one line says). Each is opened by
# every command that reads or writes a store; a new case is one line.
DAMAGED_STORES = [
    ("truncated", _truncated, "is damaged (IO Error: Could not read enough bytes"),
    ("random-bytes", lambda path: path.write_bytes(np.random.default_rng(0).bytes(64 << 10)), "is damaged (IO Error: The file"),
    ("empty-file", lambda path: path.write_bytes(b""), "is damaged"),
    ("table-dropped", _sql("DROP TABLE runs"), "is damaged (it lacks table runs)"),
    ("column-dropped", _sql("ALTER TABLE studies DROP COLUMN git_commit"), "is damaged (it lacks studies column git_commit VARCHAR)"),
    ("column-retyped", _sql("ALTER TABLE runs ALTER gpus TYPE VARCHAR"), "it lacks runs column gpus INTEGER"),
    ("version-not-a-number", _sql("UPDATE store_meta SET value = 'three' WHERE key = 'schema_version'"), "its schema_version is 'three', not a number"),
    ("version-newer", _sql("UPDATE store_meta SET value = '99' WHERE key = 'schema_version'"), "schema version 99, newer than this scalerepro understands"),
    ("foreign", _sql("DROP TABLE store_meta"), "is not a scalerepro results store"),
]


def _commands(history: Path, exported: dict[str, Path]) -> dict[str, tuple]:
    """Every command that opens a store, as argv for its main; run from a study's directory
    (its matrix names the records relative to it)."""
    return {
        "store list": (store.main, ["list", "--store", str(history)]),
        "store append": (
            store.main,
            [
                "append",
                "--store",
                str(history),
                "--matrix",
                "results/tables/matrix.csv",
                "--config",
                "results/tables/config.json",
                "--inventory",
                "results/inventory/system.json",
            ],
        ),
        "store migrate": (store.main, ["migrate", "--store", str(history)]),
        "compare": (compare.main, ["latest", "latest", "--store", str(history)]),
        "bundle import": (bundle.main, ["import", str(exported["bundle"]), "--store", str(history)]),
    }


@TRAINS
@pytest.mark.parametrize("case", DAMAGED_STORES, ids=[case[0] for case in DAMAGED_STORES])
def test_a_damaged_or_foreign_store_is_one_line_for_every_command_and_is_left_as_it_was(studies, exported, tmp_path, capsys, monkeypatch, case):
    """Each of these was a DuckDB or pandas traceback (or, for a dropped table, an empty listing)."""
    name, damage, expected = case
    history = tmp_path / "history.duckdb"
    shutil.copy(exported["store"], history)  # both studies
    damage(history)
    before = history.read_bytes()
    monkeypatch.chdir(studies["candidate"])
    for command, (main, argv) in _commands(history, exported).items():
        code = main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and expected in lines[0] and ": error: " in lines[0], (command, lines)
        assert history.read_bytes() == before, command  # refused, not repaired or half-written
    with pytest.raises(store_file.StoreError, match=re.escape(expected)):  # --debug: the traceback, for a bug report
        store.main(["list", "--store", str(history), "--debug"])


def _immutable_directory(directory: Path) -> contextlib.AbstractContextManager:
    """A directory no process may add a file to, root included (chattr +i; chmod for others)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return contextlib.nullcontext()
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: no way to make a directory read-only")

    @contextlib.contextmanager
    def immutable():
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)

    return immutable()


@TRAINS
def test_a_store_in_a_read_only_directory_names_the_cause_and_stores_nothing(exported, tmp_path, capsys):
    """DuckDB cannot create its .wal beside the store; the error was hidden behind the ROLLBACK's
    "cannot rollback - no transaction is active" traceback."""
    directory = tmp_path / "shared"
    directory.mkdir()
    history = directory / "history.duckdb"
    with duckdb.connect(str(history)) as connection:  # a store without the bundle's study: the import must write
        store_file.migrate(connection, 0)
    before = _dump(history)
    extract = tmp_path / "unpacked"
    with _immutable_directory(directory):
        code = bundle.main(["import", str(exported["bundle"]), "--store", str(history), "--extract", str(extract)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert f"cannot write the results store {history}" in lines[0] and "make its directory writable" in lines[0]
    assert _dump(history) == before and not extract.exists()  # neither the import row nor the files


@TRAINS
def test_full_disk_paths_are_one_line_and_keep_what_was_there(studies, exported, tmp_path):
    """A full file system, as the kernel reports it to the writer (a file-size limit: EFBIG on
    the first block written), for every command that writes a file. Each was a traceback."""
    kept = tmp_path / "kept.csv"
    kept.write_text("the previous table\n")
    results = tmp_path / "study" / "results"
    shutil.copytree(exported["study"] / "results", results)  # with every output (``exported`` made them)
    writers = {
        "compare --csv": ["-m", "scalerepro.analysis.history.compare", "latest", "latest", "--store", str(exported["store"]), "--csv", str(kept)],
        "bundle export": [
            "-m",
            "scalerepro.analysis.history.bundle",
            "export",
            "--results",
            str(results),
            "--store",
            str(exported["store"]),
            "--workflow",
            str(REPO),
            "--out",
            str(tmp_path / "b.zip"),
        ],
        "aggregate": [
            "-m",
            "scalerepro.analysis.tables.aggregate",
            "--matrix",
            str(results / "tables/matrix.csv"),
            "--references",
            str(REPO / "config/references.yaml"),
            "--out",
            str(tmp_path / "tables"),
        ],
        "rebuild": [
            "-m",
            "scalerepro.analysis.rebuild",
            "--results",
            str(results),
            "--references",
            str(REPO / "config/references.yaml"),
            "--templates",
            str(REPO / "report"),
        ],
    }
    file_size_limit = "the file size limit was reached (ulimit -f, or the file system's): raise it or write elsewhere"
    expected = {
        "compare --csv": file_size_limit,
        "aggregate": file_size_limit,
        "rebuild": file_size_limit,
        # Python's tempfile finds no directory it can write a byte to
        "bundle export": "No usable temporary directory found in",
    }
    for name, argv in writers.items():
        result = subprocess.run(
            [sys.executable, *argv],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=lambda: (resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)),
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and "Traceback" not in result.stderr, (name, result.stderr[-2000:])
        assert ": error: " in lines[-1] and expected[name] in lines[-1], (name, lines)
    assert kept.read_text() == "the previous table\n"  # the old table stays whole
    assert not (tmp_path / "b.zip").exists() and not list(tmp_path.glob(".b.zip.*"))


@TRAINS
def test_numeric_options_and_output_paths_are_bounded_in_one_line(exported, tmp_path, capsys):
    """--resamples 0 was an IndexError traceback, --seed -1 a numpy one, a huge --resamples took
    the machine's memory, an output path that is a directory failed after the work."""
    for flags, expected in (
        (["--resamples", "0"], "argument --resamples: 0 is outside [100, 1000000]"),
        (["--resamples", "10000000000"], "argument --resamples: 10000000000 is outside [100, 1000000]"),
        (["--seed", "-1"], "argument --seed: -1 is outside [0, 4294967295]"),
        (["--threshold", "nan"], "argument --threshold: nan is outside [0, 1)"),
        (["--lock-timeout", "-5"], "argument --lock-timeout: -5 is outside [0, 86400]"),
        (["--csv", str(tmp_path)], f"argument --csv: {tmp_path} is a directory: name a file"),
    ):
        with pytest.raises(SystemExit) as exited:
            compare.main(["latest", "latest", "--store", str(exported["store"]), *flags])
        lines = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and len(lines) == 1 and expected in lines[0], (flags, lines)
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps({"study_id": ["a", "b"]}))
    assert compare.main([str(receipt), "latest", "--store", str(exported["store"])]) == 2
    assert "is not a store receipt (its study_id is not a study id)" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Comparing studies
# --------------------------------------------------------------------------------------------


def test_bootstrap_is_seeded_and_the_verdicts_follow_the_interval_and_threshold():
    rng = np.random.default_rng(3)
    base = 100 * np.exp(rng.normal(0, 0.02, 8))
    slow = 50 * np.exp(rng.normal(0, 0.02, 8))
    first = compare.bootstrap_ratio(base, slow, np.random.default_rng(0))
    assert first == compare.bootstrap_ratio(base, slow, np.random.default_rng(0))  # seeded: the same interval
    ratio, low, high = first
    assert ratio == pytest.approx(np.median(slow) / np.median(base)) and low < 0.5 < high and high < 0.6
    assert compare.verdict(ratio, low, high, 0.03) == "slower"
    assert compare.verdict(1 / ratio, 1 / high, 1 / low, 0.03) == "faster"
    assert compare.verdict(0.98, 0.97, 0.99, 0.03) == "no significant change"  # significant, but within 3 %
    assert compare.verdict(0.90, 0.80, 1.01, 0.03) == "no significant change"  # large, but the interval holds 1


def test_environment_and_config_differences_are_named():
    base = {"driver": "535.104.05", "NCCL": "2.21.5", "commit": "3d7490190062"}
    cand = {"driver": "550.54.15", "NCCL": "2.21.5", "commit": "42cbece3e9d1 (dirty)"}
    assert compare.fact_differences(base, cand) == [
        "driver: 535.104.05 → 550.54.15",
        "commit: 3d7490190062 → 42cbece3e9d1 (dirty)",
    ]
    a = {"steps": 200, "models": {"cnn": {"per_gpu_batch": 16}}, "compare": {"baseline": None}}
    b = {"steps": 100, "models": {"cnn": {"per_gpu_batch": 16}}, "compare": {"baseline": "latest"}}
    assert compare.config_differences(a, b) == ["steps: 200 → 100"]


@TRAINS
def test_the_slowed_model_and_only_it_is_flagged_slower_with_its_factor_inside_the_interval(studies, tmp_path):
    """A 95 % interval misses the true ratio 5 % of the time by construction, and these CPU runs
    vary by up to ±20 % on a shared machine; so this test asks for a 99.9 % interval and a 20 %
    threshold, which a correct comparison fails with a probability below 0.5 % (simulated with
    ±8 % log-normal noise, six repeats a side). The defaults are printed as figures."""
    history = tmp_path / "history.duckdb"
    baseline = _appended(studies["baseline"], history)["study_id"]
    candidate = _appended(studies["candidate"], history)["study_id"]
    out = tmp_path / "versus.csv"
    facts = tmp_path / "versus.json"
    result = _python(
        "-m",
        "scalerepro.analysis.history.compare",
        baseline,
        "latest",
        "--store",
        str(history),
        "--confidence",
        "0.999",
        "--threshold",
        "0.2",
        "--csv",
        str(out),
        "--json",
        str(facts),
    )
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out).set_index("model")
    print("\n" + result.stdout)
    cnn, gpt = table.loc["cnn"], table.loc["gpt2_small"]
    assert (cnn.baseline_repeats, cnn.candidate_repeats) == (REPEATS, REPEATS)
    # The wrapper stretches each step by the factor as it times the step; the trainer's samples/s spans the whole
    # loop, and on 2 shared cores the spinning thread also slows the step's other threads, so the realised
    # factor is the nominal one within a few percent (2.13 was seen in CI), not exactly: the interval must meet
    # a +-10 % band around it, far from 1 and from the no-change verdict.
    band = (1 / SLOWDOWN / 1.1, 1 / SLOWDOWN * 1.1)
    assert cnn.verdict == "slower" and cnn.ratio_low <= band[1] and cnn.ratio_high >= band[0], cnn.to_dict()
    assert gpt.verdict == "no significant change" and gpt.ratio_low <= 1 <= gpt.ratio_high, gpt.to_dict()
    assert table.differs.isna().all()  # one machine, one commit, one container: nothing differs
    summary = json.loads(facts.read_text())
    assert summary["baseline"]["study_id"] == baseline and summary["candidate"]["study_id"] == candidate
    assert summary["environment_differences"] == [] and summary["config_differences"] == []
    assert summary["verdicts"]["slower"] == 1 and summary["confidence"] == 0.999

    defaults = _python("-m", "scalerepro.analysis.history.compare", "latest", candidate, "--store", str(history), "--fail-on-slower")
    assert defaults.returncode == 1, defaults.stderr  # the CNN is slower at the defaults too: a CI gate fails
    print(defaults.stdout)


@TRAINS
def test_selectors_name_the_study_or_say_in_one_line_why_not(studies, tmp_path):
    history = tmp_path / "history.duckdb"
    baseline = _appended(studies["baseline"], history)
    candidate = _appended(studies["candidate"], history)
    with duckdb.connect(str(history), read_only=True) as connection:
        cluster, commit = connection.execute("SELECT cluster, git_commit FROM studies LIMIT 1").fetchone()
    # a commit, a cluster, a receipt: each the latest matching study other than the other side
    for selector in (commit[:7], cluster, str(studies["baseline"] / "results/tables/store.json")):
        facts = tmp_path / "facts.json"
        result = _python("-m", "scalerepro.analysis.history.compare", selector, "latest", "--store", str(history), "--json", str(facts))
        assert result.returncode == 0, (selector, result.stderr)
        chosen = json.loads(facts.read_text())
        assert (chosen["baseline"]["study_id"], chosen["candidate"]["study_id"]) == (baseline["study_id"], candidate["study_id"])
    prefix = candidate["study_id"][:13]
    for selector, expected in (
        ("nosuchcluster", "no study in the store matches 'nosuchcluster'"),
        (f"{cluster}:nosuchpartition", f"no study in the store matches '{cluster}:nosuchpartition'"),
        (prefix, f"'{prefix}' is the start of 2 study ids"),
    ):
        result = _python("-m", "scalerepro.analysis.history.compare", selector, "latest", "--store", str(history))
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr, result.stderr
    only = tmp_path / "only.duckdb"
    _appended(studies["baseline"], only)
    alone = _python("-m", "scalerepro.analysis.history.compare", "latest", "latest", "--store", str(only))
    assert alone.returncode == 2 and "'latest': the store has no study other than" in alone.stderr, alone.stderr
    missing = _python("-m", "scalerepro.analysis.history.compare", "a", "b", "--store", str(tmp_path / "none.duckdb"))
    assert missing.returncode == 2 and "no results store at" in missing.stderr and not (tmp_path / "none.duckdb").exists()


@TRAINS
def test_a_cluster_named_with_a_colon_is_selected_alone_or_with_its_partition(studies, tmp_path):
    """CLUSTER:PARTITION split at the first colon, so "site:a" could never be selected."""
    history = tmp_path / "history.duckdb"
    baseline = _appended(studies["baseline"], history)["study_id"]
    _appended(studies["candidate"], history)
    with duckdb.connect(str(history)) as connection:
        connection.execute("UPDATE studies SET cluster = 'site:a', \"partition\" = 'gpu' WHERE study_id = ?", [baseline])
        assert store.resolve(connection, "site:a") == baseline
        assert store.resolve(connection, "site:a:gpu") == baseline
        with pytest.raises(store_file.StoreError, match="no study in the store matches 'site:a:cpu'"):
            store.resolve(connection, "site:a:cpu")


def test_a_record_that_ran_another_batch_than_its_plan_is_stored_as_it_ran_and_named(tmp_path):
    """The record is the truth: a run whose record says it ran another per-GPU batch than the matrix
    planned is stored with the batch it ran, not consistent and so not counted, and the aggregation
    names it (summary.json's inconsistent_runs), as it names a run of another world size."""
    results = tmp_path / "study" / "results"
    planned = analysis_fixtures.Study(results / "runs")
    as_planned = planned.add("strong", 1, 1, per_gpu_batch=32)
    other_batch = planned.add("strong", 1, 2, per_gpu_batch=32, record=analysis_fixtures.make_record("strong_resnet50_g1_r2", per_gpu_batch=64))
    (results / "tables").mkdir()
    (results / "inventory").mkdir()
    planned.write_matrix().rename(results / "tables" / "matrix.csv")
    (results / "tables" / "config.json").write_text(json.dumps({"study_name": "batch-test"}))
    (results / "inventory" / "system.json").write_text(json.dumps({"hostname": "test-host"}))
    history = tmp_path / "history.duckdb"
    receipt = _appended(tmp_path / "study", history)
    with duckdb.connect(str(history), read_only=True) as connection:
        stored = connection.execute("SELECT run_id, per_gpu_batch, consistent, counts FROM runs ORDER BY run_id").fetchall()
        runs_ok = connection.execute("SELECT runs_ok FROM studies").fetchone()[0]
    assert receipt["runs_added"] == 2 and runs_ok == 1
    assert stored == [(as_planned, 32, True, True), (other_batch, 64, False, False)]
    (results / "references.yaml").write_text("references: []\n")
    tables = aggregate.aggregate(results / "tables" / "matrix.csv", [], results / "references.yaml", {})
    assert aggregate.summarise(tables)["inconsistent_runs"] == [other_batch]


def test_migrate_at_a_mistyped_path_creates_no_store(tmp_path):
    result = _python("-m", "scalerepro.analysis.history.store", "migrate", "--store", str(tmp_path / "histroy.duckdb"))
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"scalerepro.analysis.history.store: error: no results store at {tmp_path / 'histroy.duckdb'}: nothing to migrate (check the path)"
    ]
    assert not (tmp_path / "histroy.duckdb").exists()


# --------------------------------------------------------------------------------------------
# Bundles
# --------------------------------------------------------------------------------------------


def test_version_3_imports_are_kept_and_a_bundle_imported_again_adds_a_row(tmp_path):
    history = tmp_path / "history.duckdb"
    with duckdb.connect(str(history)) as connection:  # a store as version 3 wrote it: one row per bundle
        store_file.migrate(connection, 0, to=3)
        connection.execute("INSERT INTO imports VALUES ('ab' , 's1', 'a.zip', '2026-01-01T00:00:00.000+00:00')")
    connection = store_file.connect(history)  # a writable open migrates
    try:
        connection.execute("INSERT INTO imports VALUES ('ab', 's1', 'b.zip', '2026-02-01T00:00:00.000+00:00')")
        assert connection.execute("SELECT path FROM imports ORDER BY imported_at").fetchall() == [("a.zip",), ("b.zip",)]
        assert store_file.schema_version(connection) == store_file.STORE_SCHEMA_VERSION
    finally:
        connection.close()


@pytest.fixture(scope="session")
def exported(studies, tmp_path_factory) -> dict[str, Path]:
    """A store with both studies, and the candidate's bundle, exported from a copy of the
    candidate study that no other test writes to (``study``: tests that append a study rewrite
    its receipt)."""
    root = tmp_path_factory.mktemp("bundle")
    history = root / "history.duckdb"
    study = root / "candidate"
    shutil.copytree(studies["candidate"], study)
    for directory in (studies["baseline"], study):
        _appended(directory, history)
    # the outputs a study's workflow writes (tables, figures, report): export refuses a study without them
    rebuilt = _python(
        "-m",
        "scalerepro.analysis.rebuild",
        "--results",
        "results",
        "--references",
        str(REPO / "config/references.yaml"),
        "--templates",
        str(REPO / "report"),
        cwd=study,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    out = root / "candidate.zip"
    result = _python("-m", "scalerepro.analysis.history.bundle", "export", "--out", str(out), "--store", str(history), "--workflow", str(REPO), cwd=study)
    assert result.returncode == 0, result.stderr
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    assert f"sha256 {digest}" in result.stdout and (root / "candidate.zip.sha256").read_text().startswith(digest)
    return {"store": history, "bundle": out, "root": root, "study": study}


@TRAINS
def test_a_bundle_against_latest_is_compared_with_the_newest_other_study(studies, exported, tmp_path):
    """`compare BUNDLE latest` said "same study" when the bundle's study was the newest stored."""
    facts = tmp_path / "facts.json"
    result = _python("-m", "scalerepro.analysis.history.compare", str(exported["bundle"]), "latest", "--store", str(exported["store"]), "--json", str(facts))
    assert result.returncode == 0, result.stderr
    chosen = json.loads(facts.read_text())
    baseline_id = json.loads((studies["baseline"] / "results/tables/store.json").read_text())["study_id"]
    candidate_id = json.loads((exported["study"] / "results/tables/store.json").read_text())["study_id"]
    assert (chosen["baseline"]["study_id"], chosen["candidate"]["study_id"]) == (candidate_id, baseline_id)


@TRAINS
def test_export_refuses_a_study_with_an_output_missing(studies, exported, tmp_path):
    """After a killed step, a full disk or a hand, export shipped what was left (4 of 17 tables)."""
    study = tmp_path / "study"
    shutil.copytree(exported["study"], study)
    (study / "results/tables/cost.csv").unlink()
    out = tmp_path / "out.zip"
    result = _python(
        "-m", "scalerepro.analysis.history.bundle", "export", "--out", str(out), "--store", str(exported["store"]), "--workflow", str(REPO), cwd=study
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "lacks 1 of the study's outputs (tables/cost.csv)" in lines[0], result.stderr
    assert not out.exists()


@TRAINS
def test_export_packs_no_file_from_outside_the_study(studies, exported, tmp_path):
    """A symbolic link in results/ was followed: export packed the file it pointed to."""
    study = tmp_path / "study"
    shutil.copytree(exported["study"], study)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the study's\n")
    (study / "results/tables/planted.csv").symlink_to(secret)
    out = tmp_path / "out.zip"
    result = _python(
        "-m", "scalerepro.analysis.history.bundle", "export", "--out", str(out), "--store", str(exported["store"]), "--workflow", str(REPO), cwd=study
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "results/tables/planted.csv is a symbolic link" in lines[0], result.stderr
    assert not out.exists() and not Path(f"{out}.sha256").exists()


@TRAINS
def test_export_then_import_round_trips_exactly(studies, exported, tmp_path):
    other = tmp_path / "other.duckdb"
    unpacked = tmp_path / "unpacked"
    digest = hashlib.sha256(exported["bundle"].read_bytes()).hexdigest()
    result = _python(
        "-m",
        "scalerepro.analysis.history.bundle",
        "import",
        str(exported["bundle"]),
        "--store",
        str(other),
        "--expect-sha256",
        digest,
        "--extract",
        str(unpacked),
    )
    assert result.returncode == 0, result.stderr
    study_id = json.loads((exported["study"] / "results/tables/store.json").read_text())["study_id"]
    with duckdb.connect(str(exported["store"]), read_only=True) as a, duckdb.connect(str(other), read_only=True) as b:
        assert store.load_study(a, study_id) == store.load_study(b, study_id)  # every column of every row
        assert b.execute("SELECT bundle_sha256, study_id FROM imports").fetchall() == [(digest, study_id)]
    for path in (exported["study"] / "results").rglob("*"):
        if path.is_file():  # every file the study wrote is in the bundle, byte for byte
            assert (unpacked / "results" / path.relative_to(exported["study"] / "results")).read_bytes() == path.read_bytes()
    checked = subprocess.run(["sha256sum", "--check", "--quiet", bundle.MANIFEST], cwd=unpacked, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    again = _python("-m", "scalerepro.analysis.history.bundle", "import", str(exported["bundle"]), "--store", str(other))
    assert again.returncode == 0 and "already in the store, unchanged" in again.stdout
    with duckdb.connect(str(other), read_only=True) as b:  # every import is kept (version 2 kept the last only)
        imports = b.execute("SELECT bundle_sha256, study_id, imported_at FROM imports ORDER BY imported_at").fetchall()
    assert [row[:2] for row in imports] == [(digest, study_id)] * 2 and imports[0][2] < imports[1][2]

    crate = json.loads((unpacked / "ro-crate-metadata.json").read_text())
    graph = {entity["@id"]: entity for entity in crate["@graph"]}
    root = graph["./"]
    profiles = {ref["@id"] for ref in root["conformsTo"]}
    assert {"https://w3id.org/ro/wfrun/process/0.5", "https://w3id.org/ro/wfrun/workflow/0.5"} <= profiles
    assert root["mainEntity"] == {"@id": "Snakefile"} and "ComputationalWorkflow" in graph["Snakefile"]["@type"]
    action = graph[root["mentions"][0]["@id"]]
    assert action["@type"] == "CreateAction" and action["instrument"] == {"@id": "Snakefile"}
    assert action["object"] == [{"@id": "results/tables/config.json"}] or action["object"] == {"@id": "results/tables/config.json"}
    results = {ref["@id"] for ref in action["result"]}
    assert "results/runs/strong_cnn_g1_r1/record.json" in results and "results/tables/matrix.csv" in results
    commands = (unpacked / "commands.sh").read_text()
    assert "python -m scalerepro.training.train --model cnn --per-gpu-batch 8" in commands.replace(sys.executable, "python")


@TRAINS
def test_a_bundle_can_be_compared_without_importing_it(studies, exported, tmp_path):
    baseline = json.loads((studies["baseline"] / "results/tables/store.json").read_text())["study_id"]
    from_store = _python(
        "-m",
        "scalerepro.analysis.history.compare",
        baseline,
        "latest",
        "--store",
        str(exported["store"]),
        "--csv",
        str(tmp_path / "a.csv"),
    )
    from_bundle = _python(
        "-m", "scalerepro.analysis.history.compare", baseline, str(exported["bundle"]), "--store", str(exported["store"]), "--csv", str(tmp_path / "b.csv")
    )
    assert from_store.returncode == from_bundle.returncode == 0, from_bundle.stderr
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


def _rewritten(source: Path, target: Path, change) -> Path:
    """A copy of the bundle with its entries passed through ``change(name, data)`` (None drops one)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
        for info in original.infolist():
            data = change(info.filename, original.read(info.filename))
            if data is not None:
                copy.writestr(info.filename, data)
    return target


@TRAINS
def test_a_tampered_or_truncated_bundle_is_refused_and_the_store_is_unchanged(studies, exported, tmp_path):
    record = "results/runs/strong_cnn_g1_r1/record.json"
    cases = {
        "tampered": (
            _rewritten(
                exported["bundle"],
                tmp_path / "tampered.zip",
                lambda name, data: data.replace(b'"samples_per_s": ', b'"samples_per_s": 1') if name == record else data,
            ),
            f"{record} does not match its checksum",
        ),
        "truncated": (tmp_path / "truncated.zip", "is not a complete zip archive"),
        "missing file": (
            _rewritten(exported["bundle"], tmp_path / "missing.zip", lambda name, data: None if name == record else data),
            f"lacks files its manifest lists (e.g. {record})",
        ),
        "extra file": (
            _rewritten(exported["bundle"], tmp_path / "extra.zip", lambda name, data: data),
            "holds files its manifest does not list",
        ),
        "another bundle": (exported["bundle"], "not the expected"),
    }
    data = exported["bundle"].read_bytes()
    cases["truncated"][0].write_bytes(data[: len(data) // 2])
    with zipfile.ZipFile(cases["extra file"][0], "a") as archive:
        archive.writestr("results/tables/planted.csv", "a,b\n1,2\n")
    history = tmp_path / "history.duckdb"
    _appended(studies["baseline"], history)  # a store with a study in it already
    before, before_bytes = _dump(history), history.read_bytes()
    for name, (path, expected) in cases.items():
        extra = ["--expect-sha256", "0" * 64] if name == "another bundle" else []
        unpack = ["--extract", str(tmp_path / name)] if name in ("tampered", "truncated") else []
        result = _python("-m", "scalerepro.analysis.history.bundle", "import", str(path), "--store", str(history), *unpack, *extra)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("scalerepro.analysis.history.bundle: error: ") and expected in lines[0], (
            name,
            result.stderr,
        )
        assert not (tmp_path / name).exists(), name  # nothing unpacked
        assert history.read_bytes() == before_bytes and _dump(history) == before, name


@TRAINS
def test_import_into_an_extract_path_that_is_a_link_leaves_the_store_untouched(exported, tmp_path):
    """The study was stored, then the unpacking failed on the link: a refusal must leave nothing."""
    history = tmp_path / "history.duckdb"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name, target in (("to-a-directory", elsewhere), ("dangling", tmp_path / "nowhere")):
        link = tmp_path / name
        link.symlink_to(target)
        result = _python("-m", "scalerepro.analysis.history.bundle", "import", str(exported["bundle"]), "--store", str(history), "--extract", str(link))
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [
            f"scalerepro.analysis.history.bundle: error: {link} is a symbolic link: give a new directory (not a link) to --extract"
        ], result.stderr
        assert not history.exists() and not list(elsewhere.iterdir()) and not (tmp_path / "nowhere").exists()
        assert not list(tmp_path.glob(".*"))  # no staging directory left beside it


def _refused_import(bundle_path: Path, history: Path) -> str:
    """Import ``bundle_path`` into ``history`` as a user would; the import must be refused (exit 2)
    in one line, which is returned."""
    result = _python("-m", "scalerepro.analysis.history.bundle", "import", str(bundle_path), "--store", str(history))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    return lines[0]


def _forged(source: Path, target: Path, change_rows) -> Path:
    """A copy of the bundle whose store rows ``change_rows(rows)`` alters, its manifest made to match
    (what a stranger can write: every checksum agrees)."""
    with zipfile.ZipFile(source) as original:
        members = {info.filename: original.read(info.filename) for info in original.infolist()}
    rows = json.loads(members[bundle.STUDY_ROWS])
    change_rows(rows)
    members[bundle.STUDY_ROWS] = json.dumps(rows).encode()
    lines = members[bundle.MANIFEST].decode().splitlines()
    digest = hashlib.sha256(members[bundle.STUDY_ROWS]).hexdigest()
    members[bundle.MANIFEST] = "".join(
        f"{digest}  {bundle.STUDY_ROWS}\n" if line.endswith(f"  {bundle.STUDY_ROWS}") else f"{line}\n" for line in lines
    ).encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
        for name, data in members.items():
            copy.writestr(name, data)
    return target


def _with_member(source: Path, target: Path, name: str, data: bytes) -> Path:
    """A copy of the bundle with one more member, listed in its manifest with its checksum."""
    with zipfile.ZipFile(source) as original:
        members = {info.filename: original.read(info.filename) for info in original.infolist()}
    members[name] = data
    members[bundle.MANIFEST] += f"{hashlib.sha256(data).hexdigest()}  {name}\n".encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
        for member, content in members.items():
            copy.writestr(member, content)
    return target


@TRAINS
def test_a_bundle_member_is_read_in_bounded_chunks(exported, tmp_path, monkeypatch):
    """A listed 1 GiB member of a 2 MB zip took 2.2 GB of memory on import: members are hashed as
    streams (a 64 MiB member: well under 32 MiB held), and one larger than a member may be is refused
    from its header, before it is read."""
    big = _with_member(exported["bundle"], tmp_path / "big.zip", "results/tables/big.csv", b"0" * (64 << 20))
    assert big.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        bundle.read_bundle(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    monkeypatch.setattr(bundle, "MAX_BUNDLE_MEMBER_BYTES", 1 << 20)
    with pytest.raises(bundle.BundleError, match=r"results/tables/big.csv would be 67108864 bytes, more than a bundle member may be"):
        bundle.read_bundle(big)


@TRAINS
def test_a_bundle_adds_only_its_own_study(studies, exported, tmp_path):
    """A stranger's bundle whose runs name a study already in the store (every checksum agreeing)
    is refused in one line and leaves the store as it was: it added 20 runs to that study, and
    its comparison's ratio went from 1.00 to 2.00."""
    history = tmp_path / "history.duckdb"
    victim = _appended(studies["baseline"], history)["study_id"]
    before, before_bytes = _dump(history), history.read_bytes()

    def into_the_victim(rows):
        for run in rows["runs"]:
            run["study_id"] = victim

    forged = _forged(exported["bundle"], tmp_path / "forged.zip", into_the_victim)
    refusal = _refused_import(forged, history)
    assert f"holds runs of another study ({victim})" in refusal, refusal
    assert history.read_bytes() == before_bytes and _dump(history) == before


# Hostile bundles: every checksum agrees, a value does not fit its column. A new case is one line:
# (id, what it does to the bundle's store rows, what the one line of refusal says).
MALFORMED = [
    ("gpus-as-text", lambda rows: rows["runs"][0].update(gpus="eight"), "run 0: gpus is a str, not integer"),
    ("gpus-as-bool", lambda rows: rows["runs"][0].update(gpus=True), "run 0: gpus is a bool, not integer"),
    ("throughput-nan", lambda rows: rows["runs"][0].update(samples_per_s=float("nan")), "run 0: samples_per_s is nan is not a finite number"),
    ("integer-overflow", lambda rows: rows["runs"][0].update(peak_memory_bytes=2**70), "is outside the range of bigint"),
    ("start-not-a-time", lambda rows: rows["study"].update(started_at="yesterday"), "study: started_at is 'yesterday' is not an ISO 8601 time"),
    ("no-study-id", lambda rows: rows["study"].update(study_id=None), "study: study_id is missing"),
    ("huge-text", lambda rows: rows["study"].update(study_name="x" * (2**20 + 1)), "study: study_name is 1048577 characters"),
]


@TRAINS
@pytest.mark.parametrize("case", MALFORMED, ids=[case[0] for case in MALFORMED])
def test_a_bundle_with_a_value_that_does_not_fit_is_refused_before_the_store_is_touched(exported, tmp_path, case):
    """Such a bundle was accepted (or refused with a traceback after an empty store was made), and
    from then on `store list`, `compare` and store_study failed with a pandas traceback."""
    name, change, expected = case
    forged = _forged(exported["bundle"], tmp_path / f"{name}.zip", change)
    history = tmp_path / "history.duckdb"
    refusal = _refused_import(forged, history)
    assert expected in refusal, refusal
    assert not history.exists()


def _doubled(rows) -> None:
    """Every run's throughput twice its record's."""
    for run in rows["runs"]:
        if run["samples_per_s"] is not None:
            run["samples_per_s"] *= 2


@TRAINS
def test_a_bundle_whose_figures_are_not_its_records_is_refused_by_compare_and_import(studies, exported, tmp_path):
    """Rows whose throughput is twice their own records' (every checksum agreeing) were compared as
    they said (each ratio off by a factor of 2: "2.000x faster" where nothing changed) and imported."""
    forged = _forged(exported["bundle"], tmp_path / "doubled.zip", _doubled)
    baseline = json.loads((studies["baseline"] / "results/tables/store.json").read_text())["study_id"]
    first = "run 'strong_cnn_g1_r1': its samples_per_s is "
    compared = _python("-m", "scalerepro.analysis.history.compare", str(forged), baseline, "--store", str(exported["store"]))
    lines = compared.stderr.strip().splitlines()
    assert compared.returncode == 2 and len(lines) == 1 and first in lines[0] and "but its record's is" in lines[0], compared.stderr
    assert compared.stdout == ""  # no comparison printed
    history = tmp_path / "history.duckdb"
    imported = _python("-m", "scalerepro.analysis.history.bundle", "import", str(forged), "--store", str(history))
    lines = imported.stderr.strip().splitlines()
    assert imported.returncode == 2 and len(lines) == 1 and first in lines[0], imported.stderr
    figures = re.search(r"its samples_per_s is ([0-9.e+]+) but its record's is ([0-9.e+]+)", lines[0])
    assert figures and float(figures[1]) == 2 * float(figures[2])  # the row's figure and its record's, named
    assert not history.exists()


# Hostile bundles whose rows fit their columns but are not what their records measured (every checksum
# agreeing): (id, what it does to the bundle's store rows, what the one line of refusal says). The first
# run is strong_cnn_g1_r1, ok and counted, on 1 GPU.
UNTRUE = [
    (
        "throughput-negative",
        lambda rows: rows["runs"][0].update(samples_per_s=-5.0),
        "run 'strong_cnn_g1_r1': samples_per_s is -5.0, where a measured one is above 0 samples/s",
    ),
    ("throughput-zero", lambda rows: rows["runs"][0].update(samples_per_s=0.0), "samples_per_s is 0.0, where a measured one is above 0 samples/s"),
    ("failed-but-counted", lambda rows: rows["runs"][0].update(status="failed"), "it counts but its status is 'failed'"),
    ("status-not-its-records", lambda rows: rows["runs"][0].update(status="missing", counts=False), "its status is 'missing' but its record's is 'ok'"),
    ("counted-at-8-gpus", lambda rows: rows["runs"][0].update(gpus=8), "it counts as gpus 8 but its record ran 1"),
    ("step-time-halved", lambda rows: rows["runs"][0].update(step_time_median_s=rows["runs"][0]["step_time_median_s"] / 2), "its step_time_median_s is"),
    ("record-sha256-rewritten", lambda rows: rows["runs"][0].update(record_sha256="0" * 64), "its record_sha256 is not the sha256 of the record it carries"),
]


@TRAINS
@pytest.mark.parametrize("case", UNTRUE, ids=[case[0] for case in UNTRUE])
def test_a_bundle_row_that_is_not_what_its_record_measured_is_refused(exported, tmp_path, case):
    """Each of these was imported with exit 0: a negative or zero throughput, a failed run counted,
    a status, GPU count or figure its record does not state."""
    name, change, expected = case
    forged = _forged(exported["bundle"], tmp_path / f"{name}.zip", change)
    history = tmp_path / "history.duckdb"
    refusal = _refused_import(forged, history)
    assert expected in refusal, refusal
    assert refusal.startswith("scalerepro.analysis.history.bundle: error: ") and "run 'strong_cnn_g1_r1'" in refusal
    assert not history.exists()


@TRAINS
def test_the_same_records_under_another_study_id_are_named_a_repeat_and_stored_once(studies, tmp_path):
    """A study appended again after its config changed (a new study id) stored its records a second
    time, and the history counted each run twice. Now it is named a repeat of the stored study and
    nothing is stored again (the workflow's store step after a config edit that reran no run)."""
    history = tmp_path / "history.duckdb"
    stored = _appended(studies["baseline"], history)["study_id"]
    before, before_bytes = _dump(history), history.read_bytes()
    renamed = tmp_path / "renamed"
    shutil.copytree(studies["baseline"], renamed)
    config = json.loads((renamed / "results/tables/config.json").read_text())
    (renamed / "results/tables/config.json").write_text(json.dumps({**config, "study_name": "store-test-renamed"}))
    result = append(renamed, history)
    assert result.returncode == 0, result.stderr
    assert f"is already stored as study {stored}: this study is a repeat of it, nothing stored again" in result.stderr
    receipt = json.loads((renamed / "results/tables/store.json").read_text())
    assert (receipt["study_id"], receipt["repeat_of"], receipt["new_study"]) == (stored, stored, False)
    assert history.read_bytes() == before_bytes and _dump(history) == before
    again = _appended(studies["baseline"], history)  # the same study again: as before, unchanged
    assert again["study_id"] == stored and not again["new_study"] and again["runs_unchanged"] == 2 * REPEATS


@TRAINS
def test_a_bundle_of_stored_records_under_another_study_id_is_refused(exported, tmp_path):
    """The candidate's bundle with its study id rewritten (every checksum agreeing) was imported
    beside the same study, and each of its runs counted twice in the history."""
    history = tmp_path / "history.duckdb"
    first = _python("-m", "scalerepro.analysis.history.bundle", "import", str(exported["bundle"]), "--store", str(history))
    assert first.returncode == 0, first.stderr
    stored = json.loads((exported["study"] / "results/tables/store.json").read_text())["study_id"]
    before, before_bytes = _dump(history), history.read_bytes()

    def under_another_id(rows):
        other = "0" * 12 + stored[12:]
        rows["study"]["study_id"] = other
        for run in rows["runs"]:
            run["study_id"] = other

    forged = _forged(exported["bundle"], tmp_path / "renamed.zip", under_another_id)
    refusal = _refused_import(forged, history)
    assert f"are already stored as study {stored}: " in refusal, refusal
    assert history.read_bytes() == before_bytes and _dump(history) == before


# The README's default study as the workflow wrote it (tests/fixtures/studies/README.md): six of its
# rows read another cell's run (record_of), the ablation's "all" a sensitivity cell's, the weak
# study's largest count the strong one's.
README_STUDY = REPO / "tests/fixtures/studies/cpu-readme-243d324"


@pytest.mark.slow  # four analysis commands, the report's figures among them: 9 s
def test_the_readme_study_round_trips_through_a_bundle_rows_that_reuse_a_record_included(tmp_path):
    """`bundle export` of the README's study failed on its first row that reads another row's record:
    "results/runs/ablation_cnn_g2_all_r1/record.json is not the record the store holds" (it looked
    for a record of the row's own run id). Exported and imported, the study is the same rows and
    the same records in the other store and in the files unpacked."""
    study = tmp_path / "study"
    shutil.copytree(README_STUDY, study / "results")
    reused = pd.read_csv(study / "results/tables/matrix.csv", keep_default_na=False).query("record_of != ''")
    assert len(reused) == 6  # the case: rows whose record is another run's
    flags = ("--references", str(REPO / "config/references.yaml"), "--templates", str(REPO / "report"))
    rebuilt = _python("-m", "scalerepro.analysis.rebuild", "--results", "results", *flags, cwd=study, timeout=300)
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    history = tmp_path / "history.duckdb"
    receipt = _appended(study, history)
    out = tmp_path / "readme.zip"
    exported = _python("-m", "scalerepro.analysis.history.bundle", "export", "--out", str(out), "--store", str(history), "--workflow", str(REPO), cwd=study)
    assert exported.returncode == 0, exported.stderr
    other, unpacked = tmp_path / "other.duckdb", tmp_path / "unpacked"
    imported = _python("-m", "scalerepro.analysis.history.bundle", "import", str(out), "--store", str(other), "--extract", str(unpacked))
    assert imported.returncode == 0, imported.stderr
    with contextlib.closing(store_file.connect(history, read_only=True)) as first, contextlib.closing(store_file.connect(other, read_only=True)) as second:
        sent, received = store.load_study(first, receipt["study_id"]), store.load_study(second, receipt["study_id"])
    assert received.row == sent.row and received.runs == sent.runs
    for run in received.runs:
        if run["record_of"]:  # a row that reads another run's record carries that record, unpacked once beside the study's own
            owner = next(row for row in received.runs if row["run_id"] == run["record_of"])
            assert run["record"] == owner["record"] is not None
        if run["record"] is not None:
            path = unpacked / "results/runs" / (run["record_of"] or run["run_id"]) / "record.json"
            assert path.read_text() == run["record"] == (study / "results/runs" / (run["record_of"] or run["run_id"]) / "record.json").read_text()


# --------------------------------------------------------------------------------------------
# The report's history section
# --------------------------------------------------------------------------------------------


@TRAINS
def test_the_report_shows_history_and_the_baseline_comparison(studies, tmp_path):
    history = tmp_path / "history.duckdb"
    tables = tmp_path / "tables"
    shutil.copytree(studies["baseline"] / "results/tables", tables)
    _appended(studies["baseline"], history)
    for name in ("history.csv", "store.json"):
        shutil.copy(studies["baseline"] / "results/tables" / name, tables / name)
    first = report.render(tables, None, None, tables / "config.json", None, REPO / "report", history_path=tables / "history.csv")
    section = first.split('<section id="history">')[1].split("</section>")[0]
    assert "This is the first study in the results store <code>results/history.duckdb</code>: there is no history yet." in section
    assert "No baseline set." in section and "<img" not in section

    _appended(studies["candidate"], history)
    for name in ("history.csv", "store.json"):
        shutil.copy(studies["candidate"] / "results/tables" / name, tables / name)
    versus, facts = tables / "versus_baseline.csv", tables / "versus_baseline.json"
    compared = _python(
        "-m",
        "scalerepro.analysis.history.compare",
        "latest",
        "latest",
        "--store",
        str(history),
        "--csv",
        str(versus),
        "--json",
        str(facts),
        "--confidence",
        "0.999",
        "--threshold",
        "0.2",
    )
    assert compared.returncode == 0, compared.stderr
    plots = tmp_path / "plots"
    drawn = _python(
        "-m",
        "scalerepro.analysis.presentation.plots",
        "--tables",
        str(tables),
        "--out",
        str(plots),
        "--only",
        "history",
        "versus_baseline",
    )
    assert drawn.returncode == 0 and "history: drawn" in drawn.stderr and "versus_baseline: drawn" in drawn.stderr, drawn.stderr
    html = report.render(
        tables,
        plots,
        None,
        tables / "config.json",
        None,
        REPO / "report",
        history_path=tables / "history.csv",
        versus_table_path=versus,
        versus_facts_path=facts,
    )
    section = html.split('<section id="history">')[1].split("</section>")[0]
    assert "first study" not in section and "No baseline set" not in section
    assert 'alt="Headline cells across studies"' in section and 'alt="Candidate vs baseline, per cell"' in section
    assert section.count('<span class="badge fail">slower</span>') == 1 and "no significant change" in section
    # both studies' headline cells: two models at one GPU count, one row per study each
    assert section.count("<tr>") == 1 + 2 + 1 + 2 * 2
