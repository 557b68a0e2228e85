"""The SHA-256 of every table the aggregation writes, kept in its summary.json, and the one check the
readers of those tables (the report and the figures) make before they show a figure of them.

The aggregation (``aggregate.write_tables``) writes each table of AGGREGATE_TABLES, then
summary.json with ``table_sha256``: a line per table, ``<sha256>  <name>.csv``, as ``sha256sum -c``
reads them. ``check`` refuses a tables folder where a table with rows is not, byte for byte, the one
summary.json lists: a figure edited in a table after the aggregation (or a table copied in from
elsewhere, or left from an older aggregation) is never published as measured. One line says which
table and how to make it again; nothing is written. A table that is absent or has no rows shows no
figure, only a hole that says so, and passes.

What a digest cannot tell: a table and summary.json rewritten together. Tables that come from
someone else are made again from their records (``python -m scalerepro.analysis.rebuild``), which
re-reads every record through its model and its checks.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from scalerepro.analysis.columns import AGGREGATE_TABLES
from scalerepro.common.cli import CommandError
from scalerepro.common.files import JsonFileError, read_json_object, sha256_of

DIGESTS = "table_sha256"  # summary.json's key
_REMAKE = "make the tables again from the records (python -m scalerepro.analysis.rebuild --results <study>, or the workflow's aggregate rule)"


class TableNotAggregated(CommandError, ValueError):
    """A table that the aggregation did not write as it is; the message names it and the fix."""


def listed(texts: Mapping[str, str]) -> list[str]:
    """summary.json's ``table_sha256`` of the tables written as ``texts`` (name -> CSV text)."""
    return [f"{hashlib.sha256(text.encode('utf-8')).hexdigest()}  {name}.csv" for name, text in texts.items()]


def _digests(tables_dir: Path) -> dict[str, str]:
    """file name -> sha256, as summary.json lists them; {} where it lists none."""
    try:
        summary = read_json_object(tables_dir / "summary.json", what="aggregation summary")
    except (FileNotFoundError, JsonFileError):
        return {}
    lines = summary.get(DIGESTS)
    if not isinstance(lines, list):
        return {}
    return {name: digest for line in lines if isinstance(line, str) for digest, _, name in [line.partition("  ")]}


def _has_rows(path: Path) -> bool:
    try:
        return not pd.read_csv(path, nrows=1).empty
    except (pd.errors.EmptyDataError, pd.errors.ParserError):
        return path.stat().st_size > 0


def check(tables_dir: str | os.PathLike[str]) -> None:
    """Refuse (TableNotAggregated) a table of AGGREGATE_TABLES in ``tables_dir`` that holds rows and
    is not the one summary.json's ``table_sha256`` lists."""
    folder = Path(tables_dir)
    digests = None
    for name in (f"{table}.csv" for table in AGGREGATE_TABLES):
        path = folder / name
        if not path.is_file():
            continue
        digests = _digests(folder) if digests is None else digests
        if digests.get(name) == sha256_of(path) or not _has_rows(path):
            continue
        if not digests:
            raise TableNotAggregated(f"{path}: summary.json beside it lists no digest of the tables, so no figure of it is shown as measured: {_REMAKE}")
        raise TableNotAggregated(
            f"{path} is not the table the aggregation wrote (its sha256 is not the one summary.json lists): "
            f"it was edited or copied in since, and no figure of it is shown as measured: {_REMAKE}"
        )
