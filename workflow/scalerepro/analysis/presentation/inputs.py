"""The report's inputs as a reader should get them.

A figure whose table has no data is still drawn (``plots.placeholder``), so that the workflow's
outputs exist, and the file says so in its own metadata: the description "not measured: <why>"
(SVG ``dc:description``, PNG ``Description`` text chunk). The report reads that note and shows
the figure as one line instead of a large empty image.

Tool output captured into the inventory (``nvidia-smi topo -m``) may carry terminal escapes; an
inventory written before the capture stripped them is shown without them.

On the analysis side: no torch, no matplotlib.
"""

from __future__ import annotations

import html
import re
import struct
import zlib
from collections.abc import Mapping
from typing import Any

from scalerepro.common.terminal import strip_terminal_escapes

NOT_MEASURED = "not measured: "  # how a placeholder's description begins
_SVG_DESCRIPTION = re.compile(rb"<dc:description>(.*?)</dc:description>", re.S)
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def placeholder_metadata(why: str) -> dict[str, dict[str, Any]]:
    """``savefig(metadata=...)`` for a placeholder, per format: the note, and no date or
    software version (the files stay the same from run to run)."""
    note = {"Description": NOT_MEASURED + why}
    return {"svg": {"Date": None, **note}, "png": {"Software": None, **note}}


def _png_text(data: bytes, keyword: bytes) -> str | None:
    """The tEXt, zTXt or iTXt chunk ``keyword`` of a PNG, before the image data."""
    offset = len(_PNG_SIGNATURE)
    while offset + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[offset : offset + 8])
        body = data[offset + 8 : offset + 8 + length]
        offset += 12 + length
        if kind == b"IDAT":
            return None  # matplotlib writes its text chunks before the pixels
        name, _, rest = body.partition(b"\0")
        if name != keyword:
            continue
        if kind == b"tEXt":
            return rest.decode("latin-1")
        if kind == b"zTXt":
            return zlib.decompress(rest[1:]).decode("latin-1")
        if kind == b"iTXt":  # flag, method, language \0, translated keyword \0, text
            compressed, rest = rest[0], rest[2:]
            text = rest.split(b"\0", 2)[2]
            return (zlib.decompress(text) if compressed else text).decode("utf-8")
    return None


def not_measured_note(data: bytes, extension: str) -> str | None:
    """Why a figure file is a placeholder (its description after "not measured: "), or None
    for a figure with data."""
    if extension == "svg":
        match = _SVG_DESCRIPTION.search(data[:8192])
        description = html.unescape(match.group(1).decode("utf-8")) if match else None
    elif extension == "png" and data.startswith(_PNG_SIGNATURE):
        description = _png_text(data, b"Description")
    else:
        description = None
    if description is None or not description.startswith(NOT_MEASURED):
        return None
    return description[len(NOT_MEASURED) :].strip()


def readable_inventory(inventory: Any) -> Any:
    """The inventory with every string's terminal escapes removed, its structure as it is."""
    if isinstance(inventory, str):
        return strip_terminal_escapes(inventory)
    if isinstance(inventory, Mapping):
        return {key: readable_inventory(value) for key, value in inventory.items()}
    if isinstance(inventory, list):
        return [readable_inventory(value) for value in inventory]
    return inventory
