"""The alpha-beta scaling model: predict the step time and the scaling efficiency at N GPUs from
a one-GPU run and the all-reduce benchmark, and set the prediction beside the measurement.

Inputs. From the one-GPU run's record (``measurements.backward_buckets``, ``scalerepro.training.buckets``):
DDP's gradient buckets in all-reduce order, bytes S_k and ready time r_k (backward start -> every
gradient of bucket k accumulated), and the compute phases of one step (forward f, backward b,
optimizer o, A micro-batches per step), plus the run's median step time t(1). From the all-reduce
benchmark at N GPUs (``scalerepro.training.commbench``, results/comm/g<N>.json): time t over message size S.

Network (ring all-reduce: a reduce-scatter and an all-gather, 2(N-1) steps, each sending S/N
bytes over the ring's slowest link):

    t_ring(S, N) = 2(N-1) alpha + 2(N-1)/N * S / B

alpha: latency of one ring step (s), B: the slowest link's bandwidth (bytes/s). With x1 = 2(N-1)
and x2 = 2(N-1)/N * S the model is linear in (alpha, 1/B); it is fitted to the benchmark's
median times by least squares on the relative error, sum(((t_ring - t) / t)^2), because the
sizes span orders of magnitude and absolute errors would ignore the small messages that
determine alpha. (busbw = S/t * 2(N-1)/N tends to B for large S: B is the measured bus
bandwidth.) For GPU counts beyond the study's hardware, alpha and B come from what the study
measured on the same kind of link: the fit at the largest count measured within one node for N
GPUs that fit in one node, the fit at the largest count measured across nodes for N that span
nodes. Where the study measured no such link, they come from ``links`` in
config/references.yaml: NVLink within a node, InfiniBand across nodes (a ring is as fast as its
slowest link), B = line rate x the link's efficiency (default 0.85: all-reduce bus bandwidth
does not reach the line rate; the source of each figure is in the file and in the table).

Step (all-reduces in bucket order on one communication stream, each starting when its bucket is
ready and the previous all-reduce is done, overlapping the rest of the backward):

    m_N, A_N = the micro-batch per GPU and micro-batches per step at N (integers: the matrix's
         per_gpu_batch and grad_accum_steps for a measured count; beyond the hardware, strong
         scaling splits the study's global batch G into G / N per GPU, in micro-batches of at
         most the 1-GPU micro-batch m_1, and a G that does not split evenly gets no prediction;
         weak scaling keeps m_1 and A_1)
    c  = compute scale: the batch curve t(m) = a + b m (``BatchCurve``, least squares) where one
         covers m_N: c = (t(m_N) - fixed) / (t(m_1) - fixed), fixed = other + o, so that a step's
         launch and per-kernel costs do not shrink with the batch; else m_N / m_1 (compute
         proportional to the micro-batch), and a row whose micro-batch shrinks so is an upper
         bound on the efficiency (its ``bound`` says so: a small batch's fixed cost is unknown).
         The curve: through the study's one-GPU runs of one micro-batch a step where it ran two
         or more micro-batches; else a kept ``batch_curve.json`` (benchmarks/gpu/batch_curve.py)
         of this model on the study's GPU, in the study folder or in the folder that holds it (a
         GPU session's folder keeps its curve beside its study: ``kept_batch_curve``). A curve
         covers the batches it was measured between (a line is not extrapolated below them)
    e_0 = 0;  e_k = max(c r_k, e_(k-1)) + t_ring(S_k, N)            end of bucket k's all-reduce
    other = t(1) - (A_1 (f + b) + o)                                 data wait and loop overhead
                                                                     of the measured 1-GPU step
    (when the probe's phases add up to more than t(1), its few steps having caught a slower
    moment than the window's median, f, b, o and every r_k are scaled by t(1) / (A_1 (f + b) + o),
    so that the model gives t(1) back at one GPU)
    t(N) = other + A_N c f + (A_N - 1) c b + max(c b, e_last) + o    (only the last micro-batch
                                                                     all-reduces: no_sync)

Compute inflation. Ranks that share a node slow each other (memory bandwidth, caches, clocks
under a power or thermal cap, cores shared with the launcher): the step they compute is not the
one-GPU step. The model takes it from the multi-rank runs' own windows (``rank_step``: the step
less its waits for the all-reduce, its input and the slowest rank, typical rank, less what the
overlapped all-reduce costs the backward; ``loss_decomposition``), or for a record from before
the window was split, from its no-sync probe (``measurements.exposed_communication``: the same
step without the all-reduce, slowest rank, the wait for it included):

    k = t_compute(N) / t_1(m_N, A_N)

Each is read in the statistic the cell's efficiency is in (``statistic_of``): a strong cell's E
is in throughputs, samples over the window (mean steps), a weak cell's in epoch times, from the
window's median step; the window's figures, means over its steps, are scaled by the run's median
step over its mean step for a weak cell, and t_1 is the one-GPU runs' median or mean step to
match. (On the kept README study, cpu-readme-a0f872f, whose strong runs each had one slow step
among three or four, the window's means taken as a weak cell's median put that cell's E(2) 8.4
points low; in its own statistic, 2.0 points high.)

Stragglers. At every all-reduce the ranks wait for the one that finishes its backward last: the
typical rank waits W(N) = E[max of the N ranks' steps] - their mean. The record keeps the window's
mean wait, not its per-rank, per-step times (``allreduce_timing.window_split`` gathers them and
keeps means), so the distribution is fitted, not taken empirically: a normal of spread sigma, the
one parameter a mean wait identifies, whose expected maximum grows as e_N (``expected_max_normal``,
e_2 = 0.564, e_8 = 1.424, e_64 = 2.344, e_512 = 3.044: about sqrt(2 ln N)). It is a lower bound
where rank steps have a heavy tail (an occasional hiccup of one rank), whose wait grows faster:

    sigma / t = W(N_measured) / (e_N_measured x t_compute)      (``straggler_spread``, per run)
    W(N) = (sigma / t) x e_N x k t_1(m_N, A_N)                   (``straggler_wait_s``)

sigma / t is chosen as k is (held out: the other cells'; beyond the hardware, every window's), and
W(N) is its own part of the predicted loss (``loss_straggler``). A probe's k holds its wait already.

(Over five README studies of 2026-11-27, the window's figures took the model's largest E(2) error
from 4.4 points to 2.6: two cells of one configuration, the strong and the weak at two ranks of
batch 8, had probes 2-5 % apart where their windows were 1-2 % apart.)

t_1(m, A): the study's measured one-GPU step at that micro-batch and accumulation (any study of
the model under the same conditions), else the profile's own step at (c, A). k is a property of
the occupancy o = min(N, GPUs per node); a cell is predicted with the median k of the *other*
cells measured at its occupancy (held out: its own measurement is not its input), its own only where no
other cell has that occupancy (the row says "in-sample"), and a count beyond the node with the k
measured at the node's fullest occupancy (inflation at full occupancy carries to more nodes).
Every phase of the step (f, b, o, other, every r_k) is scaled by K = k t_1(m_N, A_N) / (the
profile's step at (c, A)), so that the replayed step without communication is k t_1(m_N, A_N).

Bandwidth under load. The all-reduce benchmark times the collective alone; in the step it runs
beside the backward (on a CPU, gloo's reductions on the very cores the backward computes on), and
is slower. Each multi-rank run measures what the step exposes (the exposed comm of its window,
else its probe's sync - no-sync step); the
share s of the benchmark's B at which the replay (its compute at that run's own k) exposes as much
is found by bisection (``bandwidth_share``; 1 where the replay already exposes as much at B). A cell
on a link the study measured replays its all-reduces at s x B, s chosen as k is (held out, else
in-sample, beyond the hardware the fullest occupancy's); a link from references.yaml or a cluster
preset keeps its own B (s is a property of the study's hardware, not of the preset's).

The optimizer and "other" do not shrink with the batch. The step at N ranks is the replay plus
the wait for the slowest, t(N) = replayed step + W(N). Predicted efficiency, by the study's
definitions (``scalerepro.analysis.tables.aggregate``), t(1) and t(N) in the statistic above:

    strong (global batch fixed)     E(N) = thr(N) / (N thr(1)) = t(1) / (N t(N))   (mean steps)
    weak (per-GPU batch, data fixed) E(N) = T(1) / T(N)        = t(1) / t(N)       (median steps)

A study of one GPU (a model whose only scaling study ran one GPU) is also predicted as weak
scaling at its one-GPU run's per-GPU batch, held at every N: the question a user with one GPU
asks, and one no batch curve is needed for (the rows say so in their note).

On a cluster preset (``predict_cluster``: ``clusters`` in references.yaml) the counts beyond the
study's hardware run instead on that cluster's hierarchical network (``network_model``: NCCL's
flat ring through all N GPUs over NVLink and one NIC per GPU, or its tree across nodes), with its
GPUs per node, each row beside the model's back-tested error in its own regime (``prediction_error``:
strategy, nodes, the micro-batch against the batch curve's knee, where the compute came from;
``prediction_error_by_regime`` of references.yaml, measured by benchmarks/predict_published.py),
or no error where no back-test covered that regime; a row that replays the study's own links is
no regime of the back-test (it ran on NCCL clusters) and carries none. A GPU study that names no
preset predicts the counts beyond its node, where it measured no link across nodes, on the preset
of its own GPU (``network_model.preset_for_gpu``: an H100 SXM5 on dgx_h100), and says so; with no
preset for its GPU, a one-GPU node predicts nothing beyond itself (a one-GPU box is not eight
one-GPU nodes over InfiniBand). ``simulate_fsdp_step`` is the
same step under FSDP (all-gathers before each unit's forward and backward, reduce-scatters after
its backward, the root unit's apart), and ``fit_compute_to_step`` scales a profile's compute to a
published step.

What it leaves out: contention between the all-reduce and the backward on one GPU, DDP's copies
into and out of the buckets, and a data loader that slows at N ranks (the inflation k holds the
rest of the contention as the runs measured it).

Table ``scaling_model.csv``, one row per (study, model, GPU count), in strong|weak order:
    study, model, gpus, nodes, basis (measured: a measured cell, prediction beside it |
    predicted: a count beyond the study's hardware, prediction alone), network (where alpha and
    B come from), alpha_step_us, link_gbps (B in GB/s, 1e9 bytes/s), global_batch,
    per_gpu_batch (m_N), grad_accum_steps (A_N), compute_scale (c), buckets, gradient_bytes,
    allreduce_s (sum of t_ring over the buckets), exposed_comm_s (max(c b, e_last) - c b),
    step_time_measured_s, step_time_predicted_s, step_time_error (predicted / measured - 1),
    efficiency_measured (scaling.csv's), efficiency_predicted, efficiency_error (predicted -
    measured), cluster (the preset a predicted row ran on), typical_error (the median |error| the
    back-test measured in the row's regime; empty where none did), profile_run (the one-GPU run
    whose buckets were replayed), note, cluster_basis
    (why that preset: named in the config, or the study's GPU's), fixed_step_s (other + o: the
    per-step cost that does not shrink with the batch), loss_fixed_cost and loss_exposed_comm (the
    predicted loss of efficiency split: (t(N) - ideal - exposed - inflation - W(N)) / t(N) and
    exposed / t(N), ideal t(1) / N strong, t(1) weak; with loss_compute_inflation and
    loss_straggler they add up to 1 - efficiency), compute_inflation (k + W(N) / t_1(m_N, A_N): the
    step without communication, the wait for the slowest included, against the one-GPU step),
    inflation_basis (where k comes from), loss_compute_inflation (the part of the loss k adds:
    (k - 1) t_1(m_N, A_N) / t(N)), batch_curve (the curve c came from, or why none), loss_straggler
    (W(N) / t(N)), straggler_basis (where sigma / t comes from, and W(N) in it), regime (the key of
    the row's regime, ``prediction_error.Regime``), error_basis (the back-test rows behind
    typical_error, or "no back-test of this regime"), bound (why the predicted efficiency is an
    upper bound, where it is one); ``network`` ends with the share s of B under load where one
    was applied.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import pandas as pd

from scalerepro.analysis.evidence import POSITIVE, Bound, EvidenceError, read_json_document
from scalerepro.analysis.tables import loss_decomposition, prediction_error
from scalerepro.analysis.tables.network_model import (
    ClusterPreset,
    Link,
    clusters_of,
    links_of,
    preset,
    preset_for_gpu,
)
from scalerepro.analysis.tables.readers import read_comm
from scalerepro.analysis.values import finite_number
from scalerepro.common import batch_split
from scalerepro.common.gpu_peaks import peaks_key
from scalerepro.common.references import load_optional_references

SCALING_MODEL_COLUMNS = (
    "study",
    "model",
    "gpus",
    "nodes",
    "basis",
    "network",
    "alpha_step_us",
    "link_gbps",
    "global_batch",
    "per_gpu_batch",
    "grad_accum_steps",
    "compute_scale",
    "buckets",
    "gradient_bytes",
    "allreduce_s",
    "exposed_comm_s",
    "step_time_measured_s",
    "step_time_predicted_s",
    "step_time_error",
    "efficiency_measured",
    "efficiency_predicted",
    "efficiency_error",
    "cluster",
    "typical_error",
    "profile_run",
    "note",
    "cluster_basis",
    "fixed_step_s",
    "loss_fixed_cost",
    "loss_exposed_comm",
    "compute_inflation",
    "inflation_basis",
    "loss_compute_inflation",
    "batch_curve",
    "loss_straggler",
    "straggler_basis",
    "regime",
    "error_basis",
    "bound",
)
DEFAULT_PREDICT_GPUS = (8, 16, 64)
BATCH_CURVE_FILE = "batch_curve.json"  # benchmarks/gpu/batch_curve.py's output: a study's, or its GPU session's
PROPORTIONAL_BOUND = "upper bound: compute taken as proportional to the micro-batch (no batch curve covers it)"
Statistic = Literal["mean", "median"]


# --------------------------------------------------------------------------------------------
# Network: the ring all-reduce and its fit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RingNetwork:
    """The alpha-beta model of a ring all-reduce over ``gpus`` GPUs."""

    gpus: int
    alpha_step_s: float  # latency of one of the 2(N-1) ring steps
    link_bytes_per_s: float  # B: the ring's slowest link
    source: str  # where alpha and B come from

    def allreduce_s(self, size_bytes: float) -> float:
        """t_ring(S, N) = 2(N-1) alpha + 2(N-1)/N * S / B; nothing to reduce on one GPU."""
        n = self.gpus
        if n == 1:
            return 0.0
        return 2 * (n - 1) * self.alpha_step_s + 2 * (n - 1) / n * size_bytes / self.link_bytes_per_s


def fit_ring(sizes_bytes: Sequence[float], times_s: Sequence[float], gpus: int, source: str = "fit") -> RingNetwork:
    """alpha and B of t_ring(S, N) by least squares on the relative error (module docstring).
    A negative alpha (noise on a link whose latency is below the resolution) is refitted as 0; a
    time that does not grow with the size (noise over a latency-bound range of sizes) leaves B
    unresolved: it is refitted with alpha alone and B infinite, and ``source`` says so."""
    sizes, times = np.asarray(sizes_bytes, dtype=float), np.asarray(times_s, dtype=float)
    if gpus < 2:
        raise ValueError(f"an all-reduce fit needs at least 2 GPUs (got {gpus})")
    if len(np.unique(sizes)) < 2 or np.any(times <= 0):
        raise ValueError(f"{source}: fitting alpha and B needs positive times at two or more message sizes")
    x1 = np.full_like(sizes, 2.0 * (gpus - 1))  # multiplies alpha
    x2 = 2.0 * (gpus - 1) / gpus * sizes  # multiplies 1/B
    # dividing each equation by its measured time turns absolute into relative residuals
    (alpha, inverse_b), *_ = np.linalg.lstsq(np.column_stack([x1, x2]) / times[:, None], np.ones_like(times), rcond=None)
    if alpha < 0:
        alpha = 0.0
        inverse_b = float(np.sum(x2 / times) / np.sum((x2 / times) ** 2))  # 1-parameter least squares
    if inverse_b <= 0:
        alpha = float(np.sum(x1 / times) / np.sum((x1 / times) ** 2))  # 1-parameter least squares
        source += "; the time does not grow with the size: alpha alone, B unresolved (infinite)"
        return RingNetwork(gpus, alpha, math.inf, source)
    return RingNetwork(gpus, float(alpha), float(1.0 / inverse_b), source)


def fit_comm(document: Mapping[str, Any], name: str) -> RingNetwork:
    """alpha and B of one ``scalerepro.training.commbench`` result (its median times), the file ``name``."""
    rows = document["results"]
    return fit_ring(
        [row["size_bytes"] for row in rows],
        [row["time_us_median"] * 1e-6 for row in rows],
        document["world_size"],
        source=f"fit to {name} ({document['backend']}, {len(rows)} sizes)",
    )


def fit_comm_file(path: str | os.PathLike[str]) -> RingNetwork:
    """alpha and B of one ``scalerepro.training.commbench`` file (``readers.read_comm``)."""
    return fit_comm(read_comm(path), Path(path).name)


def config_network(links: Mapping[str, Link], gpus: int, gpus_per_node: int) -> RingNetwork:
    """The ring over ``gpus`` GPUs on links from the config: NVLink within one node, else the
    inter-node link (the slowest link of the ring), with that link's per-hop latency, at
    B = line rate x the link's efficiency."""
    nodes = -(-gpus // gpus_per_node)
    key = "inter_node" if nodes > 1 else "intra_node"
    if key not in links:
        raise ValueError(f"config/references.yaml has no links.{key}: add its bandwidth_gbps and hop_latency_us")
    link = links[key]
    # B = line rate x efficiency: an all-reduce's bus bandwidth stays below the line rate
    bandwidth = link.bandwidth_bytes_per_s * link.efficiency
    source = (
        f"{link.name}: {link.bandwidth_bytes_per_s / 1e9:g} GB/s line rate x {link.efficiency:g} (references.yaml links.{key}; the study measured no such link)"
    )
    return RingNetwork(gpus, link.hop_latency_s, bandwidth, source)


def measured_network(fits: Mapping[int, tuple[RingNetwork, int]], gpus: int, gpus_per_node: int) -> RingNetwork | None:
    """alpha and B measured on the kind of link a ring over ``gpus`` GPUs runs on: the fit at the
    largest count the study measured within one node (``gpus`` fit in one node) or across nodes
    (they span nodes); None when the study measured no such link. ``fits``: count -> (fit, nodes)."""
    across = -(-gpus // gpus_per_node) > 1
    same_kind = [(n, fit) for n, (fit, nodes) in fits.items() if (nodes > 1) == across and math.isfinite(fit.link_bytes_per_s)]
    if not same_kind:
        return None
    n, fit = max(same_kind, key=lambda item: item[0])
    where = "across nodes" if across else "within one node"
    source = f"measured {where}: {fit.source}, B = {fit.link_bytes_per_s / 1e9:.3g} GB/s bus bandwidth at {n} GPUs"
    return RingNetwork(gpus, fit.alpha_step_s, fit.link_bytes_per_s, source)


# --------------------------------------------------------------------------------------------
# The step: all-reduces overlapping the backward
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepProfile:
    """A one-GPU run's step, from its record (see the module docstring for the symbols)."""

    step_s: float  # t(1): the run's median step time
    forward_s: float  # f
    backward_s: float  # b
    optimizer_s: float  # o
    micro_batches: int  # A
    bucket_bytes: tuple[int, ...]  # S_k, in all-reduce order
    bucket_ready_s: tuple[float, ...]  # r_k

    @property
    def other_s(self) -> float:
        """other = t(1) - (A (f + b) + o), at least 0: what the probe's phases do not cover."""
        return max(self.step_s - (self.micro_batches * (self.forward_s + self.backward_s) + self.optimizer_s), 0.0)


@dataclass(frozen=True)
class StepPrediction:
    step_s: float  # t(N)
    allreduce_s: float  # sum of t_ring(S_k, N)
    exposed_comm_s: float  # max(c b, e_last) - c b
    backward_phase_s: float  # max(c b, e_last)


class AllReduceNetwork(Protocol):
    """What the step replays all-reduces on: the fitted or configured flat ring (``RingNetwork``)
    or the hierarchical network of a cluster preset (``network_model.HierarchicalNetwork``)."""

    @property
    def gpus(self) -> int: ...

    @property
    def source(self) -> str: ...

    def allreduce_s(self, size_bytes: float) -> float: ...


def simulate_step(profile: StepProfile, network: AllReduceNetwork, compute_scale: float = 1.0, micro_batches: int | None = None) -> StepPrediction:
    """t(N) of the module docstring: bucket k's all-reduce starts at max(c r_k, e_(k-1)).
    ``micro_batches``: A_N, micro-batches per step at N GPUs (default: the profile's A_1)."""
    c = compute_scale
    end = 0.0
    total = 0.0
    for size, ready in zip(profile.bucket_bytes, profile.bucket_ready_s):
        duration = network.allreduce_s(size)
        end = max(c * ready, end) + duration  # e_k = max(c r_k, e_(k-1)) + t_ring(S_k, N)
        total += duration
    backward = c * profile.backward_s
    backward_phase = max(backward, end)
    a = profile.micro_batches if micro_batches is None else micro_batches
    step = profile.other_s + a * c * profile.forward_s + (a - 1) * backward + backward_phase + profile.optimizer_s
    return StepPrediction(step, total, backward_phase - backward, backward_phase)


@dataclass(frozen=True)
class FsdpProfile:
    """A one-GPU step of a model that FSDP shards (full sharding) into ``units`` equal units (the
    transformer blocks), for ``simulate_fsdp_step``. f, b: forward and backward of the whole model
    for one micro-batch; o: the optimizer over the whole model on one GPU (at N GPUs each updates
    its 1/N shard); P_g, P_r: the model's parameters in the gather dtype (bf16: 2 bytes each) and
    its gradients in the reduce dtype (fp32: 4 bytes each)."""

    step_s: float  # t(1)
    forward_s: float  # f
    backward_s: float  # b
    optimizer_s: float  # o
    micro_batches: int  # A
    units: int  # L
    gather_bytes: float  # P_g
    reduce_bytes: float  # P_r
    reshard_after_forward: bool = True  # FSDP2's default: the backward gathers every unit again
    root_fraction: float = 0.0  # rho: the parameters outside the L units (embeddings, head), FSDP's root unit

    @property
    def other_s(self) -> float:
        """other = t(1) - (A (f + b) + o), at least 0."""
        return max(self.step_s - (self.micro_batches * (self.forward_s + self.backward_s) + self.optimizer_s), 0.0)


class ShardingNetwork(Protocol):
    """The collectives FSDP runs: ``network_model.HierarchicalNetwork``."""

    @property
    def gpus(self) -> int: ...

    def all_gather_s(self, size_bytes: float) -> float: ...

    def reduce_scatter_s(self, size_bytes: float) -> float: ...


def simulate_fsdp_step(profile: FsdpProfile, network: ShardingNetwork, compute_scale: float = 1.0, micro_batches: int | None = None) -> StepPrediction:
    """t(N) of an FSDP step. Each unit of wrapping (FSDP's, one a transformer block) has its
    parameters all-gathered before its forward and (with reshard after forward) again before its
    backward, prefetched one unit ahead; its gradients are reduce-scattered after its backward;
    each collective is a ring with its own latency (``network_model``: NCCL offers these two no
    tree); every transfer shares the one network, end to end. The root unit, the share rho of the
    parameters that no block holds (embeddings, final norm, head), is gathered before anything
    computes and reduce-scattered after everything has, so neither of its transfers overlaps:

        ag = all-gather((1 - rho) P_g / L, N),   rs = reduce-scatter((1 - rho) P_r / L, N)
        ag_0 = all-gather(rho P_g, N),           rs_0 = reduce-scatter(rho P_r, N)   (0 for rho = 0)
        forward phase  F = ag_0 + max(ag + c f, L ag)         (the first gather cannot overlap)
        backward phase G = max(c b + rs, L (r ag + rs)) + rs_0 (nor the last reduce-scatter; r = 1
                                                              with reshard after forward, else 0)
        t(N) = other + A (F + G) + o / N                      (FSDP gathers and reduce-scatters
                                                              every micro-batch; the optimizer
                                                              updates one shard)

    ``allreduce_s`` of the result is the communication of the step, A (L ((1 + r) ag + rs) + ag_0 + rs_0);
    ``exposed_comm_s`` is A (F + G - c (f + b))."""
    c = compute_scale
    units, root = profile.units, profile.root_fraction
    gather = network.all_gather_s((1 - root) * profile.gather_bytes / units)
    scatter = network.reduce_scatter_s((1 - root) * profile.reduce_bytes / units)
    root_gather = network.all_gather_s(root * profile.gather_bytes) if root > 0 else 0.0
    root_scatter = network.reduce_scatter_s(root * profile.reduce_bytes) if root > 0 else 0.0
    again = 1 if profile.reshard_after_forward else 0
    forward, backward = c * profile.forward_s, c * profile.backward_s
    forward_phase = root_gather + max(gather + forward, units * gather)
    backward_phase = max(backward + scatter, units * (again * gather + scatter)) + root_scatter
    a = profile.micro_batches if micro_batches is None else micro_batches
    step = profile.other_s + a * (forward_phase + backward_phase) + profile.optimizer_s / network.gpus
    communication = a * (units * ((1 + again) * gather + scatter) + root_gather + root_scatter)
    return StepPrediction(step, communication, a * (forward_phase + backward_phase - forward - backward), backward_phase)


Profile = TypeVar("Profile", StepProfile, FsdpProfile)


def scale_compute(profile: Profile, scale: float) -> Profile:
    """The profile with its compute (f, b and every bucket's ready time) times ``scale``, the
    optimizer and the communication unchanged, and t(1) its phases' sum (other = 0)."""
    scaled = replace(profile, forward_s=scale * profile.forward_s, backward_s=scale * profile.backward_s)
    if isinstance(scaled, StepProfile):
        scaled = replace(scaled, bucket_ready_s=tuple(scale * ready for ready in profile.bucket_ready_s))
    phases = scaled.micro_batches * (scaled.forward_s + scaled.backward_s) + scaled.optimizer_s
    return replace(scaled, step_s=phases)


def fit_compute_to_step(profile: Profile, step_s: float, predict: Callable[[Profile], float]) -> Profile:
    """The profile whose compute is scaled (``scale_compute``) so that ``predict`` -- the model's
    step time at the count a published step was measured on -- gives that step: the one-GPU
    compute is the published step less the communication the model exposes there. ``predict`` is
    increasing in the scale; bisection to 1e-9 relative."""
    low, high = 0.0, 1.0
    if predict(scale_compute(profile, low)) >= step_s:
        raise ValueError(f"a step of {step_s:.4g} s is shorter than the model's optimizer and exposed communication alone")
    while predict(scale_compute(profile, high)) < step_s:
        high *= 2
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if predict(scale_compute(profile, middle)) < step_s else (low, middle)
    return scale_compute(profile, (low + high) / 2)


def inflated(profile: StepProfile, factor: float) -> StepProfile:
    """The profile with every phase of its step times ``factor``: f, b, o, every r_k and t(1) (so
    "other" too); the buckets' bytes unchanged."""
    return replace(
        profile,
        step_s=factor * profile.step_s,
        forward_s=factor * profile.forward_s,
        backward_s=factor * profile.backward_s,
        optimizer_s=factor * profile.optimizer_s,
        bucket_ready_s=tuple(factor * ready for ready in profile.bucket_ready_s),
    )


@dataclass(frozen=True)
class BatchCurve:
    """A step's time over its micro-batch, t(m) = intercept + slope m, through measured one-GPU
    steps of one micro-batch a step (least squares; ``statistics.linear_regression``)."""

    intercept_s: float
    slope_s: float  # seconds a sample adds
    batches: tuple[int, ...]
    source: str

    @classmethod
    def fit(cls, batches: Sequence[float], steps_s: Sequence[float], source: str) -> BatchCurve | None:
        """The curve through (batch, step) points; None with fewer than two distinct batches or a
        slope that is not positive (noise: a step that does not grow with its batch)."""
        if len(set(batches)) < 2:
            return None
        fit = statistics.linear_regression([float(b) for b in batches], [float(t) for t in steps_s])
        if not fit.slope > 0:
            return None
        return cls(fit.intercept, fit.slope, tuple(sorted({int(b) for b in batches})), source)

    def step_s(self, batch: float) -> float:
        return self.intercept_s + self.slope_s * batch

    def compute_scale(self, batch: float, reference_batch: float, fixed_s: float) -> float:
        """c = (t(m) - fixed) / (t(m_1) - fixed): the compute of a micro-batch of ``batch``
        against one of ``reference_batch``, the per-step cost ``fixed`` (other + o) taken out."""
        return max(self.step_s(batch) - fixed_s, 0.0) / (self.step_s(reference_batch) - fixed_s)

    def describe(self) -> str:
        return f"t(m) = {self.intercept_s * 1e3:.3g} ms + {self.slope_s * 1e3:.3g} ms x m through m = {', '.join(map(str, self.batches))} ({self.source})"

    def covers(self, batch: float) -> bool:
        """Whether ``batch`` lies within the batches the curve was measured at (a line is not
        extrapolated: below its smallest batch a step's fixed cost may be more than the line says)."""
        return min(self.batches) <= batch <= max(self.batches)

    @property
    def knee(self) -> float:
        """The batch whose fixed per-step cost is a tenth of its step (``prediction_error.knee``)."""
        return prediction_error.knee(self.intercept_s, self.slope_s)

    @classmethod
    def from_document(cls, document: Mapping[str, Any], where: str) -> BatchCurve | None:
        """The curve of a ``batch_curve.json`` (benchmarks/gpu/batch_curve.py: rows of batch and
        step_s_median), named by ``where`` and the device it ran on."""
        rows = document.get("rows") or []
        return cls.fit([r["batch"] for r in rows], [r["step_s_median"] for r in rows], f"{where}, {document.get('device')}")


def kept_batch_curve(record_files: Iterable[str], model: str, device_names: Iterable[str]) -> tuple[BatchCurve | None, str]:
    """The batch curve kept for ``model`` beside a study: ``batch_curve.json`` in the study folder
    (the one holding the ``runs`` folder its records lie in, <study>/runs/<run>/record.json), else
    in the folder holding the study (a GPU session's folder, where benchmarks/gpu/batch_curve.py
    writes its curve beside the session's records). A curve of another model, or measured on
    another GPU than the study's (``gpu_peaks.peaks_key``), is not this study's. (None, why) where
    none is kept."""
    folders = {next((parent.parent for parent in Path(path).parents if parent.name == "runs"), None) for path in record_files}
    folders.discard(None)
    if len(folders) != 1:
        return None, "no study folder to look for a kept batch curve in"
    (study,) = folders
    keys = {peaks_key(str(name)) for name in device_names if name}
    for candidate in (study / BATCH_CURVE_FILE, study.parent / BATCH_CURVE_FILE):
        if not candidate.is_file():
            continue
        try:
            document = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if document.get("model") == model and peaks_key(str(document.get("device"))) in keys - {None}:
            where = f"{candidate.parent.name}/{candidate.name}" if candidate.parent != study else candidate.name
            curve = BatchCurve.from_document(document, where)
            return curve, f"kept: {where}" if curve is not None else f"{where} holds no curve that rises with the batch"
    return None, f"no {BATCH_CURVE_FILE} of {model} on the study's GPU in the study folder or the folder holding it"


# --------------------------------------------------------------------------------------------
# Stragglers: the wait for the slowest of N ranks
# --------------------------------------------------------------------------------------------

_GRID = np.linspace(-12.0, 12.0, 48_001)  # standard normal draws, step 5e-4
_PDF = np.exp(-(_GRID**2) / 2) / math.sqrt(2 * math.pi)
_CDF = 0.5 * (1 + np.vectorize(math.erf)(_GRID / math.sqrt(2)))


@functools.cache
def expected_max_normal(n: int) -> float:
    """e_N = E[max of N independent standard normal draws] = integral of x N phi(x) Phi(x)^(N-1) dx,
    by the trapezoid rule on a grid of step 5e-4 over +-12 (within 1e-6 of the closed forms
    e_2 = 1/sqrt(pi) = 0.5642, e_3 = 3 / (2 sqrt(pi)) = 0.8463); e_1 = 0."""
    if n < 1:
        raise ValueError(f"a count of ranks is a whole number from 1 (got {n})")
    if n == 1:
        return 0.0
    return float(np.trapezoid(_GRID * n * _PDF * _CDF ** (n - 1), _GRID))


def straggler_spread(wait_s: float, ranks: int, compute_s: float) -> float:
    """sigma / t: a rank's step-to-step spread as a share of its compute step, from the mean wait
    for the slowest of ``ranks`` ranks the window measured, W = sigma e_N (module docstring)."""
    return wait_s / (expected_max_normal(ranks) * compute_s)


def straggler_wait_s(spread: float, ranks: int, compute_s: float) -> float:
    """W(N) = E[max of N rank steps] - their mean = sigma e_N, sigma = spread x the compute step."""
    return spread * compute_s * expected_max_normal(ranks)


def _positive(value: Any) -> float | None:
    """A measured time: finite and above 0, else None."""
    number = finite_number(value)
    return number if number is not None and number > 0 else None


@dataclass(frozen=True)
class RankStep:
    """A multi-rank run's step as the model reads it (``rank_step``): the typical rank's compute,
    its wait for the slowest rank (None where the record does not split it out), the all-reduce
    it exposed, and where they were measured."""

    compute_s: float
    straggler_s: float | None
    exposed_s: float | None
    measured_in: str  # "window" | "probe"

    @property
    def nosync_s(self) -> float:
        """The step without communication as the ranks wait for the slowest."""
        return self.compute_s + (self.straggler_s or 0.0)


def rank_step(run: pd.Series, statistic: Statistic = "median") -> RankStep | None:
    """``no_sync_step_and_exposed`` with the wait for the slowest rank apart. The window's figures
    are means over its steps; where the prediction is of a median step (``statistic``: a weak
    cell's E is in median steps, a strong cell's in mean steps, ``statistic_of``) they are scaled
    by the run's median step over its mean step, so that a window with one slow step among few
    does not put that step into a median. A probe's figures are its own short run's: its slowest
    rank's no-sync step holds the wait, which is not split out."""
    quantities = loss_decomposition.run_quantities(run)
    if isinstance(quantities, dict) and quantities["measured_in"] == "window":
        scale = 1.0
        if statistic == "median":
            median = _positive(run.get("step_time_median_s"))
            scale = median / quantities["step"] if median is not None else 1.0
        return RankStep(scale * quantities["compute"], scale * quantities["straggler"], scale * quantities["exposed"], "window")
    nosync, exposed, measured_in = no_sync_step_and_exposed(run)
    return None if nosync is None else RankStep(nosync, None, exposed, measured_in)


def no_sync_step_and_exposed(run: pd.Series) -> tuple[float | None, float | None, str]:
    """A multi-rank run's step without the all-reduce, as the ranks wait for the slowest, and the
    all-reduce it exposed. From the window's own steps where the record splits them
    (``loss_decomposition.run_quantities``: the typical rank's compute + its wait for the slowest;
    the exposed comm), else from the probe after the window (its slowest rank's no-sync step;
    sync - no-sync step); (None, None) with neither; and which ("window" or "probe")."""
    quantities = loss_decomposition.run_quantities(run)
    # the window's figures with the probe's overlap cost only: without it (--comm-probe-steps 0)
    # the window's compute holds the all-reduce's cost to the backward, and the model has neither
    if isinstance(quantities, dict) and quantities["measured_in"] == "window":
        return quantities["compute"] + quantities["straggler"], quantities["exposed"], "window"
    nosync, sync = _positive(run.get("nosync_step_s")), _positive(run.get("sync_step_s"))
    return nosync, (max(sync - nosync, 0.0) if nosync is not None and sync is not None else None), "probe"


def one_gpu_steps(model_runs: pd.DataFrame, statistic: Statistic = "median") -> dict[tuple[int, int], float]:
    """(micro-batch, micro-batches a step) -> the median, over the model's counted one-GPU runs
    there and every study that ran it (strong, weak, sensitivity: the same preset), of each run's
    median step (``statistic`` "median") or mean step, window / steps ("mean": a throughput's)."""
    one = model_runs[model_runs["gpus"].eq(1) & model_runs["counts"].astype(bool)]
    steps: dict[tuple[int, int], list[float]] = {}
    for _, run in one.iterrows():
        step = _positive(run.get("step_time_median_s")) if statistic == "median" else loss_decomposition.mean_step_s(run)
        if step is not None:
            key = (int(run["per_gpu_batch"]), int(run.get("grad_accum_steps", 1) or 1))
            steps.setdefault(key, []).append(step)
    return {key: statistics.median(values) for key, values in steps.items()}


@dataclass(frozen=True)
class Inflation:
    """What one measured multi-rank run says of running N ranks together (module docstring: compute
    inflation, bandwidth under load)."""

    study: str
    gpus: int
    occupancy: int  # ranks on one node
    factor: float  # k
    bandwidth_share: float | None = None  # s: the share of the benchmark's B the all-reduce had in the step
    measured_in: str = "probe"  # "window" (the run's window split) or "probe" (its no-sync probe)
    spread: float | None = None  # sigma / t of the rank steps (``straggler_spread``); None: the wait is in k


def inflation_for(measured: Sequence[Inflation], study: str, gpus: int, occupancy: int, is_measured_cell: bool, attribute: str = "factor") -> tuple[float, str]:
    """k (``attribute`` "factor") or s ("bandwidth_share") for a cell at ``occupancy`` ranks a node,
    and where it comes from (module docstring): the other cells at its occupancy, else its own,
    and beyond the hardware the fullest occupancy measured."""
    measured = [m for m in measured if getattr(m, attribute) is not None]
    names = {"window": "window split", "probe": "no-sync probe" if attribute == "factor" else "sync and no-sync probe"}
    what = " and ".join(names[kind] for kind in sorted({m.measured_in for m in measured}, reverse=True)) or names["probe"]
    if occupancy <= 1:
        return 1.0, "one rank a node: none"
    if not is_measured_cell:  # a count beyond the study's hardware: what was measured, carried over
        fuller = [m for m in measured if m.occupancy <= occupancy]
        if not fuller:
            return 1.0, f"no multi-rank run measured its {what}: none assumed"
        top = max(m.occupancy for m in fuller)
        at_top = [m for m in fuller if m.occupancy == top]
        cells = sorted({f"{m.study} {m.gpus}" for m in at_top})
        return statistics.median(getattr(m, attribute) for m in at_top), (
            f"measured at {top} ranks a node ({', '.join(cells)}, {len(at_top)} runs), carried to every node"
        )
    others = [m for m in measured if m.occupancy == occupancy and (m.study, m.gpus) != (study, gpus)]
    if others:
        cells = sorted({f"{m.study} {m.gpus}" for m in others})
        return statistics.median(getattr(m, attribute) for m in others), f"held out: the {what} of {', '.join(cells)} ({len(others)} runs)"
    own = [m for m in measured if m.occupancy == occupancy]
    if own:
        return statistics.median(getattr(m, attribute) for m in own), f"in-sample: this cell's own {what} ({len(own)} runs)"
    return 1.0, f"no run at {occupancy} ranks a node measured its {what}: none assumed"


def bandwidth_share(profile: StepProfile, network: RingNetwork, exposed_s: float, compute_scale: float, micro_batches: int) -> float | None:
    """s in (0, 1]: the share of the benchmark's bandwidth B at which the replayed step exposes the
    ``exposed_s`` a run's probe measured (sync - no-sync step), its compute already inflated in
    ``profile``; 1 where the replay exposes as much at B itself, None where B is unresolved.
    Exposed time falls as s grows: bisection to 1e-6."""
    if not math.isfinite(network.link_bytes_per_s):
        return None

    def exposed(share: float) -> float:
        slower = RingNetwork(network.gpus, network.alpha_step_s, share * network.link_bytes_per_s, network.source)
        return simulate_step(profile, slower, compute_scale, micro_batches).exposed_comm_s

    if exposed(1.0) >= exposed_s:
        return 1.0
    low, high = 1e-6, 1.0
    if exposed(low) < exposed_s:
        return low
    while high - low > 1e-6:
        middle = (low + high) / 2
        low, high = (low, middle) if exposed(middle) < exposed_s else (middle, high)
    return (low + high) / 2


def statistic_of(study: str) -> Statistic:
    """The step statistic a study's efficiency is in (``aggregate``): strong's E from throughputs,
    samples over the window (mean steps); weak's from epoch times, from the window's median step."""
    return "mean" if study == "strong" else "median"


def predicted_efficiency(study: str, step_1_s: float, step_n_s: float, gpus: int) -> float:
    """strong: E = t(1) / (N t(N)) (global batch fixed); weak: E = t(1) / t(N)."""
    return step_1_s / (gpus * step_n_s) if study == "strong" else step_1_s / step_n_s


# --------------------------------------------------------------------------------------------
# From the study's records and tables to scaling_model.csv
# --------------------------------------------------------------------------------------------


def read_profile(record_path: str | os.PathLike[str]) -> tuple[StepProfile | None, str]:
    """The step profile of one run record, or None and why there is none."""
    try:
        document = read_json_document(record_path)
    except (OSError, ValueError) as error:
        return None, str(error) if isinstance(error, EvidenceError) else f"unreadable run record {record_path}: {error}"
    measurements = document.get("measurements") or {}
    probe = measurements.get("backward_buckets")
    if not isinstance(probe, dict):
        return None, "its record has no backward_buckets (recorded before the scaling model)"
    if not probe.get("steps") or not probe.get("buckets"):
        return None, f"its bucket probe did not run: {probe.get('reason')}"
    step = (measurements.get("step_time_s") or {}).get("median")
    if step is None:
        return None, "its record has no median step time"
    # every figure the model replays is a measurement: a step above 0, phases and bytes not below
    figures = {"step_time_s.median": (step, POSITIVE), **{f"backward_buckets.{k}": (probe.get(k), Bound()) for k in ("forward_s", "backward_s", "optimizer_s")}}
    buckets = probe["buckets"] if isinstance(probe["buckets"], list) else [None]
    for index, bucket in enumerate(buckets):
        bucket = bucket if isinstance(bucket, dict) else {}
        figures[f"backward_buckets.buckets[{index}].bytes"] = (bucket.get("bytes"), Bound(integer=True))
        figures[f"backward_buckets.buckets[{index}].ready_s"] = (bucket.get("ready_s"), Bound())
    for name, (value, bound) in figures.items():
        why = bound.problem(value) if value is not None else "absent"
        if why:
            return None, f"its {name} is {why}: no step to replay"
    return StepProfile(
        step_s=step,
        forward_s=probe["forward_s"],
        backward_s=probe["backward_s"],
        optimizer_s=probe["optimizer_s"],
        micro_batches=probe.get("micro_batches_per_step", 1),
        bucket_bytes=tuple(bucket["bytes"] for bucket in probe["buckets"]),
        bucket_ready_s=tuple(bucket["ready_s"] for bucket in probe["buckets"]),
    ), ""


def median_profile(profiles: Sequence[StepProfile]) -> StepProfile:
    """The element-wise median of repeats of one cell (their bucket layouts must agree)."""
    layouts = {p.bucket_bytes for p in profiles}
    if len(layouts) != 1:
        raise ValueError(f"repeats of one cell recorded different bucket layouts: {sorted(layouts)}")

    def med(values: Iterable[float]) -> float:
        return statistics.median(values)

    return StepProfile(
        step_s=med(p.step_s for p in profiles),
        forward_s=med(p.forward_s for p in profiles),
        backward_s=med(p.backward_s for p in profiles),
        optimizer_s=med(p.optimizer_s for p in profiles),
        micro_batches=profiles[0].micro_batches,
        bucket_bytes=profiles[0].bucket_bytes,
        bucket_ready_s=tuple(med(values) for values in zip(*(p.bucket_ready_s for p in profiles))),
    )


def within_step(profile: StepProfile) -> StepProfile:
    """The profile with its phases scaled down to fit in t(1) when they add up to more (see the
    module docstring); unchanged otherwise."""
    phases = profile.micro_batches * (profile.forward_s + profile.backward_s) + profile.optimizer_s
    scale = min(1.0, profile.step_s / phases)
    return StepProfile(
        step_s=profile.step_s,
        forward_s=scale * profile.forward_s,
        backward_s=scale * profile.backward_s,
        optimizer_s=scale * profile.optimizer_s,
        micro_batches=profile.micro_batches,
        bucket_bytes=profile.bucket_bytes,
        bucket_ready_s=tuple(scale * ready for ready in profile.bucket_ready_s),
    )


def _row(**values: Any) -> dict[str, Any]:
    return {column: values.get(column) for column in SCALING_MODEL_COLUMNS}


def strong_split(global_batch: int, gpus: int, micro_batch_1: int) -> tuple[int, int] | str:
    """(micro-batch per GPU, micro-batches per step) of a global batch G over N GPUs in
    micro-batches of at most the 1-GPU micro-batch m_1, as the planner schedules it
    (common.batch_split.strong_split); or why there is none."""
    try:
        return batch_split.strong_split(global_batch, gpus, micro_batch_1)
    except batch_split.BatchSplitError as error:
        return str(error)


def spread_for(measured: Sequence[Inflation], study: str, gpus: int, is_measured_cell: bool) -> tuple[float, str]:
    """sigma / t of the rank steps for a cell (module docstring, stragglers), and where it comes
    from: a measured cell's from the other cells' windows (held out), else its own (in-sample); a
    count beyond the hardware from every window measured. 0 where no window split the wait out."""
    with_spread = [m for m in measured if m.spread is not None]
    if gpus <= 1:
        return 0.0, "one rank: no wait"
    if not with_spread:
        return 0.0, "no window split measured the wait for the slowest rank: none apart from k"
    cells = lambda group: ", ".join(sorted({f"{m.study} {m.gpus}" for m in group}))  # noqa: E731
    if is_measured_cell:
        others = [m for m in with_spread if (m.study, m.gpus) != (study, gpus)]
        if others:
            return statistics.median(m.spread for m in others), f"held out: the window split of {cells(others)} ({len(others)} runs)"
        return statistics.median(m.spread for m in with_spread), f"in-sample: this cell's own window split ({len(with_spread)} runs)"
    return statistics.median(m.spread for m in with_spread), f"measured in the window split of {cells(with_spread)} ({len(with_spread)} runs)"


def scaling_model_table(
    runs: pd.DataFrame,
    scaling: pd.DataFrame,
    comm_paths: Iterable[str | os.PathLike[str]],
    references_path: str | os.PathLike[str] | None,
    predict_gpus: Sequence[int] = DEFAULT_PREDICT_GPUS,
    predict_cluster: str | None = None,
    record_files: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """scaling_model.csv (module docstring). ``runs``/``scaling`` are the aggregation's tables;
    ``record_files``: each run's record file (readers.read_matrix's, inside the study folder), by
    default the runs' ``record`` as written; the study folder they lie in is where a kept batch
    curve is looked for (``kept_batch_curve``).
    ``predict_cluster``: a preset of ``clusters`` in references.yaml; the counts beyond the
    study's hardware are then predicted on its hierarchical network (``network_model``), with
    its GPUs per node, each beside the back-tested error of its regime (``prediction_error``,
    ``prediction_error_by_regime`` of references.yaml, measured by benchmarks/predict_published.py)."""
    references = load_optional_references(references_path)
    named: ClusterPreset | None = preset(clusters_of(references), predict_cluster) if predict_cluster else None
    # A GPU study that names no preset predicts the counts beyond its node (where it measured no
    # link across nodes) on the preset of its own GPU (an H100 SXM5 on a DGX H100's 8 GPUs a
    # node), never on nodes the size of the machine it ran on: a one-GPU box as eight one-GPU
    # nodes over InfiniBand is a shape nobody has.
    counted = runs[runs["counts"].astype(bool)] if "counts" in runs.columns else runs
    gpu_runs = counted[counted["device_type"].eq("cuda")] if "device_type" in counted.columns else runs.iloc[0:0]
    own, own_why = (None, None)
    if named is None and len(gpu_runs):
        own, own_why = preset_for_gpu(clusters_of(references), gpu_runs.get("device_name", pd.Series(dtype=str)).dropna())
    errors = prediction_error.error_table_of(references)
    fits: dict[int, tuple[RingNetwork, int]] = {}  # GPU count -> (alpha, B fitted, nodes)
    fit_problems = {}
    for path in comm_paths:
        document = read_comm(path)
        try:
            fits[document["world_size"]] = (fit_comm(document, Path(path).name), document["nodes"])
        except ValueError as error:
            fit_problems[document["world_size"]] = str(error)
    links = links_of(references)
    measured_across = any(nodes > 1 for _, nodes in fits.values())  # the study's own inter-node link
    rows = []
    scaled = runs[runs["study"].isin(["strong", "weak"])]
    # (study predicted, model, the runs it comes from, whether it is weak scaling derived from a
    # study of one GPU): a model whose only study ran one GPU is also predicted at its per-GPU
    # batch held at N, the question a one-GPU user has, from that study's one-GPU run
    jobs = [(study, model, cell_runs, False) for (study, model), cell_runs in scaled.groupby(["study", "model"], sort=True)]
    for study, model, cell_runs, _ in list(jobs):
        if study == "strong" and int(cell_runs["gpus"].max()) == 1 and not (scaled["study"].eq("weak") & scaled["model"].eq(model)).any():
            jobs.append(("weak", model, cell_runs, True))
    jobs.sort(key=lambda job: (job[0], job[1]))
    for study, model, cell_runs, derived in jobs:
        source_study = str(cell_runs["study"].iloc[0])
        cells = scaling[scaling["study"].eq(source_study) & scaling["model"].eq(model)].set_index("gpus")
        one = cell_runs[cell_runs["gpus"].eq(1) & cell_runs["counts"]]
        first = cell_runs.drop_duplicates("gpus").set_index("gpus")
        batches = first["per_gpu_batch"]
        accumulation = first["grad_accum_steps"] if "grad_accum_steps" in first else pd.Series(1, index=first.index)
        gpus_per_node = int(cell_runs["gpus_per_node"].iloc[0])
        found = [read_profile((record_files or {}).get(run_id, path)) for run_id, path in zip(one["run_id"], one["record"])]
        profiles = [profile for profile, _ in found if profile is not None]
        base = {"study": study, "model": model}
        if not profiles:
            why = "; ".join(sorted({reason for _, reason in found})) or "no completed 1-GPU run of this study and model"
            for gpus, cell in [] if derived else cells.iterrows():
                rows.append(
                    _row(
                        **base,
                        gpus=gpus,
                        nodes=cell["nodes"],
                        basis="measured",
                        step_time_measured_s=cell["step_time_median_s"],
                        efficiency_measured=cell["efficiency"],
                        per_gpu_batch=batches.get(gpus),
                        note=f"no prediction: {why}",
                    )
                )
            continue
        profile = within_step(median_profile(profiles))
        profile_run = ", ".join(one["run_id"][[p is not None for p, _ in found]])
        micro_1 = int(batches[1])
        statistic = statistic_of(study)
        # the model's one-GPU steps under the profile's conditions, and the batch curve through them
        same = runs["model"].eq(model) & runs["study"].isin(["strong", "weak", "sensitivity"])
        if "precision_recorded" in runs.columns and one["precision_recorded"].notna().any():
            same &= runs["precision_recorded"].eq(one["precision_recorded"].dropna().iloc[0])
        steps_1 = one_gpu_steps(runs[same], statistic)
        single = {m: t for (m, a), t in one_gpu_steps(runs[same]).items() if a == 1}
        curve = BatchCurve.fit(list(single), list(single.values()), f"one-GPU {model} runs, one micro-batch a step")
        curve_why = "one micro-batch measured"
        if curve is None:
            files = [(record_files or {}).get(run_id, path) for run_id, path in zip(one["run_id"], one["record"])]
            curve, curve_why = kept_batch_curve(files, model, one.get("device_name", pd.Series(dtype=str)).dropna())
        fixed_s = profile.other_s + profile.optimizer_s

        def compute_scale_at(micro: int) -> float:
            if micro == micro_1:
                return 1.0
            if curve is not None and curve.covers(micro):
                return curve.compute_scale(micro, micro_1, fixed_s)
            return micro / micro_1

        def profile_step(micro: int, accum: int) -> float:
            """The profile's own step without communication at (c, A)."""
            return simulate_step(profile, RingNetwork(1, 0.0, math.inf, "one GPU"), compute_scale_at(micro), accum).step_s

        # the profile in the statistic the study's efficiency is in: a one-GPU step at (m, A),
        # measured where the study ran it, else the profile's own step scaled to the statistic
        in_statistic = steps_1.get((micro_1, profile.micro_batches), profile.step_s) / profile.step_s

        def step_1_at(micro: int, accum: int) -> float:
            return steps_1.get((micro, accum)) or in_statistic * profile_step(micro, accum)

        reference_step = step_1_at(micro_1, profile.micro_batches)  # t(1): every efficiency's numerator
        measured_inflation = []
        for _, run in runs[runs["model"].eq(model) & runs["study"].isin(["strong", "weak"]) & runs["gpus"].gt(1)].iterrows():
            step = rank_step(run, statistic)
            if step is None or not bool(run["counts"]):
                continue
            key = (int(run["per_gpu_batch"]), int(run.get("grad_accum_steps", 1) or 1))
            uninflated = profile_step(*key)
            step_1 = step_1_at(*key)  # t_1(m_N, A_N)
            occupancy = min(int(run["gpus"]), int(run["gpus_per_node"]))
            # s: the bandwidth at which the replay, its compute at this run's own k, exposes what
            # the run measured exposed, on the benchmark at this count
            share = None
            if step.exposed_s is not None and int(run["gpus"]) in fits:
                share = bandwidth_share(
                    inflated(profile, step.nosync_s / uninflated), fits[int(run["gpus"])][0], step.exposed_s, compute_scale_at(key[0]), key[1]
                )
            # k: the typical rank's compute where the window splits out the wait for the slowest
            # (that wait then grows with N, the spread sigma / t), else the probe's step that holds it
            spread = straggler_spread(step.straggler_s, int(run["gpus"]), step.compute_s) if step.straggler_s is not None else None
            measured_inflation.append(Inflation(str(run["study"]), int(run["gpus"]), occupancy, step.compute_s / step_1, share, step.measured_in, spread))
        # the strong study's global batch G, the same at every N (the 1-GPU cell's, for matrices
        # from before it was: there G was the 1-GPU per-GPU batch)
        global_batch = int(first.loc[1, "global_batch"]) if study == "strong" else None
        measured_max = max(cells.index)
        targets = [] if derived else [(g, "measured") for g in cells.index]
        targets += [(g, "predicted") for g in sorted(set(predict_gpus)) if g > measured_max]
        for gpus, basis in targets:
            cell = cells.loc[gpus] if basis == "measured" else None
            beyond_node = basis == "predicted" and gpus > gpus_per_node and not measured_across
            cluster = (named or (own if beyond_node else None)) if basis == "predicted" else None
            cluster_basis = "scaling.predict_cluster" if named is not None else own_why
            on_cluster = cluster is not None
            if beyond_node and named is None and own is None and len(gpu_runs) and gpus_per_node == 1:
                rows.append(
                    _row(
                        **base,
                        gpus=gpus,
                        basis=basis,
                        note=f"no prediction beyond the one-GPU node the study ran on: "
                        f"{own_why}; name a preset as scaling.predict_cluster (clusters in config/references.yaml)",
                    )
                )
                continue
            node_size = cluster.gpus_per_node if on_cluster else gpus_per_node
            nodes = cell["nodes"] if cell is not None else -(-gpus // node_size)
            row = _row(
                **base,
                gpus=gpus,
                nodes=nodes,
                basis=basis,
                buckets=len(profile.bucket_bytes),
                gradient_bytes=sum(profile.bucket_bytes),
                profile_run=profile_run,
                global_batch=global_batch if study == "strong" else None,
                step_time_measured_s=None if cell is None else cell["step_time_median_s"],
                efficiency_measured=None if cell is None else cell["efficiency"],
                note="",
            )
            # m_N and A_N: the matrix's where measured; beyond it G / N (strong) or m_1, A_1 (weak)
            if basis == "measured":
                split: tuple[int, int] | str = (int(batches[gpus]), int(accumulation.get(gpus, 1)))
            elif study == "strong":
                split = strong_split(global_batch, gpus, micro_1)
            else:
                split = (micro_1, profile.micro_batches)
            if isinstance(split, str):
                row["note"] = f"no prediction: {split}"
                rows.append(row)
                continue
            micro, accum = split
            compute_scale = compute_scale_at(micro)  # c = m_N / m_1, or through the batch curve
            on_curve = micro != micro_1 and curve is not None and curve.covers(micro)
            occupancy = min(gpus, node_size)
            k, k_basis = inflation_for(measured_inflation, study, gpus, occupancy, basis == "measured")
            spread, spread_basis = spread_for(measured_inflation, study, gpus, basis == "measured")
            uninflated = profile_step(micro, accum)
            step_1 = step_1_at(micro, accum)  # t_1(m_N, A_N)
            # K: every phase scaled so that the step without communication is k t_1(m_N, A_N)
            factor = k * step_1 / uninflated
            straggler_s = straggler_wait_s(spread, gpus, k * step_1)  # W(N) = sigma e_N
            if on_curve:
                curve_text = curve.describe()
            elif micro != micro_1:
                why = f"m = {micro} outside the curve's {curve.describe()}" if curve is not None else curve_why
                curve_text, row["bound"] = f"proportional: {why}", PROPORTIONAL_BOUND
            else:  # the one-GPU run's own micro-batch: no curve is needed
                curve_text = curve.describe() if curve is not None else f"none needed at the one-GPU micro-batch ({curve_why})"
            row.update(
                per_gpu_batch=micro,
                grad_accum_steps=accum,
                compute_scale=compute_scale,
                compute_inflation=k + straggler_s / step_1,
                inflation_basis=k_basis,
                batch_curve=curve_text,
                straggler_basis=(
                    f"{spread_basis}; sigma / t = {spread:.3g}, W({gpus}) = sigma x e_{gpus} = {expected_max_normal(gpus):.3f} "
                    "sigma (a normal fitted to the mean wait: the record keeps no per-step times)"
                )
                if spread
                else spread_basis,
            )
            network: AllReduceNetwork
            own_link = False  # a link the study's all-reduce benchmark measured (not references.yaml's)
            try:
                if gpus == 1:
                    network = RingNetwork(1, 0.0, math.inf, "one GPU: no all-reduce")
                elif basis == "measured":
                    if gpus not in fits:
                        raise ValueError(fit_problems.get(gpus, f"no all-reduce benchmark at {gpus} GPUs (results/comm/g{gpus}.json)"))
                    network, own_link = fits[gpus][0], True
                elif on_cluster:
                    network = cluster.network(gpus)
                else:
                    measured = measured_network(fits, gpus, gpus_per_node)
                    network, own_link = (measured, True) if measured is not None else (config_network(links, gpus, gpus_per_node), False)
            except ValueError as error:
                row["note"] = f"no prediction: {error}"
                rows.append(row)
                continue
            if own_link:
                # the all-reduce under load: the benchmark measured it alone, the step runs it
                # beside the backward (on a CPU, on the same cores)
                share, share_basis = inflation_for(measured_inflation, study, gpus, occupancy, basis == "measured", "bandwidth_share")
                network = RingNetwork(
                    gpus,
                    network.alpha_step_s,
                    share * network.link_bytes_per_s,
                    f"{network.source}; B under load {share:.3g} x the benchmark's ({share_basis})",
                )
            prediction = simulate_step(inflated(profile, factor), network, compute_scale, accum)
            step_n = prediction.step_s + straggler_s  # the last bucket waits for the slowest rank's backward
            # What the loss of efficiency is lost to: ideal is t(1) / N (strong) or t(1) (weak);
            # t(N) - ideal = the all-reduce left exposed + what inflation adds to the compute,
            # (k - 1) t_1(m_N, A_N) + the wait for the slowest rank W(N) + the per-step cost that
            # does not shrink with the batch, (other + o)(1 - 1/N) strong, nothing weak
            ideal = reference_step / gpus if study == "strong" else reference_step
            inflation_s = (k - 1) * step_1
            row.update(
                fixed_step_s=fixed_s,
                loss_exposed_comm=prediction.exposed_comm_s / step_n,
                loss_compute_inflation=inflation_s / step_n,
                loss_straggler=straggler_s / step_n,
                loss_fixed_cost=max(step_n - ideal - prediction.exposed_comm_s - inflation_s - straggler_s, 0.0) / step_n,
            )
            row.update(
                network=network.source,
                # one alpha and B for a flat ring; a cluster's two levels are in ``network``
                alpha_step_us=network.alpha_step_s * 1e6 if isinstance(network, RingNetwork) else None,
                link_gbps=network.link_bytes_per_s / 1e9 if isinstance(network, RingNetwork) and math.isfinite(network.link_bytes_per_s) else None,
                allreduce_s=prediction.allreduce_s,
                exposed_comm_s=prediction.exposed_comm_s,
                step_time_predicted_s=step_n,
                efficiency_predicted=predicted_efficiency(study, reference_step, step_n, gpus),
            )
            if row["step_time_measured_s"] is not None and not pd.isna(row["step_time_measured_s"]):
                # the prediction's error beside the measured cell
                row["step_time_error"] = step_n / row["step_time_measured_s"] - 1  # predicted / measured - 1
            if row["efficiency_measured"] is not None and not pd.isna(row["efficiency_measured"]):
                row["efficiency_error"] = row["efficiency_predicted"] - row["efficiency_measured"]  # predicted - measured
            if basis == "predicted":
                row["note"] = f"prediction only: beyond the {measured_max:g} GPU{'' if measured_max == 1 else 's'} the study ran on"
                if derived:
                    row["note"] += (
                        f"; weak scaling at the one-GPU run's per-GPU batch ({micro_1}) held at every count, from the {source_study} study's one-GPU step"
                    )
                if row["bound"]:
                    row["note"] += f"; {PROPORTIONAL_BOUND}: the efficiency is at most this"
            if on_cluster:
                # the back-tested error of the row's own regime, or none: an error measured on another
                # regime is no error bar of this one
                regime = prediction_error.regime_of("ddp", int(nodes), micro, micro_1, curve.knee if on_curve else None)
                row.update(prediction_error.error_columns(regime, errors))
                row["cluster"] = cluster.key
                row["cluster_basis"] = cluster_basis
                row["note"] += f"; on {cluster.name}; " + (
                    f"the model's typical error in its regime ({regime.key}) is ±{row['typical_error']:.1%}: {row['error_basis']}"
                    if row["typical_error"] is not None
                    else f"no typical error: {prediction_error.NO_BACK_TEST} ({regime.key})"
                )
            elif basis == "predicted":
                row["error_basis"] = (
                    f"{prediction_error.NO_BACK_TEST}: the back-test ran on NCCL clusters' published series; this row replays the study's own links"
                )
            rows.append(row)
    table = pd.DataFrame(rows, columns=SCALING_MODEL_COLUMNS)
    return table.sort_values(["study", "model", "gpus"], kind="stable", ignore_index=True)
