"""Pipeline parallel (`torch.distributed.pipelining`): the blocks split into `world_size`
contiguous stages, one per rank, run with the GPipe or 1F1B schedule over micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from scalerepro.parallel.mesh import ParallelError

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from scalerepro.models.transformer import GPT


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

    def __init__(self, model: GPT, blocks: range, first: bool, last: bool) -> None:
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

    def tied_weight(self) -> torch.Tensor | None:
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
    schedule: PipelineScheduleSingle  # ScheduleGPipe or Schedule1F1B
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
    gpt = cast("GPT", model)  # GPT is the one model with both (scalerepro.models)
    num_stages, stage_index = mesh.size(), mesh.get_local_rank()
    ranges = stage_block_ranges(len(gpt.blocks), num_stages)
    stage_module = GPTStage(gpt, ranges[stage_index], first=stage_index == 0, last=stage_index == num_stages - 1).to(device)
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
