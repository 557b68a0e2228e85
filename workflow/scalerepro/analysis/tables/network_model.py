"""The hierarchical network model: how NCCL all-reduces (and, under FSDP, reduce-scatters and
all-gathers) across the nodes of a cluster, to first order, from the cluster's link rates; and
the named cluster shapes (``clusters`` in config/references.yaml) it is evaluated on.

Cluster: N = g x n GPUs, g per node (the job's GPUs per node, at most the node's), n nodes.
Within a node every GPU reaches the others over NVLink through NVSwitch, at B_i bytes/s per GPU
each way; across nodes each GPU has its own NIC (a rail-optimised fabric: local rank j of every
node sits on rail j), at B_e bytes/s each way. B = the link's line rate x its efficiency (the
share of the line rate a collective reaches as bus bandwidth, ``links`` in references.yaml), and
alpha_i, alpha_e the latency of one hop over NVLink and over the network.

Ring. NCCL's ring all-reduce, reduce-scatter and all-gather are one flat ring through all N ranks
(not a reduce-scatter within the node, an all-reduce across nodes and an all-gather): it runs g
rings at once (one channel per rail), ring r carrying S / g of the S bytes and leaving each node
over rail r's NIC. In a ring of N ranks every chunk travels the whole ring, the node's other
GPUs' chunks included, so each edge of ring r carries (N-1)/N of its S / g per pass (one pass
for a reduce-scatter or an all-gather, two for an all-reduce): per GPU-NIC (N-1)/N * (S/g) bytes
a pass, and over NVLink, counting every ring's edge as NVLink, (N-1)/N * S. The streamed chunks
make the slower link set the pace, so the ring's bus bandwidth (N-1)/N * S / t per pass is
min(B_i, g B_e), as NCCL's own tuning model has it (src/graph/tuning.cc: the ring's bus bandwidth
is its slowest link's, the node's NICs together across nodes; time = S * 2(N-1)/N / busBw for an
all-reduce, S * (N-1)/N / busBw for a reduce-scatter or an all-gather) and as nccl-tests shows
(multi-node ring busbw about the node's NIC aggregate, ~190-230 GB/s on DGX A100's 8 x 200 Gb/s).
The NVLink term takes the flat ring's 2(N-1)/N * S / B_i rather than the one-node ring's
2(g-1)/g * S / B_i, for consistency with that bus bandwidth (strictly, in one of the g rings a
GPU's outgoing edge is its NIC, not NVLink, so the NVLink traffic across nodes is (g-1)/g of it;
the term only binds where NVLink, not the NICs, is the slower link, which is not so on the
presets). The latency grows with the ring, as NCCL's tuner counts it (src/graph/tuning.cc): a
pass of the ring is N-1 steps, each a hop's latency; n-1 of them cross the network (nInterSteps)
at alpha_e, the other N-n stay on NVLink at alpha_i. An all-reduce makes two passes, 2(N-1)
steps; a reduce-scatter or an all-gather one. At 64 GPUs in 8 nodes that is 112 NVLink hops and
14 network hops for one all-reduce, where a sum over the hierarchy (one node's NVLink hops, then
the nodes') would count 14 and 14; NCCL has only the ring for a reduce-scatter and an
all-gather, so there no tree shortens it.

    ring all-reduce(S)     = 2(N-n) alpha_i + 2(n-1) alpha_e
                             + max(2(N-1)/N * S / B_i, 2(N-1)/N * (S/g) / B_e)
    reduce-scatter(S) = all-gather(S) = (N-n) alpha_i + (n-1) alpha_e
                             + max((N-1)/N * S / B_i, (N-1)/N * (S/g) / B_e)
        (S: the whole, unsharded buffer; NCCL has only the ring for these two)

Tree (all-reduce only). NCCL's tree is a chain within the node and a double binary tree across
nodes, one per rail: every rank sends and receives its rail's share S / g once up the tree,
reducing, and once down, broadcasting, over log2 n hops each way; within the node the chain's
transfer is counted as the one-node ring's reduce-scatter and all-gather:

    tree all-reduce(S)     = 2(g-1) alpha_i + 2 ceil(log2 n) alpha_e
                             + max(2(g-1)/g * S / B_i, 2 (S/g) / B_e)

On one node (n = 1, N = g) there is no NIC term and no inter-node hop: every collective is the
flat ring of ``step_model.RingNetwork``, all-reduce 2(g-1) alpha_i + 2(g-1)/g * S / B_i.

"auto" takes, per message size, the faster of ring and tree, as NCCL's tuner does from its own
cost model: the tree's log2 n hops win for small messages across many nodes, the ring's
2(N-1)/N < 2 for large ones. A reduce-scatter or an all-gather is always the ring: NCCL's tuner
offers them no tree (src/graph/tuning.cc skips every algorithm but ring, PAT, NVLS and CollNet for
them; PAT only at one GPU per node, ncclPatEnable; NVLS and CollNet are not modelled).

NCCL's tuner (``nccl_tuner``; on for the presets, ``ClusterPreset.network``). The switch point
between ring and tree is where NCCL's own cost model says it is, from src/graph/tuning.cc (NVIDIA/nccl
at 5067397c, the Simple protocol, the one large buckets use): every collective pays a base latency
once (baseLat, 8.4 us for ring and tree); the tree's bus bandwidth is 0.92 of the link's for an
all-reduce and 0.85 of that again across nodes (its tree pattern), and is corrected by message size
(treeCorrectionFactor, 0.5-0.9 between 64 B and 256 MB, in ncclTopoGetAlgoTime); a multi-node ring
all-reduce's latency is 1.4 times its sum on sm80 and later (its "plateau effect", once a channel's
share of the message reaches 64 bytes per rank). So, with c(S) the size correction,

    ring all-reduce(S)     = 1.4 (t_0 + 2(N-n) alpha_i + 2(n-1) alpha_e) + max(NVLink, NIC)   (n > 1)
    tree all-reduce(S)     = t_0 + 2(g-1) alpha_i + 2 ceil(log2 n) alpha_e + max(NVLink, NIC) / (0.92 x 0.85 x c(S))
    reduce-scatter(S)      = t_0 + (N-n) alpha_i + (n-1) alpha_e + max(NVLink, NIC)            (t_0 = 8.4 us)

Tiers (``Topology``, a preset's ``topology`` in references.yaml). A rail-optimised fabric joins
local rank j of L nodes on one leaf switch; a job on n > L nodes spans ceil(n / L) leaves, joined
through the spine. A ring visits the leaves in turn: of its n-1 network hops a pass, ceil(n / L) - 1
cross the spine, each adding alpha_s; its slowest link is then a leaf's up-link, whose bandwidth is
B_e / o for a spine oversubscribed o : 1 (down-links over up-links; 1 in a non-blocking fat tree).
The tree's top ceil(log2 ceil(n / L)) levels join leaves, each crossing the spine up and down:

    ring, n > L:  + (ceil(n/L) - 1) alpha_s a pass,  NIC term at B_e / o
    tree, n > L:  + 2 ceil(log2 ceil(n/L)) alpha_s,  NIC term at B_e / o

Where no source states a preset's tier (``nodes_per_leaf`` null), the network is one tier; where
one states the leaves but not alpha_s or o, those terms are 0 and 1, and the preset says so.

What it leaves out: NVLink SHARP (NVLS, the in-switch reduction of H100 NVSwitch) and SHARP in the
InfiniBand switches, which raise the bus bandwidth above the ring's (the model is conservative
where NCCL uses them); congestion from other jobs in the fabric; NCCL's protocol choice
(LL/LL128/Simple) beyond the Simple protocol's latencies.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from scalerepro.common.cli import CommandError
from scalerepro.common.gpu_peaks import PEAKS, peaks_key
from scalerepro.common.references import load_optional_references

Algorithm = Literal["ring", "tree", "auto"]
ALGORITHMS: tuple[Algorithm, ...] = ("auto", "ring", "tree")
# The share of a link's line rate an all-reduce reaches as bus bandwidth, where references.yaml
# gives none for the link (nccl-tests on 8x H100 SXM: about 390 of 450 GB/s each way, NVIDIA/nccl issue #1264).
DEFAULT_LINK_EFFICIENCY = 0.85
# NCCL's own cost model, src/graph/tuning.cc (NVIDIA/nccl at 5067397c), the Simple protocol:
# baseLat of ring and tree, once per collective
NCCL_BASE_LATENCY_S = 8.4e-6
# the tree all-reduce's bus bandwidth against the link's, and across nodes (its tree pattern) again
NCCL_TREE_ALLREDUCE_BANDWIDTH = 0.92
NCCL_TREE_PATTERN_BANDWIDTH = 0.85
# treeCorrectionFactor, Simple, by log2(bytes / 64): 64 B, 128 B, ... (applied below 2^23 x 64 B)
NCCL_TREE_SIZE_CORRECTION = (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9)
# a multi-node ring all-reduce's latency on sm80 and later ("plateau effect of ring", ncclTopoGetAlgoTime),
# once bytes / (channels x ranks) reaches 64; the channels taken as NCCL's most, MAXCHANNELS = 64
# (src/include/device.h), so that the factor applies only where it would for any channel count
NCCL_RING_PLATEAU = 1.4
NCCL_RING_PLATEAU_BYTES_PER_RANK = 64 * 64


class ClusterPresetError(CommandError, ValueError):
    """A cluster preset that references.yaml lacks or gets wrong; one line naming it and the fix."""


@dataclass(frozen=True)
class Link:
    """One kind of link from ``links`` in references.yaml."""

    key: str
    name: str
    bandwidth_bytes_per_s: float  # line rate, one direction
    efficiency: float  # the share of it an all-reduce reaches as bus bandwidth
    hop_latency_s: float
    source: str


def read_links(references_path: str | os.PathLike[str] | None) -> dict[str, Link]:
    """``links`` of references.yaml (GB/s and microseconds); none without the file."""
    return links_of(load_optional_references(references_path))


def links_of(references: Mapping[str, Any]) -> dict[str, Link]:
    """``links`` of a references document (scalerepro.common.references.load_references)."""
    return {
        key: Link(
            key,
            entry["name"],
            float(entry["bandwidth_gbps"]) * 1e9,
            float(entry.get("efficiency", DEFAULT_LINK_EFFICIENCY)),
            float(entry["hop_latency_us"]) * 1e-6,
            f"{entry['bandwidth_source']}; efficiency: "
            f"{entry.get('efficiency_source', f'the default {DEFAULT_LINK_EFFICIENCY} of line rate')}; latency: {entry['latency_source']}",
        )
        for key, entry in (references.get("links") or {}).items()
    }


@dataclass(frozen=True)
class Topology:
    """The fabric above the nodes (module docstring, tiers), as a source states it; None: not stated."""

    nodes_per_leaf: int | None = None  # L: the nodes one rail's leaf switch joins
    spine_oversubscription: float | None = None  # o: a leaf's down-links over its up-links (1: non-blocking)
    spine_hop_latency_s: float | None = None  # alpha_s: what a hop through the spine adds
    source: str = "not stated"

    def describe(self) -> str:
        if self.nodes_per_leaf is None:
            return "one tier (no leaf size stated)"
        over = "oversubscription not stated (1 assumed)" if self.spine_oversubscription is None else f"spine {self.spine_oversubscription:g}:1"
        hop = "spine hop latency not stated (0 assumed)" if self.spine_hop_latency_s is None else f"spine hop +{self.spine_hop_latency_s * 1e6:g} us"
        return f"{self.nodes_per_leaf} nodes a leaf, {over}, {hop}"


@dataclass(frozen=True)
class ClusterPreset:
    """A cluster shape: GPUs per node and the links of ``links`` in references.yaml it uses."""

    key: str
    name: str
    gpu: str  # the device name NVML/torch report for its GPU
    gpus_per_node: int
    intra: Link  # NVLink, per GPU
    inter: Link  # one NIC per GPU
    source: str
    topology: Topology = Topology()

    def with_overrides(self, gpus_per_node: int | None = None, nvlink_gbps: float | None = None, nic_gbps: float | None = None) -> ClusterPreset:
        """The preset with a user's own node size or line rates (GB/s per GPU each way; the
        link's efficiency and latency stay), saying so in its name."""
        changes = []
        preset = self
        if gpus_per_node is not None:
            preset = replace(preset, gpus_per_node=gpus_per_node)
            changes.append(f"{gpus_per_node} GPUs per node")
        if nvlink_gbps is not None:
            preset = replace(preset, intra=replace(preset.intra, bandwidth_bytes_per_s=nvlink_gbps * 1e9, source=f"given: {nvlink_gbps:g} GB/s"))
            changes.append(f"NVLink {nvlink_gbps:g} GB/s")
        if nic_gbps is not None:
            preset = replace(preset, inter=replace(preset.inter, bandwidth_bytes_per_s=nic_gbps * 1e9, source=f"given: {nic_gbps:g} GB/s"))
            changes.append(f"NIC {nic_gbps:g} GB/s")
        return replace(preset, name=f"{self.name} with {', '.join(changes)}") if changes else preset

    def network(self, gpus: int, algorithm: Algorithm = "auto", nccl_tuner: bool = True, tiers: bool = True) -> HierarchicalNetwork:
        """The network of a job on ``gpus`` GPUs: one partial node below a node's worth of GPUs,
        else whole nodes (a count that does not fill whole nodes is refused: the model has no
        uneven rails). ``nccl_tuner``, ``tiers``: NCCL's cost-model refinements and the fabric's
        tiers (module docstring), each on unless a comparison takes it out."""
        if gpus <= self.gpus_per_node:
            per_node, nodes = gpus, 1
        elif gpus % self.gpus_per_node:
            raise ValueError(f"{gpus} GPUs do not fill whole nodes of {self.gpus_per_node}")
        else:
            per_node, nodes = self.gpus_per_node, gpus // self.gpus_per_node
        tier = self.topology if tiers else Topology()
        return HierarchicalNetwork(
            gpus_per_node=per_node,
            nodes=nodes,
            intra_bytes_per_s=self.intra.bandwidth_bytes_per_s * self.intra.efficiency,
            intra_hop_s=self.intra.hop_latency_s,
            inter_bytes_per_s=self.inter.bandwidth_bytes_per_s * self.inter.efficiency,
            inter_hop_s=self.inter.hop_latency_s,
            algorithm=algorithm,
            source=self.describe(),
            nodes_per_leaf=tier.nodes_per_leaf,
            spine_oversubscription=tier.spine_oversubscription or 1.0,
            spine_hop_s=tier.spine_hop_latency_s or 0.0,
            nccl_tuner=nccl_tuner,
        )

    def describe(self) -> str:
        """The assumptions in one line: each link's B = line rate x efficiency and its latency."""

        def link(name: str, link: Link) -> str:
            rate = link.bandwidth_bytes_per_s / 1e9
            return (
                f"{name} {link.name}: {rate:g} GB/s x {link.efficiency:g} = {rate * link.efficiency:.4g} GB/s per GPU, "
                f"alpha {link.hop_latency_s * 1e6:g} us/hop"
            )

        return f"{self.name}, {self.gpus_per_node} GPUs/node; {link('intra', self.intra)}; {link('inter', self.inter)}; {self.topology.describe()}"


@dataclass(frozen=True)
class HierarchicalNetwork:
    """The collectives of the module docstring on g GPUs per node x n nodes."""

    gpus_per_node: int  # g
    nodes: int  # n
    intra_bytes_per_s: float  # B_i
    intra_hop_s: float  # alpha_i
    inter_bytes_per_s: float  # B_e, one NIC per GPU
    inter_hop_s: float  # alpha_e
    algorithm: Algorithm
    source: str
    nodes_per_leaf: int | None = None  # L: nodes a rail's leaf switch joins (None: one tier)
    spine_oversubscription: float = 1.0  # o: a leaf's down-links over its up-links
    spine_hop_s: float = 0.0  # alpha_s: what a hop through the spine adds
    nccl_tuner: bool = False  # NCCL's cost-model refinements (module docstring)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def leaves(self) -> int:
        """The leaf switches one rail of the job spans: ceil(n / L); 1 on one tier."""
        if self.nodes_per_leaf is None:
            return 1
        return -(-self.nodes // self.nodes_per_leaf)

    @property
    def nic_bytes_per_s(self) -> float:
        """The NIC term's bandwidth: B_e within one leaf, B_e / o once the ring crosses the spine."""
        return self.inter_bytes_per_s / (self.spine_oversubscription if self.leaves > 1 else 1.0)

    # --- the terms: (latency, NVLink transfer, NIC transfer) -----------------------------------

    def ring_terms(self, size_bytes: float, passes: int) -> tuple[float, float, float]:
        """The flat ring through all N GPUs, ``passes`` = 2 for an all-reduce, 1 for a
        reduce-scatter or an all-gather (module docstring), per pass:
        ((N-n) alpha_i + (n-1) alpha_e + (ceil(n/L) - 1) alpha_s, (N-1)/N * S / B_i,
        (N-1)/N * (S/g) / (B_e / o beyond one leaf)): N-1 steps, n-1 of them across the network,
        ceil(n/L) - 1 of those through the spine; on one node the NIC term is 0."""
        g, n, N = self.gpus_per_node, self.nodes, self.gpus
        latency = (N - n) * self.intra_hop_s + (n - 1) * self.inter_hop_s + (self.leaves - 1) * self.spine_hop_s
        nvlink = (N - 1) / N * size_bytes / self.intra_bytes_per_s
        nic = (N - 1) / N * (size_bytes / g) / self.nic_bytes_per_s if n > 1 else 0.0
        return passes * latency, passes * nvlink, passes * nic

    def tree_terms(self, size_bytes: float) -> tuple[float, float, float]:
        """The all-reduce's chain within the node and double binary tree across nodes:
        (2(g-1) alpha_i + 2 ceil(log2 n) alpha_e + 2 ceil(log2 ceil(n/L)) alpha_s, 2(g-1)/g * S / B_i,
        2 (S/g) / (B_e / o beyond one leaf)); on one node the NIC term is 0."""
        g, n = self.gpus_per_node, self.nodes
        spine_levels = math.ceil(math.log2(self.leaves))  # the top levels, which join leaves
        latency = 2 * (g - 1) * self.intra_hop_s + 2 * math.ceil(math.log2(n)) * self.inter_hop_s + 2 * spine_levels * self.spine_hop_s
        nvlink = 2 * (g - 1) / g * size_bytes / self.intra_bytes_per_s
        nic = 2 * (size_bytes / g) / self.nic_bytes_per_s if n > 1 else 0.0
        return latency, nvlink, nic

    # --- the collectives ----------------------------------------------------------------------

    def allreduce_by(self, size_bytes: float, algorithm: Literal["ring", "tree"]) -> float:
        """latency + max(NVLink transfer, NIC transfer), the transfers streamed (module docstring):
        ring 2(N-n) alpha_i + 2(n-1) alpha_e + max(2(N-1)/N * S / B_i, 2(N-1)/N * (S/g) / B_e),
        tree 2(g-1) alpha_i + 2 ceil(log2 n) alpha_e + max(2(g-1)/g * S / B_i, 2 (S/g) / B_e);
        with ``nccl_tuner`` NCCL's base latency t_0, its ring plateau and its tree's bandwidth
        factors (module docstring)."""
        if self.gpus == 1:
            return 0.0
        if algorithm == "ring":
            latency, nvlink, nic = self.ring_terms(size_bytes, 2)
            if not self.nccl_tuner:
                return latency + max(nvlink, nic)
            plateau = self.nodes > 1 and size_bytes >= NCCL_RING_PLATEAU_BYTES_PER_RANK * self.gpus
            # 1.4 (t_0 + hops) + transfer: NCCL scales the whole latency, base included
            return (NCCL_RING_PLATEAU if plateau else 1.0) * (NCCL_BASE_LATENCY_S + latency) + max(nvlink, nic)
        latency, nvlink, nic = self.tree_terms(size_bytes)
        if not self.nccl_tuner:
            return latency + max(nvlink, nic)
        return NCCL_BASE_LATENCY_S + latency + max(nvlink, nic) / self.tree_bandwidth_factor(size_bytes)

    def tree_bandwidth_factor(self, size_bytes: float) -> float:
        """NCCL's tree all-reduce bandwidth against the model's: 0.92, x 0.85 across nodes, x the
        size correction c(S) (module docstring); 1 on one node, where NCCL's tree is a chain."""
        if self.nodes == 1:
            return 1.0
        log_size = int(math.floor(math.log2(size_bytes / 64))) if size_bytes >= 64 else -1
        correction = NCCL_TREE_SIZE_CORRECTION[log_size] if 0 <= log_size < len(NCCL_TREE_SIZE_CORRECTION) else 1.0
        return NCCL_TREE_ALLREDUCE_BANDWIDTH * NCCL_TREE_PATTERN_BANDWIDTH * correction

    def algorithm_for(self, size_bytes: float) -> Literal["ring", "tree"]:
        """The algorithm this network uses for S bytes: the configured one, or under "auto" the
        faster (ties and one node: ring)."""
        if self.algorithm != "auto":
            return self.algorithm
        if self.nodes == 1:
            return "ring"
        return "tree" if self.allreduce_by(size_bytes, "tree") < self.allreduce_by(size_bytes, "ring") else "ring"

    def allreduce_s(self, size_bytes: float) -> float:
        return self.allreduce_by(size_bytes, self.algorithm_for(size_bytes))

    def reduce_scatter_s(self, size_bytes: float) -> float:
        """(N-n) alpha_i + (n-1) alpha_e + max((N-1)/N * S / B_i, (N-1)/N * (S/g) / B_e), the flat
        ring's one pass; S is the unsharded buffer, each GPU keeps S / N of it."""
        if self.gpus == 1:
            return 0.0
        latency, nvlink, nic = self.ring_terms(size_bytes, 1)
        return (NCCL_BASE_LATENCY_S if self.nccl_tuner else 0.0) + latency + max(nvlink, nic)

    def all_gather_s(self, size_bytes: float) -> float:
        """The reduce-scatter's mirror image, the same time (S: the gathered, unsharded buffer)."""
        return self.reduce_scatter_s(size_bytes)


# --------------------------------------------------------------------------------------------
# The presets of references.yaml
# --------------------------------------------------------------------------------------------


def read_clusters(references_path: str | os.PathLike[str] | None) -> dict[str, ClusterPreset]:
    """``clusters`` of references.yaml, their links resolved from ``links``; none without the file."""
    return clusters_of(load_optional_references(references_path))


def clusters_of(references: Mapping[str, Any]) -> dict[str, ClusterPreset]:
    """``clusters`` of a references document, their links resolved from ``links`` (the loader
    has checked that each names one of them)."""
    links = links_of(references)
    return {
        key: ClusterPreset(
            key=key,
            name=entry["name"],
            gpu=entry["gpu"],
            gpus_per_node=int(entry["gpus_per_node"]),
            intra=links[entry["intra_node_link"]],
            inter=links[entry["inter_node_link"]],
            source=entry["source"],
            topology=topology_of(entry.get("topology")),
        )
        for key, entry in (references.get("clusters") or {}).items()
    }


def topology_of(entry: Mapping[str, Any] | None) -> Topology:
    """A preset's ``topology`` of references.yaml (its latency in microseconds there, seconds here);
    a figure null or absent is not stated."""
    if not entry:
        return Topology()
    latency = entry.get("spine_hop_latency_us")
    over = entry.get("spine_oversubscription")
    return Topology(
        nodes_per_leaf=None if entry.get("nodes_per_leaf") is None else int(entry["nodes_per_leaf"]),
        spine_oversubscription=None if over is None else float(over),
        spine_hop_latency_s=None if latency is None else float(latency) * 1e-6,
        source=entry.get("source") or "not stated",
    )


@dataclass(frozen=True)
class PredictionError:
    """The model's typical error on published runs (``prediction_error`` of references.yaml): the
    median and the largest |predicted / published - 1| over the benchmark's held-back rows, every
    regime together; a prediction's own error bar is its regime's (``prediction_error.ErrorTable``)."""

    typical: float
    largest: float
    rows: int
    command: str  # the benchmark command that measured it


def read_prediction_error(references_path: str | os.PathLike[str] | None) -> PredictionError | None:
    return prediction_error_of(load_optional_references(references_path))


def prediction_error_of(references: Mapping[str, Any]) -> PredictionError | None:
    """``prediction_error`` of a references document, None where it has none."""
    entry = references.get("prediction_error")
    if not entry:
        return None
    return PredictionError(float(entry["typical"]), float(entry["largest"]), int(entry["rows"]), entry["command"])


def preset(presets: Mapping[str, ClusterPreset], key: str) -> ClusterPreset:
    """The preset named ``key``, or a ValueError that lists the known ones."""
    if key not in presets:
        known = ", ".join(sorted(presets)) or "none"
        raise ClusterPresetError(f"unknown cluster preset {key!r}: choose one of {known} (clusters in config/references.yaml)")
    return presets[key]


def preset_for_gpu(presets: Mapping[str, ClusterPreset], device_names: Iterable[str]) -> tuple[ClusterPreset | None, str]:
    """The preset whose GPU is the one the study ran on (matched as the GPU peak table matches
    names: "NVIDIA H100 80GB HBM3" is the H100 SXM5 of dgx_h100), and why it is that one; None
    and why when the study ran on several GPU models, on none (a CPU), or on one no preset has."""
    names = sorted({str(name) for name in device_names if name and str(name).strip()})
    keys = {peaks_key(name) for name in names}
    if len(keys) > 1:
        return None, f"the study ran on several GPU models ({', '.join(names)}): no one cluster preset is its shape"
    key = next(iter(keys), None)
    if key is None:
        return None, f"the study ran on no GPU the GPU peak table knows ({', '.join(names) or 'no device named'})"
    matching = sorted(k for k, entry in presets.items() if peaks_key(entry.gpu) == key)
    if not matching:
        return None, f"no cluster preset in config/references.yaml has the study's GPU ({', '.join(names)})"
    return presets[matching[0]], f"the preset of the study's GPU, {', '.join(names)} = {PEAKS[key].model}: scaling.predict_cluster is not set"
