"""The jobs a dry run plans, as data: what a refactoring of the rules must leave unchanged.

    python tests/dryrun_jobs.py            # rewrite tests/fixtures/dryrun/*.json from this checkout

``planned_jobs`` runs ``snakemake -n -p --forceall`` (every job of the DAG, whatever results/
holds) and keeps, per job, what the scheduler and the ranks see: the rule, its wildcards and
outputs, threads, resources (less ``tmpdir``, which is the machine's) and, for the rules that
start ranks, the shell command (launcher and trainer flags). Snapshots were written from the
commit before the rules' helpers moved into the package (issue 16); tests/test_dryrun.py and
the Slurm test compare today's plan with them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = REPO / "tests" / "fixtures" / "dryrun"
# The rules whose command is part of the plan: they start ranks with resolved flags.
RANK_RULES = {"train", "comm_benchmark", "profile", "prescreen_node", "prescreen_link"}


def planned_jobs(workdir: Path, env: dict[str, str], *args: str, timeout: float = 300) -> list[dict]:
    """Every job of ``snakemake -n -p --forceall ARGS`` in ``workdir``, sorted by rule and outputs."""
    command = [sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", *args]
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    jobs, job = [], None
    for line in result.stdout.splitlines():
        if line.startswith(("rule ", "localrule ", "checkpoint ", "localcheckpoint ")) and line.endswith(":"):
            job = {"rule": line.split(" ", 1)[1].rstrip(":")}
            jobs.append(job)
        elif job is None:
            continue
        elif line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            if key in ("output", "wildcards", "threads"):
                job[key] = value
            elif key == "resources":
                job[key] = ", ".join(part for part in value.split(", ") if not part.startswith("tmpdir="))
        elif line.startswith("Shell command: ") and job["rule"] in RANK_RULES:
            job["command"] = line.removeprefix("Shell command: ")
    # a local prescreen's node is this host, whose name is the machine's, as tmpdir is
    host = socket.gethostname()
    for job in jobs:
        if job["rule"] == "prescreen_node":
            job.update({key: job[key].replace(host, "<this host>") for key in ("output", "wildcards", "command") if key in job})
    return sorted(jobs, key=lambda job: (job["rule"], job.get("output", "")))


def gpu_machine_env(bin_dir: Path, gpus: int, base: dict[str, str]) -> dict[str, str]:
    """``base`` with an ``nvidia-smi`` on PATH that lists ``gpus`` H100s in nvidia-smi's format
    (the workflow counts a machine's GPUs with `nvidia-smi -L` alone, and a dry run asks the
    hardware nothing else)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08x}-5b9d-ab3c-d5c0-8b8b2e5a1d4e)" for i in range(gpus))
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 9\ncat <<"LIST"\n{listing}\nLIST\n')
    fake.chmod(0o755)
    return {**base, "PATH": f"{bin_dir}{os.pathsep}{base['PATH']}"}


# The studies added since the snapshots were written (issue 17's parallelism), switched off so
# that the snapshots still compare the plan of the refactored rules with the one before them;
# the layer goes last (a --configfile list is merged in order).
SINCE_SNAPSHOT = ("tests/fixtures/dryrun/before_parallelism.yaml",)
# case -> (extra snakemake arguments, GPUs nvidia-smi lists); the Slurm case lives in test_slurm.py
LOCAL_CASES = {
    "cpu-default": (("--configfile", "config/config.yaml", *SINCE_SNAPSHOT), 0),
    "gpu8-default": (("--configfile", "config/config.yaml", *SINCE_SNAPSHOT), 8),
    "ci": (("--configfile", "config/ci.yaml", *SINCE_SNAPSHOT), 0),
}


def cpu_plan_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` for a CPU case: a CPU study's plan depends on whether the CPU has native bf16 (the
    preset's precision, and so which cells share a run), and the snapshots are of a CPU without
    it, which any CPU can be made (oneDNN held at AVX2), so that they hold on every machine."""
    return {**base, "ONEDNN_MAX_CPU_ISA": "AVX2"}


def snapshot(case: str) -> list[dict]:
    return json.loads((SNAPSHOTS / f"{case}.json").read_text())


def _write(case: str, jobs: list[dict]) -> None:
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    (SNAPSHOTS / f"{case}.json").write_text(json.dumps(jobs, indent=1) + "\n")
    print(f"{case}: {len(jobs)} jobs")


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from conftest import clean_env

    with tempfile.TemporaryDirectory() as scratch:
        for case, (args, gpus) in LOCAL_CASES.items():
            env = gpu_machine_env(Path(scratch) / case, gpus, clean_env()) if gpus else cpu_plan_env(clean_env())
            _write(case, planned_jobs(REPO, env, *args))
    if "--slurm" in sys.argv:  # needs the test cluster (tests/slurm/cluster.sh start)
        from slurm_cluster import PROFILE_ARGS, STUDY, cluster_env, snakemake_env

        env = cpu_plan_env(snakemake_env(cluster_env()))
        _write(
            "slurm",
            planned_jobs(REPO, env, *PROFILE_ARGS, "--configfile", "config/ci.yaml", str(STUDY), "tests/fixtures/dryrun/slurm_weak.yaml", *SINCE_SNAPSHOT),
        )
