"""The fork server (scalerepro.launching.fork_server): a local rank forked from a process that
imported torch once must be what ``python -m module args`` would have been, die with its
launcher, fail as it would, and be refused (then started as a new process) where forking could
change what it runs. Real servers, real sockets, real processes; the trainer through it in
test_workflow's CI study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalerepro.launching import fork_server, launch, rank_failure

WORKFLOW = Path(__file__).resolve().parents[1] / "workflow"

# A rank's program: says what it sees, then exits with the code its first argument names (or
# kills itself with a signal, or waits for SIGTERM and writes where its second argument says).
RANK_MODULE = textwrap.dedent(
    """
    import os, signal, sys, time
    print("name", __name__, "argv", sys.argv[1:], "cwd", os.getcwd(), flush=True)
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "marker", os.environ.get("RANK_MARKER"), flush=True)
    print("scalerepro imported before", [m for m in sys.modules if m.startswith("scalerepro.training")], flush=True)
    print("torch preloaded", "torch" in sys.modules, flush=True)
    print("ps shows", open("/proc/self/cmdline").read().replace(chr(0), " ").strip(), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    what = sys.argv[1]
    if what == "wait":
        def stopped(signum, frame):
            open(sys.argv[2], "w").write(signal.Signals(signum).name)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stopped)
        open(sys.argv[2] + ".started", "w").close()
        time.sleep(60)
        sys.exit(3)
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(what) if os.environ["RANK"] == "0" else 0)
    """
)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A fork server for this test, its socket named in the environment as the workflow's hook does."""
    monkeypatch.setenv("PYTHONPATH", str(WORKFLOW))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rank_program.py").write_text(RANK_MODULE)
    process, socket_path = fork_server.start(os.getpid(), tmp_path / "fork_server.log")
    monkeypatch.setenv(fork_server.SOCKET_ENV, socket_path)
    yield process
    fork_server.stop(process, socket_path)
    assert not Path(socket_path).exists()


def _run_local(capsys, ranks: int, *args: str) -> tuple[int, list[dict], str, str]:
    code, failures = launch.run_local(ranks, ["-m", "rank_program", *args], dict(os.environ), rank_failure.RankOutput(), cpus=None)
    out, err = capsys.readouterr()
    return code, failures, out, err


def test_a_forked_rank_runs_its_module_as_python_would_and_fails_as_it_would(server, tmp_path, capsys):
    os.environ["RANK_MARKER"] = "this job's"
    try:
        code, failures, out, err = _run_local(capsys, 2, "7")
    finally:
        del os.environ["RANK_MARKER"]
    assert err.count(fork_server.FORKED_LINE) == 2, err
    for rank in (0, 1):
        assert f"[default{rank}]:name __main__ argv ['7'] cwd {tmp_path}" in out
        assert f"[default{rank}]:rank {rank} of 2 marker this job's" in out
        assert f"[default{rank}]:scalerepro imported before []" in out  # the job's code, not the server's
        assert f"[default{rank}]:torch preloaded True" in out
        assert f"[default{rank}]:ps shows {sys.executable} -m rank_program 7" in out  # not the server's command line
        assert f"[default{rank}]:to stderr" in err
    assert code == 7 and [(f["rank"], f["exit_code"]) for f in failures] == [(0, 7)]
    # killed by a signal: as a new process killed so
    code, failures, _, _ = _run_local(capsys, 1, "kill")
    assert code == 128 + signal.SIGKILL and failures[0]["signal"] == "SIGKILL"


def test_a_forked_rank_gets_sigterm_when_its_launcher_dies_however_it_dies(server, tmp_path):
    stopped = tmp_path / "stopped"
    launcher = subprocess.Popen([sys.executable, "-m", "scalerepro.launching.launch", "--", "-m", "rank_program", "wait", str(stopped)], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not Path(f"{stopped}.started").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, "the rank did not start"
        time.sleep(0.05)
    launcher.kill()  # SIGKILL: the launcher forwards nothing
    launcher.wait()
    while not stopped.exists():
        assert time.monotonic() < deadline, "the rank outlived its launcher"
        time.sleep(0.05)
    assert stopped.read_text() == "SIGTERM"


def test_a_rank_whose_environment_differs_in_what_torch_reads_at_import_starts_as_a_new_process(server, capsys, monkeypatch):
    # read when oneDNN loads (the server's would stay): a value the server's environment has not
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") != "SSE41" else "AVX2")
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and "[default0]:torch preloaded False" in out
    assert "rank 0 starts as a new process: its environment differs from the fork server's in ONEDNN_MAX_CPU_ISA" in err
    # the thread counts differ from rank to rank, and each rank sets its own (torch.set_num_threads)
    assert fork_server.import_time_differences({"OMP_NUM_THREADS": "1", "PATH": "/a"}, {"OMP_NUM_THREADS": "2", "PATH": "/b"}) == []
    assert fork_server.import_time_differences({"LD_PRELOAD": "x.so"}, {}) == ["LD_PRELOAD"]


def test_the_same_interpreter_by_another_name_is_served_and_another_environment_is_not():
    """The CI study's ranks all started as new processes: Snakemake ran as .venv/bin/python3, the
    jobs' launchers as .venv/bin/python, one interpreter in one environment by two names."""
    folder = Path(sys.executable).parent
    other_name = next((folder / name for name in ("python3", "python") if (folder / name).exists() and folder / name != Path(sys.executable)), None)
    if other_name is None:
        pytest.skip(f"{folder} has one name for its Python")
    request = {"executable": str(other_name), "prefix": sys.prefix, "program": ["-m", "rank_program"], "env": dict(os.environ)}
    assert fork_server.refusal(request, dict(os.environ)) is None
    assert fork_server.refusal({**request, "prefix": "/another/venv"}, dict(os.environ)).startswith(f"its Python is {other_name} (/another/venv)")
    assert "-m module" in fork_server.refusal({**request, "program": ["script.py"]}, dict(os.environ))


def test_the_server_ends_with_its_owner_and_removes_its_socket(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(WORKFLOW))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    process, socket_path = fork_server.start(owner.pid, tmp_path / "fork_server.log")
    owner.wait()
    try:
        assert process.wait(timeout=60) == 0
        assert "its owner ended" in (tmp_path / "fork_server.log").read_text()
        # nothing left in /tmp by an owner that never called stop() (a Snakemake killed outright)
        assert not os.path.exists(os.path.dirname(socket_path))
    finally:
        fork_server.stop(process, socket_path)
