"""Compare two stored studies cell by cell: did the driver, NCCL or container upgrade, the new
partition, the other cluster or the trainer change make the study faster or slower?

    python -m scalerepro.analysis.history.compare BASELINE CANDIDATE [--store results/history.duckdb] \
        [--threshold 0.03] [--csv versus_baseline.csv] [--json versus_baseline.json]

BASELINE and CANDIDATE each name a study: a study id (or a unique prefix of one), ``latest``, a
git commit, a cluster name or ``CLUSTER:PARTITION`` (these pick the most recent matching study
other than the other side, so ``latest`` compared with the newest study means the one before
it), a study's store receipt (results/tables/store.json), or a bundle (``scalerepro.analysis.history.bundle``;
verified, its rows held to its records, and read without importing it).

Definitions. A *cell* is a study's cell (its matrix names it: study kind, model, GPU count,
variant; scalerepro.record.cell) at one precision and per-GPU batch (``columns.CELL_KEYS``); its
runs are the repeats that count (completed, record agrees with the plan). b and c are the
samples/s of a cell's runs in the baseline and the candidate.

    ratio      R = median(c) / median(b)                      (> 1: the candidate is faster)
    interval   percentile bootstrap at ``--confidence`` (95 %): resample b and c with replacement,
               ``--resamples`` times (10,000), R* = median(c*) / median(b*) each time; the
               interval is the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of R*.
               Seeded (``--seed``) per cell, so the same stores give the same intervals.
    verdict    faster: the interval lies above 1 and R > 1 + threshold; slower: it lies below 1
               and R < 1 - threshold; otherwise "no significant change". A cell needs two runs
               that count on each side for an interval ("too few repeats" otherwise); a cell of
               one study only is "only in baseline" / "only in candidate".
    differs    the environment facts of the cell's runs that are not the same on both sides:
               driver, NCCL, CUDA, torch, container, commit (and dirty flag), hosts, node
               count, cluster, partition, device. Study-wide differences (and the config keys
               that differ, which make the studies measure different things) are in --json.

Exit status: 0, or 1 with ``--fail-on-slower`` when a cell is slower; 2 on bad input (one line).
This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalerepro.analysis.columns import CELL_KEYS, CELL_SHOWN, VERSUS_COLUMNS, VERSUS_VERDICTS
from scalerepro.analysis.history import bundle, store, store_file, study_rows
from scalerepro.analysis.history.bundle import BundleError
from scalerepro.analysis.history.store_file import StoreError
from scalerepro.common.cli import OneLineErrorParser, bounded_float, bounded_int, error_boundary, output_path
from scalerepro.common.files import write_text_atomically

DEFAULT_THRESHOLD = 0.03
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
# Environment facts of a run (label -> column of the runs table) and of a study.
RUN_FACTS = {
    "driver": "driver_version",
    "NCCL": "nccl_version",
    "CUDA": "cuda_version",
    "torch": "torch_version",
    "commit": "commit",  # git_commit with a dirty mark, derived below
    "hosts": "node_list",
    "node count": "nodes",
    "cluster": "cluster",
    "partition": "partition",
    "device": "device_name",
}
STUDY_FACTS = {
    "driver": "driver_version",
    "NCCL": "nccl_version",
    "CUDA": "cuda_version",
    "torch": "torch_version",
    "container image": "container_image",
    "container digest": "container_digest",
    "commit": "git_commit",
    "dirty": "git_dirty",
    "hosts": "node_list",
    "cluster": "cluster",
    "partition": "partition",
    "device": "device_name",
    "config hash": "config_hash",
}


@dataclass
class Side:
    """One study of a comparison: its studies row and its runs (without record text)."""

    row: dict[str, Any]
    runs: pd.DataFrame
    where: str  # the store or bundle it came from

    @property
    def study_id(self) -> str:
        return self.row["study_id"]


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def bootstrap_ratio(
    baseline: Sequence[float],
    candidate: Sequence[float],
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float, float]:
    """(R, low, high): the ratio of medians and its percentile-bootstrap interval (module docstring)."""
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    ratio = float(np.median(c) / np.median(b))
    b_star = np.median(rng.choice(b, size=(resamples, b.size), replace=True), axis=1)
    c_star = np.median(rng.choice(c, size=(resamples, c.size), replace=True), axis=1)
    low, high = np.quantile(c_star / b_star, [(1 - confidence) / 2, (1 + confidence) / 2])
    return ratio, float(low), float(high)


def verdict(ratio: float, low: float, high: float, threshold: float) -> str:
    """Significant (the interval excludes 1) and larger than the threshold, or no change."""
    if low > 1 and ratio > 1 + threshold:
        return "faster"
    if high < 1 and ratio < 1 - threshold:
        return "slower"
    return "no significant change"


def _cell_rng(seed: int, key: Sequence[Any]) -> np.random.Generator:
    # A cell's stream depends on the seed and the cell only, not on which other cells exist.
    return np.random.default_rng([seed, zlib.crc32(json.dumps([str(k) for k in key]).encode())])


# --------------------------------------------------------------------------------------------
# Environment facts
# --------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = str(value)
    return text[:12] if len(text) == 40 and all(ch in "0123456789abcdef" for ch in text) else text


def _distinct(values: Any) -> str:
    """A fact's values as one comparable text: distinct, sorted, ", "-joined ("—" when unknown)."""
    seen = sorted({part for value in values if value is not None and not pd.isna(value) for part in str(value).split(", ")})
    return ", ".join(_short(part) for part in seen) or "—"


def _with_commit(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with ``commit``: the short commit, marked when the checkout was dirty."""
    commits = [
        None if commit is None or pd.isna(commit) else _short(commit) + (" (dirty)" if dirty is True else "")
        for commit, dirty in zip(runs["git_commit"], runs["git_dirty"])
    ]
    return runs.assign(commit=commits)


def fact_differences(baseline: Mapping[str, str], candidate: Mapping[str, str]) -> list[str]:
    """ "label: baseline → candidate" for every fact whose values are not the same on both sides."""
    return [f"{label}: {baseline[label]} → {candidate[label]}" for label in baseline if baseline[label] != candidate[label]]


def run_facts(runs: pd.DataFrame, study_row: Mapping[str, Any]) -> dict[str, str]:
    facts = {label: _distinct(runs[column]) for label, column in RUN_FACTS.items()}
    facts["container"] = _distinct([study_row.get("container_digest") or study_row.get("container_image")])
    return facts


def study_facts(row: Mapping[str, Any]) -> dict[str, str]:
    return {label: _distinct([row.get(column)]) for label, column in STUDY_FACTS.items()}


def config_differences(baseline: Mapping[str, Any], candidate: Mapping[str, Any], limit: int = 20) -> list[str]:
    """The dotted config keys whose values differ ("steps: 200 → 100"), at most ``limit``."""
    found: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in sorted(set(a) | set(b)):
                if key in study_rows.UNHASHED_CONFIG_KEYS and not path:
                    continue
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            found.append(f"{path}: {json.dumps(a)} → {json.dumps(b)}")

    walk(baseline, candidate, "")
    return found[:limit] + ([f"... and {len(found) - limit} more"] if len(found) > limit else [])


# --------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------


def compare(
    baseline: Side,
    candidate: Side,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per cell of either study (``VERSUS_COLUMNS``), matched cells first."""
    sides = {"baseline": baseline, "candidate": candidate}
    counted = {name: _with_commit(side.runs[side.runs["counts"].eq(True) & side.runs["samples_per_s"].notna()]) for name, side in sides.items()}
    cells = {name: {tuple(key): group for key, group in frame.groupby(list(CELL_KEYS), dropna=False, sort=False)} for name, frame in counted.items()}
    empty = {name: frame.iloc[0:0] for name, frame in counted.items()}
    rows = []
    for key in sorted(cells["baseline"].keys() | cells["candidate"].keys(), key=lambda k: tuple(map(str, k))):
        in_cell = {name: cells[name].get(key, empty[name]) for name in sides}
        b, c = (in_cell[name]["samples_per_s"].to_numpy(dtype=float) for name in sides)
        shown = next(frame.iloc[0] for frame in in_cell.values() if not frame.empty)
        row: dict[str, Any] = {**dict(zip(CELL_KEYS, key)), **{column: shown[column] for column in CELL_SHOWN}}
        row.update(
            baseline_repeats=b.size,
            baseline_median=float(np.median(b)) if b.size else None,
            candidate_repeats=c.size,
            candidate_median=float(np.median(c)) if c.size else None,
            ratio=None,
            ratio_low=None,
            ratio_high=None,
            confidence=confidence,
            threshold=threshold,
            differs="",
        )
        if not c.size or not b.size:
            row["verdict"] = "only in baseline" if b.size else "only in candidate"
        else:
            row["ratio"] = float(np.median(c) / np.median(b))
            if b.size < 2 or c.size < 2:
                row["verdict"] = "too few repeats"
            else:
                ratio, low, high = bootstrap_ratio(b, c, _cell_rng(seed, key), resamples, confidence)
                row.update(ratio=ratio, ratio_low=low, ratio_high=high, verdict=verdict(ratio, low, high, threshold))
            facts = {name: run_facts(in_cell[name], side.row) for name, side in sides.items()}
            row["differs"] = "; ".join(fact_differences(facts["baseline"], facts["candidate"]))
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(VERSUS_COLUMNS))
    matched = ~table["verdict"].isin(["only in baseline", "only in candidate"])
    return pd.concat([table[matched], table[~matched]], ignore_index=True)


def summary(baseline: Side, candidate: Side, table: pd.DataFrame, threshold: float, confidence: float, resamples: int, seed: int) -> dict[str, Any]:
    """The comparison's study-wide facts, for --json and the report."""
    config = {name: json.loads(side.row.get("config_json") or "{}") for name, side in (("b", baseline), ("c", candidate))}
    described = {}
    for name, side in (("baseline", baseline), ("candidate", candidate)):
        described[name] = {
            "study_id": side.study_id,
            "where": side.where,
            **{
                k: side.row.get(k)
                for k in (
                    "study_name",
                    "started_at",
                    "cluster",
                    "partition",
                    "git_commit",
                    "git_dirty",
                    "device_name",
                    "runs",
                    "runs_ok",
                )
            },
        }
    return {
        "baseline": described["baseline"],
        "candidate": described["candidate"],
        "threshold": threshold,
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "metric": "samples_per_s",
        "environment_differences": fact_differences(study_facts(baseline.row), study_facts(candidate.row)),
        "config_differences": config_differences(config["b"], config["c"]),
        "verdicts": {v: int(table["verdict"].eq(v).sum()) for v in VERSUS_VERDICTS},
    }


# --------------------------------------------------------------------------------------------
# Reading the two sides
# --------------------------------------------------------------------------------------------


def _is_bundle(selector: str) -> bool:
    if not selector.endswith(".zip"):
        return False
    if not Path(selector).is_file():
        raise BundleError(f"no bundle at {selector}: give the path of a bundle written by `python -m scalerepro.analysis.history.bundle export`")
    return True


def _side(study: study_rows.StoredStudy, where: str) -> Side:
    columns = [c for c in store_file.STORED_RUN_COLUMNS if c != "record"]
    return Side(dict(study.row), pd.DataFrame(study.runs, columns=list(store_file.STORED_RUN_COLUMNS))[columns], where)


def load_sides(baseline: str, candidate: str, store_path: str | None, lock_timeout_s: float = store_file.DEFAULT_LOCK_TIMEOUT_S) -> tuple[Side, Side]:
    """The two studies the selectors name: bundles are read (and verified) directly, the rest
    resolved in the store (the candidate first, so that the baseline's 'latest' is another study)."""
    found: dict[str, Side] = {}
    for name, selector in (("candidate", candidate), ("baseline", baseline)):
        if _is_bundle(selector):
            found[name] = _side(bundle.read_bundle(selector).study, f"bundle {selector}")
    wanted = [(name, selector) for name, selector in (("candidate", candidate), ("baseline", baseline)) if name not in found]
    if wanted:
        if store_path is None:
            raise StoreError("give --store: only bundles can be compared without a results store")
        connection = store_file.connect(store_path, read_only=True, lock_timeout_s=lock_timeout_s)
        try:
            for name, selector in wanted:
                # 'latest' on one side means the newest study other than the other side's
                other = found.get("candidate") if name == "baseline" else found.get("baseline")
                study_id = store.resolve(connection, selector, exclude=other.study_id if other else None)
                found[name] = _side(store.load_study(connection, study_id), f"store {store_path}")
        finally:
            connection.close()
    if found["baseline"].study_id == found["candidate"].study_id:
        raise StoreError(f"'{baseline}' and '{candidate}' are the same study ({found['baseline'].study_id}): name two studies")
    return found["baseline"], found["candidate"]


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _describe(side: Side) -> str:
    row = side.row
    commit = _short(row.get("git_commit")) if row.get("git_commit") else "no commit"
    return f"{side.study_id}  {row.get('study_name')}, {row.get('cluster')}, commit {commit}, started {row.get('started_at')}"


def render_text(baseline: Side, candidate: Side, table: pd.DataFrame, facts: Mapping[str, Any]) -> str:
    def number(value: Any, fmt: str) -> str:
        return "—" if value is None or pd.isna(value) else format(value, fmt)

    lines = [
        f"baseline   {_describe(baseline)}",
        f"candidate  {_describe(candidate)}",
        "environment: " + ("; ".join(facts["environment_differences"]) or "no study-wide fact differs"),
    ]
    if facts["config_differences"]:
        lines.append("config differs (the studies measure different things): " + "; ".join(facts["config_differences"]))
    level = f"{100 * facts['confidence']:g} %"
    lines.append(f"samples/s, median of the runs that count (n); ratio = candidate / baseline [{level} interval]; threshold {100 * facts['threshold']:g} %")
    for row in table.to_dict("records"):
        cell = f"{row['study']} {row['model']} {row['variant'] or ''} {row['precision']} batch {row['per_gpu_batch']} x {row['gpus']} GPUs"
        figures = (
            f"{number(row['baseline_median'], ',.1f')} ({row['baseline_repeats']}) -> {number(row['candidate_median'], ',.1f')} "
            f"({row['candidate_repeats']})  {number(row['ratio'], '.3f')} [{number(row['ratio_low'], '.3f')}, {number(row['ratio_high'], '.3f')}]"
        )
        lines.append(f"  {' '.join(cell.split())}: {figures}  {row['verdict']}" + (f"  ({row['differs']})" if row["differs"] else ""))
    return "\n".join(lines)


_PROG = "scalerepro.analysis.history.compare"
# The bootstrap holds resamples x runs numbers per cell: 10^6 resamples of 100 runs is under
# a GB; fewer than 100 resamples cannot place a 95 % interval's ends.
RESAMPLES = bounded_int(100, 1_000_000)
SEED = bounded_int(0, 2**32 - 1)  # numpy's seed range
FRACTION = bounded_float(0, 1, high_open=True)


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(
        prog=_PROG,
        description="Compare two studies cell by cell: ratio of median samples/s, bootstrap interval, verdict, what differs.",
        epilog=f"BASELINE, CANDIDATE: {store.SELECTOR_HELP}, or a bundle (.zip)",
    )
    parser.add_argument("baseline", metavar="BASELINE")
    parser.add_argument("candidate", metavar="CANDIDATE")
    parser.add_argument("--store", default="results/history.duckdb", help="the results store (default: %(default)s)")
    parser.add_argument("--threshold", type=FRACTION, default=DEFAULT_THRESHOLD, help="smallest change a verdict reports (default: %(default)s)")
    parser.add_argument("--confidence", type=FRACTION, default=DEFAULT_CONFIDENCE, help="interval level (default: %(default)s)")
    parser.add_argument("--resamples", type=RESAMPLES, default=DEFAULT_RESAMPLES, help="bootstrap resamples (default: %(default)s)")
    parser.add_argument("--seed", type=SEED, default=0, help="bootstrap seed (default: %(default)s)")
    parser.add_argument("--csv", type=output_path, help="write the per-cell table here")
    parser.add_argument("--json", type=output_path, help="write the study-wide facts here")
    parser.add_argument(
        "--lock-timeout", type=store_file.LOCK_TIMEOUT_S, default=store_file.DEFAULT_LOCK_TIMEOUT_S, help="seconds to wait for the store's lock"
    )
    parser.add_argument("--fail-on-slower", action="store_true", help="exit 1 when a cell is slower")
    args = parser.parse_args(argv)
    baseline, candidate = load_sides(args.baseline, args.candidate, args.store, args.lock_timeout)
    table = compare(baseline, candidate, args.threshold, args.confidence, args.resamples, args.seed)
    facts = summary(baseline, candidate, table, args.threshold, args.confidence, args.resamples, args.seed)
    if args.csv:
        write_text_atomically(args.csv, table.to_csv(index=False))
    if args.json:
        write_text_atomically(args.json, json.dumps(facts, indent=2) + "\n")
    print(render_text(baseline, candidate, table, facts))
    return 1 if args.fail_on_slower and table["verdict"].eq("slower").any() else 0


if __name__ == "__main__":
    sys.exit(main())
