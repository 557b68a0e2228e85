"""What a check is: the entries of the config's ``targets.checks`` parsed and validated against
the tables and columns a check may read (``scalerepro.analysis.tables.checking`` evaluates them).

No pandas here: the workflow parses the checks when it plans the study, where only the workflow's
extra is installed, so that a check selecting on a column its table lacks is refused at the dry run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scalerepro.analysis.columns import (
    ABLATION_COLUMNS,
    COMM_COLUMNS,
    COMPARISON_COLUMNS,
    PARALLELISM_COLUMNS,
    RUN_COLUMNS,
    SCALING_COLUMNS,
    SENSITIVITY_COLUMNS,
)
from scalerepro.common.cli import CommandError

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
REDUCTIONS = ("worst", "best", "mean", "median")
DIRECTIONS = ("min", "max")  # min: the measured value must reach the threshold; max: stay under it


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
