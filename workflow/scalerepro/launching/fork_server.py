"""A fork server for the local ranks of a study: one process per Snakemake invocation imports torch
once, and each local rank is forked from it rather than started as a new Python.

    python -m scalerepro.launching.fork_server --socket DIR/socket --owner PID

Why: a rank's imports cost more than most of what it measures on a small CPU. On a 2-core Xeon
``import torch`` takes 2.0-2.3 s and ``torch._dynamo``, which every optimizer's constructor
imports (``Optimizer.add_param_group`` is wrapped in ``torch._disable_dynamo``), 1.6-1.8 s more;
the README study's 26 jobs paid them in each rank, and on a slower machine they grow with it
(benchmarks/README.md, "The README study slowed"). A rank forked from a process that has
imported them trains as fast as a new one, and its job ends sooner: a two-rank CNN job took
4.04 s forked against 6.37 s started anew here (benchmarks/fork_server_bench.py; the journal).

What it preloads (``PRELOADED``) is torch and libraries of the environment only, never
scalerepro: a rank imports the package afresh, so it runs the code of the checkout its job was
planned with.

How a rank starts: the local launcher (``scalerepro.launching.launch.run_local``) connects to the
socket that ``SOCKET_ENV`` names and sends the rank's program (``-m module args``), environment,
working directory and Python, with its stdout and stderr pipes and, for rank 0, the rendezvous
store's listening socket (``SCM_RIGHTS``). The server forks; the child becomes what
``python -m module args`` would be there: that environment (``os.environ``, so ``putenv``), that
directory first on ``sys.path``, ``sys.argv`` and the command line ``ps`` shows (setproctitle),
the pipes as fds 1 and 2, no scalerepro module imported, default signal handlers, and the module
run as ``__main__``; it exits with the code
Python would, after the exit handlers. The server sends back the child's pid, then its wait
status when it ends. The launcher's handle (``ForkedRank``) answers as a ``subprocess.Popen``
does (poll, returncode, send_signal), so the launcher treats both kinds of rank alike.

A rank dies with its launcher as a new one does (there ``PR_SET_PDEATHSIG``): the child watches
the launcher's connection and sends itself SIGTERM when it closes, whatever ended the launcher;
the trainer's handler writes its record and leaves.

What it refuses (the launcher then starts the rank as a new process and says why in the log):
another Python interpreter or environment (``sys.prefix``), a program that is not ``-m module``, and an environment that differs
from the server's in any variable read when a library loads (``IMPORT_TIME_PREFIXES``: torch's,
oneDNN's, OpenMP's, MKL's, Python's, the dynamic loader's) other than the thread counts, which
each rank sets again itself (``torch.set_num_threads``). Forked ranks are for CPU studies: a
process that forks after initialising CUDA leaves its children without it, so the workflow
starts the server only where the ranks train on the CPU.

Lifetime: the workflow's ``onstart`` hook starts it (``start``), its ``onsuccess`` and
``onerror`` hooks stop it (``stop``), and it ends by itself when its owner (the Snakemake
process) does. The socket lives in a directory of its own, mode 0700, and the server takes
requests only from its own user (``SO_PEERCRED``).

This module's client side imports no torch: the launcher must start fast.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalerepro.common.cli import OneLineErrorParser, error_boundary
from scalerepro.schedulers.base import STORE_FD_ENV
from scalerepro.schedulers.cores import THREAD_VARIABLES

SOCKET_ENV = "SCALEREPRO_FORK_SERVER"  # the server's socket, in every job's environment
# Imported once by the server: torch and what every rank imports of the environment, never
# scalerepro. Not torchvision: where its compiled operators cannot load, only scalerepro's
# import of it (scalerepro.models._torchvision) succeeds.
PRELOADED = ("torch", "torch._dynamo", "torch.distributed", "torch.utils.data", "numpy")
# Variables a library reads when it loads (so a child would keep the server's value): a request
# whose environment differs from the server's in one of them is refused.
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "ATEN_", "ONEDNN_", "DNNL_", "MKL", "KMP_", "OMP_", "GOMP_", "OPENBLAS", "PYTHON", "LD_")
MESSAGE_MAX = 1 << 20  # bytes of one request: a rank's environment and arguments
READY_TIMEOUT_S = 10.0  # how long ``start`` waits for the socket to be bound (before the imports)
# How long a launcher waits for the rank's pid (the first waits for the server's imports, 4 s
# here, 20 s under a fifth of the cores), and the server for a request: then the rank starts as a
# new process, and the server serves the next.
REPLY_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 30.0


# What the launcher prints of each rank the server forked (benchmarks count these lines)
FORKED_LINE = "forked by the study's fork server"


class ForkServerError(RuntimeError):
    """The fork server cannot start a rank; the message says why."""


# ---- The launcher's side ----------------------------------------------------------------------


def import_time_differences(request_env: Mapping[str, str], server_env: Mapping[str, str]) -> list[str]:
    """The variables read when a library loads whose values differ between the two environments."""
    names = {name for name in (*request_env, *server_env) if name.startswith(IMPORT_TIME_PREFIXES) and name not in THREAD_VARIABLES}
    return sorted(name for name in names if request_env.get(name) != server_env.get(name))


class ForkedRank:
    """A rank forked by the server, answering what the launcher asks of the ``subprocess.Popen``
    of a new one (pid, poll, returncode, send_signal, stdout, stderr)."""

    def __init__(self, pid: int, connection: socket.socket, stdout_fd: int, stderr_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._connection = connection
        self.stdout = open(stdout_fd, errors="replace", buffering=1)  # noqa: SIM115 - the launcher's pumps read and close it
        self.stderr = open(stderr_fd, errors="replace", buffering=1)  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None:
            self._connection.setblocking(False)
            try:
                message = self._connection.recv(MESSAGE_MAX)
            except BlockingIOError:
                return None
            # the server sends the wait status; with none it ended first (its owner died), and
            # the rank's code is unknown: a failure, never a success
            status = json.loads(message).get("status") if message else None
            self.returncode = os.waitstatus_to_exitcode(status) if status is not None else 1
            self._connection.close()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


def fork_rank(socket_path: str, program: Sequence[str], env: Mapping[str, str], pass_fd: int | None = None) -> ForkedRank:
    """Ask the server at ``socket_path`` for a rank running ``python program`` in ``env`` here,
    with its stdout and stderr piped back and ``pass_fd`` (the store's socket) handed over; raise
    ForkServerError with the server's reason when it will not."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    connection.settimeout(REPLY_TIMEOUT_S)
    try:
        connection.connect(socket_path)
        request = {
            "executable": sys.executable,
            "prefix": sys.prefix,
            "program": list(program),
            "env": dict(env),
            "cwd": os.getcwd(),
            "pass_fd": pass_fd is not None,
        }
        socket.send_fds(connection, [json.dumps(request).encode()], [out_write, err_write, *([pass_fd] if pass_fd is not None else [])])
        reply = json.loads(connection.recv(MESSAGE_MAX) or b"{}")
    except (OSError, ValueError) as error:
        connection.close()
        for fd in (out_read, err_read):
            os.close(fd)
        raise ForkServerError(f"the fork server at {socket_path} did not answer ({error})") from None
    finally:
        os.close(out_write)
        os.close(err_write)
    if "pid" not in reply:
        connection.close()
        for fd in (out_read, err_read):
            os.close(fd)
        raise ForkServerError(reply.get("refused", "the fork server closed the connection without starting the rank"))
    connection.settimeout(None)
    return ForkedRank(int(reply["pid"]), connection, out_read, err_read)


# ---- The workflow's side ----------------------------------------------------------------------


def start(owner_pid: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the server for the process ``owner_pid`` (Snakemake), logging to ``log_path``; return
    it and its socket's path once the socket is bound (the server imports torch after that, so
    the first rank asked for waits for the imports a new process would have made)."""
    folder = tempfile.mkdtemp(prefix="scalerepro-fork-server-")  # mode 0700
    socket_path = os.path.join(folder, "socket")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "scalerepro.launching.fork_server", "--socket", socket_path, "--owner", str(owner_pid)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not os.path.exists(socket_path):
        if server.poll() is not None or time.monotonic() > deadline:
            stop(server, socket_path)
            raise ForkServerError(f"the fork server did not start (see {log_path}): ranks start as new processes")
        time.sleep(0.02)
    return server, socket_path


def stop(server: subprocess.Popen, socket_path: str) -> None:
    """End the server (ranks it forked keep running until their launchers end them) and remove its socket."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)


# ---- The server ---------------------------------------------------------------------------------


def refusal(request: Mapping, server_env: Mapping[str, str]) -> str | None:
    """Why the server will not fork this request, or None."""
    # one interpreter in one environment, whatever the name it was started by (python, python3)
    executable = request.get("executable") or ""
    if (os.path.realpath(executable), request.get("prefix")) != (os.path.realpath(sys.executable), sys.prefix):
        return f"its Python is {executable} ({request.get('prefix')}), the fork server's {sys.executable} ({sys.prefix})"
    program = request.get("program") or []
    if len(program) < 2 or program[0] != "-m":
        return f"the fork server runs `-m module` programs only, not {' '.join(program)!r}"
    differing = import_time_differences(request.get("env", {}), server_env)
    if differing:
        return f"its environment differs from the fork server's in {', '.join(differing)}, read when a library loads"
    return None


def _same_user(connection: socket.socket) -> bool:
    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid()


def _exit_code(error: SystemExit) -> int:
    """The process exit code of ``sys.exit(code)``, as the interpreter makes it."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _run_rank(request: Mapping, fds: list[int], connection: socket.socket, server_fds: set[int]) -> None:
    """In the forked child: become ``python -m module args`` as the request describes, run it, exit."""
    code = 1
    try:
        for fd in server_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, fds[0], fds[1]):
            os.close(fd)
        env = dict(request["env"])
        if request.get("pass_fd"):
            env[STORE_FD_ENV] = str(fds[2])
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        for name in [name for name in sys.modules if name == "scalerepro" or name.startswith("scalerepro.")]:
            del sys.modules[name]  # the job's own checkout's code, imported afresh

        connection.settimeout(None)

        def stop_with_launcher() -> None:
            with contextlib.suppress(OSError):
                connection.recv(1)  # the launcher sends nothing more: this returns when it closes
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=stop_with_launcher, daemon=True).start()
        module, *args = request["program"][1:]
        sys.argv = ["-m", *args]
        sys.executable = request["executable"]
        # what ps and top show: the command a new process would have had, not the server's
        sys.modules["setproctitle"].setproctitle(shlex.join([request["executable"], *request["program"]]))
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as error:
            code = _exit_code(error)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 128 + signal.SIGINT
        except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the exit code
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def serve(socket_path: str, owner_pid: int) -> int:
    """Bind ``socket_path``, import ``PRELOADED``, then fork a rank for each request until the
    owner ends or SIGTERM comes; remove the socket at the end."""
    # First, while the process's environment is where the kernel put it: setproctitle finds the
    # command line's memory from it (a child, whose environment is replaced, would not), and a
    # child retitles itself there (the rank's own command).
    # A training-side dependency, imported by the server only, never where the workflow parses.
    titles = importlib.import_module("setproctitle")
    titles.setproctitle(titles.getproctitle())  # it claims that memory at its first title
    try:
        owner = os.pidfd_open(owner_pid)  # before the imports: the owner may end during them
    except ProcessLookupError:
        print(f"fork server: its owner (pid {owner_pid}) had ended", flush=True)
        return 0
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(64)
    started = time.monotonic()
    server_env = dict(os.environ)  # what a request's is compared with: before the imports change it
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError as error:
            print(f"fork server: not preloaded: {name} ({error})", flush=True)
    print(f"fork server: {', '.join(PRELOADED)} imported in {time.monotonic() - started:.2f} s; serving on {socket_path}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # a ^C reaches the ranks and their launchers (one process group); the server outlives it until its owner ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(owner, selectors.EVENT_READ, "owner")
    # every descriptor of the server's, closed in each child it forks
    server_fds = {listener.fileno(), owner, selector.fileno()}
    # what the imports set in the environment (torch: TORCHINDUCTOR_CACHE_DIR), as they would have
    # in a new process started with the request's environment, which agrees in what they read
    imports_set = {name: value for name, value in os.environ.items() if server_env.get(name) != value}
    try:
        while True:
            for key, _events in selector.select():
                if key.data == "owner":
                    print("fork server: its owner ended", flush=True)
                    return 0
                if key.data == "request":
                    connection, _ = listener.accept()
                    child = _start_child(connection, server_env, imports_set, server_fds)
                    if child is not None:
                        pidfd, pid = child
                        server_fds |= {connection.fileno(), pidfd}
                        selector.register(pidfd, selectors.EVENT_READ, (pid, connection))
                    continue
                pid, connection = key.data
                selector.unregister(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # unless the launcher is gone
                    connection.send(json.dumps({"status": status}).encode())
                server_fds -= {connection.fileno(), key.fd}
                os.close(key.fd)
                connection.close()
    finally:
        listener.close()
        # An owner killed outright never calls stop(); the server outlives it, so it clears its own
        # socket, and the private folder start() made for it once that is empty.
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
            os.rmdir(os.path.dirname(socket_path))


def _start_child(connection: socket.socket, server_env: Mapping[str, str], imports_set: Mapping[str, str], server_fds: set[int]) -> tuple[int, int] | None:
    """Fork the rank ``connection`` asks for; its pidfd and pid, or None when refused."""
    fds: list[int] = []
    connection.settimeout(REQUEST_TIMEOUT_S)
    try:
        message, fds, _flags, _address = socket.recv_fds(connection, MESSAGE_MAX, 3)
        request = json.loads(message)
        reason = "another user's request" if not _same_user(connection) else refusal(request, server_env)
    except (OSError, ValueError) as error:
        reason, request = f"an unreadable request ({error})", {}
    if reason is None and len(fds) != 2 + bool(request.get("pass_fd")):
        reason = f"a request with {len(fds)} descriptors"
    if reason is not None:
        with contextlib.suppress(OSError):
            connection.send(json.dumps({"refused": reason}).encode())
        for fd in fds:
            os.close(fd)
        connection.close()
        return None
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _run_rank({**request, "env": {**imports_set, **request["env"]}}, fds, connection, server_fds)
    for fd in fds:
        os.close(fd)
    print(f"fork server: pid {pid}: {' '.join(request['program'][:2])} in {request['cwd']}", flush=True)
    connection.send(json.dumps({"pid": pid}).encode())
    return os.pidfd_open(pid), pid


@error_boundary("scalerepro.launching.fork_server")
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog="scalerepro.launching.fork_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to serve on (its folder should be private)")
    parser.add_argument("--owner", type=int, required=True, help="the process whose end ends the server (Snakemake's)")
    args = parser.parse_args(argv)
    return serve(args.socket, args.owner)


if __name__ == "__main__":
    sys.exit(main())
