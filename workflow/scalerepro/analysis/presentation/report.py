"""Render the study's report: its sections assembled from the tables and rendered into one self-contained HTML file that opens offline.

Inputs are the aggregation's tidy tables (``--tables``), the figures (``--plots``), the system
inventory, the resolved workflow config and ``config/references.yaml``. The CSS is inlined and
every figure is embedded as a base64 ``data:`` URI (the SVG where there is one, else the PNG), so
the file needs no network, no neighbouring files and no JavaScript.

Nothing is invented: a table that is missing or empty, a column that is absent and a figure
that was not drawn all show as visible holes ("not measured", "—", "figure missing"), and runs
that did not finish are listed with their error and the command that reruns them. A table with
rows that is not the one the aggregation wrote (its SHA-256 in summary.json:
``scalerepro.analysis.tables.table_digests``) is no hole: the report refuses it in one line.
Every string that comes from the config, the records or the inventory is HTML-escaped by Jinja's
autoescape.

    python -m scalerepro.analysis.presentation.report --tables results/tables --plots results/plots \
        --inventory results/inventory/system.json --config results/tables/config.json \
        --references config/references.yaml --templates report --out results/report/index.html

Its parts: ``inputs`` reads the tables, documents and figures; ``formatting`` is how a value is
written (the templates' filters); ``headline``, ``inventory_view``, ``prescreen_view``, ``profiling_view`` and
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from scalerepro.analysis import study_files
from scalerepro.analysis.columns import AGGREGATE_TABLES, CHECK_STATUSES, DEFAULT_NOISE_CV_MAX, DEFAULT_REPRODUCE_TOLERANCE
from scalerepro.analysis.presentation.bottlenecks import bottleneck_rows
from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES
from scalerepro.analysis.presentation.formatting import TEMPLATE_FILTERS, TEMPLATE_GLOBALS, is_missing
from scalerepro.analysis.presentation.headline import headline_section, mfu_columns, study_identity
from scalerepro.analysis.presentation.inputs import Figure, Row, load_figure, read_json, read_table, readable_inventory, require_aggregation, rows
from scalerepro.analysis.presentation.inventory_view import cards_beside, describe_inventory, hosts_of_runs, study_inventory
from scalerepro.analysis.presentation.loss_view import loss_rows
from scalerepro.analysis.presentation.prescreen_view import prescreen_section
from scalerepro.analysis.presentation.published_view import published_section
from scalerepro.analysis.presentation.report_facts import (
    comparison_groups,
    counts_of,
    gpu_peaks,
    history_section,
    inconsistent,
    noisy_cells,
    ok_runs,
    one_gpu_scope,
    overview,
    parallelism_why_empty,
    profiling_section,
    provenance,
    report_source,
    single_lines,
    split_cost,
    unfinished,
    unique_values,
    verdict_counts,
    withheld_figures,
)
from scalerepro.analysis.presentation.scaling_model_view import scaling_model_section
from scalerepro.analysis.tables import table_digests
from scalerepro.analysis.tables.network_model import DEFAULT_LINK_EFFICIENCY
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary, output_path
from scalerepro.common.files import write_text_atomically
from scalerepro.common.references import load_optional_references
from scalerepro.record import columns as record_columns

# The tables the report shows, by file stem: the aggregation's, but the per-epoch and per-step
# logs (the figures draw those).
TABLES = tuple(name for name in AGGREGATE_TABLES if name not in ("epochs", "loss_log"))


# The report's sections, in order: (anchor id, title, subsections). Their numbers are made from
# this order (section_numbers) and the templates show ``secno[id]``, never a typed number: a new
# section is its template plus one entry here.
SECTIONS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("summary", "Summary", (("bottlenecks", "What bounds each model"),)),
    ("system", "The system", ()),
    ("prescreen", "Nodes screened", ()),
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
    environment.globals["loss_spike_factor"] = record_columns.LOSS_SPIKE_FACTOR
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
    budget: dict[str, Any] | None  # the study budget's choice of repeats, and why (budget.json; scalerepro.planning.budget); None: no budget
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
    # Nodes screened
    prescreen: dict[str, Any]  # the prescreen's rule, medians, excluded nodes and a row per node and device; run False without one (prescreen_view)
    # Results
    scaling: dict[str, list[Row]]  # scaling.csv's rows by study ("strong", "weak")
    scaling_unlabelled: list[Row]  # scaling.csv's rows when it has no study column
    loss_view: Sequence[Mapping[str, Any]]  # loss_decomposition.csv's rows, each part worded with its interval (loss_view.loss_rows)
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
    published_comparison: dict[
        str, Any
    ]  # per measured model its best published and like-for-like figures, and the references beside no run (published_view.published_section)
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


def aggregated_tables(tables_dir: Path) -> dict[str, pd.DataFrame]:
    """TABLES as read, once each is the table the aggregation wrote (table_digests.check: else one
    line naming it, and no report)."""
    table_digests.check(tables_dir)
    return {name: read_table(tables_dir, name) for name in TABLES}


def runs_and_inventory(runs: pd.DataFrame, study: Path, inventory: Any, config: Any) -> tuple[pd.DataFrame, Any, str | None]:
    """The runs with what each record lacks of its card taken from the inventory beside it
    (inventory_view.cards_beside), the study's inventory (None where it is another machine's) and
    why it was refused. The study's inventory is beside none of the records a records-only rebuild
    read (it is the first of their folders')."""
    problem = study_files.inventory_problem(inventory, runs)
    if problem is not None:  # another machine's: nothing of it is shown as this study's system
        inventory = None
    runs = cards_beside(runs, study, None if report_source(config)["records"] else study_inventory(study, inventory))
    return runs, inventory, problem


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
    budget_path: Path | None = None,
    prescreen_path: Path | None = None,
) -> ReportContext:
    """Everything the templates show, read and derived once."""
    tables = aggregated_tables(Path(tables_dir))
    # What an empty table's section says: the file is absent, or there but without rows (e.g. no sensitivity runs).
    empty = {name: f"Not measured: {name}.csv " + ("has no rows" if (Path(tables_dir) / f"{name}.csv").is_file() else "is not there") for name in TABLES}
    config = read_json(config_path)
    runs, inventory, inventory_problem = runs_and_inventory(tables["runs"], Path(tables_dir).parent, read_json(inventory_path), config)
    scaling = tables["scaling"]
    references_doc = load_optional_references(references_path)  # for its links
    summary = read_json(Path(tables_dir) / "summary.json")
    ok = ok_runs(runs)
    ok, tables["parallelism"], mfu_headers = mfu_columns(ok, tables["parallelism"])  # the peak each MFU is against
    # Which per-run measurements any completed run has: a section with none says so, not a table of dashes.
    measured = {column: bool(column in ok.columns and ok[column].notna().any()) for column in MEASURED_COLUMNS}
    cost, cost_total = split_cost(tables["cost"])
    # Why the runs have no NVML figures, as their records say (e.g. a CPU run).
    nvml_reasons = unique_values(ok, "nvml_reason")
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
        budget=read_json(budget_path),
        checks=rows(tables["checks"]),
        check_counts=counts_of(tables["checks"], "status", CHECK_STATUSES),
        noisy=noisy_cells(tables),
        noise_cv_max=targets.get("noise_cv_max", DEFAULT_NOISE_CV_MAX),
        headline=headline_section(runs, tables["cells"], scaling, inventory),
        inventory=describe_inventory(readable_inventory(inventory)),
        inventory_problem=inventory_problem,
        hosts=hosts_of_runs(runs),
        software=(inventory or {}).get("software") if isinstance(inventory, dict) else None,
        prescreen=prescreen_section(prescreen_path),
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
        bottlenecks=bottleneck_rows(runs, tables["cells"], scaling, inventory, Path(tables_dir)),
        published_comparison=published_section(tables["published_comparison"], tables["gap_walk"], tables["comparison"]),
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
    budget_path: str | os.PathLike[str] | None = None,
    prescreen_path: str | os.PathLike[str] | None = None,
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
        *(Path(p) if p is not None else None for p in (history_path, versus_table_path, versus_facts_path, budget_path, prescreen_path)),
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
    parser.add_argument("--budget", type=Path, help="budget.json: the repeats the study's training budget chose (scalerepro.planning.budget)")
    parser.add_argument("--prescreen", type=Path, help="screen.json: the prescreen's judgement of the nodes (scalerepro.planning.node_screen)")
    args = parser.parse_args(argv)
    require_aggregation(args.tables)
    if args.budget is not None and not args.budget.is_file():
        raise CommandError(f"--budget {args.budget}: no such file: run the workflow's study_budget checkpoint first")
    versus_table, versus_facts = args.versus_baseline or (None, None)
    html = render(
        args.tables,
        args.plots,
        args.inventory,
        args.config,
        args.references,
        args.templates,
        args.out.parent,
        args.history,
        versus_table,
        versus_facts,
        args.budget,
        args.prescreen,
    )
    write_text_atomically(args.out, html)
    print(f"report: {args.out} ({len(html.encode('utf-8')) / 1024:.0f} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
