"""The rules plan the same jobs with the same resources and rank commands as before the rules'
helpers moved into the package (issue 16): see tests/dryrun_jobs.py for what is compared and how
the snapshots were written. The Slurm case is in test_slurm.py (it needs the test cluster)."""

from __future__ import annotations

import pytest

from conftest import REPO, clean_env
from dryrun_jobs import LOCAL_CASES, cpu_plan_env, gpu_machine_env, planned_jobs, snapshot

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_the_dry_run_plans_the_jobs_of_the_snapshot(case, tmp_path):
    args, gpus = LOCAL_CASES[case]
    env = gpu_machine_env(tmp_path / "bin", gpus, clean_env()) if gpus else cpu_plan_env(clean_env())
    planned, expected = planned_jobs(REPO, env, *args), snapshot(case)
    assert [job.get("output") for job in planned] == [job.get("output") for job in expected]
    for job, before in zip(planned, expected):
        assert job == before, f"{job['rule']} {job.get('wildcards', '')}"
