"""scalerepro.launching.launch: the command that starts a job's ranks, here and inside a Slurm job.

The commands are checked as composed (the real Slurm runs are in test_slurm.py); the local
path is run for real: two gloo ranks through torchrun.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from scalerepro.launching import launch
from scalerepro.schedulers import cores, slurm

from conftest import clean_env, load_record

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

TRAIN = ["-m", "scalerepro.training.train", "--model", "cnn"]


def _args(*argv: str):
    return launch.parse_args([*argv, "--", *TRAIN])


def test_outside_slurm_the_launcher_starts_the_ranks_itself_on_loopback():
    assert launch.command(_args("--ranks-per-node=2"), environ={}) == [sys.executable, *TRAIN]
    envs = launch.local_rank_environments(2, 4321, 7, {"PATH": "/bin"}, [0, 1])
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "0", "2"), ("1", "1", "2")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["GLOO_SOCKET_IFNAME"], e["NCCL_SOCKET_IFNAME"]) for e in envs} == {("127.0.0.1", "4321", "lo", "lo")}
    assert envs[0][launch.STORE_FD_ENV] == "7" and launch.STORE_FD_ENV not in envs[1]
    assert launch.local_rank_environments(1, 1, 7, {"GLOO_SOCKET_IFNAME": "eth1"}, [0])[0]["GLOO_SOCKET_IFNAME"] == "eth1"


def test_each_local_rank_gets_its_own_cores_and_as_many_threads_whatever_it_inherits():
    # Snakemake exports the job's threads (ranks x cpus_per_gpu) to the job: never a rank's count
    inherited = {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4"}
    envs = launch.local_rank_environments(2, 1, 7, inherited, [4, 5, 6, 7])
    assert [e[cores.CORES_ENV] for e in envs] == ["4,5", "6,7"]
    assert all(e[name] == "2" for e in envs for name in cores.THREAD_VARIABLES)
    one_each = launch.local_rank_environments(2, 1, 7, inherited, [0, 1])
    assert [(e[cores.CORES_ENV], e["OMP_NUM_THREADS"]) for e in one_each] == [("0", "1"), ("1", "1")]


def test_a_job_takes_the_first_cores_it_was_given_and_each_rank_an_equal_share():
    assert cores.job_cores({3, 0, 2, 1}, 2) == [0, 1] and cores.job_cores({0, 1}, None) == [0, 1] and cores.job_cores({0, 1}, 8) == [0, 1]
    assert [cores.rank_cores(range(16), r, 4) for r in range(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [cores.rank_cores(range(5), r, 2) for r in range(2)] == [[0, 1], [2, 3]]  # the odd core idle
    assert [cores.rank_cores([0, 1], r, 4) for r in range(4)] == [[0], [1], [0], [1]]  # oversubscribed, shared round-robin
    assert [cores.loader_workers(n) for n in (1, 2, 5, 8)] == [0, 1, 4, 4]


def test_more_than_one_node_outside_slurm_is_refused_with_the_fix():
    with pytest.raises(launch.LaunchError, match="needs a cluster scheduler .*--profile slurm"):
        launch.command(_args("--nodes=2", "--ranks-per-node=4"), environ={})


def test_inside_a_slurm_job_it_is_one_srun_task_per_node_with_everything_explicit(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    args = _args("--nodes=2", "--ranks-per-node=4", "--cpus-per-node=32", "--slurm-gpus", "--port=29400", "--name=strong_g8")
    command = launch.command(args, environ={"SLURM_JOB_ID": "1234"})
    srun, agent = command[: command.index(sys.executable)], command[command.index(sys.executable) :]
    assert srun == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=32",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--label",
        "--job-name=strong_g8",
        "--gpus-per-node=4",
    ]
    assert agent == [
        sys.executable,
        "-m",
        "scalerepro.launching.launch",
        "--node-agent=slurm",
        "--nodes=2",
        "--ranks-per-node=4",
        "--cpus-per-node=32",
        "--port=29400",
        "--",
        *TRAIN,
    ]


def test_with_a_container_each_node_task_runs_in_it(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    args = _args("--nodes=2", "--ranks-per-node=4", "--slurm-gpus", "--container=results/containers/scalerepro.sif")
    command = slurm.SLURM.launch_command(launch.launch_request(args), "/venv/bin/python", {})
    start = command.index("apptainer")
    assert command[start : start + 6] == ["apptainer", "exec", "--nv", "results/containers/scalerepro.sif", "python", "-m"]


def test_the_node_agent_meets_on_the_first_host_of_the_step():
    args = _args("--node-agent=slurm", "--nodes=2", "--ranks-per-node=4", "--port=29417")
    environ = {"SLURM_STEP_NODELIST": "localhost,gpu[002-003]", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0"}
    command = launch.command(args, environ)
    assert command == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=4",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:29417",
        "--rdzv-id=1234.0",
        "--tee=3",
        *TRAIN,
    ]


def test_a_node_name_that_does_not_resolve_without_slurm_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    with pytest.raises(slurm.SchedulerError, match="'node-that-does-not-exist01' does not resolve"):
        slurm.resolve_host("node-that-does-not-exist01")


def test_the_rendezvous_port_moves_with_the_job_id():
    assert slurm.SLURM.rendezvous_port(29400, {"SLURM_JOB_ID": "123456"}) == 29400 + 456
    assert slurm.SLURM.rendezvous_port(29400, {}) == 29400


def test_env_flags_reach_the_ranks_and_bad_ones_are_refused(capsys):
    with pytest.raises(SystemExit):
        launch.parse_args(["--env", "NCCL_SOCKET_IFNAME", "--", *TRAIN])
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_two_local_ranks_train_through_the_launcher(tmp_path):
    record = tmp_path / "record.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalerepro.launching.launch",
            "--ranks-per-node=2",
            "--env=SCALEREPRO_TEST_MARK=1",
            "--",
            "-m",
            "scalerepro.training.train",
            "--model",
            "cnn",
            "--data",
            "synthetic",
            "--per-gpu-batch",
            "8",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--device",
            "cpu",
            "--eval-samples",
            "16",
            "--comm-probe-steps",
            "1",
            "--record",
            str(record),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parallel = load_record(record)["parallel"]
    assert parallel["world_size"] == 2 and parallel["launcher"] == "local" and parallel["nodes"] == 1
    assert "2 local rank(s), rendezvous on 127.0.0.1 only" in result.stderr


@pytest.mark.all_cores
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_ranks_of_a_snakemake_job_run_one_thread_on_a_core_of_their_own(tmp_path):
    """As Snakemake runs a 2-rank job of cpus_per_gpu 1: threads 2 exported job-wide, the launcher
    told the job has 2 cores. Each rank must run one thread on its own core (it ran 2 threads each
    on the same 2 cores: 4 threads on 2 cores), and the record must say which."""
    record = tmp_path / "record.json"
    env = {**clean_env(), "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalerepro.launching.launch",
            "--ranks-per-node=2",
            "--cpus-per-node=2",
            "--",
            "-m",
            "scalerepro.training.train",
            "--model",
            "cnn",
            "--per-gpu-batch",
            "8",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--device",
            "cpu",
            "--no-eval",
            "--comm-probe-steps",
            "0",
            "--bucket-probe-steps",
            "0",
            "--record",
            str(record),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_record(record)
    activity = record["measurements"]["host_activity"]
    first_two = sorted(os.sched_getaffinity(0))[:2]
    assert activity["intra_op_threads_per_rank"] == 1 and activity["cores_per_rank"] == [[first_two[0]], [first_two[1]]]
    assert record["config"]["data"]["num_workers"] == 0  # one core: the rank's own process loads


def test_the_node_agent_survives_slurms_warning_signal_and_its_ranks_inherit_the_choice(tmp_path):
    """The agent execs torchrun with SIGUSR1 ignored, so the signal Slurm sends to every process
    of the step cannot kill it; each rank sees SIG_IGN until StopRequest installs its handler."""
    script = tmp_path / "probe.py"
    script.write_text("import signal; print('rank sees SIGUSR1 ignored:', signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)")
    result = subprocess.run(
        [sys.executable, "-m", "scalerepro.launching.launch", "--node-agent=slurm", "--nodes=1", "--ranks-per-node=1", "--", str(script)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rank sees SIGUSR1 ignored: True" in result.stdout


def test_a_node_list_the_agent_cannot_read_is_one_clear_error():
    args = _args("--node-agent=slurm", "--nodes=2", "--ranks-per-node=4")
    with pytest.raises(launch.LaunchError, match="cannot parse the Slurm node list"):
        launch.command(args, {"SLURM_STEP_NODELIST": "[01-02]", "SLURM_JOB_ID": "1"})


def _pid_of_rank(rank: int, mark: str) -> int:
    """The process of ``rank`` among those carrying ``mark`` in their environment (/proc)."""
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if mark.encode() in environ and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no process of rank {rank} with {mark}")


def test_ranks_killed_before_writing_a_record_leave_the_launchers_failed_record(tmp_path):
    """Rank 0 (the one that writes records) is killed with SIGKILL, as the OOM killer or
    torchrun would kill it; rank 1 then loses its peer. Neither writes a record: the launcher
    writes the failed one, with each failed rank's exit code and the tail of each rank's log."""
    record = tmp_path / "record.json"
    mark = f"SCALEREPRO_TEST_MARK={uuid.uuid4()}"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scalerepro.launching.launch",
            "--ranks-per-node=2",
            f"--env={mark}",
            "--",
            "-m",
            "scalerepro.training.train",
            "--model",
            "cnn",
            "--per-gpu-batch",
            "16",
            "--num-workers",
            "0",
            "--synthetic-samples",
            "1024",
            "--eval-samples",
            "64",
            "--steps",
            "5000",
            "--warmup-steps",
            "2",
            "--log-interval",
            "5",
            "--device",
            "cpu",
            "--run-id",
            "killed",
            "--record",
            str(record),
        ],
        env=clean_env(),
        stdout=subprocess.PIPE,
        # The launcher writes its stderr until it is killed, past any with-block here.
        stderr=open(tmp_path / "launcher.err", "w"),  # noqa: SIM115
        text=True,
    )
    seen = []
    for line in launcher.stdout:
        seen.append(line)
        if line.startswith("[default0]:step 20/"):
            break
    os.kill(_pid_of_rank(0, mark), signal.SIGKILL)
    seen += launcher.stdout.readlines()
    assert launcher.wait(timeout=120) != 0
    errors = [line for line in (tmp_path / "launcher.err").read_text().splitlines() if line.startswith("scalerepro.launching.launch: error:")]
    assert len(errors) == 1 and "rank 0 (host" in errors[0] and "exit -9 (SIGKILL)" in errors[0], errors

    document = load_record(record)
    assert document["status"] == "failed" and document["run_id"] == "killed" and document["measurements"] is None
    error = document["error"]
    assert error["type"] == "RanksEndedWithoutRecord" and error["launcher_exit_code"] != 0
    by_rank = {failure["rank"]: failure for failure in error["ranks"]}
    assert by_rank[0]["exit_code"] == -9 and by_rank[0]["signal"] == "SIGKILL"
    assert set(error["log_tails"]) == {"local rank 0", "local rank 1"}
    assert any(line.startswith("step 20/") for line in error["log_tails"]["local rank 0"])
    assert any("lost contact with another rank" in line for line in error["log_tails"]["local rank 1"]), error["log_tails"]
    assert document["config"]["run"]["record"] == str(record) and document["seed"] == 0
    assert document["versions"]["torch"] and document["hardware"]["gpu"]["reason"].startswith("not read: this process imports no torch")


def test_a_record_the_ranks_wrote_is_never_replaced(tmp_path):
    """A run that fails inside the trainer writes its own record (status failed, rank 0's
    error): the launcher leaves it as it is."""
    record = tmp_path / "record.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalerepro.launching.launch",
            "--ranks-per-node=2",
            "--",
            "-m",
            "scalerepro.training.train",
            "--model",
            "cnn",
            "--num-workers",
            "0",
            "--synthetic-samples",
            "256",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--device",
            "cpu",
            "--lr",
            "1e9",
            "--lr-scaling",
            "none",
            "--log-interval",
            "1",
            "--record",
            str(record),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    document = load_record(record)
    assert document["status"] == "failed" and document["error"]["type"] == "NonFiniteLossError"
    assert "scalerepro.launching.launch: error:" not in result.stderr


def _listening_sockets(pids: set[int]) -> set[str]:
    """Local addresses of the TCP sockets the processes ``pids`` listen on (from /proc)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add(f"{ipaddress.ip_address(bytes.fromhex(address)[::-1] if width == 8 else _v6(address))}:{int(port, 16)}")
    return found


def _descendants(pid: int) -> set[int]:
    children = {int(c) for c in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()}
    return children.union(*(_descendants(child) for child in children))


def _v6(hex_address: str) -> bytes:
    # /proc prints an IPv6 address as four host-order 32-bit words
    return b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, 32, 8))


def test_a_local_run_listens_on_loopback_only(tmp_path):
    """torchrun --standalone served its rendezvous store on every interface: a connection to the
    machine's external address was accepted. Every socket the ranks listen on must be loopback."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scalerepro.launching.launch",
            "--ranks-per-node=2",
            "--",
            "-m",
            "scalerepro.training.train",
            "--model",
            "cnn",
            "--data",
            "synthetic",
            "--per-gpu-batch",
            "8",
            "--steps",
            "400",
            "--warmup-steps",
            "1",
            "--device",
            "cpu",
            "--log-interval",
            "5",
            "--eval-samples",
            "16",
            "--comm-probe-steps",
            "0",
        ],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in launcher.stdout:
            if line.startswith("[default0]:step 10/"):
                break
        processes = _descendants(launcher.pid)
        listening = _listening_sockets(processes)
    finally:
        launcher.send_signal(signal.SIGTERM)  # forwarded: the ranks stop at their next log point
        output = launcher.communicate(timeout=120)[0]
    assert len(processes) >= 2 and listening, output[-2000:]
    assert all(address.startswith(("127.", "::1")) for address in listening), listening
    assert launcher.returncode == 0 or launcher.returncode == 75, output[-2000:]
