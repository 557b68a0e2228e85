"""Atomic file writes: a reader sees the old file or the new one, never a torn one.

Write to a temporary file in the target's directory, flush it to disk, give it the mode a plain
``open`` would (mkstemp makes it private, 0600, which hides results from a cluster group), then
rename it over the target. Standard library only: both sides of the project use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary stream; on a clean exit it replaces ``path``, on an error it is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# Top-level entry points that only give an analysis command its short name
# (``python -m scalerepro.compare``): analysis code, not the trainer's.
ANALYSIS_ENTRY_POINTS = ("compare.py", "bundle.py")


def trainer_source_files(package: Path) -> list[Path]:
    """The trainer's sources in ``package`` (the scalerepro folder), in path order: every ``.py``
    file outside ``analysis/`` and the analysis entry points. Editing one reruns the training
    jobs (the workflow's trainer fingerprint) and makes checkpoints of the old code unusable
    (``scalerepro.checkpoint.code_hash``)."""
    return sorted(
        path
        for path in package.rglob("*.py")
        if "analysis" not in path.relative_to(package).parts and path.relative_to(package).as_posix() not in ANALYSIS_ENTRY_POINTS
    )


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks (hashlib.file_digest needs Python 3.11)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
