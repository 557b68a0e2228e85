"""What the report says, derived from the aggregation's tables and the study's files: the overview,
the unfinished and inconsistent runs, provenance, the comparison's groups, noisy cells, the
profiling and history sections, and the lines a section shows in place of a table. Small and
explicit: the statistics themselves are the aggregation's. Never imports torch."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.columns import RUN_STATUSES, VERDICTS
from scalerepro.analysis.presentation.formatting import MISSING, fmt_int, fmt_text, is_missing, label, truthy
from scalerepro.analysis.presentation.inputs import Row, load_figure, read_json, read_table, rows
from scalerepro.analysis.presentation.profiling_view import profiled_run
from scalerepro.analysis.tables.reproduction import UNSCHEDULED_VERDICT
from scalerepro.analysis.values import plain
from scalerepro.common.gpu_peaks import PEAKS


def unique_values(frame: pd.DataFrame, column: str) -> list[Any]:
    if column not in frame.columns:
        return []
    values = [plain(value) for value in frame[column].dropna().unique()]
    return sorted(values, key=lambda v: (not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v)))


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
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


def counts_of(frame: pd.DataFrame, column: str, order: Iterable[str]) -> list[tuple[str, int]]:
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
        "by_status": counts_of(runs, "status", RUN_STATUSES),
        "by_study": by_study,
        "models": unique_values(runs, "model"),
        "gpus": [fmt_int(value) for value in unique_values(runs, "gpus")],
        "nodes": [fmt_int(value) for value in unique_values(runs, "nodes")],
        "devices": unique_values(runs, "device_name"),
        "device_types": unique_values(runs, "device_type"),
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
    ok = ok_runs(runs)
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
        "torch": unique_values(runs, "torch_version"),
        "devices": unique_values(runs, "device_name"),
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
    """The comparison rows by group: "reproduction" (the study's GPU) but those the reproduce
    study scheduled no run for, "unscheduled" (those: one line names them), and "context"
    (another GPU, never a pass or fail), each in model, GPU count, reference order."""
    if comparison.empty:
        return {"reproduction": [], "unscheduled": [], "context": []}
    group = comparison["group"] if "group" in comparison.columns else pd.Series("reproduction", index=comparison.index)
    verdict = comparison["verdict"] if "verdict" in comparison.columns else pd.Series(None, index=comparison.index)
    unscheduled = group.eq("reproduction") & verdict.eq(UNSCHEDULED_VERDICT)
    parts = {
        "reproduction": comparison[group.eq("reproduction") & ~unscheduled],
        "unscheduled": comparison[unscheduled],
        "context": comparison[group.eq("context")],
    }
    return {name: rows(part, ("model", "gpus", "metric", "reference")) for name, part in parts.items()}


def verdict_counts(comparison: pd.DataFrame) -> list[tuple[str, int]]:
    """How many references got each verdict (the condition of "not comparable" aside)."""
    if "verdict" not in comparison.columns or comparison.empty:
        return []
    return counts_of(comparison.assign(kind_of=comparison["verdict"].astype(str).str.split(":").str[0]), "kind_of", VERDICTS)


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
    counted = runs[runs["counts"].map(truthy).eq(True)] if "counts" in runs.columns else ok_runs(runs)
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
    loss_view: Sequence[Mapping[str, Any]],
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
