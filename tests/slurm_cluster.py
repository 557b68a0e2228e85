"""The test Slurm cluster (tests/slurm/cluster.sh, two nodes on 127.0.0.1): how to reach it and
the profile arguments the Slurm tests and the dry-run job listings share."""

from __future__ import annotations

import subprocess

from conftest import REPO
from workflow_runs import workflow_env

CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
STUDY = REPO / "tests" / "slurm" / "study.yaml"
# The profile as committed, with status checks fast enough for jobs that last seconds.
PROFILE_ARGS = ["--profile", "slurm", "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5"]


def cluster_env() -> dict[str, str]:
    exports = subprocess.run([str(CLUSTER_SH), "env"], capture_output=True, text=True, check=True).stdout
    name, _, value = exports.strip().removeprefix("export ").partition("=")
    return {name: value}


def snakemake_env(slurm_env: dict[str, str]) -> dict[str, str]:
    return workflow_env(**slurm_env)
