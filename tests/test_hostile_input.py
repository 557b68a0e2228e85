"""Hostile input, round 4 (issue 37), kind by kind: each case one line of a parametrised list, run
as the user runs it (the command's own process), each refused in one line naming the problem and
the fix, exit 2, nothing written.

Kind 2, no output from no input: a command given nothing to work from says so; a report or a
set of figures made from no tables would read as a study that measured nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, clean_env


def _report(tables: str) -> list[str]:
    return ["-m", "scalerepro.analysis.presentation.report", "--tables", tables, "--plots", "plots", "--inventory", "system.json",
            "--config", "config.json", "--references", str(REPO / "config" / "references.yaml"), "--templates", str(REPO / "report"),
            "--out", "report/index.html"]  # fmt: skip


NO_INPUT = [
    # (name, argv in the case's empty folder, what the one line says)
    ("report of a missing tables folder", _report("missing"), "--tables missing: no such folder"),
    ("report of an empty tables folder", _report("empty"), "--tables empty: no runs.csv there, so nothing was aggregated"),
    ("figures of a missing tables folder", ["-m", "scalerepro.analysis.presentation.plots", "--tables", "missing", "--out", "plots"],
     "--tables missing: no such folder"),
    ("figures of an empty tables folder", ["-m", "scalerepro.analysis.presentation.plots", "--tables", "empty", "--out", "plots"],
     "no runs.csv there"),
    ("predictions at -1 and 0 GPUs", ["-m", "scalerepro.analysis.tables.aggregate", "--matrix", "matrix.csv", "--references", "r.yaml",
                                     "--out", "tables", "--predict-gpus", "-1", "0"], "argument --predict-gpus: -1 is outside [1, 1000000]"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "argv", "said"), NO_INPUT, ids=[case[0] for case in NO_INPUT])
def test_no_output_from_no_input(name: str, argv: list[str], said: str, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, (name, done.returncode, done.stderr[-2000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"], name  # no report, no figures, no tables
