"""The scaling model for published steps, which only benchmarks/predict_published.py back-tests:
the step under FSDP (``simulate_fsdp_step``) beside DDP's (``step_model.simulate_step``), and a
profile's compute scaled so that the model gives a published step back (``fit_compute_to_step``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from scalerepro.analysis.tables.step_model import StepPrediction, StepProfile


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
    changes: dict[str, Any] = {"forward_s": scale * profile.forward_s, "backward_s": scale * profile.backward_s}
    if isinstance(profile, StepProfile):
        changes["bucket_ready_s"] = tuple(scale * ready for ready in profile.bucket_ready_s)
    changes["step_s"] = profile.micro_batches * (changes["forward_s"] + changes["backward_s"]) + profile.optimizer_s
    return replace(profile, **changes)


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
