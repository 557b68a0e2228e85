"""Beyond data parallel: the one place that turns a model and a DeviceMesh into its parallel form.

``--parallel`` picks the strategy (PyTorch native only, no DeepSpeed or Megatron):

* ``ddp`` (the default): DistributedDataParallel, set up by the trainer as before; nothing here.
* ``fsdp``: FSDP2 (``fully_shard``) on every transformer block, then on the root, over a 1-D
  mesh ("dp",). ``--reshard-after-forward`` frees the gathered parameters after each block's
  forward and gathers them again for its backward (ZeRO-3-like); ``--no-reshard-after-forward``
  keeps them from forward to backward (ZeRO-2-like: more memory, one all-gather less per block).
  Under ``--precision bf16`` the policy is MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32): compute and all-gather in bf16, gradients reduce-scattered in fp32.
* ``tp``: tensor parallel over a 1-D mesh ("tp",) of all ranks, inside each transformer block,
  the Megatron/torchtitan plan: column-parallel q, k, v and MLP up (and gate) projections,
  row-parallel attention output and MLP down projections, sequence-parallel LayerNorms (the
  residual stream between the sublayers is sharded along the sequence).
* ``fsdp+tp``: a 2-D mesh ("dp", "tp"); TP over the inner ``--tp-size`` ranks (consecutive
  ranks: one node under the launchers, whose ranks are numbered node by node), FSDP over "dp".
* ``pp``: pipeline parallel (``torch.distributed.pipelining``): the blocks are split into
  ``world_size`` contiguous stages, one per rank, run with the GPipe or 1F1B schedule over
  ``--microbatches`` micro-batches.

Why GPT gets tensor parallelism through split q, k, v projections: GPT's attention computes
q, k and v with ONE fused Linear of 3C outputs laid out (q | k | v). ColwiseParallel splits a
weight's output rows into contiguous chunks, so on 2 ranks rank 0 would get all of q and half of
k, rank 1 the rest: every rank would pair the wrong queries with the wrong keys. Under TP (only)
each block's fused ``qkv`` is therefore replaced by three Linears ``wq``, ``wk``, ``wv`` (its
rows, copied exactly: the same function), each column-parallel, so every rank holds whole heads
of q, k and v (``HeadParallelAttention``). The parameter names of a TP model differ from GPT's
(``attention.qkv`` -> ``attention.wq/wk/wv``); ``fuse_qkv`` maps a full state dict back. A
decoder written with separate projections (torchtitan's names) needs no such change.

The Llama decoder (``models/llama.py``, torchtitan's names: ``layers``, ``attention.wq/wk/wv/wo``,
``feed_forward.w1/w2/w3``, ``attention_norm``, ``ffn_norm``) gets torchtitan's block plan as it
is: its attention reads the head counts from the local shapes, so no re-layout is needed.

The embeddings and the LM head stay replicated over "tp" (GPT and llama_1b tie them: a
row-sharded embedding and a column-sharded head cannot share one table): every TP rank computes them in full, the first block slices the sequence
(no communication) and the final norm's output is gathered back.

``--activation-checkpointing``: ``full`` recomputes every block in backward
(``checkpoint_wrapper``, non-reentrant); ``selective`` recomputes every other block (torchtitan's
layer-selective mode, ``selective_ac_option=2``): about half the activation memory saved for
about half the recomputation. Op-level selection is not offered.

Order of application (as torchtitan): TP, then activation checkpointing, then FSDP.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scalerepro.parallel.activation_recompute import apply_activation_checkpointing
from scalerepro.parallel.fsdp import apply_fsdp
from scalerepro.parallel.mesh import ParallelError, mesh_shape
from scalerepro.parallel.tensor_parallel import apply_tensor_parallel

Strategy = Literal["ddp", "fsdp", "tp", "fsdp+tp", "pp"]


# ---- the mesh ---------------------------------------------------------------------------------


def build_mesh(strategy: str, world_size: int, device_type: str, tp_size: int | None = None) -> DeviceMesh:
    """The DeviceMesh of ``strategy`` over the default process group (which must exist)."""
    shape, names = mesh_shape(strategy, world_size, tp_size)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


# ---- the one entry point ------------------------------------------------------------------------


def parallelize(
    model: nn.Module,
    strategy: str,
    mesh: DeviceMesh,
    *,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    activation_checkpointing: str = "none",
) -> nn.Module:
    """``model`` (already on its device) in the parallel form of ``strategy`` on ``mesh``:
    TP first, then activation checkpointing, then FSDP. ``pp`` is ``build_pipeline`` (its
    form is a stage and a schedule, not a module)."""
    if strategy not in ("fsdp", "tp", "fsdp+tp"):
        raise ParallelError(f"parallelize() does not build --parallel {strategy}: ddp is the trainer's, pp is build_pipeline")
    if strategy in ("tp", "fsdp+tp"):
        apply_tensor_parallel(model, mesh["tp"] if strategy == "fsdp+tp" else mesh)
    apply_activation_checkpointing(model, activation_checkpointing)
    if strategy in ("fsdp", "fsdp+tp"):
        apply_fsdp(model, mesh["dp"] if strategy == "fsdp+tp" else mesh, reshard_after_forward, param_dtype)
    return model


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state: the storage of the
    local shards (``DTensor.to_local``), counted per tensor. This is what FSDP divides by the
    world size; activations and the temporarily gathered parameters are not in it."""

    def local_bytes(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = list({id(p): p for p in model.parameters()}.values())
    counts = {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_state": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            counts["optimizer_state"] += sum(local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return counts
