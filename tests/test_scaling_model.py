"""The alpha-beta scaling model: the ring fit and the overlap simulation against hand-computed
answers, the trainer's bucket record, the table the aggregation writes (whole-sample batches,
the measured bus bandwidth before the configured link), and the real inputs: a 1-rank run's
buckets and the 2-rank all-reduce benchmark drive the prediction of a 2-rank gloo run."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch.distributed as dist

from scalerepro.analysis.tables import aggregate, prediction_error
from scalerepro.analysis.tables.model_inputs import read_profile, within_step
from scalerepro.analysis.tables.network_model import HierarchicalNetwork, read_links
from scalerepro.analysis.tables.published_steps import FsdpProfile, simulate_fsdp_step
from scalerepro.analysis.tables.scaling_model import PROPORTIONAL_BOUND
from scalerepro.analysis.tables.step_model import (
    RingNetwork,
    StepProfile,
    config_network,
    expected_max_normal,
    fit_comm_file,
    fit_ring,
    simulate_step,
    straggler_spread,
    straggler_wait_s,
)
from scalerepro.models.cnn import SmallCNN
from scalerepro.training import buckets
from scalerepro.training.train import main

from analysis_fixtures import PROFILE, REFERENCES, Study, make_record, predict_published_benchmark, validate, write_comm
from conftest import SHARED_MACHINE_TARGETS, clean_env, load_record
from h100_report import REBUILDS_A_STUDY, rebuild_kept_study

# ---- the ring all-reduce and its fit ----------------------------------------------------------


def test_ring_formula_by_hand():
    ring = RingNetwork(4, alpha_step_s=2e-6, link_bytes_per_s=1e9, source="hand")
    # t = 2(N-1) alpha + 2(N-1)/N S/B = 6 x 2 us + 1.5 x 1 MB / 1 GB/s = 12 us + 1.5 ms
    assert ring.allreduce_s(1e6) == pytest.approx(12e-6 + 1.5e-3)
    assert RingNetwork(1, 1.0, 1.0, "one").allreduce_s(1e9) == 0.0


@pytest.mark.parametrize("gpus", [2, 8])
def test_fit_recovers_alpha_and_bandwidth_from_exact_data(gpus):
    alpha, bandwidth = 5e-6, 40e9
    sizes = [4096, 65536, 1 << 20, 1 << 24, 1 << 28]
    times = [RingNetwork(gpus, alpha, bandwidth, "truth").allreduce_s(s) for s in sizes]
    fitted = fit_ring(sizes, times, gpus)
    assert fitted.alpha_step_s == pytest.approx(alpha, rel=1e-9)
    assert fitted.link_bytes_per_s == pytest.approx(bandwidth, rel=1e-9)


def test_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="two or more message sizes"):
        fit_ring([1024, 1024], [1e-5, 1e-5], 2)
    # a time that falls with the size (noise): alpha alone, relative least squares over 2 steps:
    # alpha = sum(2/t) / sum((2/t)^2) = (2000 + 20000) / (4e6 + 4e8) = 5.446e-5 s
    noisy = fit_ring([1024, 1 << 20], [1e-3, 1e-4], 2)
    assert noisy.link_bytes_per_s == float("inf") and "B unresolved" in noisy.source
    assert noisy.alpha_step_s == pytest.approx(22000 / 4.04e8)


def test_config_links_pick_nvlink_in_a_node_and_infiniband_across_nodes():
    links = read_links(REFERENCES)
    inside, across = config_network(links, 8, 8), config_network(links, 16, 8)
    # B = line rate x efficiency: an all-reduce reaches about 370 of NVLink 4's 450 GB/s, never 450
    assert inside.link_bytes_per_s == pytest.approx(450e9 * 0.85) and "NVLink" in inside.source
    assert "450 GB/s line rate x 0.85" in inside.source
    assert across.link_bytes_per_s == pytest.approx(50e9 * 0.85) and "InfiniBand" in across.source
    assert across.alpha_step_s > inside.alpha_step_s > 0
    assert "nccl-tests" in links["intra_node"].source and "assumed" in links["inter_node"].source  # the stated sources


# ---- the overlap simulation ----------------------------------------------------------------------

# A 2-GPU ring with alpha 0 and B such that a bucket of S bytes takes S / B: PROFILE's buckets take
# 4, 1 and 3 ms.
RING = RingNetwork(2, 0.0, 1e9, "hand")  # 2(N-1)/N = 1: t = S / B


def test_overlap_by_hand():
    # e1 = 2 + 4 = 6; e2 = max(5, 6) + 1 = 7; e3 = max(9, 7) + 3 = 12 ms
    # t = other 1 + forward 6 + max(backward 10, 12) + optimizer 1 = 20 ms
    prediction = simulate_step(PROFILE, RING)
    assert prediction.step_s == pytest.approx(20e-3)
    assert prediction.exposed_comm_s == pytest.approx(2e-3)
    assert prediction.allreduce_s == pytest.approx(8e-3)


def test_overlap_limits():
    # Full overlap: every all-reduce hidden behind the backward -> the 1-GPU step time.
    fast = RingNetwork(2, 0.0, 1e15, "infinitely fast")
    assert simulate_step(PROFILE, fast).step_s == pytest.approx(PROFILE.step_s)
    # No overlap: every bucket ready at the end of the backward -> t(1) + the sum of all-reduces.
    late = StepProfile(**{**PROFILE.__dict__, "bucket_ready_s": (10e-3, 10e-3, 10e-3)})
    assert simulate_step(late, RING).step_s == pytest.approx(PROFILE.step_s + 8e-3)
    # Latency-bound: alpha 1 ms per step, 2 steps per all-reduce on 2 GPUs, tiny buckets
    slow = RingNetwork(2, 1e-3, 1e15, "latency only")
    # e1 = 2 + 2 = 4; e2 = max(5, 4) + 2 = 7; e3 = max(9, 7) + 2 = 11 -> 1 + 6 + 11 + 1 = 19 ms
    assert simulate_step(PROFILE, slow).step_s == pytest.approx(19e-3)


def test_compute_scale_and_accumulation():
    # Strong scaling over 2 GPUs halves the per-GPU batch: c = 0.5. Ready 1, 2.5, 4.5 ms of 5 ms;
    # e1 = 1 + 4 = 5; e2 = 5 + 1 = 6; e3 = 6 + 3 = 9 -> 1 + 3 + 9 + 1 = 14 ms
    assert simulate_step(PROFILE, RING, compute_scale=0.5).step_s == pytest.approx(14e-3)
    # Two micro-batches: the first forward and backward have no communication (no_sync).
    two = StepProfile(**{**PROFILE.__dict__, "micro_batches": 2, "step_s": 35e-3})  # other = 35 - 33 = 2 ms
    # 2 + 2 x 6 + 10 + max(10, 12) + 1 = 37 ms
    assert simulate_step(two, RING).step_s == pytest.approx(37e-3)


def test_phases_longer_than_the_step_are_scaled_into_it():
    # phases 6 + 10 + 1 = 17 ms but the window's median step is 8.5 ms: everything halves
    fitted = within_step(StepProfile(**{**PROFILE.__dict__, "step_s": 8.5e-3}))
    assert (fitted.forward_s, fitted.backward_s, fitted.optimizer_s) == pytest.approx((3e-3, 5e-3, 0.5e-3))
    assert fitted.bucket_ready_s == pytest.approx((1e-3, 2.5e-3, 4.5e-3)) and fitted.other_s == 0
    assert simulate_step(fitted, RingNetwork(2, 0.0, 1e15, "fast")).step_s == pytest.approx(8.5e-3)
    assert within_step(PROFILE) == PROFILE


# ---- the trainer's record ----------------------------------------------------------------------


def test_bucket_layout_follows_ddp():
    params = list(SmallCNN().parameters())
    sizes = [p.numel() * 4 for p in params]
    order = list(reversed(range(len(params))))
    first, cap = buckets.bucket_caps_bytes(0.1)
    layout = buckets.bucket_layout(sizes, order, first, cap)
    expected, _ = dist._compute_bucket_assignment_by_size([params[i] for i in order], [first, cap], [False] * len(order), order)
    assert layout == [list(b) for b in expected]
    assert sorted(i for bucket in layout for i in bucket) == list(range(len(params)))
    # DDP without bucket_cap_mb: a 1 MiB first bucket, then 25 MiB
    assert buckets.bucket_caps_bytes(None) == (dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20)


def test_one_rank_run_records_buckets(tmp_path):
    argv = [
        "--model",
        "cnn",
        "--steps",
        "8",
        "--warmup-steps",
        "2",
        "--per-gpu-batch",
        "8",
        "--num-workers",
        "0",
        "--synthetic-samples",
        "256",
        "--eval-samples",
        "32",
        "--bucket-cap-mb",
        "0.1",
        "--record",
        str(tmp_path / "r.json"),
    ]
    assert main(argv) == 0
    record = load_record(tmp_path / "r.json")
    probe = record["measurements"]["backward_buckets"]
    sizes = [bucket["bytes"] for bucket in probe["buckets"]]
    ready = [bucket["ready_s"] for bucket in probe["buckets"]]
    assert sum(sizes) == probe["gradient_bytes"] == 4 * record["model"]["num_parameters"]  # fp32 gradients
    assert len(sizes) == 2 and sum(b["parameters"] for b in probe["buckets"]) == 8
    assert ready == sorted(ready) and 0 < ready[-1] <= probe["backward_s"]
    assert probe["steps"] == 5 and probe["forward_s"] > 0 and probe["optimizer_s"] > 0


# ---- the aggregation's table ------------------------------------------------------------------


def test_table_puts_prediction_beside_measurement_and_predicts_beyond(tmp_path):
    s = Study(tmp_path)
    one = make_record("strong_resnet50_g1_r1", per_gpu_batch=32, samples_per_s=32 / 18e-3)
    one["measurements"]["backward_buckets"] = {
        "steps": 5,
        "reason": None,
        "gradient_bytes": 8_000_000,
        "micro_batches_per_step": 1,
        "forward_s": 6e-3,
        "backward_s": 10e-3,
        "optimizer_s": 1e-3,
        "buckets": [{"bytes": b, "parameters": 1, "ready_s": r} for b, r in zip(PROFILE.bucket_bytes, PROFILE.bucket_ready_s)],
    }
    s.add("strong", 1, 1, per_gpu_batch=32, record=validate(one))
    s.add(
        "strong", 2, 1, per_gpu_batch=16, record=_without_probe(make_record("strong_resnet50_g2_r1", per_gpu_batch=16, world_size=2, samples_per_s=32 / 15e-3))
    )
    # 2-GPU benchmark of the RING network above: t = S / 1 GB/s
    comm = write_comm(tmp_path / "g2.json", 2, 1, {s: s / 1e9 * 1e6 for s in (1 << 20, 1 << 24)})
    references = tmp_path / "references.yaml"
    references.write_text(REFERENCES.read_text())
    tables = aggregate.aggregate(s.write_matrix(), [comm], references, {}, predict_gpus=[2, 4, 8])
    table = tables["scaling_model"].set_index("gpus")
    assert list(table.index) == [1, 2, 4, 8] and list(table["basis"]) == ["measured", "measured", "predicted", "predicted"]
    assert table.loc[1, "step_time_predicted_s"] == pytest.approx(18e-3)
    assert table.loc[2, "step_time_predicted_s"] == pytest.approx(14e-3)  # test_compute_scale_and_accumulation
    assert table.loc[2, "step_time_measured_s"] == pytest.approx(15e-3)
    assert table.loc[2, "step_time_error"] == pytest.approx(14 / 15 - 1)
    assert table.loc[2, "efficiency_predicted"] == pytest.approx(18 / (2 * 14))  # t(1) / (N t(N))
    assert table.loc[2, "efficiency_measured"] == pytest.approx(tables["scaling"].set_index("gpus").loc[2, "efficiency"])
    assert pd.isna(table.loc[4, "step_time_measured_s"]) and "prediction only" in table.loc[4, "note"]
    assert table.loc[2, "network"].startswith("fit to g2.json") and table.loc[8, "compute_scale"] == pytest.approx(1 / 8)
    # the fixture's nodes hold 2 H100s and it measured no link across nodes: 4 and 8 GPUs are beyond
    # its node, and run on its GPU's preset (8 GPUs a node), not on 2-GPU nodes over InfiniBand
    assert table.loc[4, "nodes"] == 1 and table.loc[4, "cluster"] == "dgx_h100" and "scaling.predict_cluster is not set" in table.loc[4, "cluster_basis"]
    # with no preset for its GPU in the references, the links there, on nodes of its own size
    tables = aggregate.aggregate(s.write_matrix(), [comm], _without_clusters(tmp_path), {}, predict_gpus=[2, 4, 8])
    table = tables["scaling_model"].set_index("gpus")
    assert "InfiniBand" in table.loc[4, "network"] and table.loc[4, "nodes"] == 2 and pd.isna(table.loc[4, "cluster"])


def _without_probe(record: dict) -> dict:
    """A multi-rank record whose communication probe did not run (--comm-probe-steps 0): the model
    then has no compute inflation or bandwidth under load to apply, and replays the one-GPU step
    as it is (the tests of the replay itself; tests/test_loss_decomposition.py tests those two)."""
    record["measurements"]["exposed_communication"].update(
        fraction=None, sync_step_s=None, nosync_step_s=None, nosync_rank_mean_s=None, straggler_wait_s=None, steps=0, reason="--comm-probe-steps 0"
    )
    return validate(record)


def _without_clusters(tmp_path) -> Path:
    """config/references.yaml without its cluster presets."""
    import yaml

    document = yaml.safe_load(REFERENCES.read_text())
    document.pop("clusters")
    path = tmp_path / "references-no-clusters.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _agreeing(record: dict) -> None:
    """A record whose median step was set by hand, made to agree with itself again as the
    trainer's do: epoch_time_s = steps per epoch x median step, p10 and p90 around the median."""
    steps = record["measurements"]["step_time_s"]
    steps["p10"], steps["p90"] = min(steps["p10"], steps["median"]), max(steps["p90"], steps["median"])
    record["measurements"]["epoch_time_s"] = record["steps"]["per_epoch"] * steps["median"]


def _strong_study(tmp_path, gpus_per_node: int, global_batch: int, micro_1: int, accum_1: int):
    """A strong-scaling study: a 1-GPU run of micro-batch ``micro_1`` x ``accum_1`` (= G) with the
    overlap fixture's step, a 2-GPU run and the 2-GPU benchmark of RING (1 GB/s, one node)."""
    s = Study(tmp_path)
    # its throughput's step (a strong cell's efficiency is in throughputs) the median step below
    one = make_record("strong_resnet50_g1_r1", per_gpu_batch=micro_1, grad_accum_steps=accum_1, samples_per_s=global_batch / (18e-3 + (accum_1 - 1) * 16e-3))
    one["measurements"]["backward_buckets"] = {
        "steps": 5,
        "reason": None,
        "gradient_bytes": 8_000_000,
        "micro_batches_per_step": accum_1,
        "forward_s": 6e-3,
        "backward_s": 10e-3,
        "optimizer_s": 1e-3,
        "buckets": [{"bytes": b, "parameters": 1, "ready_s": r} for b, r in zip(PROFILE.bucket_bytes, PROFILE.bucket_ready_s)],
    }
    one["measurements"]["step_time_s"]["median"] = 18e-3 + (accum_1 - 1) * 16e-3  # other 1 ms: t(1) = 1 + A(6 + 10) + 1
    _agreeing(one)
    s.add("strong", 1, 1, per_gpu_batch=micro_1, grad_accum_steps=accum_1, record=validate(one))
    micro_2 = global_batch // 2 // max(1, accum_1 // 2)
    two = make_record("strong_resnet50_g2_r1", per_gpu_batch=micro_2, world_size=2, grad_accum_steps=max(1, accum_1 // 2), samples_per_s=global_batch / 30e-3)
    s.add("strong", 2, 1, per_gpu_batch=micro_2, grad_accum_steps=max(1, accum_1 // 2), record=_without_probe(two))
    matrix = pd.read_csv(s.write_matrix())
    matrix["global_batch"] = global_batch  # the same at every N (scaling.strong.global_batch)
    matrix["gpus_per_node"] = gpus_per_node
    matrix.to_csv(tmp_path / "matrix.csv", index=False)
    comm = write_comm(tmp_path / "g2.json", 2, 1, {s: s / 1e9 * 1e6 for s in (1 << 20, 1 << 24)})
    return tmp_path / "matrix.csv", comm


def test_predictions_split_the_global_batch_into_whole_samples(tmp_path):
    # G = 64 samples: micro-batch 32 x 2 at 1 GPU, then 32, 16, 8 and 1 per GPU; 3 and 48 GPUs
    # cannot take 64 samples in whole ones (the defect: 64 / 48 = 1.33 samples per GPU)
    matrix, comm = _strong_study(tmp_path, gpus_per_node=64, global_batch=64, micro_1=32, accum_1=2)
    table = aggregate.aggregate(matrix, [comm], REFERENCES, {}, predict_gpus=[3, 4, 8, 48, 64])["scaling_model"].set_index("gpus")
    assert list(table.index) == [1, 2, 3, 4, 8, 48, 64]
    assert table.loc[[4, 8, 64], "per_gpu_batch"].tolist() == [16, 8, 1] and (table.loc[[4, 8, 64], "grad_accum_steps"] == 1).all()
    assert table.loc[1, "grad_accum_steps"] == 2 and table.loc[4, "compute_scale"] == pytest.approx(16 / 32)
    for gpus in (3, 48):
        assert pd.isna(table.loc[gpus, "step_time_predicted_s"]) and pd.isna(table.loc[gpus, "per_gpu_batch"])
        assert table.loc[gpus, "note"] == f"no prediction: the global batch 64 does not split evenly over {gpus} GPUs"
    assert table["per_gpu_batch"].dropna().map(float.is_integer).all()


def test_predictions_accumulate_where_the_share_exceeds_the_micro_batch(tmp_path):
    # G = 256, micro-batch 32: 8 micro-batches at 1 GPU, 4 at 2 (measured), 2 x 32 at 4 GPUs
    matrix, comm = _strong_study(tmp_path, gpus_per_node=8, global_batch=256, micro_1=32, accum_1=8)
    table = aggregate.aggregate(matrix, [comm], REFERENCES, {}, predict_gpus=[4])["scaling_model"].set_index("gpus")
    assert (table.loc[2, "per_gpu_batch"], table.loc[2, "grad_accum_steps"]) == (32, 4)
    assert (table.loc[4, "per_gpu_batch"], table.loc[4, "grad_accum_steps"], table.loc[4, "compute_scale"]) == (32, 2, 1.0)
    # at 4 GPUs on RING-like measured links (alpha 0, B 1 GB/s fitted from g2.json, one node):
    # 2(N-1)/N = 1.5, buckets 6, 1.5, 4.5 ms: e1 = 2 + 6 = 8, e2 = 9.5, e3 = 14 ms;
    # t = other 1 + 2 x 6 + (2 - 1) x 10 + max(10, 14) + 1 = 38 ms
    assert table.loc[4, "step_time_predicted_s"] == pytest.approx(38e-3, rel=1e-6)
    assert table.loc[1, "step_time_predicted_s"] == pytest.approx(1e-3 + 8 * 16e-3 + 1e-3)  # t(1) given back


def test_beyond_the_hardware_the_measured_bus_bandwidth_wins(tmp_path):
    # g2.json was measured on one node at B = 1 GB/s; 4 and 8 GPUs fit in a node of 8: the fit
    # applies (not NVLink's 450 GB/s line rate); 16 GPUs span nodes, where nothing was measured:
    # on the H100's preset (below), else the configured InfiniBand at 0.85 of its line rate, saying so
    matrix, comm = _strong_study(tmp_path, gpus_per_node=8, global_batch=64, micro_1=32, accum_1=2)
    own = aggregate.aggregate(matrix, [comm], REFERENCES, {}, predict_gpus=[4, 8, 16])["scaling_model"].set_index("gpus")
    assert own.loc[16, "cluster"] == "dgx_h100" and own.loc[16, "nodes"] == 2 and own.loc[8, "link_gbps"] == pytest.approx(1.0, rel=1e-6)
    table = aggregate.aggregate(matrix, [comm], _without_clusters(tmp_path), {}, predict_gpus=[4, 8, 16])["scaling_model"].set_index("gpus")
    for gpus in (4, 8):
        assert table.loc[gpus, "link_gbps"] == pytest.approx(1.0, rel=1e-6)
        assert table.loc[gpus, "network"].startswith("measured within one node: fit to g2.json")
    assert table.loc[16, "link_gbps"] == pytest.approx(50 * 0.85) and "50 GB/s line rate x 0.85" in table.loc[16, "network"]
    assert "the study measured no such link" in table.loc[16, "network"]
    # the prediction's error beside each measured cell: step time and efficiency
    measured = table.loc[2]
    assert measured["step_time_error"] == pytest.approx(measured["step_time_predicted_s"] / measured["step_time_measured_s"] - 1)
    assert measured["efficiency_error"] == pytest.approx(measured["efficiency_predicted"] - measured["efficiency_measured"])


def test_records_without_buckets_say_why(tmp_path):
    s = Study(tmp_path)
    for gpus, batch in ((1, 32), (2, 16)):
        older = make_record(f"strong_resnet50_g{gpus}_r1", world_size=gpus, per_gpu_batch=batch)
        del older["measurements"]["backward_buckets"]  # a record from before the scaling model
        s.add("strong", gpus, 1, per_gpu_batch=batch, record=validate(older))
    tables = aggregate.aggregate(s.write_matrix(), [], REFERENCES, {}, predict_gpus=[4])
    table = tables["scaling_model"]
    assert table["step_time_predicted_s"].isna().all()
    assert table["note"].str.contains("no backward_buckets").all()


# ---- the real inputs: 2 gloo ranks on the CPU ----------------------------------------------------

# How close the prediction comes to the measured 2-rank step is printed, not asserted: it is a
# figure, and on the shared 2-core VM it swung from -5 % to -58 % with the neighbours' load (the
# model does not see two ranks sharing the host's cores, nor gloo's threads reducing on a core
# that is busy with the backward). What is asserted holds for any load: the trainer's real
# bucket record and the real benchmark drive the model, and the all-reduces the model fitted are
# in the prediction.


def _run(command: list[str], timeout: float = 120) -> None:
    result = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_two_gloo_ranks_real_buckets_and_benchmark_drive_the_prediction(tmp_path):
    """A 1-rank and a 2-rank cnn run (weak scaling: the same batch and data per rank, so an epoch
    has as many steps at 1 and 2 ranks) and the 2-rank all-reduce benchmark, aggregated."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    common = [
        "-m",
        "scalerepro.training.train",
        "--model",
        "cnn",
        "--per-gpu-batch",
        "32",
        "--steps",
        "40",
        "--warmup-steps",
        "5",
        "--loader",
        "device",
        "--no-eval",
        "--bucket-cap-mb",
        "0.1",
        "--comm-probe-steps",
        "0",
        "--progress",
        "off",
    ]
    for gpus in (1, 2):
        samples = str(1024 * gpus)
        _run(
            [
                *torchrun,
                f"--nproc-per-node={gpus}",
                *common,
                "--synthetic-samples",
                samples,
                "--record",
                str(tmp_path / f"g{gpus}.json"),
                "--run-id",
                f"weak_cnn_g{gpus}_r1",
            ]
        )  # the matrix's run id below: the analysis refuses another run's record
    sizes = [str(4**k) for k in range(6, 12)]  # 4 KiB .. 4 MiB: the buckets' sizes and enough range for B
    _run(
        [
            *torchrun,
            "--nproc-per-node=2",
            "-m",
            "scalerepro.training.commbench",
            "--out",
            str(tmp_path / "comm.json"),
            "--device",
            "cpu",
            "--sizes",
            *sizes,
            "--iterations",
            "30",
        ]
    )
    s = Study(tmp_path / "study")
    for gpus in (1, 2):
        # the plan as the runs were: the trainer's default precision on a CPU (a record that departs from its plan does not count)
        s.add("weak", gpus, 1, per_gpu_batch=32, model="cnn", precision="fp32", bucket_cap_mb=0.1, record=load_record(tmp_path / f"g{gpus}.json"))
    tables = aggregate.aggregate(s.write_matrix(), [tmp_path / "comm.json"], REFERENCES, SHARED_MACHINE_TARGETS, predict_gpus=[])
    row = tables["scaling_model"].set_index("gpus").loc[2]
    assert not pd.isna(row["step_time_predicted_s"]), row["note"]
    assert row["buckets"] == 2 and row["basis"] == "measured" and row["network"].startswith("fit to comm.json (gloo, 6 sizes)")

    one = json.loads((tmp_path / "g1.json").read_text())["measurements"]["backward_buckets"]
    two = json.loads((tmp_path / "g2.json").read_text())["measurements"]["backward_buckets"]
    assert two["layout_source"].startswith("DDP's rebuilt buckets") and one["layout_source"].startswith("computed")
    assert [b["bytes"] for b in one["buckets"]] == [b["bytes"] for b in two["buckets"]]  # computed = DDP's

    # The all-reduces the model replays are the recorded buckets on the fitted ring (a model that
    # left the communication out would replay none), and the prediction lies between the same
    # step on an infinitely fast network (everything hidden) and that step plus every all-reduce
    # (nothing hidden)
    profile = within_step(read_profile(tmp_path / "g1.json")[0])
    network = fit_comm_file(tmp_path / "comm.json")
    assert row["allreduce_s"] == pytest.approx(sum(network.allreduce_s(b) for b in profile.bucket_bytes)) and row["allreduce_s"] > 0
    free = simulate_step(profile, RingNetwork(2, 0.0, float("inf"), "free")).step_s
    assert free <= row["step_time_predicted_s"] * (1 + 1e-9) <= (free + row["allreduce_s"]) * (1 + 2e-9)
    print(
        f"\n2 gloo ranks: measured {row['step_time_measured_s'] * 1e3:.2f} ms, predicted "
        f"{row['step_time_predicted_s'] * 1e3:.2f} ms ({row['step_time_error']:+.1%}), without communication "
        f"{free * 1e3:.2f} ms; alpha {row['alpha_step_us']:.0f} us, B {row['link_gbps']:.2f} GB/s; efficiency measured "
        f"{row['efficiency_measured']:.2f}, predicted {row['efficiency_predicted']:.2f}; host load average {os.getloadavg()[0]:.2f}"
    )


# ---- stragglers: the wait for the slowest of N ranks -------------------------------------------

README_STUDY = Path(__file__).resolve().parent / "fixtures" / "studies" / "cpu-readme-a0f872f"
H100_SESSION = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h100-2026-11-27"


def test_expected_max_of_normal_draws_by_hand():
    # closed forms: e_1 = 0, e_2 = 1 / sqrt(pi) = 0.564190, e_3 = 3 / (2 sqrt(pi)) = 0.846284;
    # tabulated (Tippett 1925): e_4 = 1.029375, e_5 = 1.162964, e_10 = 1.538753, e_100 = 2.507594
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)
    for ranks, tabulated in ((4, 1.029375), (5, 1.162964), (10, 1.538753), (100, 2.507594)):
        assert expected_max_normal(ranks) == pytest.approx(tabulated, abs=2e-6)
    # a window that waited W = 10 ms at 2 ranks, 200 ms compute: sigma / t = 0.01 / (0.564190 x 0.2) = 0.088623;
    # at 100 ranks the same spread waits 0.088623 x 0.2 x 2.507594 = 44.446 ms (e_100 / e_2 = 4.4446 times)
    spread = straggler_spread(10e-3, 2, 0.2)
    assert spread == pytest.approx(0.088623, abs=1e-6)
    assert straggler_wait_s(spread, 100, 0.2) == pytest.approx(44.446e-3, abs=1e-6)


@pytest.mark.parametrize("ranks", [2, 8, 64, 512])
def test_the_straggler_wait_is_what_n_simulated_ranks_wait(ranks):
    """Monte Carlo: 20 000 steps of N ranks, each rank's step drawn from the fitted distribution
    (mean 0.2 s, sigma 0.012 s: sigma / t = 0.06); the mean over steps of the slowest rank's step
    less the ranks' mean is sigma e_N within 1.5 % (the defect: a wait that does not grow with N,
    the measured two-rank wait carried unchanged, is 5.4 times short at 512)."""
    rng = np.random.default_rng(20261128)
    steps = rng.normal(0.2, 0.012, size=(20_000, ranks))
    simulated = float(np.mean(steps.max(axis=1) - steps.mean(axis=1)))
    assert straggler_wait_s(0.06, ranks, 0.2) == pytest.approx(simulated, rel=0.015)


def _readme_study_tables(tmp_path, every_run: bool = True) -> dict[str, pd.DataFrame]:
    """The README CPU study kept at commit a0f872f, aggregated with today's code as its rebuild
    does. Its third repeats (and a few more: 13 of 32 runs) ran while other processes held more
    than half of the machine's two cores; ``every_run`` counts them as the code that kept it did
    (the model's figures below are of those windows), else they are left out as a rebuild leaves
    them out today (targets.other_cpu_fraction_max)."""
    study = tmp_path / "results"
    shutil.copytree(README_STUDY, study)
    config = json.loads((study / "tables" / "config.json").read_text())
    scaling = config.get("scaling") or {}
    targets = config.get("targets") or {}
    tables, _ = aggregate.aggregate_study(
        study / "tables" / "matrix.csv",
        sorted((study / "comm").glob("g*.json")),
        REFERENCES,
        {**targets, "other_cpu_fraction_max": 1.0} if every_run else targets,
        scaling.get("predict_gpus", [8, 16, 64]),
        scaling.get("predict_cluster"),
        study,
    )
    return tables


def test_the_readme_study_predicts_e2_within_5_points_and_the_wait_for_the_slowest_rank_apart(tmp_path):
    """The kept README study (2 gloo ranks of ResNet-18, batch 8, three noisy repeats a cell): each
    cell's E(2) predicted with the other cell's inflation and straggler spread is within 5 points
    of the measured, strong (E in throughputs: mean steps) and weak (E in epoch times: median
    steps). Measured 0.5556 and 0.5454; predicted 0.5656 (+1.0) and 0.5649 (+2.0). The defect: the
    window's figures (means over 3-4 steps, one of them slow in a strong run) taken as a weak cell's
    median step: the weak cell came out at 0.461, -8.4 points."""
    model = _readme_study_tables(tmp_path)["scaling_model"].set_index(["study", "gpus"])
    for study, predicted in (("strong", 0.5656), ("weak", 0.5649)):
        row = model.loc[(study, 2)]
        assert abs(row["efficiency_error"]) <= 0.05, (study, row["efficiency_predicted"], row["efficiency_measured"])
        assert row["efficiency_predicted"] == pytest.approx(predicted, abs=5e-4)
        # the wait for the slowest rank is a part of the predicted loss of its own; the weak cell's
        # parts add up to its loss (the strong cell's do not: its one-GPU steps of two micro-batches
        # ran 21 % slower a micro-batch than the weak cell's of one, so against its ideal the
        # fixed cost comes out below 0, and is shown as 0)
        assert row["loss_straggler"] > 0 and row["straggler_basis"].startswith("held out: the window split of")
    weak = model.loc[("weak", 2)]
    parts = weak[["loss_fixed_cost", "loss_exposed_comm", "loss_compute_inflation", "loss_straggler"]].sum()
    assert parts == pytest.approx(1 - weak["efficiency_predicted"])


def test_the_readme_study_without_its_busy_runs_is_predicted_less_well(tmp_path):
    """Read as a rebuild reads it today, the runs measured beside busy neighbours left out (two
    repeats a cell at most), the same model misses by -4.1 points (strong: 0.485 against 0.526)
    and +5.4 (weak: 0.586 against 0.532): on the quiet windows alone the 5 points above do not
    hold (docs/scaling-model.md states both)."""
    model = _readme_study_tables(tmp_path, every_run=False)["scaling_model"].set_index(["study", "gpus"])
    for study, predicted, measured in (("strong", 0.4846, 0.5258), ("weak", 0.5862, 0.5324)):
        row = model.loc[(study, 2)]
        assert row["efficiency_predicted"] == pytest.approx(predicted, abs=5e-4)
        assert row["efficiency_measured"] == pytest.approx(measured, abs=5e-4)
        assert row["efficiency_error"] == pytest.approx(predicted - measured, abs=1e-3)


def test_the_readme_studys_straggler_wait_held_out_at_two_ranks_and_beyond(tmp_path):
    """At N = 2 each cell's wait is predicted from the other cell's spread: strong 53.6 ms against
    the 88.7 ms its windows measured, weak 72.4 ms against 43.9 ms (at the median step). On these
    three noisy repeats a cell the held-out wait is right to within a factor of 2, not better (the
    two cells' spreads, sigma / t = 0.203 and 0.120, differ by 1.7x). Beyond the hardware the wait
    grows as e_N: W(16) / W(8) = e_16 / e_8 = 1.765991 / 1.423600 = 1.2405 at one spread and k."""
    tables = _readme_study_tables(tmp_path)
    model, runs = tables["scaling_model"].set_index(["study", "gpus"]), tables["runs"]
    for study, predicted_ms, measured_ms in (("strong", 53.58, 88.68), ("weak", 72.39, 43.86)):
        row = model.loc[(study, 2)]
        wait = row["loss_straggler"] * row["step_time_predicted_s"]
        cell = runs[runs["run_id"].str.startswith(f"{study}_resnet18_cifar_g2")]
        # the windows' waits at the statistic the cell's E is in (weak: median steps)
        scale = 1.0 if study == "strong" else cell["step_time_median_s"] / (cell["window_s"] / cell["measured_steps"])
        measured = statistics.median(cell["window_straggler_wait_s"] * scale)
        assert wait * 1e3 == pytest.approx(predicted_ms, abs=0.05) and measured * 1e3 == pytest.approx(measured_ms, abs=0.05)
        assert 0.5 < wait / measured < 2.0
    weak = model.loc["weak"]
    wait = weak["loss_straggler"] * weak["step_time_predicted_s"]
    assert wait[16] / wait[8] == pytest.approx(expected_max_normal(16) / expected_max_normal(8), rel=1e-9)
    assert expected_max_normal(16) / expected_max_normal(8) == pytest.approx(1.2405, abs=1e-4)
    assert list(weak.loc[[8, 16, 64], "loss_straggler"].diff().dropna() > 0) == [True, True]  # the share of the loss grows with N


# ---- FSDP's root unit -------------------------------------------------------------------------


def test_fsdp_root_unit_is_gathered_first_and_reduce_scattered_last_by_hand():
    # g = 8, n = 4 (NVLink 100 GB/s, 1 us; NIC 10 GB/s, 5 us), L = 4 blocks, P_g = S = 8e8 bytes,
    # P_r = 2 S, the root rho = 0.25 of the parameters. Each collective is one ring pass, 43 us +
    # max(NVLink 31/32 x bytes / 100 GB/s, NIC 31/32 x bytes / 8 / 10 GB/s), the NIC the slower:
    #   ag   = AG(0.75 S / 4 = 150 MB) = 43 us + 31/32 x 1.875 ms = 43 us + 1.81640625 ms
    #   rs   = RS(0.75 x 2S / 4 = 300 MB) = 43 us + 31/32 x 3.75 ms = 43 us + 3.6328125 ms
    #   ag_0 = AG(0.25 S = 200 MB) = 43 us + 31/32 x 2.5 ms = 43 us + 2.421875 ms
    #   rs_0 = RS(0.25 x 2S = 400 MB) = 43 us + 31/32 x 5 ms = 43 us + 4.84375 ms
    # F = ag_0 + max(ag + 100 ms, 4 ag) = ag_0 + ag + 100 ms; G = max(200 ms + rs, 4 (ag + rs)) + rs_0
    # t = other 20 ms + F + G + 80 ms / 32 = 20 + 100 + 200 + 2.5 ms + 4 x 43 us + 12.71484375 ms
    net = HierarchicalNetwork(8, 4, 100e9, 1e-6, 10e9, 5e-6, "auto", "hand")
    s = 8e8
    profile = FsdpProfile(
        step_s=0.4, forward_s=0.1, backward_s=0.2, optimizer_s=0.08, micro_batches=1, units=4, gather_bytes=s, reduce_bytes=2 * s, root_fraction=0.25
    )
    ag, rs, ag0, rs0 = (43e-6 + 31 / 32 * t for t in (1.875e-3, 3.75e-3, 2.5e-3, 5e-3))
    prediction = simulate_fsdp_step(profile, net)
    assert prediction.step_s == pytest.approx(0.02 + 0.1 + 0.2 + 0.0025 + 4 * 43e-6 + 31 / 32 * 13.125e-3)
    assert prediction.exposed_comm_s == pytest.approx(ag0 + ag + rs + rs0)
    assert prediction.allreduce_s == pytest.approx(4 * (2 * ag + rs) + ag0 + rs0)
    # the root taken as a fifth block (rho = 0, the model before): its transfers hide but the first
    # gather and the last reduce-scatter, 43 us + 2.421875 ms and 43 us + 4.84375 ms: 5.53 ms less
    flat = simulate_fsdp_step(FsdpProfile(0.4, 0.1, 0.2, 0.08, 1, 4, s, 2 * s), net)
    assert prediction.step_s - flat.step_s == pytest.approx(ag0 + ag + rs + rs0 - (43e-6 + 31 / 32 * 2.5e-3) - (43e-6 + 31 / 32 * 5e-3))


# ---- a one-GPU study: weak scaling at its per-GPU batch, strong scaling as a bound --------------


@REBUILDS_A_STUDY
def test_the_kept_one_h100_study_predicts_weak_scaling_at_its_batch_on_dgx_h100_with_the_kept_curve(tmp_path):
    """benchmarks/gpu/h100-2026-11-27/study-results ran every model on one H100 (strong study,
    one GPU). Rebuilt with its GPU session's batch curve beside it (batch_curve.json, as the
    session kept it beside the study), each model is predicted at 8, 16 and 64 GPUs with its
    one-GPU per-GPU batch held, on dgx_h100, each row with its regime's back-tested error
    (2-8 nodes: DLE BERT and ViT g/14 at 8 nodes, +-1.1 %; one node: none, each row's communication
    share far above the Lambda rows' of that regime);
    ResNet-50's rows name the kept curve. The strong rows hold a global batch of their own
    (test_scaling_model_strong_batch.py): ResNet-50's 10240 is 160 images a GPU at 64 GPUs, within
    the curve's 50 to 400: no bound, its compute from the curve."""
    root = tmp_path / "h100-2026-11-27"  # the session's folder, the study and its curve in it

    def with_the_sessions_curve(config: dict) -> None:
        shutil.copy(H100_SESSION / "batch_curve.json", root / "batch_curve.json")

    study = rebuild_kept_study(H100_SESSION / "study-results", root, with_the_sessions_curve)
    model = pd.read_csv(study.results / "tables" / "scaling_model.csv")
    weak = model[model["study"].eq("weak")].set_index(["model", "gpus"])
    assert sorted(weak.index.get_level_values("model").unique()) == ["bert_base", "gpt2_small", "llama_1b", "resnet18_cifar", "resnet50", "vit_b_16"]
    assert (weak["basis"] == "predicted").all() and (weak["cluster"] == "dgx_h100").all() and weak["step_time_predicted_s"].notna().all()
    strong_one = model[model["study"].eq("strong") & model["gpus"].eq(1)].set_index("model")["per_gpu_batch"]
    for (name, gpus), row in weak.iterrows():
        assert row["per_gpu_batch"] == strong_one[name] and row["compute_scale"] == 1.0 and 0.9 < row["efficiency_predicted"] <= 1.0
        expected = prediction_error.Regime("ddp", "one node" if gpus == 8 else "2-8 nodes", "held", "as given")
        assert row["regime"] == expected.key
        if gpus == 8:  # every model's all-reduce is 1.5-10 % of its step, the Lambda rows' 0.10-0.15 %: no error bar
            assert pd.isna(row["typical_error"]) and row["error_basis"].startswith(prediction_error.NO_ERROR_BAR)
            assert row["cluster_note"].startswith("on NVIDIA DGX H100; no typical error: no error bar: communication is")
            continue
        assert row["typical_error"] == pytest.approx(0.011)
        # the cluster and its error in their own column, so the report can say them once above the table
        assert row["cluster_note"].startswith("on NVIDIA DGX H100; the model's typical error in its regime") and "DGX" not in row["note"]
    curve = weak.loc[("resnet50", 64), "batch_curve"]
    assert curve.startswith("t(m) = 4.72 ms + 0.202 ms x m") and "h100-2026-11-27/batch_curve.json" in curve
    strong = model[model["study"].eq("strong")].set_index(["model", "gpus"]).loc[("resnet50", 64)]
    assert strong["per_gpu_batch"] == 160 and pd.isna(strong["bound"]) and strong["batch_curve"] == curve
    assert strong["regime"] == prediction_error.Regime("ddp", "2-8 nodes", "below the knee", "batch curve").key


def test_a_strong_row_the_batch_curve_covers_is_no_bound(tmp_path):
    # G = 256 at micro-batch 256 on one GPU; a kept curve through 64..256 in the study folder covers
    # 2 and 4 GPUs' 128 and 64 per GPU, not 8 GPUs' 32: c = (t(m) - fixed) / (t(256) - fixed). A
    # study of one GPU holds a larger global batch beyond it (test_scaling_model_strong_batch.py):
    # a bound of 256 on ResNet-50's keeps the study's own, split over 2, 4 and 8 GPUs
    import yaml

    from scalerepro.common.references import load_references

    references = load_references(REFERENCES)
    references["one_gpu_strong_batch"]["bounds"]["resnet50"] = {"global_batch": 256, "name": "this test", "source": "the split this test checks"}
    (tmp_path / "references.yaml").write_text(yaml.safe_dump(references))
    s = Study(tmp_path)
    one = make_record("strong_resnet50_g1_r1", per_gpu_batch=256, samples_per_s=256 / 18e-3)
    one["measurements"]["backward_buckets"] = {
        "steps": 5,
        "reason": None,
        "gradient_bytes": 8_000_000,
        "micro_batches_per_step": 1,
        "forward_s": 6e-3,
        "backward_s": 10e-3,
        "optimizer_s": 1e-3,
        "buckets": [{"bytes": b, "parameters": 1, "ready_s": r} for b, r in zip((4_000_000, 1_000_000, 3_000_000), (2e-3, 5e-3, 9e-3))],
    }
    s.add("strong", 1, 1, per_gpu_batch=256, record=validate(one))
    matrix = pd.read_csv(s.write_matrix())
    matrix["global_batch"] = 256
    matrix.to_csv(tmp_path / "matrix.csv", index=False)
    # t(m) = 4 ms + 0.0625 ms x m: t(256) = 20 ms, t(128) = 12 ms, t(64) = 8 ms (the bare loop's
    # ratios are what the model takes, not its 20 ms against the run's 18)
    (tmp_path / "batch_curve.json").write_text(
        json.dumps(
            {"model": "resnet50", "device": "NVIDIA H100 80GB HBM3", "rows": [{"batch": m, "step_s_median": 4e-3 + 0.0625e-3 * m} for m in (64, 128, 256)]}
        )
    )
    table = aggregate.aggregate(tmp_path / "matrix.csv", [], tmp_path / "references.yaml", {}, predict_gpus=[2, 4, 8])["scaling_model"]
    strong = table[table["study"].eq("strong")].set_index("gpus")
    # fixed = other + o = (18 - 16 - 1) + 1 = 2 ms: c(128) = (12 - 2) / (20 - 2) = 0.5556, c(64) = 6 / 18 = 0.3333;
    # 32 lies below the curve's 64: proportional, 32 / 256 = 0.125 (not the line's (6 - 2) / 18 = 0.2222), and a bound
    assert strong.loc[2, "compute_scale"] == pytest.approx(10 / 18) and strong.loc[4, "compute_scale"] == pytest.approx(6 / 18)
    assert strong.loc[8, "compute_scale"] == pytest.approx(0.125)
    assert pd.isna(strong.loc[2, "bound"]) and pd.isna(strong.loc[4, "bound"]) and strong.loc[8, "bound"] == PROPORTIONAL_BOUND
    assert strong.loc[4, "batch_curve"].startswith("t(m) = 4 ms + 0.0625 ms x m through m = 64, 128, 256 (batch_curve.json")
    # a study of one GPU is also predicted weak, at its 256 a GPU
    weak = table[table["study"].eq("weak")].set_index("gpus")
    assert list(weak.index) == [2, 4, 8] and (weak["per_gpu_batch"] == 256).all() and weak["bound"].isna().all()


# ---- the back-test on published series (benchmarks/predict_published.py) ----------------------


def _benchmark():
    return predict_published_benchmark()


def test_the_back_test_fits_nothing_on_the_held_back_counts():
    bench = _benchmark()
    # six counts: the first given, ceil(6 / 2) = 3 -> counts 2..3 fitted, the rest held back
    assert bench.roles([8, 16, 32, 64, 128, 256]) == {8: "given", 16: "fit", 32: "fit", 64: "held back", 128: "held back", 256: "held back"}
    assert bench.roles([1, 2, 4, 8]) == {1: "given", 2: "fit", 4: "held back", 8: "held back"}
    assert bench.roles([128, 256, 512]) == {128: "given", 256: "fit", 512: "held back"}
    assert bench.roles([8, 64]) == {8: "given", 64: "held back"}  # two counts: nothing to fit on


def test_mpt_1b_at_512_gpus_is_predicted_from_128_and_256_within_half_of_ideal_scalings_error():
    """llm-foundry's MPT-1B, SHARD_GRAD_OP at 12 a GPU: 44123, 42555, 39837 tokens/s per GPU at 128,
    256, 512 GPUs. Given 128 and the straggler spread fitted on 256, the model predicts 512 within
    +3.0 % (ideal scaling: +10.8 %); without the straggler term the model says +9.5 % (its
    collectives hide behind a 0.56 s step but the root unit's and their latency, 11 ms at 512)."""
    import yaml

    bench = _benchmark()
    series = next(s for s in bench.SERIES if s.label == "MPT-1B FSDP SHARD_GRAD_OP")
    references = {entry["id"]: entry for entry in yaml.safe_load(REFERENCES.read_text())["references"]}
    presets = bench.network_model.read_clusters(REFERENCES)
    rows = {r["gpus"]: r for r in bench.predict_series(series, references, presets, None)}
    assert rows[256]["error"] == pytest.approx(0.0, abs=1e-3)  # fitted there: nothing of 512 goes in
    assert rows[512]["role"] == "held back" and rows[512]["ideal_error"] == pytest.approx(44123 / 39837 - 1)
    assert abs(rows[512]["error"]) <= abs(rows[512]["ideal_error"]) / 2 and rows[512]["error"] == pytest.approx(0.030, abs=0.005)
    assert rows[512]["regime"] == prediction_error.Regime("fsdp", "9+ nodes", "held", "as given") and rows[512]["spread"] > 0
    without = {r["gpus"]: r for r in bench.predict_series(series, references, presets, None, terms=bench.Terms(False, True, True))}
    assert without[512]["error"] == pytest.approx(0.095, abs=0.005)
