"""Several real ranks (gloo over 127.0.0.1): DDP equals one process, accuracy matches, signals
stop every rank after the same step, a missing peer is a clear error, srun-style launch works."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scalerepro.schedulers.base import SchedulerError
from scalerepro.schedulers.slurm import first_host
from scalerepro.training.distributed import DistributedSetupError, detect_env

from conftest import clean_env, free_port, launch_ranks, load_record, python_train, signal_last_rank_at_step_20

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow


def _final_params(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("step-*.pt"))
    return torch.load(files[-1], map_location="cpu", weights_only=True)["model"]


def _run(tmp_path: Path, name: str, ranks: int, per_gpu_batch: int, *extra: str) -> dict:
    args = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        str(per_gpu_batch),
        "--num-workers",
        "0",
        "--synthetic-samples",
        "512",
        "--eval-samples",
        "64",
        "--warmup-steps",
        "0",
        "--comm-probe-steps",
        "0",
        "--no-eval",
        "--checkpoint-dir",
        str(tmp_path / name),
        "--keep-final-checkpoint",
        "--record",
        str(tmp_path / f"{name}.json"),
        *extra,
    ]
    if ranks == 1:
        result = python_train(args, timeout=120)
    else:
        result = launch_ranks(ranks, args)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_record(tmp_path / f"{name}.json")


@pytest.mark.parametrize("accumulate", [False, True], ids=["plain", "grad-accum"])
def test_two_ranks_equal_one_rank_on_the_same_global_batch(tmp_path, accumulate):
    """The same global batch of 16 split over 1 or 2 ranks (and, with accumulation, over two
    micro-batches with no all-reduce on the first) must give the same parameters after a step."""
    one = _run(tmp_path, "one", 1, 16, "--steps", "1")
    two_args = ("--steps", "1", "--grad-accum-steps", "2") if accumulate else ("--steps", "1")
    two = _run(tmp_path, "two", 2, 4 if accumulate else 8, *two_args)
    assert one["batch"]["global_batch"] == two["batch"]["global_batch"] == 16
    assert two["parallel"]["world_size"] == 2 and two["parallel"]["backend"] == "gloo"
    _run(tmp_path, "init", 1, 16, "--steps", "1", "--lr", "0")  # the initial weights
    expected, actual, initial = _final_params(tmp_path / "one"), _final_params(tmp_path / "two"), _final_params(tmp_path / "init")
    for name in expected:
        assert not torch.equal(expected[name], initial[name]), f"{name} did not change: the comparison would be empty"
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert one["loss_log"][0]["loss"] == pytest.approx(two["loss_log"][0]["loss"], rel=1e-5)


def test_cifar_one_and_two_ranks_reach_matching_accuracy(tmp_path, prepared_cifar):
    common = ["--model", "cnn", "--data", str(prepared_cifar), "--epochs", "3", "--warmup-steps", "2", "--num-workers", "1"]
    one = python_train([*common, "--per-gpu-batch", "64", "--record", str(tmp_path / "one.json")])
    assert one.returncode == 0, one.stderr
    two = launch_ranks(2, [*common, "--per-gpu-batch", "32", "--record", str(tmp_path / "two.json")])
    assert two.returncode == 0, two.stderr[-3000:]
    accuracy_one = load_record(tmp_path / "one.json")["history"][-1]["eval_accuracy"]
    record_two = load_record(tmp_path / "two.json")
    accuracy_two = record_two["history"][-1]["eval_accuracy"]
    assert [h["epoch"] for h in record_two["history"]] == [0, 1, 2]
    assert accuracy_one > 0.5, f"1 rank learned too little to compare: {accuracy_one}"
    assert abs(accuracy_one - accuracy_two) <= 0.02, (accuracy_one, accuracy_two)


def test_exposed_communication_sees_the_all_reduce(tmp_path):
    # A step made of communication: resnet18_cifar's 45 MB of gradients (a gloo all-reduce of
    # about 0.1 s over loopback) on 8x8 images, batch 2, so that little compute can hide it. The
    # probe times the same steps with and without the all-reduce, interleaved. Measured on the
    # shared 2-core VM at load averages 4-7: fraction 0.16-0.49; with the no-sync steps
    # synchronising anyway (the probe measuring nothing), 0.00-0.07.
    args = [
        "--model",
        "resnet18_cifar",
        "--image-size",
        "8",
        "--per-gpu-batch",
        "2",
        "--steps",
        "8",
        "--warmup-steps",
        "2",
        "--loader",
        "device",
        "--no-eval",
        "--synthetic-samples",
        "64",
        "--comm-probe-steps",
        "10",
        "--bucket-probe-steps",
        "0",
        "--record",
        str(tmp_path / "r.json"),
    ]
    done = launch_ranks(2, args)
    assert done.returncode == 0, done.stderr[-3000:]
    comm = load_record(tmp_path / "r.json")["measurements"]["exposed_communication"]
    assert comm["reason"] is None and comm["steps"] == 10
    assert comm["sync_step_s"] > comm["nosync_step_s"] > 0, comm
    assert comm["fraction"] >= 0.10, comm
    assert comm["fraction"] == pytest.approx((comm["sync_step_s"] - comm["nosync_step_s"]) / comm["sync_step_s"])
    # every rank timed: the typical rank's no-sync step and what it waits for the slowest (the loss
    # decomposition's compute and straggler parts); the slowest rank's median is not below the
    # typical rank's (5 % for the median of means against the mean of medians)
    assert 0 < comm["nosync_rank_mean_s"] <= 1.05 * comm["nosync_step_s"], comm
    assert 0 <= comm["straggler_wait_s"] < comm["nosync_rank_mean_s"], comm
    # the window's own steps, split on every rank: the all-reduce waited for at the backward's end
    # is a large part of what the probe says the all-reduce costs a step (the rest is gloo's
    # thread slowing the backward it overlaps): 0.38-0.65 of it natively, 0.36-0.39 under a CPU
    # quota of 0.3 with the ISA caps, where the wait was only 0.09-0.13 of the step (0.17-0.18
    # natively); with each completion marked at its launch, about 0.05. What is left is at least
    # the compute the probe times without it.
    measurements = load_record(tmp_path / "r.json")["measurements"]
    split = measurements["window_split"]
    assert split["reason"] is None and split["clock"] == "host" and split["steps"] == measurements["measured_steps"], split
    allreduce_cost_s = comm["sync_step_s"] - comm["nosync_step_s"]
    assert split["exposed_allreduce_wait_s"] >= 0.2 * allreduce_cost_s, (split, comm)
    assert split["compute_rank_mean_s"] >= 0.7 * comm["nosync_rank_mean_s"], (split, comm)
    assert comm["sync_compute_rank_mean_s"] >= 0.7 * comm["nosync_rank_mean_s"], comm
    parts = ("compute_rank_mean_s", "straggler_wait_s", "exposed_allreduce_wait_s", "data_wait_rank_mean_s")
    assert sum(split[part] for part in parts) == pytest.approx(split["step_rank_mean_s"])
    assert split["step_rank_mean_s"] == pytest.approx(measurements["window_s"] / measurements["measured_steps"], rel=0.05)


def test_the_probes_of_a_two_rank_onecycle_run_with_accumulation(tmp_path):
    """Both probes run the trainer's step on two ranks after a OneCycleLR run: they leave the
    scheduler alone (the exposed-communication probe stepped it, and OneCycleLR raised past the
    run's end, failing the finished run), and the bucket probe times every micro-batch of an
    accumulating step and records DDP's rebuilt layout."""
    args = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        "4",
        "--grad-accum-steps",
        "2",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--lr-schedule",
        "onecycle",
        "--num-workers",
        "0",
        "--no-eval",
        "--synthetic-samples",
        "64",
        "--comm-probe-steps",
        "2",
        "--bucket-probe-steps",
        "2",
        "--bucket-cap-mb",
        "0.01",
        "--record",
        str(tmp_path / "r.json"),
    ]
    done = launch_ranks(2, args)
    assert done.returncode == 0, done.stderr[-3000:]
    measurements = load_record(tmp_path / "r.json")["measurements"]
    comm, probe = measurements["exposed_communication"], measurements["backward_buckets"]
    assert comm["reason"] is None and comm["steps"] == 2 and comm["sync_step_s"] > 0, comm
    assert probe["reason"] is None and probe["steps"] == 2 and probe["micro_batches_per_step"] == 2, probe
    assert probe["layout_source"].startswith("DDP's rebuilt buckets") and len(probe["buckets"]) >= 2, probe
    ready = [bucket["ready_s"] for bucket in probe["buckets"]]
    assert 0 < ready[-1] <= probe["backward_s"] and probe["forward_s"] > 0 and probe["optimizer_s"] > 0, probe


def test_one_rank_with_a_process_group_runs_ddp_and_trains_as_one_rank_without(tmp_path):
    """--process-group-at-one-rank: a communicator of one, DDP's reducer and both probes, and the
    same weights as the plain single process (an all-reduce over one rank averages nothing)."""
    probes = ("--steps", "3", "--comm-probe-steps", "2", "--bucket-probe-steps", "2")
    plain = _run(tmp_path, "plain", 1, 16, *probes)
    grouped = _run(tmp_path, "grouped", 1, 16, *probes, "--process-group-at-one-rank")
    assert plain["parallel"]["backend"] is None and grouped["parallel"]["backend"] == "gloo"
    assert plain["measurements"]["exposed_communication"]["reason"] == "single process: no gradient communication"
    comm, probe = grouped["measurements"]["exposed_communication"], grouped["measurements"]["backward_buckets"]
    assert comm["reason"] is None and comm["steps"] == 2 and comm["sync_step_s"] > 0, comm
    assert probe["reason"] is None and probe["layout_source"].startswith("DDP's rebuilt buckets"), probe
    expected, actual = _final_params(tmp_path / "plain"), _final_params(tmp_path / "grouped")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)


def test_a_signal_to_one_rank_stops_both_after_the_same_step(tmp_path):
    args = [
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
        "400",
        "--warmup-steps",
        "2",
        "--log-interval",
        "5",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--record",
        str(tmp_path / "r.json"),
    ]
    _, output = signal_last_rank_at_step_20(args, signal.SIGUSR1)  # rank 0 must learn of it
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "preempted", output[-2000:]
    assert record["stop_signal"] == "SIGUSR1" and "stopped by SIGUSR1" in output  # rank 0 records rank 1's signal
    stopped = record["steps"]["completed"]
    assert stopped % 5 == 0 and stopped < 400  # ranks agree at a log point
    checkpoint = torch.load(tmp_path / "ckpt" / f"step-{stopped:08d}.pt", weights_only=True)
    assert len(checkpoint["rng"]) == 2  # every rank's RNG state

    resumed = launch_ranks(2, [*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_record(tmp_path / "r.json")
    assert final["status"] == "ok" and final["steps"]["completed"] == 400


def test_a_crashed_rank_fails_the_run_with_a_record_and_one_line(tmp_path):
    args = [
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
        "2000",
        "--warmup-steps",
        "2",
        "--log-interval",
        "5",
        "--record",
        str(tmp_path / "r.json"),
    ]
    launcher, output = signal_last_rank_at_step_20(args, signal.SIGKILL)  # rank 1 dies without a word
    assert launcher.returncode != 0
    errors = [line for line in output.splitlines() if line.startswith("scalerepro.training.train: error:")]
    assert len(errors) == 1 and "rank 0 at step" in errors[0] and "lost contact with another rank" in errors[0], output[-3000:]
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "failed" and record["measurements_scope"] == "rank 0 only"
    assert record["measurements"]["measured_steps"] >= 18 and record["loss_log"]


def test_a_peer_that_never_arrives_is_a_one_line_error(tmp_path):
    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    started = time.monotonic()
    result = python_train(["--model", "cnn", "--dist-timeout-s", "3", "--record", str(tmp_path / "r.json")], timeout=120, env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "could not form the gloo process group at 127.0.0.1:" in result.stderr
    assert "check that all 2 ranks were launched" in result.stderr
    assert time.monotonic() - started < 60
    assert load_record(tmp_path / "r.json")["status"] == "failed"


def test_srun_style_launch_reads_slurm_variables(tmp_path):
    """Two processes started the way `srun --ntasks 2` starts them: Slurm's variables only."""
    port = free_port()
    args = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        "8",
        "--num-workers",
        "0",
        "--synthetic-samples",
        "256",
        "--eval-samples",
        "32",
        "--steps",
        "4",
        "--warmup-steps",
        "1",
        "--record",
        str(tmp_path / "r.json"),
    ]
    processes = []
    for rank in range(2):
        env = clean_env(
            SLURM_JOB_ID="4242",
            SLURM_PROCID=str(rank),
            SLURM_NTASKS="2",
            SLURM_LOCALID=str(rank),
            SLURM_NNODES="1",
            SLURM_STEP_NODELIST="localhost",
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=str(port),
        )
        processes.append(subprocess.Popen([sys.executable, "-m", "scalerepro.training.train", *args], env=env, stderr=subprocess.PIPE, text=True))
    for process in processes:
        assert process.wait(timeout=120) == 0, process.stderr.read()
    record = load_record(tmp_path / "r.json")
    assert record["parallel"]["launcher"] == "slurm" and record["parallel"]["world_size"] == 2
    assert record["scheduler"]["name"] == "slurm" and record["scheduler"]["job_id"] == 4242


def test_detect_env_from_each_launcher():
    torchrun_env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    assert detect_env(torchrun_env).launcher == "torchrun" and detect_env(torchrun_env).rank == 3
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "gpu[007-008]",
        "SLURM_JOB_ID": "100",
    }
    env = detect_env(slurm)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == ("slurm", 5, 8, 1, 4)
    assert (env.master_addr, env.master_port) == ("gpu007", 15100)
    assert detect_env({}).launcher == "single"
    assert detect_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).launcher == "single"  # a 1-task step


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("node01", "node01"), ("gpu[007-010,012]", "gpu007"), ("a[3],b[1-2]", "a3"), ("login1,login2", "login1"), ("x-[01-04]", "x-01")],
)
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert first_host(nodelist) == first


def test_unparseable_node_list():
    with pytest.raises(SchedulerError, match="cannot parse the Slurm node list"):
        first_host("[01-02]")
    with pytest.raises(DistributedSetupError, match="cannot parse the Slurm node list"):
        detect_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "[01-02]"})


def test_a_rank_still_compiling_in_warm_up_does_not_trip_the_steady_state_timeout(tmp_path):
    """Rank 1 compiles cold (torch.compile, caches off) while rank 0 runs eager and waits for it
    in DDP's first all-reduce for longer than --dist-timeout-s: the warm-up timeout covers that
    wait; after the warm-up steps the steady-state timeout applies again."""
    port = str(free_port())
    common = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        "8",
        "--num-workers",
        "0",
        "--loader",
        "device",
        "--synthetic-samples",
        "256",
        "--no-eval",
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--comm-probe-steps",
        "0",
        "--bucket-probe-steps",
        "0",
        "--dist-timeout-s",
        "4",
        "--progress",
        "off",
    ]
    ranks = []
    for rank, extra in ((0, ["--compile", "none", "--record", str(tmp_path / "r.json")]), (1, ["--compile", "default"])):
        env = clean_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor{rank}"),
            TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
        )
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-m", "scalerepro.training.train", *common, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    started = time.monotonic()
    outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    waited = time.monotonic() - started
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "ok" and record["config"]["parallel"]["warmup_dist_timeout_s"] == 1800.0
    assert waited > 3 * 4, f"the cold compile took {waited:.0f} s: too short to show the steady-state timeout would trip"


_TIMEOUT_PROBE = """
import datetime, socket, sys
import torch, torch.distributed as dist
from scalerepro.trainer_flags import parse_args
from scalerepro.training import run_setup
from scalerepro.training.distributed import DistContext, DistEnv
from scalerepro.training.stop_request import StopRequest
from scalerepro.training.trainer import Trainer

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=5))
ctx = DistContext(DistEnv("torchrun", 0, 1, 0, 1, "127.0.0.1", int(sys.argv[1])), torch.device("cpu"), "gloo", (socket.gethostname(),))
gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
config = run_setup.resolve_config(parse_args(sys.argv[2:]), ctx)
run_setup.set_process_state(config, ctx)
trainer = Trainer(config, ctx, StopRequest(), log=lambda *a: None)
print("after setup", gloo.options._timeout.total_seconds())
trainer.fit()
print("after warm-up", gloo.options._timeout.total_seconds(), flush=True)
"""


def test_collectives_get_the_warm_up_timeout_then_the_steady_state_one(tmp_path):
    args = [
        "--model",
        "cnn",
        "--per-gpu-batch",
        "8",
        "--num-workers",
        "0",
        "--loader",
        "device",
        "--synthetic-samples",
        "128",
        "--no-eval",
        "--steps",
        "4",
        "--warmup-steps",
        "2",
        "--comm-probe-steps",
        "0",
        "--bucket-probe-steps",
        "0",
        "--dist-timeout-s",
        "17",
        "--warmup-dist-timeout-s",
        "900",
        "--progress",
        "off",
    ]
    result = subprocess.run([sys.executable, "-c", _TIMEOUT_PROBE, str(free_port()), *args], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after setup 900.0" in result.stdout and "after warm-up 17.0" in result.stdout, result.stdout


# Rank 0's eager probe steps run out of device memory (as llama_1b's did on an H100 at 8 x 2048:
# the eager loss holds fp32 logits the compiled one never does). The probe's steps run no
# collective, so rank 1 finishes them and must learn at the probe's end that rank 0 gave up.
_OUT_OF_MEMORY_IN_THE_PROBE = """
import os, sys, torch
from scalerepro.training.train import main
from scalerepro.training.trainer import Trainer

original = Trainer.probe_step

def probe_step(self, micro_batches, **kwargs):
    if kwargs.get("eager") and os.environ["RANK"] == "0":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.83 GiB (planted by the test)")
    return original(self, micro_batches, **kwargs)

Trainer.probe_step = probe_step
sys.exit(main(sys.argv[1:]))
"""


def _two_ranks_of(driver_source: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Two ranks (torchrun) of a driver script that observes or plants something around the trainer's main."""
    driver = tmp_path / "driver.py"
    driver.write_text(driver_source)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(driver), *args]
    return subprocess.run(command, env={**clean_env(), **env}, capture_output=True, text=True, timeout=240)


def test_a_probe_out_of_memory_on_one_rank_leaves_a_complete_run_on_every_rank(tmp_path):
    done = _two_ranks_of(
        _OUT_OF_MEMORY_IN_THE_PROBE,
        tmp_path,
        "--model",
        "cnn",
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--per-gpu-batch",
        "8",
        "--num-workers",
        "0",
        "--synthetic-samples",
        "256",
        "--no-eval",
        "--comm-probe-steps",
        "2",
        "--bucket-probe-steps",
        "2",
        "--dist-timeout-s",
        "60",
        "--record",
        str(tmp_path / "r.json"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = load_record(tmp_path / "r.json")
    m = record["measurements"]
    assert record["status"] == "ok" and m["measured_steps"] == 4 and m["samples_per_s"] > 0
    assert m["exposed_communication"]["reason"] is None  # the other probe measured
    reason = m["backward_buckets"]["reason"]
    assert "ran out of device memory" in reason and "planted by the test" in reason


_BROADCASTS_IN_THE_PROBE = """
import json, os, sys
from torch.nn.parallel import DistributedDataParallel
from scalerepro.training.train import main
from scalerepro.training.trainer import Trainer

steps, broadcast = [], DistributedDataParallel._sync_buffers
train_step, probe_step = Trainer.train_step, Trainer.probe_step

def sync_buffers(self):  # observed, then done as DDP does it
    steps[-1]["broadcasts"] += 1
    return broadcast(self)

def watched_train_step(self, micro_batches, **kwargs):
    steps.append({"probe": False, "sync": True, "broadcasts": 0})
    return train_step(self, micro_batches, **kwargs)

def watched_probe_step(self, micro_batches, *, sync_gradients, **kwargs):
    steps.append({"probe": True, "sync": sync_gradients, "broadcasts": 0})  # the communication probe's (--bucket-probe-steps 0)
    return probe_step(self, micro_batches, sync_gradients=sync_gradients, **kwargs)

DistributedDataParallel._sync_buffers = sync_buffers
Trainer.train_step, Trainer.probe_step = watched_train_step, watched_probe_step
code = main(sys.argv[1:])
if os.environ["RANK"] == "0":
    json.dump(steps, open(os.environ["STEPS_OUT"], "w"))
sys.exit(code)
"""


def test_the_probe_broadcasts_buffers_in_its_sync_steps_only(tmp_path):
    """A training step's forward broadcasts the BatchNorm buffers (DDP's broadcast_buffers): the
    probe's sync step must too, and its no-sync step (compute alone) must not. DDP decides from
    the step before, so with the probe's alternation left alone each sync step skipped the
    broadcast and each no-sync step paid it (probes.buffers_broadcast_like_a_training_step)."""
    done = _two_ranks_of(
        _BROADCASTS_IN_THE_PROBE,
        tmp_path,
        "--model",
        "resnet18_cifar",
        "--image-size",
        "8",
        "--per-gpu-batch",
        "2",
        "--steps",
        "8",
        "--warmup-steps",
        "2",
        "--loader",
        "device",
        "--no-eval",
        "--synthetic-samples",
        "64",
        "--comm-probe-steps",
        "3",
        "--bucket-probe-steps",
        "0",
        "--record",
        str(tmp_path / "r.json"),
        STEPS_OUT=str(tmp_path / "steps.json"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads((tmp_path / "steps.json").read_text())
    window, probe = [s for s in steps if not s["probe"]], [s for s in steps if s["probe"]]
    assert window and all(s["broadcasts"] == 1 for s in window), window  # what a training step does
    # a warm-up no-sync step, three timed ones, an untimed sync step, three timed ones (probe_schedule)
    assert [(s["sync"], s["broadcasts"]) for s in probe] == [(False, 0)] * 4 + [(True, 1)] * 4, probe


def test_two_ranks_lengthen_their_window_alike(tmp_path):
    # each rank times its own steps; both must add the same steps or a collective waits forever
    done = launch_ranks(
        2,
        [
            "--model",
            "cnn",
            "--steps",
            "6",
            "--warmup-steps",
            "2",
            "--per-gpu-batch",
            "8",
            "--num-workers",
            "0",
            "--synthetic-samples",
            "256",
            "--no-eval",
            "--comm-probe-steps",
            "0",
            "--bucket-probe-steps",
            "0",
            "--min-window-s",
            "2",
            "--log-interval",
            "2",
            "--dist-timeout-s",
            "60",
            "--record",
            str(tmp_path / "r.json"),
        ],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = load_record(tmp_path / "r.json")
    assert record["measurements"]["window_s"] >= 2 and record["steps"]["total"] > 6
