"""Profiles -> a few numbers per run, and the run's bottleneck.

    python -m scalerepro.analysis.profiles.captures summarize --run-dir results/profiles/<run> --run-id <run> \
        --gpu-peaks h100_sxm --thresholds '{...}' --out summary.json
    python -m scalerepro.analysis.profiles.captures table --summaries results/profiles/*/summary.json --out results/tables

What a profiling job leaves in ``results/profiles/<run>/<tool>/`` (``workflow/rules/profile.smk``):
``nsys/rank<R>.sqlite`` (``nsys export --type sqlite``), ``ncu/kernels.csv`` (``ncu --csv``,
long "details" layout: raw metric names as ``scalerepro.launching.nsight`` asks for them, or the
sections' display names of any ncu version) and ``torch/trace.json`` + ``torch/operators.csv``
(the torch.profiler fallback, ``scalerepro.telemetry.ranges``), each with a ``capture.json`` saying what
ran and why. What a reader cannot read (an unknown unit, a text value where a number belongs, a
kernel without a duration, a timeline without step ranges) is one line in the summary's
``warnings``, shown in the report; it never aborts the summary or reads as a figure. A capture
that failed (capture.json ``"status": "failed"``, a tool folder with a log and no capture.json,
or an ncu file with no table) is in ``failed_captures`` with the error its files hold
(``failures``), nothing of it is read, and the report says so.

Kernels by time: the timeline's (nsys, torch.profiler's CUDA trace: every kernel launched in the
window; the CPU fallback: the top ten operators); with ncu alone, every kernel ncu profiled
(``kernels.ncu_kernel_times``), whose times are one launch of each launch configuration:
``kernel_basis`` says what their sum and shares are of. The kernels' time by class
(``step_classes``, profiling.csv's ``class_*_s``) is what the step's breakdown reads (``step``).

Definitions. All times are over the profiling window W: from the start of the trainer's first
``scalerepro:step`` range (steps K .. K+M-1) to the later of the last step range's end and the end
of the last kernel launched inside the steps (the ranges are host time; the GPU runs on). An
export without step ranges gets the whole capture as W, labelled "whole capture (no step
ranges)", and its classification is provisional. |X| is the length of the union of intervals X.

    compute C          kernels that are not NCCL's (nsys, CUDA trace) / operators of the training
                       thread outside data loading (torch fallback on a CPU)
    communication N    NCCL kernels (nsys, CUDA trace) / gloo or NCCL collective ops (CPU)
    overlap            |N ∩ C|;  overlap fraction = |N ∩ C| / |N|
    exposed comm       |N \\ C| = |N| - |N ∩ C|   (communication nothing else hides)
    data wait          |D \\ (C ∪ N)|, D the host's ``scalerepro:data`` ranges: the device is idle
                       while the input pipeline is asked for the next batch
    idle               |W| - |C ∪ N| - data wait
    busy fraction      |C ∪ N| / |W|   (GPU busy fraction on a GPU)
    compute + exposed comm + data wait + idle = |W|, and each fraction is that time / |W|.

Roofline (Nsight Compute, per kernel, over its launches that have a duration; one without is
reported as missing, never as 0 s): FLOPs = FADD + FMUL + 2 FFMA (fp32, and likewise fp16 and
fp64 from the SASS thread-instruction counters), achieved FLOP/s = FLOPs / gpu__time_duration,
DRAM bytes = dram__bytes.sum (or, from sections only, DRAM bytes/s x duration),
arithmetic intensity AI = FLOPs / dram__bytes, attainable = min(peak FLOP/s, AI x peak DRAM B/s),
ridge = peak FLOP/s / peak DRAM B/s: a kernel left of the ridge is memory-bound. The SASS
counters do not see tensor-core work: a kernel's tensor-core FLOPs are estimated as tensor-pipe
utilisation x duration x the dense tensor peak of the run's precision, added to its SASS FLOPs,
and it is set against that tensor roof (``tensor_work`` says how, or why the tensor-core work
could not be counted). On Hopper the dense peak is wgmma's: a kernel whose tensor pipe is busy
with no wgmma instruction (mma.sync, or HFMA2.MMA in elementwise kernels) gets no estimate, and
one whose pipe ran only the HFMA2.MMA its SASS counters hold is a CUDA-core kernel, under the
CUDA-core roof of its precision (fp32, fp64, or the non-tensor fp16/bf16 rate). The peaks are those of the GPU the capture names (the GPU peak table,
``scalerepro.common.gpu_peaks``, matched by device name: H100, H200, GH200, H800, A100) and of the run's
precision; the configured ``profiling.gpu_peaks`` applies only when the capture names no GPU.

Classification (thresholds from the config, ``profiling.classification``): each candidate has a
score = fraction / its threshold, communication-bound (exposed comm), input-bound (data wait),
launch/latency-bound (idle); the largest score of at least 1 names the bottleneck, else the run
is compute-bound. The evidence lists every fraction against its threshold.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.columns import FILE_COLUMNS, KERNEL_COLUMNS, PROFILING_COLUMNS, ROOFLINE_COLUMNS
from scalerepro.analysis.profiles.classify import DEFAULT_THRESHOLDS, classify
from scalerepro.analysis.profiles.failures import failure
from scalerepro.analysis.profiles.intervals import WHOLE_CAPTURE, ProfileError, breakdown, top_calls
from scalerepro.analysis.profiles.kernels import kernel_class, ncu_kernel_times, short_name
from scalerepro.analysis.profiles.ncu import read_ncu_csv
from scalerepro.analysis.profiles.nsys import read_nsys_metadata, read_nsys_sqlite
from scalerepro.analysis.profiles.roofline import precision_of_capture, resolve_peaks, roofline
from scalerepro.analysis.profiles.step import capture_classes, mean_classes, profile_columns, timeline_classes
from scalerepro.analysis.profiles.torch_trace import read_operator_table, read_torch_trace
from scalerepro.common.cli import OneLineErrorParser, error_boundary
from scalerepro.common.files import write_text_atomically
from scalerepro.common.range_names import RANGE_PREFIX
from scalerepro.record.read import read

# --------------------------------------------------------------------------------------------
# One run's summary, and the study's tables
# --------------------------------------------------------------------------------------------


def _mean_breakdown(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run's figures: the mean over its profiled ranks (numbers), the first rank's labels."""
    frame = pd.DataFrame(parts)
    numeric = frame.select_dtypes("number").mean().to_dict()
    return {**{k: v for k, v in parts[0].items() if k not in numeric}, **numeric, "ranks": len(parts), "provisional": any(p["provisional"] for p in parts)}


def _files(run_dir: Path) -> list[dict[str, Any]]:
    kinds = {
        ".sqlite": "Nsight Systems SQLite export",
        ".nsys-rep": "Nsight Systems report",
        ".ncu-rep": "Nsight Compute report",
        ".json": "JSON",
        ".csv": "CSV table",
        ".log": "log",
    }
    descriptions = {
        "trace.json": "Chrome/Perfetto trace (torch.profiler)",
        "operators.csv": "operator table (torch.profiler)",
        "kernels.csv": "Nsight Compute metrics (CSV)",
        "capture.json": "what the profiling job ran",
    }
    return [
        {"path": str(p), "description": descriptions.get(p.name, kinds.get(p.suffix, p.suffix)), "bytes": p.stat().st_size}
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != "summary.json"
    ]


def _read_captures(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Each tool's capture.json, by tool; a tool's folder with the job's log but no capture.json
    is a job that died before writing it."""
    captures = {p.parent.name: json.loads(p.read_text()) for p in sorted(run_dir.glob("*/capture.json"))}
    for log in sorted(run_dir.glob("*/profile.log")):
        captures.setdefault(
            log.parent.name, {"tool": log.parent.name, "status": "failed", "exit_code": None, "reason": "the profiling job left no capture.json"}
        )
    if not captures:
        raise ProfileError(f"{run_dir}: no <tool>/capture.json: the profiling job did not run")
    return captures


def _timeline_gpus(metadata: list[dict[str, Any]]) -> list[str]:
    """The GPU names the timelines' exports hold (ncu's compute capabilities left out)."""
    return [re.sub(r"\s*\(compute capability [^)]*\)$", "", g) for m in metadata for g in m.get("gpus") or [] if "(ncu)" not in g]


def summarize(
    run_dir: str | os.PathLike[str],
    run_id: str,
    thresholds: Mapping[str, float],
    peaks: Mapping[str, Any] | None,
    configured_peaks: str | None = None,
    precision: str | None = None,
    device_name: str | None = None,
) -> dict[str, Any]:
    """Everything one run's profiles say (see the module docstring), as a JSON-ready dict, with
    ``warnings``: one line per thing that makes a figure missing or provisional.

    The roofline's peaks: ``peaks`` as given, or (None) those of the GPU peak table's entry for the GPU the
    capture ran on (``device_name``, else the GPU names in the nsys export) and of the run's
    precision (``precision``, else the --precision on a capture's command line); see
    resolve_peaks."""
    run_dir = Path(run_dir)
    captures = _read_captures(run_dir)
    failed = {tool: failure(run_dir / tool, capture) for tool, capture in captures.items() if capture.get("status") == "failed"}
    parts: list[dict[str, Any]] = []
    top: list[dict[str, Any]] = []
    operators: list[dict[str, Any]] = []
    warnings: list[str] = []
    metadata: list[dict[str, Any]] = []
    classes: list[dict[str, Any]] = []  # per rank, its window split by kernel class (step.timeline_classes)
    for path in sorted((run_dir / "nsys").glob("*.sqlite")) if "nsys" not in failed else ():
        metadata.append({k: v for k, v in read_nsys_metadata(path).items() if k != "tables"})
        for timeline in read_nsys_sqlite(path):
            parts.append(breakdown(timeline))
            classes += [c for c in [timeline_classes(timeline)] if c]
            if timeline.provisional:
                warnings.append(f"{timeline.rank}: no {RANGE_PREFIX}step ranges: window: {WHOLE_CAPTURE}; its classification is provisional")
            if not top:
                top = _kernels_of_window(timeline)
    # torch/ normally; under nsys/ or ncu/ when that tool was missing on the node and the job fell back
    trace = next(iter(sorted(p for p in run_dir.glob("*/trace.json") if p.parent.name not in failed)), None)
    if not parts and trace is not None:
        timeline = read_torch_trace(trace)
        parts.append(breakdown(timeline))
        classes += [c for c in [timeline_classes(timeline)] if c]
        top = _kernels_of_window(timeline) if classes else top_calls(timeline.calls)
        if (trace.parent / "operators.csv").is_file():
            operators = read_operator_table(trace.parent / "operators.csv")
    kernels_csv = run_dir / "ncu" / "kernels.csv"
    roof: list[dict[str, Any]] = []
    kernel_basis = None
    peaks_basis = "as given" if peaks else None
    reading = None
    if kernels_csv.is_file() and "ncu" not in failed:
        try:
            reading = read_ncu_csv(kernels_csv)
        except ProfileError as error:  # ncu ran, but wrote no table (e.g. no access to the counters)
            failed["ncu"] = failure(run_dir / "ncu", {"exit_code": (captures.get("ncu") or {}).get("exit_code")}, str(error))
    if reading is not None:
        metadata.append(
            {
                "file": "ncu/kernels.csv",
                "layout": reading.layout,
                "tool_version": (captures.get("ncu") or {}).get("tool_version"),
                "gpus": [f"compute capability {cc} (ncu)" for cc in reading.compute_capabilities],
            }
        )
        warnings += reading.problems
        if not top:  # no timeline (ncu alone): the kernels by time are ncu's, and say what they are of
            top, kernel_basis = ncu_kernel_times(reading.launches)
            classes = [capture_classes(top)]
        if peaks is None:
            precision = precision or precision_of_capture(captures)
            devices = [device_name] if device_name else _timeline_gpus(metadata)
            peaks, peaks_basis = resolve_peaks(devices, configured_peaks, precision)
            if peaks is None:
                warnings.append(f"roofline: {peaks_basis}")
        if peaks:
            roof = roofline(reading.launches, peaks)
            warnings += roofline_warnings(roof)
    warnings[:0] = [f"{tool} capture failed: {line}" for tool, line in ((t, f["error"]) for t, f in failed.items())]
    figures = _mean_breakdown(parts) if parts else {}
    fallback = [c for c in captures.values() if c.get("fallback_reason") and c.get("status") != "failed"]
    return {
        "run_id": run_id,
        "tools": sorted(captures),
        "fallback": bool(fallback),
        "fallback_reason": fallback[0]["fallback_reason"] if fallback else None,
        "captures": captures,
        "capture_metadata": metadata,
        "breakdown": figures or None,
        "per_rank": parts,
        "top_kernels": top,
        "kernel_basis": kernel_basis,
        # the kernels' time by class (step.py): every launch of the window, or ncu's one launch per configuration
        "step_classes": mean_classes(classes),
        "failed_captures": failed,
        "operators": operators,
        "roofline": roof,
        "gpu_peaks": dict(peaks) if peaks else None,
        "peaks_basis": peaks_basis,
        "classification": classify(figures, thresholds) if figures else None,
        "warnings": warnings,
        "files": _files(run_dir),
    }


def _kernels_of_window(timeline: Any) -> list[dict[str, Any]]:
    """Every kernel launched in a timeline's window, by total time, each with its class (the step's
    breakdown counts launches per class from them)."""
    start, end = timeline.window
    calls = timeline.calls[(timeline.calls["end"] > start) & (timeline.calls["start"] < end)]
    return [{**row, "class": kernel_class(row["name"])} for row in top_calls(calls, count=max(len(calls), 1))]


def roofline_warnings(roof: Sequence[Mapping[str, Any]], named: int = 3) -> list[str]:
    """One line per thing the roofline could not measure, with how many kernels lack it and the
    first few of them by time (one line per kernel buried the capture's other warnings)."""
    lacking: dict[str, list[str]] = {}
    for row in roof:
        if row["missing"]:
            lacking.setdefault(row["missing"], []).append(short_name(row["kernel"], 60))
    return [
        f"roofline: {len(names)} of {len(roof)} kernels have no {what}: {', '.join(names[:named])}{', …' if len(names) > named else ''}"
        for what, names in lacking.items()
    ]


def _capture_facts(summary: Mapping[str, Any]) -> dict[str, str | None]:
    """Tool versions, GPUs and driver as the captures record them (profiling.csv columns)."""
    meta = summary.get("capture_metadata") or []
    versions = [c.get("tool_version") for c in (summary.get("captures") or {}).values()] + [m.get("tool_version") for m in meta]

    def joined(values: Iterable[Any]) -> str | None:
        return "; ".join(dict.fromkeys(str(v) for v in values if v)) or None

    return {"tool_versions": joined(versions), "gpus": joined(g for m in meta for g in m.get("gpus") or []), "driver": joined(m.get("driver") for m in meta)}


def tables(summaries: Iterable[Mapping[str, Any]]) -> dict[str, pd.DataFrame]:
    """profiling.csv (one row per profiled run), profiling_kernels.csv (its top kernels or
    operators), profiling_roofline.csv (Nsight Compute kernels), profiling_files.csv (raw files)."""
    runs, kernels, roof, files = [], [], [], []
    for s in summaries:
        b = s.get("breakdown") or {}
        c = s.get("classification") or {}
        runs.append(
            {
                **{k: b.get(k) for k in PROFILING_COLUMNS},
                "run_id": s["run_id"],
                "tools": " ".join(s["tools"]),
                "fallback": s["fallback"],
                "fallback_reason": s["fallback_reason"],
                "classification": c.get("class"),
                "provisional": c.get("provisional"),
                "evidence": c.get("evidence"),
                **_capture_facts(s),
                "warnings": "\n".join(s.get("warnings") or []) or None,
            }
        )
        runs[-1]["kernel_basis"] = (s.get("kernel_basis") or {}).get("what")
        runs[-1].update(profile_columns(s.get("step_classes")))
        runs[-1]["capture_errors"] = "\n".join(f"{tool}: {f['error']}" for tool, f in (s.get("failed_captures") or {}).items()) or None
        kernels += [{"run_id": s["run_id"], "rank_in_run": i + 1, **k} for i, k in enumerate(s["top_kernels"])]
        peak_bw = (s.get("gpu_peaks") or {}).get("dram_bytes_per_s")
        # numbered by time as the kernels are (both longest first, ties by name): the report's tables and figure share the numbers
        roof += [
            {"run_id": s["run_id"], "rank_in_run": i + 1, **k, "peak_dram_bytes_per_s": peak_bw, "peaks_basis": s.get("peaks_basis")}
            for i, k in enumerate(s["roofline"])
        ]
        files += [{"run_id": s["run_id"], **f} for f in s["files"]]
    return {
        "profiling": pd.DataFrame(runs, columns=PROFILING_COLUMNS),
        "profiling_kernels": pd.DataFrame(kernels, columns=KERNEL_COLUMNS),
        "profiling_roofline": pd.DataFrame(roof, columns=ROOFLINE_COLUMNS),
        "profiling_files": pd.DataFrame(files, columns=FILE_COLUMNS),
    }


def study_summaries(results: Path, config: Mapping[str, Any], matrix: pd.DataFrame) -> tuple[list[dict[str, Any]], list[str]]:
    """Every profiled run's summary of a study's results folder, made again from its captures with
    today's code (what ``rebuild`` needs to read an old study with today's analysis) and written
    to its summary.json; a run whose captures are gone keeps the summary.json it has. The
    profile_summary rule's inputs: the classification thresholds and configured peaks of the
    config, the run's precision from the matrix and its GPU from its record (``record_file``:
    readers.read_matrix's). A profile folder of a run the matrix does not plan is another study's:
    left out, and named in the second list."""
    profiling = config.get("profiling") or {}
    thresholds = {**DEFAULT_THRESHOLDS, **(profiling.get("classification") or {})}
    planned = matrix.set_index("run_id") if "run_id" in matrix.columns else pd.DataFrame()
    summaries, left_out = [], []
    for run_dir in sorted(p for p in (results / "profiles").glob("*") if p.is_dir()):
        if run_dir.name not in planned.index:
            left_out.append(f"profiles/{run_dir.name}: a profile of a run this study did not plan: not shown")
            continue
        kept = run_dir / "summary.json"
        if not any(child.is_dir() for child in run_dir.iterdir()):
            if kept.is_file():
                summaries.append(json.loads(kept.read_text()))
            continue
        row = planned.loc[run_dir.name]
        device = _device_of(Path(str(row.get("record_file") or "")))
        summary = summarize(run_dir, run_dir.name, thresholds, None, profiling.get("gpu_peaks"), str(row.get("precision") or "") or None, device)
        write_text_atomically(kept, json.dumps(summary, indent=2, default=str) + "\n")
        summaries.append(summary)
    return summaries, left_out


def _device_of(record_file: Path) -> str | None:
    """The GPU a run's record names, None where it has no readable record (the capture's own name then decides)."""
    try:
        return read(record_file).record.hardware.gpu.name
    except (OSError, ValueError):
        return None


_PROG = "scalerepro.analysis.profiles.captures"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("summarize", help="one run's profiles -> summary.json")
    one.add_argument("--run-dir", required=True, type=Path, help="results/profiles/<run>")
    one.add_argument("--run-id", required=True)
    one.add_argument("--gpu-peaks", required=True, help="the gpu_peaks entry for roofline fractions when the capture names no GPU")
    one.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16", "fp8"], help="the run's precision (default: the capture's --precision)")
    one.add_argument("--device-name", help="the GPU as NVML names it (default: the nsys export's GPU names)")
    one.add_argument("--thresholds", required=True, type=json.loads, help="classification thresholds as JSON")
    one.add_argument("--out", required=True, type=Path)
    many = commands.add_parser("table", help="every run's summary.json -> the profiling tables")
    many.add_argument("--summaries", nargs="*", default=[], type=Path)
    many.add_argument("--out", required=True, type=Path, help="directory of the CSV tables")
    args = parser.parse_args(argv)
    if args.command == "summarize":
        summary = summarize(args.run_dir, args.run_id, {**DEFAULT_THRESHOLDS, **args.thresholds}, None, args.gpu_peaks, args.precision, args.device_name)
        write_text_atomically(args.out, json.dumps(summary, indent=2, default=str) + "\n")
        for warning in summary["warnings"]:
            print(f"profile: {args.run_id}: warning: {warning}", file=sys.stderr)
        verdict = (summary["classification"] or {}).get("class", "no breakdown")
        provisional = " (provisional)" if (summary["classification"] or {}).get("provisional") else ""
        print(f"profile: {args.run_id}: {verdict}{provisional} ({', '.join(summary['tools'])})", file=sys.stderr)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, table in tables(json.loads(p.read_text()) for p in args.summaries).items():
            write_text_atomically(args.out / f"{name}.csv", table.to_csv(index=False))
        print(f"profile: {len(args.summaries)} profiled runs -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
