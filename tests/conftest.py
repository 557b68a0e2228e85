"""Shared fixtures: run the trainer in-process or as real processes, validate its records."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from scalerepro.data import cifar10
from scalerepro.launching import fork_server

from h100_report import h100_report  # noqa: F401  (the report rendered from the kept H100 records)

REPO = Path(__file__).resolve().parents[1]
from scalerepro.record.model import RECORD_SCHEMA_VERSION  # noqa: E402
from scalerepro.record.read import from_document  # noqa: E402

RECORD_SCHEMA = json.loads((REPO / "workflow/schemas/run_record.schema.json").read_text())
_VALIDATOR = jsonschema.Draft202012Validator(RECORD_SCHEMA, format_checker=jsonschema.FormatChecker())


def load_record(path: Path) -> dict:
    """Read a run record the trainer wrote and fail the test unless it is a record of today's model:
    it validates against the schema file, and reads into the model with figures that agree
    (scalerepro.record.read)."""
    record = json.loads(Path(path).read_text())
    errors = sorted(_VALIDATOR.iter_errors(record), key=lambda e: list(e.path))
    assert not errors, "record does not match the schema:\n" + "\n".join(f"{'/'.join(map(str, e.path))}: {e.message[:300]}" for e in errors)
    reading = from_document(record)
    assert reading.written_as == RECORD_SCHEMA_VERSION and not reading.nonsense, reading.nonsense
    return record


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A record the suite trains ran beside the other xdist worker's tests on the same cores: its
# analysis counts it however busy that worker was (targets.other_cpu_fraction_max), as
# config/ci.yaml does for the suite's studies. The bound itself: tests/test_study_evidence.py.
SHARED_MACHINE_TARGETS = {"other_cpu_fraction_max": 1.0}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child trainer: no inherited launcher variables, one thread per rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "LOCAL_", "WORLD_", "MASTER_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


# This test process's fork server, its socket, and the folder of its log; ended at the session's end.
_FORK_SERVER: list[tuple[subprocess.Popen, str, Path]] = []


def _fork_server_socket() -> str:
    """The socket of this test process's fork server, started at its first use with the ranks'
    environment (a server refuses ranks whose import-time variables differ from its own)."""
    if not _FORK_SERVER:
        with pytest.MonkeyPatch.context() as patch:
            ranks = clean_env()
            for name in set(os.environ) - set(ranks):
                patch.delenv(name)
            for name, value in ranks.items():
                patch.setenv(name, value)
            log_folder = Path(tempfile.mkdtemp(prefix="scalerepro-test-"))
            _FORK_SERVER.append((*fork_server.start(os.getpid(), log_folder / "fork_server.log"), log_folder))
    return _FORK_SERVER[0][1]


def pytest_sessionfinish(session, exitstatus):
    """Each process's own (an xdist worker's too): its fork server and the server's log."""
    for server, socket_path, log_folder in _FORK_SERVER:
        fork_server.stop(server, socket_path)
        shutil.rmtree(log_folder, ignore_errors=True)
    _FORK_SERVER.clear()


def launch_ranks(nproc: int, args: list[str], timeout: float = 300, module: str = "scalerepro.training.train", **popen) -> subprocess.CompletedProcess:
    """Start ``nproc`` real ranks of ``module`` (the trainer) as a CPU study starts them, and wait for them:
    the local launcher (scalerepro.launching.launch: env:// on 127.0.0.1, gloo), each rank forked
    from a fork server that has imported torch (a new process per rank, under torchrun, paid
    8.5 s more a job on a 2-core AVX2 EPYC). A test whose environment differs in what torch
    reads at import gets new processes (the launcher says so in its output)."""
    command = [sys.executable, "-m", "scalerepro.launching.launch", "--ranks-per-node", str(nproc), "--", "-m", module, *args]
    env = clean_env(**{fork_server.SOCKET_ENV: _fork_server_socket()})
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, **popen)


def signal_last_rank_at_step_20(args: list[str], signum: int) -> tuple[subprocess.Popen, str]:
    """Start two ranks under torchrun, wait until step 20 is logged, send ``signum`` to the last
    rank only; return the launcher (finished) and everything it printed."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "scalerepro.training.train", *args]
    launcher = subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in launcher.stdout:
        if line.startswith("step 20/"):
            break
    workers = subprocess.run(["pgrep", "-f", "-P", str(launcher.pid), "scalerepro.training.train"], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    os.kill(int(workers[-1]), signum)
    output = launcher.stdout.read()
    launcher.wait(timeout=120)
    return launcher, output


def python_train(args: list[str], timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerepro.training.train", *args], env=env or clean_env(), capture_output=True, text=True, timeout=timeout)


def learnable_cifar_split(count: int, seed: int) -> cifar10.Split:
    """CIFAR-10-shaped data with a learnable rule: each class is a fixed 8x8 colour pattern,
    upsampled to 32x32, plus pixel noise."""
    templates = np.random.default_rng(1234).integers(0, 256, (10, 8, 8, 3))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count).astype(np.int64)
    images = np.repeat(np.repeat(templates[labels], 4, axis=1), 4, axis=2) + rng.normal(0, 48, (count, 32, 32, 3))
    return cifar10.Split(np.clip(images, 0, 255).astype(np.uint8), labels)


# The suite runs on two pytest-xdist workers (pyproject.toml). Most tests only need to finish;
# a few assert on figures they measure (a slowdown factor, a verdict), which a test beside them
# on the same two cores would distort: those are marked `measures`. Every test, from the setup of
# its fixtures (a module's study included) to their teardown, holds the machine shared; a test
# that measures holds it alone, waiting for the other worker's current test to end and keeping
# new ones out (the gate lets a waiting measurement go before tests that arrive after it).
# The locks lie in the run's base temporary folder, which the workers' own folders are in and
# pytest removes with the runs it no longer keeps.


@contextlib.contextmanager
def _machine(config: pytest.Config, mode: int) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield  # one process runs every test: nothing runs beside a measurement
        return
    locks = Path(config.option.basetemp).parent
    with open(locks / "gate", "a") as gate, open(locks / "machine", "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(machine, mode)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


# The longest files go first, the two studies (minutes each, mostly waiting on Snakemake and Slurm)
# one on each worker, and the short files fill the end. xdist keeps this order only with
# --no-loadscope-reorder (pyproject.toml): by default it sends the files with the most tests first,
# which started the Slurm study (6 minutes of a few tests) 8 minutes in, as the run's tail. The
# fast tier's longest files follow.
LONGEST_FIRST = (
    "test_slurm.py",
    "test_workflow.py",
    "test_parallel.py",
    "test_distributed.py",
    "test_trainer.py",
    "test_compilation.py",
    "test_fork_server.py",
    "test_compile_cache_trust.py",
    "test_one_gpu_report.py",
    "test_analysis.py",
    "test_study_evidence.py",
    "test_layout.py",
    "test_rebuild_records.py",
    "test_report_layout.py",
    "test_docs.py",
    "test_scaling_model.py",
    "test_hostile_input.py",
    "test_models.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: each file's order kept


# Every core this pytest process may use, read before any test narrows it.
ALL_CORES = frozenset(os.sched_getaffinity(0))


def _cores_for(item) -> set[int]:
    """Each xdist worker computes on a core of its own. A process of this package takes every
    core it may use, one thread on each (scalerepro.training.distributed.pin_to_own_cores): two
    workers' trainers then ran 4 threads on 2 cores, whose OpenMP threads spin waiting for each
    other, 4x slower than alone; on a core each they run 2.5x faster than that. A test that
    measures, or that needs every core (marker ``all_cores``), has them all."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or len(ALL_CORES) < 2 or item.get_closest_marker("measures") or item.get_closest_marker("all_cores"):
        return set(ALL_CORES)
    return {sorted(ALL_CORES)[int(worker.removeprefix("gw")) % len(ALL_CORES)]}


def _compute_on(cores: set[int] | frozenset[int]) -> None:
    """This process's main thread, and every process a test starts, on ``cores``; and torch,
    where a test module imported it, with one intra-op thread per core (its thread pool was
    made for every core, and its threads keep their own affinity)."""
    os.sched_setaffinity(0, cores)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(len(cores))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _machine(item.config, fcntl.LOCK_EX if item.get_closest_marker("measures") else fcntl.LOCK_SH):
        _compute_on(_cores_for(item))
        try:
            yield
        finally:
            _compute_on(ALL_CORES)


@pytest.fixture(scope="session")
def prepared_cifar(tmp_path_factory) -> Path:
    """A small prepared CIFAR-10 directory (2,048 train / 512 test images)."""
    path = tmp_path_factory.mktemp("data") / "cifar10"
    cifar10.write(path, {"train": learnable_cifar_split(2048, 1), "test": learnable_cifar_split(512, 2)}, source="tests")
    return path
