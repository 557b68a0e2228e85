"""Checks as data (ReFrame's value, bounds, unit): each check from `targets.checks` selects rows of
one table, reduces a column and compares it with its threshold; the verdict says pass, fail,
inconclusive (the interval straddles the threshold) or not measured. What a check is, and how the
config's entries are parsed, is ``check_definitions`` (no pandas: the workflow reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from scalerepro.analysis.columns import CHECK_COLUMNS, CPU_STUDY
from scalerepro.analysis.tables import repeats
from scalerepro.analysis.tables.check_definitions import Check, parse_checks
from scalerepro.analysis.tables.readers import RECORDS_STUDY

# --------------------------------------------------------------------------------------------
# Checks against the targets: every check is data (config ``targets.checks``), one evaluator
# --------------------------------------------------------------------------------------------

# What names a selected row in a check's detail, by table.
CHECK_LABELS = {
    "scaling": "model",
    "sensitivity": "model",
    "ablation": "model",
    "parallelism": "cell",
    "runs": "run_id",
    "communication": "size_bytes",
    "comparison": "reference",
}
# Why a row has no value, by table (shown when a check measured nothing).
CHECK_REASONS = {"scaling": "note", "sensitivity": "note", "ablation": "note", "parallelism": "note", "runs": "nvml_reason", "comparison": "verdict"}
# The runs a per-run check (the runs table) judges are the measurements of a configuration as it is
# meant to run: not the runs that vary one lever to show its effect (a study's ablation and
# sensitivity runs; in a report of records, a record that departs from its preset: the DataLoader
# run degraded on purpose) and not the smoke runs that check a code path.
LEVER_STUDIES = ("ablation", "sensitivity")


def lever_or_smoke(runs: pd.DataFrame) -> pd.Series:
    """Which of ``runs`` (runs.csv rows) a per-run check leaves out (LEVER_STUDIES)."""
    smoke = runs["purpose"].ne("measurement") if "purpose" in runs.columns else False
    study = runs["study"] if "study" in runs.columns else pd.Series("", index=runs.index)
    departs = study.eq(RECORDS_STUDY) & runs["preset_overrides"].notna() if "preset_overrides" in runs.columns else False
    return study.isin(LEVER_STUDIES) | departs | smoke


REDUCED = {"worst": "the worst", "best": "the best", "mean": "the mean", "median": "the median"}

_COMPARISONS = {">=": "ge", "<=": "le", ">": "gt", "<": "lt"}


def select(table: pd.DataFrame, where: Mapping[str, Any]) -> tuple[pd.DataFrame, str]:
    """The rows ``where`` selects, and the selection as text. A value is matched for equality (a
    list: any of it), a string ">1" / ">=2" / "<8" / "<=4" compares, and "max" / "min" keeps the
    rows at the largest / smallest value of the column among those the other keys select."""
    rows, said, extremes = table, [], []
    for column, wanted in where.items():
        if column not in table.columns:
            raise ValueError(f"a check selects on {column!r}, which the table lacks (it has {', '.join(table.columns)})")
        if wanted in ("max", "min"):
            extremes.append((column, wanted))
            continue
        if isinstance(wanted, str) and wanted[:1] in "<>":
            op = ">=" if wanted.startswith(">=") else "<=" if wanted.startswith("<=") else wanted[0]
            rows = rows[getattr(rows[column], _COMPARISONS[op])(float(wanted[len(op) :]))]
            said.append(f"{column} {op} {wanted[len(op) :]}")
        elif isinstance(wanted, list):
            rows = rows[rows[column].isin(wanted)]
            said.append(f"{column} in {', '.join(map(str, wanted))}")
        else:
            rows = rows[rows[column].eq(wanted)]
            said.append(f"{column} = {wanted}")
    for column, wanted in extremes:
        value = getattr(rows[column], wanted)()
        if pd.notna(value):
            rows = rows[rows[column].eq(value)]
        said.append(f"{column} = {value:g} ({wanted})" if pd.notna(value) else f"{column} = {wanted}")
    return rows, ", ".join(said)


def _verdict(
    check: Check,
    target: str,
    detail: str,
    measured: float | None = None,
    interval: tuple[float, float] = (float("nan"), float("nan")),
) -> dict[str, Any]:
    """One checks.csv row; without ``measured`` the check is "not measured" and ``detail`` says
    why. With an interval that has the threshold strictly inside it the check is "inconclusive":
    the repeats cannot say on which side the true value lies."""
    low, high = interval
    value = "" if measured is None else check.shown(measured)
    if measured is None:
        status = "not measured"
    elif repeats.straddles(low, high, check.threshold):
        status = "inconclusive"
        detail = f"95 % interval {check.shown(low)} to {check.shown(high)} holds the threshold; " + detail
    else:
        status = "pass" if check.passes(measured) else "fail"
    row = (check.name, target, check.threshold, measured, low, high, value, status, detail, check.unit)
    return dict(zip(CHECK_COLUMNS, row))


def evaluate(check: Check, tables: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """One check on the tables: select its rows, reduce its metric (worst: the row furthest on
    the failing side, with its 95 % interval where the table has ``<metric>_ci_low/_high``;
    mean / median: over the rows), say which rows and why any were not measured."""
    table = tables[check.table]
    label = CHECK_LABELS[check.table]
    chosen, where = select(table, check.where)
    left_out = ""
    if check.table == "runs":
        levers = lever_or_smoke(chosen)
        names = chosen.loc[levers, label].astype(str).tolist()
        if names:
            left_out = f"; left out, not a measurement of a configuration as meant (a lever's or a smoke run): {', '.join(names) if len(names) <= 3 else f'{len(names)} runs'}"
        chosen = chosen[~levers]
    # the target as its definition reads, so that one definition reads one way in every report
    # and two definitions under one name read apart: what is reduced, how, over which rows
    target = f"{check.description}: {REDUCED[check.reduce]} {check.metric} {check.operator} {check.text(check.threshold)}" + (
        f" over the {check.table} rows where {where}" if where else f" over every {check.table} row"
    )
    done = chosen.dropna(subset=[check.metric])
    if done.empty:
        reason = CHECK_REASONS.get(check.table)
        if check.table == "runs" and "withheld" in chosen.columns:  # the records hold the figure wrongly: say so, not that it is absent
            chosen = chosen.assign(withheld_why=[_withheld_why(text, check.metric) for text in chosen["withheld"]])
            reason = "withheld_why" if chosen["withheld_why"].notna().any() else reason
        reasons = []  # each reason once, with the rows it is given for
        if reason in chosen.columns:
            for text, labels in chosen.dropna(subset=[reason]).groupby(reason, sort=False)[label]:
                who = ", ".join(map(str, labels)) if len(labels) <= 3 else f"{len(labels)} rows"
                reasons.append(f"{who}: {text}")
        why = (
            f"no {check.table}.csv row where {where or 'any'}"
            if chosen.empty
            else f"no {check.metric} in the {len(chosen)} {check.table}.csv rows where {where or 'any'}"
        )
        return _verdict(check, target, why + (f": {'; '.join(reasons)}" if reasons else "") + left_out)
    worst_first = done.sort_values(check.metric, ascending=check.direction == "min", kind="stable")
    per_label = worst_first.drop_duplicates(subset=[label])  # a derived column may repeat on a model's rows
    listing = ", ".join(f"{name} {check.shown(v)}" for name, v in zip(per_label[label], per_label[check.metric]))
    if len(per_label) > 6:
        listing = f"{len(per_label)} {label}s, median {check.shown(float(done[check.metric].median()))}"
    interval = (float("nan"), float("nan"))
    if check.reduce in ("worst", "best"):
        picked = worst_first.iloc[0 if check.reduce == "worst" else -1]
        measured = float(picked[check.metric])
        detail = f"{check.reduce} {label} {picked[label]}: {listing}"
        if {f"{check.metric}_ci_low", f"{check.metric}_ci_high"} <= set(table.columns):
            interval = (float(picked[f"{check.metric}_ci_low"]), float(picked[f"{check.metric}_ci_high"]))
    else:
        measured = float(getattr(done[check.metric], check.reduce)())
        worst = worst_first.iloc[0]
        detail = f"{check.reduce} of {len(done)} rows; worst {worst[label]} {check.shown(float(worst[check.metric]))}"
    absent = chosen.loc[chosen[check.metric].isna(), label].astype(str).unique()
    if len(absent):
        detail += "; not measured: " + ", ".join(absent)
    return _verdict(check, target, detail + left_out, measured, interval)


def _withheld_why(withheld: Any, metric: str) -> str | None:
    """Why a run's ``metric`` is withheld, from runs.csv's withheld ("<columns>: <why>; ..."), or None."""
    for entry in str(withheld or "").split(" | "):
        columns, _, why = entry.partition(": ")
        if metric in columns.split(", "):
            return f"withheld: {why}"
    return None


def cpu_study(runs: pd.DataFrame) -> bool:
    """Every run that counts ran on the CPU (and at least one did)."""
    types = set(runs.loc[runs["counts"], "device_type"].dropna())
    return types == {"cpu"}


def checks_table(tables: Mapping[str, pd.DataFrame], targets: Mapping[str, Any]) -> pd.DataFrame:
    """One row per entry of ``targets['checks']``, by name, each judged against its
    threshold. On a CPU study the thresholds are the CPU's (the config's cpu_overrides set them)
    and each row says what a CPU study judges: ranks sharing one host's cores are not a cluster."""
    # by name: one order in every report, whatever order the study's config kept its checks in
    rows = [evaluate(check, tables) for check in sorted(parse_checks(targets), key=lambda check: check.name)]
    if rows and cpu_study(tables["runs"]):
        for row in rows:
            if row["status"] != "not measured":
                row["detail"] = f"{CPU_STUDY}; {row['detail']}"
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)
