"""The step of a transformer trained under 3D parallelism (Megatron-LM's layout): tensor parallel
(TP, t GPUs within a node), context parallel (CP, c), pipeline parallel (PP, p stages, each of v
virtual stages, "interleaved"), and data parallel with a distributed optimizer over the rest
(d = N / (t c p)); from one fitted compute rate and the cluster's links, for the back-test of
published 3D series (benchmarks/predict_published.py).

Megatron orders ranks t fastest, then c, then d, then p: a TP group is t neighbouring GPUs of one
node; a data-parallel group holds one GPU of every g / (t c) of a node's GPUs (g GPUs a node), so
it spans d t c / g nodes with g / (t c) GPUs (and NICs) on each; neighbouring pipeline stages sit
on different nodes once t c d >= g.

A step of global batch B sequences of s tokens: every pipeline runs m = B / (d b) micro-batches of
b sequences. W is the compute of one token (forward and backward of the whole model) on one GPU,
fitted to a published step; each GPU's share of a micro-batch is t_mb = W b s / (t c p), the
step's compute C = m t_mb = W B s / N. The terms, each on the critical path of one pipeline:

- Compute: C.
- Pipeline bubble (Narayanan et al., SC21, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", section 2.2: the interleaved 1F1B schedule's bubble is (p-1)/(v m)
  of the ideal compute):  bubble = (p-1) / (v m) x C.
- Tensor parallel (Shoeybi et al. 2019, Megatron-LM section 3: two all-reduces of the activations
  a layer in the forward, two in the backward; with sequence parallelism, Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", section 4.2.2, each all-reduce
  becomes a reduce-scatter and an all-gather of the same bytes, the same time on a ring): per layer
  and micro-batch 4 all-reduces of b (s / c) h x 2 bytes (bf16) over the TP group's NVLink. With
  Megatron's TP overlap (``--tp-comm-overlap``: the collectives run in chunks beside the layer's
  GEMMs) only what exceeds the layer's compute shows: max(0, t_tp - t_layer), t_layer = t_mb p / L;
  without it all of t_tp does. Either way x m L / p a step.
- Context parallel (ring attention as Megatron-Core/Transformer Engine run it): per layer and
  micro-batch the K and V chunks of b (s / c) h_kv / t bf16 elements each go round the ring of c
  ranks, (c-1) sends in the forward and twice that in the backward (K and V, then dK and dV),
  overlapped with the attention: max(0, t_cp - t_layer) shows, x m L / p a step.
- Pipeline sends (Narayanan et al. SC21, section 4.1, scatter/gather: each TP rank sends 1/t of
  the activation b (s / c) h x 2 bytes): the steady state's sends overlap compute
  (``overlap_p2p_comm``); the 2(p-1) sends of the fill and the drain are on the critical path,
  each alpha + bytes / B over the network (NVLink while t c d < g).
- Data parallel, distributed optimizer (Megatron's ``--use-distributed-optimizer``
  ``--overlap-grad-reduce --overlap-param-gather``): each stage's P / (t p) parameters in v chunks
  (one a virtual stage); chunk k's gradients are reduce-scattered over the data-parallel group
  once its last micro-batch's backward is done, and its parameters all-gathered before its first
  forward. In the interleaved schedule's drain the last backwards of the v chunks end p micro-
  batch-chunk backwards apart (b_c = t_mb x 2/3 / v, the backward being twice the forward), so
  with the reduce-scatters queued on one stream

      e_0 = rs,  e_k = max(k p b_c, e_(k-1)) + rs          rs = reduce-scatter(P / (t p v) x 2 bytes)
      exposed_rs = e_(v-1) - (v-1) p b_c

  and the all-gathers mirror them at the fill. What the schedule hides the share x of what it
  leaves (a fitted term, as the straggler spread of the DDP and FSDP back-test: 0 where nothing
  is fitted; 1 when the data-parallel collectives show whole):

      dp = exposed + x (v (rs + ag) - exposed)

  Two older schedules, as Megatron-LM's SC21 runs had them (``Layout.dp_schedule``): "overlapped"
  (PyTorch DDP, ``--DDP-impl torch``: gradients all-reduced in 25 MB buckets as the last micro-
  batch's backward produces them, the last bucket's showing at least) and "after_backward"
  (``--DDP-impl local``: one all-reduce of all the stage's gradients after the last backward,
  nothing hidden). Neither has a fitted share: the source states what overlaps.
- Optimizer: each GPU's 1 / (t p d) of the parameters at its memory traffic over HBM.

    t(step) = C + bubble + m L / p (tp_exposed + cp_exposed) + 2(p-1) p2p + dp + optimizer

With full activation recomputation (``Layout.recompute``) the forward runs twice, so a layer's
TP collectives are 6, not 4, a micro-batch.

W across models (a weak-scaling series, one model a row: ``token_compute_s``). Per token and
layer a GPU does its matmuls and moves its activations through HBM:

    W = F / R + kappa x L t c x A(t) / HBM

- F, the matmul FLOPs of a token (Narayanan et al. SC21, section 5.1, the count their Table 1's
  teraFLOP/s rest on): 72 L h^2 (1 + s / 6h + V / 12 L h) for forward and backward, 96 L h^2
  (1 + s / 6h + V / 16 L h) with the forward recomputed.
- A(t), the activation bytes a token leaves a layer on one GPU (Korthikanti et al. 2022, section
  4.1, fp16: s b h (34 + 5 a s / h) a layer; under TP without sequence parallelism the layer norms'
  and dropouts' 10 s b h stay whole on each GPU, s b h (10 + 24 / t + 5 a s / (h t)); with it all
  of it splits t ways), the memory-bound operations' traffic, to first order.
- R, the matmuls' achieved rate, fitted to the series' given row; kappa, the bytes moved per byte
  of activation, fitted on its fit rows. The ratio of the two terms is what makes a wider layer
  more efficient (the matmuls grow with h^2, the traffic with h and a s).

Left out: the embedding and the head outside the stages' layers, the pipeline's uneven first and
last stages, NVLink SHARP and in-network reductions, and congestion between the data-parallel
rings of the p stages sharing the NICs (each GPU has its own NIC on the presets). This module is
on the analysis side: it never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from scalerepro.analysis.tables.network_model import ClusterPreset, HierarchicalNetwork

ACTIVATION_BYTES = 2  # bf16 activations: the TP collectives', CP's and the pipeline's sends
DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb (the "overlapped" schedule)

DpSchedule = Literal["distributed_optimizer", "overlapped", "after_backward"]


@dataclass(frozen=True)
class Transformer:
    """What the step needs of the model: its parameters, layers, hidden size, the hidden size
    of K (and of V) under grouped-query attention, and the bytes of its data-parallel traffic."""

    parameters: int
    layers: int  # L
    hidden: int  # h
    kv_hidden: int  # h_kv: h without grouped-query attention
    grad_bytes: int = 2  # the reduce-scattered gradients' dtype (bf16)
    param_bytes: int = 2  # the all-gathered parameters' dtype (bf16)
    optimizer_bytes_per_parameter: int = 28  # AdamW's traffic (benchmarks/predict_published.py)
    heads: int = 0  # a: attention heads (only ``token_compute_s`` needs them)
    vocab: int = 0  # V: the vocabulary (only ``token_compute_s`` needs it)


@dataclass(frozen=True)
class Layout:
    """A 3D-parallel job: N GPUs as t x c x p x d, micro-batch b, global batch B of s tokens."""

    gpus: int  # N
    tp: int  # t
    pp: int  # p
    vp: int  # v: virtual stages (model chunks) per pipeline stage; 1 without interleaving
    micro_batch: int  # b
    global_batch: int  # B, sequences
    seq_len: int  # s
    cp: int = 1  # c
    sequence_parallel: bool = True
    tp_overlap: bool = True
    recompute: bool = False  # full activation recomputation: the forward runs twice
    dp_schedule: DpSchedule = "distributed_optimizer"

    @property
    def dp(self) -> int:
        """d = N / (t c p), refused where the layout does not divide the GPUs."""
        model = self.tp * self.cp * self.pp
        if self.gpus % model:
            raise ValueError(f"{self.gpus} GPUs are not a whole number of TP {self.tp} x CP {self.cp} x PP {self.pp} groups")
        return self.gpus // model

    @property
    def micro_batches(self) -> int:
        """m = B / (d b), refused where the global batch does not split."""
        share = self.dp * self.micro_batch
        if self.global_batch % share:
            raise ValueError(f"global batch {self.global_batch} does not split into micro-batches of {self.micro_batch} over {self.dp} data-parallel ranks")
        return self.global_batch // share

    def describe(self) -> str:
        return f"TP {self.tp} PP {self.pp} VP {self.vp} CP {self.cp} DP {self.dp}, micro-batch {self.micro_batch}, m {self.micro_batches}"


@dataclass(frozen=True)
class ParallelStep:
    """The terms of one step (module docstring), seconds."""

    compute_s: float
    bubble_s: float
    tp_exposed_s: float
    cp_exposed_s: float
    p2p_s: float
    dp_exposed_s: float
    dp_total_s: float  # v (rs + ag): the data-parallel collectives end to end
    optimizer_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.bubble_s + self.tp_exposed_s + self.cp_exposed_s + self.p2p_s + self.dp_exposed_s + self.optimizer_s


def _p2p_s(preset: ClusterPreset, size_bytes: float, across_nodes: bool) -> float:
    """One point-to-point send: alpha + bytes / B over the link it crosses."""
    link = preset.inter if across_nodes else preset.intra
    return link.hop_latency_s + size_bytes / (link.bandwidth_bytes_per_s * link.efficiency)


def tp_network(preset: ClusterPreset, layout: Layout) -> HierarchicalNetwork:
    """The TP group: t GPUs of one node over NVLink."""
    if layout.tp > preset.gpus_per_node:
        raise ValueError(f"TP {layout.tp} is more than a node's {preset.gpus_per_node} GPUs")
    return preset.network(layout.tp)


def dp_network(preset: ClusterPreset, layout: Layout) -> HierarchicalNetwork:
    """A data-parallel group: d GPUs, g / (t c) of them (each with its NIC) on each of d t c / g
    nodes (module docstring); within one node while d t c <= g."""
    model = layout.tp * layout.cp
    per_node = max(1, preset.gpus_per_node // model)
    if layout.dp <= per_node:
        return replace(preset.network(layout.dp), gpus_per_node=layout.dp, nodes=1)
    network = preset.network(layout.dp * model)
    return replace(network, gpus_per_node=per_node, nodes=layout.dp // per_node)


def queued_exposure(transfer_s: float, chunks: int, spacing_s: float) -> float:
    """The last of ``chunks`` equal transfers queued on one stream, chunk k ready k x spacing
    after the first: e_0 = transfer, e_k = max(k spacing, e_(k-1)) + transfer; what shows past the
    last chunk's ready time, e_(chunks-1) - (chunks-1) spacing."""
    end = 0.0
    for k in range(chunks):
        end = max(k * spacing_s, end) + transfer_s
    return end - (chunks - 1) * spacing_s


def simulate_parallel_step(
    model: Transformer,
    layout: Layout,
    preset: ClusterPreset,
    token_compute_s: float,
    hbm_bytes_per_s: float,
    dp_exposed_share: float = 0.0,
) -> ParallelStep:
    """t(step) of the module docstring, ``token_compute_s`` = W, the compute of one token on one GPU."""
    t, c, p, v, b, s = layout.tp, layout.cp, layout.pp, layout.vp, layout.micro_batch, layout.seq_len
    m, d, g = layout.micro_batches, layout.dp, preset.gpus_per_node
    layers_per_stage = model.layers / p
    t_mb = token_compute_s * b * s / (t * c * p)
    t_layer = t_mb / layers_per_stage
    compute = m * t_mb
    bubble = bubble_fraction(p, v, m) * compute
    activation = b * (s / c) * model.hidden * ACTIVATION_BYTES
    tp_layer = 0.0
    if t > 1:
        network = tp_network(preset, layout)
        # sequence parallelism: a reduce-scatter and an all-gather in place of each all-reduce
        one = network.reduce_scatter_s(activation) + network.all_gather_s(activation) if layout.sequence_parallel else network.allreduce_s(activation)
        tp_layer = (6 if layout.recompute else 4) * one
    tp_exposed = max(0.0, tp_layer - t_layer) if layout.tp_overlap else tp_layer
    cp_layer = 0.0
    if c > 1:
        kv_chunk = b * (s / c) * model.kv_hidden / t * ACTIVATION_BYTES
        cp_layer = 3 * (c - 1) * _p2p_s(preset, 2 * kv_chunk, across_nodes=t * c > g)
    cp_exposed = max(0.0, cp_layer - t_layer)
    p2p = 2 * (p - 1) * _p2p_s(preset, activation / t, across_nodes=t * c * d >= g) if p > 1 else 0.0
    dp_total = exposed = 0.0
    if d > 1 and layout.dp_schedule == "distributed_optimizer":
        network = dp_network(preset, layout)
        chunk = model.parameters / (t * p * v)
        rs = network.reduce_scatter_s(chunk * model.grad_bytes)
        ag = network.all_gather_s(chunk * model.param_bytes)
        spacing = p * t_mb * (2 / 3) / v  # p micro-batch-chunk backwards (forward : backward = 1 : 2)
        exposed = queued_exposure(rs, v, spacing) + queued_exposure(ag, v, p * t_mb / 3 / v)
        dp_total = v * (rs + ag)
        exposed += dp_exposed_share * (dp_total - exposed)
    elif d > 1:
        network = dp_network(preset, layout)
        gradients = model.parameters / (t * p) * model.grad_bytes
        dp_total = network.allreduce_s(gradients)
        if layout.dp_schedule == "after_backward":
            exposed = dp_total
        else:  # the buckets, each ready as the last micro-batch's backward (2/3 of t_mb) reaches it
            buckets = max(1, round(gradients / DDP_BUCKET_BYTES))
            exposed = queued_exposure(network.allreduce_s(gradients / buckets), buckets, t_mb * (2 / 3) / buckets)
    dp_exposed = exposed
    optimizer = model.parameters / (t * p * d) * model.optimizer_bytes_per_parameter / hbm_bytes_per_s
    per_step = m * layers_per_stage
    return ParallelStep(compute, bubble, per_step * tp_exposed, per_step * cp_exposed, p2p, dp_exposed, dp_total, optimizer)


def matmul_flops_per_token(model: Transformer, seq_len: int, recompute: bool) -> float:
    """F of the module docstring (Narayanan et al. SC21, section 5.1): 72 L h^2 (1 + s / 6h + V /
    12 L h), or 96 L h^2 (1 + s / 6h + V / 16 L h) with the forward recomputed."""
    layers, h = model.layers, model.hidden
    if recompute:
        return 96 * layers * h**2 * (1 + seq_len / (6 * h) + model.vocab / (16 * layers * h))
    return 72 * layers * h**2 * (1 + seq_len / (6 * h) + model.vocab / (12 * layers * h))


def activation_bytes_per_token(model: Transformer, layout: Layout) -> float:
    """A(t) of the module docstring, one layer on one GPU (Korthikanti et al. 2022, section 4.1):
    h (34 + 5 a s / h) / t with sequence parallelism, h (10 + 24 / t) + 5 a s / t without."""
    if model.heads <= 0:
        raise ValueError("the model's attention heads are not stated: A(t) needs them")
    h, t, attention = model.hidden, layout.tp, 5 * model.heads * layout.seq_len
    if layout.sequence_parallel:
        return (34 * h + attention) / t
    return h * (10 + 24 / t) + attention / t


@dataclass(frozen=True)
class ComputeRate:
    """What W is made of across models: the matmuls' achieved FLOP/s (R), the bytes moved per
    activation byte (kappa) and the memory's bytes/s."""

    matmul_flops_per_s: float
    traffic_per_activation_byte: float
    hbm_bytes_per_s: float


def _traffic_s(model: Transformer, layout: Layout, rate: ComputeRate) -> float:
    """kappa L t c A(t) / HBM: W's memory-bound part."""
    bytes_moved = rate.traffic_per_activation_byte * model.layers * layout.tp * layout.cp * activation_bytes_per_token(model, layout)
    return bytes_moved / rate.hbm_bytes_per_s


def token_compute_s(model: Transformer, layout: Layout, rate: ComputeRate) -> float:
    """W = F / R + kappa L t c A(t) / HBM (module docstring): t_mb = W b s / (t c p) at ``layout``."""
    return matmul_flops_per_token(model, layout.seq_len, layout.recompute) / rate.matmul_flops_per_s + _traffic_s(model, layout, rate)


def fit_matmul_rate(
    model: Transformer, layout: Layout, preset: ClusterPreset, step_s: float, traffic_per_activation_byte: float, hbm_bytes_per_s: float
) -> ComputeRate:
    """R such that the step at ``layout`` is ``step_s`` with the given kappa; refused where the
    traffic alone takes longer than the fitted W."""
    w = fit_token_compute(model, layout, preset, step_s, hbm_bytes_per_s)
    rate = ComputeRate(1.0, traffic_per_activation_byte, hbm_bytes_per_s)
    matmuls = w - _traffic_s(model, layout, rate)
    if matmuls <= 0:
        raise ValueError(f"kappa {traffic_per_activation_byte:g}: the memory traffic alone exceeds the step's compute at {layout.describe()}")
    return replace(rate, matmul_flops_per_s=matmul_flops_per_token(model, layout.seq_len, layout.recompute) / matmuls)


def tokens_per_s_per_gpu(layout: Layout, step_s: float) -> float:
    """B s / (N t(step))."""
    return layout.global_batch * layout.seq_len / (layout.gpus * step_s)


def fit_token_compute(model: Transformer, layout: Layout, preset: ClusterPreset, step_s: float, hbm_bytes_per_s: float, dp_exposed_share: float = 0.0) -> float:
    """W such that the step at ``layout`` is ``step_s`` (bisection: the step grows with W)."""

    def step(w: float) -> float:
        return simulate_parallel_step(model, layout, preset, w, hbm_bytes_per_s, dp_exposed_share).step_s

    low, high = 0.0, step_s * layout.gpus / (layout.global_batch * layout.seq_len)  # W with nothing but compute
    if step(low) >= step_s:
        raise ValueError(f"the step {step_s:.4g} s is shorter than its communication alone at {layout.describe()}")
    while step(high) < step_s:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if step(middle) < step_s else (low, middle)
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


def bubble_fraction(pp: int, vp: int, micro_batches: int) -> float:
    """(p-1) / (v m): the interleaved schedule's bubble against the ideal compute (SC21)."""
    return (pp - 1) / (vp * micro_batches)
