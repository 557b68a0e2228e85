"""Where a job runs and how its ranks start: the one seam between scalerepro and a batch system.

A backend (``Scheduler``) names the Snakemake executor plugin that submits to it
(``--executor``/profile) and answers, inside a job, for the launcher and the ranks (no torch
imported here):

* ``in_job``: whether this process runs inside one of its jobs;
* ``job_facts``: the job's facts for the run record (``record["scheduler"]``);
* ``launch_command``: the command that starts every rank of the job (torchrun on each node);
* ``rank_env``: who this rank is, when the system itself started one process per rank.

What every backend is made of is in ``scalerepro.schedulers.base`` (with ``LOCAL``, this machine
with no batch system, the fallback); ``scalerepro.schedulers.slurm`` is registered below, and
``scalerepro.schedulers.cores`` gives each rank its share of the job's cores. What the workflow asks a scheduler for when it submits (resources, the check
that it answers) is planning, not run time: ``scalerepro.planning.submission``, so that editing it
reruns no training job. A second backend (Flux, PBS, LSF) is one class here and one there: see
README, "Add a scheduler".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from scalerepro.schedulers.base import LOCAL, Scheduler


def local_gpu_names(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The names of the GPUs this machine's jobs can use, from nvidia-smi (the workflow's own
    environment needs no torch), as ``CUDA_VISIBLE_DEVICES`` narrows them: what the ranks see."""
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if listed.returncode != 0:
        return []
    return visible_gpu_names(listed.stdout, environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpu_names(nvidia_smi_l: str, cuda_visible_devices: str | None) -> list[str]:
    """The GPUs of ``nvidia-smi -L`` that CUDA shows a process under ``cuda_visible_devices``, by
    name, in CUDA's order. nvidia-smi lists each GPU, and under it its MIG instances:

        GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-e7038405-b552-3705-127c-81a8843d7291)
          MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)

    As the CUDA runtime reads the variable: unset, every GPU; otherwise a comma-separated list of
    GPU indices or UUIDs ("GPU-..." or "MIG-...", a unique prefix is enough), read up to the
    first entry that names no device, so that an empty value, "-1" or "NoDevFiles" leave none. A
    MIG instance is named as scalerepro.telemetry.hardware reads it: "<GPU name> MIG 3g.40gb"."""
    devices: list[tuple[str | None, str, str]] = []  # (GPU index or None for a MIG instance, UUID, name)
    gpu_name = ""
    for line in nvidia_smi_l.splitlines():
        head, _, uuid = line.partition(" (UUID: ")
        uuid = uuid.rstrip(")")
        if line.startswith("GPU "):
            index, gpu_name = head[4:].split(": ", 1)
            devices.append((index, uuid, gpu_name))
        elif line.lstrip().startswith("MIG ") and uuid:
            devices.append((None, uuid, f"{gpu_name} MIG {line.split()[1]}"))
    if cuda_visible_devices is None:
        return [name for index, _, name in devices if index is not None]
    visible = []
    for entry in (part.strip() for part in cuda_visible_devices.split(",")):
        named = [name for index, uuid, name in devices if entry and (entry == index or (entry.startswith(("GPU-", "MIG-")) and uuid.startswith(entry)))]
        if len(named) != 1:
            break  # CUDA stops at the first entry that names no device (or several)
        visible.append(named[0])
    return visible


def _backends() -> dict[str, Scheduler]:
    from scalerepro.schedulers.slurm import SLURM

    return {backend.name: backend for backend in (SLURM,)}


def backend(name: str) -> Scheduler:
    return LOCAL if name == LOCAL.name else _backends()[name]


def current(environ: Mapping[str, str] = os.environ) -> Scheduler:
    """The scheduler whose job this process runs in (LOCAL when none)."""
    return next((b for b in _backends().values() if b.in_job(environ)), LOCAL)


def for_executor(executor: str | None) -> Scheduler:
    """The scheduler a Snakemake executor submits to (LOCAL for the local executor)."""
    return next((b for b in _backends().values() if executor and b.executor == executor), LOCAL)


def invocation_executor(argv: Sequence[str], environ: Mapping[str, str], profile_executor: Callable[[str], str | None]) -> str | None:
    """The executor a Snakemake command line asks for: --executor/-e, else its profile's
    (--profile or $SNAKEMAKE_PROFILE; ``profile_executor`` reads a profile by name as
    Snakemake finds it). Snakemake reads the Snakefile before it sets the executor up, and the
    study's shape depends on the answer (device, GPU counts), so it is read where Snakemake does."""
    executor, profile = None, environ.get("SNAKEMAKE_PROFILE")
    for flag, value in zip(argv, argv[1:]):
        if flag in ("--executor", "-e"):
            executor = value
        elif flag == "--profile":
            profile = value
    for arg in argv:
        if arg.startswith("--executor="):
            executor = arg.split("=", 1)[1]
        elif arg.startswith("--profile="):
            profile = arg.split("=", 1)[1]
    return executor if executor is not None or not profile else profile_executor(profile)
