"""Which CPU cores a job and each of its ranks run on, from the job's own allocation.

A job's cores are those it was given: on Slurm the CPUs of its node task (srun binds the task to
them, and ``os.sched_getaffinity`` reads them), locally the first ``cpus`` cores of this machine
that the launcher may use (``scalerepro.launching.launch`` restricts itself to them before it starts the
ranks, as Snakemake gives the job ``threads`` cores). Each rank of a node takes its own equal,
contiguous share of them, as ``srun --cpu-bind=cores`` would, and as many intra-op threads as it
has cores. An inherited ``OMP_NUM_THREADS`` is never the per-rank count: Snakemake exports the
job-wide ``threads`` to every shell job, and 2 ranks each taking it would run 4 threads on 2 cores.

No torch here: the launcher uses it before any rank starts.
"""

from __future__ import annotations

from collections.abc import Iterable

# The cores a local rank runs on, as the local launcher gives each ("0,1"); under torchrun on a
# cluster node each rank takes its share of the node task's cores itself (rank_cores).
CORES_ENV = "SCALEREPRO_CORES"
# What reads a thread count from the environment at start: each gets the rank's own.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def job_cores(usable: Iterable[int], cpus: int | None) -> list[int]:
    """The job's cores: the first ``cpus`` of the cores this process may use (all of them when
    ``cpus`` is None or more than there are)."""
    cores = sorted(usable)
    return cores[:cpus] if cpus else cores


def rank_cores(job: Iterable[int], local_rank: int, local_world_size: int) -> list[int]:
    """Rank ``local_rank``'s own cores: its equal contiguous share of the job's cores (the
    remainder left idle, as a binding by whole shares does). With fewer cores than ranks each
    rank gets one core, shared round-robin: oversubscribed, and the record says which cores."""
    cores = sorted(job)
    if not cores:
        raise ValueError("the job has no CPU core to run on")
    share = len(cores) // local_world_size
    if share == 0:
        return [cores[local_rank % len(cores)]]
    return cores[local_rank * share : (local_rank + 1) * share]


def loader_workers(cores: int, cap: int = 4) -> int:
    """DataLoader worker processes that fit a rank's cores: one core stays with the rank's own
    process (it launches the kernels or computes the steps), the rest load, at most ``cap``."""
    return max(0, min(cap, cores - 1))
