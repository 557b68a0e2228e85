"""Start the ranks of one job: on this machine, or as the job's scheduler starts them
(``scalerepro.schedulers``: on Slurm one srun task per node, each running torchrun).

    python -m scalerepro.launching.launch --nodes 2 --ranks-per-node 4 -- -m scalerepro.training.train --model cnn ...

Outside Slurm (no ``SLURM_JOB_ID``) the launcher starts the ranks of this one machine itself
(``run_local``), because torchrun's rendezvous store listens on every interface of the host and
a local run must be reachable from this machine only: the launcher binds the store's socket to
127.0.0.1, rank 0 serves the store on it (``scalerepro.training.distributed``), and gloo and NCCL bind
their sockets to the loopback interface. Like torchrun it stops the other ranks when one fails.
Inside a scheduler's job it runs the scheduler's launch command (``Scheduler.launch_command``),
whose task on each node (``--node-agent``) execs torchrun (``Scheduler.node_command``); the
network there is the cluster's: ``slurm.env`` names the interface NCCL and gloo use, e.g.
NCCL_SOCKET_IFNAME=ib0.

Failures: every rank's console line carries its local rank (torchrun ``--tee``) and, on Slurm,
its node task (srun ``--label``); this launcher passes the ranks' output through and keeps the
tail of each. When the ranks end without writing the run record (a rank killed in a collective
by NCCL's watchdog, torchrun or the OOM killer), it writes the failed record itself, with each
failed rank's exit code and those tails (``scalerepro.launching.rank_failure``).

Preemption: Slurm's warning signal (``--signal=USR1@T``) goes to every process of every job step
but not to the batch step, where the rule (and this launcher) runs. The node agent ignores
SIGUSR1 before exec'ing torchrun, so the agent survives it; the ranks install their own handler
(``scalerepro.training.trainer.StopRequest``), checkpoint and exit 75, and the job fails so that Snakemake
retries it, resuming from the checkpoint.

This module imports no torch: it must start fast and run where only the launch happens.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalerepro import schedulers
from scalerepro.common.cli import COUNT, CommandError, OneLineErrorParser, bounded_int, error_boundary
from scalerepro.common.exits import EXIT_PREEMPTED
from scalerepro.common.files import utc_now
from scalerepro.launching import fork_server, rank_failure
from scalerepro.schedulers import cores
from scalerepro.schedulers.base import LAUNCHER_ENV, LOCAL, STORE_FD_ENV, LaunchRequest, SchedulerError
from scalerepro.schedulers.slurm import RENDEZVOUS_PORT_SPAN

STOP_GRACE_S = 30.0  # after a rank failed, how long the others get to write a record before SIGKILL
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
DRIVER_CHECK_S = 1.0  # how often a local job looks for its driver
PR_SET_PDEATHSIG = 1  # prctl(2)


_PROG = "scalerepro.launching.launch"


class LaunchError(CommandError):
    """The ranks cannot be started; the message says why and what to change."""


def local_rank_environments(ranks: int, port: int, store_fd: int, environ: Mapping[str, str], job: Sequence[int]) -> list[dict[str, str]]:
    """The environment of each local rank: the env:// variables torchrun would set, the store's
    socket for rank 0, the loopback interface for gloo and NCCL unless the caller chose one, and
    the rank's own cores of the job's ``job`` cores (scalerepro.schedulers.cores) with as many threads."""
    common = {
        **environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks),
        "GROUP_RANK": "0",
        "NODE_RANK": "0",
        LAUNCHER_ENV: "local",
        "GLOO_SOCKET_IFNAME": environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "NCCL_SOCKET_IFNAME": environ.get("NCCL_SOCKET_IFNAME", "lo"),
    }
    environments = []
    for rank in range(ranks):
        own = cores.rank_cores(job, rank, ranks)
        # the rank's share, never an inherited job-wide count (Snakemake exports its threads)
        threads = dict.fromkeys(cores.THREAD_VARIABLES, str(len(own)))
        environments.append(
            {
                **common,
                **threads,
                cores.CORES_ENV: ",".join(map(str, own)),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                **({STORE_FD_ENV: str(store_fd)} if rank == 0 else {}),
            }
        )
    return environments


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22), None when it is gone: with
    the pid it names one process, never a later one that reused the pid."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def driver() -> tuple[int, int | None]:
    """The process whose death ends this job: the nearest ancestor running Snakemake (its job's
    shell and wrapper outlive a killed Snakemake, so the parent alone is not enough), else the
    parent. As (pid, start time)."""
    pid = os.getppid()
    while pid > 1:
        try:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            break
        if b"snakemake" in command_line:
            return pid, _process_start(pid)
        fields = _stat(pid)
        pid = int(fields[1]) if fields else 0  # field 4: the parent
    return os.getppid(), _process_start(os.getppid())


def _stop_with_parent() -> None:
    """In a rank, before it runs: SIGTERM when the launcher dies, however it dies (Linux
    PR_SET_PDEATHSIG); the trainer's handler then writes its record and leaves."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_local(
    ranks: int, program: Sequence[str], environ: Mapping[str, str], output: rank_failure.RankOutput, cpus: int | None = None
) -> tuple[int, list[dict]]:
    """Start ``ranks`` processes of ``program`` here and wait for them; return the job's code and
    the ranks that failed (``rank_failure``'s form: rank, host, exit code, signal). The job runs
    on the first ``cpus`` cores this process may use (all of them when None), each rank on its
    own share (scalerepro.schedulers.cores).

    The code is that of the first rank to fail (a signal's as 128 + its number), else 75 when a
    rank was stopped by a signal after checkpointing, else 0. When one rank fails the others get
    SIGTERM (the trainer writes its record and leaves), then SIGKILL after STOP_GRACE_S seconds.
    SIGTERM, SIGINT and SIGUSR1 sent to the launcher are passed on to every rank; when the job's
    driver (``driver()``) dies, the ranks get SIGTERM as well, and they die with the launcher
    whatever kills it (a parent-death signal), so a killed Snakemake leaves no rank running. Each rank's
    lines reach our stdout and stderr prefixed ``[default<rank>]:`` as torchrun ``--tee`` would,
    and ``output`` keeps their tails."""
    with socket.create_server(("127.0.0.1", 0)) as listener:  # bound and listening before any rank starts
        job = cores.job_cores(os.sched_getaffinity(0), cpus)
        environments = local_rank_environments(ranks, listener.getsockname()[1], listener.fileno(), environ, job)
        processes = [
            _start_rank(program, env, listener.fileno() if rank == 0 else None, environ.get(fork_server.SOCKET_ENV)) for rank, env in enumerate(environments)
        ]
    pumps = [
        threading.Thread(target=_pump, args=(stream, sink, f"[default{rank}]:", output), daemon=True)
        for rank, process in enumerate(processes)
        for stream, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))
    ]
    for thread in pumps:
        thread.start()
    previous = {s: signal.signal(s, lambda signum, _frame: _signal_all(processes, signum)) for s in FORWARDED_SIGNALS}
    try:
        code = _wait_for(processes, driver())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for thread in pumps:
        thread.join()
    host = socket.gethostname()
    failures = [
        {
            "rank": rank,
            "local_rank": rank,
            "host": host,
            "exit_code": p.returncode,
            "signal": signal.Signals(-_returncode(p)).name if _returncode(p) < 0 else None,
        }
        for rank, p in enumerate(processes)
        if _exit_code(_returncode(p)) not in (0, EXIT_PREEMPTED)
    ]
    return code, failures


Rank = subprocess.Popen | fork_server.ForkedRank


def _start_rank(program: Sequence[str], env: Mapping[str, str], store_fd: int | None, fork_socket: str | None) -> Rank:
    """One local rank: forked by the study's fork server where there is one (torch already
    imported: scalerepro.launching.fork_server), else, or when it refuses, a new process."""
    if fork_socket:
        try:
            rank = fork_server.fork_rank(fork_socket, program, env, store_fd)
        except fork_server.ForkServerError as error:
            print(f"scalerepro.launching.launch: rank {env['RANK']} starts as a new process: {error}", file=sys.stderr, flush=True)
        else:
            print(f"scalerepro.launching.launch: rank {env['RANK']} {fork_server.FORKED_LINE} (pid {rank.pid})", file=sys.stderr, flush=True)
            return rank
    return subprocess.Popen(
        [sys.executable, *program],
        env=env,
        pass_fds=(store_fd,) if store_fd is not None else (),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        bufsize=1,
        preexec_fn=_stop_with_parent,
    )


def _pump(source, sink, prefix: str, output: rank_failure.RankOutput) -> None:
    for line in source:
        sink.write(prefix + line)
        sink.flush()
        output.feed(prefix + line)


def _signal_all(processes: Sequence[Rank], signum: int) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signum)


def _returncode(process: Rank) -> int:
    """The exit status of a rank that has exited (every rank has once _wait_for returns)."""
    assert process.returncode is not None
    return process.returncode


def _exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode  # killed by signal N: 128 + N, as a shell says


def _wait_for(processes: Sequence[Rank], driven_by: tuple[int, int | None] | None = None) -> int:
    first_failure: int | None = None
    kill_at: float | None = None
    next_check = time.monotonic()
    while True:
        running = [p for p in processes if p.poll() is None]
        if driven_by is not None and kill_at is None and time.monotonic() >= next_check:
            next_check = time.monotonic() + DRIVER_CHECK_S
            if _process_start(driven_by[0]) != driven_by[1]:
                print(f"scalerepro.launching.launch: the job's driver (pid {driven_by[0]}) is gone: stopping the ranks", file=sys.stderr, flush=True)
                kill_at = time.monotonic() + STOP_GRACE_S
                _signal_all(processes, signal.SIGTERM)
        if first_failure is None:
            failed = [_exit_code(p.returncode) for p in processes if p.returncode is not None and _exit_code(p.returncode) not in (0, EXIT_PREEMPTED)]
            if failed:
                first_failure, kill_at = failed[0], time.monotonic() + STOP_GRACE_S
                _signal_all(processes, signal.SIGTERM)
        if not running:
            break
        if kill_at is not None and time.monotonic() > kill_at:
            _signal_all(processes, signal.SIGKILL)
        time.sleep(0.05)
    if first_failure is not None:
        return first_failure
    return EXIT_PREEMPTED if any(_exit_code(_returncode(p)) == EXIT_PREEMPTED for p in processes) else 0


def launch_request(args: argparse.Namespace) -> LaunchRequest:
    return LaunchRequest(
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        cpus_per_node=args.cpus_per_node,
        port=args.port,
        name=args.name,
        gpus=args.slurm_gpus,
        container=args.container,
        program=tuple(args.program),
    )


def command(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """The command that starts every rank of the job, from where this launcher runs."""
    scheduler = schedulers.current(environ)
    try:
        if args.node_agent:  # the scheduler that started this node's task names itself
            return schedulers.backend(args.node_agent).node_command(launch_request(args), sys.executable, environ)
        if scheduler is not LOCAL:
            return scheduler.launch_command(launch_request(args), sys.executable, environ)
    except SchedulerError as error:
        raise LaunchError(str(error)) from None
    if args.nodes > 1:
        raise LaunchError(f"a run over {args.nodes} nodes needs a cluster scheduler (none here): run the workflow with --profile slurm")
    # Locally a container is Snakemake's business (the rule's container: directive).
    return [sys.executable, *args.program]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=COUNT, default=1)
    parser.add_argument("--ranks-per-node", type=COUNT, default=1, help="ranks (GPUs) per node")
    parser.add_argument(
        "--cpus-per-node",
        type=COUNT,
        default=None,
        help="the job's CPU cores on each node (the srun task's on Slurm; locally the first this many cores); default: all this process may use",
    )
    parser.add_argument("--slurm-gpus", action="store_true", help="ask the step for --gpus-per-node=<ranks per node>")
    parser.add_argument(
        "--port", type=bounded_int(1024, 65535 - RENDEZVOUS_PORT_SPAN), default=29400, help="rendezvous port base; the job id modulo 1000 is added (Slurm)"
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="exported to every rank (NCCL_SOCKET_IFNAME=ib0, ...)")
    parser.add_argument("--container", default=None, help="Apptainer image the ranks run in, inside each node's srun task (Slurm)")
    parser.add_argument("--name", default=None, help="the step's name in sacct")
    parser.add_argument("--node-agent", default=None, metavar="SCHEDULER", help=argparse.SUPPRESS)
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- then what torchrun starts: -m scalerepro.training.train ...")
    args = parser.parse_args(argv)
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if not args.program:
        parser.error("nothing to launch: give -- -m scalerepro.training.train ...")
    for item in args.env:
        if "=" not in item:
            parser.error(f"--env {item!r}: expected NAME=VALUE")
    return args


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.node_agent:
        args.port = schedulers.current(os.environ).rendezvous_port(args.port, os.environ)
    os.environ.update(item.split("=", 1) for item in args.env)  # srun --export=ALL carries them on
    if args.node_agent:
        return _exec_node_agent(args)
    argv_out = command(args, os.environ)
    local = schedulers.current(os.environ) is LOCAL
    where = f"{args.ranks_per_node} local rank(s), rendezvous on 127.0.0.1 only: " if local else ""
    print(f"scalerepro.launching.launch: {where}{shlex.join(argv_out)}", file=sys.stderr, flush=True)
    started, started_at = time.time(), utc_now()
    output = rank_failure.RankOutput()
    if local:
        code, failures = run_local(args.ranks_per_node, args.program, os.environ, output, args.cpus_per_node)
    else:
        # The job-level launcher waits; SIGUSR1 never reaches it (batch step) and SIGTERM ends it.
        code, failures = rank_failure.run_watched(argv_out, output), None
    target = rank_failure.trainer_record(args.program) if code != 0 else None
    if target is not None and not rank_failure.written_since(target[0], started):
        message = rank_failure.write_failed_record(target[0], target[1], started_at, code, output, failures)
        if message is not None:
            print(f"scalerepro.launching.launch: error: {message}; failed record written to {target[0]}", file=sys.stderr, flush=True)
    return code


def _exec_node_agent(args: argparse.Namespace) -> int:
    argv_out = command(args, os.environ)
    print(f"scalerepro.launching.launch: {shlex.join(argv_out)}", file=sys.stderr, flush=True)
    # torchrun would set one thread per rank: give each its share of the node task's cores (each
    # rank pins itself to its share at start, scalerepro.training.distributed), never an inherited count
    share = cores.rank_cores(cores.job_cores(os.sched_getaffinity(0), args.cpus_per_node), 0, args.ranks_per_node)
    os.environ.update(dict.fromkeys(cores.THREAD_VARIABLES, str(len(share))))
    # Survive Slurm's warning signal; the ranks, which torchrun starts from here, install
    # their own handler over the inherited SIG_IGN.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.execvp(argv_out[0], argv_out)
    raise AssertionError("execvp returned")


if __name__ == "__main__":
    sys.exit(main())
