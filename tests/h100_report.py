"""The report a GPU user reads, rendered from the H100 records this project kept (real GPU output,
kept as they are: benchmarks/gpu/h100-2026-11-25 and h100-2026-11-26) by the records-only rebuild:

    python -m scalerepro.analysis.rebuild --records <the two folders> --out OUT

Tests of the report's points read ``h100_report``: the folder it wrote and the page's HTML. It
runs once a test run (every xdist worker reads the one build, ``built_once``), in a process where
torch cannot be imported (the analysis side never needs it). The studies kept whole from GPU
sessions (``<session>/study-results``) are rebuilt by ``rebuild_kept_study`` (once a run for the
tests that only read it: ``kept_study_rebuilt_once``; without figures: ``kept_study_tables``); ``section``, ``section_element``,
``visible`` and ``table_rows`` read a rendered page as its reader sees it."""

from __future__ import annotations

import fcntl
import html as htmllib
import json
import os
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
# A test that rebuilds a whole study, or reads one rebuilt with today's code (its tables, every
# figure and the report: seconds each, most of them matplotlib's), is in the slow tier; the fast
# tier keeps the report of the kept records (``h100_report``), built once a run.
REBUILDS_A_STUDY = pytest.mark.slow


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


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder ``build`` fills once for the whole test run, for every xdist worker: the first to
    ask builds it while the others wait on its lock, and later askers read it (never write to it).
    Several test files read the same rebuilt report, each on whichever worker runs it."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the run's folder, above each worker's own
    folder = root / f"built-once-{name}"
    with open(root / f"built-once-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def h100_report(tmp_path_factory) -> RenderedReport:
    def build(folder: Path) -> None:
        done = rebuild_from_records(H100_RECORDS, folder / "out")
        assert done.returncode == 0, done.stderr[-3000:]
        (folder / "stderr.txt").write_text(done.stderr)

    folder = built_once(tmp_path_factory, "h100-records", build)
    out = folder / "out"
    return RenderedReport(out, (out / "report" / "index.html").read_text(), (folder / "stderr.txt").read_text())


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


def kept_study_tables(kept: Path, root: Path, monkeypatch) -> tuple[Path, dict]:
    """``kept`` (a study's results/) copied to ``root``/results and rebuilt in this process without
    its figures, for a test that reads tables or the page but no figure (matplotlib is most of a
    rebuild): the copy and what ``rebuild.rebuild`` returned."""
    from scalerepro.analysis import rebuild

    monkeypatch.setattr(rebuild.plots, "draw", lambda tables, out: [])
    results = root / "results"
    shutil.copytree(kept, results)
    return results, rebuild.rebuild(results, REPO / "config" / "references.yaml", REPO / "report")


def kept_study_rebuilt_once(tmp_path_factory, kept: Path) -> RebuiltStudy:
    """``rebuild_kept_study`` of ``kept`` as it was kept, once for the whole test run (``built_once``):
    for tests that only read what it wrote."""

    def build(root: Path) -> None:
        rebuild_kept_study(kept, root)

    folder = built_once(tmp_path_factory, f"{kept.parent.name}-{kept.name}", build)
    return RebuiltStudy(folder / "results", (folder / "results" / "report" / "index.html").read_text())


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


def diagnosis_rows(page: str) -> dict[str, list[list[str]]]:
    """The rows of "What bounds each model" by model, each [what, evidence, lever] (a model's later
    findings have no model cell: it spans them)."""
    by_model: dict[str, list[list[str]]] = {}
    model = ""
    for row in table_rows(section(page, "bottlenecks").split("</table>", 1)[0])[1:]:
        if len(row) == 4:
            model, row = row[0].split()[0], row[1:]
        by_model.setdefault(model, []).append(row)
    return by_model
