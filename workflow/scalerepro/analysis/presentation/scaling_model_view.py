"""What the report's scaling-model section shows: the rows of scaling_model.csv as a reader can take
them (the one-GPU row is the reference every efficiency is against, not a 100 % result), the
cluster the predictions beyond the study's hardware ran on and why that one, and what each
predicted loss of efficiency is lost to: the per-step cost that does not shrink with the batch,
or the all-reduce left exposed.

The figures are scaling_model.csv's (``scalerepro.analysis.tables.scaling_model``); this module
only selects and words them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from scalerepro.analysis.presentation.formatting import fmt_milliseconds, fmt_percent
from scalerepro.analysis.tables.prediction_error import NO_BACK_TEST, NO_ERROR_BAR
from scalerepro.analysis.tables.scaling_model import BOUND_NOTE, beyond_note, derived_note
from scalerepro.analysis.values import finite_number, plain

SCALING_STUDIES = ("strong", "weak")
# a strong row holding a larger global batch (scaling_model.held_global_batch) is against this step
# accumulated to it, which the row's note says
REFERENCE_NOTE = "the reference: every efficiency and speed-up is against this measured one-GPU step"


LOSS_PARTS = (
    ("loss_fixed_cost", "fixed per-step cost"),
    ("loss_compute_inflation", "compute inflation"),
    ("loss_exposed_comm", "exposed all-reduce"),
    ("loss_straggler", "wait for the slowest rank"),
)


def loss_source(row: Mapping[str, Any]) -> str | None:
    """What most of a predicted row's lost efficiency is lost to, in a few words: the largest
    part when it is at least twice the next, else the two largest; None for a row with no
    prediction or nothing lost (a table from before compute inflation counts it as 0)."""
    parts = {name: finite_number(row.get(key)) for key, name in LOSS_PARTS}
    if parts["fixed per-step cost"] is None or parts["exposed all-reduce"] is None:
        return None
    ranked = sorted(((value or 0.0, name) for name, value in parts.items()), reverse=True)
    if sum(value for value, _ in ranked) < 0.005:
        return None
    (first, first_name), (second, second_name) = ranked[0], ranked[1]
    if first >= 2 * second:
        return first_name
    return f"{first_name} and {second_name}"


def _shown_note_parts(row: Mapping[str, Any]) -> dict[str, str | None]:
    """The parts of a row's note the table shows otherwise, in the width of its column, built from
    the row's fields as the table built them: what its other cells already say is left out
    (scaling_model.csv keeps the whole note)."""
    shown: dict[str, str | None] = {
        beyond_note(1): None,  # every row of a one-GPU study: the Basis column and the section's first line say it
        BOUND_NOTE: "compute taken as proportional to the micro-batch: no batch curve covers it",  # "an upper bound" is under the efficiency
    }
    source, batch = plain(row.get("derived_from")), plain(row.get("per_gpu_batch"), whole_as_int=True)
    if source is not None and batch is not None:
        shown[derived_note(batch, source)] = f"weak: per-GPU batch {batch} held, from the {source} study's one-GPU step"
    return shown


def scaling_model_section(model_rows: Sequence[dict[str, Any]], runs: pd.DataFrame, empty: str) -> dict[str, Any]:
    """``model_rows``: scaling_model.csv's rows as the report reads them; ``runs``: runs.csv;
    ``empty``: what to say when there are none and the reason is not that no scaling study ran."""
    shown = []
    for row in model_rows:
        row = type(row)(row)  # the report's row type: a missing column reads as None
        if finite_number(row.get("gpus")) == 1 and row.get("basis") == "measured":
            # t(1) is the model's input and the efficiencies' denominator: 100 % and +0 % say nothing
            for key in (
                "step_time_predicted_s",
                "step_time_error",
                "efficiency_measured",
                "efficiency_predicted",
                "efficiency_error",
                "loss_fixed_cost",
                "loss_exposed_comm",
                "loss_compute_inflation",
                "compute_inflation",
            ):
                row[key] = None
            reference = REFERENCE_NOTE if finite_number(row.get("step_time_measured_s")) is not None else None  # none without a measured step
            row["note"] = "; ".join(filter(None, [reference, row.get("note")])) or None
        row["loss_source"] = loss_source(row)  # None for the reference row: it predicts nothing, so loses nothing
        # the table's first columns show the prediction with the measurement beneath it, so that a
        # measured cell reads in the width of one column (every column is in the fold below it)
        step, efficiency = finite_number(row.get("step_time_measured_s")), finite_number(row.get("efficiency_measured"))
        row["step_measured_note"] = f"measured {fmt_milliseconds(step)} ms" if step is not None else None
        row["efficiency_measured_note"] = f"measured {fmt_percent(efficiency)}" if efficiency is not None else None
        if row.get("bound") and efficiency is None:
            row["efficiency_measured_note"] = "an upper bound"  # its note says why
        if row.get("cluster"):
            # the cluster's network is said once above the table, and the regime's error is in its own
            # column, its back-test listed once above the table (the row's cluster_note is not shown)
            row["network"] = None
        shown_parts = _shown_note_parts(row)
        row["note"] = "; ".join(filter(None, (shown_parts.get(part, part) for part in str(row.get("note") or "").split("; ")))) or None
        row["assumed_note"] = row.get("assumed_inputs")
        shown.append(row)
    regimes: dict[str, dict[str, Any]] = {}
    for row in model_rows:
        if row.get("basis") != "predicted" or not row.get("regime") or finite_number(row.get("efficiency_predicted")) is None:
            continue
        # a regime's error bar, with the rows that carry it; the rows not comparable to its back-test
        # are counted apart (each row's note says why)
        regime = regimes.setdefault(row["regime"], {"key": row["regime"], "typical_error": None, "basis": NO_BACK_TEST, "rows": 0, "not_comparable": 0})
        if str(row.get("error_basis") or "").startswith(NO_ERROR_BAR):
            regime["not_comparable"] += 1
            continue
        regime.update(typical_error=finite_number(row.get("typical_error")), basis=row.get("error_basis"))
        regime["rows"] += 1
    curves = {row.get("batch_curve") for row in shown if row.get("batch_curve")}
    batch_curve = None
    if len(curves) == 1:  # one curve (or none) for every row: said once, above the table
        (batch_curve,) = curves
        for row in shown:
            row["batch_curve"] = None
    if all(finite_number(row.get("grad_accum_steps")) in (None, 1) for row in shown):
        for row in shown:  # one micro-batch a step everywhere: a column of 1s says nothing
            row["grad_accum_steps"] = None
    clusters: dict[str, dict[str, Any]] = {}
    for row in model_rows:
        if row.get("cluster") and row["cluster"] not in clusters:
            clusters[row["cluster"]] = {"key": row["cluster"], "network": row.get("network"), "basis": row.get("cluster_basis")}
    studies = set(runs["study"].dropna()) if "study" in runs.columns else set()
    why_empty = empty
    if not model_rows and not studies & set(SCALING_STUDIES):
        why_empty = (
            f"No prediction: no strong or weak scaling run here ({', '.join(sorted(studies)) or 'none'}) to replay; "
            "scalerepro.analysis.predict --record predicts a record."
        )
    fixed_mostly = [row for row in shown if row.get("loss_source") == "fixed per-step cost"]
    # what a count counts: gloo ranks where every run with a record ran on a CPU
    devices = set(runs["device_type"].dropna()) if "device_type" in runs.columns else set()
    return {
        "rows": shown,
        "clusters": list(clusters.values()),
        "why_empty": why_empty,
        "fixed_mostly": fixed_mostly,
        "batch_curve": batch_curve,
        "regimes": sorted(regimes.values(), key=lambda regime: (regime["typical_error"] is None, regime["key"])),
        "unit": ("rank", "ranks") if devices == {"cpu"} else ("GPU", "GPUs"),
    }
