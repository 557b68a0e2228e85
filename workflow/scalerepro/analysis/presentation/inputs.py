"""The report's inputs, read: tables as rows, JSON and YAML documents, figures as data URIs, the inventory without terminal escapes.

A table that is missing or empty reads as an empty frame, a document that is not there as None,
and a figure that is missing or not what its extension says as a ``Figure`` with no URI and the
reason: the report shows each as a hole, never as an error.

A figure whose table has no data is still drawn (``plots.placeholder``), so that the workflow's
outputs exist, and the file says so in its own metadata: the description "not measured: <why>"
(SVG ``dc:description``, PNG ``Description`` text chunk). The report reads that note and shows
the figure as one line instead of a large empty image.

Tool output captured into the inventory (``nvidia-smi topo -m``) may carry terminal escapes; an
inventory written before the capture stripped them is shown without them.

On the analysis side: no torch, no matplotlib.
"""

from __future__ import annotations

import base64
import html
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.values import plain
from scalerepro.common.cli import CommandError
from scalerepro.common.files import JsonFileError, read_json_object
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


def read_table(tables_dir: Path, name: str) -> pd.DataFrame:
    """``<tables_dir>/<name>.csv`` as a DataFrame; an empty one when the file is missing, empty
    or has a header only. Columns are read by name by the callers, never by position. A file
    that is there but is not CSV is an error naming it (a bug upstream, not a hole)."""
    path = Path(tables_dir) / f"{name}.csv"
    if not path.is_file():
        return pd.DataFrame()
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except pd.errors.ParserError as error:
        raise ValueError(f"{path}: not a valid CSV table: {error}") from error


def read_json(path: Path | None) -> Any:
    """A JSON document, or None when the path is not given or not a file."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return read_json_object(path, what="JSON input", max_bytes=64 << 20)
    except JsonFileError as error:
        raise CommandError(f"{error}: give the file the workflow wrote there") from None


class Row(dict):
    """One table row. A column the table does not have reads as None, so the template shows
    "—" instead of failing when an optional column is absent."""

    def __missing__(self, key: str) -> None:
        return None


def rows(frame: pd.DataFrame, sort_by: Sequence[str] = ()) -> list[Row]:
    """The frame's rows as :class:`Row` dicts, sorted by those of ``sort_by`` that it has."""
    if frame.empty:
        return []
    keys = [key for key in sort_by if key in frame.columns]
    if keys:
        frame = frame.sort_values(keys, kind="stable", na_position="last")
    return [Row({column: plain(value) for column, value in record.items()}) for record in frame.to_dict("records")]


@dataclass(frozen=True)
class Figure:
    name: str
    uri: str | None  # the data: URI, or None when no usable file was found
    file: str | None  # which file was embedded
    problem: str | None  # why there is no figure
    not_measured: str | None = None  # a placeholder's reason: the report shows this line, no image


def load_figure(plots_dir: Path | None, name: str) -> Figure:
    """Embed ``<name>.svg`` (preferred) or ``<name>.png`` as a data URI; a file that is empty or
    is not what its extension says is skipped, so the report shows a hole, not a broken image;
    a placeholder (plots drew no data) is not embedded, its reason is shown instead."""
    if plots_dir is None:
        return Figure(name, None, None, "no plots directory was given")
    problems = []
    for extension, mime in (("svg", "image/svg+xml"), ("png", "image/png")):
        path = Path(plots_dir) / f"{name}.{extension}"
        if not path.is_file():
            continue
        data = path.read_bytes()
        if extension == "svg" and b"<svg" not in data[:4096]:
            problems.append(f"{path.name} is not an SVG document")
            continue
        if extension == "png" and not data.startswith(_PNG_SIGNATURE):
            problems.append(f"{path.name} is not a PNG image")
            continue
        why = not_measured_note(data, extension)
        if why is not None:
            return Figure(name, None, path.name, None, why)
        uri = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
        return Figure(name, uri, path.name, None)
    if not problems:
        problems.append(f"neither {name}.svg nor {name}.png is in {plots_dir}")
    return Figure(name, None, None, "; ".join(problems))


def require_aggregation(tables: Path, runs: bool = True) -> None:
    """Refuse a tables folder the aggregation did not write (``runs``: its runs.csv is needed, as
    every figure and section of a study is; the store's figures alone read other tables): figures
    and a report from no tables would read as a study that measured nothing, and exit 0."""
    if not tables.is_dir():
        raise CommandError(f"--tables {tables}: no such folder: give the aggregation's output (results/tables)")
    if runs and not (tables / "runs.csv").is_file():
        raise CommandError(
            f"--tables {tables}: no runs.csv there, so nothing was aggregated: run the aggregate rule "
            "(python -m scalerepro.analysis.tables.aggregate ... --out this folder) first"
        )
