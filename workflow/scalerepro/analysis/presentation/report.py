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
renders. What the templates read is ``ReportContext``, one declared field per name, rendered under
Jinja's StrictUndefined: a name or key that nothing set fails the render naming it, so a hole is
only ever a value that is None on purpose. This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from scalerepro.analysis import study_files
from scalerepro.analysis.columns import AGGREGATE_TABLES, CHECK_STATUSES, DEFAULT_NOISE_CV_MAX, DEFAULT_REPRODUCE_TOLERANCE, RUN_STATUSES, VERDICTS
from scalerepro.analysis.presentation.bottlenecks import bottleneck_rows
from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES
from scalerepro.analysis.presentation.formatting import MISSING, TEMPLATE_FILTERS, TEMPLATE_GLOBALS, fmt_int, fmt_text, is_missing, label, truthy
from scalerepro.analysis.presentation.headline import headline_section, mfu_columns, study_identity
from scalerepro.analysis.presentation.inputs import Figure, Row, load_figure, read_json, read_table, readable_inventory, require_aggregation, rows
from scalerepro.analysis.presentation.inventory_view import describe_inventory, hosts_of_runs
from scalerepro.analysis.presentation.loss_view import loss_rows
from scalerepro.analysis.presentation.profiling_view import profiled_run
from scalerepro.analysis.presentation.scaling_model_view import scaling_model_section
from scalerepro.analysis.tables import nearest_published
from scalerepro.analysis.tables.network_model import DEFAULT_LINK_EFFICIENCY
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
    (
        "results",
        "Results",
        (
            ("scaling", "Scaling"),
            ("why-not-faster", "Why not faster"),
            ("sensitivity", "Sensitivity"),
            ("ablation", "Ablation"),
            ("parallelism", "Parallelism strategies"),
            ("communication", "Communication"),
            ("convergence", "Loss and accuracy"),
            ("energy", "Power and energy"),
            ("per-run", "Per-run measurements"),
            ("scaling-model", "Scaling model"),
            ("profiling", "Profiling"),
        ),
    ),
    ("comparison", "Measured vs published", ()),
    ("failures", "Failed or missing runs", ()),
    ("cost", "Cost of the study", ()),
    ("reproducibility", "Reproducibility", ()),
    (
        "history",
        "Versus baseline and history",
        (
            ("versus-baseline", "Versus baseline"),
            ("history-cells", "Headline cells across studies"),
        ),
    ),
)

# A report whose every counted run used one GPU leads with what that GPU measured: the headline,
# then the published figures it stands beside; the sections about scaling, which it cannot fill,
# come after the system, each as one line.
ONE_GPU_LEAD = ("summary", "comparison")


def report_sections(one_gpu: bool) -> tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...]:
    """SECTIONS in the order the report shows them: a one-GPU report's ONE_GPU_LEAD first, then
    the rest in SECTIONS' order; a study that scaled keeps SECTIONS' order."""
    if not one_gpu:
        return SECTIONS
    by_anchor = {entry[0]: entry for entry in SECTIONS}
    return (*(by_anchor[anchor] for anchor in ONE_GPU_LEAD), *(entry for entry in SECTIONS if entry[0] not in ONE_GPU_LEAD))


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
        out.append(
            {
                "key": entry.key,
                "name": entry.name,
                "source": entry.source,
                "device_names": ", ".join(entry.device_names),
                "figures": [(name, value) for name, value in figures if value is not None],
            }
        )
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
    for name, keys in (
        ("scaling", ("study", "model", "gpus")),
        ("sensitivity", ("model", "gpus", "precision", "per_gpu_batch", "bucket_cap_mb")),
        ("ablation", ("model", "gpus", "variant")),
        ("parallelism", ("model", "gpus", "parallel")),
    ):
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
        runs.append(
            profiled_run(row, of_run("profiling_kernels", row["run_id"]), of_run("profiling_roofline", row["run_id"]), files, of_run("runs", row["run_id"]))
        )
    return {"planned": (Path(tables_dir) / "profiling.csv").is_file(), "runs": runs}


def history_section(
    history_path: Path | None,
    versus_table_path: Path | None,
    versus_facts_path: Path | None,
    plots_dir: Path | None,
    config: Mapping[str, Any] | None,
) -> dict[str, Any]:
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


def withheld_figures(withheld: Any) -> tuple[str | None, list[str]]:
    """runs.csv's ``withheld`` ("<columns>: <why> | ...") as the per-run table shows it: the
    figures' names, short, and each reason apart (said once under the table)."""
    if is_missing(withheld):
        return None, []
    names, reasons = [], []
    for entry in str(withheld).split(" | "):
        columns, _, why = entry.partition(": ")
        names.append(label(columns.split(", ")[0]).removesuffix(" bytes").removesuffix(" fraction"))
        reasons.append(f"{', '.join(label(c) for c in columns.split(', '))}: {why}")
    return ", ".join(names), reasons


def report_source(config: Any) -> dict[str, Any]:
    """What the report was made from (rebuild --records writes ``records_dirs`` into its config):
    records no study planned, with their folders, the config its checks came from and the
    profiles beside them it did not read; else a planned study."""
    config = config if isinstance(config, Mapping) else {}
    records = "records_dirs" in config
    return {
        "records": records,
        "records_dirs": list(config.get("records_dirs") or []),
        "targets_from": config.get("targets_from"),
        "profiles_not_read": list(config.get("profiles_not_read") or []),
        "runs_word": "records" if records else "planned",
        "profiling_configured": "profiling" in config,
    }


def parallelism_why_empty(config: Any, empty: str) -> str:
    """Why the parallelism section has no rows: the study switched off in the configuration,
    or (switched on) the table's own state."""
    settings = config.get("parallelism") if isinstance(config, Mapping) else None
    if isinstance(settings, Mapping) and not settings.get("enabled", False):
        return "Not measured: the parallelism study is disabled in the configuration (parallelism.enabled: false)"
    if config is not None and settings is None:
        return "Not measured: the configuration has no parallelism study (no parallelism: entry)"
    return empty


def one_gpu_scope(runs: pd.DataFrame) -> str | None:
    """Why nothing was scaled, where every counted run used one GPU (one rank on a CPU): "every
    run used 1 GPU", or "every completed run ..." where runs at more were planned but none counts;
    None where a counted run used more, or none counts."""
    counted = runs[runs["counts"].map(truthy).eq(True)] if "counts" in runs.columns else _ok_runs(runs)
    if "gpus" not in counted.columns:
        return None
    gpus = pd.to_numeric(counted["gpus"], errors="coerce").dropna()
    if gpus.empty or not gpus.eq(1).all():
        return None
    cpu = "device_type" in counted.columns and set(counted["device_type"].dropna()) == {"cpu"}
    planned = pd.to_numeric(runs["gpus"], errors="coerce").dropna()
    return f"every {'run' if planned.eq(1).all() else 'completed run'} used 1 {'rank' if cpu else 'GPU'}"


def single_lines(
    scope: str | None,
    empty: Mapping[str, str],
    loss_view: Sequence[Row],
    sensitivity: Sequence[Row],
    parallelism: Sequence[Row],
    parallelism_why: str,
    communication: Sequence[Row],
    scaling_model: Mapping[str, Any],
) -> dict[str, str]:
    """Anchor -> the one line a one-GPU report says instead of a multi-GPU section it cannot fill
    (its formulas and empty tables would explain what was not measured); empty where the study
    scaled, and a section that has rows at one GPU keeps them."""
    if scope is None:
        return {}
    many = "ranks" if scope.endswith("rank") else "GPUs"

    def why(state: str) -> str:  # "Not measured: x.csv has no rows." -> "x.csv has no rows"
        return state.removeprefix("Not measured: ").removeprefix("No prediction: ").rstrip(".")

    lines = {"scaling": f"not measured — {scope}, so nothing was scaled: no speed-up or efficiency (each model's throughput is in the headline)"}
    if not loss_view:
        lines["why-not-faster"] = f"not measured — {scope}: there is no loss against ideal scaling to split into parts"
    if not sensitivity:
        lines["sensitivity"] = f"not measured — {scope}; {why(empty['sensitivity'])}"
    if not parallelism:
        lines["parallelism"] = f"not measured — {scope}; {why(parallelism_why)}"
    if not communication:
        lines["communication"] = f"not measured — {scope}, and an all-reduce needs two {many} or more; {why(empty['communication'])}"
    if not scaling_model["rows"]:
        lines["scaling-model"] = f"no prediction — {why(scaling_model['why_empty'])}"
    return lines


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
    every template (they are all HTML), the formats of ``formatting`` as its filters and globals,
    and ``<templates_dir>/style.css`` as the global ``css``. A name or key that nothing set fails
    the render with an error naming it (StrictUndefined): an absent value is None on purpose,
    so a misspelling cannot pass for a hole."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(templates_dir) / "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters.update(TEMPLATE_FILTERS)
    environment.globals.update(TEMPLATE_GLOBALS)
    environment.globals["css"] = _stylesheet(Path(templates_dir))
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
    "sm_clock_mean_mhz",
    "power_mean_w",
    "energy_per_sample_j",
    "energy_per_sample_net_j",
    "gpu_util_mean_pct",
    "final_train_loss",
    "final_eval_accuracy",
)


def shown_links(links: Any) -> dict[str, dict[str, Any]]:
    """``links`` of references.yaml as the scaling-model section lists them: each as written, with
    the efficiency the model uses where the file states none (network_model.read_links' default)
    and its efficiency's source None there (the table shows "—")."""
    if not isinstance(links, Mapping):
        return {}
    return {
        key: {**link, "efficiency": link.get("efficiency", DEFAULT_LINK_EFFICIENCY), "efficiency_source": link.get("efficiency_source")}
        for key, link in links.items()
    }


@dataclasses.dataclass(frozen=True)
class ReportContext:
    """Everything the templates show, read and derived once (``build_context``): one field per
    name the templates read, each a top-level variable there (``{{ overview.runs }}``).

    New report content is a field here, with a line on what it holds, and its value in
    ``build_context``: a field declared but not given, or given but not declared, is a TypeError
    as the context is built, and a template that reads a name or key that nothing set fails the
    render naming it (``make_environment``'s StrictUndefined). A value that may be absent is
    None on purpose (the templates' ``missing`` test and filters show "—" or say why); a table's
    rows are ``inputs.Row`` dicts, whose absent columns read None.
    """

    # The whole report
    study: dict[str, Any]  # the title: the study's name and what it was (headline.study_identity)
    generated_at: str  # when this report was rendered, "YYYY-MM-DD HH:MM UTC"
    tables_dir: str  # the folder of the tables it was rendered from, relative to the report (no path of the machine that rendered it)
    source: dict[
        str, Any
    ]  # what the report was made from: a planned study, or records no study planned (records: True, their folders, the config its checks came from, the profiles beside them it did not read)
    left_out: list[str]  # the files beside the records not taken as this study's, each with why (summary.json's left_out)
    sections: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...]  # SECTIONS in the report's order (report_sections): contents and templates
    one_gpu: str | None  # "every run used 1 GPU" where every counted run used one GPU or rank (one_gpu_scope); None where the study scaled
    single_lines: dict[str, str]  # anchor -> the line a one-GPU report says for a multi-GPU section it cannot fill (single_lines); {} where it scaled
    secno: dict[str, str]  # anchor id -> its number, "3" / "3.1", from the report's order (section_numbers)
    sectitle: dict[str, str]  # anchor id -> its heading (section_titles)
    empty: dict[str, str]  # table name -> what its section says without rows: "Not measured: <name>.csv has no rows" / "is not there"
    cpu_study: bool  # every completed run ran on the CPU: a count is of ranks, not GPUs
    figures: dict[str, Figure]  # figure name (FIGURE_NAMES) -> its data URI, or why there is none
    # Summary
    overview: dict[str, Any]  # what was run: runs by study and status, models, counts, devices, dates (overview)
    checks: list[Row]  # checks.csv: each target check with its status
    check_counts: list[tuple[str, int]]  # (status, how many checks have it), CHECK_STATUSES first
    noisy: list[dict[str, Any]]  # the cells whose throughput CV exceeds noise_cv_max, table by table (noisy_cells)
    noise_cv_max: float  # targets.noise_cv_max: the CV above which a cell is noisy
    headline: dict[str, Any]  # per model, its best figure at one GPU and at its most, grouped by unit (headline.headline_section)
    # The system
    inventory: (
        dict[str, Any] | None
    )  # the inventory laid out as lists, tables and text (inventory_view.describe_inventory); None without one, or where it is not of the runs' machines
    inventory_problem: str | None  # why the inventory is not shown as this study's (study_files.inventory_problem); None where it is, or there is none
    hosts: list[dict[str, Any]]  # every host and card the completed runs ran on, as their records say (inventory_view.hosts_of_runs)
    software: Any  # the inventory's "software" entry as recorded; None without an inventory
    # Results
    scaling: dict[str, list[Row]]  # scaling.csv's rows by study ("strong", "weak")
    scaling_unlabelled: list[Row]  # scaling.csv's rows when it has no study column
    loss_view: list[Row]  # loss_decomposition.csv's rows, each part worded with its interval (loss_view.loss_rows)
    sensitivity: list[Row]  # sensitivity.csv
    ablation: list[Row]  # ablation.csv, the aggregation's variant order (baseline first) within a model and GPU count
    parallelism: list[Row]  # parallelism.csv with each MFU's peak, the aggregation's strategy order within a model and GPU count
    parallelism_why_empty: str  # why the parallelism section has no rows (parallelism_why_empty)
    mfu_headers: dict[str, str]  # "runs" / "parallelism" -> that table's MFU column header, naming the peak where one is common
    communication: list[Row]  # communication.csv: the all-reduce benchmark
    ok_runs: list[Row]  # runs.csv's completed runs, with each MFU's peak and the names of the figures withheld from them
    withheld_reasons: list[str]  # each reason a figure of a completed run is withheld, once (withheld_figures)
    measured: dict[str, bool]  # MEASURED_COLUMNS -> whether any completed run has a value in it
    nvml_reasons: list[str]  # why the runs' records have no NVML figures (e.g. a CPU run)
    scaling_model_view: dict[str, Any]  # scaling_model.csv as its section shows it (scaling_model_view.scaling_model_section)
    links: dict[str, dict[str, Any]]  # references.yaml's links, each with the efficiency the model uses (shown_links)
    profiling: dict[str, Any]  # whether profiling was planned, and each profiled run (profiling_section)
    bottlenecks: list[dict[str, Any]]  # per model, what bounds its one-GPU cell, with the evidence and the lever (bottlenecks.bottleneck_rows)
    # Measured vs published
    nearest_published: dict[
        str, Any
    ]  # per measured model its best published and like-for-like figures, and the references beside no run (nearest_published.report_context)
    comparison_groups: dict[str, list[Row]]  # comparison.csv by group, "reproduction" and "context" (comparison_groups)
    verdict_counts: list[tuple[str, int]]  # (verdict, how many references got it), VERDICTS first
    tolerance: float  # targets.reproduce_tolerance: how far from 1 a ratio is still reproduced
    references_path: str | None  # the references file by its folder and name (config/references.yaml), no path of the machine; None without one
    peaks: list[dict[str, Any]]  # the GPU peak table, one entry per GPU (gpu_peaks)
    # Failed or missing runs
    unfinished: list[Row]  # runs.csv's runs whose status is not ok, worst first (unfinished)
    inconsistent: list[Row]  # completed runs whose record disagrees with the plan (inconsistent)
    # Cost of the study
    cost: list[Row]  # cost.csv's per-study rows
    cost_total: Row | None  # cost.csv's total row; None without one
    # Reproducibility
    provenance: dict[str, Any]  # the git commits, torch versions and devices the runs recorded (provenance)
    all_runs: list[Row]  # runs.csv: every planned run, with its rerun command
    config_json: str | None  # the resolved workflow config as JSON text; None without one
    summary_json: str | None  # the aggregation's summary.json as text; None without one
    # Versus baseline and history
    history: dict[str, Any]  # the results store's view of the study and the comparison with the baseline (history_section)

    def variables(self) -> dict[str, Any]:
        """The fields by name, the templates' top-level variables (the values themselves, not copies)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


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
) -> ReportContext:
    """Everything the templates show, read and derived once."""
    tables = {name: read_table(Path(tables_dir), name) for name in TABLES}
    # What an empty table's section says: the file is absent, or there but without rows (e.g. a
    # study with no sensitivity runs).
    empty = {name: f"Not measured: {name}.csv " + ("has no rows" if (Path(tables_dir) / f"{name}.csv").is_file() else "is not there") for name in TABLES}
    runs, scaling = tables["runs"], tables["scaling"]
    inventory = read_json(inventory_path)
    inventory_problem = study_files.inventory_problem(inventory, runs)
    if inventory_problem is not None:  # another machine's: nothing of it is shown as this study's system
        inventory = None
    config = read_json(config_path)
    references_doc = nearest_published.references_document(references_path)
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
    one_gpu = one_gpu_scope(runs)
    sections = report_sections(one_gpu is not None)
    loss_view = loss_rows(rows(tables["loss_decomposition"], ("study", "model", "gpus")))
    sensitivity = rows(tables["sensitivity"], ("model", "gpus", "precision", "per_gpu_batch", "bucket_cap_mb"))
    parallelism = rows(tables["parallelism"], ("model", "gpus"))
    parallelism_why = parallelism_why_empty(config, empty["parallelism"])
    communication = rows(tables["communication"], ("backend", "nodes", "gpus", "size_bytes"))
    scaling_model_view = scaling_model_section(rows(tables["scaling_model"], ("study", "model", "gpus")), runs, empty["scaling_model"])
    return ReportContext(
        study=study_identity(config, runs),
        generated_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        tables_dir=os.path.relpath(tables_dir, report_dir) if report_dir is not None else Path(tables_dir).name,
        source=report_source(config),
        left_out=list((summary or {}).get("left_out") or []) if isinstance(summary, dict) else [],
        sections=sections,
        one_gpu=one_gpu,
        single_lines=single_lines(one_gpu, empty, loss_view, sensitivity, parallelism, parallelism_why, communication, scaling_model_view),
        secno=section_numbers(sections),
        sectitle=section_titles(),
        empty=empty,
        cpu_study=bool(not ok.empty and "device_type" in ok.columns and set(ok["device_type"].dropna()) == {"cpu"}),
        figures={name: load_figure(plots_dir, name) for name in FIGURE_NAMES},
        overview=overview(runs),
        checks=rows(tables["checks"]),
        check_counts=_counts(tables["checks"], "status", CHECK_STATUSES),
        noisy=noisy_cells(tables),
        noise_cv_max=targets.get("noise_cv_max", DEFAULT_NOISE_CV_MAX),
        headline=headline_section(runs, scaling, inventory),
        inventory=describe_inventory(readable_inventory(inventory)),
        inventory_problem=inventory_problem,
        hosts=hosts_of_runs(runs),
        software=(inventory or {}).get("software") if isinstance(inventory, dict) else None,
        scaling={study: rows(group, ("model", "gpus")) for study, group in (scaling.groupby("study", sort=True) if "study" in scaling.columns else [])},
        scaling_unlabelled=rows(scaling, ("model", "gpus")) if "study" not in scaling.columns else [],
        loss_view=loss_view,
        sensitivity=sensitivity,
        ablation=rows(tables["ablation"], ("model", "gpus")),
        parallelism=parallelism,
        parallelism_why_empty=parallelism_why,
        mfu_headers=mfu_headers,
        communication=communication,
        ok_runs=[
            Row({**row, "withheld": withheld_figures(row.get("withheld"))[0]}) for row in rows(ok, ("study", "model", "gpus", "variant", "repeat", "run_id"))
        ],
        withheld_reasons=sorted({reason for value in ok.get("withheld", pd.Series(dtype=object)) for reason in withheld_figures(value)[1]}),
        measured=measured,
        nvml_reasons=nvml_reasons,
        scaling_model_view=scaling_model_view,
        links=shown_links(references_doc.get("links")),
        profiling=profiling_section(Path(tables_dir), report_dir),
        bottlenecks=bottleneck_rows(runs, scaling, inventory, Path(tables_dir)),
        nearest_published=nearest_published.report_context(runs, references_path, tables["comparison"], inventory),
        comparison_groups=comparison_groups(tables["comparison"]),
        verdict_counts=verdict_counts(tables["comparison"]),
        tolerance=targets.get("reproduce_tolerance", DEFAULT_REPRODUCE_TOLERANCE),
        references_path=f"{references_path.parent.name}/{references_path.name}" if references_path is not None else None,
        peaks=gpu_peaks(),
        unfinished=unfinished(runs),
        inconsistent=inconsistent(runs),
        cost=cost,
        cost_total=cost_total,
        provenance=provenance(runs),
        all_runs=rows(runs, ("study", "model", "gpus", "variant", "repeat", "run_id")),
        config_json=json.dumps(config, indent=2) if config is not None else None,
        summary_json=json.dumps(summary, indent=2, sort_keys=True) if summary is not None else None,
        history=history_section(history_path, versus_table_path, versus_facts_path, plots_dir, config),
    )


def render_context(context: ReportContext, templates_dir: str | os.PathLike[str]) -> str:
    """The report of ``context`` as one HTML string, from ``<templates_dir>/templates/report.html.j2``
    (and its partials) and ``<templates_dir>/style.css``."""
    return make_environment(Path(templates_dir)).get_template("report.html.j2").render(context.variables())


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
    context = build_context(
        Path(tables_dir),
        Path(plots_dir) if plots_dir is not None else None,
        Path(inventory_path) if inventory_path is not None else None,
        Path(config_path) if config_path is not None else None,
        Path(references_path) if references_path is not None else None,
        Path(report_dir) if report_dir is not None else None,
        *(Path(p) if p is not None else None for p in (history_path, versus_table_path, versus_facts_path)),
    )
    return render_context(context, templates_dir)


_PROG = "scalerepro.analysis.presentation.report"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(
        prog=_PROG,
        description="Render the scaling study's report as one self-contained HTML file.",
    )
    parser.add_argument("--tables", required=True, type=Path, help="directory of the aggregation's CSV tables and summary.json")
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
    html = render(args.tables, args.plots, args.inventory, args.config, args.references, args.templates, args.out.parent, args.history, *versus)
    write_text_atomically(args.out, html)
    print(f"report: {args.out} ({len(html.encode('utf-8')) / 1024:.0f} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
