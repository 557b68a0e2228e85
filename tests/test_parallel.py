"""FSDP2, tensor, 2-D and pipeline parallelism (scalerepro.parallel) on real ranks: gloo over
127.0.0.1, one process per rank (tests/parallel_worker.py), against one process on the same
global batch; memory per rank under FSDP; activation checkpointing; sharded DCP checkpoints.

Tolerance of "the same parameters": float32, rtol 1e-4 and atol 1e-5 after one SGD step of lr
0.5 (the update is lr x gradient, ~1e-3 per weight here): sharding changes only the order of the
sums (reduce-scatter, all-reduce, micro-batch accumulation), which moves results by a few ulps.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from scalerepro.parallel import activation_recompute, comm_bytes, mesh, pipeline_parallel, tensor_parallel

from conftest import launch_ranks, signal_last_rank_at_step_20

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parent / "parallel_worker.py"
RTOL, ATOL = 1e-4, 1e-5


def run_ranks(world: int, out: Path, *args: str, timeout: float = 180) -> dict:
    """Start ``world`` real ranks of the worker with the local launcher and return rank 0's result."""
    result = launch_ranks(world, ["--out", str(out), *args], timeout=timeout, module=WORKER.stem, cwd=WORKER.parent)
    assert result.returncode == 0, f"the ranks exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One process, no sharding, the same global batch and step."""
    return run_ranks(1, tmp_path_factory.mktemp("ref") / "ref.pt")


@pytest.fixture(scope="module")
def initial(tmp_path_factory) -> dict:
    return run_ranks(1, tmp_path_factory.mktemp("init") / "init.pt", "--steps", "0")


@pytest.fixture(scope="module")
def llama_reference(tmp_path_factory) -> dict:
    """The tiny Llama's one step in one process, once for every strategy compared with it."""
    return run_ranks(1, tmp_path_factory.mktemp("llama_ref") / "ref.pt", "--model", "llama3_8b")


@pytest.fixture(scope="module")
def llama_initial(tmp_path_factory) -> dict:
    return run_ranks(1, tmp_path_factory.mktemp("llama_init") / "init.pt", "--model", "llama3_8b", "--steps", "0")


def assert_same_weights(actual: dict, expected: dict, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=rtol, atol=atol, msg=name)


def assert_same_parameters(actual: dict, expected: dict, initial: dict) -> None:
    for name in expected:
        assert not torch.equal(expected[name], initial[name]), f"{name} did not change: the comparison would be empty"
    assert_same_weights(actual, expected)


def last_checkpoint_model(directory: Path) -> dict:
    """The model state of the newest (unsharded) checkpoint the trainer left in ``directory``."""
    return torch.load(sorted(directory.glob("step-*.pt"))[-1], weights_only=True)["model"]


@pytest.mark.parametrize(
    ("world", "args"),
    [
        (2, ("--strategy", "fsdp")),
        (2, ("--strategy", "fsdp", "--no-reshard-after-forward")),
        (2, ("--strategy", "tp")),
        (4, ("--strategy", "fsdp+tp", "--tp-size", "2")),
        (2, ("--strategy", "pp", "--pp-schedule", "gpipe", "--microbatches", "4")),
        (2, ("--strategy", "pp", "--pp-schedule", "1f1b", "--microbatches", "4")),
    ],
    ids=["fsdp", "fsdp-no-reshard", "tp", "fsdp+tp", "pp-gpipe", "pp-1f1b"],
)
def test_one_step_equals_one_process(tmp_path, reference, initial, world, args):
    result = run_ranks(world, tmp_path / "out.pt", *args)
    assert_same_parameters(result["state"], reference["state"], initial["state"])
    if "pp" not in args:  # rank 0 of a pipeline is the first stage: the loss is on the last
        assert result["losses"][0] == pytest.approx(reference["losses"][0], rel=1e-5)


@pytest.mark.parametrize(
    ("world", "args"),
    [(2, ("--strategy", "tp")), (4, ("--strategy", "fsdp+tp", "--tp-size", "2")), (2, ("--strategy", "fsdp"))],
    ids=["tp", "fsdp+tp", "fsdp"],
)
def test_llama_one_step_equals_one_process(tmp_path, llama_reference, llama_initial, world, args):
    """The Llama decoder (GQA, RoPE, SwiGLU) under torchtitan's plan."""
    result = run_ranks(world, tmp_path / "out.pt", "--model", "llama3_8b", *args)
    assert_same_parameters(result["state"], llama_reference["state"], llama_initial["state"])
    assert result["losses"][0] == pytest.approx(llama_reference["losses"][0], rel=1e-5)


def test_fsdp_state_per_rank_falls_as_one_over_world(tmp_path):
    """Parameters + gradients + AdamW state held per rank (local shard storage) after a step:
    world 1 holds the total T; under FSDP on W ranks each holds T / W within 5 % (dim-0 padding
    of shards that do not divide by W is the difference)."""
    held = {}
    for world in (1, 2, 4):
        strategy = ("--strategy", "fsdp") if world > 1 else ()
        result = run_ranks(world, tmp_path / f"w{world}.pt", *strategy, "--optimizer", "adamw")
        held[world] = [sum(rank.values()) for rank in result["bytes"]]
    total = held[1][0]
    assert result["bytes"][0]["optimizer_state"] > 0
    for world in (2, 4):
        for rank, value in enumerate(held[world]):
            assert value == pytest.approx(total / world, rel=0.05), f"world {world} rank {rank}: {value} bytes, total {total}"


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_gives_the_same_step(tmp_path, reference, mode):
    """Recomputing blocks in backward must give the same gradients, hence the same SGD step
    (bit for bit in one process: the same ops in the same order)."""
    result = run_ranks(1, tmp_path / "ac.pt", "--activation-checkpointing", mode)
    assert_same_weights(result["state"], reference["state"], rtol=0, atol=0)


def test_activation_checkpointing_under_fsdp(tmp_path, reference, initial):
    result = run_ranks(2, tmp_path / "ac.pt", "--strategy", "fsdp", "--activation-checkpointing", "full")
    assert_same_parameters(result["state"], reference["state"], initial["state"])


def test_activation_checkpointing_wraps_every_or_every_other_block():
    from scalerepro.models import registry

    spec = registry.resolve("gpt2_small", registry.ModelShape(seq_len=8, vocab_size=64, num_layers=4, hidden_size=16, num_heads=2))
    counts = {}
    for mode in ("none", "selective", "full"):
        model = registry.build(spec)
        names = set(model.state_dict())
        counts[mode] = activation_recompute.apply_activation_checkpointing(model, mode)
        assert set(model.state_dict()) == names  # checkpoints keep the model's names
    assert counts == {"none": 0, "selective": 2, "full": 4}


def test_bubble_fraction_and_stage_split():
    assert pipeline_parallel.pipeline_bubble_fraction(2, 4) == pytest.approx(1 / 5)
    assert pipeline_parallel.pipeline_bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert [list(r) for r in pipeline_parallel.stage_block_ranges(5, 2)] == [[0, 1, 2], [3, 4]]
    with pytest.raises(mesh.ParallelError, match="raise --num-layers"):
        pipeline_parallel.stage_block_ranges(2, 4)


def test_mesh_shapes_and_bad_tp_size():
    assert mesh.mesh_shape("fsdp+tp", 8, 4) == ((2, 4), ("dp", "tp"))
    with pytest.raises(mesh.ParallelError, match="--tp-size"):
        mesh.mesh_shape("fsdp+tp", 4, 3)


# ---- sharded checkpoints (DCP) ------------------------------------------------------------------


def test_dcp_checkpoint_saved_on_2_ranks_loads_on_1_and_4(tmp_path):
    saved = run_ranks(2, tmp_path / "saved.pt", "--strategy", "fsdp", "--optimizer", "adamw", "--save-dcp", str(tmp_path / "step-00000001.dcp"))
    checkpoint = tmp_path / "step-00000001.dcp"
    assert checkpoint.is_dir() and not (tmp_path / ".step-00000001.dcp.tmp").exists()
    one = run_ranks(1, tmp_path / "one.pt", "--optimizer", "adamw", "--steps", "0", "--load-dcp", str(checkpoint))
    four = run_ranks(4, tmp_path / "four.pt", "--strategy", "fsdp", "--optimizer", "adamw", "--steps", "0", "--load-dcp", str(checkpoint))
    assert_same_weights(one["state"], saved["state"], rtol=0, atol=0)
    assert_same_weights(four["state"], saved["state"], rtol=0, atol=0)


def test_dcp_checkpoint_mid_run_resumes_to_the_same_weights(tmp_path):
    """4 AdamW steps in one go == 2 steps, a sharded checkpoint, new processes, 2 more steps
    (the optimizer state must come back too: Adam's moments steer steps 3 and 4)."""
    common = ("--strategy", "fsdp", "--optimizer", "adamw")
    straight = run_ranks(2, tmp_path / "straight.pt", *common, "--steps", "4")
    run_ranks(2, tmp_path / "first.pt", *common, "--steps", "2", "--save-dcp", str(tmp_path / "step-00000002.dcp"))
    resumed = run_ranks(2, tmp_path / "resumed.pt", *common, "--steps", "2", "--first-step", "2", "--load-dcp", str(tmp_path / "step-00000002.dcp"))
    assert_same_weights(resumed["state"], straight["state"], rtol=0, atol=0)


# ---- the trainer ----------------------------------------------------------------------------------


def test_trainer_runs_fsdp_on_two_ranks_and_records_ok(tmp_path):
    """python -m scalerepro.training.train --parallel fsdp on 2 gloo ranks: a tiny GPT trains and the
    record says ok, with the strategy in its configuration."""
    from conftest import launch_ranks, load_record

    record_path = tmp_path / "fsdp.json"
    args = [
        "--model",
        "gpt2_small",
        "--seq-len",
        "16",
        "--vocab-size",
        "64",
        "--num-layers",
        "2",
        "--hidden-size",
        "32",
        "--num-heads",
        "4",
        "--per-gpu-batch",
        "4",
        "--synthetic-samples",
        "64",
        "--eval-samples",
        "16",
        "--steps",
        "4",
        "--warmup-steps",
        "1",
        "--log-interval",
        "2",
        "--num-workers",
        "0",
        "--parallel",
        "fsdp",
        "--activation-checkpointing",
        "selective",
        "--record",
        str(record_path),
    ]
    result = launch_ranks(2, args, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_record(record_path)
    assert record["status"] == "ok" and record["parallel"]["world_size"] == 2
    assert record["config"]["parallel"]["parallel"] == "fsdp"
    assert record["measurements"]["measured_steps"] == 3
    assert record["measurements"]["exposed_communication"]["fraction"] is None  # not DDP: not measured, not 0
    sharding = record["measurements"]["sharding"]
    assert record["parallel"]["strategy"] == "fsdp" and sharding["mesh"] == {"shape": [2], "dims": ["dp"]}
    assert sharding["comm_bytes_per_step_analytic"]["reduce_scatter"] > 0
    losses = [entry["loss"] for entry in record["loss_log"]]
    assert all(loss == loss for loss in losses) and len(losses) == 2


@pytest.mark.parametrize("preset", ["baseline", "optimised"])
def test_tensor_parallel_takes_the_optimizer_it_needs_by_default_and_refuses_one_given_that_it_cannot_run(preset, capsys):
    """Under tp alone the foreach and fused kernels cannot mix the replicated plain-tensor
    embeddings with the DTensor blocks: every preset's default there is for-loop (fsdp+tp, all
    DTensors, keeps the preset's), and an explicit foreach or fused is one line and exit 2."""
    from scalerepro.trainer_flags import PRESETS, parse_args

    assert parse_args(["--preset", preset, "--parallel", "tp"]).optim.optimizer_impl == "for-loop"
    assert parse_args(["--preset", preset, "--parallel", "fsdp+tp"]).optim.optimizer_impl == PRESETS[preset]["optimizer_impl"]
    assert parse_args(["--preset", preset, "--parallel", "tp", "--optimizer-impl", "for-loop"]).optim.optimizer_impl == "for-loop"
    with pytest.raises(SystemExit) as exited:
        parse_args(["--preset", preset, "--parallel", "tp", "--optimizer-impl", "fused"])
    assert exited.value.code == 2
    assert "--parallel tp needs --optimizer-impl for-loop (the fused kernels cannot mix" in capsys.readouterr().err


def test_trainer_refuses_what_a_pipeline_step_does_not_do(tmp_path):
    from conftest import python_train

    args = [
        "--model",
        "gpt2_small",
        "--num-layers",
        "2",
        "--hidden-size",
        "32",
        "--num-heads",
        "4",
        "--seq-len",
        "16",
        "--vocab-size",
        "64",
        "--num-workers",
        "0",
        "--parallel",
        "pp",
        "--steps",
        "2",
        "--warmup-steps",
        "0",
        "--grad-accum-steps",
        "2",
        "--record",
        str(tmp_path / "r.json"),
    ]
    result = python_train(args)
    assert result.returncode != 0
    assert "--parallel pp does not support --grad-accum-steps: the pipeline's --microbatches are its gradient accumulation" in result.stderr


def test_fsdp_comm_volume_formula_on_a_known_model():
    """2 blocks of 10 parameters each, 5 in the root, 4 ranks, fp32: per micro-batch all-gather
    (2 x 20 + 5) x 4 x 3/4 resharded, (20 + 5) x 4 x 3/4 not; reduce-scatter 25 x 4 x 3/4."""
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(2))
            self.head = nn.Linear(4, 1)  # 5

    model = Tiny()
    for block in model.blocks:  # 9 + 1 = 10 parameters per block
        block.weight = nn.Parameter(torch.zeros(3, 3))
        block.bias = nn.Parameter(torch.zeros(1))
    figures = comm_bytes.fsdp_comm_bytes_per_step(model, 4, True, 4, 4, 1)
    assert figures == {"all_gather": (2 * 20 + 5) * 4 * 0.75, "reduce_scatter": 25 * 4 * 0.75}
    assert comm_bytes.fsdp_comm_bytes_per_step(model, 4, False, 2, 4, 2)["all_gather"] == 2 * 25 * 2 * 0.75


TRAINER_GPT = [
    "--model",
    "gpt2_small",
    "--seq-len",
    "16",
    "--vocab-size",
    "64",
    "--num-layers",
    "2",
    "--hidden-size",
    "32",
    "--num-heads",
    "4",
    "--per-gpu-batch",
    "4",
    "--synthetic-samples",
    "256",
    "--num-workers",
    "0",
    "--no-eval",
    "--comm-probe-steps",
    "0",
    "--bucket-probe-steps",
    "0",
    "--keep-final-checkpoint",
]


def _trainer_gpt_module():
    from scalerepro.models import registry

    shape = registry.ModelShape(seq_len=16, vocab_size=64, num_layers=2, hidden_size=32, num_heads=4)
    return registry.build(registry.resolve("gpt2_small", shape))


def _final_sharded_weights(directory: Path, world: int = 2, split_qkv: bool = False) -> dict[str, torch.Tensor]:
    """The weights of the newest sharded checkpoint in ``directory``, loaded on one process
    into a plain model (DCP reshards W -> 1); a TP run's under its split q/k/v names."""
    from scalerepro.training import sharded_checkpoint_store

    newest = sharded_checkpoint_store.list_checkpoints(directory)[0]
    model = _trainer_gpt_module()
    if split_qkv:
        tensor_parallel.prepare_for_tensor_parallel(model)
    meta = sharded_checkpoint_store.load(newest, model)
    assert meta["final"] and len(meta["rng"]) == world  # one RNG state per rank that wrote it
    return tensor_parallel.fuse_qkv({k: v.detach() for k, v in model.state_dict().items()})


def test_trainer_fsdp_reaches_the_weights_of_ddp(tmp_path):
    """3 AdamW steps through the trainer on 2 ranks: FSDP (sharded DCP final checkpoint) and
    DDP (single-file final checkpoint) end at the same weights (tolerance as above: only the
    order of the sums differs; AdamW's first steps are ~lr x sign, so a gradient gone wrong
    flips whole weights by 2 lr and cannot hide in it)."""
    from conftest import launch_ranks

    for strategy in ("ddp", "fsdp"):
        result = launch_ranks(
            2,
            [
                *TRAINER_GPT,
                "--steps",
                "3",
                "--warmup-steps",
                "1",
                "--parallel",
                strategy,
                "--checkpoint-dir",
                str(tmp_path / strategy),
                "--record",
                str(tmp_path / f"{strategy}.json"),
            ],
            timeout=240,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    # The memory split: every DDP rank holds the whole state; every FSDP rank half of it (within
    # 5 %: dim-0 padding of shards), parameters, gradients and AdamW's moments each.
    from conftest import load_record

    splits = {s: load_record(tmp_path / f"{s}.json")["measurements"]["memory_split"] for s in ("ddp", "fsdp")}
    for kind in ("parameters", "gradients", "optimizer_state"):
        whole = splits["ddp"]["per_rank"][0][kind]
        assert whole > 0 and all(rank[kind] == whole for rank in splits["ddp"]["per_rank"])
        for rank in splits["fsdp"]["per_rank"]:
            assert rank[kind] == pytest.approx(whole / 2, rel=0.05), (kind, rank, whole)
    assert splits["fsdp"]["per_rank"][0]["activations"] is None and "not measured on the CPU" in splits["fsdp"]["activations_reason"]
    assert_same_weights(_final_sharded_weights(tmp_path / "fsdp"), last_checkpoint_model(tmp_path / "ddp"))


def test_trainer_fsdp_preempted_and_resumed_ends_where_an_uninterrupted_run_does(tmp_path):
    """SIGUSR1 at a log point: every rank writes its shards (DCP), the run is resumed with
    --resume, and the final weights equal those of a run never stopped, bit for bit."""

    from conftest import launch_ranks, load_record

    common = [*TRAINER_GPT, "--steps", "60", "--warmup-steps", "2", "--log-interval", "5", "--parallel", "fsdp"]
    straight = launch_ranks(2, [*common, "--checkpoint-dir", str(tmp_path / "straight"), "--record", str(tmp_path / "s.json")], timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    args = [*common, "--checkpoint-dir", str(tmp_path / "stopped"), "--record", str(tmp_path / "r.json")]
    _, output = signal_last_rank_at_step_20(args, signal.SIGUSR1)
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "preempted", output[-2000:]
    stopped = record["steps"]["completed"]
    assert (tmp_path / "stopped" / f"step-{stopped:08d}.dcp" / "meta.pt").is_file() and stopped < 60
    resumed = launch_ranks(2, [*args, "--resume"], timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {tmp_path / 'stopped'}/step-{stopped:08d}.dcp" in resumed.stdout + resumed.stderr
    assert load_record(tmp_path / "r.json")["status"] == "ok"
    assert_same_weights(_final_sharded_weights(tmp_path / "stopped"), _final_sharded_weights(tmp_path / "straight"), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("strategy", "world", "extra", "reference_world"),
    [("tp", 2, (), 1), ("fsdp+tp", 4, ("--tp-size", "2"), 2)],
    ids=["tp", "fsdp+tp"],
)
def test_trainer_tensor_parallel_reaches_the_weights_of_ddp_on_the_data_parallel_ranks(tmp_path, strategy, world, extra, reference_world):
    """The ranks of a TP group read one batch: tp on 2 ranks trains as 1 process, fsdp+tp on
    4 ranks (2 x 2) as DDP on 2, on the same global batch, to the same weights. tp runs with the
    trainer's defaults: the optimizer implementation it needs is its default."""
    from conftest import launch_ranks, load_record, python_train

    common = [*TRAINER_GPT, "--steps", "3", "--warmup-steps", "1"]
    reference_args = [*common, "--checkpoint-dir", str(tmp_path / "ref"), "--record", str(tmp_path / "ref.json")]
    reference = python_train(reference_args) if reference_world == 1 else launch_ranks(reference_world, reference_args, timeout=240)
    assert reference.returncode == 0, reference.stderr[-3000:]
    result = launch_ranks(
        world, [*common, "--parallel", strategy, *extra, "--checkpoint-dir", str(tmp_path / "tp"), "--record", str(tmp_path / "tp.json")], timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_record(tmp_path / "tp.json")
    if strategy == "tp":
        assert record["knobs"]["optimizer_impl"] == "for-loop" and "optimizer_impl" not in record["knobs"]["preset_overrides"]
    assert record["batch"]["global_batch"] == load_record(tmp_path / "ref.json")["batch"]["global_batch"]
    comm = record["measurements"]["sharding"]["comm_bytes_per_step_analytic"]
    assert comm["tp_all_gather"] > comm["tp_reduce_scatter"] > 0 and ("dp_reduce_scatter" in comm) == (strategy == "fsdp+tp")
    assert_same_weights(_final_sharded_weights(tmp_path / "tp", world=world, split_qkv=True), last_checkpoint_model(tmp_path / "ref"))


def _pipeline_checkpoint_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The weights of the newest (pipeline) DCP checkpoint in ``directory``, read on one process
    into a full GPT's names, each key into its own tensor: the first stage's embedding and the
    last stage's tied copy (the LM head) are checked equal, bit for bit."""
    import torch.distributed.checkpoint as dcp

    from scalerepro.training import sharded_checkpoint_store

    newest = sharded_checkpoint_store.list_checkpoints(directory)[0]
    state = {k: torch.empty_like(v) for k, v in _trainer_gpt_module().state_dict().items()}
    dcp.load({"model": state}, checkpoint_id=newest)
    torch.testing.assert_close(state["lm_head.weight"], state["token_embedding.weight"], rtol=0, atol=0)
    return state


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_trainer_pipeline_reaches_the_weights_of_one_process(tmp_path, schedule):
    """python -m scalerepro.training.train --parallel pp on 2 gloo ranks (2 stages, 2 micro-batches per
    step) against one process on the same global batch: ok record (samples counted once per
    global batch, the loss the last stage's), and after 3 AdamW steps the same weights."""
    from conftest import launch_ranks, load_record, python_train

    common = [*TRAINER_GPT, "--steps", "3", "--warmup-steps", "1", "--log-interval", "1"]
    reference = python_train([*common, "--checkpoint-dir", str(tmp_path / "ref"), "--record", str(tmp_path / "ref.json")])
    assert reference.returncode == 0, reference.stderr[-3000:]
    pp = [*common, "--parallel", "pp", "--pp-schedule", schedule, "--microbatches", "2"]
    result = launch_ranks(2, [*pp, "--checkpoint-dir", str(tmp_path / "pp"), "--record", str(tmp_path / "pp.json")], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record, expected_record = load_record(tmp_path / "pp.json"), load_record(tmp_path / "ref.json")
    assert record["status"] == "ok" and record["batch"]["global_batch"] == expected_record["batch"]["global_batch"]
    assert record["measurements"]["measured_samples"] == expected_record["measurements"]["measured_samples"]
    sharding = record["measurements"]["sharding"]
    assert sharding["pipeline_bubble_fraction"] == pytest.approx(1 / 3)  # (2 - 1) / (2 + 2 - 1)
    assert sharding["pipeline"] == {"schedule": schedule, "stages": 2, "microbatches": 2}
    # rank 0 is the first stage: a loss it did not get from the last would read 0 here
    for ours, theirs in zip(record["loss_log"], expected_record["loss_log"], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    assert_same_weights(_pipeline_checkpoint_weights(tmp_path / "pp"), last_checkpoint_model(tmp_path / "ref"))


def test_trainer_fsdp_checkpoint_of_2_ranks_resumes_on_4(tmp_path):
    """SIGUSR1 stops a 2-rank FSDP run (batch 4 per rank); --resume on 4 ranks (batch 2 per
    rank: the same global batch of 8) takes its DCP checkpoint (resharded 2 -> 4), finishes ok,
    and ends at the weights of the 2-rank run never stopped (tolerance as above: only the order
    of the sums differs; AdamW's moments, the data position and the schedule must all have come
    back for the 40 steps after it to land there)."""

    from conftest import launch_ranks, load_record

    common = [*TRAINER_GPT, "--steps", "40", "--warmup-steps", "2", "--log-interval", "5", "--parallel", "fsdp"]
    straight = launch_ranks(2, [*common, "--checkpoint-dir", str(tmp_path / "straight"), "--record", str(tmp_path / "s.json")], timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    stopped_args = ["--checkpoint-dir", str(tmp_path / "stopped"), "--record", str(tmp_path / "r.json")]
    _, output = signal_last_rank_at_step_20([*common, *stopped_args], signal.SIGUSR1)
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "preempted", output[-2000:]
    stopped = record["steps"]["completed"]
    four = [arg if arg != "4" or previous != "--per-gpu-batch" else "2" for previous, arg in zip(["", *common], common)]
    resumed = launch_ranks(4, [*four, *stopped_args, "--resume"], timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {tmp_path / 'stopped'}/step-{stopped:08d}.dcp" in resumed.stdout + resumed.stderr
    record = load_record(tmp_path / "r.json")
    assert record["status"] == "ok" and record["parallel"]["world_size"] == 4 and record["batch"]["global_batch"] == 8
    assert_same_weights(_final_sharded_weights(tmp_path / "stopped", world=4), _final_sharded_weights(tmp_path / "straight"))


def test_tp_comm_volume_formula_by_hand():
    """2 blocks, micro-batch 2, seq 4, hidden 8 (b T H = 64 elements), tp 2 (ring factor 1/2),
    fp32, 1 micro-batch, LayerNorms of 32 parameters per block and 16 final: per block 4
    all-gathers and 4 reduce-scatters of 64 x 4 bytes x 1/2 = 128 bytes each; outside the
    blocks 2 all-gathers more; the norms' gradients all-reduced (2 x 1/2 of (2 x 32 + 16) x 4)."""
    figures = comm_bytes.tp_comm_bytes_per_step(2, 2, 4, 8, 2, 1, norm_parameters_per_block=32, final_norm_parameters=16)
    assert figures == {"all_gather": (2 * 4 + 2) * 128, "reduce_scatter": 2 * 4 * 128, "all_reduce": (2 * 32 + 16) * 4}
    # bf16 matmul outputs halve the row-parallel outputs' bytes; 3 micro-batches triple all
    mixed = comm_bytes.tp_comm_bytes_per_step(2, 2, 4, 8, 2, 3, matmul_bytes=2)
    assert mixed["reduce_scatter"] == 3 * 2 * 2 * (4 + 2) * 64 * 0.5


def test_pipeline_comm_volume_formula_by_hand():
    """Global batch 8, seq 16, hidden 32, vocab 64, 2 stages, fp32 residual stream."""
    figures = comm_bytes.pipeline_comm_bytes_per_step(8, 16, 32, 64, 2)
    assert figures == {"send_activations": 8 * 16 * 32 * 4, "send_gradients": 8 * 16 * 32 * 4, "tied_all_reduce": 64 * 32 * 4, "loss_broadcast": 4}
