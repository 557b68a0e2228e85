"""What the workflow asks a batch system for when it submits a job: the rule resources the
Snakemake executor plugin turns into an allocation of N nodes x R ranks, the queue settings of
every job, and the check, on the submitting host, that the system answers and the configured
queue exists (one-line errors).

This is the planning half of a scheduler backend; the run-time half (who a rank is, how ranks
start, the job's facts for the record) is ``scalerepro.schedulers``, which the ranks import. The
two halves are kept apart so that editing what is submitted reruns no training job.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from scalerepro.schedulers.base import Scheduler, SchedulerError


class Submission:
    """A machine with no batch system: nothing to ask for, nothing to check."""

    def submission_resources(self, settings: Mapping[str, Any], ranks_per_node: int, nodes: int, gpus: bool, signal: bool, exclusive: bool) -> dict[str, Any]:
        return {}

    def queue_resources(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Account, partition, QoS and the like, for every job the workflow submits."""
        return {}

    def check(self, settings: Mapping[str, Any]) -> None:
        """On the submitting host: the system answers and ``settings`` fit it."""

    def nodes(self, settings: Mapping[str, Any]) -> list[str]:
        """The nodes a study's jobs may run on: this host."""
        return [socket.gethostname()]

    def on_nodes(self, nodes: Sequence[str]) -> dict[str, Any]:
        """What a job asks for to run on exactly ``nodes``: nothing, here."""
        return {}

    def excluding(self, nodes: Sequence[str]) -> list[str]:
        """The submission's words that keep a job off ``nodes``: none, with one host."""
        return []


class SlurmSubmission(Submission):
    """snakemake-executor-plugin-slurm's resources; sinfo for the check."""

    def queue_resources(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Account, partition, QoS and constraint of every job (unset ones omitted)."""
        names = {"slurm_account": "account", "slurm_partition": "partition", "qos": "qos", "constraint": "constraint"}
        return {resource: settings[key] for resource, key in names.items() if settings[key] is not None}

    def submission_resources(self, settings: Mapping[str, Any], ranks_per_node: int, nodes: int, gpus: bool, signal: bool, exclusive: bool) -> dict[str, Any]:
        """sbatch settings of a job that starts ranks: ``nodes`` nodes with ``ranks_per_node`` GPUs
        each (``--gres=gpu:<n>`` is per node), one task per node holding all its CPUs.

        ``mpi`` (any value) tells the plugin's job step that the job starts its own srun step;
        without it the rule would run inside an ``srun -n1`` step, which Slurm's warning signal
        reaches and kills. Its empty value keeps sbatch's MPI task-count checks out of the way.
        ``tasks_per_gpu=0`` stops the plugin from asking for one task per GPU. A measured job
        gets whole nodes (``--exclusive``) unless resources.exclusive is false."""
        extra = [
            *settings["extra"],
            *(["--exclusive"] if exclusive else []),
            *([f"--signal=USR1@{settings['signal_before_end_s']}"] if signal else []),
        ]
        return {
            "mpi": "",
            "tasks_per_gpu": 0,
            "gres": f"gpu:{ranks_per_node}" if gpus else None,
            # The plugin pastes slurm_extra into its sbatch shell command: every token is quoted
            # (and the schema allows only --name[=value] tokens of shell-inert characters).
            "slurm_extra": shlex.join(extra) or None,
        }

    def on_nodes(self, nodes: Sequence[str]) -> dict[str, Any]:
        return {"nodes": len(nodes), "slurm_extra": shlex.join([f"--nodelist={','.join(nodes)}"])}

    def excluding(self, nodes: Sequence[str]) -> list[str]:
        return [f"--exclude={','.join(nodes)}"] if nodes else []

    def nodes(self, settings: Mapping[str, Any]) -> list[str]:
        """The nodes of the partition the study requests (its default where none is set), as
        ``sinfo --Node`` lists them."""
        command = ["sinfo", "--Node", "--noheader", "--format=%N", *(["--partition", settings["partition"]] if settings["partition"] else [])]
        listed = subprocess.run(command, capture_output=True, text=True)
        if listed.returncode != 0:
            said = listed.stderr.strip().splitlines()[-1] if listed.stderr.strip() else "no output"
            raise SchedulerError(
                f"the Slurm controller does not list the partition's nodes (sinfo: {said}): check `scontrol ping`, or list them as prescreen.nodes"
            )
        return sorted(set(listed.stdout.split()))

    def check(self, settings: Mapping[str, Any]) -> None:
        """The controller answers and the configured partition exists."""
        if shutil.which("sinfo") is None:
            raise SchedulerError("sinfo is not on PATH: run the workflow on the cluster's login node, or load its Slurm module")
        listed = subprocess.run(["sinfo", "--noheader", "--format=%R"], capture_output=True, text=True)
        if listed.returncode != 0:
            said = listed.stderr.strip().splitlines()[-1] if listed.stderr.strip() else "no output"
            raise SchedulerError(f"the Slurm controller does not answer (sinfo: {said}): check `scontrol ping` and that SLURM_CONF points at this cluster")
        partitions = sorted(set(listed.stdout.split()))
        if settings["partition"] is not None and settings["partition"] not in partitions:
            raise SchedulerError(
                f"config error at 'slurm.partition': {settings['partition']!r} is not a partition of this cluster "
                f"(sinfo lists: {', '.join(partitions)}): set slurm.partition in config/config.yaml"
            )


SUBMISSIONS: dict[str, Submission] = {"local": Submission(), "slurm": SlurmSubmission()}


def for_scheduler(scheduler: Scheduler) -> Submission:
    """The submission side of ``scheduler`` (every registered backend has one)."""
    return SUBMISSIONS[scheduler.name]
