"""Reading a record file into the model: the one way the analysis reads a record.

A record file is data until checked (another user's, a damaged copy, a newer scalerepro's): it is
read within bounds (``scalerepro.common.files.read_json_object``), refused when its schema is
newer than this code reads or it is no record of its schema, taken up the upgrade chain, and
held to the model's types and bounds. A figure outside its bound (negative, infinite, NaN, text)
does not make the record unreadable: the figure is emptied and named (``Reading.nonsense``), and
the run counts as failed; so does a record whose figures disagree (``Reading.problems``).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from scalerepro.common.cli import CommandError
from scalerepro.common.files import read_json_object
from scalerepro.record import columns, evidence
from scalerepro.record.cell import Cell
from scalerepro.record.model import RECORD_SCHEMA_VERSION, RunRecord
from scalerepro.record.upgrade import OLDEST_RECORD_SCHEMA, Withheld, upgraded


class RecordUnreadable(CommandError, ValueError):
    """A file that is no run record this code reads; one line saying what it is instead."""


@dataclass(frozen=True)
class Reading:
    """A record as read: today's model of it, the schema it was written in, why each field an
    older record cannot hold is empty, what it holds wrongly (withheld), the figures it states
    outside their bounds (emptied), and where its figures disagree."""

    record: RunRecord
    written_as: int
    absent: dict[str, str]
    withheld: tuple[Withheld, ...]
    nonsense: tuple[str, ...]

    @property
    def problems(self) -> list[str]:
        """Why the record is no measurement: figures out of bounds, else figures that disagree."""
        return list(self.nonsense) or evidence.problems(self.record)

    @property
    def cell(self) -> Cell:
        return Cell.of(self.record)

    @property
    def purpose_basis(self) -> str:
        return self.absent.get("purpose", "stated by the record")

    def row(self) -> dict[str, Any]:
        """Its runs-table columns (scalerepro.record.columns), with the schema it was written in."""
        return {**columns.row(self.record), "schema_version": self.written_as, "purpose_basis": self.purpose_basis}


def schema_problem(document: dict[str, Any]) -> str | None:
    """Why this code cannot read the document's schema (a newer one, or none), or None."""
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < OLDEST_RECORD_SCHEMA:
        return f"schema_version {version!r} is no record schema version"
    if version > RECORD_SCHEMA_VERSION:
        return f"it is of record schema {version}, newer than this scalerepro reads ({RECORD_SCHEMA_VERSION}): read it with the scalerepro that wrote it, or update"
    return None


def _set(document: Any, location: tuple[Any, ...], value: Any) -> None:
    for part in location[:-1]:
        document = document[part]
    document[location[-1]] = value


def _error_text(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg'][:160]}" if where else error["msg"][:160]


def from_document(document: dict[str, Any]) -> Reading:
    """The record in ``document`` (a JSON object), as ``read`` reads a file; RecordUnreadable
    where it is no record of a schema this code reads."""
    unreadable = schema_problem(document)
    if unreadable:
        raise RecordUnreadable(unreadable)
    try:
        up = upgraded(document)
    except (KeyError, TypeError, AttributeError) as failure:  # an older layout too damaged to take up the chain
        raise RecordUnreadable(f"it is no record of schema {document.get('schema_version')} ({type(failure).__name__}: {failure})") from None
    current, nonsense, emptied, copied = up.document, [], set(), False
    while True:
        try:
            record = RunRecord.model_validate(current)
            break
        except ValidationError as failure:
            errors = failure.errors()
        # A figure that is no measurement is emptied and named: the record is read, and fails.
        figures = [e for e in errors if e["loc"][:1] == ("measurements",) and tuple(e["loc"]) not in emptied and not isinstance(e["input"], (dict, list))]
        if len(figures) < len(errors):
            first = next(e for e in errors if e not in figures)
            raise RecordUnreadable(f"it is no run record of schema {up.written_as} ({_error_text(first)})")
        if not copied:  # never empty a figure of the caller's document (the chain's copy shares its lists)
            current, copied = copy.deepcopy(current), True
        for error in figures:
            location = tuple(error["loc"])
            leaf = columns.leaf_at(location)
            name = leaf.name if leaf is not None else ".".join(map(str, location[1:]))
            why = (leaf.problem(error["input"]) if leaf is not None else None) or f"{error['input']!r}: {error['msg']}"
            nonsense.append(f"{name} is {why}")
            emptied.add(location)
            _set(current, location, None)
    return Reading(record, up.written_as, dict(up.absent), up.withheld, tuple(nonsense))


def read(path: str | os.PathLike[str]) -> Reading:
    """The record at ``path``. FileNotFoundError passes through (a missing record is a hole of its
    own kind); a file that is no record this code reads raises JsonFileError or RecordUnreadable,
    each one line naming ``path``."""
    document = read_json_object(path)
    try:
        return from_document(document)
    except RecordUnreadable as error:
        raise RecordUnreadable(f"run record {path}: {error}") from None
