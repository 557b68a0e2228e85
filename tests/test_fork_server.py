"""The fork server (scalerepro.launching.fork_server): a local rank forked from a process that
imported torch once must be what ``python -m module args`` would have been, die with its
launcher, fail as it would, and be refused (then started as a new process) where forking could
change what it runs. Real servers, real sockets, real processes; the trainer through it in
test_workflow's CI study."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from scalerepro.launching import fork_server, launch, rank_failure

WORKFLOW = Path(__file__).resolve().parents[1] / "workflow"

# Real servers that import torch before they fork (2-3 s a test): the slow tier.
pytestmark = pytest.mark.slow

# A rank's program: says what it sees, then exits with the code its first argument names (or
# kills itself with a signal, or waits for SIGTERM and writes where its second argument says, or
# writes its pid to <second argument>.started and exits 0 once the second argument exists).
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
    if what.isdigit() and os.environ["RANK"] != "0":
        # ends as it means to even when the launcher stops it after rank 0 failed; rank 0 waits for it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open("rank" + os.environ["RANK"] + ".ready", "w").close()
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
    if what == "until":
        open(sys.argv[2] + ".started", "w").write(str(os.getpid()))
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.02)
        sys.exit(0)
    while not all(os.path.exists(f"rank{rank}.ready") for rank in range(1, int(os.environ["WORLD_SIZE"]))):
        time.sleep(0.01)
    sys.exit(int(what) if os.environ["RANK"] == "0" else 0)
    """
)


@pytest.fixture
def rank_program(tmp_path, monkeypatch):
    """``-m rank_program`` runs RANK_MODULE, here in this test's folder."""
    monkeypatch.setenv("PYTHONPATH", str(WORKFLOW))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rank_program.py").write_text(RANK_MODULE)


@pytest.fixture
def server(rank_program, tmp_path, monkeypatch):
    """A fork server for this test, its socket named in the environment as the workflow's hook does."""
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
    request = fork_server.RankRequest(str(other_name), sys.prefix, ["-m", "rank_program"], dict(os.environ), os.getcwd(), False)
    assert fork_server.refusal(request, dict(os.environ)) is None
    assert fork_server.refusal(replace(request, prefix="/another/venv"), dict(os.environ)).startswith(f"its Python is {other_name} (/another/venv)")
    assert "-m module" in fork_server.refusal(replace(request, program=["script.py"]), dict(os.environ))


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


# ---- Who may use the socket ---------------------------------------------------------------------

NOBODY = 65534  # another user, whose process serves a socket where the launcher looks
# Listens on argv[1] as NOBODY (bound first, as this test's user, where only it may bind), and
# prints, once its stdin closes, the length of what each client sent (0: connected, sent nothing).
OTHER_USERS_LISTENER = textwrap.dedent(
    """
    import json, os, select, socket, sys
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[1])
    os.setuid(int(sys.argv[2]))  # before listen(): the credentials a client reads (SO_PEERCRED)
    listener.listen(8)
    print("listening", flush=True)
    received = []
    while True:
        ready = select.select([listener, sys.stdin], [], [])[0]
        if listener in ready:
            connection, _ = listener.accept()
            connection.settimeout(30)
            received.append(len(connection.recv(1 << 20)))
            connection.close()
        elif sys.stdin in ready:
            break
    print(json.dumps(received), flush=True)
    """
)


def _another_users_listener(socket_path: Path) -> subprocess.Popen:
    if os.getuid() != 0:
        pytest.skip("needs root, to serve a socket as another user")
    listener = subprocess.Popen(
        [sys.executable, "-c", OTHER_USERS_LISTENER, str(socket_path), str(NOBODY)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert listener.stdout.readline() == "listening\n"
    return listener


def _what_it_received(listener: subprocess.Popen) -> list[int]:
    out, _ = listener.communicate(timeout=60)
    return json.loads(out)


def test_a_socket_in_another_users_folder_is_never_dialled(rank_program, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    listener = _another_users_listener(folder / "socket")
    monkeypatch.setenv(fork_server.SOCKET_ENV, str(folder / "socket"))
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and "[default0]:torch preloaded False" in out  # a new process
    assert (
        f"rank 0 starts as a new process: the fork server at {folder}/socket is not used: its folder {folder} belongs to uid {NOBODY}, not to this user (uid 0): use one of your own\n"
        in err
    )
    assert _what_it_received(listener) == []  # not even a connection


def test_a_server_of_another_user_is_sent_nothing(rank_program, tmp_path, monkeypatch, capsys):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # this user's, mode 0700: only the peer is wrong
    listener = _another_users_listener(folder / "socket")
    monkeypatch.setenv(fork_server.SOCKET_ENV, str(folder / "socket"))
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and "[default0]:torch preloaded False" in out
    assert f"rank 0 starts as a new process: the fork server at {folder}/socket is not used: it is run by uid {NOBODY}, not this user (uid 0)\n" in err
    assert _what_it_received(listener) == [0]  # connected, and closed with nothing sent


def test_a_socket_folder_open_to_group_or_others_is_not_used(server, capsys):
    folder = Path(os.environ[fork_server.SOCKET_ENV]).parent
    folder.chmod(0o750)
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and "[default0]:torch preloaded False" in out
    assert (
        f"rank 0 starts as a new process: the fork server at {folder}/socket is not used: its folder {folder} has mode 750, open to group or others: chmod 700 {folder}\n"
        in err
    )
    folder.chmod(0o700)  # the same server, in its private folder again, serves
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and fork_server.FORKED_LINE in err and "[default0]:torch preloaded True" in out


def _forked_pids(log: Path) -> list[str]:
    return re.findall(r"fork server: pid (\d+): -m rank_program", log.read_text())


def test_with_the_fork_server_off_the_jobs_dial_no_inherited_socket(server, tmp_path, capsys, monkeypatch):
    # a live server's socket, inherited by a Snakemake whose config turns the fork server off
    assert fork_server.start_for_jobs(False, os.getpid(), tmp_path / "unused.log") is None
    assert fork_server.SOCKET_ENV not in os.environ
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and "[default0]:torch preloaded False" in out
    assert fork_server.FORKED_LINE not in err and "starts as a new process" not in err  # not asked at all
    assert _forked_pids(tmp_path / "fork_server.log") == [] and not (tmp_path / "unused.log").exists()
    # a stale name, its server gone: the rank starts as a new process, and the log says why
    gone = tmp_path / "scalerepro-fork-server-gone" / "socket"
    monkeypatch.setenv(fork_server.SOCKET_ENV, str(gone))
    code, _, _, err = _run_local(capsys, 1, "0")
    assert code == 0
    assert (
        f"rank 0 starts as a new process: the fork server at {gone} is not used: its folder {gone.parent} cannot be read (No such file or directory; a stale {fork_server.SOCKET_ENV}?)\n"
        in err
    )


def test_without_pidfd_open_no_server_starts_and_no_launcher_asks_one(server, tmp_path, capsys, monkeypatch):
    """A kernel before Linux 5.3 (a RHEL 8 login node's 4.18) has no pidfd_open, which a forked
    rank's monitor and launcher need: the server is not started and a launcher sends nothing, so
    the ranks start as new processes instead of being forked and then lost track of."""

    def no_pidfd_open(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd_open)
    with pytest.raises(fork_server.ForkServerError, match="no pidfd_open"):
        fork_server.start(os.getpid(), tmp_path / "never.log")
    assert not (tmp_path / "never.log").exists()
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and "[default0]:torch preloaded False" in out and "no pidfd_open" in err
    assert _forked_pids(tmp_path / "fork_server.log") == []


# ---- Bad clients ------------------------------------------------------------------------------


def _client(socket_path: str, message: bytes, fds: Sequence[int] = ()) -> None:
    """Connect, send ``message`` (and ``fds``), and leave before the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.connect(socket_path)
        socket.send_fds(connection, [message], list(fds))


def test_bad_clients_are_refused_one_line_each_and_the_server_serves_the_next(server, tmp_path, capsys):
    socket_path = os.environ[fork_server.SOCKET_ENV]
    request = fork_server.RankRequest(sys.executable, sys.prefix, ["-m", "rank_program", "0"], dict(os.environ), str(tmp_path), False)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    server.send_signal(signal.SIGSTOP)  # every client below has gone before the server reads it
    try:
        for message in (b"[]", b"\xff\x00 not JSON", b"[" * 100_000, json.dumps({"program": 5}).encode()):
            _client(socket_path, message)
        _client(socket_path, replace(request, program=["script.py"]).encode())  # refused, its reply unsendable
        _client(socket_path, request.encode(), [out_write, err_write])  # forked, its pid unsendable
    finally:
        server.send_signal(signal.SIGCONT)
    for fd in (out_read, out_write, err_read, err_write):
        os.close(fd)
    code, _, out, err = _run_local(capsys, 1, "0")
    assert code == 0 and fork_server.FORKED_LINE in err and "[default0]:torch preloaded True" in out
    assert server.poll() is None
    log = (tmp_path / "fork_server.log").read_text()
    refused = [line for line in log.splitlines() if "refused a request" in line]
    assert [line.split(": ", 2)[2].split(" (")[0] for line in refused] == [
        "an unreadable request or a failed fork",
        "an unreadable request or a failed fork",
        "an unreadable request or a failed fork",
        "an unreadable request or a failed fork",
        "the fork server runs `-m module` programs only, not 'script.py'",
    ], log
    assert "a request is a JSON object, not list" in refused[0] and "RecursionError" in refused[2] and "a request has the fields" in refused[3]
    assert len(re.findall(r"pid \d+: its launcher was gone before the reply", log)) == 1 and "Traceback" not in log, log


# ---- Exit status --------------------------------------------------------------------------------


def _launcher_waiting(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path, int]:
    """A launcher of one forked rank that exits 0 once ``tmp_path/name`` exists; it, that file and the rank's pid."""
    release = tmp_path / name
    launcher = subprocess.Popen(
        [sys.executable, "-m", "scalerepro.launching.launch", "--", "-m", "rank_program", "until", str(release)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = Path(f"{release}.started")
    deadline = time.monotonic() + 60
    while not (started.exists() and started.read_text()):
        assert launcher.poll() is None and time.monotonic() < deadline, "the rank did not start"
        time.sleep(0.05)
    return launcher, release, int(started.read_text())


def test_a_rank_that_ends_after_its_server_stopped_reads_as_its_own_exit_status(server, tmp_path):
    exits_0, release, _ = _launcher_waiting(tmp_path, "release")
    killed, _, killed_pid = _launcher_waiting(tmp_path, "never")
    try:
        fork_server.stop(server, os.environ[fork_server.SOCKET_ENV])
        release.touch()
        assert exits_0.wait(timeout=60) == 0, exits_0.stdout.read()
        os.kill(killed_pid, signal.SIGKILL)
        assert killed.wait(timeout=60) == 128 + signal.SIGKILL
        for launcher in (exits_0, killed):
            output = launcher.stdout.read()
            assert fork_server.FORKED_LINE in output and "exit status is unknown" not in output, output
    finally:
        for launcher in (exits_0, killed):  # its monitor then stops its rank
            launcher.kill()
            launcher.wait()


def test_a_rank_whose_status_cannot_be_known_reads_as_a_failure_once_it_ends(server, tmp_path, capsys):
    release = tmp_path / "release"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    rank = fork_server.fork_rank(os.environ[fork_server.SOCKET_ENV], ["-m", "rank_program", "until", str(release)], env)
    try:
        started = Path(f"{release}.started")
        deadline = time.monotonic() + 60
        while not (started.exists() and started.read_text()):
            assert rank.poll() is None and time.monotonic() < deadline, "the rank did not start"
            time.sleep(0.05)
        monitor = int(Path(f"/proc/{rank.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(monitor, signal.SIGKILL)  # the rank's parent, which alone can know its status
        while Path(f"/proc/{monitor}").exists():  # reaped by the server
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(5):
            assert rank.poll() is None  # it runs on: still signalled, still waited for
            time.sleep(0.05)
        release.touch()
        while rank.poll() is None:
            assert time.monotonic() < deadline, "the rank's end was not seen"
            time.sleep(0.05)
        assert rank.returncode == fork_server.UNKNOWN_EXIT_CODE != 0
        assert f"pid {rank.pid} ended and its exit status is unknown (its monitor ended first): read as exit 1, a failure" in capsys.readouterr().err
    finally:
        release.touch()
        rank.stdout.close()
        rank.stderr.close()
