"""Each model measured on a GPU beside two published figures: the best one published for that model's
class on that GPU model, and the best like-for-like one (or none, and why); both ratios, every
condition that differs from each named with both values, and the gap walk from the like-for-like
figure to the measured one.

    measured       per model and device, one row: the best cell, the configuration (the matrix's
                   cell, split further by every recorded condition of CONDITION_TABLE and PAIR_ONLY)
                   with the highest median per-GPU throughput over its counted repeats, with n and its
                   spread (cell_facts.spread: n >= 3 min - max, n = 2 the two runs, n = 1 the run's
                   own p10 - p90 steps), per GPU
    figures        references (config/references.yaml) that are measurements (MEASURED_KINDS), each
                   as a per-GPU figure: a whole-job figure (samples_per_s) / its GPU count. At more
                   than one GPU that includes each step's all-reduce: a lower bound on what one of its
                   GPUs does alone
    model class    the model itself and a model the references file declares as standing in for it
                   (`stands_for`: the nearest shape, another model)
    best published the figure of the model's class on the same GPU model (H100, whatever the part,
                   framework or GPU count) that makes the measured figure look worst: the lowest
                   ratio ours / theirs
    like for like  a figure of the same model (never a stand-in), on the same GPU part (the name
                   NVML reports) at the same GPU count, in the same framework (PyTorch, as the
                   reference states it), on the same kind of data (synthetic or real, as stated), at
                   the same precision class (fp16 and bf16 are one: the same tensor-core rate, another
                   format), at the same sequence length, and with the same optimizer where the
                   reference states one. What may differ, each named on the row: the batch per GPU,
                   memory format, compile, loader, PyTorch release, power cap, fp16 against bf16, and
                   what the reference leaves unstated. The best like-for-like figure is the highest of
                   them (the lowest ratio); none where no reference passes, with why for each that
                   fails
    ratio          measured median per GPU / published per GPU, in the reference's metric (images or
                   sequences per second, or tokens per second)

The gap walk goes from the like-for-like reference's conditions to the measured cell's, one lever
(WALK_LEVERS) at a time. A step is a measured pair of cells that differ in that lever only (every
other condition equal: the same model, device, GPU count, sequence length, PyTorch, and every knob of
PAIR_ONLY), its ratio the two medians' (with the interval of that ratio where both cells have 2
repeats or more). Steps chain where the study measured values between the two ends (compile none ->
default -> reduce-overhead). What no step measures is the unexplained rest:

    rest = (measured / published) / product of the measured steps

named with every difference no step covers (levers not measured, framework, software stack) and what
the product assumes: each step was measured with the other levers as its pair had them, so the steps
compose only as far as the levers do not interact. Where the best published figure is another than
the like-for-like one, the walk says where it stops short of it: the conditions the best differs in
that no measured step reaches.

The analysis side: pandas only, no torch.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import REFERENCE_COLUMNS
from scalerepro.analysis.presentation import cell_facts
from scalerepro.analysis.tables import repeats, reproduction
from scalerepro.analysis.tables.reproduction import _same_device, recorded_conditions
from scalerepro.common.references import load_optional_references, load_references

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
# Knobs no reference states, which a pair of cells must still share to be one lever apart.
PAIR_ONLY = {"optimizer_impl": "optimizer implementation", "cudnn_benchmark": "cuDNN benchmark", "parallel": "parallelism"}
LABELS = {**{key: label for key, label, _ in CONDITION_TABLE}, **PAIR_ONLY}
WALK_LEVERS = tuple(key for key, _, lever in CONDITION_TABLE if lever)
# Precisions that differ in format but run at the same tensor-core rate: one precision class.
SAME_RATE = ({"fp16", "bf16"},)
VALUE_WORDS = {"nchw": "NCHW", "nhwc": "NHWC (channels_last)", "none": "none (eager)"}
# What reproduction.read_references leaves out and this comparison reads: the GPU part, its power
# cap and whose figure that is, and the trainer's model an entry stands in for (with what differs).
EXTRA_COLUMNS = ("sku", "power_cap_w", "power_cap_basis", "stands_for", "stands_for_differs")
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
    frame["stands_for"] = [stands_for[key].get("model") for key in frame["id"]]
    frame["stands_for_differs"] = [stands_for[key].get("differs") for key in frame["id"]]
    return frame


def _plain(value: Any) -> Any:
    """None for NaN or empty, Python scalars for numpy ones, bools for "True"/"False" text."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value == "":
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str) and value in ("True", "False"):
        return value == "True"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def gpu_model(name: Any) -> str | None:
    """The GPU model (its chip: H100, A100) a device name or a reference's GPU text names; None for a
    CPU or a name without one."""
    if not isinstance(name, str) or name.upper().startswith("CPU"):
        return None
    return next((token for token in re.split(r"[^A-Z0-9]+", name.upper()) if _CHIP.match(token)), None)


def words(key: str, value: Any) -> str:
    """A condition's value as the tables print it."""
    value = _plain(value)
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
    framework = str(_plain(ref.get("framework")) or "")
    stack = re.search(r"PyTorch\s+\d[^\s,;]*(?:\s+\([^)]*\))?", framework)
    conditions = {key: _plain(ref.get(key)) for key, _, _ in CONDITION_TABLE if key in ref}
    conditions.update(
        gpus=_plain(ref.get("gpus")),
        compile=_flag(ref.get("trainer_flags"), "--compile"),
        loader=_flag(ref.get("trainer_flags"), "--loader"),
        framework=("PyTorch" if _is_pytorch(framework) else framework.split(", ")[0]) if framework else None,
        software_stack=stack.group(0) if stack else None,
        gpu=_plain(ref.get("gpu")),
        power_cap_basis=_plain(ref.get("power_cap_basis")),
    )
    return conditions


def run_conditions(run: Mapping[str, Any]) -> dict[str, Any]:
    """A counted run's conditions (a runs.csv row) under CONDITION_TABLE's keys, and PAIR_ONLY's."""
    recorded = {key: _plain(value) for key, value in recorded_conditions(run).items()}
    torch_version = _plain(run.get("torch_version"))
    return {
        **recorded,
        "gpus": _plain(run.get("gpus")),
        "compile": _plain(run.get("compile_mode")),
        "loader": _plain(run.get("loader")),
        "framework": "PyTorch",  # the trainer is PyTorch
        "software_stack": None if torch_version is None else f"PyTorch {torch_version}",
        "optimizer_impl": _plain(run.get("optimizer_impl")),
        "cudnn_benchmark": _plain(run.get("cudnn_benchmark")),
        "parallel": _plain(run.get("parallel_recorded")),
    }


def compare(key: str, published: Any, measured: Any) -> tuple[str, float] | None:
    """(state, cost) of one condition: "same" 0, "differs" 1 (fp16 against bf16: 0.5), "not stated"
    (by the reference) or "not recorded" (by the run) 0; None where neither side has it (a sequence
    length of an image model)."""
    published, measured = _plain(published), _plain(measured)
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
    return "differs", 0.5 if key == "precision" and _same_rate(published, measured) else 1.0


def _same_rate(a: Any, b: Any) -> bool:
    pair = {str(a).lower(), str(b).lower()}
    return len(pair) == 1 or any(pair == rate for rate in SAME_RATE)


def state_of(key: str, published: Mapping[str, Any], ours: Mapping[str, Any]) -> tuple[str, float] | None:
    """``compare`` of one condition of a reference's conditions and a cell's (Cell.compared). The GPU
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
class Cell:
    """The counted runs of one recorded configuration."""

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
        return {str(run.get("git_commit"))[:12] for run in self.runs if _plain(run.get("git_commit"))}


def measured_cells(runs: pd.DataFrame, inventory: Any = None) -> list[Cell]:
    """The counted runs grouped by study, model, device, the matrix's variant, precision and batch, and
    every recorded condition, in first-seen order; each with its power cap (cell_facts.clocks: the
    records', else the inventory's entry of its GPU)."""
    cells: dict[tuple, Cell] = {}
    if runs.empty or "counts" not in runs.columns:
        return []
    for run in runs[runs["counts"].astype(bool)].to_dict("records"):
        conditions = run_conditions(run)
        device = conditions.pop("gpu")
        # never coarser than the matrix's cell (a record that leaves a knob out is not pooled with another variant)
        planned = tuple(str(run.get(k)) for k in ("variant", "precision", "per_gpu_batch"))
        key = (run.get("study"), run.get("model"), device, planned, tuple(sorted((k, str(v)) for k, v in conditions.items())))
        cells.setdefault(key, Cell(str(run.get("study")), str(run.get("model")), str(device), conditions)).runs.append(run)
    counted = [cell for cell in cells.values() if cell.describe("per_gpu")["n"]]
    for cell in counted:
        clocks = cell_facts.clocks(pd.DataFrame(cell.runs), inventory) or {}
        if clocks.get("power_limit_w") is not None:
            basis = "record" if clocks.get("power_limit_basis") == "the record" else "inventory"
            cell.hardware = {"power_cap_w": _plain(float(clocks["power_limit_w"])), "power_cap_basis": basis}
    return counted


def _best(cells: Sequence[Cell]) -> Cell:
    """The cell of highest median per-GPU throughput (more repeats first on a tie)."""
    return max(cells, key=lambda c: (c.describe("per_gpu")["median"], c.describe("per_gpu")["n"]))


# --------------------------------------------------------------------------------------------
# The best published figure and the like-for-like one
# --------------------------------------------------------------------------------------------


def per_gpu_published(ref: Mapping[str, Any]) -> float:
    """A reference's figure per GPU: a whole-job figure / its GPU count."""
    value = float(ref["value"])
    return value / int(_plain(ref["gpus"])) if ref["metric"] == "samples_per_s" else value


def figure_ratio(ref: Mapping[str, Any], cell: Cell) -> float:
    """Measured median per GPU / published per GPU, in the reference's metric."""
    metric = "samples_per_gpu" if ref["metric"] == "samples_per_s" else "tokens_per_s_per_gpu"
    return cell.describe(metric)["median"] / per_gpu_published(ref)


def class_figures(references: pd.DataFrame, cell: Cell) -> list[Mapping[str, Any]]:
    """The measurements of the cell's model class (the model, or one standing in for it) on its GPU
    model, at any GPU count."""
    refs = references.to_dict("records") if not references.empty else []
    chip = gpu_model(cell.device)
    return [
        ref
        for ref in refs
        if cell.model in (ref.get("model"), _plain(ref.get("stands_for")))
        and ref.get("kind") in MEASURED_KINDS
        and chip is not None
        and gpu_model(ref.get("gpu")) == chip
    ]


def _stand_in(ref: Mapping[str, Any], cell: Cell) -> str | None:
    """What makes a stand-in another model ("another model (MPT-1B: ...)"); None for the model itself."""
    if ref.get("model") == cell.model:
        return None
    return f"another model ({_plain(ref.get('stands_for_differs')) or ref.get('model')})"


def _published_words(key: str, published: Mapping[str, Any]) -> str:
    """A reference's value of a condition as the row prints it: its GPU part as the source names it,
    its power cap with whose figure it is."""
    if key == "sku":
        return words(key, published.get("sku"))
    if key == "power_cap_w" and published.get("power_cap_w") is not None:
        basis = POWER_BASIS.get(str(published.get("power_cap_basis")), published.get("power_cap_basis"))
        return f"{words(key, published['power_cap_w'])} ({basis})" if basis else words(key, published["power_cap_w"])
    return words(key, published.get(key))


def _measured_words(key: str, cell: Cell) -> str:
    if key == "power_cap_w" and cell.hardware.get("power_cap_w") is not None:
        return f"{words(key, cell.hardware['power_cap_w'])} ({POWER_BASIS[cell.hardware['power_cap_basis']]})"
    return words(key, cell.compared().get(key))


def conditions_table(ref: Mapping[str, Any] | None, cell: Cell) -> list[dict[str, Any]]:
    """Every condition of a reference beside a cell's: label, measured and published values, state,
    cost, and the words the row says of it. A stand-in's model comes first, as a condition that differs."""
    if ref is None:
        return []
    published, ours = reference_conditions(ref), cell.compared()
    rows = []
    if (stand_in := _stand_in(ref, cell)) is not None:
        rows.append(
            {
                "condition": "model",
                "label": "model",
                "measured": cell.model,
                "published": str(ref.get("model")),
                "state": "differs",
                "cost": 1.0,
                "says": stand_in,
            }
        )
    for key, label, _ in CONDITION_TABLE:
        state = state_of(key, published, ours)
        if state is None:
            continue
        theirs, mine = _published_words(key, published), _measured_words(key, cell)
        if state[0] == "differs":
            says = f"{label}: {theirs}, ours {mine}" + (" (the same tensor-core rate)" if state[1] == 0.5 else "")
        elif state[0] == "not stated":
            says = f"{label}: not stated, ours {mine}"
        elif state[0] == "not recorded":
            says = f"{label}: {theirs}, ours not recorded"
        else:
            says = f"{label} {mine}"
        rows.append({"condition": key, "label": label, "measured": mine, "published": theirs, "state": state[0], "cost": state[1], "says": says})
    return rows


def like_for_like_failures(ref: Mapping[str, Any], cell: Cell) -> list[str]:
    """Why a reference is not like for like with a cell (the module docstring's rule), in words;
    empty where it is."""
    published, ours = reference_conditions(ref), cell.compared()
    failures = []
    if (stand_in := _stand_in(ref, cell)) is not None:
        failures.append(stand_in)
    if not _same_device(ref.get("gpu"), cell.device):
        failures.append(f"GPU: {published.get('sku') or ref.get('gpu')}, ours {cell.device}")
    if published.get("gpus") != cell.gpus:
        failures.append(f"GPUs: {words('gpus', published.get('gpus'))}, ours {words('gpus', cell.gpus)}")
    for key in ("framework", "data", "precision", "seq_len", "optimizer"):
        state = state_of(key, published, ours)
        if state is None or state[0] == "same":
            continue
        if key == "precision" and state[0] == "differs" and _same_rate(published.get(key), ours.get(key)):
            continue  # the same precision class
        if key == "optimizer" and state[0] in ("not stated", "not recorded"):
            continue  # named as unknown on the row, not a failure
        mine = words(key, ours.get(key)) if state[0] != "not recorded" else "not recorded"
        failures.append(f"{LABELS[key]}: {words(key, published.get(key))}, ours {mine}")
    return failures


def _figure(ref: Mapping[str, Any], cell: Cell) -> dict[str, Any]:
    """One published figure as the row shows it: per GPU (and what that is at more than one GPU), its
    ratio, its conditions and those that differ from the cell's, its source."""
    conditions = conditions_table(ref, cell)
    gpus = int(_plain(ref["gpus"]))
    per_gpu_note = None
    if gpus > 1:
        per_gpu_note = f"per GPU at {gpus} GPUs: a lower bound on what one of its GPUs does alone"
        if ref["metric"] == "samples_per_s":
            per_gpu_note += f" ({float(ref['value']):,.0f} for the job)"
    return {
        "reference": ref["id"],
        "kind": ref.get("kind"),
        "published": per_gpu_published(ref),
        "published_value": float(ref["value"]),
        "published_gpus": gpus,
        "metric": ref["metric"],
        "per_gpu_note": per_gpu_note,
        "ratio": figure_ratio(ref, cell),
        "source": ref.get("source"),
        "framework": _plain(ref.get("framework")),
        "metric_notes": _plain(ref.get("metric_notes")),
        "stand_in": _stand_in(ref, cell),
        # its reproduction conditions, as the source states them
        "stated": [
            c["published"] if c["condition"] == "gpus" else f"{c['label']} {c['published']}"
            for c in conditions
            if c["condition"] != "model" and c["state"] != "not stated"
        ],
        "differs": [c["says"] for c in conditions if c["state"] == "differs"],
        "unknown": [c["says"] for c in conditions if c["state"] in ("not stated", "not recorded")],
        "conditions": conditions,
    }


@dataclass
class Pairing:
    """A measured cell and the published figure its gap walk starts from (the like-for-like one)."""

    cell: Cell
    reference: Mapping[str, Any] | None


def choose(references: pd.DataFrame, cell: Cell) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None, list[tuple[str, list[str]]]]:
    """(best published, best like for like, why each other figure of the model's class is not like
    for like) for a cell (the module docstring's rules); the lowest ratio wins, the model itself before a
    stand-in, then the fewest conditions that differ, then the id."""
    figures = class_figures(references, cell)

    def order(ref: Mapping[str, Any]) -> tuple:
        differ = sum(c["cost"] for c in conditions_table(ref, cell) if c["state"] == "differs")
        return (figure_ratio(ref, cell), ref.get("model") != cell.model, differ, str(ref["id"]))

    failures = {ref["id"]: like_for_like_failures(ref, cell) for ref in figures}
    alike = [ref for ref in figures if not failures[ref["id"]]]
    best = min(figures, key=order) if figures else None
    like = min(alike, key=order) if alike else None
    return best, like, [(ref["id"], failures[ref["id"]]) for ref in sorted(figures, key=order) if failures[ref["id"]]]


def _why_no_like(cell: Cell, failed: Sequence[tuple[str, Sequence[str]]]) -> dict[str, Any]:
    """Why a row has no like-for-like figure: ``text``, and each figure of the model itself with the
    conditions that fail the rule (``failed``)."""
    own = [{"reference": ref, "why": list(why)} for ref, why in failed if not why[0].startswith("another model")]
    text = f"no figure of {cell.model} itself on the {gpu_model(cell.device)}" if not own else "no figure of the model passes the rule"
    stand_ins = sorted({re.sub(r"-\d+$", "-*", ref) for ref, why in failed if why[0].startswith("another model")})
    if stand_ins:
        text += f"; {', '.join(stand_ins)}: another model, never like for like"
    return {"text": text, "failed": own}


def _why_none(references: pd.DataFrame, model: str, device: str) -> str:
    """Why a model has no published figure beside it, naming the GPUs it was published on and the
    expectations that are no measurement."""
    text = f"No published figure for {model} on {device}"
    if references.empty:
        return text + ": no references."
    same_model = references[references["model"].eq(model)]
    measured = same_model["kind"].isin(MEASURED_KINDS)
    chip = gpu_model(device)
    elsewhere = sorted({str(g) for g in same_model.loc[measured, "gpu"].dropna() if gpu_model(g) != chip})
    expected = sorted({f"{kind} on {gpu}" for kind, gpu in same_model.loc[~measured, ["kind", "gpu"]].itertuples(index=False)})
    if elsewhere:
        text += f"; published on {'; '.join(elsewhere)}"
    if expected:
        text += f"; an expectation, not a measurement: {'; '.join(expected)}"
    return text + "."


def _reached(best: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> set[str]:
    """The levers in which the best figure's value is one a measured step of the walk starts or ends at."""
    published = reference_conditions(best)
    return {s["lever"] for s in steps if s.get("status") == "measured" and words(s["lever"], published.get(s["lever"])) in (s["from"], s["to"])}


def stops_short(
    best: dict[str, Any] | None, like: dict[str, Any] | None, steps: Sequence[Mapping[str, Any]], best_ref: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Where the walk from the like-for-like figure stops short of the best published one: the
    conditions the best differs in from the measured cell that no measured step reaches."""
    if best is None or like is None or best["reference"] == like["reference"] or best_ref is None:
        return None
    reached = _reached(best_ref, steps)
    differ = [c for c in best["conditions"] if c["state"] == "differs"]
    return {
        "reference": best["reference"],
        "ratio": best["ratio"],
        "like": like["reference"],
        "unreached": [c["says"] for c in differ if c["condition"] not in reached],
        "reached": [c["label"] for c in differ if c["condition"] in reached],
    }


# --------------------------------------------------------------------------------------------
# The gap walk
# --------------------------------------------------------------------------------------------


def _one_lever_apart(a: Cell, b: Cell, lever: str) -> bool:
    """Same model and device, every condition equal but ``lever``, which differs."""
    if (a.model, a.device) != (b.model, b.device):
        return False
    keys = set(a.conditions) | set(b.conditions)
    return str(a.conditions.get(lever)) != str(b.conditions.get(lever)) and all(
        str(a.conditions.get(k)) == str(b.conditions.get(k)) for k in keys if k != lever
    )


def _closeness(pair: tuple[Cell, Cell], target: Cell) -> tuple:
    """Pairs whose other levers are the target cell's first, then those with more repeats."""
    a, b = pair
    apart = sum(str(a.conditions.get(k)) != str(target.conditions.get(k)) for k in a.conditions)
    return (apart, -(len(a.runs) + len(b.runs)), a.key_text(), b.key_text())


def walk(pairing: Pairing, cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """The gap walk of a pairing (module docstring): its steps in WALK_LEVERS order, measured or not,
    then the unexplained rest. Each a dict: lever, label, from, to, status ("measured", "not
    measured", "rest"), ratio with its interval and the two cells' medians, n and runs."""
    ref, target = pairing.reference, pairing.cell
    if ref is None:
        return []
    metric = str(ref["metric"])
    published = reference_conditions(ref)
    steps: list[dict[str, Any]] = []
    for lever in WALK_LEVERS:
        state = compare(lever, published.get(lever), target.conditions.get(lever))
        if state is None or state[0] != "differs":
            continue
        # values compared in lower case (Muon, muon), printed as one of the sides spelled them
        spelled = {str(v).lower(): v for v in (published[lever], target.conditions[lever])}
        start, end = str(published[lever]).lower(), str(target.conditions[lever]).lower()
        pairs: dict[tuple[str, str], list[tuple[Cell, Cell]]] = {}
        for a in cells:
            for b in cells:
                if a is not b and (a.model, a.device, a.gpus) == (target.model, target.device, target.gpus) and _one_lever_apart(a, b, lever):
                    spelled.setdefault(str(a.conditions[lever]).lower(), a.conditions[lever])
                    pairs.setdefault((str(a.conditions[lever]).lower(), str(b.conditions[lever]).lower()), []).append((a, b))
        # breadth first from our value over the measured pairs, toward the reference's
        parent: dict[str, str | None] = {end: None}
        queue = deque([end])
        while queue:
            here = queue.popleft()
            for x, y in pairs:
                if y == here and x not in parent:
                    parent[x] = here
                    queue.append(x)
        # where the reference's value is not reached: the value farthest from ours that is
        reached = start if start in parent else max(parent, key=lambda v: _depth(parent, v))
        if reached != start:
            steps.append(_unmeasured(lever, spelled[start], spelled[reached]))
        value = reached
        while parent.get(value) is not None:
            nxt = parent[value]
            a, b = min(pairs[(value, nxt)], key=lambda p: _closeness(p, target))
            steps.append(_measured(lever, spelled[value], spelled[nxt], a, b, metric))
            value = nxt
    used = {id(target)} | {id(c) for step in steps for c in step.pop("cells", ())}
    others = [c for c in cells if id(c) not in used and (c.model, c.device, c.gpus) == (target.model, target.device, target.gpus)]
    unused = [_unused(c, target, metric) for c in others]
    # a cell the records say nothing different of (another study's, or knobs not recorded) is no lever at all
    return steps + [{**_rest(pairing, steps, published), "unused": [u for u in unused if u["levers"]]}]


def _unused(cell: Cell, target: Cell, metric: str) -> dict[str, Any]:
    """A cell of the model that no step uses: more than one lever from every other cell."""
    spread = cell.describe("per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s")
    apart = [f"{LABELS[k]} {words(k, v)}" for k, v in cell.conditions.items() if str(v) != str(target.conditions.get(k))]
    return {"runs": cell.run_ids(), "median": spread["median"], "n": spread["n"], "apart": "; ".join(apart), "levers": len(apart)}


def _depth(parent: Mapping[str, str | None], value: str) -> int:
    depth = 0
    while parent.get(value) is not None:
        value, depth = parent[value], depth + 1
    return depth


def _unmeasured(lever: str, start: Any, end: Any) -> dict[str, Any]:
    return {"lever": lever, "label": LABELS[lever], "from": words(lever, start), "to": words(lever, end), "status": "not measured"}


def _measured(lever: str, start: Any, end: Any, a: Cell, b: Cell, metric: str) -> dict[str, Any]:
    metric = "per_gpu" if metric == "tokens_per_s_per_gpu" else "samples_per_s"
    low, high = repeats.ratio_interval(
        [(a.values(metric), ("nearest", a.key_text(), metric)), (b.values(metric), ("nearest", b.key_text(), metric))],
        lambda x, y: y / x,
    )
    da, db = a.describe(metric), b.describe(metric)
    commits = sorted(a.commits() | b.commits())
    return {
        "lever": lever,
        "label": LABELS[lever],
        "from": words(lever, start),
        "to": words(lever, end),
        "status": "measured",
        "ratio": db["median"] / da["median"],
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "from_median": da["median"],
        "from_n": da["n"],
        "from_runs": a.run_ids(),
        "to_median": db["median"],
        "to_n": db["n"],
        "to_runs": b.run_ids(),
        "held": "; ".join(f"{LABELS[k]} {words(k, v)}" for k, v in a.conditions.items() if k != lever and k in WALK_LEVERS and v is not None),
        "sessions": f"runs of {len(commits)} commits ({', '.join(commits)})" if len(commits) > 1 else "",
        "cells": (a, b),
    }


def _rest(pairing: Pairing, steps: Sequence[Mapping[str, Any]], published: Mapping[str, Any]) -> dict[str, Any]:
    """What the measured steps leave of the gap, and every difference they do not cover."""
    total = pairing_ratio(pairing)
    measured = [s for s in steps if s["status"] == "measured"]
    product = float(np.prod([s["ratio"] for s in measured])) if measured else 1.0
    unexplained = [f"{s['label']} {s['from']} \u2192 {s['to']} (not measured)" for s in steps if s["status"] == "not measured"]
    unstated: dict[str, list[str]] = {"not stated": [], "not recorded": []}
    ours = pairing.cell.compared()
    for key, label, lever in CONDITION_TABLE:
        state = state_of(key, published, ours)
        if state and state[0] == "differs" and not lever:
            if key == "software_stack" and compare("framework", published.get("framework"), "PyTorch")[0] == "differs":
                continue  # another framework says it
            unexplained.append(f"{label} {_published_words(key, published)} \u2192 {_measured_words(key, pairing.cell)}")
        elif state and state[0] in unstated:
            unstated[state[0]].append(label)
    if unstated["not stated"]:
        unexplained.append(f"whatever differs in what the reference does not state ({', '.join(unstated['not stated'])})")
    if unstated["not recorded"]:
        unexplained.append(f"whatever differs in what the runs' records do not state ({', '.join(unstated['not recorded'])})")
    if len(measured) > 1 or (measured and unexplained):
        unexplained.append("how the levers interact (each step was measured with the other levers as its pair had them)")
    return {
        "lever": "",
        "label": "unexplained rest",
        "status": "rest",
        "ratio": total / product if total == total else float("nan"),
        "explained": product,
        "total": total,
        "what": unexplained,
    }


def pairing_ratio(pairing: Pairing) -> float:
    """Measured median / published, in the reference's metric."""
    if pairing.reference is None:
        return float("nan")
    metric = "samples_per_s" if pairing.reference["metric"] == "samples_per_s" else "per_gpu"
    return pairing.cell.describe(metric)["median"] / float(pairing.reference["value"])


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------


def _anchor(model: str, device: str, devices: int) -> str:
    """The row's id: published-<model>, with the device where the report has several."""
    token = lambda text: re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")  # noqa: E731
    return f"published-{token(model)}" + (f"-{token(device)}" if devices > 1 else "")


def published_table(runs: pd.DataFrame, references: pd.DataFrame, inventory: Any = None) -> list[dict[str, Any]]:
    """One row per measured model and device: the best cell (median per GPU, n, spread, runs), the
    best published figure of its class (``best``), the best like-for-like one (``like``, else
    ``like_none`` says why), each with its ratio, conditions and those that differ (``_figure``), the
    gap walk from the like-for-like figure (``walk``) and where it stops short of the best
    (``stops_short``); ``why_none`` where there is no figure at all."""
    cells = measured_cells(runs, inventory)
    pairs = list(dict.fromkeys((c.model, c.device) for c in cells))
    devices = len({device for _, device in pairs})
    rows = []
    for model, device in pairs:
        cell = _best([c for c in cells if (c.model, c.device) == (model, device)])
        best_ref, like_ref, failed = choose(references, cell)
        best = None if best_ref is None else _figure(best_ref, cell)
        like = None if like_ref is None else _figure(like_ref, cell)
        # the metric of the figure shown; without one, the one the model is published in elsewhere, else
        # a language model's tokens per GPU
        elsewhere = references.loc[references["model"].eq(model), "metric"] if not references.empty else pd.Series(dtype=object)
        metric = (best_ref or like_ref or {}).get("metric") or (elsewhere.iloc[0] if len(elsewhere) else None)
        tokens = metric == "tokens_per_s_per_gpu" if metric else bool(cell.conditions.get("seq_len"))
        spread = cell.describe("tokens_per_s_per_gpu" if tokens else "samples_per_gpu")
        steps = walk(Pairing(cell, like_ref), cells) if like_ref is not None else []
        rows.append(
            {
                "model": model,
                "device": device,
                "gpus": cell.gpus,
                "study": cell.study,
                "anchor": _anchor(model, device, devices),
                "metric": "tokens_per_s_per_gpu" if tokens else "samples_per_s",
                "measured": spread["median"],
                "repeats": spread["n"],
                "spread": cell.spread(tokens),
                "measured_runs": cell.run_ids(),
                "best": best,
                "like": like,
                "like_none": None if like is not None or best is None else _why_no_like(cell, failed),
                "why_none": _why_none(references, model, device) if best is None else "",
                "walk": steps,
                "stops_short": stops_short(best, like, steps, best_ref),
                # the walk's figures are in the like-for-like reference's metric, at the cell's GPU count
                "walk_published": None if like_ref is None else float(like_ref["value"]),
                "walk_measured": None if like_ref is None else cell.describe("samples_per_s" if like_ref["metric"] == "samples_per_s" else "per_gpu")["median"],
                "walk_metric": None if like_ref is None else like_ref["metric"],
            }
        )
    return rows


def reproduction_shown(comparison: pd.DataFrame) -> bool:
    """Whether the reproduce study planned a run for any reference: then its table is shown as it
    is; else every reference of it would read "not comparable: no run scheduled", and they go to the
    one folded table instead."""
    if comparison.empty or "verdict" not in comparison.columns:
        return False
    cells = comparison.get("measured_cell", pd.Series("", index=comparison.index)).astype("string").fillna("")
    return bool(cells.ne("").any() or comparison["verdict"].astype(str).eq("not measured").any())


def unshown_references(
    references: pd.DataFrame, rows: Sequence[Mapping[str, Any]], runs: pd.DataFrame, shown: set[str] = frozenset(), inventory: Any = None
) -> list[dict[str, Any]]:
    """The references beside no measurement here (neither a row's best nor its like-for-like figure,
    not in ``shown``), each with why: like for like but below the one shown, below the best published
    and not like for like (and why), a model not measured on this GPU model, another GPU, or an
    expectation."""
    cells = measured_cells(runs, inventory)
    chips = sorted({c for c in (gpu_model(cell.device) for cell in cells) if c})
    shown_ids = {figure["reference"] for row in rows for figure in (row["best"], row["like"]) if figure}
    best_of = {(row["model"], gpu_model(row["device"])): row for row in rows}
    out = []
    for ref in references.to_dict("records") if not references.empty else []:
        if ref["id"] in shown_ids or ref["id"] in shown:
            continue
        chip = gpu_model(ref.get("gpu"))
        models = [m for m in (ref.get("model"), _plain(ref.get("stands_for"))) if m]
        row = next((best_of[(m, chip)] for m in models if (m, chip) in best_of), None)
        if ref.get("kind") not in MEASURED_KINDS:
            why = f"{ref.get('kind')}: not a measurement"
        elif chip not in chips:
            why = "another GPU" if cells else "no run completed here"
        elif row is None:
            why = f"no {ref.get('model')} measured on this GPU model"
        else:
            cell = _best([c for c in cells if (c.model, c.device) == (row["model"], row["device"])])
            failures = like_for_like_failures(ref, cell)
            if not failures and row["like"]:
                why = f"like for like, below the one shown ({row['like']['reference']}, {figure_ratio(ref, cell):.2f}× against {row['like']['ratio']:.2f}×)"
            elif row["best"]:
                why = f"below the best published shown ({row['best']['reference']}); not like for like: {'; '.join(failures)}"
            else:
                why = f"not of {row['model']}'s class on this GPU model; not like for like: {'; '.join(failures)}"
        out.append(
            {
                "id": ref["id"],
                "model": ref.get("model"),
                "gpu": ref.get("gpu"),
                "gpus": _plain(ref.get("gpus")),
                "metric": ref.get("metric"),
                "value": float(ref["value"]),
                "kind": ref.get("kind"),
                "why": why,
            }
        )
    order = ("like for like", "below the best", "no ", "another GPU", "expected")
    group = {r["id"]: next((i for i, w in enumerate(order) if r["why"].startswith(w)), len(order)) for r in out}
    return sorted(out, key=lambda r: (group[r["id"]], str(r["gpu"]), str(r["model"]), r["gpus"] or 0))


def references_document(references_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The references file for what else the report shows of it (the links), checked against its
    schema as everywhere; empty without one."""
    return load_optional_references(references_path)


def report_context(runs: pd.DataFrame, references_path: str | os.PathLike[str] | None, comparison: pd.DataFrame, inventory: Any = None) -> dict[str, Any]:
    """What the report's "Measured vs published" section shows of this module: a row per measured
    model (its best published and like-for-like figures, the gap walk), whether the reproduction
    table is shown, and the references beside no measurement here. No references file: no
    reference."""
    if references_path is not None and Path(references_path).is_file():
        references = read_references(references_path)
    else:
        references = pd.DataFrame(columns=[*REFERENCE_COLUMNS, *EXTRA_COLUMNS])
    rows = published_table(runs, references, inventory)
    shown_in_reproduction: set[str] = set()
    if reproduction_shown(comparison) and "group" in comparison.columns:
        shown_in_reproduction = set(comparison.loc[comparison["group"].eq("reproduction"), "reference"].astype(str))
    return {
        "rows": rows,
        "reproduction_shown": reproduction_shown(comparison),
        "unshown": unshown_references(references, rows, runs, shown_in_reproduction, inventory),
    }
