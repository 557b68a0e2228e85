"""The run's state in and out of its checkpoints: which store, the fingerprint a checkpoint must match, saving, resuming.

The stores and their formats are ``checkpoint_store`` (one file, rank 0, DDP) and
``sharded_checkpoint_store`` (DCP, every rank its shards: fsdp, tp, fsdp+tp, pp); this module is what
the trainer does with them: it hands over the run's state (``RunState``: model, optimizer, LR
scheduler, loss scaler) and its position, and gets them back on resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from scalerepro.trainer_flags import TrainConfig
from scalerepro.training import checkpoint_store
from scalerepro.training.distributed import DistContext, barrier, gather_objects

if TYPE_CHECKING:
    from scalerepro.training.sharded_checkpoint_store import ShardedCheckpointStore


@dataclass(frozen=True)
class RunState:
    """What an optimizer step changes and a checkpoint holds, besides the RNG states: the model
    (this rank's shards, or its pipeline stage, when sharded), optimizer, LR scheduler, loss scaler."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def fingerprint(config: TrainConfig, world_size: int, total_steps: int, global_batch: int, reshardable: bool) -> dict[str, Any]:
    """What a checkpoint must share with this run to continue it exactly.

    A DTensor-sharded checkpoint (``reshardable``: fsdp, tp, fsdp+tp; DCP stores global shapes
    and reshards on load) continues on another world size: there the global batch must match, not
    the world size and the per-rank batch. A single-file (ddp) checkpoint and a pipeline's (one
    stage's blocks per rank: the cut depends on the world size) keep both."""
    c = config
    found = {
        "model": dataclasses.asdict(c.model),
        "data": c.data.data,
        "synthetic_samples": c.data.synthetic_samples,
        "per_gpu_batch": c.run.per_gpu_batch,
        "world_size": world_size,
        "grad_accum_steps": c.optim.grad_accum_steps,
        "seed": c.run.seed,
        "total_steps": total_steps,
        "optim": dataclasses.asdict(c.optim),
        "precision": c.perf.precision,
        "code": checkpoint_store.code_hash(),
    }
    if reshardable:
        del found["per_gpu_batch"], found["world_size"]
        found["global_batch"] = global_batch
    return found


def open_store(directory: Path, found: dict[str, Any], keep: int, sharded: bool) -> checkpoint_store.CheckpointStore:
    """The run's checkpoint store in ``directory`` (--checkpoint-dir): sharded state (``sharded``)
    is checkpointed by every rank with DCP (scalerepro.training.sharded_checkpoint_store)."""
    if not sharded:
        return checkpoint_store.CheckpointStore(directory, found, keep)
    # imported here: DCP pulls in torch.distributed.tensor, 0.6 s of every rank's start-up a DDP run never uses
    from scalerepro.training import sharded_checkpoint_store

    return sharded_checkpoint_store.ShardedCheckpointStore(directory, found, keep)


def resume(
    store: checkpoint_store.CheckpointStore, state: RunState, ctx: DistContext, last_resumable_step: int, sharded: bool, log: Callable[[str], Any]
) -> tuple[dict[str, Any], str] | None:
    """Load the newest usable checkpoint into ``state`` and this rank's RNG; return its progress
    (``Progress``'s fields) and path, or None to start fresh. Every newer checkpoint passed over is
    named, so the log and the record say why a run started fresh or went back
    (checkpoint_store.unusable_reason)."""
    saved = store.load_newest(last_resumable_step)
    for skipped in store.skipped:
        log(f"passing over checkpoint {skipped['path']}: {skipped['reason']}")
    if saved is None:
        log(f"no usable checkpoint in {store.directory}: starting from step 0")
        return None
    if sharded:  # this rank's shards of the model and optimizer
        from scalerepro.training import sharded_checkpoint_store  # (see open_store)

        sharded_checkpoint_store.load(saved["path"], state.module, state.optimizer)
    else:
        state.module.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.scaler.load_state_dict(saved["scaler"])
    saved_rng = saved["rng"]  # one per rank that wrote the checkpoint
    if len(saved_rng) != ctx.world_size:  # a sharded checkpoint resumed on another world size
        log(f"the checkpoint was written by {len(saved_rng)} ranks, this run has {ctx.world_size}: rank r takes rank r mod {len(saved_rng)}'s RNG state")
    checkpoint_store.set_rng_state(saved_rng[ctx.rank % len(saved_rng)])
    log(f"resumed from {saved['path']} at step {saved['progress']['step']}")
    return saved["progress"], saved["path"]


def save(
    store: checkpoint_store.CheckpointStore,
    state: RunState,
    ctx: DistContext,
    progress: dict[str, Any],
    fingerprint_now: Callable[[], dict[str, Any]],
    sharded: bool,
    final: bool,
) -> str | None:
    """Write the checkpoint of step ``progress["step"]``: the run's state, its position
    (``progress``: Progress's fields), every rank's RNG states and the run's fingerprint (taken
    now, by the ranks that write: the run may have grown since it started, --min-window-s). A
    collective. Returns its path where this rank wrote it (every rank when sharded, rank 0
    else), None on the others."""
    rng = gather_objects(ctx, checkpoint_store.rng_state())  # every rank's, in rank order
    if sharded:  # every rank writes its shards (a collective)
        meta = {
            "scheduler": state.scheduler.state_dict(),
            "scaler": state.scaler.state_dict(),
            "progress": progress,
            "rng": rng,
            "fingerprint": fingerprint_now(),
        }
        sharded_store = cast("ShardedCheckpointStore", store)  # open_store(sharded=True) made it
        return str(sharded_store.save(progress["step"], state.module, state.optimizer, meta, final=final))
    path = None
    if ctx.is_main:
        whole = {
            "model": state.module.state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "scaler": state.scaler.state_dict(),
            "progress": progress,
            "rng": rng,
            "fingerprint": fingerprint_now(),
        }
        path = str(store.save(progress["step"], whole, final=final))
    barrier(ctx)
    return path
