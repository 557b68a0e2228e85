"""What the scaling model (``step_model``) reads from a study's records and tables: the one-GPU
run's step profile (its gradient buckets and compute phases), the multi-rank runs' steps, the
one-GPU steps at each micro-batch, a batch curve kept beside the study, and from references.yaml
the largest global batch each model is trained at (``global_batch_caps``). Never imports torch."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.tables import loss_decomposition
from scalerepro.analysis.tables.step_model import BatchCurve, Statistic, StepProfile
from scalerepro.analysis.values import finite_number
from scalerepro.common import batch_split
from scalerepro.common.cli import CommandError
from scalerepro.common.gpu_peaks import peaks_key
from scalerepro.record.read import read

BATCH_CURVE_FILE = "batch_curve.json"  # benchmarks/gpu/batch_curve.py's output: a study's, or its GPU session's


def read_profile(record_path: str | os.PathLike[str]) -> tuple[StepProfile | None, str]:
    """The step profile of one run record, or None and why there is none."""
    try:
        reading = read(record_path)
    except (OSError, ValueError) as error:
        return None, str(error) if isinstance(error, CommandError) else f"unreadable run record {record_path}: {error}"
    if reading.nonsense:
        return None, f"its {reading.nonsense[0]}: no step to replay"
    measured = reading.record.measurements
    probe = measured.backward_buckets if measured is not None else None
    if measured is None or probe is None:
        return None, "its record has no backward_buckets (recorded before the scaling model)"
    if not probe.steps or not probe.buckets:
        return None, f"its bucket probe did not run: {probe.reason}"
    if measured.step_time_s.median is None:
        return None, "its record has no median step time"
    forward, backward, optimizer = probe.forward_s, probe.backward_s, probe.optimizer_s
    if forward is None or backward is None or optimizer is None:
        absent = next(name for name, value in (("forward_s", forward), ("backward_s", backward), ("optimizer_s", optimizer)) if value is None)
        return None, f"its backward_buckets.{absent} is absent: no step to replay"
    return StepProfile(
        step_s=measured.step_time_s.median,
        forward_s=forward,
        backward_s=backward,
        optimizer_s=optimizer,
        micro_batches=probe.micro_batches_per_step or 1,
        bucket_bytes=tuple(bucket.bytes for bucket in probe.buckets),
        bucket_ready_s=tuple(bucket.ready_s for bucket in probe.buckets),
    ), ""


def median_profile(profiles: Sequence[StepProfile]) -> StepProfile:
    """The element-wise median of repeats of one cell (their bucket layouts must agree)."""
    layouts = {p.bucket_bytes for p in profiles}
    if len(layouts) != 1:
        raise ValueError(f"repeats of one cell recorded different bucket layouts: {sorted(layouts)}")

    def med(values: Iterable[float]) -> float:
        return statistics.median(values)

    return StepProfile(
        step_s=med(p.step_s for p in profiles),
        forward_s=med(p.forward_s for p in profiles),
        backward_s=med(p.backward_s for p in profiles),
        optimizer_s=med(p.optimizer_s for p in profiles),
        micro_batches=profiles[0].micro_batches,
        bucket_bytes=profiles[0].bucket_bytes,
        bucket_ready_s=tuple(med(values) for values in zip(*(p.bucket_ready_s for p in profiles))),
    )


def within_step(profile: StepProfile) -> StepProfile:
    """The profile with its phases scaled down to fit in t(1) when they add up to more (the probe's
    few steps caught a slower moment than the window's median), so that the model gives t(1) back
    at one GPU; unchanged otherwise."""
    phases = profile.micro_batches * (profile.forward_s + profile.backward_s) + profile.optimizer_s
    scale = min(1.0, profile.step_s / phases)
    return StepProfile(
        step_s=profile.step_s,
        forward_s=scale * profile.forward_s,
        backward_s=scale * profile.backward_s,
        optimizer_s=scale * profile.optimizer_s,
        micro_batches=profile.micro_batches,
        bucket_bytes=profile.bucket_bytes,
        bucket_ready_s=tuple(scale * ready for ready in profile.bucket_ready_s),
    )


def kept_batch_curve(record_files: Iterable[str], model: str, device_names: Iterable[str]) -> tuple[BatchCurve | None, str]:
    """The batch curve kept for ``model`` beside a study: ``batch_curve.json`` in the study folder
    (the one holding the ``runs`` folder its records lie in, <study>/runs/<run>/record.json), else
    in the folder holding the study (a GPU session's folder, where benchmarks/gpu/batch_curve.py
    writes its curve beside the session's records). A curve of another model, or measured on
    another GPU than the study's (``gpu_peaks.peaks_key``), is not this study's. (None, why) where
    none is kept."""
    folders = set()
    for path in record_files:
        runs_folder = next((parent for parent in Path(path).parents if parent.name == "runs"), None)
        if runs_folder is not None:
            folders.add(runs_folder.parent)
    if len(folders) != 1:
        return None, "no study folder to look for a kept batch curve in"
    (study,) = folders
    keys = {peaks_key(str(name)) for name in device_names if name}
    for candidate in (study / BATCH_CURVE_FILE, study.parent / BATCH_CURVE_FILE):
        if not candidate.is_file():
            continue
        try:
            document = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if document.get("model") == model and peaks_key(str(document.get("device"))) in keys - {None}:
            where = f"{candidate.parent.name}/{candidate.name}" if candidate.parent != study else candidate.name
            curve = BatchCurve.from_document(document, where)
            return curve, f"kept: {where}" if curve is not None else f"{where} holds no curve that rises with the batch"
    return None, f"no {BATCH_CURVE_FILE} of {model} on the study's GPU in the study folder or the folder holding it"


@dataclass(frozen=True)
class BatchCap:
    """The largest global batch a model is trained at, and whose figure it is."""

    global_batch: int
    name: str  # whose figure, in a few words
    source: str


def global_batch_caps(references: Mapping[str, Any]) -> dict[str, BatchCap]:
    """Per trainer model, the least of: the largest global batch a published run of it, or of a
    model standing for it (``stands_for``), uses (gpus x per_gpu_samples_per_step; an expectation
    is no run), and the bound ``one_gpu_strong_batch.bounds`` gives it (its data set)."""
    caps: dict[str, BatchCap] = {}

    def offer(model: str, cap: BatchCap) -> None:
        if model not in caps or cap.global_batch < caps[model].global_batch:
            caps[model] = cap

    published: dict[str, BatchCap] = {}
    for entry in references.get("references") or []:
        per_gpu = (entry.get("conditions") or {}).get("per_gpu_samples_per_step")
        if per_gpu is None or str(entry.get("kind", "")).startswith("expected"):
            continue
        batch = int(entry["gpus"]) * int(per_gpu)
        stands_for = (entry.get("stands_for") or {}).get("model")
        for model in filter(None, (entry.get("model"), stands_for)):
            if model not in published or batch > published[model].global_batch:
                whose = f"{entry['model']} standing for {model}, " if model == stands_for else ""
                published[model] = BatchCap(batch, entry["id"], f"the largest a published run uses: {entry['id']} ({whose}{entry['gpus']} GPUs x {per_gpu})")
    for model, cap in published.items():
        offer(model, cap)
    for model, bound in ((references.get("one_gpu_strong_batch") or {}).get("bounds") or {}).items():
        offer(model, BatchCap(int(bound["global_batch"]), bound["name"], bound["source"]))
    return caps


def _positive(value: Any) -> float | None:
    """A measured time: finite and above 0, else None."""
    number = finite_number(value)
    return number if number is not None and number > 0 else None


@dataclass(frozen=True)
class RankStep:
    """A multi-rank run's step as the model reads it (``rank_step``): the typical rank's compute,
    its wait for the slowest rank (None where the record does not split it out), the all-reduce
    it exposed, and where they were measured."""

    compute_s: float
    straggler_s: float | None
    exposed_s: float | None
    measured_in: str  # "window" | "probe"

    @property
    def nosync_s(self) -> float:
        """The step without communication as the ranks wait for the slowest."""
        return self.compute_s + (self.straggler_s or 0.0)


def rank_step(run: pd.Series, statistic: Statistic = "median") -> RankStep | None:
    """``no_sync_step_and_exposed`` with the wait for the slowest rank apart. The window's figures
    are means over its steps; where the prediction is of a median step (``statistic``: a weak
    cell's E is in median steps, a strong cell's in mean steps, ``statistic_of``) they are scaled
    by the run's median step over its mean step, so that a window with one slow step among few
    does not put that step into a median. A probe's figures are its own short run's: its slowest
    rank's no-sync step holds the wait, which is not split out."""
    quantities = loss_decomposition.run_quantities(run)
    if isinstance(quantities, dict) and quantities["measured_in"] == "window":
        scale = 1.0
        if statistic == "median":
            median = _positive(run.get("step_time_median_s"))
            scale = median / quantities["step"] if median is not None else 1.0
        return RankStep(scale * quantities["compute"], scale * quantities["straggler"], scale * quantities["exposed"], "window")
    nosync, exposed, measured_in = no_sync_step_and_exposed(run)
    return None if nosync is None else RankStep(nosync, None, exposed, measured_in)


def no_sync_step_and_exposed(run: pd.Series) -> tuple[float | None, float | None, str]:
    """A multi-rank run's step without the all-reduce, as the ranks wait for the slowest, and the
    all-reduce it exposed. From the window's own steps where the record splits them
    (``loss_decomposition.run_quantities``: the typical rank's compute + its wait for the slowest;
    the exposed comm), else from the probe after the window (its slowest rank's no-sync step;
    sync - no-sync step); (None, None) with neither; and which ("window" or "probe")."""
    quantities = loss_decomposition.run_quantities(run)
    # the window's figures with the probe's overlap cost only: without it (--comm-probe-steps 0)
    # the window's compute holds the all-reduce's cost to the backward, and the model has neither
    if isinstance(quantities, dict) and quantities["measured_in"] == "window":
        return quantities["compute"] + quantities["straggler"], quantities["exposed"], "window"
    nosync, sync = _positive(run.get("nosync_step_s")), _positive(run.get("sync_step_s"))
    return nosync, (max(sync - nosync, 0.0) if nosync is not None and sync is not None else None), "probe"


def one_gpu_steps(model_runs: pd.DataFrame, statistic: Statistic = "median") -> dict[tuple[int, int], float]:
    """(micro-batch, micro-batches a step) -> the median, over the model's counted one-GPU runs
    there and every study that ran it (strong, weak, sensitivity: the same preset), of each run's
    median step (``statistic`` "median") or mean step, window / steps ("mean": a throughput's)."""
    one = model_runs[model_runs["gpus"].eq(1) & model_runs["counts"].astype(bool)]
    steps: dict[tuple[int, int], list[float]] = {}
    for _, run in one.iterrows():
        step = _positive(run.get("step_time_median_s")) if statistic == "median" else loss_decomposition.mean_step_s(run)
        if step is not None:
            key = (int(run["per_gpu_batch"]), int(run.get("grad_accum_steps", 1) or 1))
            steps.setdefault(key, []).append(step)
    return {key: statistics.median(values) for key, values in steps.items()}


@dataclass(frozen=True)
class HeldBatch:
    """The global batch the predicted strong rows of a one-GPU study hold, the one-GPU step it is
    against (micro-batch, micro-batches a step), and why that batch (``basis``: the rows'
    global_batch_basis)."""

    global_batch: int
    reference_split: tuple[int, int]
    basis: str


def held_global_batch(batch_1: int, micro_1: int, counts: Sequence[int], model: str, cap: BatchCap | None) -> HeldBatch:
    """G = the one-GPU batch x n for the largest n up to the largest of ``counts`` whose G splits
    evenly over every count and is within ``cap``: at the largest count each GPU runs the one-GPU
    batch, fewer GPUs accumulate micro-batches of at most ``micro_1``; where a cap binds, fewer
    samples a GPU at the largest count. Where no multiple splits (or the one-GPU batch is above the
    cap) G is the one-GPU batch, as measured."""
    largest = max(counts)
    limit = cap.global_batch if cap is not None else math.inf
    within = cap.source if cap is not None else f"no published run of {model} and no bound in references.yaml caps it"
    for n in range(largest, 0, -1):
        global_batch = batch_1 * n
        if global_batch <= limit and all(global_batch % gpus == 0 for gpus in counts):
            break
    else:
        reason = f"no multiple of {batch_1} up to {largest}x splits evenly over {', '.join(map(str, counts))} GPUs within its cap ({within})"
        return HeldBatch(batch_1, batch_split.strong_split(batch_1, 1, micro_1), f"the one-GPU global batch {batch_1}: {reason}")
    reference = batch_split.strong_split(global_batch, 1, micro_1)
    if n == largest:
        held = f"at {largest} GPUs each runs the one-GPU batch {batch_1}, fewer GPUs accumulate"
    elif cap is not None and batch_1 * largest > cap.global_batch:
        held = f"capped at {cap.global_batch} by {cap.name}"
    else:
        held = f"the largest multiple of the one-GPU batch that splits over {', '.join(map(str, counts))} GPUs"
    return HeldBatch(
        global_batch,
        reference,
        f"global batch {global_batch} = the one-GPU batch {batch_1} x {n} ({held}; {within}), "
        f"against the one-GPU step at it: {reference[1]} micro-batch{'es' if reference[1] != 1 else ''} of {reference[0]}",
    )
