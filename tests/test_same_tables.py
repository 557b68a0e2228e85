"""The tables of today's rebuild against the tables the code of commit 243d324 wrote from the same
files (tests/fixtures/tables-243d324, its README says how they were made): the kept H100 studies
and records, the kept CPU studies and the CPU record fixtures.

Each golden's input is copied to a temporary folder and rebuilt in this process by
``scalerepro.analysis.rebuild``'s command line (``main([...])``, without its figures: no table is
made from them); then every table the old code wrote is compared with today's, column by column
and by name: the same rows in the same order on the table's key columns (``KEYS``), and every
cell equal (numbers within a relative 1e-9, NaN equal to NaN), and ``summary.json`` key by key.
A difference is allowed only where ``EXPECTED`` names it, with why: a column a table gains or
loses, or whose values change (``"*"`` for the whole table). Every difference is reported at
once, one line each:

    <golden>/<table>.csv: <column>: <n> rows differ, e.g. row <i> (<key>): <old> -> <new>

The current list, without pytest (seconds per golden):

    .venv/bin/python tests/test_same_tables.py --show [golden ...]

or ``.venv/bin/pytest tests/test_same_tables.py -n 0`` (each golden is one test).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "fixtures" / "tables-243d324"
GPU = REPO / "benchmarks" / "gpu"
STUDIES = REPO / "tests" / "fixtures" / "studies"

# Eight rebuilds, a few seconds each: the slow tier.
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Golden:
    name: str  # the folder under tests/fixtures/tables-243d324
    source: Path  # what was rebuilt: a study folder (--results) or a folder of records (--records)
    records: bool  # rebuilt with --records <source> --out <folder>


GOLDENS = (
    Golden("h100-2026-11-26-study", GPU / "h100-2026-11-26" / "study-results", records=False),
    Golden("h100-2026-11-27-study", GPU / "h100-2026-11-27" / "study-results", records=False),
    Golden("h100-2026-11-25-records", GPU / "h100-2026-11-25", records=True),
    Golden("h100-2026-11-26-records", GPU / "h100-2026-11-26", records=True),
    Golden("h100-2026-11-27-records", GPU / "h100-2026-11-27", records=True),
    Golden("cpu-readme-a0f872f", STUDIES / "cpu-readme-a0f872f", records=False),
    Golden("cpu-records", REPO / "tests" / "fixtures" / "records", records=True),
    Golden("cpu-readme-243d324", STUDIES / "cpu-readme-243d324", records=False),
)

# The differences allowed, each with why: (table, column) -> reason. The column may be new in
# today's table, gone from it, or have other values; "*" allows anything of the table (a table
# that is new or gone). ("summary", "<key>") allows a key of summary.json ("status.ok" for a
# nested one).
_RECORD_MODEL = "new: a column of the record model's runs table (scalerepro.record)"
EXPECTED: dict[tuple[str, str], str] = {
    ("runs", "cell"): _RECORD_MODEL,
    ("runs", "ended_at"): _RECORD_MODEL,
    ("runs", "samples_per_gpu_step"): _RECORD_MODEL,
    ("runs", "peak_rate"): _RECORD_MODEL,
    ("runs", "peak_part"): _RECORD_MODEL,
    ("runs", "peak_clock_mhz"): _RECORD_MODEL,
    ("runs", "temperature_start_c"): _RECORD_MODEL,
    ("runs", "temperature_end_c"): _RECORD_MODEL,
    ("runs", "sm_clock_start_mhz"): _RECORD_MODEL,
    ("runs", "sm_clock_end_mhz"): _RECORD_MODEL,
    # the window's mean power is the energy counter's delta over it (NVML's samples are 1 s moving
    # averages that read low over a few seconds), and energy per sample divides the energy and the
    # samples of one window (scalerepro.record.columns.window_power, energy_per_sample)
    ("runs", "power_w"): "new: the window's mean power from the energy counter (record.columns.window_power)",
    ("runs", "power_basis"): "new: whether power_w is the energy counter's or the samples' mean",
    ("runs", "energy_per_sample_j"): "the energy and the samples of one window: the counter's mean power x the steps' seconds / their samples",
    ("runs", "energy_per_sample_net_j"): "the energy and the samples of one window, above the power before step 1",
    # a check of a name today's config defines means what it defines, at the study's threshold and
    # selection (rebuild._checks_as_defined_today): the 11-26 study judged GPU utilisation by a mean
    ("checks", "target"): "a check means what today's config defines: the worst run's GPU utilisation, a strict bound",
    ("checks", "unit"): "a check means what today's config defines: the gain's unit is a signed fraction",
    ("runs", "num_parameters"): _RECORD_MODEL,
    ("runs", "num_layers"): _RECORD_MODEL,
    ("runs", "loss_spike"): "new: a logged training loss far above its reference (scalerepro.record.columns.loss_spike)",
    ("runs", "preset_overrides"): "new: the levers where a run departs from its preset (a lever's run in a report of records)",
    ("runs", "final_train_loss"): "the last logged training loss, not the epoch's mean (the mean carried ResNet-18's 21.6 at step 10)",
    # a per-run check judges the measurements only: not a lever's run (ablation, sensitivity, a record
    # departing from its preset) nor a smoke run (scalerepro.analysis.tables.checking.lever_or_smoke)
    ("checks", "measured"): "per-run checks leave out lever and smoke runs",
    ("checks", "value"): "per-run checks leave out lever and smoke runs",
    ("checks", "detail"): "per-run checks leave out lever and smoke runs, and say so",
    ("checks", "status"): "per-run checks leave out lever and smoke runs: the CPU records all depart from their preset",
    ("summary", "checks.pass"): "per-run checks leave out lever and smoke runs",
    ("summary", "checks.not measured"): "per-run checks leave out lever and smoke runs",
    # a record's rerun in today's CLI, its machine paths cut (scalerepro.record.upgrade.rerun_command)
    ("matrix", "rerun"): "a record's command line in today's CLI, with no machine path",
    ("runs", "rerun"): "a record's command line in today's CLI, with no machine path",
    # rebuild --records writes the matrix it reads: with the cell each record ran in (scalerepro.record.cell)
    ("matrix", "cell"): "the matrix names each run's cell: the records' cells under rebuild --records",
    # a CPU record from before schema 4 read its data wait on the host, a CPU's only clock
    # (scalerepro.telemetry.metrics.StepTimer): the upgrade states it (the GPU ones stay empty, withheld)
    ("runs", "data_wait_clock"): "a CPU record before schema 4 states its data wait's clock: the host's, a CPU's only one",
    # one definition of a cell: every table names a cell as the matrix does (scalerepro.record.cell)
    ("parallelism", "cell"): "a parallelism row's cell is its name, the matrix's (parallelism_gpt2_small_g2_fsdp), not a label of its own",
    ("cells", "*"): "new: every cell's statistics, as its study's table states them (the headline reads them)",
    # each table's SHA-256, which the report and the figures check first (analysis/tables/table_digests.py)
    ("summary", "table_sha256"): "new: the digest of every table the aggregation wrote",
    # a figure is set beside runs of its own GPU part only: an H100 PCIe figure is another part beside
    # SXM5 runs, and a model without a figure says on which part (published_conditions.gpu_part)
    ("published_comparison", "why"): "the GPU part, not the chip: H100 PCIe figures are another part beside H100 SXM5 runs",
    # like for like needs the same compile mode and memory format: ResNet-50's Lambda figure is the
    # nearest PyTorch figure, a row of its own; a per-GPU figure is a lower bound only under data
    # parallelism (issue 66; published_conditions.LIKE_FOR_LIKE, published_comparison.per_gpu_note)
    ("published_comparison", "*"): "like for like needs the same compile and memory format (a nearest row where none is); per-GPU notes by parallelism",
    # the walk starts from the like-for-like figure or else the nearest, and a step within the spread
    # of its runs explains nothing (gap_walk._within_spread)
    ("gap_walk", "like_reference"): "the walk's first figure is named by start_role and start_reference (like for like, or the nearest)",
    ("gap_walk", "start_role"): "new: whether the walk starts from the like-for-like figure or the nearest",
    ("gap_walk", "start_reference"): "new: the walk's first figure (was like_reference)",
    ("gap_walk", "within_spread"): "new: a step within the spread of the runs it compares is no lever's effect",
    # a regime's error bar only for a row comparable to its back-tested rows (their communication
    # share of the step, their micro-batches a step), and what each row assumes (issue 67)
    ("scaling_model", "comm_share"): "new: every all-reduce's time over the predicted step",
    ("scaling_model", "assumed_inputs"): "new: what a predicted row takes as given rather than measured",
    ("scaling_model", "typical_error"): "none where the row's communication share is far above its regime's back-tested rows'",
    ("scaling_model", "error_basis"): "says why a row not comparable to its regime's back-tested rows has no error bar",
    ("scaling_model", "cluster_note"): "says why a row not comparable to its regime's back-tested rows has no error bar",
    # a one-GPU study's predicted strong rows hold a global batch someone runs, not the one-GPU batch
    # split (issue 67; scaling_model.held_global_batch): rows that had no prediction have one (their
    # network and cluster, keys here, too), and global_batch_basis is new
    ("scaling_model", "*"): "a one-GPU study's predicted strong rows hold the one-GPU batch on each GPU of the largest count, capped",
}

# The columns that name a row of each table (unique in every golden); a table not named here, or
# whose key columns are gone, is compared row by row in order.
KEYS: dict[str, tuple[str, ...]] = {
    "runs": ("run_id",),
    "matrix": ("run_id",),
    "epochs": ("run_id", "epoch"),
    "loss_log": ("run_id", "step"),
    "ablation": ("model", "gpus", "variant"),
    "checks": ("check",),
    "communication": ("gpus", "size_bytes", "nodes", "backend"),
    "comparison": ("reference", "model", "gpus", "metric"),
    "cost": ("study",),
    "gap_walk": ("model", "device", "gpus", "start_reference", "step"),
    "loss_decomposition": ("study", "model", "gpus", "nodes"),
    "parallelism": ("model", "gpus", "nodes", "parallel", "variant"),
    "profiling": ("run_id",),
    "profiling_files": ("run_id", "path"),
    "profiling_kernels": ("run_id", "rank_in_run", "name"),
    "profiling_roofline": ("run_id", "rank_in_run", "kernel"),
    "published_comparison": ("role", "model", "device", "gpus", "study", "metric", "reference"),
    "scaling": ("study", "model", "gpus", "nodes"),
    "scaling_model": ("study", "model", "gpus", "nodes", "basis", "network", "cluster"),
    "sensitivity": ("model", "gpus", "bucket_cap_mb", "per_gpu_batch", "precision"),
}

REL_TOL = 1e-9
ABS_TOL = 1e-12  # a sum taken in another order can leave 1e-17 where there was 0
SHOWN = 100  # characters of a value in a message


@contextlib.contextmanager
def _no_figures(rebuild: Any) -> Iterator[None]:
    """The rebuild without its figures (matplotlib is most of its time; no table comes from them)."""
    plots = getattr(rebuild, "plots", None)
    if plots is None or not hasattr(plots, "draw"):
        yield
        return
    with mock.patch.object(plots, "draw", lambda *args, **kwargs: {}):
        yield


@contextlib.contextmanager
def _working_in(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def rebuild_golden(golden: Golden, work: Path) -> Path:
    """``golden``'s input copied under ``work`` and rebuilt with today's code as the golden was
    made: from ``work``, with the folders given relative to it (a records rebuild names its
    folder; profiling_files.csv holds the paths as given); the folder of the tables it wrote."""
    from scalerepro.analysis import rebuild

    shutil.copytree(golden.source, work / golden.source.name)
    shared = ["--references", str(REPO / "config" / "references.yaml"), "--templates", str(REPO / "report")]
    if golden.records:
        out = work / "out"
        argv = ["--records", golden.source.name, "--out", "out", "--config", str(REPO / "config" / "config.yaml"), *shared]
    else:
        out = work / golden.source.name
        argv = ["--results", golden.source.name, *shared]
        # The code of 243d324 counted a run whatever else held its machine; today a run whose
        # window other processes held more than half the CPUs of is not counted (13 of the 32 runs
        # of cpu-readme-a0f872f, 3 of cpu-readme-243d324: tests/test_study_evidence.py, and
        # test_scaling_model.py for what it does to the kept study's model). The golden is read
        # as that code read it, every run counted, so that a difference here is one of the code.
        config_file = out / "tables" / "config.json"
        config = json.loads(config_file.read_text())
        config["targets"] = {**(config.get("targets") or {}), "other_cpu_fraction_max": 1.0}
        config_file.write_text(json.dumps(config))
    stderr = io.StringIO()
    with _working_in(work), _no_figures(rebuild), contextlib.redirect_stderr(stderr):
        code = rebuild.main(argv)
    if code != 0:
        raise AssertionError(f"{golden.name}: rebuild {' '.join(argv)} exited {code}:\n{stderr.getvalue()[-3000:]}")
    return out / "tables"


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _missing(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array is a value
        return False


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def same_value(old: Any, new: Any) -> bool:
    """One cell: NaN equals NaN, numbers within REL_TOL (a column read as text on one side and as
    numbers on the other compares by number), anything else by its text."""
    if _missing(old) or _missing(new):
        return _missing(old) and _missing(new)
    a, b = _number(old), _number(new)
    if a is not None and b is not None:
        return a == b or math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return str(old) == str(new)


def _shown(value: Any) -> str:
    text = "NaN" if _missing(value) else repr(value.item() if hasattr(value, "item") else value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


# The EXPECTED entries some difference needed (``show`` names the others: stale, or not yet made).
USED: set[tuple[str, str]] = set()


def _allowed(table: str, column: str) -> bool:
    """Whether EXPECTED allows a difference found in ``column`` of ``table`` (noted in USED)."""
    for entry in ((table, column), (table, "*")):
        if entry in EXPECTED:
            USED.add(entry)
            return True
    return False


def _key_text(frame: pd.DataFrame, keys: list[str], row: int) -> str:
    if not keys:
        return "no key columns"
    return ", ".join(f"{key}={_shown(frame[key].iloc[row])}" for key in keys)


def _key_tuples(frame: pd.DataFrame, keys: list[str]) -> list[tuple[str, ...]]:
    return [tuple("NaN" if _missing(v) else str(v.item() if hasattr(v, "item") else v) for v in row) for row in frame[keys].itertuples(index=False)]


def compare_table(label: str, table: str, old: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """Every difference between the golden ``old`` and today's ``new`` not allowed by EXPECTED."""
    differences = []
    for column in old.columns:
        if column not in new.columns and not _allowed(table, column):
            differences.append(f"{label}: {column}: column gone (old values e.g. {_shown(old[column].iloc[0]) if len(old) else 'no rows'})")
    for column in new.columns:
        if column not in old.columns and not _allowed(table, column):
            differences.append(f"{label}: {column}: new column (e.g. {_shown(new[column].iloc[0]) if len(new) else 'no rows'})")
    keys = [key for key in KEYS.get(table, ()) if key in old.columns and key in new.columns]
    old_keys, new_keys = (_key_tuples(old, keys), _key_tuples(new, keys)) if keys else ([], [])
    if keys and old_keys != new_keys:
        gone = [k for k in old_keys if k not in set(new_keys)]
        added = [k for k in new_keys if k not in set(old_keys)]
        common = [k for k in old_keys if k in set(new_keys)]
        order = [k for k in new_keys if k in set(old_keys)] != common
        differences += (
            []
            if _allowed(table, "*")
            else [
                f"{label}: rows ({', '.join(keys)}): {len(old)} -> {len(new)} rows; {len(gone)} gone{', e.g. ' + str(gone[0]) if gone else ''}; "
                f"{len(added)} new{', e.g. ' + str(added[0]) if added else ''}{'; the common rows in another order' if order else ''}"
            ]
        )
        if len(set(old_keys)) != len(old_keys) or len(set(new_keys)) != len(new_keys):
            return differences + [f"{label}: key columns {keys} do not name one row each: cells not compared"]
        old_at = {k: i for i, k in enumerate(old_keys)}
        new_at = {k: i for i, k in enumerate(new_keys)}
        pairs = [(old_at[k], new_at[k]) for k in common]
    elif not keys and len(old) != len(new):
        differences.append(f"{label}: rows: {len(old)} -> {len(new)} rows (no key columns: the first {min(len(old), len(new))} compared in order)")
        pairs = [(i, i) for i in range(min(len(old), len(new)))]
    else:
        pairs = [(i, i) for i in range(len(old))]
    for column in old.columns:
        if column not in new.columns:
            continue
        old_values, new_values = old[column].tolist(), new[column].tolist()
        differ = [(i, j) for i, j in pairs if not same_value(old_values[i], new_values[j])]
        if differ and not _allowed(table, column):
            i, j = differ[0]
            differences.append(
                f"{label}: {column}: {len(differ)} rows differ, e.g. row {i} ({_key_text(old, keys, i)}): {_shown(old_values[i])} -> {_shown(new_values[j])}"
            )
    return differences


def _flat(document: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(document, dict) and document:
        return {key: value for name, item in document.items() for key, value in _flat(item, f"{prefix}{name}.").items()}
    return {prefix.rstrip("."): document}


def compare_summary(label: str, old: dict, new: dict) -> list[str]:
    old_flat, new_flat = _flat(old), _flat(new)
    differences = []
    for key in [*old_flat, *(k for k in new_flat if k not in old_flat)]:
        if key not in new_flat:
            found = f"{label}: {key}: key gone (old {_shown(old_flat[key])})"
        elif key not in old_flat:
            found = f"{label}: {key}: new key ({_shown(new_flat[key])})"
        elif old_flat[key] != new_flat[key] and not same_value(old_flat[key], new_flat[key]):
            found = f"{label}: {key}: {_shown(old_flat[key])} -> {_shown(new_flat[key])}"
        else:
            continue
        if not _allowed("summary", key):
            differences.append(found)
    return differences


def differences(golden: Golden, tables: Path) -> list[str]:
    """Every difference between ``golden``'s tables and those in ``tables`` that EXPECTED does not allow."""
    found = []
    folder = GOLDEN / golden.name
    old_tables = {path.stem for path in folder.glob("*.csv")}
    new_tables = {path.stem for path in tables.glob("*.csv")}
    for table in sorted(old_tables | new_tables):
        label = f"{golden.name}/{table}.csv"
        if table not in new_tables:
            if not _allowed(table, "*"):
                found.append(f"{label}: table gone")
        elif table not in old_tables:
            if not _allowed(table, "*"):
                found.append(f"{label}: new table ({', '.join(_read(tables / f'{table}.csv').columns)})")
        else:
            found += compare_table(label, table, _read(folder / f"{table}.csv"), _read(tables / f"{table}.csv"))
    label = f"{golden.name}/summary.json"
    if not (tables / "summary.json").is_file():
        found.append(f"{label}: no summary.json")
    else:
        found += compare_summary(label, json.loads((folder / "summary.json").read_text()), json.loads((tables / "summary.json").read_text()))
    return found


@pytest.mark.parametrize("golden", GOLDENS, ids=[golden.name for golden in GOLDENS])
def test_same_tables_as_243d324(golden: Golden, tmp_path: Path) -> None:
    found = differences(golden, rebuild_golden(golden, tmp_path))
    if found:
        pytest.fail(f"{len(found)} differences from the tables of 243d324 that EXPECTED does not allow:\n" + "\n".join(found), pytrace=False)


def test_every_golden_has_its_input() -> None:
    """Each golden folder is one of GOLDENS, and each holds the tables its rebuild wrote."""
    assert sorted(path.name for path in GOLDEN.iterdir() if path.is_dir()) == sorted(golden.name for golden in GOLDENS)
    for golden in GOLDENS:
        assert golden.source.is_dir(), golden.source
        assert (GOLDEN / golden.name / "runs.csv").is_file() and (GOLDEN / golden.name / "summary.json").is_file(), golden.name


def show(names: list[str]) -> int:
    """Print every difference of each golden (or those named), and any rebuild that failed."""
    chosen = [golden for golden in GOLDENS if not names or golden.name in names]
    unknown = sorted(set(names) - {golden.name for golden in GOLDENS})
    if unknown:
        print(f"no such golden: {', '.join(unknown)} (one of {', '.join(golden.name for golden in GOLDENS)})", file=sys.stderr)
        return 2
    total = 0
    for golden in chosen:
        with tempfile.TemporaryDirectory(prefix=f"same-tables-{golden.name}-") as work:
            try:
                found = differences(golden, rebuild_golden(golden, Path(work)))
            except Exception:  # a rebuild that fails is one finding among the others
                found = [f"{golden.name}: rebuild failed:\n" + traceback.format_exc()[-3000:]]
        total += len(found)
        print(f"== {golden.name}: {len(found)} differences")
        for line in found:
            print(line)
    print(f"== {total} differences in {len(chosen)} goldens")
    for (table, column), why in EXPECTED.items():
        if (table, column) not in USED:
            print(f"== EXPECTED ({table!r}, {column!r}) allowed no difference here ({why})")
    return 1 if total else 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "--show":
        print(__doc__)
        sys.exit(2)
    sys.exit(show(sys.argv[2:]))
