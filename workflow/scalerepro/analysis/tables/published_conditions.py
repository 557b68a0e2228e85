"""The conditions a published figure and a measured cell are set side by side in (``CONDITION_TABLE``),
as a reference states them and as a run records them, and the measured cells: the counted runs
grouped by every recorded condition, each with its spread and power cap. ``published_comparison``
pairs each cell with its published figures; ``gap_walk`` steps between them. The analysis side:
pandas only, no torch."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.presentation import cell_facts
from scalerepro.analysis.tables import repeats, reproduction
from scalerepro.analysis.tables.reproduction import _same_device, recorded_conditions
from scalerepro.analysis.values import plain
from scalerepro.common import gpu_peaks
from scalerepro.common.references import load_references

# References that are measurements; "expected (seed document)" is a planning document's expectation.
MEASURED_KINDS = ("published", "mlperf")
# The conditions set side by side: (key, label, a lever the gap walk can step). Keys are those of
# reproduction.recorded_conditions and references.yaml's `conditions`, and four more: the GPU count,
# compile and loader (the reference's trainer flags), framework and software stack (its framework
# text); then the GPU part and its power cap (the run's from NVML: the record, else the inventory).
CONDITION_TABLE = (
    ("gpus", "GPUs", False),
    ("precision", "precision", True),
    ("per_gpu_samples_per_step", "batch per GPU", True),
    ("seq_len", "sequence length", False),
    ("memory_format", "memory format", True),
    ("compile", "compile", True),
    ("loader", "loader", True),
    ("data", "data", True),
    ("optimizer", "optimizer", True),
    ("framework", "framework", False),
    ("software_stack", "software stack", False),
    ("sku", "GPU", False),
    ("power_cap_w", "power cap", False),
)
# What no reference states and a pair of cells must still share to be one lever apart: key ->
# (its runs.csv column, label). With CONDITION_TABLE's they hold every field of the matrix's cell
# (CELL_FIELDS), so two cells the matrix keeps apart (1 and 2 nodes at 8 GPUs) are never taken for
# one lever apart, nor one cell's figures for another's.
PAIR_ONLY = {
    "nodes": ("nodes_recorded", "nodes"),
    "micro_batch": ("per_gpu_batch_recorded", "micro-batch"),
    "grad_accum_steps": ("grad_accum_recorded", "accumulation steps"),
    "global_batch": ("global_batch", "global batch"),
    "bucket_cap_mb": ("bucket_cap_mb", "DDP bucket cap (MB)"),
    "parallel": ("parallel_recorded", "parallelism"),
    "data_kind": ("data_kind", "data set"),
    "purpose": ("purpose_recorded", "purpose"),
    "image_size": ("image_size", "image size"),
    "optimizer_impl": ("optimizer_impl", "optimizer implementation"),
    "cudnn_benchmark": ("cudnn_benchmark", "cuDNN benchmark"),
    "compile_scope": ("compile_scope", "compile scope"),
    "attention_backend": ("attention_backend", "attention kernel"),
    "stem_channels": ("stem_channels", "ResNet stem channels"),
}
# Each field of scalerepro.record.cell.Cell -> what holds it here: a key of CONDITION_TABLE or
# PAIR_ONLY, or "model"/"device" (MeasuredCell's own). tests/test_report_published.py holds the
# keys to the Cell's fields: a field the cell gains is a field the comparison holds.
CELL_FIELDS = {
    "model": "model",
    "world_size": "gpus",
    "nodes": "nodes",
    "micro_batch": "micro_batch",
    "grad_accum_steps": "grad_accum_steps",
    "global_batch": "global_batch",
    "precision": "precision",
    "bucket_cap_mb": "bucket_cap_mb",
    "strategy": "parallel",
    "device_type": "device",
    "data": "data_kind",
    "purpose": "purpose",
    "device_name": "device",
    "image_size": "image_size",
    "seq_len": "seq_len",
    "compile": "compile",
    "channels_last": "memory_format",
    "loader": "loader",
    "optimizer_impl": "optimizer_impl",
    "cudnn_benchmark": "cudnn_benchmark",
    "compile_scope": "compile_scope",
    "attention_backend": "attention_backend",
    "stem_channels": "stem_channels",
}
LABELS = {**{key: label for key, label, _ in CONDITION_TABLE}, **{key: label for key, (_, label) in PAIR_ONLY.items()}}
# The cell fields a lever is made of, which differ wherever it does: a batch per GPU is a micro-batch
# x accumulation steps and sets the global batch; a data kind is a data set's.
MOVES_WITH = {"per_gpu_samples_per_step": ("micro_batch", "grad_accum_steps", "global_batch"), "data": ("data_kind",)}
WALK_LEVERS = tuple(key for key, _, lever in CONDITION_TABLE if lever)
# Like for like (published_comparison): the conditions besides the model, GPU part and GPU count a
# reference must share with the cell -> what a value the reference leaves unstated counts as. Compile
# mode and memory format are here because each moves a CNN's step by more than the day-to-day
# spread: a figure that differs in them is the nearest figure, not like for like. Precision matches
# within its class (SAME_RATE). Every other condition of CONDITION_TABLE may differ, and is named.
LIKE_FOR_LIKE = {
    "framework": "fails",
    "data": "fails",
    "precision": "fails",
    "seq_len": "fails",
    "memory_format": "fails",
    "compile": "fails",
    "optimizer": "unknown",
}
MAY_DIFFER = tuple(key for key, _, _ in CONDITION_TABLE if key not in LIKE_FOR_LIKE and key not in ("gpus", "sku"))
# Precisions that differ in format but run at the same tensor-core rate: one precision class.
SAME_RATE = ({"fp16", "bf16"},)
VALUE_WORDS = {"nchw": "NCHW", "nhwc": "NHWC (channels_last)", "none": "none (eager)"}
# What reproduction.read_references leaves out and this comparison reads: the GPU part, its power
# cap and whose figure that is, and the trainer's model an entry stands in for (with what differs).
EXTRA_COLUMNS = ("sku", "power_cap_w", "power_cap_basis", "parallelism", "parallelism_stated", "stands_for", "stands_for_differs")
# A reference's parallelism (references.yaml conditions.parallelism.kind) -> whether its per-GPU figure
# at N GPUs bounds what one of its GPUs does alone from below: under data parallelism every GPU holds
# the whole model and does one GPU's step plus the all-reduce; sharded (FSDP, ZeRO) or model-parallel
# (tensor, pipeline) GPUs each hold a part, and one GPU alone need not hold the model at all.
LOWER_BOUND = {"data": True, "sharded": False, "model": False}
POWER_BASIS = {
    "source": "the source's",
    "datasheet": "the datasheet maximum; the source states none",
    "record": "NVML, the record",
    "inventory": "NVML, the host inventory",
}
# A GPU model's chip in a device name: H100, A100, GH200, L40S (the tokens of "NVIDIA H100 80GB HBM3").
_CHIP = re.compile(r"^(?:GH|GB|[ABHLTV])\d{1,3}S?$")


def read_references(path: str | os.PathLike[str]) -> pd.DataFrame:
    """reproduction.read_references with EXTRA_COLUMNS, read from the same checked file."""
    frame = reproduction.read_references(path)
    entries = {entry["id"]: entry for entry in load_references(path).get("references", [])}
    conditions = {key: entry["conditions"] for key, entry in entries.items()}
    stands_for = {key: entry.get("stands_for") or {} for key, entry in entries.items()}
    for column in ("sku", "power_cap_w", "power_cap_basis"):
        frame[column] = [conditions[key].get(column) for key in frame["id"]]
    parallelism = {key: conditions[key].get("parallelism") or {} for key in frame["id"]}
    frame["parallelism"] = [parallelism[key].get("kind") for key in frame["id"]]
    frame["parallelism_stated"] = [parallelism[key].get("as_stated") for key in frame["id"]]
    frame["stands_for"] = [stands_for[key].get("model") for key in frame["id"]]
    frame["stands_for_differs"] = [stands_for[key].get("differs") for key in frame["id"]]
    return frame


def plain_value(value: Any) -> Any:
    """A reference's or a run's value as Python: "True"/"False" text as bools, whole floats as ints."""
    return plain(value, keep_infinite=True, text_flags=True, whole_as_int=True)


def gpu_model(name: Any) -> str | None:
    """The GPU model (its chip: H100, A100) a device name or a reference's GPU text names; None for a
    CPU or a name without one."""
    if not isinstance(name, str) or name.upper().startswith("CPU"):
        return None
    return next((token for token in re.split(r"[^A-Z0-9]+", name.upper()) if _CHIP.match(token)), None)


def gpu_part(name: Any) -> str | None:
    """The GPU part a device name or a reference's GPU text names: its compute part in the peak
    table (H100 SXM5, H100 PCIe and H100 NVL are three parts of one chip, at other peaks; a name
    without a form factor is the SXM part, gpu_peaks.BARE_NAME_RULE), else its chip; None for a CPU
    or a name without one."""
    chip = gpu_model(name)
    return None if chip is None else gpu_peaks.gpu_model(name) or chip


def words(key: str, value: Any) -> str:
    """A condition's value as the tables print it."""
    value = plain_value(value)
    if value is None:
        return "not stated"
    if isinstance(value, bool):
        return "on" if value else "off"
    if key == "gpus":
        return f"{value} GPU" + ("s" if value != 1 else "")
    if key == "power_cap_w" and isinstance(value, (int, float)):
        return f"{value:,.0f} W"
    if isinstance(value, int):
        return f"{value:,}"
    return VALUE_WORDS.get(str(value).lower(), str(value))


def _flag(flags: Any, name: str) -> str | None:
    """The value after ``name`` in a reference's trainer flags ("--compile none ...")."""
    if not isinstance(flags, str):
        return None
    tokens = shlex.split(flags)
    return tokens[tokens.index(name) + 1] if name in tokens[:-1] else None


def _is_pytorch(text: str) -> bool:
    return bool(re.search(r"\b(py)?torch\b", text, re.I))


def _pytorch_version(text: Any) -> tuple[int, int] | None:
    match = re.search(r"pytorch\s+(\d+)\.(\d+)", str(text or ""), re.I)
    return (int(match.group(1)), int(match.group(2))) if match else None


def reference_conditions(ref: Mapping[str, Any]) -> dict[str, Any]:
    """A reference's conditions (a row of read_references) under CONDITION_TABLE's keys, and its
    GPU name (``gpu``) and the basis of its power cap."""
    framework = str(plain_value(ref.get("framework")) or "")
    stack = re.search(r"PyTorch\s+\d[^\s,;]*(?:\s+\([^)]*\))?", framework)
    conditions = {key: plain_value(ref.get(key)) for key, _, _ in CONDITION_TABLE if key in ref}
    conditions.update(
        gpus=plain_value(ref.get("gpus")),
        compile=_flag(ref.get("trainer_flags"), "--compile"),
        loader=_flag(ref.get("trainer_flags"), "--loader"),
        framework=("PyTorch" if _is_pytorch(framework) else framework.split(", ")[0]) if framework else None,
        software_stack=stack.group(0) if stack else None,
        gpu=plain_value(ref.get("gpu")),
        power_cap_basis=plain_value(ref.get("power_cap_basis")),
    )
    return conditions


def run_conditions(run: Mapping[str, Any]) -> dict[str, Any]:
    """A counted run's conditions (a runs.csv row) under CONDITION_TABLE's keys, and PAIR_ONLY's."""
    recorded = {key: plain_value(value) for key, value in recorded_conditions(run).items()}
    torch_version = plain_value(run.get("torch_version"))
    return {
        **recorded,
        "gpus": plain_value(run.get("gpus")),
        "compile": plain_value(run.get("compile_mode")),
        "loader": plain_value(run.get("loader")),
        "framework": "PyTorch",  # the trainer is PyTorch
        "software_stack": None if torch_version is None else f"PyTorch {torch_version}",
        **{key: plain_value(run.get(column)) for key, (column, _) in PAIR_ONLY.items()},
    }


def compare(key: str, published: Any, measured: Any) -> tuple[str, float] | None:
    """(state, cost) of one condition: "same" 0, "differs" 1 (fp16 against bf16: 0.5), "not stated"
    (by the reference) or "not recorded" (by the run) 0; None where neither side has it (a sequence
    length of an image model)."""
    published, measured = plain_value(published), plain_value(measured)
    if published is None and measured is None:
        return None
    if published is None:
        return "not stated", 0.0
    if measured is None:
        return "not recorded", 0.0
    if key == "software_stack":
        # the same PyTorch release (major.minor); builds, CUDA and drivers are rarely all stated
        same = _pytorch_version(published) is not None and _pytorch_version(published) == _pytorch_version(measured)
    elif isinstance(published, (int, float)) or isinstance(measured, (int, float)):
        same = str(published) == str(measured)
    else:
        same = str(published).lower() == str(measured).lower()
    if same:
        return "same", 0.0
    return "differs", 0.5 if key == "precision" and same_rate(published, measured) else 1.0


def differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The keys in which two cells' conditions differ, in ``a``'s order; a field that is part of a
    lever that differs (MOVES_WITH) is that lever's difference, not one of its own."""
    apart = [key for key in dict.fromkeys([*a, *b]) if str(a.get(key)) != str(b.get(key))]
    moved = {field for key in apart for field in MOVES_WITH.get(key, ())}
    return [key for key in apart if key not in moved]


def same_rate(a: Any, b: Any) -> bool:
    pair = {str(a).lower(), str(b).lower()}
    return len(pair) == 1 or any(pair == rate for rate in SAME_RATE)


def state_of(key: str, published: Mapping[str, Any], ours: Mapping[str, Any]) -> tuple[str, float] | None:
    """``compare`` of one condition of a reference's conditions and a cell's (MeasuredCell.compared). The GPU
    part: the same where the reference's GPU is the name NVML reports for ours (it names the part),
    else another where the reference states its part, else not stated."""
    if key != "sku":
        return compare(key, published.get(key), ours.get(key))
    if ours.get("sku") is None:
        return "not recorded", 0.0
    if _same_device(published.get("gpu"), ours.get("sku")):
        return "same", 0.0
    return ("differs", 1.0) if published.get("sku") is not None else ("not stated", 0.0)


@dataclass
class MeasuredCell:
    """The counted runs of one cell (scalerepro.record.cell), with the conditions they ran under as
    the published comparison sets them beside a reference's."""

    study: str
    model: str
    device: str
    conditions: dict[str, Any]
    runs: list[Mapping[str, Any]] = field(default_factory=list)
    # the GPU part (its NVML name) and power cap with its basis: compared with a reference's, never
    # a lever (a pair of cells one lever apart is told by ``conditions`` alone)
    hardware: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return int(self.conditions["gpus"])

    def compared(self) -> dict[str, Any]:
        """The conditions a reference's are compared with: the recorded ones and the hardware's."""
        return {**self.conditions, "sku": self.device, "power_cap_w": self.hardware.get("power_cap_w")}

    def values(self, metric: str) -> np.ndarray:
        """Each run's figure in ``metric``: samples_per_s (whole job), samples_per_gpu,
        tokens_per_s_per_gpu, or per_gpu (tokens per GPU for a language model, samples per GPU
        otherwise: the ranking)."""
        if metric == "per_gpu":
            metric = "tokens_per_s_per_gpu" if self.conditions.get("seq_len") else "samples_per_gpu"
        column = "samples_per_s" if metric in ("samples_per_s", "samples_per_gpu") else "tokens_per_s"
        per_gpu = metric != "samples_per_s"
        return repeats.values_of([float(run.get(column, np.nan)) / (self.gpus if per_gpu else 1) for run in self.runs])

    def describe(self, metric: str) -> dict[str, float]:
        return repeats.describe(self.values(metric), ("nearest", self.key_text(), metric))

    def spread(self, tokens: bool) -> dict[str, Any]:
        """cell_facts.spread of the cell's runs (n >= 3: min - max; n = 2: the two runs; n = 1: the
        run's p10 - p90 steps), per GPU."""
        spread = cell_facts.spread(pd.DataFrame(self.runs), tokens)
        return {**spread, **{end: None if spread[end] is None else spread[end] / self.gpus for end in ("low", "high")}}

    def key_text(self) -> str:
        return f"{self.study}|{self.model}|{self.device}|{sorted((k, str(v)) for k, v in self.conditions.items())}"

    def run_ids(self) -> str:
        return ", ".join(str(run.get("run_id")) for run in self.runs)

    def commits(self) -> set[str]:
        return {str(run.get("git_commit"))[:12] for run in self.runs if plain_value(run.get("git_commit"))}


def measured_cells(runs: pd.DataFrame, inventory: Any = None) -> list[MeasuredCell]:
    """The counted runs by their cell (the matrix's: its repeats, which agree on every recorded
    condition or do not count, scalerepro.record.cell), in first-seen order; each with its power
    cap (cell_facts.clocks: the records', else the inventory's entry of its GPU)."""
    cells: dict[str, MeasuredCell] = {}
    if runs.empty or "counts" not in runs.columns:
        return []
    for run in runs[runs["counts"].astype(bool)].to_dict("records"):
        if run["cell"] not in cells:
            conditions = run_conditions(run)
            device = conditions.pop("gpu")
            cells[run["cell"]] = MeasuredCell(str(run.get("study")), str(run.get("model")), str(device), conditions)
        cells[run["cell"]].runs.append(run)
    counted = [cell for cell in cells.values() if cell.describe("per_gpu")["n"]]
    for cell in counted:
        clocks = cell_facts.clocks(pd.DataFrame(cell.runs), inventory) or {}
        if clocks.get("power_limit_w") is not None:
            basis = "record" if clocks.get("power_limit_basis") == "the record" else "inventory"
            cell.hardware = {"power_cap_w": plain_value(float(clocks["power_limit_w"])), "power_cap_basis": basis}
    return counted


def best_cell(cells: Sequence[MeasuredCell]) -> MeasuredCell:
    """The cell of highest median per-GPU throughput (more repeats first on a tie)."""
    return max(cells, key=lambda c: (c.describe("per_gpu")["median"], c.describe("per_gpu")["n"]))


def published_words(key: str, published: Mapping[str, Any]) -> str:
    """A reference's value of a condition as the row prints it: its GPU part as the source names it,
    its power cap with whose figure it is."""
    if key == "sku":
        return words(key, published.get("sku"))
    if key == "power_cap_w" and published.get("power_cap_w") is not None:
        basis = POWER_BASIS.get(str(published.get("power_cap_basis")), published.get("power_cap_basis"))
        return f"{words(key, published['power_cap_w'])} ({basis})" if basis else words(key, published["power_cap_w"])
    return words(key, published.get(key))


def measured_words(key: str, cell: MeasuredCell) -> str:
    if key == "power_cap_w" and cell.hardware.get("power_cap_w") is not None:
        return f"{words(key, cell.hardware['power_cap_w'])} ({POWER_BASIS[cell.hardware['power_cap_basis']]})"
    return words(key, cell.compared().get(key))
