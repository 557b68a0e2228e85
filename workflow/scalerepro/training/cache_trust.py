"""Which compile cache files a run may load: only those this user's own runs wrote.

A compile cache is code. ``torch.compiler.load_cache_artifacts`` writes each artifact to a path
built from its key under torch's cache folder (an absolute key, or one with ``..``, writes
anywhere: a 130-byte file can plant a ``sitecustomize.py`` that the next Python runs), and the
inductor, AOT-autograd and precompile artifacts are pickles that torch unpickles and runs when a
compile hits them. So a cache file is loaded only when:

- it and its folder belong to this user and no one else can write them (``verified_payload``);
- it carries its own signature, an HMAC-SHA256 of torch's bytes keyed by this user's secret key
  (``key_path``: created 0600 in a 0700 folder on the first save, and readable by no one else);
- every artifact key stays inside torch's cache folder, read from torch's container without
  unpickling anything.

The signature is the file's first line rather than a file beside it, so that one rename writes
both and no crash or second writer can leave bytes and signature that do not belong together.
A cache copied from another machine or user carries another key's signature and is refused; one
that its user has vetted is re-signed with ``python -m scalerepro.training.cache_trust sign FILE``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import sys
import tempfile
from pathlib import Path

from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import atomic_file, current_umask, ownership_problem

# The first line of a signed cache: this prefix, the HMAC's 64 hex digits, a newline; torch's bytes follow.
SIGNATURE_PREFIX = b"scalerepro compile cache, hmac-sha256 "
_SIGNATURE_LINE = len(SIGNATURE_PREFIX) + 64 + 1
_KEY_BYTES = 32
# The container version of torch's AppendingByteSerializer that this reader knows (torch 2.13)
_TORCH_CONTAINER_VERSION = 1
SIGN_COMMAND = "python -m scalerepro.training.cache_trust sign FILE"


class CacheRefused(CommandError):
    """A cache file this user cannot vouch for; the message says why and what to do."""


def key_path() -> Path:
    """This user's compile-cache key: ``$XDG_CONFIG_HOME/scalerepro/compile-cache.key``, where
    XDG_CONFIG_HOME defaults to ``~/.config``."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "scalerepro" / "compile-cache.key"


def _refuse_unless_private(path: Path, info: os.stat_result, forbidden: int) -> None:
    """Refuse ``path`` unless this user owns it and ``forbidden`` (mode bits of group and others) is clear."""
    problem = ownership_problem(path, info, forbidden)
    if problem is not None:
        raise CacheRefused(problem)


def _read_key(path: Path) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CacheRefused(f"this user has no compile-cache key yet ({path}): a cache is loaded only after a run of this user wrote it") from None
    except OSError as error:
        raise CacheRefused(f"this user's compile-cache key {path} cannot be read ({error.strerror}): it must be a file of its own, not a link") from None
    with os.fdopen(descriptor, "rb") as stream:
        # anyone who can read the key can sign a cache; anyone who can replace it, or its folder, chose it
        _refuse_unless_private(path, os.fstat(descriptor), 0o077)
        _refuse_unless_private(path.parent, os.stat(path.parent), 0o022)
        text = stream.read(4 * _KEY_BYTES)
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != _KEY_BYTES:
        raise CacheRefused(f"{path} is not a compile-cache key ({2 * _KEY_BYTES} hex digits): delete it (a new one is made at the next save)")
    return key


def _key_made_if_absent() -> bytes:
    """This user's key, made on first use: a 0600 file in a 0700 folder, linked into place whole
    (two runs saving at once both end with the one that was linked first)."""
    path = key_path()
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp makes it 0600
        try:
            with os.fdopen(descriptor, "w") as stream:
                stream.write(secrets.token_hex(_KEY_BYTES) + "\n")
                stream.flush()
                os.fsync(stream.fileno())
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
    return _read_key(path)


def _signature_line(key: bytes, payload: bytes) -> bytes:
    return SIGNATURE_PREFIX + hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii") + b"\n"


class _Reader:
    """torch's ``BytesReader`` (torch/utils/_appending_byte_serializer.py), bounds-checked: a
    4-byte CRC, then big-endian uint64 lengths, strings as base64 of UTF-8."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 4

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise CacheRefused("it ends early: not a whole cache file of this torch, delete it")
        chunk, self.at = self.data[self.at : self.at + size], self.at + size
        return chunk

    def uint64(self) -> int:
        return int.from_bytes(self.take(8), "big")

    def text(self) -> str:
        # strict base64: torch's decoder skips stray characters, so only canonical text reads the same to both
        try:
            return base64.b64decode(self.take(self.uint64()), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise CacheRefused("a name in it is not base64 of UTF-8 text: not a cache file of this torch, delete it") from None


def artifact_keys(payload: bytes) -> list[tuple[str, str]]:
    """Each artifact's (kind, key) in torch's cache container, read without unpickling anything
    (torch's ``CacheArtifactManager.serialize``: per kind, its name, a count, then each artifact's
    key and content)."""
    reader = _Reader(payload)
    version = reader.uint64()
    if version != _TORCH_CONTAINER_VERSION:
        raise CacheRefused(f"its container version is {version}, not this torch's {_TORCH_CONTAINER_VERSION}: it is not a cache file of this torch")
    keys = []
    while reader.at < len(payload):
        kind = reader.text()
        for _ in range(reader.uint64()):
            keys.append((kind, reader.text()))
            reader.take(reader.uint64())  # the content: a pickle, left unread
    return keys


def check_keys_stay_inside(payload: bytes) -> None:
    """Refuse a cache whose artifact keys name a path outside torch's cache folder. Each kind
    joins its key under the folder (``os.path.join``, which restarts at an absolute part);
    inductor also joins ``key[1:3]`` as a folder before the key."""
    for kind, key in artifact_keys(payload):
        parts = [key[1:3], key] if kind == "inductor" else [key]
        if not key or any("\0" in part or part.startswith("/") or ".." in part.split("/") for part in parts):
            raise CacheRefused(f"its {kind} artifact key {key!r} names a path outside torch's cache folder: a planted file, delete it")


def verified_payload(path: Path) -> bytes:
    """torch's bytes from the cache file at ``path``, once it is this user's, signed with this
    user's key, and every artifact key in it stays inside torch's cache folder; else CacheRefused."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise CacheRefused(f"it cannot be opened as a file of its own ({error.strerror}): name the cache file itself, not a link") from None
    with os.fdopen(descriptor, "rb") as stream:
        _refuse_unless_private(path, os.fstat(descriptor), 0o022)
        _refuse_unless_private(path.parent, os.stat(path.parent), 0o022)
        data = stream.read()
    line, payload = data[:_SIGNATURE_LINE], data[_SIGNATURE_LINE:]
    if not line.startswith(SIGNATURE_PREFIX):
        raise CacheRefused(f"it is not signed by a scalerepro run: vet a cache from elsewhere, then re-sign it ({SIGN_COMMAND})")
    if not hmac.compare_digest(line, _signature_line(_read_key(key_path()), payload)):
        raise CacheRefused(
            f"its signature does not match its bytes under this user's key (changed since it was written, or from another machine or user): "
            f"delete it, or vet it and re-sign it ({SIGN_COMMAND})"
        )
    # the provenance above is what makes the pickles inside trusted; the key check is defense in depth
    check_keys_stay_inside(payload)
    return payload


def write_signed(path: Path, payload: bytes) -> int:
    """Write torch's cache bytes to ``path`` with this user's signature, whole or not at all, in a
    folder and with a mode no one else can write (as ``verified_payload`` requires); the bytes
    written."""
    signed = _signature_line(_key_made_if_absent(), payload) + payload
    folder_made = not path.parent.exists()
    with atomic_file(path) as stream:
        stream.write(signed)
    private = 0o777 & ~current_umask() & ~0o022  # a umask of 002, usual on clusters, would open both to the group
    os.chmod(path, private & 0o666)
    if folder_made:
        os.chmod(path.parent, private)
    return len(signed)


@error_boundary("python -m scalerepro.training.cache_trust")
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog="python -m scalerepro.training.cache_trust", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sign = commands.add_parser(
        "sign", help="sign compile cache files you have vetted (e.g. carried from another machine) with this user's key, so runs load them"
    )
    sign.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.files:
        data = path.read_bytes()
        payload = data[_SIGNATURE_LINE:] if data.startswith(SIGNATURE_PREFIX) else data
        try:
            check_keys_stay_inside(payload)
        except CacheRefused as refusal:
            raise CacheRefused(f"{path}: not signed: {refusal}") from None
        write_signed(path, payload)
        print(f"signed {path} with {key_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
