"""The alpha-beta scaling model's arithmetic: the ring all-reduce fitted to the all-reduce
benchmark, a one-GPU step replayed at N GPUs with its all-reduces overlapping the backward, and
what running N ranks together costs (compute inflation, the wait for the slowest rank, bandwidth
under load). ``model_inputs`` reads what it needs from the records; ``scaling_model`` writes the
table; ``published_steps`` holds the FSDP step and the fit to a published step.

Network (ring all-reduce: a reduce-scatter and an all-gather, 2(N-1) steps of S/N bytes over the
ring's slowest link):

    t_ring(S, N) = 2(N-1) alpha + 2(N-1)/N * S / B

fitted to the benchmark's median times by least squares on the relative error, because the sizes
span orders of magnitude and absolute errors would ignore the small messages that determine alpha
(B is then the measured bus bandwidth). Beyond the study's hardware alpha and B come from the fit on
the same kind of link (within one node, across nodes), else from ``links`` in
config/references.yaml at line rate x the link's efficiency (an all-reduce stays below line rate).

Step (all-reduces in bucket order on one stream, each starting when its bucket is ready and the
previous one is done; only the last micro-batch all-reduces, DDP's no_sync):

    e_0 = 0;  e_k = max(c r_k, e_(k-1)) + t_ring(S_k, N)          end of bucket k's all-reduce
    other = t(1) - (A_1 (f + b) + o)                               data wait and loop overhead
    t(N) = other + A_N c f + (A_N - 1) c b + max(c b, e_last) + o

f, b, o: forward, backward, optimizer of one micro-batch; A: micro-batches a step; S_k, r_k: bucket
k's bytes and ready time; c: the compute scale of the micro-batch at N against the one-GPU one,
through the batch curve t(m) = a + b m where one covers it (``BatchCurve``: the fixed per-step cost,
other + o, does not shrink with the batch), else proportional to the micro-batch (an upper bound on
the efficiency: a small batch's fixed cost is unknown).

Compute inflation. Ranks that share a node slow each other (memory bandwidth, caches, clocks under a
cap, cores shared with the launcher), so the step they compute is not the one-GPU step:
k = t_compute(N) / t_1(m_N, A_N), from the multi-rank runs' windows (or their no-sync probe), in
the statistic the cell's efficiency is in (``statistic_of``: a strong cell's E from mean steps, a
weak cell's from median steps). k is a property of the occupancy (ranks a node): a cell takes the
median k of the *other* cells at its occupancy (held out: its own measurement is not its input),
its own only where no other cell has it, and a count beyond the node the fullest occupancy's.

Stragglers. At every all-reduce the ranks wait for the slowest: W(N) = E[max of N rank steps] -
their mean. The record keeps the window's mean wait, not per-rank times, so a normal of spread
sigma is fitted (the one parameter a mean wait identifies); its expected maximum grows as e_N
(``expected_max_normal``, about sqrt(2 ln N)), a lower bound where rank steps have a heavy tail:

    sigma / t = W(N_measured) / (e_N_measured t_compute),   W(N) = (sigma / t) e_N k t_1(m_N, A_N)

Bandwidth under load. The benchmark times the all-reduce alone; in the step it runs beside the
backward (on a CPU, on the very cores), and is slower: the share s of B at which the replay exposes
what a run measured exposed (``bandwidth_share``), chosen as k is, applies to the study's own links.

Efficiency, by the study's definitions (``aggregate``), t(N) = replayed step + W(N):

    strong (global batch fixed)      E(N) = t(1) / (N t(N))
    weak (per-GPU batch, data fixed) E(N) = t(1) / t(N)

What it leaves out: contention between the all-reduce and the backward on one GPU, DDP's copies
into and out of the buckets, and a data loader that slows at N ranks (k holds the rest of the
contention as the runs measured it). This module never imports torch.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from scalerepro.analysis.tables import prediction_error
from scalerepro.analysis.tables.network_model import Link
from scalerepro.analysis.tables.readers import read_comm

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


def spread_for(measured: Sequence[Inflation], study: str, gpus: int, is_measured_cell: bool) -> tuple[float, str]:
    """sigma / t of the rank steps for a cell (module docstring, stragglers), and where it comes
    from: a measured cell's from the other cells' windows (held out), else its own (in-sample); a
    count beyond the hardware from every window measured. 0 where no window split the wait out."""
    with_spread = [(m, m.spread) for m in measured if m.spread is not None]
    if gpus <= 1:
        return 0.0, "one rank: no wait"
    if not with_spread:
        return 0.0, "no window split measured the wait for the slowest rank: none apart from k"

    def cells(group: Sequence[tuple[Inflation, float]]) -> str:
        return ", ".join(sorted({f"{m.study} {m.gpus}" for m, _ in group}))

    if is_measured_cell:
        others = [(m, spread) for m, spread in with_spread if (m.study, m.gpus) != (study, gpus)]
        if others:
            return statistics.median(spread for _, spread in others), f"held out: the window split of {cells(others)} ({len(others)} runs)"
        return statistics.median(spread for _, spread in with_spread), f"in-sample: this cell's own window split ({len(with_spread)} runs)"
    return statistics.median(spread for _, spread in with_spread), f"measured in the window split of {cells(with_spread)} ({len(with_spread)} runs)"
