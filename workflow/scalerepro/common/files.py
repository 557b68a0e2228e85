"""Atomic file writes: a reader sees the old file or the new one, never a torn one; bounded
reads of a JSON object from a file that is data until checked; and whether a file or folder is
this user's alone (``ownership_problem``).

Write to a temporary file in the target's directory, flush it to disk, give it the mode a plain
``open`` would (mkstemp makes it private, 0600, which hides results from a cluster group), then
rename it over the target. Standard library only: both sides of the project use it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from scalerepro.common.cli import CommandError


def ownership_problem(path: str | os.PathLike[str], info: os.stat_result, forbidden: int) -> str | None:
    """Why ``path`` (``info``: its stat, taken without following a link) is not this user's alone,
    with the fix, or None. It must belong to this user and have none of the ``forbidden`` mode
    bits: 0o022, no one else writes it (a cache whose contents run as code); 0o077, no one else
    reaches it (a socket's folder, a secret key). A file or folder on a shared machine is trusted
    for what it is, never for where it lies."""
    if info.st_uid != os.geteuid():
        return f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): use one of your own"
    mode = stat.S_IMODE(info.st_mode)
    if mode & forbidden:
        return f"{path} has mode {mode:o}, open to group or others: chmod {mode & ~forbidden:o} {path}"
    return None


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary stream; on a clean exit it replaces ``path``, on an error it is removed."""
    target = Path(path)
    if target.is_dir():  # the rename at the end would fail, after all the work
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, target)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        if error.filename in (None, temporary):  # name the file the caller asked for, not the temporary
            raise OSError(error.errno, error.strerror, str(target)) from error
        raise
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks (hashlib.file_digest needs Python 3.11)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomically(path: str | os.PathLike[str], document: dict[str, Any]) -> None:
    """Write ``document`` as JSON (no NaN: a record must be JSON any reader takes); readers see
    the old file or the new one, never a torn one."""
    with atomic_file(path) as stream:
        stream.write((json.dumps(document, indent=2, allow_nan=False) + "\n").encode())


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    with atomic_file(path) as stream:
        stream.write(text.encode("utf-8"))


def utc_now() -> str:
    """Now, in UTC, as the ISO 8601 text every record and store row carries (milliseconds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


# A run record is tens to hundreds of KiB (its loss log grows with the steps: 100,000 logged steps
# are ~10 MiB); 64 MiB is no document the project writes, and reading it whole is what a bound is for.
MAX_JSON_BYTES = 64 << 20


class JsonFileError(CommandError, ValueError):
    """A file that is not the JSON document it should be; one line naming it."""


def read_json_object(path: str | os.PathLike[str], what: str = "run record", max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``, read within bounds: at most ``max_bytes``, nested no deeper than
    Python's parser allows (a RecursionError is a JsonFileError here), UTF-8, an object at the
    top. FileNotFoundError passes through (a missing file is a hole of its own kind)."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise JsonFileError(f"{what} {path} is {size / 2**20:.0f} MiB, larger than any {what} ({max_bytes >> 20} MiB): not read")
    try:
        document = json.loads(path.read_bytes())
    except RecursionError:
        raise JsonFileError(f"{what} {path} is nested deeper than any {what}: not read") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise JsonFileError(f"{what} {path} is not JSON ({str(error).splitlines()[0][:120]})") from None
    if not isinstance(document, dict):
        raise JsonFileError(f"{what} {path} holds a JSON {type(document).__name__}, not an object")
    return document


def with_generated_part(current: str, markers: tuple[str, str], body: str, where: object) -> str:
    """``current``, a document with a part a command writes between two marker lines, with that
    part replaced by ``body`` (the prose around it kept); ValueError naming ``where`` and the
    marker where either is missing."""
    begin, end = markers
    head, found, rest = current.partition(begin)
    if not found:
        raise ValueError(f"{where} has no line {begin!r} to put the generated part after")
    _, found, tail = rest.partition(end)
    if not found:
        raise ValueError(f"{where} has no line {end!r} after its generated part")
    return f"{head}{begin}\n\n{body}\n{end}{tail}"
