"""The 3D-parallel step (scalerepro.analysis.tables.parallel_step) on closed-form cases a reader
checks by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scalerepro.analysis.tables import network_model, parallel_step
from scalerepro.analysis.tables.parallel_step import Layout, Transformer

LINK = network_model.Link("l", "link", 100e9, 1.0, 1e-6, "test")
PRESET = network_model.ClusterPreset("c", "cluster", "gpu", 8, LINK, LINK, "test")
MODEL = Transformer(parameters=8_000_000_000, layers=32, hidden=4096, kv_hidden=4096)
HBM = 1e12


def test_the_bubble_is_p_minus_1_over_v_m_of_the_compute():
    # SC21: 8 stages, 12 virtual stages each, 16 micro-batches: 7 / 192 of the compute
    layout = Layout(gpus=512, tp=4, pp=8, vp=12, micro_batch=1, global_batch=256, seq_len=2048)
    assert layout.dp == 16 and layout.micro_batches == 16
    step = parallel_step.simulate_parallel_step(MODEL, layout, PRESET, 1e-3, HBM)
    assert step.bubble_s == pytest.approx(7 / 192 * step.compute_s)
    # C = W B s / N
    assert step.compute_s == pytest.approx(1e-3 * 256 * 2048 / 512)


def test_one_gpu_is_compute_and_optimizer_alone():
    layout = Layout(gpus=1, tp=1, pp=1, vp=1, micro_batch=2, global_batch=8, seq_len=1024)
    step = parallel_step.simulate_parallel_step(MODEL, layout, PRESET, 1e-4, HBM)
    assert step.step_s == pytest.approx(1e-4 * 8 * 1024 + 8e9 * 28 / HBM)


def test_queued_transfers_hide_behind_wider_spacing_and_pile_up_behind_narrower():
    # ready at 0, 2, 4, each 1 long: only the last shows
    assert parallel_step.queued_exposure(1.0, 3, 2.0) == pytest.approx(1.0)
    # ready at 0, 0.5, 1: they end at 1, 2, 3; the last was ready at 1
    assert parallel_step.queued_exposure(1.0, 3, 0.5) == pytest.approx(2.0)


def test_a_data_parallel_group_spans_nodes_with_g_over_tc_gpus_on_each():
    layout = Layout(gpus=4096, tp=4, pp=8, vp=12, micro_batch=1, global_batch=2048, seq_len=2048)
    network = parallel_step.dp_network(PRESET, layout)
    assert (network.gpus_per_node, network.nodes) == (2, 64)
    layout = Layout(gpus=64, tp=4, pp=8, vp=1, micro_batch=1, global_batch=16, seq_len=2048)
    assert (parallel_step.dp_network(PRESET, layout).gpus_per_node, parallel_step.dp_network(PRESET, layout).nodes) == (2, 1)


def test_tensor_parallel_collectives_show_whole_without_overlap():
    # 4 reduce-scatters and 4 all-gathers a layer (sequence parallel) of b s h x 2 bytes on 4 GPUs
    layout = Layout(gpus=4, tp=4, pp=1, vp=1, micro_batch=1, global_batch=2, seq_len=2048, tp_overlap=False)
    step = parallel_step.simulate_parallel_step(MODEL, layout, PRESET, 1e-4, HBM)
    size = 2048 * 4096 * 2
    # NCCL's base latency, (N-1) hops and (N-1)/N of the bytes over NVLink, one node
    one = network_model.NCCL_BASE_LATENCY_S + 3 * 1e-6 + 3 / 4 * size / 100e9
    assert step.tp_exposed_s == pytest.approx(2 * 32 * 4 * 2 * one)


def test_a_fitted_compute_gives_the_step_back():
    layout = Layout(gpus=512, tp=4, pp=8, vp=12, micro_batch=1, global_batch=2048, seq_len=2048)
    w = parallel_step.fit_token_compute(MODEL, layout, PRESET, 3.0, HBM, dp_exposed_share=0.5)
    assert parallel_step.simulate_parallel_step(MODEL, layout, PRESET, w, HBM, 0.5).step_s == pytest.approx(3.0, rel=1e-9)


def test_the_exposed_share_moves_the_data_parallel_term_from_the_schedule_to_whole():
    layout = Layout(gpus=4096, tp=4, pp=8, vp=12, micro_batch=1, global_batch=2048, seq_len=2048)
    hidden = parallel_step.simulate_parallel_step(MODEL, layout, PRESET, 1e-3, HBM, 0.0)
    whole = parallel_step.simulate_parallel_step(MODEL, layout, PRESET, 1e-3, HBM, 1.0)
    assert hidden.dp_exposed_s < hidden.dp_total_s
    assert whole.dp_exposed_s == pytest.approx(whole.dp_total_s)


def test_a_layout_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="not a whole number"):
        assert Layout(gpus=100, tp=4, pp=8, vp=1, micro_batch=1, global_batch=64, seq_len=2048).dp


def test_the_matmul_flops_of_a_token_are_narayanans_count():
    # per layer and token 24 h^2 + 4 s h forward (QKV 6h^2, projection 2h^2, MLP 16h^2; scores and
    # values 4 s h), the head 2 V h; backward twice the forward, the layers' forward once more
    # when recomputed: 4 L (24 h^2 + 4 s h) + 6 V h
    model = Transformer(parameters=1, layers=24, hidden=2304, kv_hidden=2304, heads=24, vocab=51_200)
    by_hand = 4 * 24 * (24 * 2304**2 + 4 * 2048 * 2304) + 6 * 51_200 * 2304
    assert parallel_step.matmul_flops_per_token(model, 2048, recompute=True) == pytest.approx(by_hand)
    assert parallel_step.matmul_flops_per_token(model, 2048, recompute=False) == pytest.approx(3 * 24 * (24 * 2304**2 + 4 * 2048 * 2304) + 6 * 51_200 * 2304)


def test_activation_bytes_split_by_tp_except_the_norms_without_sequence_parallelism():
    # Korthikanti et al.: s b h (34 + 5 a s / h) a layer; 10 s b h of it whole on each TP rank
    model = Transformer(parameters=1, layers=2, hidden=1024, kv_hidden=1024, heads=16)
    one = Layout(gpus=1, tp=1, pp=1, vp=1, micro_batch=1, global_batch=1, seq_len=512)
    assert parallel_step.activation_bytes_per_token(model, one) == 34 * 1024 + 5 * 16 * 512
    eight = Layout(gpus=8, tp=8, pp=1, vp=1, micro_batch=1, global_batch=1, seq_len=512, sequence_parallel=False)
    assert parallel_step.activation_bytes_per_token(model, eight) == 10 * 1024 + 24 * 1024 / 8 + 5 * 16 * 512 / 8


def test_a_fitted_matmul_rate_gives_the_step_back_and_wider_layers_run_closer_to_it():
    model = Transformer(parameters=1_000_000_000, layers=8, hidden=2048, kv_hidden=2048, heads=16, vocab=32_000)
    layout = Layout(gpus=1, tp=1, pp=1, vp=1, micro_batch=4, global_batch=4, seq_len=1024)
    rate = parallel_step.fit_matmul_rate(model, layout, PRESET, 2.0, 3.0, HBM)
    w = parallel_step.token_compute_s(model, layout, rate)
    assert parallel_step.simulate_parallel_step(model, layout, PRESET, w, HBM).step_s == pytest.approx(2.0, rel=1e-9)
    wide = replace(model, hidden=4096, heads=32)
    flops = parallel_step.matmul_flops_per_token
    assert flops(model, 1024, False) / parallel_step.token_compute_s(model, layout, rate) < flops(wide, 1024, False) / parallel_step.token_compute_s(
        wide, layout, rate
    )


def test_megatrons_local_ddp_all_reduces_every_gradient_after_the_backward():
    layout = Layout(gpus=16, tp=8, pp=1, vp=1, micro_batch=1, global_batch=2, seq_len=2048, dp_schedule="after_backward")
    step = parallel_step.simulate_parallel_step(MODEL, layout, PRESET, 1e-3, HBM)
    # 2 data-parallel ranks, one in each node: the stage's 8e9 / 8 parameters of 2 bytes, whole
    assert step.dp_exposed_s == pytest.approx(parallel_step.dp_network(PRESET, layout).allreduce_s(8e9 / 8 * 2))
    overlapped = parallel_step.simulate_parallel_step(MODEL, replace(layout, dp_schedule="overlapped"), PRESET, 1e-3, HBM)
    assert overlapped.dp_exposed_s < step.dp_exposed_s / 10  # the buckets hide behind a 2 s backward
