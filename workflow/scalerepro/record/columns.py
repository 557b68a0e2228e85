"""The runs table's columns of a record, as the model declares them: each field marked ``Column``
is one, read where the model has it; a few are derived from several fields (below, each with its
formula). Every figure's bound is its field's, checked by one function (``bound_problem``) for a
record being read and for a row the store is given.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union, cast

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from scalerepro.common.cuda_graphs import replays_cuda_graphs
from scalerepro.record import peak
from scalerepro.record.base import Column
from scalerepro.record.model import RunRecord


@dataclass(frozen=True)
class Leaf:
    """A field of the model: where it is, what it is, and the column it is (None: not a column)."""

    path: tuple[str, ...]
    info: FieldInfo
    column: Column | None
    whole: bool  # an integer field
    limits: tuple[Any, ...]  # its bounds (annotated_types' Gt, Ge, Le), wherever the annotation declares them

    @property
    def name(self) -> str:
        """As a message names it: its path in the record, less the ``measurements`` every figure is under."""
        return ".".join(self.path[1:] if self.path[0] == "measurements" else self.path)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not such a figure, or None (None itself is "not measured": allowed)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r}, not a number"
        if self.whole and not isinstance(value, int):
            return f"{value!r}, not a whole number"
        if not math.isfinite(value):
            return f"{value!r}, not a finite number"
        unit = f" {self.column.unit}" if self.column is not None and self.column.unit else ""
        for limit in self.limits:
            # the model's bounds are numbers (annotated_types types them as anything comparable)
            if isinstance(limit, annotated_types.Gt) and not value > (bound := cast(float, limit.gt)):
                return f"{value!r}, where a measured one is above {bound:g}{unit}"
            if isinstance(limit, annotated_types.Ge) and not value >= (bound := cast(float, limit.ge)):
                return f"{value!r}, where a measured one is at least {bound:g}{unit}"
            if isinstance(limit, annotated_types.Le) and not value <= (bound := cast(float, limit.le)):
                return f"{value!r}, where a measured one is at most {bound:g}{unit}"
        return None


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The model classes an annotation holds (X, X | None, Annotated[X | None, ...])."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _models(arg)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _whole(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return _whole(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return any(_whole(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    return annotation is int


def _limits(annotation: Any) -> list[Any]:
    """The bounds an annotation declares inside it (on a union's members, in nested Annotated)."""
    found: list[Any] = []
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *extras = typing.get_args(annotation)
        for extra in extras:
            found += [extra] if isinstance(extra, annotated_types.BaseMetadata) else list(getattr(extra, "metadata", []))
        return found + _limits(inner)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [limit for arg in typing.get_args(annotation) for limit in _limits(arg)]
    return found


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[Leaf]:
    for name, info in model.model_fields.items():
        inner = _models(info.annotation)
        if inner:
            yield from _leaves(inner[0], (*prefix, name))
            continue
        column = next((item for item in info.metadata if isinstance(item, Column)), None)
        limits = [item for item in info.metadata if isinstance(item, annotated_types.BaseMetadata)] + _limits(info.annotation)
        yield Leaf((*prefix, name), info, column, _whole(info.annotation), tuple(limits))


# Every scalar field of the record (a list's items are not walked), and the columns among them.
LEAVES: dict[tuple[str, ...], Leaf] = {leaf.path: leaf for leaf in _leaves(RunRecord)}
FIELD_COLUMNS: dict[str, Leaf] = {leaf.column.name: leaf for leaf in LEAVES.values() if leaf.column is not None}
# The measured figures a table publishes: a record with one outside its bound is no measurement,
# and none of them reaches a table.
FIGURES: dict[str, Leaf] = {name: leaf for name, leaf in FIELD_COLUMNS.items() if leaf.path[0] == "measurements" and (leaf.limits or leaf.whole)}


def leaf_at(location: Sequence[str | int]) -> Leaf | None:
    """The field at a validation error's location (list indices skipped), or None."""
    for end in range(len(location), 0, -1):
        path = tuple(str(part) for part in location[:end] if not isinstance(part, int))
        if path in LEAVES:
            return LEAVES[path]
    return None


def value_at(record: BaseModel, path: tuple[str, ...]) -> Any:
    value: Any = record
    for name in path:
        value = getattr(value, name, None)
        if value is None:
            return None
    return value


# --- the columns derived from several fields ----------------------------------------------------

# runs.csv column -> the kind of measurements.memory_split.per_rank it is the largest over the ranks of
MEMORY_SPLIT = {
    "params_bytes_per_rank": "parameters",
    "grads_bytes_per_rank": "gradients",
    "optimizer_bytes_per_rank": "optimizer_state",
    "activations_bytes_per_rank": "activations",
}
DERIVED = (
    "torch_version",
    "peak_flops_source",
    "peak_rate",
    "peak_part",
    "peak_memory_bytes",
    "peak_memory_kind",
    "final_train_loss",
    "loss_spike",
    "preset_overrides",
    "final_eval_loss",
    "final_eval_accuracy",
    "device_name",
    "mesh",
    "comm_bytes_per_step",
    "comm_by_collective",
    *MEMORY_SPLIT,
    "hostname",
    "purpose_recorded",
    "clock_event_reasons",
    "power_w",
    "power_basis",
)
# Columns of a field whose value the row derives again from several fields (``derived``): the
# field keeps its bound, the table holds the derived figure.
REDERIVED = ("energy_per_sample_j", "energy_per_sample_net_j")
assert set(REDERIVED) <= set(FIELD_COLUMNS)
RECORD_ROW = (*FIELD_COLUMNS, *DERIVED)


def _reason_shares(reasons: dict[str, float] | None) -> str | None:
    """nvml.clock_event_reasons (reason -> share of the window's samples it was active in) as
    text, most frequent first: "sw_power_cap 92 %, ..."; "none" where NVML read them and none was
    active; None where not read."""
    if reasons is None:
        return None
    shares = sorted(reasons.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {100 * share:.0f} %" for name, share in shares) or "none"


def window_power(record: RunRecord) -> tuple[float | None, str | None]:
    """The GPUs' mean power over the NVML window (sum over GPUs) and what it is: the energy
    counter's delta / the window's seconds where the counter was read; else the mean of the power
    samples, which on Hopper and later are 1 s moving averages and read low over a window of a
    few seconds (an H100's ResNet-18: 609 W sampled, 680 W from the counter)."""
    nvml = record.measurements.nvml if record.measurements is not None else None
    if nvml is None:
        return None, None
    if nvml.energy_method == "total_energy_counter" and nvml.energy_j is not None and nvml.window_s:
        return nvml.energy_j / nvml.window_s, "energy counter"
    if nvml.power_mean_w is not None:
        return nvml.power_mean_w, "power samples (no energy counter read)"
    return None, None


def energy_per_sample(record: RunRecord) -> dict[str, float | None]:
    """Energy per sample, gross and net of the power before step 1 (REDERIVED), each the energy
    and the samples of one window: the mean power over the NVML window x the measured window's
    seconds / its samples. The NVML window opens before the first measured step and closes after
    the last one's log point, so its energy over the steps' samples reads a few % high."""
    m = record.measurements
    power, _ = window_power(record)
    if m is None or power is None or m.nvml.energy_j is None or not m.measured_samples:
        return {"energy_per_sample_j": None, "energy_per_sample_net_j": None}
    before = m.nvml.idle_power_w
    return {
        "energy_per_sample_j": power * m.window_s / m.measured_samples,
        "energy_per_sample_net_j": (power - before) * m.window_s / m.measured_samples if before is not None else None,
    }


# A logged training loss is a spike where it is more than LOSS_SPIKE_FACTOR times a reference: the
# first logged loss against the loss of a uniform guess over the classes or the vocabulary (ln C:
# a fresh model starts near it, 2.3 for 10 classes), each later one against the median of the
# losses logged before it. A spike is no failure, but the throughput beside it came from a run
# that did not train as its model should (ResNet-18 at 21.6 for 10 classes, then 2.0).
LOSS_SPIKE_FACTOR = 2.0


def loss_spike(record: RunRecord) -> str | None:
    """The run's largest logged loss spike (LOSS_SPIKE_FACTOR), in words, or None."""
    shape = record.model.shape
    classes = (shape.num_classes or shape.vocab_size) if shape is not None else None
    losses = [(entry.step, entry.loss) for entry in record.loss_log if math.isfinite(entry.loss)]
    spikes = []
    if losses and classes and classes > 1 and losses[0][1] > LOSS_SPIKE_FACTOR * math.log(classes):
        step, loss = losses[0]
        spikes.append(
            (loss / math.log(classes), f"{loss:.3g} at step {step}, {loss / math.log(classes):.1f}x ln {classes} = {math.log(classes):.2f} (a uniform guess)")
        )
    for index in range(1, len(losses)):
        step, loss = losses[index]
        median = sorted(value for _, value in losses[:index])[(index - 1) // 2]
        if median > 0 and loss > LOSS_SPIKE_FACTOR * median:
            spikes.append((loss / median, f"{loss:.3g} at step {step}, {loss / median:.1f}x the median {median:.3g} of the losses logged before it"))
    return max(spikes)[1] if spikes else None


def derived(record: RunRecord) -> dict[str, Any]:
    """The DERIVED and REDERIVED columns of a record."""
    m = record.measurements
    memory = m.memory if m is not None else None
    allocated, kind = (memory.allocated_bytes_max, "cuda_allocated") if memory is not None else (None, None)
    if memory is not None and replays_cuda_graphs(record.parallel.device_type, record.knobs.compile) and memory.reserved_bytes_max is not None:
        # A CUDA graph's replay allocates nothing through the caching allocator: its activations
        # live in the graph's private pool, which the window's "allocated" peak never sees
        # (ResNet-50 on an H100: 0.56 GiB allocated, 12.7 GiB reserved). The reserved peak holds
        # the pools; it bounds the step's memory from above (cached free blocks count too).
        allocated, kind = memory.reserved_bytes_max, "cuda_reserved"
    rss = memory.rss_bytes_max if memory is not None else None
    last = record.history[-1] if record.history else None
    sharding = m.sharding if m is not None else None
    mesh = sharding.mesh if sharding is not None else None
    # the analytic bytes a rank sends per optimizer step, by collective (all_gather/reduce_scatter
    # under fsdp, tp_* and dp_* under tp and fsdp+tp, send_* under pp)
    volume = (sharding.comm_bytes_per_step_analytic or {}) if sharding is not None else {}
    ranks = m.memory_split.per_rank if m is not None and m.memory_split is not None else []
    split = {column: [getattr(rank, kind) for rank in ranks if getattr(rank, kind) is not None] for column, kind in MEMORY_SPLIT.items()}
    shape, dims = ("x".join(map(str, mesh.shape)), ", ".join(mesh.dims)) if mesh is not None else ("", "")
    return {
        "torch_version": record.versions.get("torch"),
        # what MFU is against, or why there is none
        "peak_flops_source": (m.peak.source if m.peak is not None else m.peak_reason) if m is not None else None,
        # the peak named: "989 TFLOP/s dense bf16" of "H100 SXM5" (scalerepro.record.peak)
        "peak_rate": peak.rate_words(m.peak) if m is not None and m.peak is not None else None,
        "peak_part": peak.part_words(m.peak) if m is not None and m.peak is not None else None,
        "peak_memory_bytes": rss if allocated is None else allocated,
        "peak_memory_kind": kind if allocated is not None else "rss" if rss is not None else None,
        # the last logged loss, the mean of the steps since the log point before it (--log-interval):
        # the epoch's mean would carry its first steps' loss into the end of the run
        "final_train_loss": record.loss_log[-1].loss if record.loss_log else None,
        "loss_spike": loss_spike(record),
        # the levers where the run departs from its preset: a lever's run, not its preset's
        "preset_overrides": ", ".join(f"{name}={value}" for name, value in sorted(record.knobs.preset_overrides.items())) or None,
        "final_eval_loss": last.eval_loss if last else None,
        "final_eval_accuracy": last.eval_accuracy if last else None,
        "device_name": record.hardware.gpu.name or record.hardware.cpu_model,
        "mesh": f"{shape} ({dims})" if dims else shape or None,
        # communication per step = the sum over the collectives of the bytes each rank sends
        "comm_bytes_per_step": float(sum(volume.values())) if volume else None,
        "comm_by_collective": "; ".join(f"{k} {v:,.0f} B" for k, v in volume.items()) or None,
        # each kind the largest over the ranks: the rank that sets a GPU's memory need
        **{column: max(found) if found else None for column, found in split.items()},
        "hostname": record.hardware.hostname or ", ".join(record.parallel.hostnames) or None,
        "purpose_recorded": record.purpose,
        "clock_event_reasons": _reason_shares(m.nvml.clock_event_reasons) if m is not None else None,
        **dict(zip(("power_w", "power_basis"), window_power(record))),
        **energy_per_sample(record),
    }


def row(record: RunRecord) -> dict[str, Any]:
    """Every column a record gives (RECORD_ROW), the REDERIVED ones derived."""
    return {**{name: value_at(record, leaf.path) for name, leaf in FIELD_COLUMNS.items()}, **derived(record)}
