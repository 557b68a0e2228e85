"""`snakemake --profile slurm` against a real Slurm: controller, accounting database and two
compute daemons on 127.0.0.1 (tests/slurm/cluster.sh), fake GPUs, training on the CPU with gloo.

The module starts the cluster itself when Slurm is installed and this is root, and stops it
afterwards. Without Slurm the tests skip with the reason, except in CI (``CI`` set), where a
missing cluster is a failure: these tests must run there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ALL_CORES, REPO, clean_env, load_record
from slurm_cluster import CLUSTER_SH, PROFILE_ARGS, STUDY, cluster_env, snakemake_env
from workflow_runs import COPY_IGNORE, cifar_server  # noqa: F401 - a fixture, used by name

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
# Its runs are compared bit for bit with runs made here: both see every core (one thread per core).
pytestmark = [pytest.mark.slow, pytest.mark.all_cores]


def _cluster_answers(env: dict[str, str]) -> bool:
    """Whether the test cluster answers. sinfo retries a controller that is down for about a
    minute (63 s of every suite's Slurm setup); one that runs answers in milliseconds."""
    if shutil.which("sinfo") is None:
        return False
    try:
        nodes = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], capture_output=True, text=True, env={**os.environ, **env}, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return nodes.returncode == 0 and len(nodes.stdout.split("\n")) >= 2


@pytest.fixture(scope="module")
def slurm_env():
    """The environment that reaches the test cluster, started here if it is not running."""
    env = cluster_env()
    started = False
    if not _cluster_answers(env):
        reason = None
        if shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists():
            reason = "Slurm is not installed (tests/slurm/cluster.sh install, as root)"
        elif os.geteuid() != 0:
            reason = "starting the test cluster needs root (tests/slurm/cluster.sh start)"
        if reason:
            if os.environ.get("CI"):
                pytest.fail(f"the Slurm tests must run in CI: {reason}")
            pytest.skip(reason)
        # the daemons, and the job steps they start, on every core (not this xdist worker's one)
        begun = subprocess.run(
            [str(CLUSTER_SH), "start"], check=True, timeout=180, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, ALL_CORES)
        )
        started = "already running" not in begun.stdout  # a slow controller's cluster is not ours to stop
    yield env
    if started:
        subprocess.run([str(CLUSTER_SH), "stop"], check=False, timeout=120)


def _snakemake(workdir: Path, env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def _copy(tmp_path_factory, name: str) -> Path:
    workdir = tmp_path_factory.mktemp(name) / "scalerepro"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    return workdir


def _sacct(env: dict[str, str], *job_ids: str) -> list[dict[str, str]]:
    """One row per job (allocations only, -X): id, comment (the rule and wildcards), state, exit code, nodes."""
    fields = ["JobID", "Comment", "State", "ExitCode", "NNodes", "NodeList", "AllocTRES"]
    selection = ["--jobs", ",".join(job_ids)] if job_ids else ["--starttime", "now-1hour"]
    listed = subprocess.run(
        ["sacct", "-X", "--noheader", "--parsable2", f"--format={','.join(fields)}", *selection],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return [dict(zip(fields, line.split("|"))) for line in listed.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def slurm_study(tmp_path_factory, slurm_env, cifar_server):  # noqa: F811 - the imported fixture
    """The CI study submitted to the test cluster, once."""
    workdir = _copy(tmp_path_factory, "slurm-study")
    url, md5 = cifar_server
    env = snakemake_env(slurm_env)
    started = time.monotonic()
    result = _snakemake(
        workdir,
        env,
        *PROFILE_ARGS,
        "--configfile",
        "config/ci.yaml",
        str(STUDY),
        "--config",
        f"cifar10={{url: '{url}', md5: '{md5}'}}",
    )
    print(f"Slurm study: the whole DAG in {time.monotonic() - started:.0f} s")
    logs = "\n".join(f"--- {p}\n{p.read_text()[-1500:]}" for p in sorted((workdir / "results").rglob("*.log")) if p.stat().st_size)
    assert result.returncode == 0, result.stderr[-6000:] + logs[-6000:]
    return workdir, env, result


def test_the_whole_dag_runs_on_slurm_with_a_two_node_eight_rank_run(slurm_study):
    workdir, env, _ = slurm_study
    record = load_record(workdir / "results/runs/strong_cnn_g8_r1/record.json")
    assert record["status"] == "ok"
    assert record["parallel"]["nodes"] == 2 and record["parallel"]["world_size"] == 8
    assert record["parallel"]["ranks_per_node"] == 4 and record["parallel"]["hostnames"] == ["node01", "node02"]
    job_id = record["scheduler"]["job_id"]
    assert record["scheduler"]["name"] == "slurm" and record["scheduler"]["partition"] == "gpu"
    assert isinstance(job_id, int) and record["scheduler"]["num_nodes"] == 2
    (job,) = _sacct(env, str(job_id))
    assert job["Comment"] == "rule_train_wildcards_strong_cnn_g8_r1" and job["State"] == "COMPLETED"
    assert job["NNodes"] == "2" and "gres/gpu=8" in job["AllocTRES"]
    one_rank = load_record(workdir / "results/runs/strong_cnn_g1_r1/record.json")
    assert one_rank["parallel"]["world_size"] == 1 and one_rank["scheduler"]["job_id"] != job_id
    comm = json.loads((workdir / "results/comm/g8.json").read_text())
    assert comm["world_size"] == 8
    assert (workdir / "results/report/index.html").stat().st_size > 10_000


def test_sacct_shows_one_job_per_rule_job(slurm_study):
    workdir, env, result = slurm_study
    submitted = sorted(line.split("SLURM jobid ")[1].split(" ")[0] for line in result.stderr.splitlines() if "SLURM jobid" in line)
    jobs = _sacct(env, *submitted)
    comments = sorted(job["Comment"] for job in jobs)
    runs = sorted(p.parent.name for p in (workdir / "results/runs").glob("*/record.json"))
    expected = {f"rule_train_wildcards_{run}" for run in runs} | {"rule_comm_benchmark_wildcards_8", "rule_system_inventory"}
    assert len(comments) == len(set(comments)) == len(submitted), comments  # one job per rule job
    assert expected <= set(comments) and all(c.startswith("rule_") for c in comments), comments
    assert all(job["State"] == "COMPLETED" for job in jobs)
    # Local rules (the download, the fingerprint, the analysis: tables, figures, the report) ran on
    # the submitting host, never waiting in the GPU partition's queue.
    local = ("fetch_cifar10", "code_fingerprint", "aggregate", "plots", "report", "store_")
    assert not any(name in c for c in comments for name in local), comments
    assert (workdir / "results/data/cifar10/manifest.json").exists()


def _write_config(workdir: Path, name: str, values: dict) -> str:
    path = workdir / name
    path.write_text(yaml.safe_dump(values))
    return name


def _final_loss(record: dict) -> float:
    return record["loss_log"][-1]["loss"]


def test_a_preempted_run_checkpoints_is_retried_and_matches_an_uninterrupted_run(tmp_path_factory, slurm_env):
    """Slurm's time-limit warning (the --signal the jobs ask for) arrives mid-run: the ranks
    checkpoint and exit 75, Snakemake retries the job, the retry resumes from the checkpoint,
    and the final loss equals that of a run never interrupted."""
    workdir = _copy(tmp_path_factory, "slurm-preempt")
    # The job and the reference run are one-rank trainers on every core: with OpenMP's spinning
    # waits, a busy neighbour (the other xdist worker) made them 5x slower. Passive waits change
    # no arithmetic, so the bit-for-bit comparison stands.
    env = {**snakemake_env(slurm_env), "OMP_WAIT_POLICY": "PASSIVE"}
    steps = 600
    config = _write_config(
        workdir,
        "preempt.yaml",
        {
            "data": "synthetic",
            "steps": steps,
            "repeats": 1,
            "trainer_args": ["--num-workers", "0", "--eval-samples", "64", "--comm-probe-steps", "2", "--log-interval", "20"],
            "scaling": {"gpu_counts": [1], "max_gpus": 1, "weak": {"enabled": False}},
            "sensitivity": {"enabled": False},
            "ablation": {"enabled": False},
            "communication": {"enabled": False},
        },
    )
    run = "strong_cnn_g1_r1"
    target = f"results/runs/{run}/record.json"
    log = workdir / f"results/runs/{run}/train.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "snakemake", target, *PROFILE_ARGS, "--configfile", "config/ci.yaml", str(STUDY), config],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Wait until the run is well into its steps, then send the warning to its job's steps.
        deadline = time.monotonic() + 240
        while not (log.exists() and f"step 100/{steps}" in log.read_text()):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the run never reached step 100:\n{process.communicate(timeout=60)[0][-4000:] if process.poll() is not None else ''}")
            time.sleep(0.5)
        queue = subprocess.run(["squeue", "--noheader", "--format=%i|%k"], capture_output=True, text=True, env={**os.environ, **env}, check=True)
        (job_id,) = [line.split("|")[0] for line in queue.stdout.splitlines() if line.endswith(f"|rule_train_wildcards_{run}")]
        subprocess.run(["scancel", "--signal=USR1", job_id], env={**os.environ, **env}, check=True)
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-6000:]
    record = load_record(workdir / target)
    assert record["status"] == "ok" and record["steps"]["completed"] == steps
    # Snakemake clears a failed job's log before the retry: the retry's log and record tell.
    log_text = log.read_text()
    resumed = re.search(r"resumed from (\S+step-(\d+)\.pt) at step (\d+)", log_text)
    assert resumed, log_text[-3000:]
    assert 100 <= int(resumed.group(3)) < steps and int(resumed.group(2)) == int(resumed.group(3))
    assert record["steps"]["resumed_from"] == resumed.group(1)
    attempts = [j for j in _sacct(env) if j["Comment"] == f"rule_train_wildcards_{run}"]
    states = sorted((j["State"], j["ExitCode"]) for j in attempts if int(j["JobID"]) >= int(job_id))
    assert [state for state, _ in states] == ["COMPLETED", "FAILED"], states
    assert record["scheduler"]["job_id"] != int(job_id)  # the record comes from the retry

    # The same run, uninterrupted, on this machine: the same final loss, bit for bit.
    reference = workdir / "reference.json"
    command = record["command_line"]
    args = command[command.index("scalerepro.training.train") + 1 :] if "scalerepro.training.train" in command else command[1:]
    args = [a for a in args if a != "--resume"]
    for flag, value in (("--record", str(reference)), ("--checkpoint-dir", str(workdir / "reference-ckpt"))):
        args[args.index(flag) + 1] = value
    subprocess.run([sys.executable, "-m", "scalerepro.training.train", *args], cwd=workdir, env=clean_env(OMP_WAIT_POLICY="PASSIVE"), check=True, timeout=300)
    assert _final_loss(load_record(reference)) == _final_loss(record)


def test_a_failing_rule_names_its_slurm_job_and_logs(tmp_path_factory, slurm_env):
    workdir = _copy(tmp_path_factory, "slurm-fail")
    env = snakemake_env(slurm_env)
    # A bad trainer flag is now refused before anything is submitted (scalerepro.planning.study), and a
    # run that fails inside the trainer leaves a failed record (its job succeeds). What still fails
    # a job: the site's Slurm module not loaded in it, so srun is not on the job's PATH.
    config = _write_config(
        workdir,
        "failing.yaml",
        {
            "data": "synthetic",
            "repeats": 1,
            "slurm": {"env": {"PATH": "/nonexistent"}},
            # the prescreen's link job starts its ranks with srun too, and would fail first
            "prescreen": {"enabled": False},
            "scaling": {"gpu_counts": [1], "max_gpus": 1, "weak": {"enabled": False}},
            "sensitivity": {"enabled": False},
            "ablation": {"enabled": False},
            "communication": {"enabled": False},
        },
    )
    run = "strong_cnn_g1_r1"
    result = _snakemake(
        workdir, env, f"results/runs/{run}/record.json", *PROFILE_ARGS, "--retries", "0", "--configfile", "config/ci.yaml", str(STUDY), config, timeout=300
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Error in rule train" in output
    job_id = output.split("SLURM-job '")[1].split("'")[0]
    assert f"results/runs/{run}/train.log" in output
    slurm_log = f"results/logs/slurm/rule_train/{run}/{job_id}.log"
    assert slurm_log in output and (workdir / slurm_log).exists()
    assert "inside a Slurm job but srun is not on PATH" in (workdir / f"results/runs/{run}/train.log").read_text()


def test_the_slurm_dry_run_plans_the_jobs_of_the_snapshot(slurm_env):
    """As tests/test_dryrun.py, for the profile's submissions (resources, sbatch flags, srun launch)."""
    from dryrun_jobs import SINCE_SNAPSHOT, cpu_plan_env, planned_jobs, snapshot

    layers = (str(STUDY), "tests/fixtures/dryrun/slurm_weak.yaml", *SINCE_SNAPSHOT)
    # the prescreen's precision is the plan's (bf16 only where this CPU has it): a CPU without it
    planned = planned_jobs(REPO, cpu_plan_env(snakemake_env(slurm_env)), *PROFILE_ARGS, "--configfile", "config/ci.yaml", *layers)
    expected = snapshot("slurm")
    assert [job.get("output") for job in planned] == [job.get("output") for job in expected]
    for job, before in zip(planned, expected):
        assert job == before, f"{job['rule']} {job.get('wildcards', '')}"


def test_an_unknown_partition_is_one_clear_error(tmp_path_factory, slurm_env):
    workdir = _copy(tmp_path_factory, "slurm-partition")
    env = snakemake_env(slurm_env)
    config = _write_config(workdir, "partition.yaml", {"slurm": {"partition": "nosuch"}})
    result = _snakemake(workdir, env, *PROFILE_ARGS, "-n", "--configfile", "config/ci.yaml", str(STUDY), config, timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "config error at 'slurm.partition': 'nosuch' is not a partition of this cluster (sinfo lists: gpu)" in output


# ---- the prescreen: a slow node found, excluded and named; mended, taken back ------------------


def _slurmd_pid(env: dict[str, str], node: str) -> int:
    run = Path(env["SLURM_CONF"]).parents[1] / "run"
    return int((run / f"slurmd-{node}.pid").read_text())


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` to ``cores``: the jobs its slurmd starts from now on inherit them."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


# it compares two nodes' figures: no other test may load either node's core beside it
@pytest.mark.measures
def test_a_slow_node_is_excluded_named_and_taken_back_once_mended(tmp_path_factory, slurm_env):
    """The two test nodes share this host: each slurmd (and so each job it starts) is pinned to
    its own core, so that they are two machines of one core; a process spinning on node01's core
    makes node01 the slow node. The study whose largest run needs both nodes stops before its
    first training job, naming node01 and its figure; the same study up to one node's GPUs runs on
    node02 (its node records reused: only the rule is applied again); with
    the spinner gone, the prescreen run again passes node01, and the finished run is not redone."""
    if len(ALL_CORES) < 2:
        pytest.skip("two cores are needed: one a node")
    workdir = _copy(tmp_path_factory, "slurm-prescreen")
    env = snakemake_env(slurm_env)
    first, second = sorted(ALL_CORES)[:2]
    config = _write_config(
        workdir,
        "prescreen.yaml",
        {
            "data": "synthetic",
            "repeats": 1,
            "scaling": {"gpu_counts": [1, 8], "max_gpus": 8, "weak": {"enabled": False}},
            "sensitivity": {"enabled": False},
            "ablation": {"enabled": False},
            "communication": {"enabled": False},
        },
    )
    args = (*PROFILE_ARGS, "--configfile", "config/ci.yaml", str(STUDY), config)
    # the same study with one node's worth of GPUs at most: the screen it needs passes with one node
    one_node = _write_config(workdir, "one_node.yaml", {"scaling": {"gpu_counts": [1, 4], "max_gpus": 4}})
    pids = {node: _slurmd_pid(slurm_env, node) for node in ("node01", "node02")}
    spinner = None
    try:
        _pin(pids["node01"], {first})
        _pin(pids["node02"], {second})
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {first}))
        trained_before = {job["JobID"] for job in _sacct(env) if job["Comment"].startswith("rule_train")}
        stopped = _snakemake(workdir, env, "results/runs/strong_cnn_g8_r1/record.json", *args, timeout=600)
        assert stopped.returncode != 0
        said = [line for line in (stopped.stdout + stopped.stderr).splitlines() if line.startswith("scalerepro.planning.node_screen: error: ")]
        assert len(said) == 1 and "1 of 2 nodes passed the prescreen" in said[0] and "node01: matmul_tflops" in said[0] and "needs 2" in said[0], said
        assert {job["JobID"] for job in _sacct(env) if job["Comment"].startswith("rule_train")} == trained_before  # none submitted
        assert sorted(p.name for p in (workdir / "results/prescreen/nodes").glob("*.json")) == ["node01.json", "node02.json"]  # kept

        ran = _snakemake(workdir, env, "results/runs/strong_cnn_g1_r1/record.json", "results/prescreen/screen.json", *args, one_node, timeout=600)
        assert ran.returncode == 0, ran.stderr[-4000:]
        screen = json.loads((workdir / "results/prescreen/screen.json").read_text())
        (slow,) = [node for node in screen["nodes"] if node["excluded_because"]]
        assert slow["node"] == "node01" and slow["ratios"]["matmul_tflops"] < screen["fraction"]
        record = load_record(workdir / "results/runs/strong_cnn_g1_r1/record.json")
        assert record["parallel"]["hostnames"] == ["node02"]
        (job,) = _sacct(env, str(record["scheduler"]["job_id"]))
        assert job["NodeList"] == "node02"
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        for pid in pids.values():
            _pin(pid, set(ALL_CORES))

    _pin(pids["node01"], {first})
    _pin(pids["node02"], {second})
    try:
        mended = _snakemake(
            workdir,
            env,
            "results/runs/strong_cnn_g1_r1/record.json",
            "results/prescreen/screen.json",
            *args,
            one_node,
            "--forcerun",
            "prescreen_node",
            timeout=600,
        )
    finally:
        for pid in pids.values():
            _pin(pid, set(ALL_CORES))
    assert mended.returncode == 0, mended.stderr[-4000:]
    screen = json.loads((workdir / "results/prescreen/screen.json").read_text())
    assert [node["node"] for node in screen["nodes"] if not node["excluded_because"]] == ["node01", "node02"], screen
    assert load_record(workdir / "results/runs/strong_cnn_g1_r1/record.json")["scheduler"]["job_id"] == record["scheduler"]["job_id"]
