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
store's listening socket (``SCM_RIGHTS``). The server forks a monitor, which forks the rank and
sends back its pid; the rank becomes what ``python -m module args`` would be there: that
environment (``os.environ``, so ``putenv``), that directory first on ``sys.path``, ``sys.argv``
and the command line ``ps`` shows (setproctitle), the pipes as fds 1 and 2, no scalerepro module
imported, default signal handlers, and the module run as ``__main__``; it exits with the code
Python would, after the exit handlers. The launcher's handle (``ForkedRank``) answers as a
``subprocess.Popen`` does (poll, returncode, send_signal), so the launcher treats both kinds of
rank alike.

Exit status: the rank's parent is its monitor, which waits for it and sends its wait status to
the launcher, so the status does not depend on the server, which may end first (its owner's
end, ``stop``). Should the monitor itself die (killed), the launcher waits for the rank's end
(its pidfd) and reads it as exit 1, a failure, never a success: the status cannot be known.

A rank dies with its launcher as a new one does (there ``PR_SET_PDEATHSIG``): its monitor watches
the launcher's connection and sends the rank SIGTERM when it closes, whatever ended the launcher;
the trainer's handler writes its record and leaves.

Who may use it: the socket lives in a folder of its own made by ``start`` (``mkdtemp``: a random
name, mode 0700). Both sides check the other before anything passes: the server serves only in
such a folder and only clients of its own user (``SO_PEERCRED``); the launcher uses a socket only
in a folder owned by its user and closed to group and others, and only a server of its own user,
before it sends the environment (tokens too) or descriptors. A socket that fails a check, or
names nothing (a stale ``SOCKET_ENV``), is not used: the rank starts as a new process and the
log says why. A bad client (gone before the reply, a malformed request) is refused with one line
in the server's log; the server goes on serving the others.

What it refuses (the launcher then starts the rank as a new process and says why in the log):
another Python interpreter or environment (``sys.prefix``), a program that is not ``-m module``, and an environment that differs
from the server's in any variable read when a library loads (``IMPORT_TIME_PREFIXES``: torch's,
oneDNN's, OpenMP's, MKL's, Python's, the dynamic loader's) other than the thread counts, which
each rank sets again itself (``torch.set_num_threads``). Forked ranks are for CPU studies: a
process that forks after initialising CUDA leaves its children without it, so the workflow
starts the server only where the ranks train on the CPU.

Lifetime: the workflow's ``onstart`` hook starts it (``start_for_jobs``, which also removes any
inherited ``SOCKET_ENV`` when the server is off), its ``onsuccess`` and ``onerror`` hooks stop it
(``stop``), and it ends by itself when its owner (the Snakemake process) does.

This module's client side imports no torch: the launcher must start fast.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import json
import os
import runpy
import select
import selectors
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import ownership_problem
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
# A forked rank whose wait status cannot be known (its monitor was killed): a failure, never 0
UNKNOWN_EXIT_CODE = 1
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid (SO_PEERCRED)


# What the launcher prints of each rank the server forked (benchmarks count these lines)
FORKED_LINE = "forked by the study's fork server"


class ForkServerError(CommandError):
    """The fork server cannot start a rank, or cannot serve; the message says why."""


# ---- Who may use the socket: both sides' checks ------------------------------------------------


def folder_problem(socket_path: str) -> str | None:
    """Why the folder of ``socket_path`` is not private to this user, or None: only a folder
    owned by this user and closed to group and others keeps another user from binding (or
    binding again, after the server ended) a socket of that name."""
    folder = os.path.dirname(os.path.abspath(socket_path))
    try:
        info = os.lstat(folder)  # the folder itself, never where a link points
    except OSError as error:
        return f"its folder {folder} cannot be read ({error.strerror}; a stale {SOCKET_ENV}?)"
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a folder"
    problem = ownership_problem(folder, info, 0o077)
    return None if problem is None else f"its folder {problem}"


def peer_uid(connection: socket.socket) -> int:
    """The user of the process at the other end of a connected Unix socket (the kernel's word)."""
    _pid, uid, _gid = _UCRED.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


@dataclasses.dataclass(frozen=True)
class RankRequest:
    """What a launcher asks the server for: ``executable program`` in ``env`` and ``cwd``, with
    the rendezvous store's socket handed over when ``pass_fd``."""

    executable: str
    prefix: str
    program: list[str]
    env: dict[str, str]
    cwd: str
    pass_fd: bool

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def parse(cls, message: bytes) -> RankRequest:
        """The request in ``message``; ValueError (or RecursionError, for nesting too deep) naming
        what is wrong when it is not one: a client's bytes are data until checked."""
        fields = json.loads(message)
        if not isinstance(fields, dict):
            raise ValueError(f"a request is a JSON object, not {type(fields).__name__}")
        names = {field.name for field in dataclasses.fields(cls)}
        if set(fields) != names:
            raise ValueError(f"a request has the fields {', '.join(sorted(names))}, not {', '.join(sorted(map(str, fields)))}")
        strings = {name: fields[name] for name in ("executable", "prefix", "cwd")}
        if not all(isinstance(value, str) for value in strings.values()) or not isinstance(fields["pass_fd"], bool):
            raise ValueError("a request's executable, prefix and cwd are strings, and its pass_fd true or false")
        program, env = fields["program"], fields["env"]
        if not isinstance(program, list) or not all(isinstance(item, str) for item in program):
            raise ValueError("a request's program is a list of strings")
        if not isinstance(env, dict) or not all(isinstance(value, str) for value in env.values()):
            raise ValueError("a request's env maps names to strings")
        return cls(**fields)


# ---- The launcher's side ----------------------------------------------------------------------


def import_time_differences(request_env: Mapping[str, str], server_env: Mapping[str, str]) -> list[str]:
    """The variables read when a library loads whose values differ between the two environments."""
    names = {name for name in (*request_env, *server_env) if name.startswith(IMPORT_TIME_PREFIXES) and name not in THREAD_VARIABLES}
    return sorted(name for name in names if request_env.get(name) != server_env.get(name))


def _reported_exit_code(message: bytes) -> int | None:
    """The exit code in a monitor's ``{"status": <wait status>}``, None for anything else."""
    with contextlib.suppress(ValueError, RecursionError):
        status = json.loads(message).get("status") if message else None
        if isinstance(status, int):
            return os.waitstatus_to_exitcode(status)
    return None


class ForkedRank:
    """A rank forked by the server, answering what the launcher asks of the ``subprocess.Popen``
    of a new one (pid, poll, returncode, send_signal, stdout, stderr)."""

    def __init__(self, pid: int, connection: socket.socket, stdout_fd: int, stderr_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._connection: socket.socket | None = connection  # the monitor's reports; None once closed
        connection.setblocking(False)
        # the rank itself, for its signals and its end (never another process that reuses the pid)
        self._process: int | None = None
        with contextlib.suppress(ProcessLookupError):  # ended already: its monitor reports how
            self._process = os.pidfd_open(pid)
        self.stdout = open(stdout_fd, errors="replace", buffering=1)  # noqa: SIM115 - the launcher's pumps read and close it
        self.stderr = open(stderr_fd, errors="replace", buffering=1)  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None and self._connection is not None:
            try:
                message = self._connection.recv(MESSAGE_MAX)
            except BlockingIOError:
                return None
            except OSError:
                message = b""
            code = _reported_exit_code(message)
            self._connection.close()
            self._connection = None
            if code is not None:
                self._finish(code)
        if self.returncode is None and self._connection is None and self._has_ended():
            # the monitor ended without a status (killed): what the rank's code was is unknown
            print(
                f"scalerepro.launching.fork_server: pid {self.pid} ended and its exit status is unknown "
                f"(its monitor ended first): read as exit {UNKNOWN_EXIT_CODE}, a failure",
                file=sys.stderr,
                flush=True,
            )
            self._finish(UNKNOWN_EXIT_CODE)
        return self.returncode

    def _has_ended(self) -> bool:
        return self._process is None or bool(select.select([self._process], [], [], 0)[0])

    def _finish(self, code: int) -> None:
        self.returncode = code
        if self._process is not None:
            os.close(self._process)
            self._process = None

    def send_signal(self, signum: int) -> None:
        if self.poll() is None and self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._process, signum)


def pidfd_problem() -> str | None:
    """Why this system cannot watch a rank through a pidfd (``pidfd_open``: Linux 5.3 and later,
    which a RHEL 8 login node's 4.18 kernel is not), or None. Both sides need it: without it the
    server is not started and a launcher asks none, and ranks start as new processes."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as error:
        return f"this system has no pidfd_open ({error}), which a forked rank's watch needs: ranks start as new processes"
    return None


def fork_rank(socket_path: str, program: Sequence[str], env: Mapping[str, str], pass_fd: int | None = None) -> ForkedRank:
    """Ask the server at ``socket_path`` for a rank running ``python program`` in ``env`` here,
    with its stdout and stderr piped back and ``pass_fd`` (the store's socket) handed over; raise
    ForkServerError with the reason when it will not, or when the socket is not one this user's
    own server serves in a private folder (then nothing is sent)."""
    problem = pidfd_problem() or folder_problem(socket_path)
    if problem is not None:
        raise ForkServerError(f"the fork server at {socket_path} is not used: {problem}")
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.settimeout(REPLY_TIMEOUT_S)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        try:
            connection.connect(socket_path)
            uid = peer_uid(connection)
            if uid != os.getuid():
                raise ForkServerError(f"the fork server at {socket_path} is not used: it is run by uid {uid}, not this user (uid {os.getuid()})")
            request = RankRequest(sys.executable, sys.prefix, list(program), dict(env), os.getcwd(), pass_fd is not None)
            socket.send_fds(connection, [request.encode()], [out_write, err_write, *([pass_fd] if pass_fd is not None else [])])
            reply = json.loads(connection.recv(MESSAGE_MAX) or b"{}")
        finally:
            os.close(out_write)
            os.close(err_write)
        pid = reply.get("pid") if isinstance(reply, dict) else None
        if not isinstance(pid, int) or pid <= 0:
            reason = reply.get("refused") if isinstance(reply, dict) else None
            raise ForkServerError(" ".join(str(reason or "the fork server closed the connection without starting the rank").split()))
        connection.settimeout(None)
        return ForkedRank(pid, connection, out_read, err_read)
    except BaseException as error:
        connection.close()
        os.close(out_read)
        os.close(err_read)
        if isinstance(error, OSError | ValueError | RecursionError):
            raise ForkServerError(f"the fork server at {socket_path} did not answer ({error})") from None
        raise


# ---- The workflow's side ----------------------------------------------------------------------


def start(owner_pid: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the server for the process ``owner_pid`` (Snakemake), logging to ``log_path``; return
    it and its socket's path once the socket is bound (the server imports torch after that, so
    the first rank asked for waits for the imports a new process would have made)."""
    problem = pidfd_problem()
    if problem is not None:
        raise ForkServerError(f"the fork server is not started: {problem}")
    folder = tempfile.mkdtemp(prefix="scalerepro-fork-server-")  # a random name, mode 0700
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


def start_for_jobs(wanted: bool, owner_pid: int, log_path: Path) -> tuple[subprocess.Popen, str] | None:
    """For the workflow's onstart hook: when ``wanted``, start the server (``start``) and name its
    socket in this process's environment, which every job inherits; return it. A ``SOCKET_ENV``
    this process inherited (a shell's, an earlier Snakemake's) names no server of this
    invocation's and is removed either way, so a server that is off is off."""
    os.environ.pop(SOCKET_ENV, None)
    if not wanted:
        return None
    try:
        server = start(owner_pid, log_path)
    except ForkServerError as error:
        print(f"scalerepro: {error}", file=sys.stderr)
        return None
    os.environ[SOCKET_ENV] = server[1]
    return server


def stop(server: subprocess.Popen, socket_path: str) -> None:
    """End the server (the ranks it forked run on, their monitors reporting to their launchers)
    and remove its socket."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)


# ---- The server ---------------------------------------------------------------------------------


def refusal(request: RankRequest, server_env: Mapping[str, str]) -> str | None:
    """Why the server will not fork this request, or None."""
    # one interpreter in one environment, whatever the name it was started by (python, python3)
    if (os.path.realpath(request.executable), request.prefix) != (os.path.realpath(sys.executable), sys.prefix):
        return f"its Python is {request.executable} ({request.prefix}), the fork server's {sys.executable} ({sys.prefix})"
    if len(request.program) < 2 or request.program[0] != "-m":
        return f"the fork server runs `-m module` programs only, not {' '.join(request.program)!r}"
    differing = import_time_differences(request.env, server_env)
    if differing:
        return f"its environment differs from the fork server's in {', '.join(differing)}, read when a library loads"
    return None


def _exit_code(error: SystemExit) -> int:
    """The process exit code of ``sys.exit(code)``, as the interpreter makes it."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code & 0xFF  # what the parent sees, as of a new process
    print(error.code, file=sys.stderr)
    return 1


def _run_rank(request: RankRequest, fds: list[int]) -> NoReturn:
    """In the monitor's child: become ``python -m module args`` as the request describes, run it, exit."""
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, fds[0], fds[1]):
            os.close(fd)
        env = dict(request.env)
        if request.pass_fd:
            env[STORE_FD_ENV] = str(fds[2])
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request.cwd)
        sys.path[0] = request.cwd  # as `python -m` puts the working directory first
        for name in [name for name in sys.modules if name == "scalerepro" or name.startswith("scalerepro.")]:
            del sys.modules[name]  # the job's own checkout's code, imported afresh
        module, *args = request.program[1:]
        sys.argv = ["-m", *args]
        sys.executable = request.executable
        # what ps and top show: the command a new process would have had, not the server's
        sys.modules["setproctitle"].setproctitle(shlex.join([request.executable, *request.program]))
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


def _monitor_rank(request: RankRequest, fds: list[int], connection: socket.socket, server_fds: set[int]) -> NoReturn:
    """In the server's child: fork the rank, send the launcher its pid, stop it (SIGTERM) when the
    launcher's connection closes, and send its wait status when it ends. The rank's parent, so
    its status reaches the launcher whether or not the server still runs."""
    try:
        for fd in server_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGCHLD):  # the server's handler and its auto-reaping
            signal.signal(signum, signal.SIG_DFL)
        connection.settimeout(None)
        pid = os.fork()
        if pid == 0:
            connection.close()  # the launcher's end closes when the monitor's does
            _run_rank(request, fds)
        for fd in fds:
            os.close(fd)
        rank = os.pidfd_open(pid)
        print(f"fork server: pid {pid}: {' '.join(request.program[:2])} in {request.cwd}", flush=True)
        watched = [rank, connection.fileno()]
        try:
            connection.send(json.dumps({"pid": pid}).encode())
        except OSError as error:
            print(f"fork server: pid {pid}: its launcher was gone before the reply ({error}): stopped", flush=True)
            watched.remove(connection.fileno())
            os.kill(pid, signal.SIGTERM)
        while rank not in (ready := select.select(watched, [], [])[0]):
            if connection.fileno() in ready:  # the launcher sends nothing more: it closed, it ended
                watched.remove(connection.fileno())
                os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):  # unless the launcher is gone
            connection.send(json.dumps({"status": status}).encode())
    finally:
        os._exit(0)


class _Refused(Exception):
    """A request the server will not fork; the message says why."""


def _receive(connection: socket.socket, server_env: Mapping[str, str], fds: list[int]) -> RankRequest:
    """The request on ``connection``, its descriptors appended to ``fds``; _Refused, ValueError,
    RecursionError or OSError when it is not one to fork."""
    uid = peer_uid(connection)
    if uid != os.getuid():
        raise _Refused(f"another user's request (uid {uid})")  # nothing of it read
    connection.settimeout(REQUEST_TIMEOUT_S)
    message, received, flags, _address = socket.recv_fds(connection, MESSAGE_MAX, 3)
    fds.extend(received)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise _Refused(f"a request over {MESSAGE_MAX} bytes or with more than 3 descriptors")
    request = RankRequest.parse(message)
    reason = refusal(request, server_env)
    if reason is None and len(fds) != 2 + request.pass_fd:
        reason = f"a request with {len(fds)} descriptors, not {2 + request.pass_fd}"
    if reason is not None:
        raise _Refused(reason)
    return request


def _serve_one(listener: socket.socket, server_env: Mapping[str, str], imports_set: Mapping[str, str], server_fds: set[int]) -> None:
    """Answer one client: fork its rank's monitor, or refuse it with one line in the log. Nothing
    a client sends, or its leaving, ends the server."""
    try:
        connection, _ = listener.accept()
    except OSError as error:
        print(f"fork server: a client left before it was accepted ({error})", flush=True)
        return
    fds: list[int] = []
    with connection:
        try:
            request = _receive(connection, server_env, fds)
            sys.stdout.flush()
            if os.fork() == 0:
                _monitor_rank(dataclasses.replace(request, env={**imports_set, **request.env}), fds, connection, server_fds)
            return
        except _Refused as refused:
            reason = str(refused)
        except (OSError, ValueError, RecursionError) as error:
            reason = f"an unreadable request or a failed fork ({type(error).__name__}: {error})"
        finally:
            for fd in fds:  # the monitor has its own copies
                os.close(fd)
        print(f"fork server: refused a request: {reason}", flush=True)
        with contextlib.suppress(OSError):  # unless the client is gone
            connection.send(json.dumps({"refused": reason}).encode())


def serve(socket_path: str, owner_pid: int) -> int:
    """Bind ``socket_path`` (in a private folder of this user's), import ``PRELOADED``, then fork
    a monitor and its rank for each request until the owner ends or SIGTERM comes; remove the
    socket at the end."""
    problem = folder_problem(socket_path)
    if problem is not None:
        raise ForkServerError(f"will not serve on {socket_path}: {problem}: give a socket in a folder of this user's with mode 0700")
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
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the monitors: the server waits for none
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(owner, selectors.EVENT_READ, "owner")
    # every descriptor of the server's, closed in each monitor it forks
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
                _serve_one(listener, server_env, imports_set, server_fds)
    finally:
        listener.close()
        # An owner killed outright never calls stop(); the server outlives it, so it clears its own
        # socket, and the private folder start() made for it once that is empty.
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
            os.rmdir(os.path.dirname(socket_path))


@error_boundary("scalerepro.launching.fork_server")
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog="scalerepro.launching.fork_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to serve on, in a folder of this user's with mode 0700")
    parser.add_argument("--owner", type=int, required=True, help="the process whose end ends the server (Snakemake's)")
    args = parser.parse_args(argv)
    return serve(args.socket, args.owner)


if __name__ == "__main__":
    sys.exit(main())
