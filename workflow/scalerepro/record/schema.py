"""The files generated from the record model: its JSON Schema and the field table of
docs/run-record.md. Tests fail when either differs from what this writes.

    python -m scalerepro.record.schema --write      # from the repository root
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types

from scalerepro.common.cli import OneLineErrorParser, error_boundary
from scalerepro.common.files import with_generated_part, write_text_atomically
from scalerepro.record.columns import LEAVES, Leaf
from scalerepro.record.model import RunRecord

SCHEMA_FILE = Path("workflow/schemas/run_record.schema.json")
DOC_FILE = Path("docs/run-record.md")
FIELD_TABLE_MARKERS = (
    "<!-- the field table: generated from scalerepro.record.model by `python -m scalerepro.record.schema --write` -->",
    "<!-- end of the generated field table -->",
)


def schema_text() -> str:
    """The record's JSON Schema (draft 2020-12), as the file holds it."""
    return json.dumps(RunRecord.model_json_schema(), indent=1, ensure_ascii=False) + "\n"


def _type(annotation: Any) -> str:
    """An annotation in words: "int or null", "one of 'ok', 'failed'", "list of str"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(arg) for arg in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"object of {_type(args[1])}"
    return {type(None): "null", str: "text", int: "integer", float: "number", bool: "boolean"}.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bound(leaf: Leaf) -> str:
    words = []
    for limit in leaf.limits:
        if isinstance(limit, annotated_types.Gt):
            words.append(f"> {limit.gt}")
        elif isinstance(limit, annotated_types.Ge):
            words.append(f"≥ {limit.ge}")
        elif isinstance(limit, annotated_types.Le):
            words.append(f"≤ {limit.le}")
    return ", ".join(words)


def field_table() -> str:
    """Every scalar field of the record: its path, type, bound, runs-table column and meaning."""
    rows = ["| field | type | bound | runs.csv column | meaning |", "|---|---|---|---|---|"]
    for path, leaf in LEAVES.items():
        column = f"`{leaf.column.name}`" + (f" ({leaf.column.unit})" if leaf.column.unit else "") if leaf.column else ""
        meaning = (leaf.info.description or "").replace("|", "\\|")
        rows.append(f"| `{'.'.join(path)}` | {_type(leaf.info.annotation)} | {_bound(leaf)} | {column} | {meaning} |")
    return "\n".join(rows) + "\n"


def doc_text(current: str) -> str:
    """docs/run-record.md with its field table as generated now (the prose around it kept)."""
    return with_generated_part(current, FIELD_TABLE_MARKERS, field_table(), DOC_FILE)


@error_boundary("scalerepro.record.schema")
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog="scalerepro.record.schema", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the schema file and the doc's field table (run from the repository root)")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(schema_text())
        return 0
    write_text_atomically(SCHEMA_FILE, schema_text())
    write_text_atomically(DOC_FILE, doc_text(DOC_FILE.read_text(encoding="utf-8")))
    print(f"wrote {SCHEMA_FILE} and the field table of {DOC_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
