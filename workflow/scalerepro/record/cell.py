"""A cell: the configuration and purpose that the repeats of one measurement share.

One definition, read off a record (``Cell.of``) or written by the study's plan for each run it
plans (``scalerepro.planning.study``: the fields the plan sets, the others None). The analysis
holds a completed run to its plan on the fields the plan sets (``departures``), holds the repeats
of a planned cell to one configuration (``differences``), and groups records no study planned by
their cells (``rebuild --records``). A run's figures are comparable with another's only within a
cell; every table's cell is a view of this one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import Field

from scalerepro.record.base import CompileMode, Part, Precision, Purpose, Strategy
from scalerepro.record.model import RunRecord

# matrix column -> the cell field it plans, in the order a departure is named
PLANNED_BY_COLUMN = {
    "gpus": "world_size",
    "nodes": "nodes",
    "per_gpu_batch": "micro_batch",
    "grad_accum_steps": "grad_accum_steps",
    "global_batch": "global_batch",
    "precision": "precision",
    "bucket_cap_mb": "bucket_cap_mb",
    "parallel": "strategy",
    "device": "device_type",
    "data": "data",
    "purpose": "purpose",
}
PLANNED = tuple(PLANNED_BY_COLUMN.values())  # the fields a study's plan sets for each run


class Cell(Part):
    """Every setting that changes a run's figures, and what the run was for. None: not stated (a
    record that failed before it knew, or a plan that does not set it)."""

    model: str | None = Field(None, title="model")
    world_size: int | None = Field(None, title="world size")
    nodes: int | None = Field(None, title="node count")
    micro_batch: int | None = Field(None, title="per-GPU batch")
    grad_accum_steps: int | None = Field(None, title="accumulation steps")
    global_batch: int | None = Field(None, title="global batch")
    precision: Precision | None = Field(None, title="precision")
    bucket_cap_mb: float | None = Field(None, title="DDP bucket cap")
    strategy: Strategy | None = Field(None, title="strategy")
    device_type: str | None = Field(None, title="device")
    data: str | None = Field(None, title="data")
    purpose: Purpose | None = Field(None, title="purpose")
    # what the record states beside its plan
    device_name: str | None = Field(None, title="device")
    image_size: int | None = Field(None, title="image size")
    seq_len: int | None = Field(None, title="sequence length")
    compile: CompileMode | None = Field(None, title="compile mode")
    channels_last: bool | None = Field(None, title="memory format (channels_last)")
    loader: str | None = Field(None, title="loader")
    optimizer_impl: str | None = Field(None, title="optimizer implementation")
    cudnn_benchmark: bool | None = Field(None, title="cuDNN benchmark")
    compile_scope: str | None = Field(None, title="compile scope")
    attention_backend: str | None = Field(None, title="attention kernel")
    stem_channels: int | None = Field(None, title="ResNet stem channels")

    @classmethod
    def of(cls, record: RunRecord) -> Cell:
        """The cell a record ran in, as it states it."""
        knobs, parallel, shape = record.knobs, record.parallel, record.model.shape
        return cls(
            model=record.model.name,
            world_size=parallel.world_size,
            nodes=parallel.nodes,
            micro_batch=record.batch.micro_batch,
            grad_accum_steps=record.batch.grad_accum_steps,
            global_batch=record.batch.global_batch,
            precision=record.precision.name,
            bucket_cap_mb=knobs.bucket_cap_mb,
            strategy=parallel.strategy,
            device_type=parallel.device_type,
            data=record.data.kind if record.data is not None else None,
            purpose=record.purpose,
            device_name=record.hardware.gpu.name or record.hardware.cpu_model,
            image_size=shape.image_size if shape is not None else None,
            seq_len=shape.seq_len if shape is not None else None,
            compile=knobs.compile,
            channels_last=knobs.channels_last,
            loader=knobs.loader,
            optimizer_impl=knobs.optimizer_impl,
            cudnn_benchmark=knobs.cudnn_benchmark,
            compile_scope=knobs.compile_scope,
            attention_backend=knobs.attention_backend,
            stem_channels=knobs.stem_channels,
        )

    @classmethod
    def planned(cls, row: dict[str, Any]) -> Cell:
        """The cell a study matrix's row plans: the fields of its PLANNED_BY_COLUMN it sets (an older
        matrix leaves some unset: empty, or NaN)."""
        values = {field: row[column] for column, field in PLANNED_BY_COLUMN.items() if column in row and _set(row[column])}
        for field in ("world_size", "nodes", "micro_batch", "grad_accum_steps", "global_batch"):
            if field in values:
                values[field] = int(values[field])
        if "bucket_cap_mb" in values:
            values["bucket_cap_mb"] = float(values["bucket_cap_mb"])
        return cls.model_validate(values, strict=False)

    def key(self) -> tuple[Any, ...]:
        """The cell as one hashable value: runs are repeats of one cell where their keys are equal."""
        return tuple(getattr(self, name) for name in type(self).model_fields)


def _set(value: Any) -> bool:
    return value is not None and value != "" and not (isinstance(value, float) and math.isnan(value))


def _shown(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    return f"{value:g}"


def departures(record: Cell, plan: Cell) -> list[str]:
    """Where a completed run's cell departs from its plan, field by field over the fields the
    plan sets (PLANNED); a field the record does not state is a departure too."""
    problems = []
    for name in PLANNED:
        planned, ran = getattr(plan, name), getattr(record, name)
        if planned is None:
            continue
        title = Cell.model_fields[name].title
        if ran is None:
            problems.append(f"its record states no {title} (the plan's is {_shown(planned)})")
        elif ran != planned:
            problems.append(f"{title} {_shown(ran)}, where the plan's is {_shown(planned)}")
    return problems


# What the repeats of a planned cell must agree on beside the plan: the record's own conditions.
RUN_CONDITIONS = (
    "device_name",
    "data",
    "image_size",
    "seq_len",
    "compile",
    "channels_last",
    "loader",
    "optimizer_impl",
    "cudnn_benchmark",
    "compile_scope",
    "attention_backend",
    "stem_channels",
)


def differences(cells: Sequence[Cell], fields: Iterable[str] = RUN_CONDITIONS) -> list[str]:
    """The fields on which ``cells`` (the completed repeats of one planned cell) differ, each
    with its values: "device (A, B)"; a field stated by some and not others differs too."""
    found = []
    for name in fields:
        values = [getattr(cell, name) for cell in cells]
        stated = sorted({str(value) for value in values if value is not None})
        unstated = any(value is None for value in values)
        if len(stated) > 1 or (stated and unstated):
            found.append(f"{Cell.model_fields[name].title} ({', '.join(stated + (['not stated'] if unstated else []))})")
    return found
