"""What every part of the run record is made of: ``Part`` (a section, typed strictly), ``Column``
(a field that is a column of the runs table) and the value types the parts share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Column:
    """A field that is a column of the runs table (``results/tables/runs.csv``), and its unit."""

    name: str
    unit: str = ""


class Part(BaseModel):
    """A section of the record: typed strictly (no coercion: 5.0 is no whole number, "5" no
    number), no key it does not declare, NaN and infinity refused."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


# --- value types ------------------------------------------------------------------------------

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
PeakPrecision = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8"]
Units = Literal["tensor", "cuda_core"]
Strategy = Literal["ddp", "fsdp", "tp", "fsdp+tp", "pp"]
Purpose = Literal["measurement", "smoke"]
Status = Literal["ok", "failed", "preempted"]
CompileMode = Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
# the trainer's flags' vocabularies the record states (scalerepro.trainer_flags declares its flags with them)
Preset = Literal["baseline", "optimised"]
CompileScope = Literal["model", "blocks"]
AttentionBackend = Literal["auto", "flash", "efficient", "cudnn", "math"]
Loader = Literal["dataloader", "device"]
OptimizerImpl = Literal["foreach", "fused", "for-loop"]

Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Bytes = Annotated[int, Field(ge=0)]
