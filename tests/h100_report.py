"""The report a GPU user reads, rendered from the H100 records this project kept (real GPU output,
kept as they are: benchmarks/gpu/h100-2026-11-25 and h100-2026-11-26) by the records-only rebuild:

    python -m scalerepro.analysis.rebuild --records <the two folders> --out OUT

Tests of the report's points (issue 33) read ``h100_report``: the folder it wrote and the page's
HTML. It runs once a test session, in a process where torch cannot be imported (the analysis side
never needs it). The studies kept whole from GPU sessions (``<session>/study-results``) are rebuilt
by ``rebuild_kept_study``; ``section``, ``section_element``, ``visible`` and ``table_rows`` read a
rendered page as its reader sees it."""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
H100_RECORDS = (REPO / "benchmarks" / "gpu" / "h100-2026-11-25", REPO / "benchmarks" / "gpu" / "h100-2026-11-26")
NO_TORCH = "import sys; sys.modules['torch'] = None  # importing torch now raises ImportError\n"


@dataclass(frozen=True)
class RenderedReport:
    out: Path  # tables/, plots/, report/index.html
    html: str
    stderr: str


def rebuild_from_records(records: tuple[Path, ...], out: Path, *extra: str) -> subprocess.CompletedProcess:
    code = NO_TORCH + "import runpy; sys.argv[0] = 'rebuild'; runpy.run_module('scalerepro.analysis.rebuild', run_name='__main__')"
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--records",
            *map(str, records),
            "--out",
            str(out),
            "--config",
            str(REPO / "config" / "config.yaml"),
            "--references",
            str(REPO / "config" / "references.yaml"),
            "--templates",
            str(REPO / "report"),
            *extra,
        ],
        cwd=out.parent,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="session")
def h100_report(tmp_path_factory) -> RenderedReport:
    out = tmp_path_factory.mktemp("h100") / "out"
    done = rebuild_from_records(H100_RECORDS, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return RenderedReport(out, (out / "report" / "index.html").read_text(), done.stderr)


@dataclass(frozen=True)
class RebuiltStudy:
    results: Path  # the study's results/, rebuilt: tables/, plots/, report/index.html
    html: str


def rebuild_kept_study(kept: Path, root: Path, edit_config: Callable[[dict], None] | None = None) -> RebuiltStudy:
    """A study's ``results/`` kept from a GPU session, copied under ``root`` and rebuilt with
    today's code (``rebuild --results``) in a process where torch cannot be imported;
    ``edit_config`` changes its tables/config.json first."""
    results = root / "results"
    shutil.copytree(kept, results)
    if edit_config is not None:
        config_path = results / "tables" / "config.json"
        config = json.loads(config_path.read_text())
        edit_config(config)
        config_path.write_text(json.dumps(config))
    code = NO_TORCH + "import runpy; sys.argv[0] = 'rebuild'; runpy.run_module('scalerepro.analysis.rebuild', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", code, "--results", str(results), "--references", str(REPO / "config" / "references.yaml"), "--templates", str(REPO / "report")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return RebuiltStudy(results, (results / "report" / "index.html").read_text())


def section(page: str, anchor: str) -> str:
    """The HTML of one section: from the heading with id ``anchor`` to the next h2/h3 heading."""
    start = page.index(f'id="{anchor}"')
    following = re.compile(r"<h[23][ >]").search(page, start)
    return page[start : following.start() if following else len(page)]


def section_element(page: str, section_id: str) -> str:
    """The HTML inside ``<section id="section_id">`` (the summary and the failures are such
    elements; their headings carry no id)."""
    return page.split(f'<section id="{section_id}">', 1)[1].split("</section>", 1)[0]


def visible(fragment: str) -> str:
    """What a reader sees of an HTML fragment: no tags, no embedded images, one space between words."""
    text = re.sub(r"<img[^>]*>", " ", fragment)
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", text))).strip()


def table_rows(fragment: str) -> list[list[str]]:
    """Each <tr> of a fragment as its cells' visible text."""
    return [[visible(cell) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)] for row in re.findall(r"<tr>(.*?)</tr>", fragment, re.S)]
