"""Checkpoints: everything needed to continue a run bit for bit, written atomically by rank 0.

A checkpoint holds the model, optimizer, LR scheduler and loss scaler states, the data position
(epoch and micro-batch within it), the per-epoch history so far, and every rank's RNG states
(torch CPU, CUDA, Python). Data order and augmentation are functions of (seed, epoch, index),
so the data position is all the loaders need.

Files are ``step-00001234.pt``: written to a temporary file in the same directory, flushed to
disk, then renamed, so a reader never sees half a checkpoint. Loading uses ``weights_only=True``.

A checkpoint continues a run only if it is *usable* for it (``unusable_reason``): it loads, it is
a checkpoint of this format, its fingerprint (configuration and the trainer's code hash) is the
run's, it is not the final checkpoint of a finished run, and enough steps are left after it to
measure something. Every newer file that is passed over is named with its reason, so a resume
never goes backwards silently. Cleanup (``keep``) counts only the checkpoints this store knows
to be usable: a corrupt or foreign file never takes the place of a good one.
"""

from __future__ import annotations

import errno
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scalerepro.common import source_closure
from scalerepro.common.files import atomic_file

# 2: the fingerprint holds the trainer's code hash and the last checkpoint of a run says "final".
FORMAT_VERSION = 2
_NAME = re.compile(r"^step-(\d{8})\.pt$")
_REQUIRED = ("step", "model", "optimizer", "scheduler", "scaler", "progress", "rng", "fingerprint")


def code_hash() -> str:
    """SHA-256 over the code a rank runs (``source_closure.source_files`` of
    ``scalerepro.training.train``: not the planning, launching or analysis code, which no rank
    imports). A checkpoint written by other code cannot be trusted to continue this code's run
    bit for bit, so it is not resumed."""
    return source_closure.code_hash([source_closure.RANK_ENTRY])


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


def list_checkpoints(directory: Path) -> list[Path]:
    """Files named like checkpoints in ``directory``, newest step first (usable or not)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=_step_of, reverse=True)


def _step_of(path: Path) -> int:
    match = _NAME.match(path.name)
    assert match is not None  # list_checkpoints keeps only the names that match
    return int(match.group(1))


def unusable_reason(state: object, fingerprint: dict[str, Any], last_resumable_step: int) -> str | None:
    """Why ``state`` cannot continue the run of ``fingerprint`` (None: it can).

    ``last_resumable_step``: a checkpoint after it leaves fewer steps than the warm-up plus one
    measured step, so a run resumed from it would measure nothing."""
    if not isinstance(state, dict):
        return f"not a checkpoint (it holds a {type(state).__name__})"
    if state.get("format") != FORMAT_VERSION:
        return f"checkpoint format {state.get('format')!r}, this trainer reads {FORMAT_VERSION}"
    missing = [key for key in _REQUIRED if key not in state]
    if missing or not isinstance(state["fingerprint"], dict):
        return f"incomplete checkpoint (missing {', '.join(missing) or 'a fingerprint'})"
    theirs = state["fingerprint"]
    if theirs.get("code") != fingerprint["code"]:
        return f"written by other trainer code (code hash {str(theirs.get('code'))[:12]}, now {fingerprint['code'][:12]})"
    changed = [f"{k} was {theirs.get(k)!r}, now {v!r}" for k, v in fingerprint.items() if theirs.get(k) != v]
    if changed:
        return "written by a different configuration (" + "; ".join(changed) + ")"
    if state.get("final"):
        return "the final checkpoint of a finished run"
    if state["step"] > last_resumable_step:
        return f"at step {state['step']} it leaves too few steps for the warm-up and a measured window"
    return None


# Below this many free bytes a failed write is the disk being full (the partial file is still there).
FULL_DISK_BYTES = 1 << 20


def write_failure(directory: Path, error: RuntimeError) -> Exception:
    """What a failed torch.save means: a full file system (named, as the OSError every command
    describes in one line) where the checkpoint's folder has next to no space left, else ``error``."""
    free = shutil.disk_usage(directory).free
    if free < FULL_DISK_BYTES:
        return OSError(errno.ENOSPC, f"No space left on device ({free} bytes free) writing a checkpoint", str(directory))
    return error


@dataclass
class CheckpointStore:
    """The checkpoints of one run in ``directory``; rank 0 alone writes and deletes."""

    directory: Path
    fingerprint: dict[str, Any]
    keep: int
    usable: list[Path] = field(default_factory=list)  # known usable for this run, newest first
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"} of files passed over

    def load_newest(self, last_resumable_step: int) -> dict[str, Any] | None:
        """The newest usable checkpoint, or None; every newer file passed over is in ``skipped``."""
        for path in self._candidates():
            try:
                state = self._read(path)
            except Exception as error:  # noqa: BLE001 - an unreadable file is skipped, never trusted
                self.skipped.append({"path": str(path), "reason": f"unreadable ({type(error).__name__}: {_first_line(error)})"})
                continue
            reason = unusable_reason(state, self.fingerprint, last_resumable_step)
            if reason is not None:
                self.skipped.append({"path": str(path), "reason": reason})
                continue
            self.usable.insert(0, path)
            state["path"] = str(path)
            return state
        return None

    def save(self, step: int, state: dict[str, Any], final: bool = False) -> Path:
        """Write ``state`` as the checkpoint of ``step``; keep the newest ``keep`` usable ones."""
        target = path_for(self.directory, step)
        with atomic_file(target) as stream:
            try:
                torch.save({"format": FORMAT_VERSION, "step": step, "final": final, **state}, stream)
            except RuntimeError as error:  # torch's zip writer on a failed write: "unexpected pos 11328 vs 11280"
                raise write_failure(self.directory, error) from None
        self._keep_newest(target)
        return target

    def discard(self, keep: Path | None = None) -> list[Path]:
        """Remove this run's checkpoints but ``keep`` (a finished run needs none to continue)."""
        removed = [p for p in self.usable if p != keep]
        for path in removed:
            self._remove(path)
        self.usable = [p for p in self.usable if p == keep]
        return removed

    # What differs between a file of torch.save and a directory of DCP shards
    # (scalerepro.training.sharded_checkpoint_store.ShardedCheckpointStore overrides these).

    def _candidates(self) -> list[Path]:
        return list_checkpoints(self.directory)

    def _read(self, path: Path) -> Any:
        # mmap: telling whether a file is usable must not read gigabytes of tensors
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)

    def _remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def _keep_newest(self, target: Path) -> None:
        """``target`` is the newest usable checkpoint; only the newest ``keep`` usable ones stay
        (files never known to be usable are not counted, so they never crowd a fresh one out)."""
        self.usable = [target, *(p for p in self.usable if p != target)]
        for old in self.usable[self.keep :]:
            self._remove(old)
        self.usable = self.usable[: self.keep]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else ""
