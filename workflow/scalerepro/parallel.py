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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .mesh import STRATEGIES, ParallelError, data_parallel_coordinates, default_tp_size, mesh_shape  # noqa: F401 - re-exported

Strategy = Literal["ddp", "fsdp", "tp", "fsdp+tp", "pp"]
ActivationCheckpointing = Literal["none", "selective", "full"]
PipelineScheduleName = Literal["gpipe", "1f1b"]

# torchtitan's layer-selective activation checkpointing: recompute every N-th block.
SELECTIVE_EVERY = 2


# ---- the mesh ---------------------------------------------------------------------------------


def build_mesh(strategy: str, world_size: int, device_type: str, tp_size: int | None = None) -> DeviceMesh:
    """The DeviceMesh of ``strategy`` over the default process group (which must exist)."""
    shape, names = mesh_shape(strategy, world_size, tp_size)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def data_parallel_rank_and_size(mesh: DeviceMesh) -> tuple[int, int]:
    """Which slice of the global batch this rank reads, of how many: ranks of one TP group (or
    all stages of a pipeline) read the same data."""
    names = mesh.mesh_dim_names or ()
    if "dp" in names:
        dp = mesh["dp"] if len(names) > 1 else mesh
        return dp.get_local_rank(), dp.size()
    return 0, 1


# ---- the model's blocks -----------------------------------------------------------------------


def transformer_blocks(model: nn.Module) -> nn.Module:
    """The container of the model's repeated blocks: ``blocks`` (GPT, BERT) or ``layers``
    (torchtitan-style decoders)."""
    for name in ("blocks", "layers"):
        container = getattr(model, name, None)
        if isinstance(container, (nn.ModuleList, nn.ModuleDict)):
            return container
    raise ParallelError(
        f"{type(model).__name__} has no transformer blocks (.blocks or .layers): --parallel fsdp/tp/pp apply to the "
        "transformer models; use --parallel ddp for the others"
    )


def _block_items(container: nn.Module) -> list[tuple[str, nn.Module]]:
    return list(container.named_children())


# ---- activation checkpointing -----------------------------------------------------------------


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Wrap blocks in ``checkpoint_wrapper`` (non-reentrant): all of them (``full``) or every
    ``SELECTIVE_EVERY``-th (``selective``). Returns how many blocks were wrapped. The wrapper's
    state-dict hooks strip its prefix, so checkpoints keep the model's parameter names."""
    if mode == "none":
        return 0
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    container = transformer_blocks(model)
    wrapped = 0
    for index, (name, block) in enumerate(_block_items(container)):
        if mode == "full" or index % SELECTIVE_EVERY == 0:
            container.register_module(name, checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
            wrapped += 1
    return wrapped


# ---- FSDP2 -------------------------------------------------------------------------------------


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, param_dtype: torch.dtype | None) -> nn.Module:
    """fully_shard each block, then the root (which owns the embeddings, final norm and head).
    The root is sharded in place: ``model`` itself becomes the FSDP module."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype is not None
        else MixedPrecisionPolicy()
    )
    for _, block in _block_items(transformer_blocks(model)):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root's parameters are used again at once by the backward (the LM head is the last
    # forward op): resharding them after forward would only gather them again.
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    return model


# ---- tensor parallel ---------------------------------------------------------------------------


class HeadParallelAttention(nn.Module):
    """GPT's self-attention with q, k, v as three Linears (``wq``, ``wk``, ``wv``) and the output
    projection ``out``: the same function as ``models.transformer.SelfAttention``, in a layout
    that column-parallel sharding splits by whole heads. The number of heads is read from the
    width of the (possibly local) q, so it runs sharded or not."""

    def __init__(self, fused: nn.Module) -> None:
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
            block.attention = HeadParallelAttention(block.attention)


def _block_tp_plan(block: nn.Module) -> dict[str, object]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    to_replicated = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    if hasattr(block, "feed_forward"):  # torchtitan names (Llama-style decoder, SwiGLU MLP)
        return {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": to_replicated,
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        }  # fmt: skip
    return {  # GPT after prepare_for_tensor_parallel
        "attention_norm": SequenceParallel(),
        "attention": to_replicated,
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.out": RowwiseParallel(output_layouts=Shard(1)),
        "mlp_norm": SequenceParallel(),
        "mlp": to_replicated,
        "mlp.fc": ColwiseParallel(),
        "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
    }  # fmt: skip


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
        container, tp_mesh,
        {first_name: PrepareModuleInput(input_layouts=(Replicate(), *extra), desired_input_layouts=(Shard(1), *extra), use_local_output=True)},
    )  # fmt: skip
    final_norm_name = "final_norm" if hasattr(model, "final_norm") else "norm"
    parallelize_module(model, tp_mesh, {final_norm_name: SequenceParallel(use_local_output=False)})
    head_name = "lm_head" if hasattr(model, "lm_head") else "output"
    # The head takes the whole sequence again: all-gather along it.
    parallelize_module(model, tp_mesh, {head_name: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)})
    return model


def _is_tp_ready(block: nn.Module) -> bool:
    attention = getattr(block, "attention", None)
    return attention is not None and hasattr(attention, "wq")


# ---- pipeline parallel -------------------------------------------------------------------------


def stage_block_ranges(num_blocks: int, num_stages: int) -> list[range]:
    """Contiguous blocks per stage, as even as possible (earlier stages take the remainder: the
    last stage also runs the LM head)."""
    if num_stages > num_blocks:
        raise ParallelError(f"--parallel pp over {num_stages} ranks needs at least {num_stages} layers (got {num_blocks}): raise --num-layers")
    base, extra = divmod(num_blocks, num_stages)
    ranges, start = [], 0
    for stage in range(num_stages):
        stop = start + base + (1 if stage < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


class GPTStage(nn.Module):
    """One pipeline stage of GPT: the embeddings on the first, its blocks, the final norm and LM
    head on the last. Parameter names are GPT's (blocks keep their global index)."""

    def __init__(self, model: nn.Module, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.hidden_size = model.lm_head.in_features  # the width of what passes between stages
        self.vocab_size = model.lm_head.out_features  # the rows of the tied embedding / head
        if first:
            self.token_embedding, self.position_embedding, self.dropout = model.token_embedding, model.position_embedding, model.dropout
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        if last:
            self.final_norm = model.final_norm
            # GPT ties the head to the token embedding. Across stages the tie is kept by hand:
            # the last stage holds its own copy, and the two copies' gradients are summed
            # (sync_tied_gradients) before every optimizer step, so both stay equal.
            self.lm_head = nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(model.lm_head.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            positions = torch.arange(x.size(1), device=x.device)
            x = self.dropout(self.token_embedding(x) + self.position_embedding(positions))
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.lm_head(self.final_norm(x))
        return x

    def tied_weight(self) -> nn.Parameter | None:
        if self.first:
            return self.token_embedding.weight
        if self.last:
            return self.lm_head.weight
        return None


@dataclass
class Pipeline:
    """This rank's stage and the schedule that runs it. ``step(inputs, targets)`` runs forward
    and backward over all micro-batches (gradients scaled to the mean over them) and returns the
    mean loss, computed on the last stage and broadcast to every stage (one scalar)."""

    stage_module: GPTStage
    schedule: object
    stage_index: int
    num_stages: int
    tied_group: dist.ProcessGroup | None
    group: dist.ProcessGroup | None = None  # the pipeline's ranks, in stage order

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def _global_rank(self, stage: int) -> int:
        return dist.get_global_rank(self.group, stage) if self.group is not None else stage

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        if self.stage_index == 0:
            self.schedule.step(inputs, target=targets if self.num_stages == 1 else None, losses=losses)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses)
        else:
            self.schedule.step()
        self.sync_tied_gradients()
        loss = torch.stack(losses).detach().mean() if losses else torch.zeros((), device=inputs.device)
        if self.num_stages > 1:  # the loss exists on the last stage only: every stage reports it
            dist.broadcast(loss, src=self._global_rank(self.num_stages - 1), group=self.group)
        return loss

    @torch.no_grad()
    def forward_only(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """The model's output (logits) for ``inputs`` on the last stage, None elsewhere: each
        stage receives its input from the one before (float32, shape (batch, seq, hidden), known
        to every rank since all read the same batch) and sends its output on. For evaluation, of
        any batch size (the schedule's buffers are fixed to the training micro-batch)."""
        x = inputs
        device = next(self.stage_module.parameters()).device
        if self.stage_index > 0:
            x = torch.empty((*inputs.shape, self.stage_module.hidden_size), dtype=torch.float32, device=device)
            dist.recv(x, src=self._global_rank(self.stage_index - 1), group=self.group)
        x = self.stage_module(x)
        if not self.is_last:
            dist.send(x.float().contiguous(), dst=self._global_rank(self.stage_index + 1), group=self.group)
            return None
        return x

    def sync_tied_gradients(self) -> None:
        """grad(tied weight) = grad through the embedding + grad through the LM head."""
        weight = self.stage_module.tied_weight()
        if self.tied_group is None or weight is None:
            return
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=self.tied_group)


def build_pipeline(
    model: nn.Module,
    mesh: DeviceMesh,
    schedule: str,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
) -> Pipeline:
    """Cut GPT into ``mesh.size()`` stages and build this rank's stage and schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if not hasattr(model, "token_embedding") or not hasattr(model, "lm_head"):
        raise ParallelError(f"--parallel pp splits a GPT-style decoder (gpt2_small), not {type(model).__name__}: use --parallel fsdp")
    num_stages, stage_index = mesh.size(), mesh.get_local_rank()
    ranges = stage_block_ranges(len(model.blocks), num_stages)
    stage_module = GPTStage(model, ranges[stage_index], first=stage_index == 0, last=stage_index == num_stages - 1).to(device)
    group = mesh.get_group()
    stage = PipelineStage(stage_module, stage_index, num_stages, device, group=group)
    schedule_class = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    # scale_grads: each micro-batch's loss is its own mean, so the gradients are divided by the
    # number of micro-batches to give the gradient of the mean over the whole batch.
    runner = schedule_class(stage, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=True)
    tied_group = None
    if num_stages > 1:  # every rank must take part in creating the group
        ranks = dist.get_process_group_ranks(group)
        tied_group = dist.new_group([ranks[0], ranks[-1]])
        if stage_index not in (0, num_stages - 1):
            tied_group = None
    return Pipeline(stage_module, runner, stage_index, num_stages, tied_group, group if num_stages > 1 else None)


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction of a GPipe or 1F1B step: (p - 1) / (m + p - 1) for p stages and m
    micro-batches (both schedules have the same bubble; 1F1B only bounds the activations held
    to p micro-batches instead of m)."""
    return (stages - 1) / (microbatches + stages - 1)


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
    num_blocks: int, micro_batch: int, seq_len: int, hidden: int, tp: int, micro_batches: int,
    norm_bytes: int = 4, matmul_bytes: int = 4, norm_parameters_per_block: int = 0, final_norm_parameters: int = 0,
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


def tp_local_numel(parameter: torch.Tensor) -> int:
    """Elements of ``parameter`` per TP rank on a ("dp", "tp") mesh: what FSDP over "dp" gathers
    and reduces of it (sharded over "tp": numel / tp; replicated over "tp": all of it)."""
    placements = getattr(parameter, "placements", ())
    if len(placements) == 2 and placements[1].is_shard():
        return parameter.numel() // parameter.device_mesh.size(1)
    return parameter.numel()


def fsdp_comm_bytes_per_step(
    model: nn.Module, world: int, reshard_after_forward: bool, param_bytes: int, reduce_bytes: int, micro_batches: int,
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


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole, on the CPU, under the model's own names (a collective:
    every rank calls it; every rank gets it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in state.items()}
    return fuse_qkv(state)


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
