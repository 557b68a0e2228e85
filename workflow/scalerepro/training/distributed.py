"""Process-group setup, in one place.

A rank learns who it is from exactly one of three launchers:

* ``torchrun`` or ``scalerepro.launching.launch`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``PORT``);
* the job's scheduler alone, one task per rank (``Scheduler.rank_env``: on Slurm ``srun`` with
  ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``);
* nothing: a single process, no process group and no DDP wrapper.

One rank has no process group unless ``group_at_one_rank`` asks for one (the trainer's and the
comm benchmark's ``--process-group-at-one-rank``): then a real NCCL or gloo communicator of one
rank is formed on an in-process store, and the trainer wraps the model in DDP as it does at N
ranks. That is a 1-GPU baseline that pays DDP's reducer and its (local) all-reduces, and the
one way to run the NCCL and DDP code paths on a machine with one GPU.

The backend (``--dist-backend``) is by default NCCL on CUDA and gloo on the CPU. NCCL takes one card
per rank; gloo on CUDA lets the ranks of a node share its cards (``card_of_rank``), which on a
machine with one GPU runs the multi-rank CUDA code paths (DDP's reducer and hook, FSDP's
collectives, the record of N ranks) at world size 2: a check of code paths, not of NCCL, NVLink
or any scaling figure (gloo copies through the host, and the ranks share one card's SMs). A peer
that never arrives turns into a one-line ``DistributedSetupError`` after ``--dist-timeout-s``
instead of a hang.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn, TypedDict, TypeVar, cast

import torch
import torch.distributed as dist

from scalerepro import schedulers
from scalerepro.schedulers import cores
from scalerepro.schedulers.base import LAUNCHER_ENV, STORE_FD_ENV, RankEnv, SchedulerError


class DistributedSetupError(RuntimeError):
    """The process group could not be formed; the message says which peer or address and what to check."""


# Who a rank is (launcher, rank, world size, local rank, rendezvous): see scalerepro.schedulers.
DistEnv = RankEnv

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    env: DistEnv
    device: torch.device
    backend: str | None  # None when world_size == 1 (no process group)
    hostnames: tuple[str, ...]  # node name of each rank, in rank order (see node_name)
    cores: tuple[int, ...] = ()  # the CPU cores this rank runs on (pin_to_own_cores); () = not pinned

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def num_nodes(self) -> int:
        return len(set(self.hostnames))


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    """The node this process runs on: its scheduler's name for it (two slurmd on one host are two
    nodes), else the host name."""
    return schedulers.current(environ).node_name(environ) or socket.gethostname()


def detect_env(environ: Mapping[str, str] = os.environ) -> DistEnv:
    if "RANK" in environ and "WORLD_SIZE" in environ:  # torchrun, scalerepro.launching.launch or any env:// launcher
        return DistEnv(
            launcher="local" if environ.get(LAUNCHER_ENV) == "local" else "torchrun",
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])),
            master_addr=environ.get("MASTER_ADDR"),
            master_port=int(environ["MASTER_PORT"]) if "MASTER_PORT" in environ else None,
        )
    try:
        started_by_scheduler = schedulers.current(environ).rank_env(environ)
    except SchedulerError as error:
        raise DistributedSetupError(str(error)) from None
    return started_by_scheduler or DistEnv("single", 0, 1, 0, 1, None, None)


def pin_to_own_cores(env: DistEnv, environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """Run this rank on its own cores, with one intra-op thread per core, and return them: the
    cores the local launcher gave it (scalerepro.schedulers.cores.CORES_ENV), else its share of the cores this
    process may use (a Slurm node task's, or this machine's for a single process) by local rank.
    An inherited OMP_NUM_THREADS is never the count (Snakemake exports the job's to every job)."""
    given = environ.get(cores.CORES_ENV)
    own = [int(core) for core in given.split(",")] if given else cores.rank_cores(os.sched_getaffinity(0), env.local_rank, env.local_world_size)
    os.sched_setaffinity(0, own)
    torch.set_num_threads(len(own))
    return tuple(own)


def card_of_rank(local_rank: int, cards: int, backend: str) -> int:
    """The CUDA card of local rank ``local_rank`` on a node that shows ``cards``: under NCCL its
    own (NCCL refuses two ranks on one device); under gloo card ``local_rank % cards``, so that
    more ranks than cards share them."""
    if cards < 1:
        raise DistributedSetupError("this node shows no CUDA device: run on the CPU (--device cpu)")
    if backend == "gloo":
        return local_rank % cards
    if local_rank >= cards:
        raise DistributedSetupError(
            f"local rank {local_rank} has no GPU of its own: this node shows {cards} and NCCL needs a card per rank; launch at most "
            f"{cards} ranks per node, or pass --dist-backend gloo to share a card (for checking code paths only: it measures no NCCL)"
        )
    return local_rank


def _on_cuda(requested: str) -> bool:
    if requested == "cuda" and not torch.cuda.is_available():
        raise DistributedSetupError("--device cuda was requested but torch sees no CUDA device")
    return requested == "cuda" or (requested == "auto" and torch.cuda.is_available())


def _backend(asked: str, on_cuda: bool) -> str:
    """The collective backend ``--dist-backend`` asks for ('auto': NCCL on CUDA, gloo on the CPU)."""
    if asked == "auto":
        return "nccl" if on_cuda else "gloo"
    if asked == "nccl" and not on_cuda:
        raise DistributedSetupError("--dist-backend nccl needs a CUDA device and this run is on the CPU: use --dist-backend gloo (or auto) there")
    return asked


def _select_device(on_cuda: bool, local_rank: int, backend: str) -> torch.device:
    if not on_cuda:
        return torch.device("cpu")
    card = card_of_rank(local_rank, torch.cuda.device_count(), backend)
    torch.cuda.set_device(card)
    return torch.device("cuda", card)


def setup(
    requested_device: str,
    timeout_s: float,
    environ: Mapping[str, str] = os.environ,
    *,
    group_at_one_rank: bool = False,
    backend: str = "auto",
) -> DistContext:
    """Form the process group (if there is more than one rank, or ``group_at_one_rank``) over
    ``backend`` (``--dist-backend``) and pick this rank's device."""
    env = detect_env(environ)
    own_cores = pin_to_own_cores(env, environ)
    on_cuda = _on_cuda(requested_device)
    backend = _backend(backend, on_cuda)
    device = _select_device(on_cuda, env.local_rank, backend)
    # device_id binds the group to a card, and only NCCL uses it (an eager communicator of that
    # card); gloo has no use for it, and a card shared by two ranks is no rank's own.
    device_id = device if backend == "nccl" else None
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.world_size == 1:
        if not group_at_one_rank:
            return DistContext(env, device, None, (node_name(environ),), own_cores)
        # One rank meets nobody: an in-process store is its whole rendezvous (no port, no peer).
        dist.init_process_group(
            backend=backend,
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            timeout=timeout,
            device_id=device_id,
        )
        return DistContext(env, device, backend, (node_name(environ),), own_cores)

    address = f"{env.master_addr}:{env.master_port}"
    # Under torchrun the agent already serves the store at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE),
    # which only env:// honours; under srun alone, rank 0 serves it at the first host; a local run
    # (scalerepro.launching.launch) meets in a store that listens on loopback only.
    init_method = "env://" if env.launcher == "torchrun" else f"tcp://{address}"
    rendezvous: _Rendezvous = {"init_method": init_method}
    try:
        if env.launcher == "local":
            rendezvous = {"store": _loopback_store(env, timeout, environ)}
        dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device_id,
            **rendezvous,
        )
        # The first collective is where a missing peer shows up; gather host names with it.
        hostnames: list[str | None] = [None] * env.world_size
        dist.all_gather_object(hostnames, node_name(environ))
    except (RuntimeError, dist.DistError) as error:  # DistStoreError, DistNetworkError, timeouts
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DistributedSetupError(
            f"rank {env.rank} of {env.world_size} could not form the {backend} process group at {address} "
            f"within {timeout_s:g} s ({detail}); check that all {env.world_size} ranks were launched, "
            f"that {env.master_addr} resolves and port {env.master_port} is reachable, or raise --dist-timeout-s"
        ) from None
    return DistContext(env, device, backend, tuple(str(h) for h in hostnames), own_cores)


class _Rendezvous(TypedDict, total=False):
    """How init_process_group meets the other ranks: at an address, or in a store."""

    init_method: str
    store: dist.Store


class _StoreAddress(TypedDict):
    host_name: str
    port: int
    world_size: int
    timeout: datetime.timedelta


def _loopback_store(env: DistEnv, timeout: datetime.timedelta, environ: Mapping[str, str]) -> dist.TCPStore:
    """The rendezvous store of a local run, reachable from this machine only.

    TCPStore binds its server to every interface whatever host it is given, and torchrun offers
    no other choice; but it accepts a socket that is already listening. The launcher binds one
    to 127.0.0.1 and rank 0 inherits it (``pass_fds``); the others connect to it. The libuv
    server cannot adopt a socket, hence ``use_libuv=False``."""
    assert env.master_port is not None  # the local launcher sets MASTER_PORT
    common: _StoreAddress = {"host_name": "127.0.0.1", "port": env.master_port, "world_size": env.world_size, "timeout": timeout}
    if env.rank == 0:
        return dist.TCPStore(**common, is_master=True, master_listen_fd=int(environ[STORE_FD_ENV]), use_libuv=False)
    return dist.TCPStore(**common, is_master=False)


def set_collective_timeout(ctx: DistContext, timeout_s: float) -> None:
    """From now on, a collective of the default process group that waits longer than
    ``timeout_s`` fails (NCCL's watchdog aborts it; gloo raises). Collectives already issued
    keep the timeout they were issued with."""
    if ctx.distributed:
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s))


def finish(ctx: DistContext, clean: bool) -> None:
    """End of a rank's work. After a clean run all ranks meet at a barrier, so none leaves while a
    peer still waits on a collective; after a failure peers may be gone, so no barrier.

    The process group is deliberately not destroyed: the entry points leave with ``os._exit``.
    Destroying a gloo group (or letting DDP's reducer free it) joins gloo's worker thread while
    holding the GIL, and that thread may still need the GIL to free a finished collective: a
    deadlock, seen here, that keeps a finished rank alive forever.
    """
    if ctx.distributed and clean:
        dist.barrier()


def leave(exit_code: int) -> NoReturn:
    """End an entry point's process without interpreter finalisation, its files written: that
    would destroy the process group, which can deadlock (``finish``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def all_reduce_sum(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (identity without a process group)."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def max_over_ranks(ctx: DistContext, value: float) -> float:
    """The largest ``value`` any rank holds (a collective: every rank calls it at the same point)."""
    return float(all_reduce_max(ctx, torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)).item())


def gather_objects(ctx: DistContext, obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank (each rank passes its value of the same kind)."""
    if not ctx.distributed:
        return [obj]
    gathered: list[T | None] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return cast("list[T]", gathered)  # all_gather_object filled every place with a rank's obj


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()
