"""Checkpoints: everything needed to continue a run bit for bit, written atomically by rank 0.

A checkpoint holds the model, optimizer, LR scheduler and loss scaler states, the data position
(epoch and micro-batch within it), the per-epoch history so far, and every rank's RNG states
(torch CPU, CUDA, Python). Data order and augmentation are functions of (seed, epoch, index),
so the data position is all the loaders need.

Files are ``step-00001234.pt``: written to a temporary file in the same directory, flushed to
disk, then renamed, so a reader never sees half a checkpoint. Loading uses ``weights_only=True``.
"""

from __future__ import annotations

import random
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from .files import atomic_file

FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d{8})\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used for this run; the message names the file and the mismatch."""


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def save(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step`` and keep only the newest ``keep`` files."""
    target = path_for(directory, step)
    with atomic_file(target) as stream:
        torch.save({"format": FORMAT_VERSION, "step": step, **state}, stream)
    for old in list_checkpoints(directory)[keep:]:
        old.unlink(missing_ok=True)
    return target


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in ``directory``, newest step first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)), reverse=True)


def load_newest(directory: Path, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The newest checkpoint that loads and belongs to this run, or None if there is none.

    A file that fails to load (truncated by a crash during a copy, say) is skipped with a warning;
    one that loads but was made by a different configuration is an error, not something to skip.
    """
    for path in list_checkpoints(directory):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, never trusted
            warnings.warn(f"skipping unreadable checkpoint {path}: {type(error).__name__}: {error}", stacklevel=2)
            continue
        if state.get("format") != FORMAT_VERSION:
            warnings.warn(f"skipping checkpoint {path}: format {state.get('format')!r}", stacklevel=2)
            continue
        mismatched = {k: (state["fingerprint"].get(k), v) for k, v in fingerprint.items() if state["fingerprint"].get(k) != v}
        if mismatched:
            detail = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in mismatched.items())
            raise CheckpointError(
                f"checkpoint {path} was made by a different run ({detail}): use another --checkpoint-dir or drop --resume"
            )
        state["path"] = str(path)
        return state
    return None
