"""The report's first read: what the study was (its title) and, per model, its best figure with
everything needed to read it: the unit, the configuration (precision, per-GPU batch, data), the
device (form factor, memory, power limit), MFU against a named peak, peak memory against the
card's capacity, n and the spread over the repeats, and scaling only where something was scaled.

Small and explicit: the statistics are the aggregation's; this module picks and labels them. It
does not import the report module (which imports it): the templates format its numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import pandas as pd

from scalerepro.analysis.presentation import cell_facts
from scalerepro.analysis.values import finite_number, plain
from scalerepro.common import gpu_peaks

# What "fp32" and "tf32" mean in this trainer (scalerepro.trainer_flags: --precision); an H100's dense
# TF32 rate is 7.4x its IEEE fp32 rate, and NGC's and Lambda's published "FP32" figures are TF32.
PRECISION_WORDS = {
    "fp32": "fp32, TF32 off (IEEE fp32 matmuls and convolutions)",
    "tf32": "tf32 (fp32 storage, TF32 tensor-core matmuls and convolutions)",
}


# --------------------------------------------------------------------------------------------
# Values as the tables hold them
# --------------------------------------------------------------------------------------------


def _plain_cell(value: Any) -> Any:
    """A cell as a Python value, ±inf kept: a headline shows what the table holds."""
    return plain(value, keep_infinite=True)


def _flag(value: Any) -> bool:
    value = _plain_cell(value)
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes")) or value == 1


def gib(size: Any) -> str | None:
    number = finite_number(size)
    return None if number is None else f"{number / 2**30:,.1f} GiB"


def counting_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs the aggregation's statistics are over: its ``counts`` column of runs.csv."""
    if runs.empty or "counts" not in runs.columns:
        return runs.iloc[0:0]
    return runs[runs["counts"].map(_flag)]


# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------


def precision_words(precision: Any) -> str | None:
    """A precision as the reader needs it: fp32 and tf32 say whether TF32 was on."""
    precision = _plain_cell(precision)
    return None if precision is None else PRECISION_WORDS.get(str(precision), str(precision))


def throughput_unit(tokens_per_s: Any, tokens_per_sample: Any) -> str:
    """img/s for an image model (no tokens), tokens/s for a language model, else samples/s."""
    if finite_number(tokens_per_s) is not None or (finite_number(tokens_per_sample) or 0) > 0:
        return "tokens/s"
    if finite_number(tokens_per_sample) == 0:
        return "img/s"
    return "samples/s"


def describe_config(row: Mapping[str, Any], worker: str = "GPU") -> str:
    """Study · variant · precision · batch per ``worker`` (GPU, or rank on a CPU) · bucket · data,
    as far as the row says."""
    parts = [str(row[key]) for key in ("study", "variant") if _plain_cell(row.get(key)) is not None]
    if _plain_cell(row.get("precision")) is not None:
        parts.append(str(precision_words(row["precision"])))
    batch = finite_number(row.get("per_gpu_batch"))
    if batch is not None:
        parts.append(f"batch {round(batch):,}/{worker}")
    # DDP's gradient buckets only exist where gradients are all-reduced: one GPU has none
    if finite_number(row.get("bucket_cap_mb")) is not None and (finite_number(row.get("gpus")) or 2) > 1:
        parts.append(f"bucket {finite_number(row['bucket_cap_mb']):g} MB")
    data = _plain_cell(row.get("data_kind"))
    if data is not None:
        parts.append("synthetic data" if data == "synthetic" else f"{data} (real data)")
    return " · ".join(parts) or "—"


def _count_words(number: float) -> str:
    """136,960 -> "137k", 11,173,962 -> "11.2M", 1.24e9 -> "1.24B": three significant digits."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if number >= scale:
            return f"{number / scale:.3g}{suffix}"
    return f"{number:.0f}"


def model_label(model: Any, runs: pd.DataFrame) -> str:
    """A model as its runs built it: the registry's name with the shape its records state (layers
    and parameters), so that a model shrunk by flags is not read as its namesake:
    "gpt2_small (2 layers, 137k params)"."""
    shapes = []
    for layers, parameters in zip(runs.get("num_layers", pd.Series(dtype=float)), runs.get("num_parameters", pd.Series(dtype=float))):
        words = ([f"{round(layers):,} layers"] if finite_number(layers) is not None else []) + (
            [f"{_count_words(float(parameters))} params"] if finite_number(parameters) is not None else []
        )
        if words and ", ".join(words) not in shapes:
            shapes.append(", ".join(words))
    return f"{model} ({' / '.join(shapes)})" if shapes else str(model)


class Peak(NamedTuple):
    """What an MFU is against: the rate and precision ("989 TFLOP/s dense bf16") and the part
    ("H100 SXM5"; "user override" for --peak-tflops), as the runs table names a record's peak
    (scalerepro.record.peak)."""

    rate: str
    part: str | None

    @property
    def label(self) -> str:
        return f"{self.rate} ({self.part})" if self.part else self.rate


def mfu_peak(rate: Any, part: Any) -> Peak | None:
    """The peak a run's MFU is against, from its ``peak_rate`` and ``peak_part``; None where it has none."""
    rate, part = _plain_cell(rate), _plain_cell(part)
    return None if rate is None else Peak(str(rate), None if part is None else str(part))


def _peaks(frame: pd.DataFrame) -> pd.Series:
    """Each row's MFU peak (None where the row has no MFU)."""
    if frame.empty or "mfu" not in frame.columns:
        return pd.Series([None] * len(frame), index=frame.index, dtype=object)
    column = lambda name: frame[name] if name in frame.columns else pd.Series(None, index=frame.index)  # noqa: E731
    return pd.Series(
        [mfu_peak(rate, part) if finite_number(mfu) is not None else None for mfu, rate, part in zip(frame["mfu"], column("peak_rate"), column("peak_part"))],
        index=frame.index,
        dtype=object,
    )


def mfu_header(peaks: Sequence[Peak | None]) -> tuple[str, list[str | None]]:
    """An MFU column's header and the note under each value: one peak for every row is named in
    the header (no notes); one part with several peaks names the part in the header and each
    row's rate and precision under its value; else each row's whole peak."""
    named = {peak for peak in peaks if peak is not None}
    parts = {peak.part for peak in named}
    if len(named) <= 1:
        return (f"MFU vs {named.pop().label}" if named else "MFU"), [None] * len(peaks)
    if len(parts) == 1 and None not in parts:
        return f"MFU vs the {parts.pop()} dense peak under it", [f"vs {p.rate}" if p else None for p in peaks]
    return "MFU vs the peak under it", [f"vs {p.label}" if p else None for p in peaks]


def mfu_columns(ok: pd.DataFrame, parallelism: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """The completed runs and the parallelism cells with an ``mfu_peak`` column (the note under
    each MFU naming what it is against, where the header cannot name it for every row), and
    each table's MFU header. A parallelism cell's peak is that of its runs."""
    peaks = _peaks(ok)
    header_runs, notes = mfu_header(list(peaks))
    ok = ok.assign(mfu_peak=notes)
    cell_peaks: list[Peak | None] = []
    keys = [key for key in ("model", "gpus", "parallel", "variant") if key in parallelism.columns and key in ok.columns]
    for _, cell in parallelism.iterrows():
        runs = ok.loc[(ok[keys] == cell[keys]).all(axis=1)] if keys else ok.iloc[0:0]
        found = {peak for peak in peaks.loc[runs.index] if peak is not None}
        # the runs of a cell share a precision and a device; several peaks would be a mixed cell
        cell_peaks.append(found.pop() if len(found) == 1 and finite_number(cell.get("mfu")) is not None else None)
    header_parallelism, notes = mfu_header(cell_peaks)
    parallelism = parallelism.assign(mfu_peak=notes) if not parallelism.empty else parallelism
    return ok, parallelism, {"runs": header_runs, "parallelism": header_parallelism}


def device_facts(device_name: Any, device_type: Any, memory_bytes: Any, inventory: Any, limits_w: Sequence[float] = ()) -> dict[str, Any]:
    """The device a figure ran on, as the reader needs it: the part with its form factor (from the
    GPU peak table), its memory, and its power limit: ``limits_w``, its runs' (their records', or
    the inventory's beside them), else where the study's inventory (NVML) has it."""
    name = _plain_cell(device_name)
    if _plain_cell(device_type) == "cpu":
        return {"name": name or "a CPU", "text": f"{name or 'a CPU'} (CPU: no GPU, no MFU)", "cpu": True}
    key = gpu_peaks.peaks_key(name)
    if key is None:
        form = "form factor unknown (not in the GPU peak table)"
    elif gpu_peaks.names_no_form_factor(name):
        form = f"{gpu_peaks.PEAKS[key].model} assumed (the name gives no form factor)"
    else:
        form = gpu_peaks.PEAKS[key].model
    gpus = inventory.get("gpus") if isinstance(inventory, Mapping) else None
    limits = sorted(set(limits_w)) or sorted(
        {limit for gpu in gpus or () if isinstance(gpu, Mapping) and gpu.get("name") == name and (limit := finite_number(gpu.get("power_limit_w"))) is not None}
    )
    if memory_bytes is None:
        memory_bytes = next((gpu.get("memory_bytes") for gpu in gpus or () if isinstance(gpu, Mapping) and gpu.get("name") == name), None)
    power = (
        f"power limit {' / '.join(f'{w:,.0f}' for w in limits)} W"
        if limits
        else "power limit not recorded (neither the records nor an inventory kept beside them name it)"
    )
    memory = gib(memory_bytes)
    parts = [form, *([f"{memory} memory"] if memory else []), power]
    return {
        "name": name or "an unnamed GPU",
        "text": f"{name or 'an unnamed GPU'} ({', '.join(parts)})",
        "cpu": False,
        "memory_bytes": finite_number(memory_bytes),
    }


# --------------------------------------------------------------------------------------------
# The headline
# --------------------------------------------------------------------------------------------


# cells.csv column -> what the headline calls it: a cell's figure is its median over its counted repeats
CELL_FIGURES = {
    "samples_per_s_median": "samples_per_s",
    "tokens_per_s_median": "tokens_per_s",
    "repeats_ok": "repeats",
    "samples_per_s_min": "min",
    "samples_per_s_max": "max",
}


def _fastest(cells: pd.DataFrame, ok: pd.DataFrame, inventory: Any) -> dict[str, Any] | None:
    """The cell (cells.csv rows) with the highest median throughput, with what it takes to read
    it: its unit, configuration, device, MFU and its peak, peak memory against the card's, and
    its spread, clocks and provenance (cell_facts, over the cell's counted runs ``ok``)."""
    if cells.empty:
        return None
    row = cells.loc[cells["samples_per_s_median"].idxmax()]
    top = {CELL_FIGURES.get(key, key): _plain_cell(value) for key, value in row.items()}
    runs = ok[ok["cell"].eq(row["cell"])]
    clocks = cell_facts.clocks(runs, inventory)
    limits = [clocks["power_limit_w"]] if clocks and clocks.get("power_limit_w") is not None and clocks.get("power_limit_basis") != "the inventory" else []
    device = device_facts(top.get("device_name"), top.get("device_type"), top.get("gpu_memory_bytes"), inventory, limits)
    memory, capacity = finite_number(top.get("peak_memory_bytes")), device.get("memory_bytes")
    unit = throughput_unit(top.get("tokens_per_s"), top.get("tokens_per_sample"))
    tokens = (finite_number(top.get("tokens_per_sample")) or 0) > 0
    return {
        **top,
        "config": describe_config(top, "rank" if device["cpu"] else "GPU"),
        "unit": unit,
        # a language model's figure is its tokens/s: sequences of one length are not comparable across lengths
        "median": top.get("tokens_per_s") if unit == "tokens/s" else top.get("samples_per_s"),
        # one run's figure is its window's mean (samples / window seconds), not a median: its median
        # step's rate is shown beside it
        "window_mean": len(runs) == 1,
        "median_step": cell_facts.median_step_rate(runs, tokens),
        "mfu_peak": mfu_peak(top.get("peak_rate"), top.get("peak_part")) if top.get("mfu") is not None else None,
        "device": device,
        "memory": gib(memory),
        "memory_share": memory / capacity if memory is not None and capacity else None,
        "spread": cell_facts.spread(runs, tokens),
        "clocks": clocks,
        "hottest": cell_facts.hottest_run(runs, tokens) if clocks else None,
        "provenance": cell_facts.provenance(runs),
        # the largest loss spike of the cell's runs (record.columns.loss_spike): the figure came from a run that misbehaved
        "loss_spike": next((str(spike) for spike in runs.get("loss_spike", pd.Series(dtype=object)).dropna()), None),
    }


def _strong_rows(scaling: pd.DataFrame) -> dict[Any, dict[str, Any]]:
    """Per model, the strong-scaling row at its largest GPU count, only where the model's strong
    study ran two counts or more: at one count the efficiency is 1 by definition, not a finding."""
    found: dict[Any, dict[str, Any]] = {}
    if not {"study", "model", "gpus", "efficiency"} <= set(scaling.columns):
        return found
    strong = scaling[(scaling["study"] == "strong") & scaling["gpus"].notna()]
    for model, group in strong.groupby("model", sort=True):
        measured = group[group["efficiency"].notna()]
        if measured["gpus"].nunique() >= 2:
            found[model] = {key: _plain_cell(value) for key, value in measured.loc[measured["gpus"].idxmax()].items()}
    return found


def headline(runs: pd.DataFrame, cells: pd.DataFrame, scaling: pd.DataFrame, inventory: Any = None) -> list[dict[str, Any]]:
    """Per model: the fastest cell at 1 GPU and at the largest GPU count it ran on (its median
    over its counted repeats, cells.csv's: so one lucky repeat cannot win), each with its unit,
    configuration, device, MFU and its peak, peak memory and capacity, n and range; and the
    strong-scaling row at the largest count where the strong study scaled the model."""
    ok = counting_runs(runs)
    out: list[dict[str, Any]] = []
    if {"cell", "model", "gpus", "samples_per_s_median"} <= set(cells.columns):
        measured = cells[cells["samples_per_s_median"].notna() & cells["gpus"].notna() & cells["repeats_ok"].gt(0)]
        for model, of_model in measured.groupby("model", sort=True):
            max_gpus = _plain_cell(of_model["gpus"].max())
            out.append(
                {
                    "model": model,
                    "label": model_label(model, ok[ok["model"].eq(model)]),
                    "one": _fastest(of_model[of_model["gpus"] == 1], ok, inventory),
                    "max_gpus": max_gpus,
                    "at_max": _fastest(of_model[of_model["gpus"] == max_gpus], ok, inventory) if max_gpus != 1 else None,
                }
            )
    strong_rows = _strong_rows(scaling)
    for item in out:
        item["strong"] = strong_rows.pop(item["model"], None)
    # A model with a strong-scaling row but no completed run with a throughput still shows it.
    out += [
        {"model": model, "label": model_label(model, ok[ok["model"].eq(model)]), "one": None, "max_gpus": None, "at_max": None, "strong": row}
        for model, row in strong_rows.items()
    ]
    return out


def headline_section(runs: pd.DataFrame, cells: pd.DataFrame, scaling: pd.DataFrame, inventory: Any = None) -> dict[str, Any]:
    """The headline, grouped by unit (img/s, tokens/s, samples/s: a column header carries the
    unit), with what is common to its figures said once: the device, the peak MFU is against."""
    items = headline(runs, cells, scaling, inventory)
    figures = [f for item in items for f in (item["one"], item["at_max"]) if f is not None]
    groups: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        figure = item["one"] or item["at_max"]
        groups.setdefault(figure["unit"] if figure else "samples/s", []).append(item)
    devices = list(dict.fromkeys(f["device"]["text"] for f in figures))
    header, notes = mfu_header([f["mfu_peak"] for f in figures])
    for figure, note in zip(figures, notes):
        figure["mfu_note"] = note
    # what a column's figures are: medians over repeats, one run's window mean, or both kinds
    kinds = {unit: {f["window_mean"] for item in rows for f in (item["one"], item["at_max"]) if f is not None} for unit, rows in groups.items()}
    words = {unit: "Window mean" if kind == {True} else "Median" if kind == {False} else "Median (n = 1: window mean)" for unit, kind in kinds.items()}
    return {
        "rows": items,
        "figure_words": words,
        "groups": [(unit, groups[unit]) for unit in ("img/s", "tokens/s", "samples/s") if unit in groups],
        "devices": devices,
        "scaled": any(item["at_max"] is not None or item["strong"] is not None for item in items),
        "mfu_header": header,
        "cpu": bool(figures) and all(f["device"]["cpu"] for f in figures),
        "mfu": any(f.get("mfu") is not None for f in figures),  # no column of dashes where nothing has a peak (a CPU)
    }


# --------------------------------------------------------------------------------------------
# What the study was
# --------------------------------------------------------------------------------------------


def study_identity(config: Any, runs: pd.DataFrame) -> dict[str, Any]:
    """The study's name (config ``study_name``) and what it was, from the GPU counts it planned:
    a scaling study runs two counts or more; a study at one count is a benchmark, not scaling."""
    name = config.get("study_name") if isinstance(config, Mapping) else None
    counts = sorted({round(g) for g in (finite_number(v) for v in runs.get("gpus", pd.Series(dtype=float))) if g is not None})
    types = set(runs["device_type"].dropna()) if "device_type" in runs.columns else set()
    cpu = types == {"cpu"}
    word = "rank" if cpu else "GPU"
    if not counts:
        kind, scope = "Study with no runs", "no run was planned"
    elif len(counts) == 1:
        n = counts[0]
        kind = f"{'One' if n == 1 else n}-{word} benchmark"
        scope = f"every run used {n} {word}{'s' if n != 1 else ''}, so nothing was scaled: no scaling efficiency or speedup"
    else:
        kind, scope = f"Scaling study over {', '.join(map(str, counts))} {word}s", None
    if cpu:
        kind = f"CPU {kind[0].lower()}{kind[1:]}"
    phrase = kind if kind[:3].isupper() or kind[0].isdigit() else kind[0].lower() + kind[1:]  # "one-GPU benchmark", "CPU ..."
    return {"name": name, "kind": kind, "phrase": phrase, "scope": scope, "title": f"{kind} — {name}" if name else kind}
