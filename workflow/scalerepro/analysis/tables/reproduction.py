"""Published references beside the `reproduce` study's runs: the references file read into a
frame, the conditions of both sides, and a verdict that says `not comparable` whenever a
condition differs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import (
    COMPARISON_COLUMNS,
    CONDITIONS,
    DEFAULT_NOISE_CV_MAX,
    DEFAULT_REPRODUCE_TOLERANCE,
    REFERENCE_COLUMNS,
)
from scalerepro.analysis.tables import repeats
from scalerepro.common.references import load_references

# The condition of a reference the reproduce study names no run for: nothing was measured against
# it, so the report folds these into one line rather than a row each.
UNSCHEDULED = "no run scheduled for it"
UNSCHEDULED_VERDICT = f"not comparable: {UNSCHEDULED}"


def _source_text(source: Any) -> str:
    """A reference's source as one line: repository@commit path (row), or page, table."""
    if isinstance(source, str):
        return source
    if not isinstance(source, Mapping):
        return ""
    if "repository" in source:
        text = f"{source['repository']}@{str(source.get('commit', ''))[:12]} {source.get('path', '')}".strip()
        return text + (f" (row {source['row']})" if source.get("row") else "")
    return ", ".join(str(source[key]) for key in ("page", "table") if source.get(key))


def read_references(path: str | os.PathLike[str]) -> pd.DataFrame:
    """config/references.yaml's ``references``, one row each, conditions flattened into columns
    (REFERENCE_COLUMNS). A file that breaks its schema is a one-line ReferencesError naming the
    entry and what to fix (scalerepro.common.references)."""
    rows = []
    for entry in load_references(path).get("references", []):
        conditions, trainer = entry["conditions"], entry["trainer"]
        rows.append(
            {
                **{key: entry.get(key) for key in ("id", "model", "gpus", "metric", "value", "kind", "unmatched", "note")},
                "source": _source_text(entry["source"]),
                **{key: conditions.get(key) for key in (*CONDITIONS, "framework", "metric_notes")},
                "trainer_model": None if trainer is None else trainer["model"],
                "trainer_per_gpu_batch": None if trainer is None else trainer["per_gpu_batch"],
                "trainer_flags": None if trainer is None else " ".join(map(str, trainer["flags"])),
            }
        )
    return pd.DataFrame(rows, columns=list(REFERENCE_COLUMNS))


def read_target_gpu(path: str | os.PathLike[str]) -> str | None:
    """``target_gpu`` of references.yaml: the GPU the set is for (see comparison_table)."""
    return load_references(path).get("target_gpu")


def _given(value: Any) -> bool:
    """Not None, NaN or an empty string."""
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and value != ""


def _same_device(a: Any, b: Any) -> bool:
    """Device names compared as NVML spells them, case and spacing aside."""
    return isinstance(a, str) and isinstance(b, str) and " ".join(a.lower().split()) == " ".join(b.lower().split())


def recorded_conditions(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run's conditions in the references' terms, from its record (runs.csv columns)."""
    # runs.csv cells: None or NaN where the record lacks the field (pd.isna)
    tokens: Any = run.get("tokens_per_sample")
    image = pd.isna(tokens) or tokens == 0
    micro_batch: Any = run.get("per_gpu_batch_recorded")
    accum: Any = run.get("grad_accum_recorded")
    channels_last = run.get("channels_last")
    data = run.get("data_kind")
    return {
        "gpu": run.get("device_name") if run.get("device_type") == "cuda" else f"CPU ({run.get('device_name')})",
        "precision": run.get("precision_recorded"),
        # samples per GPU per optimizer step = per-rank micro-batch x micro-batches per step
        "per_gpu_samples_per_step": None if pd.isna(micro_batch) else int(micro_batch) * (1 if pd.isna(accum) else int(accum)),
        "seq_len": None if image else int(tokens),
        "memory_format": (None if pd.isna(channels_last) else "nhwc" if channels_last else "nchw") if image else None,
        "data": None if pd.isna(data) else "synthetic" if data == "synthetic" else "real",
        "optimizer": run.get("optimizer_kind"),
    }


def describe_conditions(conditions: Mapping[str, Any]) -> str:
    """Conditions as one line, in CONDITIONS order, the missing ones left out."""
    parts = []
    for key in CONDITIONS:
        value = conditions.get(key)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            continue
        parts.append(f"{key.replace('_', ' ')} {int(value) if isinstance(value, float) and value.is_integer() else value}")
    return "; ".join(parts)


def _differing_condition(reference: Mapping[str, Any], measured: Mapping[str, Any]) -> str | None:
    """The first condition (CONDITIONS order, GPU aside) that the reference states and the run
    does not share, as "<condition> (measured X, reference Y)"."""
    for key in CONDITIONS[1:]:
        wanted, got = reference.get(key), measured.get(key)
        if wanted is None or (isinstance(wanted, float) and np.isnan(wanted)):
            continue  # the reference does not state it: nothing to compare
        same = str(wanted).lower() == str(got).lower() if key == "optimizer" else wanted == got
        if isinstance(wanted, float) and got is not None:
            same = int(wanted) == got
        if not same:
            return f"{key.replace('_', ' ')} (measured {got}, reference {int(wanted) if isinstance(wanted, float) else wanted})"
    return None


def comparison_table(
    runs: pd.DataFrame,
    references: pd.DataFrame,
    tolerance: float = DEFAULT_REPRODUCE_TOLERANCE,
    noise_cv_max: float = DEFAULT_NOISE_CV_MAX,
    target_gpu: str | None = None,
) -> pd.DataFrame:
    """Each reference beside the cell run under its own conditions (the ``reproduce`` study's
    runs that name it in the matrix's ``reference`` column, or, where it has none, those of a
    reference with the same trainer run), with a verdict:

        reproduced      |measured / published - 1| <= tolerance
        above / below   outside the tolerance, measured higher / lower
        not comparable: <condition>   another GPU (its device name differs from the reference's),
                        a condition the trainer cannot match (the reference's ``unmatched``),
                        no run scheduled for it, or a recorded condition that differs
        not measured    a run was planned but none completed

    ``group`` is "reproduction" for references on the GPU the study ran on (on a study without
    such a GPU, a CPU study: those on ``target_gpu``), "context" for the others: shown apart,
    never a pass or fail. The measured figure is the cell's median with its bootstrap 95 %
    interval (scalerepro.analysis.tables.repeats)."""
    ok = runs[runs["counts"]]
    study_gpus = sorted(set(ok.loc[ok["device_type"].eq("cuda"), "device_name"].dropna()))
    cpu_names = sorted(set(ok.loc[ok["device_type"].eq("cpu"), "device_name"].dropna()))
    ran_on = ", ".join(study_gpus) or (f"CPU ({', '.join(cpu_names)})" if cpu_names else "no completed run")
    reproduce = runs[runs["study"].eq("reproduce")]
    # references that the same trainer run serves (the same model, GPU count, batch and flags)
    by_trainer = {
        ref["id"]: (ref["trainer_model"], ref["gpus"], ref["trainer_per_gpu_batch"], ref["trainer_flags"])
        for ref in references.to_dict("records")
        if _given(ref["trainer_model"])
    }
    rows = []
    for ref in references.to_dict("records"):
        on_study_gpu = any(_same_device(ref["gpu"], g) for g in study_gpus)
        group = "reproduction" if on_study_gpu or (not study_gpus and _same_device(ref["gpu"], target_gpu)) else "context"
        planned = reproduce[reproduce["reference"].eq(ref["id"])]
        shared = ""
        if planned.empty and ref["id"] in by_trainer:
            same = [rid for rid, key in by_trainer.items() if key == by_trainer[ref["id"]] and rid != ref["id"]]
            planned = reproduce[reproduce["reference"].isin(same)]
            shared = f"; the run of {', '.join(sorted(set(planned['reference'])))} (the same trainer run)" if len(planned) else ""
        done = planned[planned["counts"]]
        value = "samples_per_s" if ref["metric"] == "samples_per_s" else "tokens_per_s"
        values = done[value] / (done["gpus"] if ref["metric"] == "tokens_per_s_per_gpu" else 1)
        spread = repeats.describe(values.to_numpy(dtype=float), ("reference", ref["id"]))
        measured = recorded_conditions(done.iloc[0].to_dict()) if len(done) else {}
        row = {
            "reference": ref["id"],
            "group": group,
            "kind": ref["kind"],
            "model": ref["model"],
            "gpus": ref["gpus"],
            "metric": ref["metric"],
            "published": ref["value"],
            "measured": spread["median"],
            "measured_ci_low": spread["ci_low"],
            "measured_ci_high": spread["ci_high"],
            "repeats": spread["n"],
            "measured_cv": spread["cv"],
            "noisy": bool(spread["cv"] > noise_cv_max),
            "measured_cell": f"reproduce: {', '.join(done['run_id'])}{shared}" if len(done) else "",
            "measured_device": measured.get("gpu", ""),
            "measured_conditions": describe_conditions(measured),
            "published_conditions": describe_conditions(ref),
            **{key: ref[key] for key in (*CONDITIONS, "framework", "metric_notes", "source", "note")},
        }
        row["ratio"] = spread["median"] / ref["value"] if len(done) else float("nan")
        differs = None
        if len(done) and not _same_device(measured["gpu"], ref["gpu"]):
            differs = f"GPU (measured on {measured['gpu']}, reference on {ref['gpu']})"
        elif not len(done) and not on_study_gpu:
            differs = f"GPU (this study ran on {ran_on}; the reference on {ref['gpu']})"
        elif _given(ref["unmatched"]):
            differs = str(ref["unmatched"])
        elif planned.empty:
            differs = f"{UNSCHEDULED} (the reproduce study has no run naming this reference)"
        elif len(done) and spread["n"]:  # runs without the metric are "not measured" below, whatever their conditions
            differs = _differing_condition(ref, measured)
        if differs is not None:
            row["verdict"], row["differs"] = f"not comparable: {differs.split(' (')[0].split(':')[0]}", differs
        elif not len(done):
            row["verdict"] = "not measured"
            row["differs"] = f"no completed run: {len(planned)} planned, {int(planned['counts'].sum())} counted"
        elif spread["n"] == 0:
            row["verdict"], row["differs"] = "not measured", f"its {len(done)} completed runs recorded no {value}"
        else:
            # reproduced when |measured / published - 1| <= tolerance
            ratio = row["ratio"]
            row["verdict"] = "reproduced" if abs(ratio - 1) <= tolerance else "above" if ratio > 1 else "below"
            row["differs"] = ""
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
    order = {"reproduction": 0, "context": 1}
    return table.sort_values(["group", "model", "gpus"], key=lambda c: c.map(order) if c.name == "group" else c, kind="stable", ignore_index=True)
