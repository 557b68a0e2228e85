"""The prescreen's record of one node (``NodeCheck``): what its devices do alone before the study
trusts them, written by the node's check (``scalerepro.training.node_check``) and judged against
its peers' by ``scalerepro.planning.node_screen``, whose outcome is the ``NodeScreen``. Every side
(the check, the rule, the report and the store) reads them through these models only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, ValidationError

from scalerepro.common.cli import CommandError
from scalerepro.common.files import read_json_object
from scalerepro.record.base import Fraction, Part, Positive, Precision, Seconds

NODE_CHECK_SCHEMA_VERSION: Final = 1

# The figures the prescreen's rule judges, by the names the screen gives them: each in words, and
# its unit (scalerepro.planning.node_screen reads each off a NodeCheck).
SCREEN_FIGURES = {
    "matmul_tflops": ("matmul", "TFLOP/s"),
    "memory_gbps": ("memory copy", "GB/s"),
    "allreduce_busbw_gbps": ("within-node all-reduce bus bandwidth", "GB/s"),
    "link_busbw_gbps": ("all-reduce bus bandwidth with the reference node", "GB/s"),
}


class DeviceState(Part):
    """The device as the last figure ended: a throttled clock or a hot card shows here. Null where
    the device does not report it (a CPU's power; a GPU without NVML), with the reason."""

    clock_mhz: float | None = Field(None, ge=0, description="SM clock (GPU) or the cores' mean frequency (CPU)")
    temperature_c: float | None = None
    power_w: float | None = Field(None, ge=0)
    clock_event_reasons: dict[str, bool] | None = Field(None, description="NVML's clock-event reasons active at the end, by name")
    reason: str | None = Field(None, description="why a figure is null")


class DeviceFigures(Part):
    """One device's figures: a dense matmul at the study's precision and a memory copy, each the
    median of its timed repeats."""

    index: int = Field(ge=0, description="CUDA ordinal; 0 for the CPU")
    name: str
    matmul_tflops: float = Field(gt=0, description="2 n^3 FLOPs per n x n matmul over its median time")
    matmul_size: Positive
    memory_gbps: float = Field(gt=0, description="bytes read and written by a copy over its median time (read + write, as STREAM's copy counts)")
    memory_bytes: Positive = Field(description="the copied buffer's size")
    repeats: Positive
    spread: Fraction = Field(description="(p90 - p10) / median of the matmul's repeats")
    state: DeviceState


class AllReduceFigure(Part):
    """An all-reduce among the node's ranks (NCCL on GPUs, gloo on CPUs), as nccl-tests reports it:
    bus bandwidth = size / time x 2 (n - 1) / n, the median of its repeats, slowest rank."""

    ranks: int = Field(ge=2)
    size_bytes: Positive
    backend: Literal["nccl", "gloo"]
    busbw_gbps: float = Field(gt=0)
    time_s: Seconds


class NodeCheck(Part):
    """One node's prescreen: its devices' figures, measured on the cores (CPU) or the cards (GPU)
    a rank of the study gets."""

    schema_version: Literal[1]
    node: str = Field(min_length=1, description="the host's name as the scheduler knows it")
    started_at: str
    device_type: Literal["cuda", "cpu"]
    precision: Precision
    cores: Positive = Field(description="CPU cores the check ran on (its affinity)")
    seconds: Seconds = Field(description="the whole check, start to record")
    devices: list[DeviceFigures] = Field(min_length=1)
    allreduce: AllReduceFigure | None = None
    allreduce_reason: str | None = Field(None, description="why there is no all-reduce figure (one rank on the node)")


class LinkCheck(Part):
    """An all-reduce across two nodes, the reference node and ``node``, with every rank of each
    (``scalerepro.training.node_link``): what the network between them carries, as nccl-tests
    reports it. A slow NIC, cable or switch port shows as this link below its peers'."""

    schema_version: Literal[1]
    node: str = Field(min_length=1, description="the node whose link to the reference this is")
    reference: str = Field(min_length=1)
    hostnames: list[str] = Field(min_length=2, description="the nodes the ranks ran on, as the ranks saw them")
    started_at: str
    ranks: int = Field(ge=2)
    backend: Literal["nccl", "gloo"]
    size_bytes: Positive
    busbw_gbps: float = Field(gt=0, description="size / t x 2 (n - 1) / n, t the slowest rank's median")
    time_s: Seconds


class NodeVerdict(Part):
    """One node against the median: its figures, each as a fraction of the median, and why it was
    excluded (None where it passed)."""

    node: str
    figures: dict[str, float]
    ratios: dict[str, float]
    excluded_because: str | None
    check: NodeCheck  # the node's record, whole: the screen is all its readers need
    link: LinkCheck | None = None  # its link to the reference node (None: the reference, or one node)


class NodeScreen(Part):
    """The rule's outcome over every node screened."""

    fraction: float = Field(gt=0, le=1)
    reason: str | None = Field(None, description="why that fraction (the config's prescreen.reason)")
    medians: dict[str, float]
    nodes: list[NodeVerdict]
    note: str | None = Field(None, description="why nothing was compared (one node)")
    reference: str | None = Field(None, description="the node every link was measured to (the first screened)")

    @property
    def excluded(self) -> list[str]:
        return [verdict.node for verdict in self.nodes if verdict.excluded_because is not None]

    @property
    def passed(self) -> list[str]:
        return [verdict.node for verdict in self.nodes if verdict.excluded_because is None]


RERUN = "rerun the prescreen (snakemake --forcerun prescreen)"


class NodeFileError(CommandError):
    """A prescreen file that is absent, not JSON or not its model: one line naming it."""


def read_screen(path: str | os.PathLike[str]) -> NodeScreen:
    """The screen at ``path``, checked against the model: the one reader of every side (the
    submission's exclusions, the report, the store), which refuse a file that is not a screen
    with the same line."""
    path = Path(path)
    try:
        return NodeScreen.model_validate(read_json_object(path, "prescreen screen"))
    except FileNotFoundError:
        raise NodeFileError(f"no prescreen screen at {path}: {RERUN}, or leave the flag out where prescreen.enabled is false") from None
    except ValidationError as error:
        # pydantic's first line counts the errors; the second names the first field that failed
        lines = str(error).splitlines()
        raise NodeFileError(f"{path}: not a prescreen screen ({'; '.join(lines[:2])}): {RERUN}") from None
    except ValueError as error:  # read_json_object's JsonFileError: too large, not JSON, not an object
        raise NodeFileError(f"{str(error).splitlines()[0]}: {RERUN}") from None
