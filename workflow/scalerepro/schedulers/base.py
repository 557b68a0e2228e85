"""What every scheduler backend is made of: the errors, the environment a local run's ranks get,
who a rank is (``RankEnv``), what a launch asks for (``LaunchRequest``), the ``Scheduler`` base
class (a machine with no batch system: ``LOCAL``) and the torchrun command line. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerepro.common.cli import CommandError

# The environment of a local run's ranks (set by scalerepro.launching.launch, read by
# scalerepro.training.distributed): who started them, and which inherited file descriptor is the
# store's listening socket (rank 0 only).
LAUNCHER_ENV, STORE_FD_ENV = "SCALEREPRO_LAUNCHER", "SCALEREPRO_STORE_FD"


class SchedulerError(CommandError):
    """The batch system cannot be used as configured; the message says why and what to change."""


@dataclass(frozen=True)
class RankEnv:
    """Who this rank is, as the launcher that started it says (see scalerepro.training.distributed)."""

    launcher: str  # "local" (scalerepro.launching.launch on one machine) | "torchrun" | a scheduler's name | "single"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None


@dataclass(frozen=True)
class LaunchRequest:
    """One job's ranks, as ``python -m scalerepro.launching.launch`` was asked for them."""

    nodes: int
    ranks_per_node: int
    cpus_per_node: int | None  # None: all the job has (locally: every core this process may use)
    port: int
    name: str | None
    gpus: bool  # ask the scheduler for a GPU per rank
    container: str | None
    program: Sequence[str]


class Scheduler:
    """A batch system. Subclasses override what their system does differently; the defaults
    describe a machine with no batch system."""

    name = "local"
    executor: str | None = None  # Snakemake's --executor for it (None: jobs run where Snakemake runs)

    def in_job(self, environ: Mapping[str, str]) -> bool:
        return False

    def job_facts(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """The record's ``scheduler`` block: at least name, job_id, cluster_name, partition."""
        return {"name": self.name, "job_id": None, "cluster_name": None, "partition": None}

    def node_name(self, environ: Mapping[str, str]) -> str | None:
        """The scheduler's name for this node, where it differs from the host name."""
        return None

    def rank_env(self, environ: Mapping[str, str]) -> RankEnv | None:
        return None

    def launch_command(self, request: LaunchRequest, python: str, environ: Mapping[str, str]) -> list[str]:
        raise NotImplementedError(f"{self.name} starts its ranks in scalerepro.launching.launch.run_local")

    def node_command(self, request: LaunchRequest, python: str, environ: Mapping[str, str]) -> list[str]:
        """On each node of the job, inside the task ``launch_command`` started there: torchrun."""
        raise NotImplementedError(f"{self.name} has no node agent")

    def rendezvous_port(self, base: int, environ: Mapping[str, str]) -> int:
        return base


LOCAL = Scheduler()


def torchrun_command(
    python: str, nodes: int, ranks_per_node: int, endpoint: str | None, rdzv_id: str, program: Sequence[str], log_dir: str | None = None
) -> list[str]:
    """torchrun for one node's ranks: standalone on one node, c10d rendezvous at ``endpoint``
    across nodes; every rank's output to the console, each line prefixed with its local rank
    (``--tee``, which also writes them under ``log_dir``; torchrun picks a directory when None)."""
    command = [python, "-m", "torch.distributed.run", f"--nproc-per-node={ranks_per_node}"]
    if nodes == 1:
        command.append("--standalone")
    else:
        command += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}"]
    return command + ["--tee=3", *([f"--log-dir={log_dir}"] if log_dir else [])] + list(program)
