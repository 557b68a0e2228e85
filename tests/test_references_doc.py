"""config/references.md documents every published figure of config/references.yaml, in the repository.

Pure file checks (yaml, pathlib, re): one section per reference id, no section for an id the YAML
lacks, each section states the entry's value, and nothing in the product points outside the
repository (to ../shared).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
REFERENCES_YAML = REPO / "config" / "references.yaml"
REFERENCES_DOC = REPO / "config" / "references.md"

# A section heading for an entry: "### `<id>`" (any heading level, the id alone in backticks).
_ID_HEADING = re.compile(r"^#{1,6}\s+`([^`]+)`\s*$", re.MULTILINE)
_ANY_HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)

# Generated or ignored folders that are not part of the product's text.
_SKIP_DIRS = {"__pycache__", ".snakemake", ".pytest_cache", "results"}


def _references() -> list[dict]:
    return yaml.safe_load(REFERENCES_YAML.read_text())["references"]


def _sections() -> dict[str, str]:
    """Each id heading of the doc -> its text up to the next heading of any level."""
    text = REFERENCES_DOC.read_text()
    starts = [m.start() for m in _ANY_HEADING.finditer(text)] + [len(text)]
    sections: dict[str, str] = {}
    for match in _ID_HEADING.finditer(text):
        end = next(s for s in starts if s > match.start())
        assert match.group(1) not in sections, f"two headings for `{match.group(1)}`"
        sections[match.group(1)] = text[match.end() : end]
    return sections


def _value_pattern(value: int | float) -> re.Pattern[str]:
    """The value as written in the YAML, allowing thousands separators (2789, 2,789, 2789.0)."""
    whole, _, fraction = str(value).partition(".")
    plain, grouped = whole, f"{int(whole):,}"
    number = "(?:" + "|".join(map(re.escape, dict.fromkeys([plain, grouped]))) + ")"
    tail = r"\." + fraction if fraction and fraction.strip("0") else r"(?:\.0+)?"
    return re.compile(r"(?<![\d.,])" + number + tail + r"(?![\d]|[.,]\d)")


def test_every_reference_has_a_section():
    sections = _sections()
    missing = [ref["id"] for ref in _references() if ref["id"] not in sections]
    assert not missing, f"config/references.md has no section for: {missing}"


def test_no_section_for_an_unknown_id():
    ids = {ref["id"] for ref in _references()}
    unknown = sorted(set(_sections()) - ids)
    assert not unknown, f"config/references.md has sections for ids not in references.yaml: {unknown}"


def test_each_section_states_the_value():
    sections = _sections()
    wrong = [f"{ref['id']}: {ref['value']}" for ref in _references() if ref["id"] in sections and not _value_pattern(ref["value"]).search(sections[ref["id"]])]
    assert not wrong, f"these sections do not state the YAML's value: {wrong}"


def test_value_pattern():
    assert _value_pattern(2789).search("mean **2,789** img/s")
    assert _value_pattern(2789).search("2789.0 img/s")
    assert not _value_pattern(2789).search("runs 2789.37 and 12789")
    assert _value_pattern(7759.6).search("median 7,759.6 seq/s")
    assert not _value_pattern(7759.6).search("7759.65")


def test_nothing_points_outside_the_repository():
    files = [REPO / "README.md"]
    for top in ("config", "docs", "report", "workflow"):
        files += [
            path
            for path in (REPO / top).rglob("*")
            if path.is_file() and not any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in path.relative_to(REPO).parts)
        ]
    offenders = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files cannot hold a readable pointer
        if "../shared" in text:
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"these files point to ../shared, which a clone does not have: {offenders}"
