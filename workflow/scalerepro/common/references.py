"""config/references.yaml read and checked against workflow/schemas/references.schema.yaml: the one
loader of the file, for the workflow's planning (the `reproduce` runs) and for the analysis (the
comparison, the nearest published figures, the scaling model's links and cluster presets, the
report). A file that breaks the schema is one line naming the entry (a reference by its position
and id, a link or a cluster by its key), what is wrong, the rule it breaks and the file to fix.

The standard library at import, as all of common/: yaml and jsonschema are imported when a file is
loaded (the planning and analysis environments install both; the rank, which imports common/ too,
never loads the file).
"""

from __future__ import annotations

import collections
import copy
import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerepro.common import share_of_peak
from scalerepro.common.cli import CommandError

REFERENCES_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "references.schema.yaml"

# How the one line names a JSON Schema type.
_TYPE_WORDS = {
    "number": "a number",
    "integer": "a whole number",
    "string": "text",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
    "boolean": "true or false",
}
_BOUNDS = {"minimum": "is below", "exclusiveMinimum": "is not above", "maximum": "is above", "exclusiveMaximum": "is not below"}
_SHOWN_CHARACTERS = 80  # of a value quoted in the message


class ReferencesError(CommandError, ValueError):
    """config/references.yaml breaks its format; the message names the entry and the fix."""


def load_references(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The references file, its YAML anchors merged, once it holds to the schema: else a
    ReferencesError whose one line names the first problem in the file's order (an OSError
    where the file cannot be read). Each call reads the file; a text already checked at that
    path is not parsed again (one command reads it in several places), and each caller gets its
    own copy to change."""
    text = Path(path).read_text(encoding="utf-8")
    return copy.deepcopy(_checked(str(path), text))


def load_optional_references(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """``load_references``, or an empty document where no file is given or there is none (a
    study without published figures, links or presets)."""
    if path is None or not Path(path).is_file():
        return {}
    return load_references(path)


@functools.lru_cache(maxsize=8)
def _checked(path: str, text: str) -> dict[str, Any]:
    import yaml

    from scalerepro.common import yaml_text

    try:
        document = yaml_text.safe_load(text)
    except yaml.YAMLError as error:
        raise ReferencesError(f"{path} is not valid YAML ({' '.join(str(error).split())[:200]}): fix the file") from None
    document = {} if document is None else document
    errors = sorted(_validator().iter_errors(document), key=lambda error: _document_order(document, error))
    if errors:
        raise ReferencesError(_one_line(path, document, errors[0]))
    # a figure its GPU cannot reach is as wrong as a negative one (share_of_peak)
    problem = _unresolved(document) or share_of_peak.beyond_peak(document.get("references", []))
    if problem:
        raise ReferencesError(f"{problem}: fix {path}")
    return document


def _finite_number(checker: Any, instance: Any) -> bool:
    # JSON has no NaN or infinity, and every bound lets NaN through (no comparison with it holds)
    if isinstance(instance, bool):
        return False
    return isinstance(instance, int) or (isinstance(instance, float) and math.isfinite(instance))


@functools.cache
def _validator() -> Any:
    import jsonschema

    from scalerepro.common import yaml_text

    schema = yaml_text.safe_load(REFERENCES_SCHEMA.read_text(encoding="utf-8"))
    base = jsonschema.Draft202012Validator
    finite = jsonschema.validators.extend(base, type_checker=base.TYPE_CHECKER.redefine("number", _finite_number))
    return finite(schema)


def _position(node: Any, key: Any) -> int:
    """Where ``key`` is in ``node``: a list's index, a mapping key's place; a key the mapping
    lacks comes after those it has."""
    if isinstance(node, Mapping):
        keys = list(node)
        return keys.index(key) if key in node else len(keys)
    return key if isinstance(key, int) else 0


def _missing(error: Any) -> list[str]:
    return [key for key in error.validator_value if key not in error.instance]


def _unknown(error: Any) -> list[Any]:
    known = error.schema.get("properties", {})
    patterns = error.schema.get("patternProperties", {})
    return [key for key in error.instance if key not in known and not any(isinstance(key, str) and re.search(p, key) for p in patterns)]


def _document_order(document: Any, error: Any) -> list[int]:
    """An error's place in the file: the first problem is the one reported."""
    order, node = [], document
    for part in error.absolute_path:
        order.append(_position(node, part))
        node = node[part]
    concerned = _missing(error) if error.validator == "required" else _unknown(error) if error.validator == "additionalProperties" else []
    if concerned:
        order.append(_position(node, concerned[0]))
    return order


def _entry(document: Mapping[str, Any], parts: Sequence[Any]) -> tuple[str, list[Any]]:
    """The entry an error is in, as the one line names it, and the error's path inside it."""
    if not parts:
        return "the top level", []
    section = str(parts[0])
    if section == "references" and len(parts) > 1:
        entry = document["references"][parts[1]]
        label = entry.get("id", "no id") if isinstance(entry, Mapping) else "not a mapping"
        return f"references[{parts[1]}] ({label})", list(parts[2:])
    if section in ("links", "clusters") and len(parts) > 1:
        return f"{section}.{parts[1]}", list(parts[2:])
    return section, list(parts[1:])


def _field(parts: Sequence[Any]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts).lstrip(".")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARACTERS else text[: _SHOWN_CHARACTERS - 3] + "..."


def _problem(error: Any, field: str) -> str:
    """What is wrong, in words, from the schema keyword that failed."""
    subject = f"{field} {_shown(error.instance)}" if field else _shown(error.instance)
    keyword, wanted = error.validator, error.validator_value
    if keyword == "type":
        return f"{subject} is not {' or '.join(_TYPE_WORDS[kind] for kind in ([wanted] if isinstance(wanted, str) else wanted))}"
    if keyword == "enum":
        choices = ", ".join(str(choice) for choice in wanted if choice is not None)
        return f"{subject} is not one of {choices}" + (" (or null: not stated)" if None in wanted else "")
    if keyword in _BOUNDS:
        return f"{subject} {_BOUNDS[keyword]} {wanted}"
    if keyword == "pattern" and "description" in error.schema:
        return f"{subject} is not {error.schema['description']}"
    if keyword == "required":
        return f"add {', '.join(_missing(error))}" + (f" to {field}" if field else "")
    if keyword == "additionalProperties":
        keys = [*error.schema.get("properties", {}), *(["_<anchor>"] if error.schema.get("patternProperties") else [])]
        return f"unknown key {_shown(_unknown(error)[0])}" + (f" in {field}" if field else "") + f" (the keys: {', '.join(keys)})"
    return f"{field}: {error.message}" if field else error.message


def _rule(error: Any) -> str | None:
    """The schema's words for what a valid value is, where the problem alone does not say it."""
    kinds = error.schema.get("type", [])
    numeric = bool({"number", "integer"} & set([kinds] if isinstance(kinds, str) else kinds))
    if error.validator in _BOUNDS or (error.validator == "type" and numeric) or error.validator == "required":
        return error.schema.get("description")
    return None


def _one_line(path: str, document: Any, error: Any) -> str:
    where, inside = _entry(document, list(error.absolute_path)) if isinstance(document, Mapping) else ("the top level", [])
    rule = _rule(error)
    return f"{where}: {_problem(error, _field(inside))}{f': {rule}' if rule else ''}: fix {path}"


def _unresolved(document: Mapping[str, Any]) -> str | None:
    """What the schema cannot say: each reference's id is its own, and each cluster's links are
    keys of ``links``."""
    ids = collections.Counter(entry["id"] for entry in document.get("references", []))
    repeated = sorted(key for key, count in ids.items() if count > 1)
    if repeated:
        return f"references: the id {repeated[0]!r} is given {ids[repeated[0]]} times: give each reference its own id"
    links = document.get("links") or {}
    for key, cluster in (document.get("clusters") or {}).items():
        for role in ("intra_node_link", "inter_node_link"):
            if cluster[role] not in links:
                known = ", ".join(links) or "none"
                return f"clusters.{key}: {role} {cluster[role]!r} is not a key of links ({known}): add it to links or name one of them"
    return None
