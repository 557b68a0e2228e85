"""FSDP2 (`fully_shard`) on every transformer block, then on the root, over the mesh's "dp" axis.
`reshard_after_forward` frees the gathered parameters after each block's forward (ZeRO-3-like);
without it they are kept from forward to backward (ZeRO-2-like). Under bf16 the policy computes
and all-gathers in bf16 and reduce-scatters gradients in fp32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from scalerepro.parallel.blocks import _block_items, transformer_blocks

# ---- FSDP2 -------------------------------------------------------------------------------------


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, param_dtype: torch.dtype | None) -> nn.Module:
    """fully_shard each block, then the root (which owns the embeddings, final norm and head).
    The root is sharded in place: ``model`` itself becomes the FSDP module."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype is not None else MixedPrecisionPolicy()
    for _, block in _block_items(transformer_blocks(model)):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root's parameters are used again at once by the backward (the LM head is the last
    # forward op): resharding them after forward would only gather them again.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    return model
