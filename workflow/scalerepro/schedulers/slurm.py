"""Slurm: jobs submitted by snakemake-executor-plugin-slurm, ranks started by one srun step.

Inside an allocation the launcher runs one step, ``srun --nodes N --ntasks N --ntasks-per-node 1``,
whose task on each node (``python -m scalerepro.launching.launch --node-agent``) execs torchrun with c10d
rendezvous on the first host of the step's node list. Everything the step needs is passed to srun
explicitly: Snakemake's Slurm job step strips most ``SLURM_*`` variables from a rule's
environment, so the allocation's defaults cannot be relied on, and the node list is read inside
the step, where srun sets it. Ranks started by srun alone (one task per rank, no torchrun) are
recognised too (``rank_env``).
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

from scalerepro.schedulers.base import LaunchRequest, RankEnv, Scheduler, SchedulerError, torchrun_command

# The c10d rendezvous port of a multi-node job: a base plus the job id modulo a span, so that two
# jobs whose first node is the same host rarely meet on one port.
RENDEZVOUS_PORT_SPAN = 1000


def first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression, e.g. ``gpu[007-010,012],login1`` -> ``gpu007``.

    Slurm's ``scontrol show hostnames`` does this too, but it is not on every compute node's PATH
    inside containers; the first host needs only the prefix and the first number of the first range.
    """
    match = re.match(r"^([^\[,]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise SchedulerError(f"cannot parse the Slurm node list {nodelist!r}")
    prefix, ranges = match.groups()
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]  # keeps zero padding: "007" stays "007"


def resolve_host(host: str) -> str:
    """An address for ``host``: its name when it resolves, else the NodeAddr Slurm knows it by
    (clusters, and the test cluster, whose node names are not DNS names)."""
    try:
        socket.getaddrinfo(host, None)
        return host
    except socket.gaierror:
        pass
    if shutil.which("scontrol"):
        shown = subprocess.run(["scontrol", "show", "node", host, "--oneliner"], capture_output=True, text=True)
        for field in shown.stdout.split():
            if field.startswith("NodeAddr="):
                return field.removeprefix("NodeAddr=")
    raise SchedulerError(f"the rendezvous host {host!r} does not resolve and Slurm gives no NodeAddr for it: check the node's DNS name")


def _int_or_raw(value: str | None) -> int | str | None:
    """An integer variable as int; anything else as given (None when unset)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


class Slurm(Scheduler):
    name = "slurm"
    executor = "slurm"

    def in_job(self, environ: Mapping[str, str]) -> bool:
        return "SLURM_JOB_ID" in environ

    def job_facts(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """The Slurm job and step this process belongs to.

        The three GPU variables are kept apart because they mean different things: ``SLURM_GPUS``
        is the job's ``--gpus`` request as written (may be typed, "h100:8"), ``SLURM_GPUS_ON_NODE``
        the count allocated on this node, ``SLURM_JOB_GPUS`` the allocated GPU indices ("0,1,2,3").
        """
        get = environ.get
        return {
            "name": self.name,
            "job_id": _int_or_raw(get("SLURM_JOB_ID")),
            "cluster_name": get("SLURM_CLUSTER_NAME"),  # names the cluster in the results store
            "partition": get("SLURM_JOB_PARTITION"),
            "array_job_id": _int_or_raw(get("SLURM_ARRAY_JOB_ID")),
            "array_task_id": _int_or_raw(get("SLURM_ARRAY_TASK_ID")),
            "step_id": _int_or_raw(get("SLURM_STEP_ID")),
            "job_name": get("SLURM_JOB_NAME"),
            "node_list": get("SLURM_JOB_NODELIST"),
            "step_node_list": get("SLURM_STEP_NODELIST"),
            "num_nodes": _int_or_raw(get("SLURM_JOB_NUM_NODES", get("SLURM_NNODES"))),
            "ntasks": _int_or_raw(get("SLURM_NTASKS", get("SLURM_NPROCS"))),
            "cpus_per_task": _int_or_raw(get("SLURM_CPUS_PER_TASK")),
            "gpus": get("SLURM_GPUS"),
            "gpus_on_node": _int_or_raw(get("SLURM_GPUS_ON_NODE")),
            "job_gpus": get("SLURM_JOB_GPUS"),
            # Incremented each time the job is requeued; 0 or unset on the first run.
            "restart_count": _int_or_raw(get("SLURM_RESTART_COUNT")),
        }

    def node_name(self, environ: Mapping[str, str]) -> str | None:
        # inside a job step: two slurmd on one host are two nodes
        return environ.get("SLURMD_NODENAME")

    def rank_env(self, environ: Mapping[str, str]) -> RankEnv | None:
        """srun alone, one task per rank: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the
        rendezvous host is the first host of the step's node list, the port derived from the job id."""
        if "SLURM_PROCID" not in environ or int(environ.get("SLURM_NTASKS", "1")) <= 1:
            return None
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise SchedulerError("SLURM_PROCID is set but no SLURM_STEP_NODELIST: launch with srun")
        ntasks = int(environ["SLURM_NTASKS"])
        nnodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
        # A port per job, so two jobs sharing a node do not collide; MASTER_PORT wins if set.
        port = int(environ.get("MASTER_PORT") or 15000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000)
        return RankEnv(
            launcher=self.name,
            rank=int(environ["SLURM_PROCID"]),
            world_size=ntasks,
            local_rank=int(environ.get("SLURM_LOCALID", 0)),
            local_world_size=-(-ntasks // nnodes),
            master_addr=environ.get("MASTER_ADDR") or first_host(nodelist),
            master_port=port,
        )

    def rendezvous_port(self, base: int, environ: Mapping[str, str]) -> int:
        job_id = environ.get("SLURM_JOB_ID", "0")
        return base + (int(job_id) if job_id.isdigit() else 0) % RENDEZVOUS_PORT_SPAN

    def launch_command(self, request: LaunchRequest, python: str, environ: Mapping[str, str]) -> list[str]:
        """The one step of the job: a node agent per node, every resource named explicitly."""
        if shutil.which("srun", path=environ.get("PATH")) is None:
            raise SchedulerError("inside a Slurm job but srun is not on PATH: load the site's Slurm module in the profile's precommand")
        step = [
            "srun",
            f"--nodes={request.nodes}",
            f"--ntasks={request.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={request.cpus_per_node}" if request.cpus_per_node else None,
            "--kill-on-bad-exit=1",
            "--export=ALL",
            "--label",
            f"--job-name={request.name}" if request.name else None,
            f"--gpus-per-node={request.ranks_per_node}" if request.gpus else None,
        ]
        container = ["apptainer", "exec", *(["--nv"] if request.gpus else []), request.container] if request.container else []
        agent = [
            "python" if request.container else python,
            "-m",
            "scalerepro.launching.launch",
            f"--node-agent={self.name}",
            f"--nodes={request.nodes}",
            f"--ranks-per-node={request.ranks_per_node}",
            *([f"--cpus-per-node={request.cpus_per_node}"] if request.cpus_per_node else []),
            f"--port={request.port}",
            "--",
            *request.program,
        ]
        return [part for part in step if part] + container + agent

    def node_command(self, request: LaunchRequest, python: str, environ: Mapping[str, str]) -> list[str]:
        """Inside the step, on each node: the torchrun command for this node."""
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        if request.nodes > 1 and not nodelist:
            raise SchedulerError("--node-agent runs inside an srun step (no SLURM_STEP_NODELIST here): start jobs with scalerepro.launching.launch")
        endpoint = f"{resolve_host(first_host(nodelist))}:{request.port}" if request.nodes > 1 and nodelist else None  # nodelist: set (checked above)
        rdzv_id = f"{environ.get('SLURM_JOB_ID', 'local')}.{environ.get('SLURM_STEP_ID', '0')}"
        return torchrun_command(python, request.nodes, request.ranks_per_node, endpoint, rdzv_id, request.program)


SLURM = Slurm()
