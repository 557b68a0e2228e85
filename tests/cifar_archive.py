"""Small archives in the official CIFAR-10 python format, for testing the fetch without the 170 MB download.

The official batches are Python 2 cPickle (protocol 2) files. ``legacy_pickle`` writes the same
opcodes Python 2 wrote: str as BINSTRING (so it unpickles as bytes with encoding="bytes") and the
pixel array through ``numpy.core.multiarray._reconstruct``, the global names the real files use.
Python 3's pickle would write neither, and a test on its output would miss what the real archive needs.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalerepro.data import cifar10
from scalerepro.data.fetch import BATCH_DIR, META, TEST_BATCH, TRAIN_BATCHES


@dataclass(frozen=True)
class Batch:
    data: np.ndarray  # uint8 (n, 3072): per image the red 32x32 plane, then green, then blue (CHW)
    labels: list[int]


def random_batches(per_batch: int = 20, seed: int = 0) -> dict[str, Batch]:
    """Five training batches and a test batch of random pixels and labels, keyed by member base name."""
    rng = np.random.default_rng(seed)
    return {
        name: Batch(rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), rng.integers(0, 10, per_batch).tolist()) for name in (*TRAIN_BATCHES, TEST_BATCH)
    }


def official_files(batches: dict[str, Batch]) -> dict[str, bytes]:
    """Member base name -> content, as in cifar-10-batches-py/ of the official archive."""
    files = {META: meta_file(), "readme.html": b"<html>the official archive carries a readme</html>\n"}
    for name, batch in batches.items():
        files[name] = legacy_pickle(
            {
                b"batch_label": f"{name} of the test archive".encode(),
                b"labels": batch.labels,
                b"data": batch.data,
                b"filenames": [f"image_{i:06d}.png".encode() for i in range(len(batch.labels))],
            }
        )
    return files


def meta_file(label_names: Iterable[str] = cifar10.CLASSES) -> bytes:
    return legacy_pickle({b"num_cases_per_batch": 10000, b"label_names": [n.encode() for n in label_names], b"num_vis": 3072})


def write_archive(path: Path, files: dict[str, bytes], extra: Iterable[tuple[tarfile.TarInfo, bytes]] = ()) -> str:
    """tar.gz ``files`` under cifar-10-batches-py/, then the ``extra`` members as given; return the md5."""
    with tarfile.open(path, "w:gz") as tar:
        directory = tarfile.TarInfo(BATCH_DIR)
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(directory)
        for name, content in files.items():
            info = tarfile.TarInfo(f"{BATCH_DIR}/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        for info, content in extra:
            info.size = len(content) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return hashlib.md5(path.read_bytes()).hexdigest()


def legacy_pickle(value: object) -> bytes:
    """Serialise dicts, lists, ints, bytes (as Python 2 str) and 2-d uint8 arrays as Python 2's cPickle did."""
    out = bytearray(pickle.PROTO + b"\x02")
    _emit(value, out)
    return bytes(out + pickle.STOP)


def _emit(value: object, out: bytearray) -> None:
    if isinstance(value, bytes):
        header = pickle.SHORT_BINSTRING + bytes([len(value)]) if len(value) < 256 else pickle.BINSTRING + struct.pack("<i", len(value))
        out += header + value
    elif isinstance(value, int):
        out += pickle.BININT + struct.pack("<i", value)
    elif isinstance(value, list):
        out += pickle.EMPTY_LIST + pickle.MARK
        for item in value:
            _emit(item, out)
        out += pickle.APPENDS
    elif isinstance(value, dict):
        out += pickle.EMPTY_DICT + pickle.MARK
        for key, item in value.items():
            _emit(key, out)
            _emit(item, out)
        out += pickle.SETITEMS
    elif isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 2:
        # ndarray.__reduce__ under Python 2: _reconstruct(ndarray, (0,), 'b'), then
        # __setstate__((1, shape, dtype('u1'), False, raw bytes)), the dtype rebuilt the same way.
        out += pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n" + pickle.GLOBAL + b"numpy\nndarray\n"
        out += pickle.BININT1 + b"\x00" + pickle.TUPLE1 + pickle.SHORT_BINSTRING + b"\x01b" + pickle.TUPLE3 + pickle.REDUCE
        out += pickle.MARK + pickle.BININT1 + b"\x01"
        _emit(value.shape[0], out)
        _emit(value.shape[1], out)
        out += pickle.TUPLE2
        out += pickle.GLOBAL + b"numpy\ndtype\n" + pickle.SHORT_BINSTRING + b"\x02u1"
        out += pickle.BININT1 + b"\x00" + pickle.BININT1 + b"\x01" + pickle.TUPLE3 + pickle.REDUCE
        out += pickle.MARK + pickle.BININT1 + b"\x03" + pickle.SHORT_BINSTRING + b"\x01|" + pickle.NONE * 3
        out += pickle.BININT + struct.pack("<i", -1) + pickle.BININT + struct.pack("<i", -1) + pickle.BININT1 + b"\x00"
        out += pickle.TUPLE + pickle.BUILD + pickle.NEWFALSE
        _emit(np.ascontiguousarray(value).tobytes(), out)
        out += pickle.TUPLE + pickle.BUILD
    else:
        raise TypeError(f"legacy_pickle cannot write {type(value).__name__}")
