"""The prepared CIFAR-10 layout: what the workflow's fetch rule writes and the trainer reads.

A prepared directory holds four NumPy arrays and a small manifest:

    train_images.npy  uint8  (50000, 32, 32, 3)   HWC, RGB (the official batches store CHW rows)
    train_labels.npy  int64  (50000,)             class index 0..9
    test_images.npy   uint8  (10000, 32, 32, 3)
    test_labels.npy   int64  (10000,)
    manifest.json     {"format": 1, "classes": [...], "source": ..., "sha256": {...}}

This module needs only NumPy, so the fetch rule's environment does not need torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalerepro.common.cli import CommandError
from scalerepro.common.files import current_umask, sha256_of

DATASET_FORMAT_VERSION = 1
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
IMAGE_SHAPE = (32, 32, 3)
SPLITS = ("train", "test")
DATASET_MANIFEST = "manifest.json"


class DatasetError(CommandError, ValueError):
    """A prepared dataset is missing or malformed; the message is one line with the fix."""


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 (N, 32, 32, 3)
    labels: np.ndarray  # int64 (N,)


def _fix_hint(path: Path) -> str:
    return f"run the workflow's fetch rule to prepare it (snakemake {path}) or train with --data synthetic"


def load(path: str | os.PathLike[str], mmap: bool = False) -> dict[str, Split]:
    """Read and validate a prepared directory; raise DatasetError naming what is wrong."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"dataset directory '{root}' does not exist: {_fix_hint(root)}")
    manifest_path = root / DATASET_MANIFEST
    if not manifest_path.is_file():
        raise DatasetError(f"'{root}' is not a prepared CIFAR-10 directory (no {DATASET_MANIFEST}): {_fix_hint(root)}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(f"'{manifest_path}' is not valid JSON ({error}): {_fix_hint(root)}") from None
    if manifest.get("format") != DATASET_FORMAT_VERSION:
        raise DatasetError(f"'{root}' has layout format {manifest.get('format')!r}, expected {DATASET_FORMAT_VERSION}: {_fix_hint(root)}")

    splits: dict[str, Split] = {}
    for name in SPLITS:
        arrays = []
        for kind in ("images", "labels"):
            file = root / f"{name}_{kind}.npy"
            try:
                arrays.append(np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False))
            except FileNotFoundError:
                raise DatasetError(f"'{file}' is missing: {_fix_hint(root)}") from None
            except ValueError as error:
                raise DatasetError(f"'{file}' is not a readable .npy array ({error}): {_fix_hint(root)}") from None
        images, labels = arrays
        if images.dtype != np.uint8 or images.shape[1:] != IMAGE_SHAPE:
            raise DatasetError(f"'{root}/{name}_images.npy' has dtype {images.dtype} shape {images.shape}, expected uint8 (N, 32, 32, 3): {_fix_hint(root)}")
        if labels.shape != (images.shape[0],) or labels.dtype != np.int64:
            raise DatasetError(f"'{root}/{name}_labels.npy' must be int64 with one label per image: {_fix_hint(root)}")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(CLASSES)):
            raise DatasetError(f"'{root}/{name}_labels.npy' has labels outside 0..9: {_fix_hint(root)}")
        splits[name] = Split(images, labels)
    return splits


def write(path: str | os.PathLike[str], splits: dict[str, Split], source: str) -> None:
    """Write a prepared directory atomically: into a sibling temporary directory, then rename.

    A crash half-way leaves no directory that ``load`` would accept.
    """
    root = Path(path)
    root.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(root)
    # The writer's pid is in the name, so a later run can tell a dead writer's leftovers (SIGKILL
    # skips the cleanup below) from a live one's.
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.{os.getpid()}.", dir=root.parent))
    try:
        digests = {}
        for name in SPLITS:
            split = splits[name]
            for kind, array in (("images", split.images), ("labels", split.labels)):
                file = staging / f"{name}_{kind}.npy"
                np.save(file, np.ascontiguousarray(array), allow_pickle=False)
                digests[file.name] = sha256_of(file)
        manifest = {"format": DATASET_FORMAT_VERSION, "classes": list(CLASSES), "source": source, "sha256": digests}
        (staging / DATASET_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if root.exists():
            raise DatasetError(f"'{root}' already exists; remove it to prepare the dataset again")
        # mkdtemp makes the directory private (0700); a shared cluster's group must read it.
        staging.chmod(0o777 & ~current_umask())
        staging.rename(root)
    except BaseException:
        for file in staging.glob("*"):
            file.unlink()
        staging.rmdir()
        raise


def remove_stale_staging(root: Path) -> list[Path]:
    """Remove the staging directories of ``write`` calls whose process is gone (killed with
    SIGKILL, or by the OOM killer, half-way); return them. A live writer's directory is kept."""
    removed = []
    for staging in root.parent.glob(f".{root.name}.*"):
        owner = staging.name.removeprefix(f".{root.name}.").split(".")[0]
        if staging.is_dir() and not (owner.isdigit() and _alive(int(owner))):
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
