"""What a run record must be to count as evidence: bounded, readable, the run its plan names, and
every measured figure a finite number on the right side of zero.

The rank writes a record; the analysis reads it (``tables.readers``, the scaling model's profile,
``predict --record``, ``rebuild --records``). A record is a claim, not a figure to publish: a file
that is too large or nested too deep to be a record, a record of another run (copied over, or a
matrix pointing at the wrong path), or a figure that is negative, infinite, NaN or text is refused
here, named, and counted as a hole (the run is missing or failed, never an ok run with a number).

The bounds are data (``FIGURE_BOUNDS``: one line per figure, its range and unit), checked by one
function, the way ``history.study_rows.check_rows`` checks what the store takes.

On the analysis side: no torch.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerepro.common.cli import CommandError

# A record is tens to hundreds of KiB (its loss log grows with the steps: 100,000 logged steps are
# ~10 MiB); 64 MiB is no record, and reading it whole is what a bound is for.
MAX_RECORD_BYTES = 64 << 20


class EvidenceError(CommandError, ValueError):
    """A file that is not a run record, or a record that is not evidence; one line naming it."""


def read_json_document(path: str | os.PathLike[str], what: str = "run record", max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``, read within bounds: at most ``max_bytes``, nested no deeper than
    Python's parser allows (a RecursionError is an EvidenceError here), UTF-8, an object at the top.
    FileNotFoundError passes through (a missing record is a hole of its own kind)."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise EvidenceError(f"{what} {path} is {size / 2**20:.0f} MiB, larger than any {what} ({max_bytes >> 20} MiB): not read")
    try:
        document = json.loads(path.read_bytes())
    except RecursionError:
        raise EvidenceError(f"{what} {path} is nested deeper than any {what}: not read") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise EvidenceError(f"{what} {path} is not JSON ({str(error).splitlines()[0][:120]})") from None
    if not isinstance(document, dict):
        raise EvidenceError(f"{what} {path} holds a JSON {type(document).__name__}, not an object")
    return document


@dataclass(frozen=True)
class Bound:
    """A measured figure's range: above ``low`` (or at it, ``low_inclusive``), at most ``high``."""

    low: float = 0.0
    low_inclusive: bool = True
    high: float = math.inf
    unit: str = ""
    integer: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not such a figure, or None (None itself is "not measured": allowed)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r}, not a number"
        if self.integer and not isinstance(value, int):
            return f"{value!r}, not a whole number"
        if not math.isfinite(value):
            return f"{value!r}, not a finite number"
        if value < self.low or (value == self.low and not self.low_inclusive):
            side = "at least" if self.low_inclusive else "above"
            return f"{value!r}, where a measured one is {side} {self.low:g}{' ' + self.unit if self.unit else ''}"
        if value > self.high:
            return f"{value!r}, where a measured one is at most {self.high:g}{' ' + self.unit if self.unit else ''}"
        return None


POSITIVE = Bound(0.0, low_inclusive=False)
UNIT_INTERVAL = Bound(0.0, high=1.0)
# runs.csv column -> the range of the figure a record gives it (tables.readers reads them; a record
# with one out of range is no evidence: the run is refused, not published)
FIGURE_BOUNDS: dict[str, Bound] = {
    "samples_per_s": Bound(0.0, False, unit="samples/s"),
    "tokens_per_s": Bound(0.0, False, unit="tokens/s"),
    "step_time_median_s": Bound(0.0, False, unit="s"),
    "step_time_p10_s": Bound(0.0, False, unit="s"),
    "step_time_p90_s": Bound(0.0, False, unit="s"),
    "epoch_time_s": Bound(0.0, False, unit="s"),
    "window_s": Bound(0.0, False, unit="s"),
    "measured_steps": Bound(0.0, integer=True),
    "mfu": UNIT_INTERVAL,
    "exposed_comm_fraction": UNIT_INTERVAL,
    "data_stall_fraction": UNIT_INTERVAL,
    "data_wait_s": Bound(unit="s"),
    "sync_step_s": Bound(0.0, False, unit="s"),
    "nosync_step_s": Bound(0.0, False, unit="s"),
    "nosync_rank_mean_s": Bound(0.0, False, unit="s"),
    "straggler_wait_s": Bound(unit="s"),
    "sync_compute_rank_mean_s": Bound(0.0, False, unit="s"),
    "window_compute_rank_mean_s": Bound(0.0, False, unit="s"),
    "window_exposed_wait_s": Bound(unit="s"),
    "window_straggler_wait_s": Bound(unit="s"),
    "window_data_wait_rank_mean_s": Bound(unit="s"),
    "gpu_util_mean_pct": Bound(high=100.0, unit="%"),
    "power_mean_w": Bound(unit="W"),
    "energy_j": Bound(unit="J"),
    "energy_per_sample_j": Bound(unit="J"),
    "energy_per_sample_net_j": Bound(low=-math.inf, unit="J"),  # net of idle power: below 0 is noise, not nonsense
    "idle_power_w": Bound(unit="W"),
}


def figure_problems(fields: Mapping[str, Any], bounds: Mapping[str, Bound] = FIGURE_BOUNDS) -> list[str]:
    """ "<column> is <why>" for every figure of ``fields`` outside its bound."""
    return [f"{name} is {why}" for name, bound in bounds.items() if name in fields and (why := bound.problem(fields[name]))]


# --------------------------------------------------------------------------------------------
# A record's figures against each other
# --------------------------------------------------------------------------------------------

# The newest record schema this code reads (the trainer's RECORD_SCHEMA_VERSION; tests hold the
# two equal). A record of a newer schema may hold a figure under a name, or with a meaning, that
# this code reads as something else: it is refused, not read.
NEWEST_RECORD_SCHEMA = 4
# Two figures "agree" when they differ by less than this, relatively: a record holds doubles
# computed from each other, so anything wider than rounding is an edited or mixed-up record.
AGREEMENT = 1e-3


def dig(document: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a record (nested objects), or None where any step is absent."""
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _product(*values: Any) -> float | None:
    numbers = [_number(v) for v in values]
    return None if None in numbers else math.prod(numbers)  # type: ignore[arg-type]


def _quotient(numerator: Any, *denominators: Any) -> float | None:
    top, bottom = _number(numerator), _product(*denominators)
    return None if top is None or not bottom else top / bottom


@dataclass(frozen=True)
class Relation:
    """A figure a record states and the formula the trainer computed it by from the record's other
    figures (scalerepro.training.measurements): the two agree within AGREEMENT, or the record is
    no evidence. ``expected`` is None where the formula's inputs are not all in the record (an older
    record: the relation is then not checked)."""

    stated: tuple[str, ...]
    formula: str
    expected: Callable[[Mapping[str, Any]], float | None]


def _m(*path: str) -> tuple[str, ...]:
    return ("measurements", *path)


RELATIONS: tuple[Relation, ...] = (
    Relation(_m("samples_per_s"), "measured_samples / window_s", lambda r: _quotient(dig(r, _m("measured_samples")), dig(r, _m("window_s")))),
    Relation(_m("measured_samples"), "measured_steps x batch.global", lambda r: _product(dig(r, _m("measured_steps")), dig(r, ("batch", "global")))),
    Relation(
        _m("tokens_per_s"),
        "samples_per_s x model.tokens_per_sample",
        lambda r: _product(dig(r, _m("samples_per_s")), dig(r, ("model", "tokens_per_sample"))) or None,
    ),
    Relation(
        _m("epoch_time_s"), "steps.per_epoch x step_time_s.median", lambda r: _product(dig(r, ("steps", "per_epoch")), dig(r, _m("step_time_s", "median")))
    ),
    Relation(_m("data_stall_fraction"), "data_wait_s / window_s", lambda r: _quotient(dig(r, _m("data_wait_s")), dig(r, _m("window_s")))),
    Relation(
        _m("achieved_flops"),
        "model.train_flops_per_sample x samples_per_s",
        lambda r: _product(dig(r, ("model", "train_flops_per_sample")), dig(r, _m("samples_per_s"))),
    ),
    Relation(
        _m("mfu"),
        "model.train_flops_per_sample x samples_per_s / (parallel.world_size x peak_flops_per_device)",
        lambda r: _quotient(
            _product(dig(r, ("model", "train_flops_per_sample")), dig(r, _m("samples_per_s"))),
            dig(r, ("parallel", "world_size")),
            dig(r, _m("peak_flops_per_device")),
        ),
    ),
    Relation(
        _m("energy_per_sample_j"), "nvml.energy_j / measured_samples", lambda r: _quotient(dig(r, _m("nvml", "energy_j")), dig(r, _m("measured_samples")))
    ),
    Relation(
        _m("energy_per_sample_net_j"),
        "nvml.energy_net_j / measured_samples",
        lambda r: _quotient(dig(r, _m("nvml", "energy_net_j")), dig(r, _m("measured_samples"))),
    ),
)


@dataclass(frozen=True)
class Requirement:
    """A figure that a record may state only with another: without it the figure was not computed
    by the trainer (an MFU without the peak it is a fraction of)."""

    stated: tuple[str, ...]
    needs: tuple[str, ...]
    why: str


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(_m("mfu"), _m("peak_flops_per_device"), "MFU is a fraction of the device's peak FLOP/s, and the record names none (a CPU has none)"),
    Requirement(
        _m("energy_per_sample_j"), _m("nvml", "energy_j"), "energy per sample is the window's GPU energy over its samples, and the record has no energy"
    ),
    Requirement(_m("tokens_per_s"), ("model", "tokens_per_sample"), "tokens/s is samples/s x tokens per sample, and the record's model has no tokens"),
)


def _when(value: Any) -> datetime.datetime | None:
    try:
        stamp = datetime.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return stamp if stamp is None or stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def _order_problems(record: Mapping[str, Any]) -> list[str]:
    """Figures that bound each other: p10 <= median <= p90 of the step time, a run that ends after
    it starts and lasts at least its measured window, a CUDA peak within the card's memory."""
    problems = []
    steps = dig(record, _m("step_time_s")) or {}
    p10, median, p90 = (_number(steps.get(k)) if isinstance(steps, dict) else None for k in ("p10", "median", "p90"))
    if None not in (p10, median) and p10 > median * (1 + AGREEMENT):  # type: ignore[operator]
        problems.append(f"step_time_s.p10 {p10:.6g} is above its median {median:.6g}")
    if None not in (median, p90) and median > p90 * (1 + AGREEMENT):  # type: ignore[operator]
        problems.append(f"step_time_s.median {median:.6g} is above its p90 {p90:.6g}")
    started, ended = _when(record.get("started_at")), _when(record.get("ended_at"))
    if record.get("started_at") is not None and started is None:
        problems.append(f"started_at {record.get('started_at')!r} is no ISO 8601 time")
    if record.get("ended_at") is not None and ended is None:
        problems.append(f"ended_at {record.get('ended_at')!r} is no ISO 8601 time")
    if started and ended:
        lasted = (ended - started).total_seconds()
        window = _number(dig(record, _m("window_s")))
        if lasted < 0:
            problems.append(f"ended_at {record['ended_at']} is before started_at {record['started_at']}")
        elif window is not None and window > lasted + 1.0:  # one second for the two clocks' resolution
            problems.append(f"the measured window ({window:.1f} s) is longer than the run ({lasted:.1f} s from started_at to ended_at)")
    card = _number(dig(record, ("hardware", "gpu", "memory_bytes")))
    if card and dig(record, ("parallel", "device_type")) == "cuda":
        memory = dig(record, _m("memory")) or {}
        for key in ("allocated_bytes_max", "reserved_bytes_max"):
            peak = _number(memory.get(key)) if isinstance(memory, dict) else None
            if peak is not None and peak > card:
                problems.append(f"memory.{key} {peak / 2**30:,.1f} GiB is more than the card holds ({card / 2**30:,.1f} GiB)")
    return problems


def _name(path: tuple[str, ...]) -> str:
    """A record field as a message names it: its path, less the ``measurements`` every figure is under."""
    return ".".join(path[1:] if path[0] == "measurements" else path)


def record_problems(record: Mapping[str, Any]) -> list[str]:
    """Why a record's figures do not agree with each other (empty: they do). A record is evidence
    only when each figure is what the formula that made it gives from the record's other figures
    (RELATIONS), a figure stands with what it needs (REQUIREMENTS), and the figures that bound each
    other do (_order_problems)."""
    problems = []
    for relation in RELATIONS:
        stated, expected = _number(dig(record, relation.stated)), relation.expected(record)
        if stated is not None and expected is not None and not math.isclose(stated, expected, rel_tol=AGREEMENT, abs_tol=1e-12):
            problems.append(f"{_name(relation.stated)} is {stated:.6g} where {relation.formula} gives {expected:.6g}")
    for requirement in REQUIREMENTS:
        if dig(record, requirement.stated) is not None and not dig(record, requirement.needs):
            problems.append(f"{_name(requirement.stated)} is stated without {_name(requirement.needs)}: {requirement.why}")
    return problems + _order_problems(record)


def schema_problem(record: Mapping[str, Any]) -> str | None:
    """Why this code cannot read the record's schema (a newer one, or none), or None."""
    version = record.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"schema_version {version!r} is no record schema version"
    if version > NEWEST_RECORD_SCHEMA:
        return (
            f"it is of record schema {version}, newer than this scalerepro reads ({NEWEST_RECORD_SCHEMA}): read it with the scalerepro that wrote it, or update"
        )
    return None


# --------------------------------------------------------------------------------------------
# A record against its plan
# --------------------------------------------------------------------------------------------

# matrix column -> (where the record states it, what it is called in a message): whose record it is
IDENTITY: dict[str, tuple[tuple[str, ...], str]] = {
    "run_id": (("run_id",), "run id"),
    "model": (("model", "name"), "model"),
}


def identity_problem(document: Mapping[str, Any], planned: Mapping[str, Any]) -> str | None:
    """Why the record is not the run its plan names (its run id or model differ, or it states
    none), or None. The rest of what the plan sets is compared by ``plan_problems``."""
    differs = []
    for column, (where, name) in IDENTITY.items():
        if column not in planned:
            continue
        value = dig(document, where)
        if value is None:
            differs.append(f"it states no {name}")
        elif str(value) != str(planned[column]):
            differs.append(f"{name} {value!r}, not {planned[column]!r}")
    return f"it is another run's record ({'; '.join(differs)})" if differs else None


def _strategy(document: Mapping[str, Any]) -> Any:
    """The --parallel strategy a record ran: measurements.sharding.strategy, ddp where the entry is
    there and null; None (not stated) where the record has no such entry."""
    measurements = document.get("measurements")
    if not isinstance(measurements, dict) or "sharding" not in measurements:
        return None
    sharding = measurements["sharding"]
    return sharding.get("strategy") if isinstance(sharding, dict) else "ddp"


@dataclass(frozen=True)
class PlannedKnob:
    """A value the study's plan sets for a run (its matrix column) and where the run's record
    states the value it ran with (the first of ``paths`` that is there: later ones are the names of
    older schemas). A completed run counts only where its record states every knob its plan sets,
    each equal to the plan's."""

    column: str
    name: str
    paths: tuple[tuple[str, ...], ...] = ()
    read: Callable[[Mapping[str, Any]], Any] | None = None
    number: bool = False

    def recorded(self, document: Mapping[str, Any]) -> Any:
        if self.read is not None:
            return self.read(document)
        return next((value for path in self.paths if (value := dig(document, path)) is not None), None)

    def problem(self, document: Mapping[str, Any], planned: Any) -> str | None:
        if planned is None or (isinstance(planned, float) and math.isnan(planned)) or planned == "":
            return None  # the plan does not set it (an older matrix)
        value = self.recorded(document)
        if value is None:
            return f"its record states no {self.name} (the plan's is {_shown(planned)})"
        same = (
            _number(value) is not None and _number_of(planned) is not None and _number(value) == _number_of(planned)
            if self.number
            else str(value) == str(planned)
        )
        return None if same else f"{self.name} {_shown(value)}, where the plan's is {_shown(planned)}"


def _number_of(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _shown(value: Any) -> str:
    number = _number_of(value) if not isinstance(value, str) or value.strip() else None
    return f"{number:g}" if number is not None and not isinstance(value, bool) else repr(value)


PLANNED_KNOBS: tuple[PlannedKnob, ...] = (
    PlannedKnob("gpus", "world size", (("parallel", "world_size"),), number=True),
    PlannedKnob("nodes", "node count", (("parallel", "nodes"),), number=True),
    PlannedKnob("per_gpu_batch", "per-GPU batch", (("batch", "per_gpu"), ("batch", "per_rank")), number=True),
    PlannedKnob("grad_accum_steps", "accumulation steps", (("batch", "grad_accum_steps"),), number=True),
    PlannedKnob("global_batch", "global batch", (("batch", "global"),), number=True),
    PlannedKnob("precision", "precision", (("precision",),)),
    PlannedKnob("bucket_cap_mb", "DDP bucket cap", (("knobs", "bucket_cap_mb"),), number=True),
    PlannedKnob("parallel", "strategy", read=_strategy),
    PlannedKnob("device", "device", (("parallel", "device_type"),)),
    PlannedKnob("data", "data", (("data", "kind"),)),
    PlannedKnob("purpose", "purpose", read=lambda document: record_purpose(document)[0]),
)


def plan_problems(document: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    """Where a completed run's record departs from its plan (``planned``: its matrix row), knob by
    knob (PLANNED_KNOBS); a knob the record does not state is a departure too."""
    return [problem for knob in PLANNED_KNOBS if knob.column in planned and (problem := knob.problem(document, planned[knob.column]))]


# --------------------------------------------------------------------------------------------
# What a run was for
# --------------------------------------------------------------------------------------------

PURPOSES = ("measurement", "smoke")


def _flag_value(command: list[str], flag: str) -> str | None:
    values = [command[i + 1] for i, word in enumerate(command[:-1]) if word == flag]
    values += [word.split("=", 1)[1] for word in command if word.startswith(flag + "=")]
    return values[-1] if values else None


def record_purpose(document: Mapping[str, Any]) -> tuple[str, str]:
    """What the run was for, and how that is known: a measurement of its configuration, or a smoke
    run (a check of a code path, whose figures are by-products). The record states it (``purpose``,
    from schema 4); an older record says it only through its command line, read by one rule:
    a smoke run asked for a process group or a profile at one rank (``--process-group-at-one-rank``,
    ``--profile-mode``), or ran the communication or bucket probes at one rank outside a study (no
    ``--run-id``: every study names its runs)."""
    stated = document.get("purpose")
    if stated is not None:
        return str(stated), "stated by the record"
    command = [str(word) for word in document.get("command_line") or [] if isinstance(word, (str, int, float))]
    if any(word in ("--process-group-at-one-rank", "--profile-mode") or word.startswith("--profile-mode=") for word in command):
        return "smoke", "from its command line (a process group or a profile at one rank)"
    probes = [_number_of(_flag_value(command, flag)) or 0 for flag in ("--comm-probe-steps", "--bucket-probe-steps")]
    one_rank = (dig(document, ("parallel", "world_size")) or 1) == 1
    if one_rank and any(probes) and _flag_value(command, "--run-id") is None:
        return "smoke", "from its command line (the probes at one rank, outside a study)"
    return "measurement", "from its command line (a record older than the purpose field)"


# --------------------------------------------------------------------------------------------
# Figures a record is known to hold wrongly
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownDefect:
    """A figure the trainer that wrote a record is known to have measured wrongly, fixed in a
    later record schema: such a figure is withheld (not shown as a measurement, not in a cell's
    median or largest value), with ``why``."""

    columns: tuple[str, ...]  # the runs.csv columns withheld
    applies: Callable[[Mapping[str, Any]], bool]
    why: str


def _schema(document: Mapping[str, Any]) -> int:
    version = document.get("schema_version")
    return version if isinstance(version, int) else 0


KNOWN_DEFECTS: tuple[KnownDefect, ...] = (
    KnownDefect(
        ("peak_memory_bytes", "activations_bytes_per_rank"),
        lambda document: _schema(document) < 3,
        "the peak of a schema-2 record may include the probes run after the measured window (the trainer reads the window's own peak from schema 3 on)",
    ),
    KnownDefect(
        ("data_stall_fraction", "data_wait_s", "window_data_wait_rank_mean_s"),
        lambda document: dig(document, ("parallel", "device_type")) == "cuda" and dig(document, ("measurements", "data_wait_clock")) is None,
        "on a GPU, a record that does not name the clock of its data wait (before schema 4) holds the host's wait in "
        "the fetch, which counts a host that runs ahead of the GPU and blocks there (no stall); the trainer reads it "
        "on the device clock from schema 4",
    ),
)


def withheld(document: Mapping[str, Any]) -> list[KnownDefect]:
    """The known defects of a record (KNOWN_DEFECTS) that apply to it."""
    return [defect for defect in KNOWN_DEFECTS if defect.applies(document)]
