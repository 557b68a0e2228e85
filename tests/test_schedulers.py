"""scalerepro.schedulers: which scheduler a process runs under, what it records, what it submits."""

from __future__ import annotations

import pytest

from scalerepro import schedulers
from scalerepro.planning.submission import SUBMISSIONS
from scalerepro.schedulers.base import LOCAL, SchedulerError
from scalerepro.schedulers.slurm import SLURM


def test_the_scheduler_is_the_one_whose_job_this_is_else_local() -> None:
    assert schedulers.current({"HOME": "/root"}) is LOCAL
    assert schedulers.current({"SLURM_JOB_ID": "7"}) is SLURM
    assert LOCAL.job_facts({}) == {"name": "local", "job_id": None, "cluster_name": None, "partition": None}
    assert schedulers.for_executor("slurm") is SLURM and schedulers.for_executor(None) is LOCAL
    assert schedulers.for_executor("local") is LOCAL


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["snakemake", "--cores", "all"], {}, None),
        (["snakemake", "--executor", "slurm"], {}, "slurm"),
        (["snakemake", "-e", "slurm"], {}, "slurm"),
        (["snakemake", "--executor=slurm"], {}, "slurm"),
        (["snakemake", "--profile", "slurm"], {}, "from-profile:slurm"),
        (["snakemake", "--profile=slurm"], {}, "from-profile:slurm"),
        (["snakemake"], {"SNAKEMAKE_PROFILE": "mine"}, "from-profile:mine"),
        (["snakemake", "--profile", "slurm", "--executor", "local"], {}, "local"),  # the flag wins
    ],
)
def test_the_executor_of_a_command_line(argv, environ, expected) -> None:
    assert schedulers.invocation_executor(argv, environ, lambda name: f"from-profile:{name}") == expected


def test_slurm_submission_resources_quote_every_extra_token() -> None:
    settings = {"extra": ["--comment=a b"], "signal_before_end_s": 300}
    resources = SUBMISSIONS["slurm"].submission_resources(settings, ranks_per_node=4, nodes=2, gpus=True, signal=True, exclusive=True)
    assert resources == {"mpi": "", "tasks_per_gpu": 0, "gres": "gpu:4", "slurm_extra": "'--comment=a b' --exclusive --signal=USR1@300"}
    bare = SUBMISSIONS["slurm"].submission_resources({"extra": [], "signal_before_end_s": 1}, 1, 1, gpus=False, signal=False, exclusive=False)
    assert bare["gres"] is None and bare["slurm_extra"] is None


def test_slurm_check_without_sinfo_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SchedulerError, match="sinfo is not on PATH"):
        SUBMISSIONS["slurm"].check({"partition": None})


def test_slurm_facts_parses_a_job_environment() -> None:
    environ = {
        "SLURM_JOB_ID": "123457",
        "SLURM_ARRAY_JOB_ID": "123450",
        "SLURM_ARRAY_TASK_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NAME": "resnet50-scaling",
        "SLURM_CLUSTER_NAME": "alps",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_NODELIST": "gpu[001-004]",
        "SLURM_STEP_NODELIST": "gpu[001-002]",
        "SLURM_NNODES": "4",
        "SLURM_NTASKS": "16",
        "SLURM_CPUS_PER_TASK": "8",
        "SLURM_GPUS": "h100:16",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_GPUS": "0,1,2,3",
        "SLURM_RESTART_COUNT": "1",
    }
    assert SLURM.job_facts(environ) == {
        "name": "slurm",
        "job_id": 123457,
        "array_job_id": 123450,
        "array_task_id": 7,
        "step_id": 0,
        "job_name": "resnet50-scaling",
        "cluster_name": "alps",
        "partition": "gpu",
        "node_list": "gpu[001-004]",
        "step_node_list": "gpu[001-002]",
        "num_nodes": 4,  # from SLURM_NNODES when SLURM_JOB_NUM_NODES is absent
        "ntasks": 16,
        "cpus_per_task": 8,
        "gpus": "h100:16",
        "gpus_on_node": 4,
        "job_gpus": "0,1,2,3",
        "restart_count": 1,
    }


def test_slurm_facts_minimal_job_leaves_the_rest_none() -> None:
    facts = SLURM.job_facts({"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "9"})
    assert facts is not None
    assert facts["job_id"] == 42
    assert facts["num_nodes"] == 2  # SLURM_JOB_NUM_NODES wins
    assert facts["array_task_id"] is None and facts["restart_count"] is None


# nvidia-smi -L's listing: a line per GPU, and under a GPU in MIG mode a line per instance (the
# layout of NVIDIA's MIG user guide; GPU 0's UUID is the H100 lent to issue 24's session)
NVIDIA_SMI_L = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-e7038405-b552-3705-127c-81a8843d7291)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-5f2d1c3a-0b1e-4c61-9d07-2b8f0f7d9a11)
  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.40gb     Device  1: (UUID: MIG-0a9b7c55-6e4f-5d21-8c3b-1f2e3d4c5b6a)
"""


@pytest.mark.parametrize(
    "visible, names",
    [
        (None, ["H100", "H100"]),
        ("1", ["H100"]),
        ("1,0", ["H100", "H100"]),
        ("", []),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,7,1", ["H100"]),  # CUDA stops at the first entry naming no GPU
        ("GPU-5f2d", ["H100"]),  # a unique UUID prefix
        ("GPU-", []),  # a prefix of every GPU names none
        ("MIG-0a9b7c55-6e4f-5d21-8c3b-1f2e3d4c5b6a", ["H100 MIG 3g.40gb"]),
    ],
)
def test_the_local_gpus_are_those_cuda_visible_devices_leaves(visible, names):
    from scalerepro.schedulers import visible_gpu_names

    got = visible_gpu_names(NVIDIA_SMI_L, visible)
    assert [name.replace("NVIDIA ", "").replace(" 80GB HBM3", "") for name in got] == names
    assert all(name.startswith("NVIDIA H100 80GB HBM3") for name in got)
