"""The report a GPU user reads, rendered from the H100 records this project kept (real GPU output,
kept as they are: benchmarks/gpu/h100-2026-11-25 and h100-2026-11-26) by the records-only rebuild:

    python -m scalerepro.analysis.rebuild --records <the two folders> --out OUT

Tests of the report's points (issue 33) read ``h100_report``: the folder it wrote and the page's
HTML. It runs once a test session, in a process where torch cannot be imported (the analysis side
never needs it)."""

from __future__ import annotations

import subprocess
import sys
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
        [sys.executable, "-c", code, "--records", *map(str, records), "--out", str(out), "--config", str(REPO / "config" / "config.yaml"),
         "--references", str(REPO / "config" / "references.yaml"), "--templates", str(REPO / "report"), *extra],
        cwd=out.parent, check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="session")
def h100_report(tmp_path_factory) -> RenderedReport:
    out = tmp_path_factory.mktemp("h100") / "out"
    done = rebuild_from_records(H100_RECORDS, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return RenderedReport(out, (out / "report" / "index.html").read_text(), done.stderr)
