"""Tensor parallel inside each transformer block (the Megatron/torchtitan plan): column-parallel
q, k, v and MLP up (and gate) projections, row-parallel attention output and MLP down
projections, sequence-parallel norms.

Why GPT's fused qkv is split: ColwiseParallel cuts a weight's output rows into contiguous
chunks, so on 2 ranks a fused (q | k | v) Linear would give rank 0 all of q and half of k.
Under TP each block's `qkv` becomes three Linears `wq`, `wk`, `wv` (its rows copied exactly),
each column-parallel, so every rank holds whole heads (`HeadParallelAttention`); `fuse_qkv`
maps a TP state dict back to GPT's names. The Llama decoder has separate projections already.
Embeddings and the LM head stay replicated over "tp" (they are tied).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from scalerepro.parallel.blocks import _block_items, transformer_blocks
from scalerepro.parallel.mesh import ParallelError

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ParallelStyle
    from torch.distributed.tensor.placement_types import Placement

    from scalerepro.models.transformer import SelfAttention

# ---- tensor parallel ---------------------------------------------------------------------------


class HeadParallelAttention(nn.Module):
    """GPT's self-attention with q, k, v as three Linears (``wq``, ``wk``, ``wv``) and the output
    projection ``out``: the same function as ``models.transformer.SelfAttention``, in a layout
    that column-parallel sharding splits by whole heads. The number of heads is read from the
    width of the (possibly local) q, so it runs sharded or not."""

    def __init__(self, fused: SelfAttention) -> None:
        super().__init__()
        hidden = fused.out.in_features
        self.head_dim = hidden // fused.num_heads
        self.causal, self.dropout = fused.causal, fused.dropout
        with torch.no_grad():
            for name, rows in zip(("wq", "wk", "wv"), fused.qkv.weight.split(hidden), strict=True):
                setattr(self, name, nn.Linear(hidden, hidden, bias=fused.qkv.bias is not None, device=rows.device, dtype=rows.dtype))
                getattr(self, name).weight.copy_(rows)
            if fused.qkv.bias is not None:
                for name, part in zip(("wq", "wk", "wv"), fused.qkv.bias.split(hidden), strict=True):
                    getattr(self, name).bias.copy_(part)
        self.out = fused.out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, heads_local x head_dim) -> (B, heads_local, T, head_dim)
        q, k, v = (getattr(self, n)(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for n in ("wq", "wk", "wv"))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal)
        return self.out(y.transpose(1, 2).flatten(-2))


def fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state dict of a TP-prepared GPT under GPT's own names (``attention.wq/wk/wv`` ->
    ``attention.qkv``, rows concatenated q | k | v)."""
    fused: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".attention.wq." in key:
            suffix = key.split(".attention.wq.")
            parts = [state[f"{suffix[0]}.attention.{n}.{suffix[1]}"] for n in ("wq", "wk", "wv")]
            fused[f"{suffix[0]}.attention.qkv.{suffix[1]}"] = torch.cat(parts)
        elif ".attention.wk." not in key and ".attention.wv." not in key:
            fused[key] = value
    return fused


def _is_gpt_block(block: nn.Module) -> bool:
    return hasattr(block, "attention") and hasattr(block.attention, "qkv") and hasattr(block, "mlp")


def prepare_for_tensor_parallel(model: nn.Module) -> None:
    """Split each GPT block's fused qkv into wq, wk, wv (see the module docstring). Idempotent."""
    for _, block in _block_items(transformer_blocks(model)):
        if _is_gpt_block(block):
            if not getattr(block, "pre_norm", True):
                raise ParallelError("tensor parallel supports the pre-LN decoder (gpt2_small), not post-LN bert_base: use --parallel fsdp")
            block.attention = HeadParallelAttention(cast("SelfAttention", block.attention))  # a GPT block's (_is_gpt_block)


def _block_tp_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    to_replicated = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    if hasattr(block, "feed_forward"):  # torchtitan names (Llama-style decoder, SwiGLU MLP)
        return {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": to_replicated,
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        }
    return {  # GPT after prepare_for_tensor_parallel
        "attention_norm": SequenceParallel(),
        "attention": to_replicated,
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.out": RowwiseParallel(output_layouts=Shard(1)),
        "mlp_norm": SequenceParallel(),
        "mlp": to_replicated,
        "mlp.fc": ColwiseParallel(),
        "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard every block over ``tp_mesh``. Between blocks the residual stream is this rank's
    slice of the sequence; it enters the first block whole (replicated embeddings: slicing it is
    free) and leaves the final norm gathered whole for the replicated LM head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel, parallelize_module

    prepare_for_tensor_parallel(model)
    blocks = _block_items(transformer_blocks(model))
    if any(not _is_tp_ready(block) for _, block in blocks):
        raise ParallelError(f"{type(model).__name__}'s blocks have no tensor-parallel plan here: use --parallel fsdp")
    config = getattr(model, "config", None)
    for flag, attribute in (("--num-heads", "num_heads"), ("--num-heads", "n_heads"), ("--num-kv-heads", "n_kv_heads")):
        heads = getattr(config, attribute, None)
        if heads is not None and heads % tp_mesh.size():
            raise ParallelError(f"{flag} {heads} is not divisible by the tensor-parallel size {tp_mesh.size()}: change either")
    for _, block in blocks:
        parallelize_module(block, tp_mesh, _block_tp_plan(block))
    first_name = blocks[0][0]
    container = transformer_blocks(model)
    # Replicate -> Shard(1) is a local slice: each rank keeps its part of the sequence.
    # (Llama's blocks take the rotary table as a second, unsharded input.)
    extra = (None,) if hasattr(blocks[0][1], "feed_forward") else ()
    parallelize_module(
        container,
        tp_mesh,
        {first_name: PrepareModuleInput(input_layouts=(Replicate(), *extra), desired_input_layouts=(Shard(1), *extra), use_local_output=True)},
    )
    final_norm_name = "final_norm" if hasattr(model, "final_norm") else "norm"
    parallelize_module(model, tp_mesh, {final_norm_name: SequenceParallel(use_local_output=False)})
    head_name = "lm_head" if hasattr(model, "lm_head") else "output"
    # The head takes the whole sequence again: all-gather along it.
    parallelize_module(model, tp_mesh, {head_name: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)})
    return model


def _is_tp_ready(block: nn.Module) -> bool:
    attention = getattr(block, "attention", None)
    return attention is not None and hasattr(attention, "wq")


def tp_local_numel(parameter: torch.Tensor) -> int:
    """Elements of ``parameter`` per TP rank on a ("dp", "tp") mesh: what FSDP over "dp" gathers
    and reduces of it (sharded over "tp": numel / tp; replicated over "tp": all of it)."""
    placements: Sequence[Placement] = getattr(parameter, "placements", ())
    if len(placements) == 2 and placements[1].is_shard():
        return parameter.numel() // cast("DTensor", parameter).device_mesh.size(1)  # only a DTensor has placements
    return parameter.numel()
