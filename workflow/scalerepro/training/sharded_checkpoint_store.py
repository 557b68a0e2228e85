"""Checkpoints of sharded state (FSDP2, TP): torch.distributed.checkpoint (DCP), every rank
writing its own shards, beside ``checkpoint_store``'s single-file checkpoints of DDP runs.

A checkpoint is a directory ``step-00001234.dcp``: the DCP files of the model and optimizer
(``get_state_dict``: the optimizer state keyed by parameter names, flattened, so it loads into
any sharding, and a pipeline stage's into that stage) and ``meta.pt``, written by rank 0, holding the rest of a checkpoint as
``checkpoint_store`` has it (step, scheduler, scaler, progress, RNG states, the fingerprint with
the trainer's code hash, the format number). Whether it can continue a run is decided by the same
``checkpoint_store.unusable_reason`` on ``meta.pt``.

Atomic as the single files are: every rank writes into ``.step-00001234.dcp.tmp``, and after
DCP's final collective (the metadata is written by the coordinator once all shards are) rank 0
renames the directory into place; a reader never sees a half-written one.

Resharding: DCP stores each tensor's global shape and the offsets of the saved pieces, and
``set_state_dict`` takes the model's current sharding, so a checkpoint saved on 2 ranks loads on
1 or 4 (the model must be sharded the same *way* (names), not on the same number of ranks).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from scalerepro.common.files import atomic_file
from scalerepro.training.checkpoint_store import FORMAT_VERSION, CheckpointStore

META_FILE = "meta.pt"
# Stands in meta.pt for the model and optimizer states, which are in the DCP files beside it
# (checkpoint_store.unusable_reason requires the keys to exist).
IN_DCP_FILES = "sharded: in this directory's DCP files"
# The optimizer state flattened to one key per parameter and setting ("state.<fqn>.exp_avg",
# "param_groups.<fqn>.lr"), as torchtitan does: every key belongs to the parameter it describes,
# so a pipeline stage saves and loads its own parameters' entries only. (Unflattened, the
# "param_groups" list would be one key on every rank holding different parameter names, and DCP
# keeps one rank's copy of a key present on several.)
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def path_for(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.dcp"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _is_main() -> bool:
    return not _distributed() or dist.get_rank() == 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def save(target: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> Path:
    """Write the model and optimizer shards of every rank, and rank 0's ``meta``, to ``target``
    (a collective: every rank calls it with the same ``target``)."""
    target = Path(target)
    temporary = target.with_name(f".{target.name}.tmp")
    if _is_main():
        shutil.rmtree(temporary, ignore_errors=True)  # a crashed earlier attempt
        temporary.mkdir(parents=True)
    _barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=temporary)
    if _is_main():
        with atomic_file(temporary / META_FILE) as stream:
            torch.save({"format": FORMAT_VERSION, "model": IN_DCP_FILES, "optimizer": IN_DCP_FILES, **meta}, stream)
        if target.exists():  # the same step written again: the new one wins
            shutil.rmtree(target)
        os.replace(temporary, target)
        _fsync_directory(target.parent)
    _barrier()
    return target


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``meta.pt`` of a sharded checkpoint (cheap: no tensors of the model)."""
    return torch.load(Path(directory) / META_FILE, map_location="cpu", weights_only=True)


def load(directory: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Load the shards this rank's model and optimizer need, whatever world size wrote them;
    returns ``meta`` (a collective)."""
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        state: dict[str, Any] = {"model": get_model_state_dict(model)}  # what dcp.load takes
        dcp.load(state, checkpoint_id=Path(directory))
        set_model_state_dict(model, state["model"])
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=Path(directory))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=OPTIONS)
    return read_meta(directory)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


_NAME = re.compile(r"^step-(\d{8})\.dcp$")


def list_checkpoints(directory: Path) -> list[Path]:
    """Directories named like sharded checkpoints, newest step first (usable or not)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=_step_of, reverse=True)


def _step_of(path: Path) -> int:
    match = _NAME.match(path.name)
    assert match is not None  # list_checkpoints keeps only the names that match
    return int(match.group(1))


class ShardedCheckpointStore(CheckpointStore):
    """The sharded checkpoints of one run: ``checkpoint_store.CheckpointStore``'s policy (newest usable
    one, every newer one passed over with its reason, ``keep`` counting usable ones only) for
    DCP directories, read by their ``meta.pt`` (the shards are loaded by ``load``). Every rank
    reads the same files, so every rank picks the same one. ``save`` is a collective; rank 0
    alone deletes."""

    # a sharded save takes the model and optimizer too (a collective over their shards); run_state
    # calls it on a store it opened sharded
    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], final: bool = False) -> Path:  # type: ignore[override]
        target = save(path_for(self.directory, step), model, optimizer, {"step": step, "final": final, **state})
        self._keep_newest(target)
        return target

    def _candidates(self) -> list[Path]:
        return list_checkpoints(self.directory)

    def _read(self, path: Path) -> Any:
        return read_meta(path)

    def _remove(self, path: Path) -> None:
        if _is_main():
            shutil.rmtree(path, ignore_errors=True)
