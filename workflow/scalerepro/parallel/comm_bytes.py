"""Bytes each rank sends per optimizer step under each parallel form, for the report's
communication figures. Every formula is written beside its code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from scalerepro.parallel.blocks import transformer_blocks


def pipeline_comm_bytes_per_step(batch: int, seq_len: int, hidden: int, vocab: int, stages: int, activation_bytes: int = 4) -> dict[str, float]:
    """Bytes the busiest rank sends per optimizer step under --parallel pp (point-to-point),
    by kind, analytic:

        send_activations = B x T x H x b   (every stage but the last: m micro-batches of B/m rows)
        send_gradients   = B x T x H x b   (every stage but the first: the inputs' gradients back)
        tied_all_reduce  = V x H x 4 x 2 (S - 1) / S with S = 2   (the tied embedding/head gradient
                           summed between the first and last stage, fp32; 0 when they are one rank)
        loss_broadcast   = 4               (the step's mean loss from the last stage to the others)

    B the global batch, T the sequence, H the hidden size, b the bytes per element of the
    residual stream between stages (float32 under bf16 autocast too: the embeddings are float32
    and the residual additions promote). The figures are per kind the largest over ranks (a middle
    stage sends both activations and gradients; the first and last also the tied gradient)."""
    boundary = batch * seq_len * hidden * activation_bytes
    return {
        "send_activations": float(boundary if stages > 1 else 0),
        "send_gradients": float(boundary if stages > 1 else 0),
        "tied_all_reduce": float(vocab * hidden * 4 if stages > 1 else 0),
        "loss_broadcast": float(4 if stages > 1 else 0),
    }


def tp_comm_bytes_per_step(
    num_blocks: int,
    micro_batch: int,
    seq_len: int,
    hidden: int,
    tp: int,
    micro_batches: int,
    norm_bytes: int = 4,
    matmul_bytes: int = 4,
    norm_parameters_per_block: int = 0,
    final_norm_parameters: int = 0,
) -> dict[str, float]:
    """Bytes each rank sends per optimizer step under tensor + sequence parallelism (the plan of
    ``apply_tensor_parallel``, ring collectives over ``tp`` ranks), by collective, analytic.
    Every block moves activations of shape (b, T, H) (b the micro-batch):

        forward:  2 all-gathers (the norm outputs, sequence -> whole, before attention and MLP)
                  2 reduce-scatters (the row-parallel outputs, partial sums -> sequence shards)
        backward: the mirror: 2 reduce-scatters of the norm outputs' gradients, 2 all-gathers of
                  the row-parallel outputs' gradients
        outside the blocks: 1 all-gather of the final norm's output before the replicated LM
                  head (forward), 1 all-gather of the gradient of the first block's input
                  (backward: the replicated embeddings need it whole)
        LayerNorm weights and biases (replicated, fed sequence shards): their gradients are
                  all-reduced, per micro-batch

        all_gather     = m x [ L x 2 (b_norm + b_mm) + 2 b_norm ] x b T H x (tp - 1) / tp
        reduce_scatter = m x L x 2 (b_norm + b_mm) x b T H x (tp - 1) / tp
        all_reduce     = m x (L x n_norm + n_final) x 4 x 2 (tp - 1) / tp

    with m micro-batches, L blocks, b_norm the bytes per element of the norm outputs (float32:
    autocast runs layer_norm in float32) and b_mm of the matmul outputs (the autocast dtype), the
    two gathers outside the blocks taken as b_norm, n_norm the LayerNorm parameters per block."""
    activation = micro_batch * seq_len * hidden
    ring = (tp - 1) / tp
    per_block = 2 * (norm_bytes + matmul_bytes) * activation * ring
    return {
        "all_gather": micro_batches * (num_blocks * per_block + 2 * norm_bytes * activation * ring),
        "reduce_scatter": micro_batches * num_blocks * per_block,
        "all_reduce": micro_batches * (num_blocks * norm_parameters_per_block + final_norm_parameters) * 4 * 2 * ring,
    }


def fsdp_comm_bytes_per_step(
    model: nn.Module,
    world: int,
    reshard_after_forward: bool,
    param_bytes: int,
    reduce_bytes: int,
    micro_batches: int,
    numel: Callable[[torch.Tensor], int] = torch.numel,
) -> dict[str, float]:
    """Bytes each rank sends per optimizer step under FSDP2 (ring collectives), by collective,
    analytic from the parameter counts (global numel, so it can be called after sharding):

        all_gather   = m x (N_blocks + N_root + [reshard] N_blocks) x b_param x (W - 1) / W
        reduce_scatter = m x (N_blocks + N_root) x b_reduce x (W - 1) / W

    m micro-batches per step (each runs its own forward all-gathers and backward reduce-scatter:
    the trainer does not skip gradient sync between micro-batches), N_blocks the parameters
    inside the transformer blocks (each block an FSDP unit, gathered again for backward when
    resharded after forward), N_root the rest (the root unit, never resharded after forward),
    b the bytes per element (param_dtype for the gathers, reduce_dtype for the reduction).
    Under fsdp+tp, W is the "dp" size and ``numel`` is ``tp_local_numel``: FSDP moves each TP
    rank's shard."""
    unique = {id(p): p for p in model.parameters()}.values()
    total = sum(numel(p) for p in unique)
    in_blocks = sum(numel(p) for p in {id(p): p for p in transformer_blocks(model).parameters()}.values())
    ring = (world - 1) / world
    gathered = in_blocks * (2 if reshard_after_forward else 1) + (total - in_blocks)
    return {
        "all_gather": micro_batches * gathered * param_bytes * ring,
        "reduce_scatter": micro_batches * total * reduce_bytes * ring,
    }
