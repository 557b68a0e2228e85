"""The report and the figures show only tables the aggregation wrote as they are: each table's SHA-256
is in the summary.json the aggregation writes after them (scalerepro.analysis.tables.table_digests),
and a table with rows that is not the one listed there (a figure edited since, a table copied in) is
refused in one line naming it and the fix, before anything is written. The tables are those of the
kept H100 records' aggregation (fixture h100_report), copied and changed one at a time."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalerepro.analysis.columns import AGGREGATE_TABLES
from scalerepro.analysis.presentation import report
from scalerepro.analysis.tables import table_digests

from conftest import REPO, clean_env

REFERENCES = REPO / "config" / "references.yaml"
REMAKE = "make the tables again from the records (python -m scalerepro.analysis.rebuild --results <study>, or the workflow's aggregate rule)"


def _copy(h100_report, tmp_path: Path) -> Path:
    out = tmp_path / "study"
    shutil.copytree(h100_report.out, out)
    return out


def _render(study: Path) -> str:
    return report.render(study / "tables", study / "plots", study / "inventory" / "system.json", study / "tables" / "config.json", REFERENCES, REPO / "report")


def _command(study: Path, program: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"scalerepro.analysis.presentation.{program}", "--tables", "tables", *args],
        cwd=study,
        env=clean_env(PYTHONPATH=str(REPO / "workflow")),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_published_figure_edited_x100_is_refused_by_the_report_and_the_figures_in_one_line(h100_report, tmp_path):
    study = _copy(h100_report, tmp_path)
    table = pd.read_csv(study / "tables" / "published_comparison.csv")
    best = table["role"].eq("best published") & table["model"].eq("resnet50")
    table.loc[best, "published"] *= 100
    table.to_csv(study / "tables" / "published_comparison.csv", index=False)
    kept = (study / "report" / "index.html").read_bytes()
    done = _command(
        study,
        "report",
        *("--plots", "plots", "--inventory", "inventory/system.json", "--config", "tables/config.json"),
        *("--references", str(REFERENCES), "--templates", str(REPO / "report"), "--out", "report/index.html"),
    )
    line = (
        "tables/published_comparison.csv is not the table the aggregation wrote (its sha256 is not the one summary.json lists): "
        f"it was edited or copied in since, and no figure of it is shown as measured: {REMAKE}\n"
    )
    assert (done.returncode, done.stderr) == (2, f"scalerepro.analysis.presentation.report: error: {line}")
    assert (study / "report" / "index.html").read_bytes() == kept  # the report written before is kept
    drawn = _command(study, "plots", "--out", "plots-again")
    assert (drawn.returncode, drawn.stderr) == (2, f"scalerepro.analysis.presentation.plots: error: {line}")
    assert not (study / "plots-again").exists()


@pytest.mark.parametrize("name", AGGREGATE_TABLES)
def test_every_table_the_aggregation_writes_is_held_to_its_digest(name, h100_report, tmp_path):
    """Each table, changed: a figure of its first row (or, where it has none, a row added): no report."""
    study = _copy(h100_report, tmp_path)
    path = study / "tables" / f"{name}.csv"
    header, *rows = path.read_text().splitlines(keepends=True)
    changed = (
        [re.sub(r"\d", lambda digit: str((int(digit.group()) + 1) % 10), rows[0], count=1), *rows[1:]]
        if rows
        else [",".join("7" * len(header.split(","))) + "\n"]
    )
    assert changed != rows
    path.write_text(header + "".join(changed))
    with pytest.raises(table_digests.TableNotAggregated, match=f"{name}.csv is not the table the aggregation wrote"):
        _render(study)


def test_a_table_without_rows_is_a_hole_and_the_aggregations_own_tables_render(h100_report, tmp_path):
    study = _copy(h100_report, tmp_path)
    assert 'id="comparison"' in _render(study)
    (study / "tables" / "cells.csv").write_text("")  # emptied: nothing shown of it, and it says so
    (study / "tables" / "checks.csv").write_text("check,target,threshold,measured,status\n")
    page = _render(study)
    assert "Not measured: checks.csv has no rows." in page


def test_tables_whose_summary_lists_no_digest_are_refused(h100_report, tmp_path):
    """An aggregation older than the digests, or tables with no summary.json beside them: made again
    from their records, never shown as they are."""
    study = _copy(h100_report, tmp_path)
    summary = json.loads((study / "tables" / "summary.json").read_text())
    del summary[table_digests.DIGESTS]
    (study / "tables" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(table_digests.TableNotAggregated, match=r"runs\.csv: summary\.json beside it lists no digest of the tables"):
        _render(study)
    (study / "tables" / "summary.json").unlink()
    with pytest.raises(table_digests.TableNotAggregated, match="lists no digest"):
        _render(study)
