"""The network model's terms at scale, each against hand-computed values: the fabric's tiers (a ring
or a tree that crosses the spine), NCCL's own cost model's refinements (its base latency, the ring's
plateau, the tree's bandwidth and where the two switch), the presets' topology as references.yaml
states it; and the back-tested error bars by regime (``prediction_error``)."""

from __future__ import annotations

import pytest

from scalerepro.analysis.tables import prediction_error
from scalerepro.analysis.tables.network_model import HierarchicalNetwork, read_clusters
from scalerepro.analysis.tables.prediction_error import Regime
from scalerepro.common.references import load_references

from analysis_fixtures import REPO

REFERENCES = REPO / "config" / "references.yaml"
S = 8e8  # bytes
# g = 8 GPUs per node, n = 4 nodes; NVLink B_i = 100 GB/s, alpha_i = 1 us; NIC B_e = 10 GB/s,
# alpha_e = 5 us (round numbers, as in tests/test_predict.py)
HAND = (8, 4, 100e9, 1e-6, 10e9, 5e-6)


# ---- tiers: leaves and spine ------------------------------------------------------------------


def test_a_ring_beyond_one_leaf_crosses_the_spine_at_its_up_links_bandwidth():
    # 2 nodes a leaf, spine 2:1, +3 us a spine hop: 4 nodes are ceil(4/2) = 2 leaves. A pass of the
    # ring: (N-n) alpha_i + (n-1) alpha_e + (2 - 1) alpha_s = 28 + 15 + 3 = 46 us; NVLink
    # 31/32 x 8 ms = 7.75 ms; each NIC at B_e / 2 = 5 GB/s: 31/32 x (S/8) / 5 GB/s = 31/32 x 20 ms = 19.375 ms
    spine = HierarchicalNetwork(*HAND, "ring", "hand", nodes_per_leaf=2, spine_oversubscription=2.0, spine_hop_s=3e-6)
    assert spine.leaves == 2 and spine.ring_terms(S, 1) == pytest.approx((46e-6, 7.75e-3, 19.375e-3))
    # within one leaf (4 nodes a leaf) nothing changes: 43 us, 7.75 ms, 9.6875 ms (the one-tier network's)
    leaf = HierarchicalNetwork(*HAND, "ring", "hand", nodes_per_leaf=4, spine_oversubscription=2.0, spine_hop_s=3e-6)
    assert leaf.ring_terms(S, 1) == pytest.approx(HierarchicalNetwork(*HAND, "ring", "hand").ring_terms(S, 1))
    assert leaf.ring_terms(S, 1) == pytest.approx((43e-6, 7.75e-3, 31 / 32 * 10e-3))
    # 9 nodes in leaves of 2: 5 leaves, 4 spine hops a pass (72 GPUs: 63 x 1 + 8 x 5 + 4 x 3 = 115 us)
    nine = HierarchicalNetwork(8, 9, 100e9, 1e-6, 10e9, 5e-6, "ring", "hand", nodes_per_leaf=2, spine_oversubscription=1.0, spine_hop_s=3e-6)
    assert nine.leaves == 5 and nine.ring_terms(0.0, 1)[0] == pytest.approx(115e-6)


def test_a_tree_beyond_one_leaf_crosses_the_spine_at_its_top_levels():
    # 4 nodes, 2 a leaf: ceil(log2 2) = 1 level joins leaves, up and down: 2(g-1) alpha_i +
    # 2 ceil(log2 4) alpha_e + 2 x 1 x alpha_s = 14 + 20 + 6 = 40 us; NIC 2 (S/g) / (B_e / 2) = 2 x 100 MB / 5 GB/s = 40 ms
    spine = HierarchicalNetwork(*HAND, "tree", "hand", nodes_per_leaf=2, spine_oversubscription=2.0, spine_hop_s=3e-6)
    assert spine.tree_terms(S) == pytest.approx((40e-6, 14e-3, 40e-3))
    # 9 nodes in 5 leaves: ceil(log2 5) = 3 levels cross the spine: 14 + 2 x 4 x 5 + 2 x 3 x 3 = 72 us
    nine = HierarchicalNetwork(8, 9, 100e9, 1e-6, 10e9, 5e-6, "tree", "hand", nodes_per_leaf=2, spine_oversubscription=1.0, spine_hop_s=3e-6)
    assert nine.tree_terms(0.0)[0] == pytest.approx(72e-6)


def test_the_presets_state_their_fabric_only_as_a_source_does():
    presets = read_clusters(REFERENCES)
    h100, a100 = presets["dgx_h100"], presets["dgx_a100"]
    # the DGX SuperPOD (H100) reference architecture: units of 32 nodes, one leaf per rail, non-blocking
    assert (h100.topology.nodes_per_leaf, h100.topology.spine_oversubscription) == (32, 1.0)
    assert h100.topology.spine_hop_latency_s is None and "RA-11333-001" in h100.topology.source
    assert "spine hop latency not stated (0 assumed)" in h100.describe()
    # 512 GPUs are 64 nodes in 2 leaves: the spine is crossed, at 1:1 the NICs keep B_e = 50 x 0.85 GB/s
    network = h100.network(512)
    assert network.leaves == 2 and network.nic_bytes_per_s == pytest.approx(42.5e9) and network.spine_hop_s == 0.0
    assert h100.network(512, tiers=False).leaves == 1
    # nothing read states the DGX A100 clusters' fabric: one tier, and the preset says so
    assert a100.topology.nodes_per_leaf is None and a100.topology.source.startswith("not stated")
    assert a100.network(256).leaves == 1


# ---- NCCL's tuner -----------------------------------------------------------------------------


def test_nccl_tuner_adds_its_base_latency_and_the_ring_plateau():
    tuned = HierarchicalNetwork(*HAND, "ring", "hand", nccl_tuner=True)
    # reduce-scatter: t_0 + (N-n) alpha_i + (n-1) alpha_e + NIC = 8.4 + 43 us + 9.6875 ms
    assert tuned.reduce_scatter_s(S) == pytest.approx(51.4e-6 + 31 / 32 * 10e-3)
    # a ring all-reduce across nodes of S >= 64 x 64 x 32 bytes: 1.4 (8.4 + 86 us) = 132.16 us + 19.375 ms
    assert tuned.allreduce_by(S, "ring") == pytest.approx(1.4 * 94.4e-6 + 19.375e-3)
    # 8 kB is below the plateau's 131 kB: 94.4 us + max(0.155, 0.19375) us
    assert tuned.allreduce_by(8e3, "ring") == pytest.approx(94.4e-6 + 0.19375e-6)
    # one node: no plateau, the base latency alone is added (t_0 + 2(g-1) alpha_i + 2(g-1)/g S / B_i)
    node = HierarchicalNetwork(8, 1, 100e9, 1e-6, 10e9, 5e-6, "ring", "hand", nccl_tuner=True)
    assert node.allreduce_s(S) == pytest.approx(8.4e-6 + 14e-6 + 14e-3)


def test_nccl_tuner_moves_the_switch_from_tree_to_ring_to_smaller_messages():
    # the tree's bandwidth: x 0.92 x 0.85 across nodes, x c(S): 8 kB is log2(8000 / 64) -> 6, c = 0.9:
    # 8.4 + 34 us + 0.2 us / (0.782 x 0.9) = 42.4 + 0.28417 us
    tuned = HierarchicalNetwork(*HAND, "auto", "hand", nccl_tuner=True)
    assert tuned.tree_bandwidth_factor(8e3) == pytest.approx(0.92 * 0.85 * 0.9)
    assert tuned.allreduce_by(8e3, "tree") == pytest.approx(42.4e-6 + 0.2e-6 / (0.782 * 0.9))
    # 800 MB: log2(8e8 / 64) = 23.6 -> 23, past the table: c = 1; 42.4 us + 20 ms / 0.782
    assert tuned.allreduce_by(S, "tree") == pytest.approx(42.4e-6 + 20e-3 / 0.782)
    # where they switch. Without the tuner: 86 us + S x 2.421875e-11 = 34 us + S x 2.5e-11 at
    # S = 52 us / 7.8125e-13 = 66.56 MB. With it, near 3 MB (log2(3e6 / 64) = 15.5 -> c = 0.6):
    # 132.16 us + S x 2.421875e-11 = 42.4 us + S x 2.5e-11 / (0.782 x 0.6) at S = 89.76 us / 2.9064e-11 = 3.088 MB
    plain = HierarchicalNetwork(*HAND, "auto", "hand")
    assert plain.algorithm_for(60e6) == "tree" and plain.algorithm_for(70e6) == "ring"
    assert tuned.algorithm_for(3.0e6) == "tree" and tuned.algorithm_for(3.2e6) == "ring"
    assert plain.algorithm_for(3.2e6) == "tree"  # the defect the tuner corrects: the tree chosen up to 66 MB


# ---- the back-tested error bars, by regime ----------------------------------------------------


def test_a_regime_places_the_batch_against_the_curves_knee():
    # the kept H100 curve of ResNet-50, t(m) = 4.72 ms + 0.202 ms x m: knee 9 x 4.72 / 0.202 = 210.3 images
    assert prediction_error.knee(4.72e-3, 0.202e-3) == pytest.approx(210.297, rel=1e-4)
    assert prediction_error.regime_of("ddp", 8, 50, 400, 210.3) == Regime("ddp", "2-8 nodes", "below the knee", "batch curve")
    assert prediction_error.regime_of("ddp", 8, 256, 400, 210.3).batch == "above the knee"
    assert prediction_error.regime_of("fsdp", 16, 12, 12, None) == Regime("fsdp", "9+ nodes", "held", "as given")
    assert prediction_error.regime_of("fsdp", 2, 20, 14, None) == Regime("fsdp", "2-8 nodes", "changed, no curve", "proportional")
    assert [prediction_error.node_regime(n) for n in (1, 2, 8, 9)] == ["one node", "2-8 nodes", "2-8 nodes", "9+ nodes"]
    with pytest.raises(ValueError, match="strategy 'tp' is none of"):
        prediction_error.regime_of("tp", 1, 1, 1, None)


def test_a_regimes_error_is_its_own_rows_and_an_uncovered_regime_prints_none():
    one, other = Regime("ddp", "one node", "held", "as given"), Regime("fsdp", "9+ nodes", "held", "as given")
    # |e| 0.02 and 0.04: median 0.03, largest 0.04; the other regime's row does not enter it
    rows = [(one, "a 4", 0.02, 0.01, 1), (one, "a 8", -0.04, 0.03, 1), (other, "b 128", 0.10, 0.2, 1)]
    first, second = prediction_error.back_tested(prediction_error.BackTestedRow(*row) for row in rows)
    assert (first.regime, first.median, first.largest, first.rows) == (one, pytest.approx(0.03), pytest.approx(0.04), ("a 4", "a 8"))
    assert first.comm_share == (0.01, 0.03) and first.micro_batches == (1, 1)
    assert second.median == pytest.approx(0.10)
    table = prediction_error.ErrorTable({first.regime.key: first}, "bench", prediction_error.Comparable(2.0, "why"))
    columns = prediction_error.error_columns(one, table, 0.05, 1)
    assert columns["typical_error"] == pytest.approx(0.03) and "2 held-back rows (a 4, a 8)" in columns["error_basis"]
    # fsdp at 9+ nodes is not in this table: no error, never the ddp one's
    assert prediction_error.error_columns(other, table, 0.05, 1) == {"regime": other.key, "typical_error": None, "error_basis": prediction_error.NO_BACK_TEST}
    assert prediction_error.error_columns(one, None, 0.05, 1)["typical_error"] is None


def test_references_hold_the_back_test_by_regime_and_its_rows():
    table = prediction_error.error_table_of(load_references(REFERENCES))
    assert table is not None and "predict_published.py" in table.command
    mlperf = table.for_regime(Regime("ddp", "2-8 nodes", "below the knee", "batch curve"))
    assert mlperf.rows == ("MLPerf v3.0 RN50 DGX H100 64",) and mlperf.median == mlperf.largest
    for entry in table.regimes.values():
        assert 0 <= entry.median <= entry.largest <= 0.10 and entry.rows
    # the 3D series has no prediction, so no regime of it is back-tested
    assert not any(entry.regime.strategy == "3d" for entry in table.regimes.values())
