"""Render the study's report: its sections assembled from the tables and rendered into one self-contained HTML file that opens offline.

Inputs are the aggregation's tidy tables (``--tables``), the figures (``--plots``), the system
inventory, the resolved workflow config and ``config/references.yaml``. The CSS is inlined and
every figure is embedded as a base64 ``data:`` URI (the SVG where there is one, else the PNG), so
the file needs no network, no neighbouring files and no JavaScript.

Nothing is invented: a table that is missing or empty, a column that is absent and a figure
that was not drawn all show as visible holes ("not measured", "—", "figure missing"), and runs
that did not finish are listed with their error and the command that reruns them. Every string
that comes from the config, the records or the inventory is HTML-escaped by Jinja's autoescape.

    python -m scalerepro.analysis.presentation.report --tables results/tables --plots results/plots \
        --inventory results/inventory/system.json --config results/tables/config.json \
        --references config/references.yaml --templates report --out results/report/index.html

Its parts: ``inputs`` reads the tables, documents and figures; ``formatting`` is how a value is
written (the templates' filters); ``headline``, ``inventory_view``, ``profiling_view`` and
``scaling_model_view`` lay out their sections; this module derives the rest from the tables and
renders. This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from scalerepro.analysis.columns import AGGREGATE_TABLES, CHECK_STATUSES, DEFAULT_NOISE_CV_MAX, DEFAULT_REPRODUCE_TOLERANCE, RUN_STATUSES, VERDICTS
from scalerepro.analysis.presentation.figures import FIGURE_NAMES
from scalerepro.analysis.presentation.formatting import MISSING, TEMPLATE_FILTERS, TEMPLATE_GLOBALS, fmt_int, fmt_text, is_missing, label, truthy
from scalerepro.analysis.presentation.headline import headline_section, mfu_columns, study_identity
from scalerepro.analysis.presentation.inputs import Row, load_figure, read_json, read_table, read_yaml, readable_inventory, require_aggregation, rows
from scalerepro.analysis.presentation.inventory_view import describe_inventory
from scalerepro.analysis.presentation.loss_view import loss_rows
from scalerepro.analysis.presentation.profiling_view import profiled_run
from scalerepro.analysis.presentation.scaling_model_view import scaling_model_section
from scalerepro.analysis.tables import nearest_published
from scalerepro.analysis.values import plain
from scalerepro.common.cli import OneLineErrorParser, error_boundary, output_path
from scalerepro.common.files import write_text_atomically
from scalerepro.common.gpu_peaks import PEAKS

# The tables the report shows, by file stem: the aggregation's, but the per-epoch and per-step
# logs (the figures draw those).
TABLES = tuple(name for name in AGGREGATE_TABLES if name not in ("epochs", "loss_log"))


# The report's sections, in order: (anchor id, title, subsections). Their numbers are made from
# this order (section_numbers) and the templates show ``secno[id]``, never a typed number: a new
# section is its template plus one entry here.
SECTIONS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("summary", "Summary", ()),
    ("system", "The system", ()),
    ("results", "Results", (
        ("scaling", "Scaling"), ("why-not-faster", "Why not faster"), ("sensitivity", "Sensitivity"), ("ablation", "Ablation"),
        ("parallelism", "Parallelism strategies"), ("communication", "Communication"), ("convergence", "Loss and accuracy"), ("energy", "Power and energy"),
        ("per-run", "Per-run measurements"), ("scaling-model", "Scaling model"), ("profiling", "Profiling"),
    )),
    ("comparison", "Measured vs published", ()),
    ("failures", "Failed or missing runs", ()),
    ("cost", "Cost of the study", ()),
    ("reproducibility", "Reproducibility", ()),
    ("history", "Versus baseline and history", (
        ("versus-baseline", "Versus baseline"), ("history-cells", "Headline cells across studies"),
    )),
)  # fmt: skip


def section_numbers(sections: Sequence[tuple[str, str, Sequence[tuple[str, str]]]] = SECTIONS) -> dict[str, str]:
    """Anchor id -> "3" / "3.1", from the order of ``sections``."""
    numbers = {}
    for i, (anchor, _, subsections) in enumerate(sections, 1):
        numbers[anchor] = str(i)
        numbers.update({sub: f"{i}.{j}" for j, (sub, _) in enumerate(subsections, 1)})
    return numbers


def section_titles(sections: Sequence[tuple[str, str, Sequence[tuple[str, str]]]] = SECTIONS) -> dict[str, str]:
    """Anchor id -> its heading, so that a title is typed once, in ``sections``."""
    titles = {}
    for anchor, title, subsections in sections:
        titles[anchor] = title
        titles.update(subsections)
    return titles


# --------------------------------------------------------------------------------------------
# What the report says, derived from the tables (small and explicit; the statistics themselves
# are the aggregation's)
# --------------------------------------------------------------------------------------------


def _unique(frame: pd.DataFrame, column: str) -> list[Any]:
    if column not in frame.columns:
        return []
    values = [plain(value) for value in frame[column].dropna().unique()]
    return sorted(values, key=lambda v: (not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v)))


def _ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that completed (status ok)."""
    if runs.empty or "status" not in runs.columns:
        return runs.iloc[0:0]
    return runs[runs["status"] == "ok"]


def _dates(runs: pd.DataFrame) -> tuple[str | None, str | None]:
    if "started_at" not in runs.columns:
        return None, None
    stamps = pd.to_datetime(runs["started_at"], utc=True, errors="coerce", format="ISO8601").dropna()
    if stamps.empty:
        return None, None
    return stamps.min().strftime("%Y-%m-%d %H:%M UTC"), stamps.max().strftime("%Y-%m-%d %H:%M UTC")


def _counts(frame: pd.DataFrame, column: str, order: Iterable[str]) -> list[tuple[str, int]]:
    """How many rows have each value of ``column``: the values in ``order`` first, then the rest."""
    if column not in frame.columns:
        return []
    counts = frame[column].fillna("unknown").astype(str).value_counts().to_dict()
    ordered = [(key, counts.pop(key)) for key in order if key in counts]
    return ordered + sorted(counts.items())


def overview(runs: pd.DataFrame) -> dict[str, Any]:
    """What was run: models, GPU and node counts, devices, dates, runs by study and status."""
    by_study = []
    if "study" in runs.columns:
        for study, group in runs.groupby(runs["study"].fillna("unknown").astype(str), sort=True):
            ok = int((group["status"] == "ok").sum()) if "status" in group.columns else 0
            by_study.append({"study": study, "runs": len(group), "ok": ok})
    first, last = _dates(runs)
    return {
        "runs": len(runs),
        "by_status": _counts(runs, "status", RUN_STATUSES),
        "by_study": by_study,
        "models": _unique(runs, "model"),
        "gpus": [fmt_int(value) for value in _unique(runs, "gpus")],
        "nodes": [fmt_int(value) for value in _unique(runs, "nodes")],
        "devices": _unique(runs, "device_name"),
        "device_types": _unique(runs, "device_type"),
        "first_started": first,
        "last_started": last,
    }


def unfinished(runs: pd.DataFrame) -> list[Row]:
    """Every run whose status is not ok (including a missing status), worst first."""
    if runs.empty:
        return []
    if "status" not in runs.columns:
        return rows(runs, ("study", "model", "gpus", "run_id"))
    frame = runs[runs["status"].fillna("") != "ok"].copy()
    order = {status: index for index, status in enumerate(("failed", "preempted", "missing"))}
    frame["_order"] = frame["status"].map(order).fillna(len(order))
    found = rows(frame, ("_order", "study", "model", "gpus", "repeat", "run_id"))
    for row in found:
        row.pop("_order", None)
    return found


def inconsistent(runs: pd.DataFrame) -> list[Row]:
    """Completed runs whose record disagrees with what the study planned (``consistent`` false)."""
    ok = _ok_runs(runs)
    if "consistent" not in ok.columns:
        return []
    return rows(ok[ok["consistent"].map(truthy).eq(False)], ("study", "model", "gpus", "run_id"))


def provenance(runs: pd.DataFrame) -> dict[str, Any]:
    """Git commits (with dirtiness and how many runs each), torch versions and devices seen;
    runs that recorded no commit are counted apart, not as a commit of their own."""
    commits = []
    unrecorded = len(runs)
    if "git_commit" in runs.columns:
        frame = runs[runs["git_commit"].notna()]
        frame = frame.assign(_dirty=frame["git_dirty"].map(truthy) if "git_dirty" in frame.columns else None)
        unrecorded = len(runs) - len(frame)
        for commit, group in frame.groupby("git_commit", sort=True):
            dirty = {flag for flag in group["_dirty"] if flag is not None}
            commits.append(
                {
                    "commit": commit,
                    "runs": len(group),
                    "dirty": "yes" if dirty == {True} else "no" if dirty == {False} else "mixed" if dirty else MISSING,
                }
            )
    return {
        "commits": commits,
        "unrecorded": unrecorded,  # runs with no commit (typically: no record at all)
        "torch": _unique(runs, "torch_version"),
        "devices": _unique(runs, "device_name"),
    }


def gpu_peaks() -> list[dict[str, Any]]:
    """The GPU peak table (``scalerepro.common.gpu_peaks``: MFU's denominators and the roofline's
    roofs), one entry per GPU with the figures it gives."""
    out = []
    for entry in PEAKS.values():
        figures = [(f"{precision} (TFLOP/s)", entry.tflops(precision)) for precision in ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")]
        figures.append(("HBM (TB/s)", entry.hbm_tbps))
        out.append({
            "key": entry.key,
            "name": entry.name,
            "source": entry.source,
            "device_names": ", ".join(entry.device_names),
            "figures": [(name, value) for name, value in figures if value is not None],
        })  # fmt: skip
    return out


def comparison_groups(comparison: pd.DataFrame) -> dict[str, list[Row]]:
    """The comparison rows by group: "reproduction" (the study's GPU) and "context" (another
    GPU, never a pass or fail), each in model, GPU count, reference order."""
    if comparison.empty:
        return {"reproduction": [], "context": []}
    group = comparison["group"] if "group" in comparison.columns else pd.Series("reproduction", index=comparison.index)
    return {name: rows(comparison[group.eq(name)], ("model", "gpus", "metric", "reference")) for name in ("reproduction", "context")}


def verdict_counts(comparison: pd.DataFrame) -> list[tuple[str, int]]:
    """How many references got each verdict (the condition of "not comparable" aside)."""
    if "verdict" not in comparison.columns or comparison.empty:
        return []
    return _counts(comparison.assign(kind_of=comparison["verdict"].astype(str).str.split(":").str[0]), "kind_of", VERDICTS)


def noisy_cells(tables: Mapping[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """The cells flagged noisy (throughput CV above targets.noise_cv_max), table by table."""
    found = []
    for name, keys in (("scaling", ("study", "model", "gpus")), ("sensitivity", ("model", "gpus", "precision", "per_gpu_batch", "bucket_cap_mb")),
                       ("ablation", ("model", "gpus", "variant")), ("parallelism", ("model", "gpus", "parallel"))):  # fmt: skip
        frame = tables.get(name, pd.DataFrame())
        if "noisy" not in frame.columns:
            continue
        for row in rows(frame[frame["noisy"].map(truthy).eq(True)]):
            cell = ", ".join(f"{label(k)} {fmt_text(row.get(k))}" for k in keys if not is_missing(row.get(k)))
            found.append({"table": name, "cell": cell, "cv": row.get("samples_per_s_cv"), "n": row.get("repeats_ok")})
    return found


def profiling_section(tables_dir: Path, report_dir: Path | None) -> dict[str, Any]:
    """Per profiled run: its breakdown and classification (profiling.csv), top kernels or
    operators, Nsight Compute roofline rows, and its raw files with links relative to the report
    (the files stay in results/profiles/, next to results/report/)."""
    tables = {name: read_table(tables_dir, name) for name in ("profiling", "profiling_kernels", "profiling_roofline", "profiling_files", "runs")}

    def of_run(name: str, run_id: Any) -> list[Row]:
        frame = tables[name]
        return rows(frame[frame["run_id"] == run_id]) if "run_id" in frame.columns else []

    runs = []
    for row in rows(tables["profiling"], ("run_id",)):
        files = of_run("profiling_files", row["run_id"])
        for f in files:
            f["href"] = os.path.relpath(f["path"], report_dir) if report_dir is not None else f["path"]
        runs.append(profiled_run(row, of_run("profiling_kernels", row["run_id"]), of_run("profiling_roofline", row["run_id"]),
                                 files, of_run("runs", row["run_id"])))  # fmt: skip
    return {"planned": (Path(tables_dir) / "profiling.csv").is_file(), "runs": runs}


def history_section(
    history_path: Path | None, versus_table_path: Path | None, versus_facts_path: Path | None,
    plots_dir: Path | None, config: Mapping[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """The results store's view of the study (``scalerepro.analysis.history.store``, ``scalerepro.analysis.history.compare``):
    each headline cell across the stored studies, and the comparison with the baseline when
    ``compare.baseline`` is set. An absent input is said to be absent, never drawn as empty."""
    config = config if isinstance(config, Mapping) else {}
    history = read_table(history_path.parent, history_path.stem) if history_path is not None else pd.DataFrame()
    studies = int(history["study_id"].nunique()) if "study_id" in history.columns else 0
    # The store's receipt beside the history (store_study writes both): how many studies it holds.
    receipt = read_json(history_path.parent / "store.json") if history_path is not None else None
    section: dict[str, Any] = {
        "store": (config.get("store") or {}).get("path"),
        "baseline": (config.get("compare") or {}).get("baseline"),
        "consulted": history_path is not None and history_path.is_file(),
        "in_store": receipt.get("studies_in_store") if isinstance(receipt, Mapping) else None,
        "studies": studies,
        "rows": rows(history, ("model", "gpus", "per_gpu_batch", "started_at")),
        "figure": load_figure(plots_dir, "history") if studies >= 2 else None,
        "versus": None,
    }
    if versus_facts_path is not None and versus_table_path is not None:
        section["versus"] = {
            "facts": read_json(versus_facts_path) or {},
            "rows": rows(read_table(versus_table_path.parent, versus_table_path.stem)),
            "figure": load_figure(plots_dir, "versus_baseline"),
        }
    return section


def parallelism_why_empty(config: Any, empty: str) -> str:
    """Why the parallelism section has no rows: the study switched off in the configuration,
    or (switched on) the table's own state."""
    settings = config.get("parallelism") if isinstance(config, Mapping) else None
    if isinstance(settings, Mapping) and not settings.get("enabled", False):
        return "Not measured: the parallelism study is disabled in the configuration (parallelism.enabled: false)"
    if config is not None and settings is None:
        return "Not measured: the configuration has no parallelism study (no parallelism: entry)"
    return empty


def split_cost(cost: pd.DataFrame) -> tuple[list[Row], Row | None]:
    """The per-study rows of ``cost.csv`` and its 'total' row (None when it has none)."""
    if "study" not in cost.columns:
        return rows(cost), None
    is_total = cost["study"].astype(str) == "total"
    total = rows(cost[is_total])
    return rows(cost[~is_total]), (total[0] if total else None)


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def make_environment(templates_dir: Path) -> jinja2.Environment:
    """The Jinja environment: templates from ``<templates_dir>/templates``, autoescape on for
    every template (they are all HTML), the formats of ``formatting`` as its filters and globals."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(templates_dir) / "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(TEMPLATE_FILTERS)
    environment.globals.update(TEMPLATE_GLOBALS)
    environment.tests["missing"] = is_missing
    return environment


def _stylesheet(templates_dir: Path) -> str:
    """The report's own CSS, inlined into a <style> element (and so not escaped)."""
    path = Path(templates_dir) / "style.css"
    css = path.read_text(encoding="utf-8") if path.is_file() else ""
    if "</style" in css.lower():
        raise ValueError(f"{path} contains '</style', which would end the inlined stylesheet")
    return css


MEASURED_COLUMNS = (
    "power_mean_w",
    "energy_per_sample_j",
    "energy_per_sample_net_j",
    "gpu_util_mean_pct",
    "final_train_loss",
    "final_eval_accuracy",
)


def build_context(
    tables_dir: Path,
    plots_dir: Path | None,
    inventory_path: Path | None,
    config_path: Path | None,
    references_path: Path | None,
    report_dir: Path | None = None,
    history_path: Path | None = None,
    versus_table_path: Path | None = None,
    versus_facts_path: Path | None = None,
) -> dict[str, Any]:
    """Everything the templates show, read and derived once."""
    tables = {name: read_table(Path(tables_dir), name) for name in TABLES}
    # What an empty table's section says: the file is absent, or there but without rows (e.g. a
    # study with no sensitivity runs).
    empty = {
        name: f"Not measured: {name}.csv "
        + ("has no rows" if (Path(tables_dir) / f"{name}.csv").is_file() else "is not there")
        for name in TABLES
    }
    runs, scaling = tables["runs"], tables["scaling"]
    inventory = read_json(inventory_path)
    config = read_json(config_path)
    references_doc = read_yaml(references_path) or {}
    summary = read_json(Path(tables_dir) / "summary.json")
    ok = _ok_runs(runs)
    ok, tables["parallelism"], mfu_headers = mfu_columns(ok, tables["parallelism"])  # the peak each MFU is against
    # Which per-run measurements any completed run has: a section with none says so instead of
    # showing a table of dashes.
    measured = {column: bool(column in ok.columns and ok[column].notna().any()) for column in MEASURED_COLUMNS}
    cost, cost_total = split_cost(tables["cost"])
    # Why the runs have no NVML figures, as their records say (e.g. a CPU run).
    nvml_reasons = _unique(ok, "nvml_reason")
    targets = (config or {}).get("targets") or {} if isinstance(config, dict) else {}
    return {
        "empty": empty,
        "cpu_study": bool(not ok.empty and "device_type" in ok.columns and set(ok["device_type"].dropna()) == {"cpu"}),
        "tolerance": targets.get("reproduce_tolerance", DEFAULT_REPRODUCE_TOLERANCE),
        "noise_cv_max": targets.get("noise_cv_max", DEFAULT_NOISE_CV_MAX),
        "noisy": noisy_cells(tables),
        "comparison_groups": comparison_groups(tables["comparison"]),
        "verdict_counts": verdict_counts(tables["comparison"]),
        "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "overview": overview(runs),
        "summary_json": json.dumps(summary, indent=2, sort_keys=True) if summary is not None else None,
        "checks": rows(tables["checks"]),
        "check_counts": _counts(tables["checks"], "status", CHECK_STATUSES),
        "headline": headline_section(runs, scaling, inventory),
        "study": study_identity(config, runs),  # the title: the study's name and what it was
        "mfu_headers": mfu_headers,
        "inventory": describe_inventory(readable_inventory(inventory)),
        "software": (inventory or {}).get("software") if isinstance(inventory, dict) else None,
        "scaling": {
            study: rows(group, ("model", "gpus"))
            for study, group in (scaling.groupby("study", sort=True) if "study" in scaling.columns else [])
        },
        "scaling_unlabelled": rows(scaling, ("model", "gpus")) if "study" not in scaling.columns else [],
        "sensitivity": rows(tables["sensitivity"], ("model", "gpus", "precision", "per_gpu_batch", "bucket_cap_mb")),
        # The aggregation's variant order (baseline first) is kept within a model and GPU count.
        "ablation": rows(tables["ablation"], ("model", "gpus")),
        # the aggregation's strategy order (matrix order) is kept within a model and GPU count
        "parallelism": rows(tables["parallelism"], ("model", "gpus")),
        "parallelism_why_empty": parallelism_why_empty(config, empty["parallelism"]),
        "communication": rows(tables["communication"], ("backend", "nodes", "gpus", "size_bytes")),
        "comparison": rows(tables["comparison"], ("model", "gpus", "metric", "reference")),
        "loss_view": loss_rows(rows(tables["loss_decomposition"], ("study", "model", "gpus"))),
        "scaling_model": rows(tables["scaling_model"], ("study", "model", "gpus")),
        "scaling_model_view": scaling_model_section(rows(tables["scaling_model"], ("study", "model", "gpus")), runs, empty["scaling_model"]),
        "links": (references_doc.get("links") or {}),
        "nearest_published": nearest_published.report_context(runs, references_path, tables["comparison"]),
        "peaks": gpu_peaks(),
        "references_path": str(references_path) if references_path is not None else None,
        "ok_runs": rows(ok, ("study", "model", "gpus", "variant", "repeat", "run_id")),
        "measured": measured,
        "nvml_reasons": nvml_reasons,
        "unfinished": unfinished(runs),
        "inconsistent": inconsistent(runs),
        "cost": cost,
        "cost_total": cost_total,
        "provenance": provenance(runs),
        "all_runs": rows(runs, ("study", "model", "gpus", "variant", "repeat", "run_id")),
        "config_json": json.dumps(config, indent=2) if config is not None else None,
        "figures": {name: load_figure(plots_dir, name) for name in FIGURE_NAMES},
        "sections": SECTIONS,
        "secno": section_numbers(),
        "sectitle": section_titles(),
        "tables_dir": str(tables_dir),
        "profiling": profiling_section(Path(tables_dir), report_dir),
        "history": history_section(history_path, versus_table_path, versus_facts_path, plots_dir, config),
    }


def render(
    tables_dir: str | os.PathLike[str],
    plots_dir: str | os.PathLike[str] | None,
    inventory_path: str | os.PathLike[str] | None,
    config_path: str | os.PathLike[str] | None,
    references_path: str | os.PathLike[str] | None,
    templates_dir: str | os.PathLike[str],
    report_dir: str | os.PathLike[str] | None = None,
    history_path: str | os.PathLike[str] | None = None,
    versus_table_path: str | os.PathLike[str] | None = None,
    versus_facts_path: str | os.PathLike[str] | None = None,
) -> str:
    """The report as one HTML string. ``templates_dir`` holds ``templates/report.html.j2`` (and
    its partials) and ``style.css``. Missing inputs become visible holes, never errors."""
    environment = make_environment(Path(templates_dir))
    context = build_context(
        Path(tables_dir),
        Path(plots_dir) if plots_dir is not None else None,
        Path(inventory_path) if inventory_path is not None else None,
        Path(config_path) if config_path is not None else None,
        Path(references_path) if references_path is not None else None,
        Path(report_dir) if report_dir is not None else None,
        *(Path(p) if p is not None else None for p in (history_path, versus_table_path, versus_facts_path)),
    )
    context["css"] = _stylesheet(Path(templates_dir))
    return environment.get_template("report.html.j2").render(**context)


_PROG = "scalerepro.analysis.presentation.report"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(
        prog=_PROG,
        description="Render the scaling study's report as one self-contained HTML file.",
    )
    parser.add_argument(
        "--tables", required=True, type=Path, help="directory of the aggregation's CSV tables and summary.json"
    )
    parser.add_argument("--plots", required=True, type=Path, help="directory of <figure>.svg / <figure>.png")
    parser.add_argument("--inventory", required=True, type=Path, help="system inventory JSON")
    parser.add_argument("--config", required=True, type=Path, help="the resolved workflow config as JSON")
    parser.add_argument("--references", required=True, type=Path, help="config/references.yaml")
    parser.add_argument("--templates", required=True, type=Path, help="directory holding templates/ and style.css")
    parser.add_argument("--out", required=True, type=output_path, help="the HTML file to write")
    parser.add_argument("--history", type=Path, help="history.csv of the results store (scalerepro.analysis.history.store)")
    parser.add_argument("--versus-baseline", nargs=2, type=Path, metavar=("CSV", "JSON"), help="the compare rule's table and facts")
    args = parser.parse_args(argv)
    require_aggregation(args.tables)
    versus = args.versus_baseline or (None, None)
    html = render(args.tables, args.plots, args.inventory, args.config, args.references, args.templates, args.out.parent,
                  args.history, *versus)  # fmt: skip
    write_text_atomically(args.out, html)
    print(f"report: {args.out} ({len(html.encode('utf-8')) / 1024:.0f} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
