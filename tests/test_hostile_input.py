"""Hostile input, round 4 (issue 37), kind by kind: each case one line of a parametrised list, run
as the user runs it (the command's own process), each refused in one line naming the problem and
the fix, exit 2, nothing written.

Kind 1, a record is evidence, not a figure to publish: a record of another run, a figure no
measurement gives, a file no record is, is refused where the analysis reads it, named, and counted
as a hole (the run missing or failed; no figure of it in any table).

Kind 2, no output from no input: a command given nothing to work from says so; a report or a
set of figures made from no tables would read as a study that measured nothing.

Kind 3, every command inside the boundary: a file of the wrong kind (empty, binary, huge) or a flag
no run can use (nan) is one line naming it, exit 2, never a traceback, never a run that ignores it.

Kind 5, two drivers, one study: a second driver is told plainly that the first is running."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from analysis_fixtures import Study, make_record
from conftest import REPO, clean_env
from workflow_runs import COPY_IGNORE, workflow_env

REFERENCES = str(REPO / "config" / "references.yaml")


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120)


# ---- kind 1: a record is evidence -------------------------------------------------------------


def _study(root: Path) -> Path:
    """A strong and a weak cell at 1 and 2 GPUs, one repeat each; the matrix's path."""
    s = Study(root)
    for study in ("strong", "weak"):
        s.add(study, 1, 1, samples_per_s=100.0)
        s.add(study, 2, 1, per_gpu_batch=32 if study == "weak" else 16, samples_per_s=180.0)
    return s.write_matrix()


def _swap(root: Path) -> None:  # the weak 2-GPU run's record copied over the strong 1-GPU run's
    shutil.copy(root / "runs" / "weak_resnet50_g2_r1.json", root / "runs" / "strong_resnet50_g1_r1.json")


def _point_elsewhere(root: Path) -> None:  # the matrix names the weak run's record, by an absolute path
    matrix = pd.read_csv(root / "matrix.csv")
    matrix.loc[matrix.run_id.eq("strong_resnet50_g1_r1"), "record"] = str((root / "runs" / "weak_resnet50_g2_r1.json").resolve())
    matrix.to_csv(root / "matrix.csv", index=False)


def _figure(value: object) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        path = root / "runs" / "strong_resnet50_g1_r1.json"
        record = json.loads(path.read_text())
        record["measurements"]["samples_per_s"] = value
        path.write_text(json.dumps(record))  # NaN and inf as JSON's NaN and Infinity, as Python writes them

    return corrupt


def _nested(root: Path) -> None:  # a record 100,000 levels deep
    (root / "runs" / "strong_resnet50_g1_r1.json").write_text("[" * 100_000 + "]" * 100_000)


EVIDENCE = [
    # (name, what is done to the study, the run's status in runs.csv, what its error says)
    ("another run's record in its place", _swap, "missing", "is not this run's: it is another run's record (run id 'weak_resnet50_g2_r1'"),
    ("the matrix points at another run's record", _point_elsewhere, "missing", "is not this run's: it is another run's record"),
    ("a negative throughput", _figure(-5.0), "failed", "samples_per_s is -5.0, where a measured one is above 0 samples/s"),
    ("an infinite throughput", _figure(math.inf), "failed", "samples_per_s is inf, not a finite number"),
    ("a NaN throughput", _figure(math.nan), "failed", "samples_per_s is nan, not a finite number"),
    ("a throughput in words", _figure("fast"), "failed", "samples_per_s is 'fast', not a number"),
    ("a record nested 100,000 levels deep", _nested, "missing", "is nested deeper than any run record"),
]


@pytest.mark.parametrize(("name", "corrupt", "status", "said"), EVIDENCE, ids=[case[0] for case in EVIDENCE])
def test_a_record_is_evidence(name: str, corrupt: Callable[[Path], None], status: str, said: str, tmp_path: Path) -> None:
    """aggregate, as the workflow runs it: the run is a hole, its figure in no table, the rest counted."""
    _study(tmp_path)
    corrupt(tmp_path)
    done = _run(
        ["-m", "scalerepro.analysis.tables.aggregate", "--matrix", "matrix.csv", "--references", REFERENCES, "--out", "tables", "--predict-gpus", "4"], tmp_path
    )
    assert done.returncode == 0, (name, done.stderr[-2000:])
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv").set_index("run_id")
    run = runs.loc["strong_resnet50_g1_r1"]
    assert run["status"] == status and said in run["error"] and not run["counts"], (name, run["status"], run["error"])
    assert runs.drop(index="strong_resnet50_g1_r1")["counts"].all(), name  # the other runs still count
    scaling = pd.read_csv(tmp_path / "tables" / "scaling.csv")
    one = scaling[scaling.study.eq("strong") & scaling.gpus.eq(1)].iloc[0]
    assert one["repeats_ok"] == 0 and pd.isna(one["samples_per_s_median"]), name  # no figure of it published
    assert scaling.select_dtypes("number").abs().max().max() < math.inf, name


def _record_with_step(step: float) -> Callable[[Path], list[str]]:
    def make(folder: Path) -> list[str]:
        record = make_record("strong_resnet50_g1_r1", per_gpu_batch=32, samples_per_s=32 / 18e-3)
        record["measurements"]["backward_buckets"] = {
            "steps": 5,
            "reason": None,
            "gradient_bytes": 8_000_000,
            "micro_batches_per_step": 1,
            "forward_s": 6e-3,
            "backward_s": 10e-3,
            "optimizer_s": 1e-3,
            "buckets": [{"bytes": 8_000_000, "parameters": 1, "ready_s": 9e-3}],
        }
        record["measurements"]["step_time_s"]["median"] = step
        (folder / "r.json").write_text(json.dumps(record))
        return ["-m", "scalerepro.analysis.predict", "--record", "r.json", "--cluster", "dgx_h100", "--references", REFERENCES]

    return make


PREDICT_RECORD = [
    ("a step of 0 s", _record_with_step(0.0), "step_time_s.median is 0.0, where a measured one is above 0"),
    ("a step of -1 s", _record_with_step(-1.0), "step_time_s.median is -1.0, where a measured one is above 0"),
    ("a step of NaN", _record_with_step(math.nan), "step_time_s.median is nan, not a finite number"),
]


@pytest.mark.parametrize(("name", "make", "said"), PREDICT_RECORD, ids=[case[0] for case in PREDICT_RECORD])
def test_predict_takes_a_record_as_evidence(name: str, make: Callable[[Path], list[str]], said: str, tmp_path: Path) -> None:
    done = _run(make(tmp_path), tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, (name, done.returncode, done.stderr[-2000:])
    assert done.stdout == "", name  # no prediction printed


# ---- kind 2: no output from no input ----------------------------------------------------------


def _report(tables: str) -> list[str]:
    return [
        "-m",
        "scalerepro.analysis.presentation.report",
        "--tables",
        tables,
        "--plots",
        "plots",
        "--inventory",
        "system.json",
        "--config",
        "config.json",
        "--references",
        str(REPO / "config" / "references.yaml"),
        "--templates",
        str(REPO / "report"),
        "--out",
        "report/index.html",
    ]


NO_INPUT = [
    # (name, argv in the case's empty folder, what the one line says)
    ("report of a missing tables folder", _report("missing"), "--tables missing: no such folder"),
    ("report of an empty tables folder", _report("empty"), "--tables empty: no runs.csv there, so nothing was aggregated"),
    (
        "figures of a missing tables folder",
        ["-m", "scalerepro.analysis.presentation.plots", "--tables", "missing", "--out", "plots"],
        "--tables missing: no such folder",
    ),
    ("figures of an empty tables folder", ["-m", "scalerepro.analysis.presentation.plots", "--tables", "empty", "--out", "plots"], "no runs.csv there"),
    (
        "predictions at -1 and 0 GPUs",
        ["-m", "scalerepro.analysis.tables.aggregate", "--matrix", "matrix.csv", "--references", "r.yaml", "--out", "tables", "--predict-gpus", "-1", "0"],
        "argument --predict-gpus: -1 is outside [1, 1000000]",
    ),
]


@pytest.mark.parametrize(("name", "argv", "said"), NO_INPUT, ids=[case[0] for case in NO_INPUT])
def test_no_output_from_no_input(name: str, argv: list[str], said: str, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, (name, done.returncode, done.stderr[-2000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"], name  # no report, no figures, no tables


# ---- kind 3: every command inside the boundary ------------------------------------------------

BINARY = bytes(range(256)) * 16  # no text, no JSON: what a mis-typed path or a half-copied file gives


def _files(folder: Path) -> None:
    """The inputs of the commands below, good ones, so that each case breaks exactly one."""
    _study(folder)
    (folder / "empty.csv").write_text("")
    (folder / "binary.bin").write_bytes(BINARY)
    (folder / "tables").mkdir()
    (folder / "tables" / "runs.csv").write_text("run_id,status\n")
    (folder / "config.json").write_text("{}")
    (folder / "system.json").write_text("{}")


def _aggregate(matrix: str = "matrix.csv", *extra: str) -> list[str]:
    return ["-m", "scalerepro.analysis.tables.aggregate", "--matrix", matrix, "--references", REFERENCES, "--out", "out", *extra]


def _store_append(matrix: str) -> list[str]:
    return [
        "-m",
        "scalerepro.analysis.history.store",
        "append",
        "--store",
        "store.duckdb",
        "--matrix",
        matrix,
        "--config",
        "config.json",
        "--inventory",
        "system.json",
    ]


def _report_with(config: str = "config.json", inventory: str = "system.json") -> list[str]:
    argv = _report("tables")
    argv[argv.index("--config") + 1], argv[argv.index("--inventory") + 1] = config, inventory
    return argv


def _train(*flags: str) -> list[str]:
    return ["-m", "scalerepro.training.train", "--model", "cnn", "--device", "cpu", "--steps", "2", "--record", "r.json", *flags]


def _huge(folder: Path) -> str:
    (folder / "huge.csv").write_bytes(BINARY * (50 * 2**20 // len(BINARY)))  # 50 MiB
    return "huge.csv"


BOUNDARY = [
    # (name, argv (a callable takes the folder, for a file it must first write), what the one line says)
    ("aggregate: an empty matrix.csv", _aggregate("empty.csv"), "empty.csv: the study matrix is empty"),
    ("aggregate: a binary matrix.csv", _aggregate("binary.bin"), "binary.bin: not a study matrix, not CSV text"),
    ("aggregate: a 50 MB binary matrix.csv", lambda f: _aggregate(_huge(f)), "huge.csv: not a study matrix, not CSV text"),
    ("store append: an empty matrix.csv", _store_append("empty.csv"), "empty.csv: the study matrix is empty"),
    ("store append: a binary matrix.csv", _store_append("binary.bin"), "binary.bin: not a study matrix, not CSV text"),
    ("aggregate: a binary --comm", _aggregate("matrix.csv", "--comm", "binary.bin"), "all-reduce benchmark result binary.bin is not JSON"),
    ("report: a binary --config", _report_with(config="binary.bin"), "JSON input binary.bin is not JSON"),
    ("report: a binary --inventory", _report_with(inventory="binary.bin"), "JSON input binary.bin is not JSON"),
    ("train: --dist-timeout-s nan", _train("--dist-timeout-s", "nan"), "--dist-timeout-s must be a finite number (got nan)"),
    ("train: --min-window-s nan", _train("--min-window-s", "nan"), "--min-window-s must be a finite number (got nan)"),
    ("train: a file as --checkpoint-dir", _train("--checkpoint-dir", "config.json"), "--checkpoint-dir config.json is a file, not a folder"),
]


@pytest.mark.slow  # starts training processes or Snakemake: not in the fast tier
@pytest.mark.parametrize(("name", "argv", "said"), BOUNDARY, ids=[case[0] for case in BOUNDARY])
def test_every_command_inside_the_boundary(name: str, argv, said: str, tmp_path: Path) -> None:
    _files(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = _run(argv(tmp_path) if callable(argv) else argv, tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, (name, done.returncode, done.stderr[-2000:])
    after = sorted(p.name for p in tmp_path.iterdir() if p.name != "huge.csv")
    assert after == before, name  # nothing written: no tables, no store, no report, no record, no checkpoint


# ---- also: what a failure names -----------------------------------------------------------------


def _full_disk(folder: Path) -> tuple[list[str], dict[str, str] | None]:
    """A 64 KiB file system for the checkpoints (a real one: tmpfs), unmounted by the test."""
    disk = folder / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a small file system and mounting one is not permitted here: {mounted.stderr.strip()}")
    return _train("--steps", "6", "--warmup-steps", "2", "--checkpoint-dir", str(disk / "ckpt"), "--checkpoint-interval", "1", "--no-eval"), None


def _without_nsys(folder: Path) -> tuple[list[str], dict[str, str] | None]:
    env = clean_env()
    env["PATH"] = str(Path(sys.executable).parent) + ":/usr/bin:/bin"  # no Nsight there
    return ["-m", "scalerepro.launching.nsight", "--tool", "nsys", "--out-dir", "prof", "--", "--model", "cnn"], env


def _repeated_run_id(folder: Path) -> tuple[list[str], dict[str, str] | None]:
    (folder / "results" / "tables").mkdir(parents=True)
    matrix = pd.read_csv(_study(folder))
    pd.concat([matrix, matrix.head(1)]).to_csv(folder / "results" / "tables" / "matrix.csv", index=False)
    return ["-m", "scalerepro.analysis.rebuild", "--results", "results"], None


def _study_set_flag(folder: Path) -> tuple[list[str], dict[str, str] | None]:
    import yaml

    config = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    config["trainer_args"] = [*config["trainer_args"], "--record=/etc/passwd"]
    (folder / "bad.yaml").write_text(yaml.safe_dump(config))
    return ["-m", "snakemake", "-n", "--directory", str(REPO), "--snakefile", str(REPO / "Snakefile"), "--configfile", str(folder / "bad.yaml")], None


ALSO = [
    # (name, the command and its environment, its exit status, what its error line says)
    ("a checkpoint on a full disk", _full_disk, 1, "No space left on device (0 bytes free) writing a checkpoint: '"),
    ("nsight without nsys installed", _without_nsys, 2, "nsys is not installed here (not on PATH): install Nsight Systems"),
    ("rebuild of a matrix with a repeated run id", _repeated_run_id, 2, "results/tables/matrix.csv: run_id repeats"),
    ("a trainer flag the study sets itself", _study_set_flag, 1, "config error at 'trainer_args': --record=/etc/passwd is a flag the study sets for every run"),
]


@pytest.mark.slow  # starts training processes or Snakemake: not in the fast tier
@pytest.mark.parametrize(("name", "command", "status", "said"), ALSO, ids=[case[0] for case in ALSO])
def test_a_failure_names_what_failed(name: str, command, status: int, said: str, tmp_path: Path) -> None:
    argv, env = command(tmp_path)
    try:
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env or clean_env(), capture_output=True, text=True, timeout=300)
    finally:
        if (tmp_path / "disk").is_dir():
            subprocess.run(["umount", str(tmp_path / "disk")], capture_output=True)
    output = done.stdout + done.stderr  # Snakemake prints its errors on stdout
    lines = [line for line in output.splitlines() if said in line]
    assert done.returncode == status and lines, (name, done.returncode, output[-2000:])
    assert "unexpected pos" not in output and "/tmp/tmp" not in output, name  # no torch internals, no scratch copy


def test_store_list_prints_a_stored_name_as_text_never_as_terminal_control(tmp_path: Path) -> None:
    """Round 3's one class still open: a study named with escape sequences (ESC[2J clears the
    screen, OSC 8 makes a link, BEL rings) is listed with them stripped or shown escaped."""
    matrix = _study(tmp_path)
    evil = "evil\x1b[2J\x1b]8;;http://x\x07name\x07\r"
    (tmp_path / "config.json").write_text(json.dumps({"study_name": evil}))
    (tmp_path / "system.json").write_text("{}")
    appended = _run(_store_append(str(matrix)), tmp_path)
    assert appended.returncode == 0, appended.stderr[-2000:]
    listed = _run(["-m", "scalerepro.analysis.history.store", "list", "--store", "store.duckdb"], tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "evilname\\x07\\r" in listed.stdout and not any(c in listed.stdout for c in "\x1b\x07\r\x9b"), repr(listed.stdout)


# ---- kind 5: two drivers, one study -----------------------------------------------------------

TWO_DRIVERS = [
    # (name, the second driver's Snakemake flags, its exit status, what it says)
    ("a second driver that would run jobs", ["--cores", "1"], 1, "another snakemake is running this study in"),
    ("a dry run beside the driver", ["-n"], 0, "warning: another snakemake is running this study in"),
]


@pytest.mark.slow  # starts training processes or Snakemake: not in the fast tier
@pytest.mark.parametrize(("name", "flags", "status", "said"), TWO_DRIVERS, ids=[case[0] for case in TWO_DRIVERS])
def test_two_drivers_one_study(name: str, flags: list[str], status: int, said: str, tmp_path: Path) -> None:
    """A real driver runs the CI study (synthetic data) in a copy of the checkout; a second one
    started there is told plainly that the first is running, never to --rerun-incomplete."""

    workdir = tmp_path / "study"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    env = workflow_env()
    snakemake = [sys.executable, "-m", "snakemake", "--configfile", "config/ci.yaml", "--config", "data=synthetic"]
    first_log = tmp_path / "first-driver.log"
    with open(first_log, "w") as sink:
        first = subprocess.Popen([*snakemake, "--cores", "1"], cwd=workdir, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        lock = workdir / ".snakemake" / "scalerepro-driver.lock"
        deadline = time.monotonic() + 120
        while not (lock.is_file() and "pid" in lock.read_text() and list((workdir / "results").glob("*"))):
            assert first.poll() is None and time.monotonic() < deadline, "the first driver did not start"
            time.sleep(0.5)
        time.sleep(2)  # its first jobs under way: outputs in progress
        second = subprocess.run([*snakemake, *flags], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            raise AssertionError(f"the first driver outlived SIGTERM by 120 s; its log ends:\n{first_log.read_text()[-3000:]}") from None
    output = second.stdout + second.stderr
    lines = [line for line in output.splitlines() if said in line]
    # the messages are strings, which pytest prints whole (a tuple's repr it cuts short)
    assert second.returncode == status and lines, f"{name}: exit {second.returncode}\n--- stdout\n{second.stdout[-3000:]}\n--- stderr\n{second.stderr[-3000:]}"
    assert f"pid {first.pid}" in lines[0] and "IncompleteFilesException" not in output, f"{name}\n{output[-3000:]}"


# A checkpoint whose DAG update (under Snakemake's scheduler lock) is held open until the test
# has sent SIGTERM: the main thread holds the lock when the signal comes.
HELD_CHECKPOINT = """
import time
from pathlib import Path
from scalerepro.launching import driver_signals

onstart:
    if HOOK:
        driver_signals.run_stop_handler_off_the_main_thread()

checkpoint pick:
    output: "out/pick.txt"
    shell: "mkdir -p out && echo picked > {output}"

def after_pick(wildcards):
    picked = checkpoints.pick.get().output[0]
    Path("updating").touch()
    while not Path("signalled").exists():
        time.sleep(0.05)
    time.sleep(1.0)
    return [picked]

rule done:
    input: after_pick
    output: "out/done.txt"
    shell: "cp {input} {output}"
"""


@pytest.mark.slow  # starts Snakemake: not in the fast tier
def test_sigterm_while_snakemake_updates_its_dag_stops_the_driver(tmp_path: Path) -> None:
    """SIGTERM to the driver while its scheduler holds its lock (here, updating the DAG after a
    checkpoint; the study budget's is one): Snakemake's handler waited for that lock in the very
    thread that held it, and the driver hung for good (the two-drivers test's first driver did,
    in CI). With the workflow's onstart hook it stops as Snakemake's graceful stop does, once the
    scheduler lets go of the lock (a job it selected meanwhile may still run first)."""
    (tmp_path / "Snakefile").write_text("HOOK = True\n" + HELD_CHECKPOINT)
    with open(tmp_path / "driver.log", "w") as sink:
        driver = subprocess.Popen(
            [sys.executable, "-m", "snakemake", "--cores", "1", "done"], cwd=tmp_path, env=workflow_env(), stdout=sink, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 120
    while not (tmp_path / "updating").exists():
        assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.log").read_text()[-3000:]
        time.sleep(0.05)
    driver.send_signal(signal.SIGTERM)
    (tmp_path / "signalled").touch()
    try:
        code = driver.wait(timeout=60)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise AssertionError(f"the driver hung on SIGTERM; its log ends:\n{(tmp_path / 'driver.log').read_text()[-3000:]}") from None
    log = (tmp_path / "driver.log").read_text()
    # Snakemake's graceful stop, which ends the invocation as not done
    assert code != 0 and "Will exit after finishing currently running jobs" in log, log[-3000:]


# ---- kind 4: a stop is a stop, also in evaluation ---------------------------------------------

AFTER_THE_LAST_STEP = [
    # (name, the run's flags, the log line after which SIGTERM is sent, where it stopped)
    ("in the final evaluation", ["--eval-samples", "60000", "--eval-batch-size", "8"], "evaluating 60000 held-out samples", "during the final evaluation"),
    ("in the probes", ["--no-eval", "--bucket-probe-steps", "3000"], "step 6/6", "during the probes"),
]


@pytest.mark.slow  # starts training processes or Snakemake: not in the fast tier
@pytest.mark.parametrize(("name", "flags", "after", "where"), AFTER_THE_LAST_STEP, ids=[case[0] for case in AFTER_THE_LAST_STEP])
def test_a_stop_is_a_stop_after_the_last_step(name: str, flags: list[str], after: str, where: str, tmp_path: Path) -> None:
    """SIGTERM once the last step is done: acknowledged within seconds (the defect: the evaluation
    of 60,000 samples ran on for minutes and the run ended ok; on Slurm KillWait then killed it
    mid-evaluation, leaving no record), a preempted record with the window's figures, exit 75."""
    argv = [
        sys.executable,
        *_train("--steps", "6", "--warmup-steps", "2", "--synthetic-samples", "1024", "--num-workers", "0", "--checkpoint-dir", "ckpt", *flags),
    ]
    process = subprocess.Popen(argv, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if after in line:
            time.sleep(1.0)  # well inside it
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            break
    output = process.stdout.read()
    assert process.wait(timeout=60) == 75, (name, output[-2000:])
    assert time.monotonic() - signalled < 15, name  # within a batch or a probe step, not after the whole of it
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "preempted" and record["stop_signal"] == "SIGTERM", name
    assert record["measurements"]["samples_per_s"] > 0 and record["steps"]["completed"] == 6, name  # the window's figures kept
    assert f"stopped by SIGTERM {where}, after the last step" in output, (name, output[-2000:])
