"""Checks as data (ReFrame's value, bounds, unit): each check from `targets.checks` selects rows of
one table, reduces a column and compares it with its threshold; the verdict says pass, fail,
inconclusive (the interval straddles the threshold) or not measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from scalerepro.analysis.columns import (
    ABLATION_COLUMNS,
    CHECK_COLUMNS,
    COMM_COLUMNS,
    COMPARISON_COLUMNS,
    CPU_STUDY,
    PARALLELISM_COLUMNS,
    RUN_COLUMNS,
    SCALING_COLUMNS,
    SENSITIVITY_COLUMNS,
)
from scalerepro.analysis.tables import repeats
from scalerepro.common.cli import CommandError

# --------------------------------------------------------------------------------------------
# Checks against the targets: every check is data (config ``targets.checks``), one evaluator
# --------------------------------------------------------------------------------------------

# The tables a check may select from, and the numeric columns it may reduce (its metric).
CHECK_TABLES: dict[str, tuple[str, ...]] = {
    "scaling": (
        "samples_per_s_median",
        "samples_per_s_cv",
        "samples_per_s_per_gpu",
        "step_time_median_s",
        "epoch_time_s",
        "epoch_time_cv",
        "speedup",
        "efficiency",
        "weak_variation",
    ),
    "sensitivity": ("samples_per_s_median", "samples_per_s_cv", "step_time_median_s", "exposed_comm_fraction"),
    "ablation": ("samples_per_s_median", "samples_per_s_cv", "gain"),
    "parallelism": (
        "samples_per_s_median",
        "samples_per_s_cv",
        "tokens_per_s_median",
        "tokens_per_s_per_gpu",
        "mfu",
        "peak_memory_bytes",
        "state_bytes_per_rank_max",
        "comm_bytes_per_step",
    ),
    "runs": (
        "samples_per_s",
        "tokens_per_s",
        "step_time_median_s",
        "epoch_time_s",
        "mfu",
        "exposed_comm_fraction",
        "data_stall_fraction",
        "gpu_util_mean_pct",
        "power_mean_w",
        "energy_per_sample_j",
        "energy_per_sample_net_j",
        "peak_memory_bytes",
        "final_train_loss",
        "final_eval_loss",
        "final_eval_accuracy",
    ),
    "communication": ("time_us_median", "algbw_gbps", "busbw_gbps"),
    "comparison": ("ratio", "measured"),
}
# Every column of each table, which a check's ``where`` may select on.
CHECK_TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "scaling": SCALING_COLUMNS,
    "sensitivity": SENSITIVITY_COLUMNS,
    "ablation": ABLATION_COLUMNS,
    "parallelism": PARALLELISM_COLUMNS,
    "runs": RUN_COLUMNS,
    "communication": COMM_COLUMNS,
    "comparison": COMPARISON_COLUMNS,
}
assert set(CHECK_TABLE_COLUMNS) == set(CHECK_TABLES)
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
REDUCTIONS = ("worst", "best", "mean", "median")
REDUCED = {"worst": "the worst", "best": "the best", "mean": "the mean", "median": "the median"}
DIRECTIONS = ("min", "max")  # min: the measured value must reach the threshold; max: stay under it
CHECK_UNITS = ("fraction", "percent", "signed fraction")


class CheckConfigError(CommandError, ValueError):
    """An entry of ``targets.checks`` the evaluator cannot use; one line naming the key and the fix."""


@dataclass(frozen=True)
class Check:
    """One entry of ``targets.checks`` (ReFrame's reference tuple as data): reduce ``metric``
    over the ``table`` rows that ``where`` selects, and hold it against ``threshold``."""

    name: str
    description: str
    table: str
    metric: str
    threshold: float
    direction: str
    where: Mapping[str, Any]
    reduce: str = "worst"
    strict: bool = False  # pass at equality unless strict
    unit: str = "fraction"

    @property
    def operator(self) -> str:
        return {"min": ">", "max": "<"}[self.direction] + ("" if self.strict else "=")

    def passes(self, value: float) -> bool:
        return {">": value > self.threshold, ">=": value >= self.threshold, "<": value < self.threshold, "<=": value <= self.threshold}[self.operator]

    def text(self, value: float, digits: int = 1) -> str:
        """A value of this check's metric as the report shows it (``digits`` decimals; a unit of
        its own: three more significant digits)."""
        return {"fraction": f"{value:.{digits}%}", "percent": f"{value:.{digits}f}%", "signed fraction": f"{value:+.{digits}%}"}.get(
            self.unit, f"{value:.{digits + 3}g} {self.unit}"
        )

    def shown(self, value: float) -> str:
        """``text``, with as many more digits as tell the value from the threshold where, rounded,
        it would read as the threshold: 79.96 % against "> 80.0%" fails and must not read 80.0 %."""
        digits = 1
        while value != self.threshold and self.text(value, digits) == self.text(self.threshold, digits) and digits < 9:
            digits += 1
        return self.text(value, digits)


def parse_checks(targets: Mapping[str, Any]) -> list[Check]:
    """The checks of ``targets['checks']`` (name -> entry), in their order. A bad entry raises
    CheckConfigError with one line naming the key and the fix (the config schema catches most
    first). The workflow calls it at the dry run, so that a check selecting on a column its table
    lacks is refused before any job runs, not when the aggregation has its tables."""
    entries = targets.get("checks") or {}
    known = set(Check.__dataclass_fields__) - {"name"}
    parsed = []
    for name, entry in entries.items():
        where = f"targets.checks.{name}"
        if not isinstance(entry, Mapping):
            raise CheckConfigError(f"config error at '{where}': a check is a mapping of {sorted(known)}")
        unknown = set(entry) - known
        missing = {"table", "metric", "threshold", "direction"} - set(entry)
        if unknown or missing:
            what = f"unknown keys {sorted(unknown)}" if unknown else f"missing keys {sorted(missing)}"
            raise CheckConfigError(f"config error at '{where}': {what}; a check has {sorted(known)}")
        table, metric = entry["table"], entry["metric"]
        if table not in CHECK_TABLES:
            raise CheckConfigError(f"config error at '{where}.table': {table!r} is not one of {list(CHECK_TABLES)}")
        if metric not in CHECK_TABLES[table]:
            raise CheckConfigError(f"config error at '{where}.metric': {metric!r} is not a metric of {table}.csv (one of {', '.join(CHECK_TABLES[table])})")
        for key, allowed in (("direction", DIRECTIONS), ("reduce", REDUCTIONS)):
            if key in entry and entry[key] not in allowed:
                raise CheckConfigError(f"config error at '{where}.{key}': {entry[key]!r} is not one of {list(allowed)}")
        selector = entry.get("where") or {}
        unknown_columns = [str(column) for column in selector if column not in CHECK_TABLE_COLUMNS[table]]
        if unknown_columns:
            raise CheckConfigError(
                f"config error at '{where}.where': {table}.csv has no column {unknown_columns[0]!r} (it has {', '.join(CHECK_TABLE_COLUMNS[table])})"
            )
        if isinstance(entry["threshold"], bool) or not isinstance(entry["threshold"], (int, float)):
            raise CheckConfigError(f"config error at '{where}.threshold': {entry['threshold']!r} is not a number")
        parsed.append(
            Check(
                name=name,
                description=entry.get("description", f"{table} {metric}"),
                table=table,
                metric=metric,
                threshold=float(entry["threshold"]),
                direction=entry["direction"],
                where=dict(entry.get("where") or {}),
                reduce=entry.get("reduce", "worst"),
                strict=bool(entry.get("strict", False)),
                unit=entry.get("unit", "fraction"),
            )
        )
    return parsed


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
        return _verdict(check, target, why + (f": {'; '.join(reasons)}" if reasons else ""))
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
    return _verdict(check, target, detail, measured, interval)


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
