"""Regenerate the tables, figures and report of a finished study from its files alone: no run,
no benchmark, no Snakemake.

    python -m scalerepro.analysis.rebuild --results results

What it reads under ``--results`` (what the workflow left there): ``tables/matrix.csv`` (the
planned runs, with the path of each record), the records it names, ``tables/config.json`` (the
resolved config: the targets and the counts the scaling model predicts), ``comm/g*.json``,
``profiles/*/summary.json`` (when the study was profiled), ``inventory/system.json``; and
``--references`` (``config/references.yaml``) and ``--templates`` (``report/``). It writes what
the aggregate, plots and report rules write: ``tables/*.csv`` and ``summary.json``,
``plots/*.png|svg``, ``report/index.html``. A record path in the matrix that is relative is
resolved against the directory that holds ``--results`` (where the workflow ran), so a copied
results folder rebuilds where it lies.

Use it after changing the analysis code, the references or the templates, or to read an old
study's records with today's statistics.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis import columns
from scalerepro.analysis.presentation import plots, report
from scalerepro.analysis.profiles import captures
from scalerepro.analysis.tables import aggregate
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import write_text_atomically


def _targets(config: dict) -> dict[str, Any]:
    """The targets the aggregation knows (checks included), from the resolved config."""
    return {key: value for key, value in (config.get("targets") or {}).items() if key in columns.TARGETS}


def rebuild(results: Path, references: Path, templates: Path) -> dict[str, object]:
    """Tables, figures and report from the files under ``results`` (module docstring)."""
    tables_dir = results / "tables"
    matrix_path = tables_dir / "matrix.csv"
    if not matrix_path.is_file():
        raise CommandError(f"{matrix_path}: no study matrix (run the workflow's study_matrix rule, or point --results at a study)")
    config_path = tables_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    # record paths relative to where the workflow ran (the folder holding results/)
    matrix = pd.read_csv(matrix_path, dtype=str, keep_default_na=False)
    base = results.resolve().parent
    matrix["record"] = [r if os.path.isabs(r) or not r else str(base / r) for r in matrix["record"]]
    with tempfile.TemporaryDirectory() as scratch:
        resolved = Path(scratch) / "matrix.csv"
        matrix.to_csv(resolved, index=False)
        comm = sorted((results / "comm").glob("g*.json"))
        scaling = config.get("scaling") or {}
        predict = scaling.get("predict_gpus", list(aggregate.scaling_model.DEFAULT_PREDICT_GPUS))
        tables = aggregate.aggregate(resolved, comm, references, _targets(config), predict, scaling.get("predict_cluster"))
    summary = aggregate.write_tables(tables, tables_dir)
    summaries = sorted((results / "profiles").glob("*/summary.json"))
    if summaries:
        for name, table in captures.tables(json.loads(p.read_text()) for p in summaries).items():
            write_text_atomically(tables_dir / f"{name}.csv", table.to_csv(index=False))
    drawn = plots.draw(plots.read_tables(tables_dir), results / "plots")
    out = results / "report" / "index.html"
    inventory = results / "inventory" / "system.json"
    html = report.render(tables_dir, results / "plots", inventory, config_path, references, templates, out.parent)
    write_text_atomically(out, html)
    return {"summary": summary, "figures": drawn, "profiled_runs": len(summaries), "report": out}


_PROG = "scalerepro.analysis.rebuild"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the study's results folder (default: results)")
    parser.add_argument("--references", type=Path, default=Path("config/references.yaml"), help="published figures, GPU peaks, links")
    parser.add_argument("--templates", type=Path, default=Path("report"), help="directory holding templates/ and style.css")
    args = parser.parse_args(argv)
    done = rebuild(args.results, args.references, args.templates)
    summary = done["summary"]
    print(
        f"rebuild: {summary['runs']} runs {summary['status']}, checks {summary['checks']}, comparison "
        f"{summary['comparison']}; {sum(1 for v in done['figures'].values() if v == 'drawn')} figures; "
        f"report {done['report']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
