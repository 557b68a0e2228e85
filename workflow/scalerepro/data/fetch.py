"""Fetch the official CIFAR-10 archive and write the prepared layout of ``scalerepro.data.cifar10``.

    python -m scalerepro.data.fetch --out data/cifar10 [--url URL | --archive FILE] [--md5 HEX|'']
                               [--download-dir DIR] [--timeout S]

The archive is checked against the MD5 (and size) the CIFAR-10 page publishes before anything
in it is trusted, then read straight from the compressed stream: no member is ever written to
disk, and an archive holding a link, a special file, or an absolute or '..' member is refused
whole. Nothing partial survives a failure: the download streams into a ``.part`` file that is
renamed only once complete and verified, and ``cifar10.write`` stages the output and renames it.
A verified download is kept in --download-dir, so preparing again does not download again.
urllib honours the usual ``https_proxy``/``no_proxy`` variables, which cluster login nodes often need.

Exit codes: 0 prepared, or already prepared; 1 failed, with one line on stderr naming the problem
and the fix; 2 bad flags. Needs only the standard library and NumPy (no torch).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import io
import os
import pickle
import posixpath
import re
import secrets
import signal
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from types import FrameType
from typing import BinaryIO, NoReturn

import numpy as np

from scalerepro import __version__
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.data import cifar10

_PROG = "scalerepro.data.fetch"
OFFICIAL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
OFFICIAL_MD5 = "c58f30108f718f92721af3b95e74349a"  # as published on https://www.cs.toronto.edu/~kriz/cifar.html
OFFICIAL_SIZE = 170_498_071
ARCHIVE_NAME = "cifar-10-python.tar.gz"
BATCH_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
PIXELS = 3 * 32 * 32
CHUNK = 1 << 20
# An official batch is 31 MB. The cap bounds memory when an unverified archive claims a huge member.
MAX_MEMBER_BYTES = 64 << 20


class FetchError(CommandError):
    """The fetch failed; the message is one line naming the problem and the fix."""


# ---- download ---------------------------------------------------------------------------------


def download(url: str, dest: str | os.PathLike[str], md5: str | None, timeout: float, size: int | None = None) -> Path:
    """Stream ``url`` to ``dest``; ``dest`` appears only once the body is complete and verified.

    ``md5`` None skips the checksum; ``size``, when known, is checked against Content-Length
    before the body is read and against the bytes received after. ``timeout`` bounds the
    connection and every read, not the whole transfer.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A unique name, so concurrent fetches into one directory cannot interleave their bytes.
    part = dest.with_name(f"{dest.name}.{secrets.token_hex(4)}.part")
    try:
        with _open_url(url, timeout) as response, open(part, "xb") as sink:
            length = _content_length(response)
            if size is not None and length is not None and length != size:
                raise FetchError(f"{url} offers {length} bytes, but the CIFAR-10 archive has {size}: check --url")
            digest, received = _stream(url, response, sink, timeout)
        if length is not None and received < length:
            raise FetchError(f"truncated download from {url}: the connection closed after {received} of {length} bytes; retry")
        _compare(dest.name, digest, received, md5, size, fix="the download was corrupt or is not CIFAR-10: retry or check --url")
        # No fsync: a kept archive is verified again before it is reused.
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest


def _open_url(url: str, timeout: float) -> http.client.HTTPResponse:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise FetchError(f"cannot fetch '{url}': not an http(s) URL; pass one to --url, or a local file to --archive")
    request = urllib.request.Request(url, headers={"User-Agent": f"scalerepro/{__version__}"})
    offline = "check the network or pass --archive FILE (a pre-staged copy)"
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        error.close()
        raise FetchError(f"{url} answered HTTP {error.code} {error.reason}: check --url or pass --archive FILE (a pre-staged copy)") from None
    except urllib.error.URLError as error:
        raise FetchError(f"cannot reach {url}: {_reason(error.reason)}; {offline}") from None
    except (OSError, http.client.HTTPException) as error:  # a timeout or a broken reply before the body
        raise FetchError(f"cannot reach {url}: {_reason(error)}; {offline}") from None
    return response


def _content_length(response: http.client.HTTPResponse) -> int | None:
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def _stream(url: str, response: http.client.HTTPResponse, sink: BinaryIO, timeout: float) -> tuple[str, int]:
    """Copy the body in chunks, hashing as it goes; return (md5, bytes received)."""
    # usedforsecurity=False: FIPS-mode hosts (common on clusters) refuse MD5 otherwise. It
    # detects corruption and matches the published checksum; it does not authenticate.
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    while True:
        try:
            # read1, not read: it returns what has arrived instead of waiting for a full chunk, so
            # a stall is reported with the true byte count.
            chunk = response.read1(CHUNK)
        except TimeoutError:
            raise FetchError(f"download from {url} stalled: no data for {timeout:g} s after {received} bytes; retry, or raise --timeout") from None
        except http.client.IncompleteRead:  # a chunked body cut short
            raise FetchError(f"truncated download from {url}: the connection closed after {received} bytes; retry") from None
        except (OSError, http.client.HTTPException) as error:
            raise FetchError(f"download from {url} failed after {received} bytes ({_reason(error)}); retry") from None
        if not chunk:  # end of body; a short body is caught against Content-Length by the caller
            return digest.hexdigest(), received
        digest.update(chunk)
        try:
            sink.write(chunk)
        except OSError as error:
            raise FetchError(f"cannot write '{sink.name}': {_reason(error)}; free space there or pass --download-dir") from None
        received += len(chunk)


def _reason(error: object) -> str:
    """'Connection refused' rather than '[Errno 111] Connection refused'."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


# ---- verification -----------------------------------------------------------------------------


def file_md5(path: Path) -> tuple[str, int]:
    """(md5, size) of a file, read in chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def verify_file(path: Path, md5: str | None, size: int | None) -> str:
    """Return the file's md5; FetchError unless it matches ``md5`` and ``size`` (None: unchecked)."""
    try:
        digest, length = file_md5(path)
    except OSError as error:
        raise FetchError(f"cannot read the archive '{path}': {_reason(error)}; check the path given to --archive") from None
    _compare(path.name, digest, length, md5, size, fix="it is corrupt or not CIFAR-10: replace it with a good copy")
    return digest


def _compare(name: str, digest: str, length: int, md5: str | None, size: int | None, fix: str) -> None:
    if size is not None and length != size:
        raise FetchError(f"{name} has {length} bytes, but the CIFAR-10 archive has {size}; {fix}")
    if md5 is not None and digest != md5:
        raise FetchError(f"checksum mismatch for {name}: md5 {digest}, expected {md5}; {fix}")


# ---- reading the archive ----------------------------------------------------------------------


def read_batches(archive: str | os.PathLike[str]) -> dict[str, cifar10.Split]:
    """The train and test splits of an archive in the official python format, as prepared HWC arrays.

    It checks the format, not the checksum: verify the archive first (``verify_file``, ``download``).
    """
    raw = _read_members(Path(archive))
    names = _unpickle(META, raw.pop(META)).get(b"label_names")
    if names != [name.encode() for name in cifar10.CLASSES]:
        raise FetchError(f"{META} names the classes {names!r}, not CIFAR-10's: {_NOT_CIFAR}")
    train = [_to_split(name, _unpickle(name, raw.pop(name))) for name in TRAIN_BATCHES]
    return {
        "train": cifar10.Split(np.concatenate([s.images for s in train]), np.concatenate([s.labels for s in train])),
        "test": _to_split(TEST_BATCH, _unpickle(TEST_BATCH, raw.pop(TEST_BATCH))),
    }


_NOT_CIFAR = "this is not the official CIFAR-10 python archive; use one that matches the published md5"


def _read_members(archive: Path) -> dict[str, bytes]:
    """Check every member, and return the content of the batches and the metadata by base name."""
    wanted = {f"{BATCH_DIR}/{name}": name for name in (META, *TRAIN_BATCHES, TEST_BATCH)}
    found: dict[str, bytes] = {}
    try:
        # Stream mode: one sequential pass over the decompressed bytes, each wanted member read
        # into memory as it passes. Nothing is extracted, so no member can land anywhere; the
        # archive is still refused if any member would be unsafe to extract.
        with tarfile.open(archive, mode="r|gz") as tar:
            for member in tar:
                name = _checked_name(member)
                if name not in wanted:
                    continue
                if wanted[name] in found:  # on extraction the second copy would silently win
                    raise FetchError(f"archive member '{member.name}' appears twice: {_NOT_CIFAR}")
                if not member.isfile() or member.size > MAX_MEMBER_BYTES:
                    raise FetchError(f"archive member '{member.name}' is not a batch file: {_NOT_CIFAR}")
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file always has a handle
                found[wanted[name]] = handle.read()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise FetchError(f"cannot read '{archive}' as a tar.gz archive ({_reason(error)}): {_NOT_CIFAR}") from None
    missing = [path for path, name in wanted.items() if name not in found]
    if missing:
        raise FetchError(f"the archive has no member '{missing[0]}': {_NOT_CIFAR}")
    return found


def _checked_name(member: tarfile.TarInfo) -> str:
    """The member's normalised name; FetchError unless it is a plain file or directory that stays inside.

    What would escape the target or is a special file is decided by the standard library's data
    extraction filter (``tarfile.data_filter``, PEP 706), as if extracting to a fresh directory.
    Two refusals go beyond it: links of any kind (a batch is a regular file), and absolute names,
    which the filter would quietly make relative (no honest archive has one)."""
    if member.issym() or member.islnk():
        problem = f"is a link (to '{member.linkname}')"
    elif member.name.startswith("/"):
        problem = "escapes the target"
    else:
        try:
            tarfile.data_filter(member, _EXTRACTION_ROOT)
            return posixpath.normpath(member.name)  # "./a/b" -> "a/b"
        except tarfile.SpecialFileError:
            problem = "is a device, FIFO or other special file"
        except (tarfile.AbsolutePathError, tarfile.OutsideDestinationError):
            problem = "escapes the target"
        except tarfile.FilterError as error:
            problem = f"is refused by tarfile's data filter ({error})"
    raise FetchError(f"archive member '{member.name}' {problem}: refusing the archive; {_NOT_CIFAR}")


# Nothing is extracted: the filter only needs a directory to judge paths against.
_EXTRACTION_ROOT = "/nonexistent-scalerepro-extraction-root"


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles the official batches and nothing that could run code.

    The batches are Python 2 cPickle files: dicts of str, int and list, plus one uint8 ndarray.
    Unpickling untrusted data runs arbitrary code; the archive's MD5 matching the published one
    is the first defence, and this allow-list of the three globals that rebuild an ndarray is the
    second, for archives fetched with the check skipped.
    """

    _GLOBALS = {
        ("numpy.core.multiarray", "_reconstruct"): np.empty(0).__reduce__()[0],  # the name the official files use
        ("numpy._core.multiarray", "_reconstruct"): np.empty(0).__reduce__()[0],  # the name NumPy 2 writes
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    def find_class(self, module: str, name: str) -> object:
        try:
            return self._GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR-10 batch never does") from None


def _unpickle(name: str, raw: bytes) -> dict[object, object]:
    try:
        # encoding="bytes": the Python 2 str keys and pixel data arrive as bytes, as NumPy expects.
        value = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as error:  # noqa: BLE001 - malformed input raises anything from struct.error to KeyError
        raise FetchError(f"archive member '{name}' is not a CIFAR-10 batch ({_reason(error)}): {_NOT_CIFAR}") from None
    if not isinstance(value, dict):
        raise FetchError(f"archive member '{name}' is not a CIFAR-10 batch (a {type(value).__name__}, not a dict): {_NOT_CIFAR}")
    return value


def _to_split(name: str, batch: dict[object, object]) -> cifar10.Split:
    data, labels = batch.get(b"data"), batch.get(b"labels")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == PIXELS):
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise FetchError(f"{name}: b'data' is {found}, expected uint8 (N, {PIXELS}): {_NOT_CIFAR}")
    if not (isinstance(labels, list) and len(labels) == len(data) and all(type(label) is int for label in labels)):
        raise FetchError(f"{name}: b'labels' is not a list of {len(data)} ints, one per image: {_NOT_CIFAR}")
    label_array = np.array(labels, dtype=np.int64)
    if len(label_array) and (label_array.min() < 0 or label_array.max() >= len(cifar10.CLASSES)):
        raise FetchError(f"{name}: labels outside 0..{len(cifar10.CLASSES) - 1}: {_NOT_CIFAR}")
    # Each row holds the 32x32 red plane, then green, then blue (CHW); the prepared layout is HWC.
    return cifar10.Split(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), label_array)


# ---- command line -----------------------------------------------------------------------------


def _md5_flag(value: str) -> str:
    if value and not re.fullmatch(r"[0-9a-fA-F]{32}", value):
        raise argparse.ArgumentTypeError(f"'{value}' is not an MD5 (32 hex digits, or '' to skip the check)")
    return value.lower()


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"'{value}' is not a positive number of seconds")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog=_PROG, description="Download, verify and convert CIFAR-10 to the prepared layout.")
    parser.add_argument("--out", required=True, metavar="DIR", help="the prepared directory to write")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--url", default=OFFICIAL_URL, help="where to download the archive (default: %(default)s)")
    source.add_argument("--archive", metavar="FILE", help="a pre-staged archive to use instead of downloading")
    parser.add_argument(
        "--md5", type=_md5_flag, default=OFFICIAL_MD5, metavar="HEX", help="expected MD5 of the archive; '' skips the check (default: the published one)"
    )
    parser.add_argument("--download-dir", metavar="DIR", help="where the verified download is kept (default: the parent of --out; unused with --archive)")
    parser.add_argument(
        "--timeout", type=_seconds, default=60.0, metavar="S", help="seconds to wait for the connection and for each read (default: %(default)g)"
    )
    return parser


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)  # exits 2 with one line on a bad flag
    out = Path(args.out)
    for stale in cifar10.remove_stale_staging(out):
        print(f"{_PROG}: removed '{stale}', left half-written by a fetch that was killed")
    if out.exists():
        return _already_prepared(out)
    archive, source = _obtain(args, out)
    splits = read_batches(archive)
    cifar10.write(out, splits, source=source)  # a full or read-only file system: the boundary's one line
    print(f"{_PROG}: prepared '{out}': {len(splits['train'].labels)} train and {len(splits['test'].labels)} test images")
    return 0


def _already_prepared(out: Path) -> int:
    try:
        splits = cifar10.load(out, mmap=True)  # validates shapes without reading the images
    except cifar10.DatasetError:
        raise FetchError(f"'{out}' exists but is not a prepared CIFAR-10 directory: remove it and run again") from None
    print(f"{_PROG}: '{out}' already holds {len(splits['train'].labels)} train and {len(splits['test'].labels)} test images: nothing to do")
    return 0


def _obtain(args: argparse.Namespace, out: Path) -> tuple[Path, str]:
    """A verified archive and the provenance line for the manifest."""
    md5: str | None = args.md5 or None
    size = OFFICIAL_SIZE if md5 == OFFICIAL_MD5 else None
    if md5 is None:
        print(f"{_PROG}: warning: --md5 '' skips the checksum: the archive is not verified to be CIFAR-10", file=sys.stderr)
    if args.archive:
        archive = Path(args.archive)
        digest = verify_file(archive, md5, size)
        return archive, f"{archive.resolve()} (md5 {digest}{'' if md5 else ', unverified'})"

    archive = Path(args.download_dir or out.parent) / ARCHIVE_NAME
    # Without an expected checksum there is no telling what a kept file is: download afresh.
    if md5 is not None and archive.is_file() and _matches(archive, md5, size):
        print(f"{_PROG}: using the verified archive already at '{archive}'")
    else:
        print(f"{_PROG}: downloading {args.url} to '{archive}'", flush=True)
        started = time.monotonic()
        download(args.url, archive, md5, args.timeout, size)
        megabytes, seconds = archive.stat().st_size / 1e6, time.monotonic() - started
        print(f"{_PROG}: downloaded {megabytes:.1f} MB in {seconds:.1f} s ({megabytes / max(seconds, 1e-3):.1f} MB/s)")
    digest = md5 or file_md5(archive)[0]
    return archive, f"{args.url} (md5 {digest}{'' if md5 else ', unverified'})"


def _matches(path: Path, md5: str, size: int | None) -> bool:
    digest, length = file_md5(path)
    return digest == md5 and size in (None, length)


def _stop(signum: int, _frame: FrameType | None) -> NoReturn:
    # Slurm and Snakemake stop a job with SIGTERM. Turning it into SystemExit runs the cleanup
    # (the .part file, cifar10.write's staging directory) that the default action would skip,
    # and Ctrl-C gets the same one line instead of a traceback.
    print(f"{_PROG}: error: stopped by {signal.Signals(signum).name}; nothing partial is kept: run again", file=sys.stderr)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sys.exit(main())
