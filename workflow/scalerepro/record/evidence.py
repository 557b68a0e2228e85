"""What a record must be to count as evidence beyond its types and bounds (which the model
declares): each figure what the formula that made it gives from the record's other figures, a
figure stated only with what it needs, the figures that bound each other in order, and a measured
window that had its machine to itself (QUIET).

A record is a claim, not a figure to publish: one whose figures disagree is no measurement, and
``scalerepro.record.read`` says so in one line, naming the figure and the formula.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scalerepro.record.measured import Measurements
from scalerepro.record.model import RunRecord

# Two figures "agree" when they differ by less than this, relatively: a record holds doubles
# computed from each other, so anything wider than rounding is an edited or mixed-up record.
AGREEMENT = 1e-3


def _product(*values: float | int | None) -> float | None:
    return None if any(v is None for v in values) else math.prod(v for v in values if v is not None)


def _quotient(numerator: float | int | None, *denominators: float | int | None) -> float | None:
    bottom = _product(*denominators)
    return None if numerator is None or not bottom else numerator / bottom


def devices(record: RunRecord) -> int | None:
    """The devices whose peak a run had: its distinct cards on CUDA (ranks may share one under
    gloo), else its ranks."""
    parallel = record.parallel
    return parallel.gpus if parallel.device_type == "cuda" and parallel.gpus else parallel.world_size


@dataclass(frozen=True)
class Relation:
    """A figure a record states and the formula the trainer computed it by (scalerepro.training.
    measurements): the two agree within AGREEMENT, or the record is no evidence. ``expected`` is
    None where the formula's inputs are not all in the record (not checked then)."""

    stated: str
    formula: str
    value: Callable[[RunRecord, Measurements], float | int | None]
    expected: Callable[[RunRecord, Measurements], float | None]


RELATIONS: tuple[Relation, ...] = (
    Relation("samples_per_s", "measured_samples / window_s", lambda r, m: m.samples_per_s, lambda r, m: _quotient(m.measured_samples, m.window_s)),
    Relation(
        "measured_samples",
        "measured_steps x batch.global_batch",
        lambda r, m: m.measured_samples,
        lambda r, m: _product(m.measured_steps, r.batch.global_batch),
    ),
    Relation(
        "tokens_per_s",
        "samples_per_s x model.tokens_per_sample",
        lambda r, m: m.tokens_per_s,
        lambda r, m: _product(m.samples_per_s, r.model.tokens_per_sample) or None,
    ),
    Relation(
        "epoch_time_s",
        "steps.per_epoch x step_time_s.median",
        lambda r, m: m.epoch_time_s,
        lambda r, m: _product(r.steps.per_epoch if r.steps else None, m.step_time_s.median),
    ),
    Relation("data_stall_fraction", "data_wait_s / window_s", lambda r, m: m.data_stall_fraction, lambda r, m: _quotient(m.data_wait_s, m.window_s)),
    Relation(
        "achieved_flops",
        "model.train_flops_per_sample x samples_per_s",
        lambda r, m: m.achieved_flops,
        lambda r, m: _product(r.model.train_flops_per_sample, m.samples_per_s),
    ),
    Relation(
        "mfu",
        "model.train_flops_per_sample x samples_per_s / (devices x peak.flops_per_s)",
        lambda r, m: m.mfu,
        lambda r, m: _quotient(_product(r.model.train_flops_per_sample, m.samples_per_s), devices(r), m.peak.flops_per_s if m.peak else None),
    ),
    Relation(
        "energy_per_sample_j",
        "nvml.energy_j / measured_samples",
        lambda r, m: m.energy_per_sample_j,
        lambda r, m: _quotient(m.nvml.energy_j, m.measured_samples),
    ),
    Relation(
        "energy_per_sample_net_j",
        "nvml.energy_net_j / measured_samples",
        lambda r, m: m.energy_per_sample_net_j,
        lambda r, m: _quotient(m.nvml.energy_net_j, m.measured_samples),
    ),
    Relation(
        "batch.samples_per_gpu_step",
        "batch.global_batch / parallel.world_size",
        lambda r, m: r.batch.samples_per_gpu_step,
        lambda r, m: _quotient(r.batch.global_batch, r.parallel.world_size),
    ),
)


@dataclass(frozen=True)
class Requirement:
    """A figure a record may state only with another: without it the trainer did not compute it."""

    stated: str
    needs: str
    has: Callable[[RunRecord, Measurements], tuple[object, object]]
    why: str


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("mfu", "peak", lambda r, m: (m.mfu, m.peak), "MFU is a fraction of the device's peak FLOP/s, and the record names none (a CPU has none)"),
    Requirement(
        "energy_per_sample_j",
        "nvml.energy_j",
        lambda r, m: (m.energy_per_sample_j, m.nvml.energy_j),
        "energy per sample is the window's GPU energy over its samples, and the record has no energy",
    ),
    Requirement(
        "tokens_per_s",
        "model.tokens_per_sample",
        lambda r, m: (m.tokens_per_s, r.model.tokens_per_sample),
        "tokens/s is samples/s x tokens per sample, and the record's model has no tokens",
    ),
)


@dataclass(frozen=True)
class Bound:
    """A condition of the measured window the record states, and the most of it a counted run may
    have had (ReFrame's reference as data: the figure, its bound, its unit). Above it the run did
    not have its machine to itself, as the plan asks (the local scheduler runs one measured job at
    a time, Slurm gives it exclusive nodes): its figures are another workload's as much as its
    own, so the run is not counted, whatever its other figures say. A record that does not state
    the figure (an older schema) is not judged by it. ``target``: the config's ``targets`` key
    that may set ``most`` for a study (``quiet``)."""

    figure: str
    target: str
    most: float
    unit: str
    value: Callable[[Measurements], float | None]
    what: str
    fix: str


QUIET: tuple[Bound, ...] = (
    Bound(
        "measurements.host_activity.other_cpu_fraction_max",
        "other_cpu_fraction_max",
        # half the node: beyond it other processes held more of the CPUs than any noise a quiet
        # node shows (a few percent: the OS and its daemons; the kept H100 records state at most
        # 1.1 %); lighter load shows as spread between repeats (the noisy flag)
        0.5,
        "of the node's CPUs",
        lambda m: m.host_activity.other_cpu_fraction_max if m.host_activity is not None else None,
        "other processes used",
        "rerun it on a quiet machine",
    ),
)


def quiet(targets: Mapping[str, Any]) -> tuple[Bound, ...]:
    """QUIET with each bound the config's ``targets`` sets (a study on a machine it knows it
    shares, such as the test suite's, may allow more), the rest as QUIET has them."""
    return tuple(replace(bound, most=float(targets.get(bound.target, bound.most))) for bound in QUIET)


def disturbances(record: RunRecord, bounds: Sequence[Bound] = QUIET) -> list[str]:
    """Why a record's window was not its machine's alone (``bounds``, by default QUIET), one
    reason each; empty: it was, or the record does not say."""
    m = record.measurements
    found = []
    for bound in bounds:
        value = bound.value(m) if m is not None else None
        if value is not None and value > bound.most:
            found.append(
                f"it did not have its machine to itself: {bound.what} {100 * value:.0f} % {bound.unit} during its measured window "
                f"({bound.figure} {value:.3g}, where a counted run has at most {bound.most:g}): {bound.fix}"
            )
    return found


def _when(value: str) -> datetime.datetime | None:
    try:
        stamp = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def _order_problems(record: RunRecord) -> list[str]:
    """Figures that bound each other: p10 <= median <= p90 of the step time, a run that ends after
    it starts and lasts at least its measured window, a window of measured steps longer than 0 s,
    a CUDA peak within the card's memory."""
    problems = []
    started, ended = _when(record.started_at), _when(record.ended_at)
    if started is None:
        problems.append(f"started_at {record.started_at!r} is no ISO 8601 time")
    if ended is None:
        problems.append(f"ended_at {record.ended_at!r} is no ISO 8601 time")
    m = record.measurements
    if m is not None:
        p10, median, p90 = m.step_time_s.p10, m.step_time_s.median, m.step_time_s.p90
        if p10 is not None and median is not None and p10 > median * (1 + AGREEMENT):
            problems.append(f"step_time_s.p10 {p10:.6g} is above its median {median:.6g}")
        if median is not None and p90 is not None and median > p90 * (1 + AGREEMENT):
            problems.append(f"step_time_s.median {median:.6g} is above its p90 {p90:.6g}")
        if m.measured_steps and not m.window_s:
            problems.append(f"its {m.measured_steps} measured steps took a window of {m.window_s} s")
    if started and ended:
        lasted = (ended - started).total_seconds()
        if lasted < 0:
            problems.append(f"ended_at {record.ended_at} is before started_at {record.started_at}")
        elif m is not None and m.window_s > lasted + 1.0:  # one second for the two clocks' resolution
            problems.append(f"the measured window ({m.window_s:.1f} s) is longer than the run ({lasted:.1f} s from started_at to ended_at)")
    card = record.hardware.gpu.memory_bytes
    if card and m is not None and record.parallel.device_type == "cuda":
        for key, peak in (("allocated_bytes_max", m.memory.allocated_bytes_max), ("reserved_bytes_max", m.memory.reserved_bytes_max)):
            if peak is not None and peak > card:
                problems.append(f"memory.{key} {peak / 2**30:,.1f} GiB is more than the card holds ({card / 2**30:,.1f} GiB)")
    return problems


def problems(record: RunRecord) -> list[str]:
    """Why a record's figures do not agree with each other (empty: they do): each figure is what
    its formula gives from the record's other figures (RELATIONS), a figure stands with what it
    needs (REQUIREMENTS), and the figures that bound each other do."""
    found = []
    m = record.measurements
    if m is not None:
        for relation in RELATIONS:
            stated, expected = relation.value(record, m), relation.expected(record, m)
            if stated is not None and expected is not None and not math.isclose(stated, expected, rel_tol=AGREEMENT, abs_tol=1e-12):
                found.append(f"{relation.stated} is {stated:.6g} where {relation.formula} gives {expected:.6g}")
        for requirement in REQUIREMENTS:
            figure, needed = requirement.has(record, m)
            if figure is not None and not needed:
                found.append(f"{requirement.stated} is stated without {requirement.needs}: {requirement.why}")
    return found + _order_problems(record)
