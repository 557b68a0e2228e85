"""Several ranks on one card (``--dist-backend gloo``): what the GPU smoke's ``onecard`` stage
runs on the one card the project is lent, checked here on the CPU. NCCL takes a card per rank and
refuses two ranks on one device; gloo lets the ranks of a node share its cards. The mapping is a
pure function (no GPU needed); the flag's refusals and a two-rank gloo run are real trainer
processes."""

from __future__ import annotations

import pytest

from scalerepro.training.distributed import DistributedSetupError, card_of_rank

from conftest import launch_ranks, load_record, python_train


@pytest.mark.parametrize(
    ("local_rank", "cards", "card"),
    [(0, 1, 0), (1, 1, 0), (3, 1, 0), (1, 2, 1), (2, 2, 0), (5, 4, 1)],
    ids=["first-of-one", "second-shares-the-one", "fourth-shares-the-one", "own-of-two", "third-wraps", "sixth-of-four"],
)
def test_under_gloo_ranks_share_the_cards_round_robin(local_rank, cards, card):
    """Local rank r takes card r mod the node's count: on one card every rank takes card 0."""
    assert card_of_rank(local_rank, cards, "gloo") == card


def test_nccl_keeps_a_card_per_rank_and_names_gloo_as_the_way_to_share():
    """Under NCCL (what 'auto' is on CUDA) rank r takes card r, and a rank beyond the node's cards
    is refused in one line that names the fix."""
    assert [card_of_rank(rank, 2, "nccl") for rank in (0, 1)] == [0, 1]
    with pytest.raises(DistributedSetupError) as refused:
        card_of_rank(1, 1, "nccl")
    message = str(refused.value)
    assert "--dist-backend gloo" in message and "launch at most 1 ranks per node" in message
    assert "\n" not in message


def test_a_node_without_cards_is_refused_in_one_line():
    with pytest.raises(DistributedSetupError, match="no CUDA device"):
        card_of_rank(0, 0, "gloo")


_TINY = ["--model", "cnn", "--per-gpu-batch", "8", "--synthetic-samples", "256", "--steps", "6", "--warmup-steps", "2", "--no-eval", "--progress", "off"]


@pytest.mark.slow  # starts a training process: not in the fast tier
def test_nccl_on_a_cpu_run_is_one_line_naming_gloo():
    """NCCL has no CPU path: asking for it there fails at setup, one line, before anything is built."""
    result = python_train([*_TINY, "--device", "cpu", "--dist-backend", "nccl"], timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "--dist-backend nccl needs a CUDA device" in lines[0] and "--dist-backend gloo" in lines[0]


@pytest.mark.slow  # starts training processes: not in the fast tier
def test_two_ranks_over_gloo_record_gloo(tmp_path):
    """Two real ranks with --dist-backend gloo: the record states the backend that ran and both ranks."""
    record = tmp_path / "gloo.json"
    result = launch_ranks(2, [*_TINY, "--device", "cpu", "--dist-backend", "gloo", "--comm-probe-steps", "0", "--record", str(record)], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    parallel = load_record(record)["parallel"]
    assert (parallel["backend"], parallel["world_size"], parallel["device_type"]) == ("gloo", 2, "cpu")
