"""The alpha-beta scaling model: the ring fit and the overlap simulation against hand-computed
answers, the trainer's bucket record, the table the aggregation writes (whole-sample batches,
the measured bus bandwidth before the configured link), and the real inputs: a 1-rank run's
buckets and the 2-rank all-reduce benchmark drive the prediction of a 2-rank gloo run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch.distributed as dist

from scalerepro.analysis.tables import aggregate
from scalerepro.analysis.tables.scaling_model import (
    RingNetwork,
    StepProfile,
    config_network,
    fit_comm_file,
    fit_ring,
    read_links,
    read_profile,
    simulate_step,
    within_step,
)
from scalerepro.models.cnn import SmallCNN
from scalerepro.training import buckets
from scalerepro.training.train import main

from analysis_fixtures import Study, make_record, validate, write_comm
from conftest import clean_env, load_record

REFERENCES = Path(__file__).resolve().parents[1] / "config" / "references.yaml"

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

# Three buckets ready at 2, 5 and 9 ms of a 10 ms backward; forward 6 ms, optimizer 1 ms, the
# measured step 18 ms (other = 18 - (6 + 10 + 1) = 1 ms). A 2-GPU ring with alpha 0 and B such
# that a bucket of S bytes takes S / B: sizes of 4, 1 and 3 ms.
PROFILE = StepProfile(
    step_s=18e-3,
    forward_s=6e-3,
    backward_s=10e-3,
    optimizer_s=1e-3,
    micro_batches=1,
    bucket_bytes=(4_000_000, 1_000_000, 3_000_000),
    bucket_ready_s=(2e-3, 5e-3, 9e-3),
)
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
    expected, _ = dist._compute_bucket_assignment_by_size(
        [params[i] for i in order], [first, cap], [False] * len(order), order
    )
    assert layout == [list(b) for b in expected]
    assert sorted(i for bucket in layout for i in bucket) == list(range(len(params)))
    # DDP without bucket_cap_mb: a 1 MiB first bucket, then 25 MiB
    assert buckets.bucket_caps_bytes(None) == (dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20)


def test_one_rank_run_records_buckets(tmp_path):
    argv = [
        "--model", "cnn", "--steps", "8", "--warmup-steps", "2", "--per-gpu-batch", "8", "--num-workers", "0",
        "--synthetic-samples", "256", "--eval-samples", "32", "--bucket-cap-mb", "0.1",
        "--record", str(tmp_path / "r.json"),
    ]  # fmt: skip
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
        "steps": 5, "reason": None, "gradient_bytes": 8_000_000, "micro_batches_per_step": 1,
        "forward_s": 6e-3, "backward_s": 10e-3, "optimizer_s": 1e-3,
        "buckets": [{"bytes": b, "parameters": 1, "ready_s": r} for b, r in zip(PROFILE.bucket_bytes, PROFILE.bucket_ready_s)],
    }  # fmt: skip
    s.add("strong", 1, 1, per_gpu_batch=32, record=validate(one))
    s.add("strong", 2, 1, per_gpu_batch=16, record=_without_probe(make_record("strong_resnet50_g2_r1", per_gpu_batch=16, world_size=2, samples_per_s=32 / 15e-3)))
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
        fraction=None, sync_step_s=None, nosync_step_s=None, nosync_rank_mean_s=None, straggler_wait_s=None, steps=0,
        reason="--comm-probe-steps 0")  # fmt: skip
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
    one = make_record("strong_resnet50_g1_r1", per_gpu_batch=micro_1, grad_accum_steps=accum_1, samples_per_s=global_batch / 18e-3)
    one["measurements"]["backward_buckets"] = {
        "steps": 5, "reason": None, "gradient_bytes": 8_000_000, "micro_batches_per_step": accum_1,
        "forward_s": 6e-3, "backward_s": 10e-3, "optimizer_s": 1e-3,
        "buckets": [{"bytes": b, "parameters": 1, "ready_s": r} for b, r in zip(PROFILE.bucket_bytes, PROFILE.bucket_ready_s)],
    }  # fmt: skip
    one["measurements"]["step_time_s"]["median"] = 18e-3 + (accum_1 - 1) * 16e-3  # other 1 ms: t(1) = 1 + A(6 + 10) + 1
    _agreeing(one)
    s.add("strong", 1, 1, per_gpu_batch=micro_1, grad_accum_steps=accum_1, record=validate(one))
    micro_2 = global_batch // 2 // max(1, accum_1 // 2)
    two = make_record("strong_resnet50_g2_r1", per_gpu_batch=micro_2, world_size=2, grad_accum_steps=max(1, accum_1 // 2),
                      samples_per_s=global_batch / 30e-3)
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
        "-m", "scalerepro.training.train", "--model", "cnn", "--per-gpu-batch", "32", "--steps", "40", "--warmup-steps", "5",
        "--loader", "device", "--no-eval", "--bucket-cap-mb", "0.1", "--comm-probe-steps", "0", "--progress", "off",
    ]  # fmt: skip
    for gpus in (1, 2):
        samples = str(1024 * gpus)
        _run([*torchrun, f"--nproc-per-node={gpus}", *common, "--synthetic-samples", samples, "--record", str(tmp_path / f"g{gpus}.json"),
              "--run-id", f"weak_cnn_g{gpus}_r1"])  # the matrix's run id below: the analysis refuses another run's record
    sizes = [str(4**k) for k in range(6, 12)]  # 4 KiB .. 4 MiB: the buckets' sizes and enough range for B
    _run([*torchrun, "--nproc-per-node=2", "-m", "scalerepro.training.commbench", "--out", str(tmp_path / "comm.json"),
          "--device", "cpu", "--sizes", *sizes, "--iterations", "30"])  # fmt: skip
    s = Study(tmp_path / "study")
    for gpus in (1, 2):
        # the plan as the runs were: the trainer's default precision on a CPU (a record that departs from its plan does not count)
        s.add("weak", gpus, 1, per_gpu_batch=32, model="cnn", precision="fp32", record=load_record(tmp_path / f"g{gpus}.json"))
    tables = aggregate.aggregate(s.write_matrix(), [tmp_path / "comm.json"], REFERENCES, {}, predict_gpus=[])
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
