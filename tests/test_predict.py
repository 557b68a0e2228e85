"""The hierarchical network model and the prediction command: each collective's terms against
hand-computed answers (NCCL's flat ring through all N GPUs over NVLink and one NIC per GPU, the
tree across nodes, the ring's bus bandwidth across nodes, the latency per hop, FSDP's
reduce-scatter / all-gather step), the cluster
presets of config/references.yaml, the fit of the compute to a published step, the report's
table on a preset, and ``python -m scalerepro.analysis.predict`` on a real record and on bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scalerepro.analysis import predict
from scalerepro.analysis.tables import aggregate, prediction_error
from scalerepro.analysis.tables.network_model import HierarchicalNetwork, read_clusters, read_prediction_error
from scalerepro.analysis.tables.prediction_error import error_table_of
from scalerepro.analysis.tables.published_steps import FsdpProfile, fit_compute_to_step, simulate_fsdp_step
from scalerepro.analysis.tables.step_model import RingNetwork, StepProfile, simulate_step
from scalerepro.common.references import load_references

from analysis_fixtures import REPO, Study, make_record, validate

REFERENCES = REPO / "config" / "references.yaml"

# g = 8 GPUs per node, n = 4 nodes; NVLink B_i = 100 GB/s, alpha_i = 1 us; NIC B_e = 10 GB/s,
# alpha_e = 5 us (round numbers, so that every term can be written out by hand)
NET = HierarchicalNetwork(8, 4, 100e9, 1e-6, 10e9, 5e-6, "auto", "hand")
S = 8e8  # bytes


def test_ring_terms_by_hand():
    # the flat ring through all N = 32 GPUs, per pass N-1 = 31 steps, n-1 = 3 across the network
    # (NCCL's tuner): (N-n) alpha_i + (n-1) alpha_e = 28 + 15 us;
    # NVLink (N-1)/N S / B_i = 31/32 x 8 ms = 7.75 ms; each NIC (N-1)/N (S/g) / B_e = 31/32 x 10 ms = 9.6875 ms
    assert NET.ring_terms(S, 1) == pytest.approx((43e-6, 31 / 32 * 8e-3, 31 / 32 * 10e-3))
    # the all-reduce is two passes: 86 us, 2 x 31/32 x 8 ms = 15.5 ms, 2 x 31/32 x 10 ms = 19.375 ms
    assert NET.ring_terms(S, 2) == pytest.approx((86e-6, 15.5e-3, 19.375e-3))


def test_tree_terms_by_hand():
    # 2(g-1) alpha_i + 2 ceil(log2 4) alpha_e = 14 + 20 us; 2(g-1)/g S / B_i = 1.75 x 8 ms = 14 ms;
    # 2 (S/g) / B_e = 2 x 100 MB / 10 GB/s = 20 ms
    assert NET.tree_terms(S) == pytest.approx((34e-6, 14e-3, 20e-3))
    # 5 nodes: ceil(log2 5) = 3 hops each way, 14 + 30 us
    assert HierarchicalNetwork(8, 5, 100e9, 1e-6, 10e9, 5e-6, "tree", "h").tree_terms(S)[0] == pytest.approx(44e-6)


def test_allreduce_by_hand():
    # ring: 86 us + max(15.5 ms over NVLink, 19.375 ms over the NICs) = 19.461 ms
    assert NET.allreduce_by(S, "ring") == pytest.approx(86e-6 + 2 * 31 / 32 * 10e-3)
    # tree: 34 us + max(14 ms, 20 ms) = 20.034 ms: the ring (2(N-1)/N = 1.9375 < 2) wins for large messages
    assert NET.allreduce_by(S, "tree") == pytest.approx(34e-6 + 20e-3)
    assert NET.algorithm_for(S) == "ring" and NET.allreduce_s(S) == pytest.approx(86e-6 + 19.375e-3)
    # 8 kB: ring 86 us + max(0.155, 0.19375) us; tree 34 us + max(0.14, 0.2) us = 34.2 us: the tree's fewer hops win
    assert NET.allreduce_by(8e3, "ring") == pytest.approx(86e-6 + 2 * 31 / 32 * 1e3 / 10e9)
    assert NET.allreduce_s(8e3) == pytest.approx(34.2e-6) and NET.algorithm_for(8e3) == "tree"
    # a fixed algorithm is kept whatever the size
    assert HierarchicalNetwork(8, 4, 100e9, 1e-6, 10e9, 5e-6, "ring", "h").algorithm_for(8e3) == "ring"


def test_ring_bus_bandwidth_across_nodes_is_the_slower_of_nvlink_and_the_node_nics():
    # n = 2, g = 8 (N = 16), alpha -> 0, a large S: NCCL's ring all-reduce reaches a bus bandwidth
    # 2(N-1)/N S / t = min(B_i, g B_e), as nccl-tests shows (multi-node busbw ~ the node's NIC
    # aggregate). NIC-bound (B_i = 1000 GB/s, 8 x 25 GB/s): 200 GB/s, not the 2(N-1)/N / (2(n-1)/n)
    # x g B_e = 1.875 x 200 = 375 GB/s that an inter-node term in (n-1)/n gives
    big = 1e12
    for b_i, b_e in ((1000e9, 25e9), (300e9, 25e9), (300e9, 50e9)):  # NIC-bound twice, NVLink-bound once
        two_nodes = HierarchicalNetwork(8, 2, b_i, 0.0, b_e, 0.0, "ring", "h")
        assert 2 * 15 / 16 * big / two_nodes.allreduce_s(big) == pytest.approx(min(b_i, 8 * b_e))
        # one pass for the reduce-scatter and the all-gather: (N-1)/N S / t, the same bus bandwidth
        assert 15 / 16 * big / two_nodes.reduce_scatter_s(big) == pytest.approx(min(b_i, 8 * b_e))


def test_latency_per_hop():
    # zero bytes leave only the hops, every step of the ring (NCCL's tuner: nsteps, nInterSteps):
    # ring 2(N-n) alpha_i + 2(n-1) alpha_e = 56 + 30 us, reduce-scatter (N-n) alpha_i + (n-1) alpha_e
    # = 28 + 15 us (the defect, one node's hops counted once: 14 + 30 and 7 + 15)
    assert NET.allreduce_by(0, "ring") == pytest.approx(86e-6)
    assert NET.reduce_scatter_s(0) == pytest.approx(43e-6) and NET.all_gather_s(0) == pytest.approx(43e-6)


def test_fsdp_reduce_scatter_and_all_gather_by_hand():
    # 43 us + max((N-1)/N S / B_i = 31/32 x 8 ms = 7.75 ms, (N-1)/N (S/g) / B_e = 31/32 x 10 ms = 9.6875 ms) = 9.7305 ms
    assert NET.reduce_scatter_s(S) == pytest.approx(43e-6 + 31 / 32 * 10e-3)
    assert NET.all_gather_s(S) == NET.reduce_scatter_s(S)


def test_one_node_is_the_flat_ring():
    node = HierarchicalNetwork(8, 1, 100e9, 1e-6, 10e9, 5e-6, "auto", "h")
    assert node.allreduce_s(S) == pytest.approx(RingNetwork(8, 1e-6, 100e9, "ring").allreduce_s(S))
    # 2(g-1) alpha + 2(g-1)/g S / B = 14 us + 14 ms, and the tree is the same on one node
    assert node.allreduce_s(S) == pytest.approx(14e-6 + 14e-3) and node.allreduce_by(S, "tree") == pytest.approx(14e-6 + 14e-3)
    assert node.algorithm_for(S) == "ring" and node.reduce_scatter_s(S) == pytest.approx(7e-6 + 7e-3)
    assert HierarchicalNetwork(1, 1, 1.0, 1.0, 1.0, 1.0, "auto", "h").allreduce_s(S) == 0.0


def test_fsdp_step_by_hand():
    # L = 4 units; per unit gathered S / 4 = 200 MB and reduce-scattered 2 S / 4 = 400 MB: P_g = S, P_r = 2 S
    profile = FsdpProfile(step_s=0.4, forward_s=0.1, backward_s=0.2, optimizer_s=0.08, micro_batches=1, units=4, gather_bytes=S, reduce_bytes=2 * S)
    # ag = all-gather(S / 4) = 43 us + max(7.75 ms / 4, 9.6875 ms / 4) = 43 us + 2.421875 ms;
    # rs = reduce-scatter(S / 2) = 43 us + 9.6875 ms / 2 = 43 us + 4.84375 ms
    ag, rs = 43e-6 + 31 / 32 * 10e-3 / 4, 43e-6 + 31 / 32 * 10e-3 / 2
    forward = max(ag + 0.1, 4 * ag)  # 102.465 ms: the first gather is exposed
    backward = max(0.2 + rs, 4 * (ag + rs))  # 204.887 ms: the last reduce-scatter is exposed
    other = 0.4 - 0.38
    expected = other + forward + backward + 0.08 / 32  # the optimizer updates a 1/32 shard
    prediction = simulate_fsdp_step(profile, NET)
    assert prediction.step_s == pytest.approx(expected)
    assert prediction.exposed_comm_s == pytest.approx(forward + backward - 0.3)
    assert prediction.allreduce_s == pytest.approx(4 * (2 * ag + rs))
    # communication-bound: 100x slower NICs, the transfers end to end set the phases
    slow = HierarchicalNetwork(8, 4, 100e9, 1e-6, 0.1e9, 5e-6, "auto", "slow")
    ag_slow, rs_slow = slow.all_gather_s(S / 4), slow.reduce_scatter_s(S / 2)
    assert simulate_fsdp_step(profile, slow).step_s == pytest.approx(other + 4 * ag_slow + 4 * (ag_slow + rs_slow) + 0.08 / 32)
    # one GPU: nothing to gather, the measured step back
    assert simulate_fsdp_step(profile, HierarchicalNetwork(1, 1, 1.0, 0.0, 1.0, 0.0, "auto", "one")).step_s == pytest.approx(0.4)


def test_the_compute_is_fitted_to_a_published_step():
    # one bucket of 8e8 bytes ready at the end of a backward: fully exposed, 86 us + 19.375 ms on NET
    profile = StepProfile(1.0, 0.25, 0.5, 0.01, 1, (int(S),), (0.5,))

    def step(p):
        return simulate_step(p, NET).step_s

    fitted = fit_compute_to_step(profile, 0.5, step)
    # 0.5 = s (0.25 + 0.5) + 0.01 + 19.461 ms -> s = (0.5 - 0.01 - 0.019461) / 0.75
    assert fitted.forward_s + fitted.backward_s == pytest.approx(0.5 - 0.01 - (86e-6 + 19.375e-3), rel=1e-7)
    assert fitted.bucket_ready_s[0] == pytest.approx(fitted.backward_s) and fitted.other_s == 0
    with pytest.raises(ValueError, match="shorter than the model's optimizer"):
        fit_compute_to_step(profile, 0.02, step)


def test_the_presets_state_their_links_and_sources():
    presets = read_clusters(REFERENCES)
    h100, a100 = presets["dgx_h100"], presets["dgx_a100"]
    assert (h100.gpus_per_node, h100.intra.bandwidth_bytes_per_s, h100.inter.bandwidth_bytes_per_s) == (8, 450e9, 50e9)
    assert (a100.intra.bandwidth_bytes_per_s, a100.inter.bandwidth_bytes_per_s) == (300e9, 25e9)
    assert "ConnectX-7" in h100.source and "ConnectX-6" in a100.inter.source and "datasheet" in a100.intra.source
    network = h100.network(64)
    assert (network.gpus_per_node, network.nodes) == (8, 8)
    assert network.inter_bytes_per_s == pytest.approx(50e9 * 0.85) and network.intra_hop_s == pytest.approx(3.4e-6)
    assert h100.network(4).nodes == 1 and h100.network(4).gpus_per_node == 4
    with pytest.raises(ValueError, match="do not fill whole nodes of 8"):
        h100.network(12)
    custom = h100.with_overrides(gpus_per_node=4, nic_gbps=100)
    assert custom.network(8).nodes == 2 and custom.inter.bandwidth_bytes_per_s == 100e9 and "NIC 100 GB/s" in custom.name
    error = read_prediction_error(REFERENCES)
    assert error is not None and 0 < error.typical <= error.largest and "predict_published.py" in error.command


# ---- the report's table on a preset ----------------------------------------------------------


def _one_gpu_record(tmp_path, run_id: str = "weak_resnet50_g1_r1"):
    """A one-GPU record: the overlap fixture's step (tests/test_scaling_model.py), 18 ms, batch 32;
    ``run_id`` the matrix's (the analysis refuses another run's record)."""
    record = make_record(run_id, per_gpu_batch=32, samples_per_s=32 / 18e-3)
    record["measurements"]["backward_buckets"] = {
        "steps": 5,
        "reason": None,
        "gradient_bytes": 8_000_000,
        "micro_batches_per_step": 1,
        "forward_s": 6e-3,
        "backward_s": 10e-3,
        "optimizer_s": 1e-3,
        "buckets": [{"bytes": b, "parameters": 1, "ready_s": r} for b, r in zip((4_000_000, 1_000_000, 3_000_000), (2e-3, 5e-3, 9e-3))],
    }
    return validate(record)


def test_the_table_predicts_beyond_the_study_on_a_cluster_with_its_typical_error(tmp_path):
    s = Study(tmp_path)
    s.add("weak", 1, 1, per_gpu_batch=32, record=_one_gpu_record(tmp_path))
    tables = aggregate.aggregate(s.write_matrix(), [], REFERENCES, {}, predict_gpus=[8, 64], predict_cluster="dgx_h100")
    table = tables["scaling_model"].set_index("gpus")
    row = table.loc[64]
    assert row["basis"] == "predicted" and row["cluster"] == "dgx_h100" and row["nodes"] == 8
    # the error bar of its own regime (weak: the batch held; 8 nodes), back-tested on published runs
    regime = prediction_error.Regime("ddp", "2-8 nodes", "held", "as given")
    assert row["regime"] == regime.key
    assert row["typical_error"] == pytest.approx(error_table_of(load_references(REFERENCES)).for_regime(regime).median)
    assert (
        "NVIDIA DGX H100" in row["network"]
        and "typical error in its regime" in row["cluster_note"]
        and "on NVIDIA DGX H100" in row["cluster_note"]
        and "DLE BERT-large" in row["error_basis"]
    )
    network = read_clusters(REFERENCES)["dgx_h100"].network(64)
    profile = StepProfile(18e-3, 6e-3, 10e-3, 1e-3, 1, (4_000_000, 1_000_000, 3_000_000), (2e-3, 5e-3, 9e-3))
    assert row["step_time_predicted_s"] == pytest.approx(simulate_step(profile, network).step_s)
    assert pd.isna(table.loc[1, "cluster"])  # the measured count keeps its own network
    with pytest.raises(ValueError, match="unknown cluster preset 'dgx_z'"):
        aggregate.aggregate(s.write_matrix(), [], REFERENCES, {}, predict_gpus=[8], predict_cluster="dgx_z")


# ---- the command ------------------------------------------------------------------------------


def test_predict_command_on_a_record(tmp_path, capsys):
    path = tmp_path / "g1.json"
    path.write_text(json.dumps(_one_gpu_record(tmp_path)))
    assert (
        predict.main(["--record", str(path), "--cluster", "dgx_h100", "--nodes", "1", "2", "--csv", str(tmp_path / "p.csv"), "--references", str(REFERENCES)])
        == 0
    )
    out = capsys.readouterr().out
    assert "NVIDIA DGX H100" in out and "typical error" in out and "ConnectX-7" in out
    table = pd.read_csv(tmp_path / "p.csv").set_index("gpus")
    assert list(table.index) == [1, 8, 16] and list(table["nodes"]) == [1, 1, 2]
    assert table.loc[1, "step_time_s"] == pytest.approx(18e-3) and table.loc[1, "efficiency"] == pytest.approx(1.0)
    profile = StepProfile(18e-3, 6e-3, 10e-3, 1e-3, 1, (4_000_000, 1_000_000, 3_000_000), (2e-3, 5e-3, 9e-3))
    expected = simulate_step(profile, read_clusters(REFERENCES)["dgx_h100"].network(16)).step_s
    assert table.loc[16, "step_time_s"] == pytest.approx(expected)
    assert table.loc[16, "samples_per_s"] == pytest.approx(16 * 32 / expected) and table.loc[16, "efficiency"] == pytest.approx(18e-3 / expected)
    assert "50 GB/s x 0.85" in table.loc[16, "assumptions"]
    # strong scaling of G = 64 on a 4-GPU-per-node variant with 100 GB/s NICs: 16 per GPU at 4 GPUs
    assert (
        predict.main(
            [
                "--record",
                str(path),
                "--global-batch",
                "64",
                "--gpus-per-node",
                "4",
                "--nic-gbps",
                "100",
                "--gpus",
                "4",
                "8",
                "--csv",
                str(tmp_path / "s.csv"),
                "--references",
                str(REFERENCES),
            ]
        )
        == 0
    )
    strong = pd.read_csv(tmp_path / "s.csv").set_index("gpus")
    assert strong.loc[4, "per_gpu_batch"] == 16 and strong.loc[8, "nodes"] == 2 and "100 GB/s x 0.85" in strong.loc[8, "assumptions"]
    assert strong.loc[8, "efficiency"] == pytest.approx(18e-3 / (8 * strong.loc[8, "step_time_s"]))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cluster", "dgx_z"], "unknown cluster preset 'dgx_z': choose one of dgx_a100, dgx_h100"),
        (["--nic-gbps", "-5"], "argument --nic-gbps: -5 is outside [0.001, 1000000.0]"),
        (["--nic-gbps", "nan"], "argument --nic-gbps: nan is outside"),
        (["--nodes", "0"], "argument --nodes: 0 is outside [1, 1048576]"),
        (["--csv", "."], "argument --csv: . is a directory: name a file"),
    ],
)
def test_predict_command_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    path = tmp_path / "g1.json"
    path.write_text(json.dumps(_one_gpu_record(tmp_path)))
    try:
        code = predict.main(["--record", str(path), "--references", str(REFERENCES), *argv])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_predict_command_refuses_a_record_without_buckets(tmp_path, capsys):
    path = tmp_path / "old.json"
    record = make_record("strong_resnet50_g1_r1", per_gpu_batch=32)
    del record["measurements"]["backward_buckets"]  # a record from before the scaling model
    path.write_text(json.dumps(record))
    assert predict.main(["--record", str(path), "--references", str(REFERENCES)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalerepro.analysis.predict: error: ") and "backward_buckets" in err and "\n" not in err
    assert predict.main(["--study", str(tmp_path), "--references", str(REFERENCES)]) == 2
    assert "no runs.csv" in capsys.readouterr().err


def test_each_prediction_carries_its_own_regimes_back_tested_error_or_none(tmp_path):
    """A weak prediction keeps the micro-batch: at 8 GPUs (one node) none (its communication share is
    far above the Lambda rows' of its regime), at 16
    (2 nodes) the 8-node rows' +-1.1 %, at 256 (32 nodes) the 9+ node rows' +-1.6 %. A strong one from
    G = 256 at 32 a GPU keeps 32 at 8 GPUs (no error bar either), but 16 GPUs take 16 a GPU with compute proportional to the
    micro-batch (no batch curve): an upper bound, in a regime no back-test covered, so no error."""
    errors = error_table_of(load_references(REFERENCES))
    cluster = read_clusters(REFERENCES)["dgx_h100"]
    profile = StepProfile(18e-3, 6e-3, 10e-3, 1e-3, 1, (4_000_000, 1_000_000, 3_000_000), (2e-3, 5e-3, 9e-3))
    weak = predict.predict(predict.OneGpuInput("weak", "resnet50", profile, 32, None), cluster, [1, 8, 16, 256], "auto", errors)
    weak = weak.set_index("gpus")
    # at 8 GPUs 1.1 % of the step is all-reduce, the Lambda rows' 0.10-0.15 %: not comparable, no error bar
    assert pd.isna(weak.loc[8, "typical_error"]) and weak.loc[8, "error_basis"].startswith(prediction_error.NO_ERROR_BAR)
    assert weak.loc[[16, 256], "typical_error"].tolist() == pytest.approx([0.011, 0.016])
    assert weak.loc[256, "regime"] == "ddp, 9+ nodes, batch held, compute as given" and "DLE BERT-large" in weak.loc[256, "error_basis"]
    assert pd.isna(weak.loc[1, "regime"]) and weak["bound"].isna().all()
    strong = predict.predict(predict.OneGpuInput("strong", "resnet50", profile, 32, 256), cluster, [8, 16], "auto", errors).set_index("gpus")
    # 32 a GPU at 8 GPUs, as at one: the batch is held, but its all-reduce share is the weak 8's, far above Lambda's
    assert pd.isna(strong.loc[8, "typical_error"]) and strong.loc[8, "error_basis"].startswith(prediction_error.NO_ERROR_BAR)
    assert pd.isna(strong.loc[8, "bound"])
    assert pd.isna(strong.loc[16, "typical_error"]) and strong.loc[16, "error_basis"] == prediction_error.NO_BACK_TEST
    assert strong.loc[16, "bound"].startswith("upper bound") and strong.loc[16, "regime"].endswith("batch changed, no curve, compute proportional")
    text = predict.render(strong.reset_index(), cluster, errors)
    assert "(upper bound)" in text and "no back-test of this regime (no ± printed): ddp, 2-8 nodes, batch changed, no curve" in text
