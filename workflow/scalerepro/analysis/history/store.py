"""The results store: every study kept in one DuckDB file, so studies can be compared across runs,
commits and clusters (``scalerepro.analysis.history.compare``) and shipped as bundles (``scalerepro.analysis.history.bundle``).

    python -m scalerepro.analysis.history.store append --store results/history.duckdb \
        --matrix results/tables/matrix.csv --config results/tables/config.json \
        --inventory results/inventory/system.json \
        --receipt results/tables/store.json --history results/tables/history.csv \
        [--prescreen results/prescreen/screen.json]
    python -m scalerepro.analysis.history.store list --store results/history.duckdb
    python -m scalerepro.analysis.history.store migrate --store results/history.duckdb

The file is embedded (no server) and its path is the config's ``store.path``: point every study
of a team at one shared file and each appends itself when its aggregation is done (rule
``store_study``). Query it with any DuckDB client, e.g.
``duckdb results/history.duckdb "SELECT study_id, cluster, git_commit FROM studies"``.

This module appends, loads and selects studies and keeps the command line; the file itself (its
tables, schema version, migrations, lock and damage checks) is ``scalerepro.analysis.history.store_file``,
and a study read from its workflow's files into rows is ``scalerepro.analysis.history.study_rows``.

Tables (columns in ``store_file.STUDY_COLUMNS`` and ``store_file.STORED_RUN_COLUMNS``; timestamps are ISO 8601 UTC text as
the records write them):

studies -- one row per study.
    study_id          ``<config hash, 12 hex>-<start time, UTC, ms>``, e.g. ``3f2a9c1b4d5e-20261120T080000.123Z``
    config_hash       sha256 of the resolved config (results/tables/config.json) as canonical
                      JSON (sorted keys, no spaces), without the ``store`` and ``compare``
                      sections: where a study is kept and what it is compared with do not
                      change what it measured
    started_at        the earliest ``started_at`` of the study's records (a rerun of that run
                      starts a new study id); ended_at: the latest ``ended_at``
    git_commit, git_dirty     the runs' commits (", "-joined when they differ); dirty when any run was
    cluster           the Slurm cluster (SLURM_CLUSTER_NAME in the inventory), else the host
                      name of a local study; partition: the inventory's Slurm partition
    node_list         every host a run of the study ran on (sorted, ", "-joined)
    container_image   container.base_image when container.enabled; container_digest:
                      ``sha256:<hex>`` of the image file (container.sif) the study ran in
    torch_version, cuda_version, nccl_version, driver_version   from the records (driver: the
                      inventory's NVML driver, else the records'); ", "-joined when they differ
    device_type, device_name, runs, runs_ok, config_json, inventory_json
    appended_at       when the study was first appended (to this store, or to the one its bundle
                      came from: an import keeps the row exactly)
runs -- one row per planned run of a study, keyed by (study_id, run_id): the study matrix's
    columns, the aggregation's per-run figures (``scalerepro.analysis.tables.aggregate``, runs.csv),
    ``counts`` (the run is completed and agrees with the plan: what statistics are over), the
    run's own environment facts (commit, hosts, versions, cluster, partition), and ``record``:
    the run record's JSON text exactly as written (``json_extract(record, '$.knobs.loader')``),
    with ``record_sha256``. A run without a record has status ``missing`` and no record.
    ``per_gpu_batch`` is the batch the record says the run ran (``batch.micro_batch``; the plan's where
    there is no record or it does not say): a record whose batch, world size, nodes or strategy
    disagrees with its plan is stored as it ran, with ``consistent`` false (and so not ``counts``).
node_checks -- the prescreen's figures (``record.node_check``; ``append --prescreen``), one row per
    study, node and device, keyed by (study_id, node, device_index): the check's started_at,
    device type and precision, the device's matmul TFLOP/s and memory copy GB/s, the node's
    within-node all-reduce bus bandwidth (null with one rank), its link's to the reference node and
    which node that was (null: the reference itself, or one node), the clock, temperature and power at
    the end (null where not reported), why the node was excluded (null: it passed) and the
    fraction of the median it was judged against. ``node_history`` reads one node across studies.
    Bundles do not carry it: it stays in the store the study was appended to.
imports -- one row per import of a bundle (``scalerepro.analysis.history.bundle``): bundle_sha256, study_id, path,
    imported_at.

Appending. A study is appended in one transaction. Appending the same study again changes
nothing; a run whose row differs (rerun since) replaces its row, and the study row follows. The
receipt (``--receipt``) says what was added, replaced and left unchanged. Refused, in one line,
with nothing stored: a row that is not what the record it carries measured (a figure, status,
time or counted cell its record does not state, a figure outside its bound (scalerepro.record), a
run counted that is not ok: ``study_rows.check_records``), and records already stored under
another study id (by sha256, or run id and start: the same runs would count twice in the history).

Concurrency. DuckDB lets one process at a time open the file for writing. A writer (or a reader)
that finds it locked says so in one line on stderr and retries with backoff for up to
``--lock-timeout`` seconds, then stops with a one-line error naming the process holding the
lock; a transaction is all or nothing, so a killed writer never leaves half a study.

Schema version. ``store_meta.schema_version`` says which layout a file has. Opening an older
file for writing migrates it, in one transaction, through ``store_file.MIGRATIONS`` (a new file goes through
the same steps from 0); a read-only open of an older file, or any open of a newer one, is a
one-line error saying what to do.

History (``--history``): each headline cell of the study (strong scaling, each model at its
smallest and largest GPU count; weak scaling when there is no strong) in every stored study that
started no later than this one: median, min and max samples/s over the runs that count.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from scalerepro.analysis.columns import CELL_KEYS, CELL_SHOWN, HISTORY_COLUMNS
from scalerepro.analysis.history.store_file import (
    DEFAULT_LOCK_TIMEOUT_S,
    LOCK_TIMEOUT_S,
    NODE_CHECK_COLUMNS,
    NODE_CHECK_TYPES,
    RUN_TYPES,
    STORE_SCHEMA_VERSION,
    STORED_RUN_COLUMNS,
    STUDY_COLUMNS,
    STUDY_TYPES,
    StoreError,
    connect,
    transaction,
)
from scalerepro.analysis.history.study_rows import StoredStudy, check_rows, distinct_joined, read_json, read_study
from scalerepro.common.cli import OneLineErrorParser, error_boundary
from scalerepro.common.files import utc_now, write_text_atomically
from scalerepro.common.terminal import printable
from scalerepro.record.node_check import NodeScreen, read_screen

# --------------------------------------------------------------------------------------------
# Writing and reading studies
# --------------------------------------------------------------------------------------------

# DuckDB column type -> the pandas dtype that carries it, nulls included, without loss.
_PANDAS_DTYPES = {"VARCHAR": "string", "INTEGER": "Int64", "BIGINT": "Int64", "DOUBLE": "Float64", "BOOLEAN": "boolean"}
_TYPES = {"studies": STUDY_TYPES, "runs": RUN_TYPES, "node_checks": NODE_CHECK_TYPES}


def _insert(connection: duckdb.DuckDBPyConnection, table: str, columns: Sequence[str], rows: Sequence[Mapping]) -> None:
    """Insert ``rows`` in one statement from a typed frame (row-by-row inserts take ~10 ms a row)."""
    if not rows:
        return
    dtypes = {column: _PANDAS_DTYPES[_TYPES[table][column].split()[0]] for column in columns}
    frame = pd.DataFrame({column: pd.array([row[column] for row in rows], dtype=dtypes[column]) for column in columns})
    names = ", ".join(f'"{column}"' for column in columns)
    connection.register("_new_rows", frame)
    # Not in a finally: after a failed statement the transaction only takes ROLLBACK (the
    # caller's), and the view goes with the connection.
    connection.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _new_rows")
    connection.unregister("_new_rows")


def _fetch(connection: duckdb.DuckDBPyConnection, query: str, parameters: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = connection.execute(query, list(parameters))
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, values)) for values in cursor.fetchall()]


@dataclass
class AppendResult:
    study_id: str  # the study the records are stored as: the one appended, or the stored one it repeats
    new_study: bool
    added: int
    replaced: int
    unchanged: int
    repeat_of: str | None = None  # every record is already stored as this study: nothing was stored again
    shares: dict[str, int] = field(default_factory=dict)  # another stored study id -> records the two share


def append(
    connection: duckdb.DuckDBPyConnection,
    study: StoredStudy,
    keep_appended_at: bool = False,
    replace: bool = True,
    before_commit: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
) -> AppendResult:
    """Add the study, or bring its stored rows up to date, in one transaction. The same study
    again changes nothing. ``keep_appended_at``: keep the row's own ``appended_at`` (an import
    that reproduces a study exactly), else it is now. ``replace=False``: a study stored with
    other rows is an error (and nothing changes), not an update. ``before_commit`` runs inside
    the transaction, last: what it writes, and whether it fails, is part of the append. Rows that
    are not what their records measured are a StoreError.

    A study whose records are all stored already, as another study (the same runs under a config
    edited since, which only changed what is judged: another study id), is that study: it is named
    as a repeat of it (``repeat_of``) and nothing is stored again, so that no run counts twice in
    the history; with ``replace=False`` (an import, which must add a study of its own) it is a
    StoreError. A study that shares some of its records with stored ones is stored, the shared
    records named (``shares``)."""
    row = dict(study.row)
    if not keep_appended_at or not row.get("appended_at"):
        row["appended_at"] = utc_now()
    check_rows(StoredStudy(row, study.runs))
    strangers = sorted({str(run.get("study_id")) for run in study.runs if run.get("study_id") != study.study_id})
    if strangers:
        # a study adds its own runs only: a row naming another study would change that study
        raise StoreError(f"study {study.study_id} holds runs of another study ({', '.join(strangers[:3])}): nothing stored")
    with transaction(connection):
        elsewhere = _stored_elsewhere(connection, study)
        recorded = sum(1 for run in study.runs if run.get("record") is not None)
        whole = [other for other, runs in elsewhere.items() if recorded and len(runs) == recorded]
        if whole and not replace:
            raise StoreError(_stored_as(whole[0], elsewhere[whole[0]], study, recorded) + ": nothing stored")
        if whole:
            return AppendResult(whole[0], False, 0, 0, len(study.runs), repeat_of=whole[0])
        existing = _fetch(connection, "SELECT * FROM studies WHERE study_id = ?", [study.study_id])
        stored = {r["run_id"]: r for r in _fetch(connection, "SELECT * FROM runs WHERE study_id = ?", [study.study_id])}
        if existing and not replace:
            differing = sum(stored.get(run["run_id"]) != run for run in study.runs) + len(set(stored) - {r["run_id"] for r in study.runs})
            if differing or {**existing[0], "appended_at": None} != {**row, "appended_at": None}:
                raise StoreError(
                    f"study {study.study_id} is already in the store with other contents ({differing} runs differ): "
                    "not replaced; import it into another store to compare the two"
                )
        added = replaced = unchanged = 0
        new_rows = []
        for run in study.runs:
            before = stored.get(run["run_id"])
            if before == run:
                unchanged += 1
                continue
            if before is None:
                added += 1
            else:
                replaced += 1
                connection.execute("DELETE FROM runs WHERE study_id = ? AND run_id = ?", [study.study_id, run["run_id"]])
            new_rows.append(run)
        _insert(connection, "runs", STORED_RUN_COLUMNS, new_rows)
        if not existing:
            _insert(connection, "studies", STUDY_COLUMNS, [row])
        else:
            # The facts follow the runs; when the study first arrived stays as it was.
            kept = {"appended_at": existing[0]["appended_at"]}
            if {**row, **kept} != existing[0]:
                connection.execute("DELETE FROM studies WHERE study_id = ?", [study.study_id])
                _insert(connection, "studies", STUDY_COLUMNS, [{**row, **kept}])
        if before_commit is not None:
            before_commit(connection)
    return AppendResult(study.study_id, not existing, added, replaced, unchanged, shares={k: len(v) for k, v in elsewhere.items()})


def _stored_elsewhere(connection: duckdb.DuckDBPyConnection, study: StoredStudy) -> dict[str, list[str]]:
    """Another stored study id -> the study's runs whose records it holds already: the same
    sha256, or the same run id and start (the same run, its record since edited). A study's own
    id (appended again, a rerun replacing a run) is its own."""
    keys = [(run["run_id"], run.get("started_at"), run.get("record_sha256")) for run in study.runs if run.get("record") is not None]
    if not keys:
        return {}
    frame = pd.DataFrame(keys, columns=["run_id", "started_at", "record_sha256"], dtype="string")
    connection.register("_appended_records", frame)
    found = _fetch(
        connection,
        "SELECT stored.study_id, new.run_id FROM runs stored JOIN _appended_records new ON stored.record_sha256 = new.record_sha256 "
        "WHERE stored.study_id <> ? "
        "UNION SELECT stored.study_id, new.run_id FROM runs stored JOIN _appended_records new "
        "ON stored.run_id = new.run_id AND stored.started_at = new.started_at WHERE stored.study_id <> ? "
        "ORDER BY 1, 2",
        [study.study_id, study.study_id],
    )
    connection.unregister("_appended_records")
    shared: dict[str, list[str]] = {}
    for row in found:
        shared.setdefault(row["study_id"], [])
        if row["run_id"] not in shared[row["study_id"]]:
            shared[row["study_id"]].append(row["run_id"])
    return shared


def _stored_as(other: str, runs: Sequence[str], study: StoredStudy, recorded: int) -> str:
    """What a study whose records another stored study holds is, in one line."""
    return (
        f"the records of study {study.study_id} are already stored as study {other}: {len(runs)} of its {recorded} records "
        f"({', '.join(printable(r) for r in runs[:3])}{', ...' if len(runs) > 3 else ''}), the same record sha256 or run id and "
        "start; stored again they would count twice in the history"
    )


def load_study(connection: duckdb.DuckDBPyConnection, study_id: str) -> StoredStudy:
    """A stored study, exactly as stored."""
    rows = _fetch(connection, "SELECT * FROM studies WHERE study_id = ?", [study_id])
    if not rows:
        raise StoreError(f"no study {study_id} in the store")
    runs = _fetch(connection, "SELECT * FROM runs WHERE study_id = ? ORDER BY run_id", [study_id])
    return StoredStudy(rows[0], runs)


def studies(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every stored study, oldest first (by start time)."""
    frame = pd.DataFrame(_fetch(connection, "SELECT * FROM studies"), columns=list(STUDY_COLUMNS))
    if frame.empty:
        return frame
    started = pd.to_datetime(frame["started_at"], utc=True, format="ISO8601")
    return frame.assign(_started=started).sort_values(["_started", "study_id"]).drop(columns="_started").reset_index(drop=True)


def runs_of(connection: duckdb.DuckDBPyConnection, study_ids: Sequence[str]) -> pd.DataFrame:
    """The runs of the given studies, without their record text."""
    columns = [c for c in STORED_RUN_COLUMNS if c != "record"]
    if not study_ids:
        return pd.DataFrame(columns=columns)
    names = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join("?" for _ in study_ids)
    return pd.DataFrame(_fetch(connection, f"SELECT {names} FROM runs WHERE study_id IN ({marks})", list(study_ids)), columns=columns)


def node_check_rows(study_id: str, screen: NodeScreen) -> list[dict[str, Any]]:
    """The screen as node_checks rows: one per node and device."""
    rows = []
    for verdict in screen.nodes:
        check = verdict.check
        for device in check.devices:
            rows.append(
                {
                    "study_id": study_id,
                    "node": verdict.node,
                    "started_at": check.started_at,
                    "device_type": check.device_type,
                    "precision": check.precision,
                    "device_index": device.index,
                    "device_name": device.name,
                    "matmul_tflops": device.matmul_tflops,
                    "memory_gbps": device.memory_gbps,
                    "allreduce_busbw_gbps": check.allreduce.busbw_gbps if check.allreduce is not None else None,
                    "link_busbw_gbps": verdict.link.busbw_gbps if verdict.link is not None else None,
                    "link_reference": verdict.link.reference if verdict.link is not None else None,
                    "clock_mhz": device.state.clock_mhz,
                    "temperature_c": device.state.temperature_c,
                    "power_w": device.state.power_w,
                    "excluded_because": verdict.excluded_because,
                    "fraction": screen.fraction,
                }
            )
    return rows


def replace_node_checks(connection: duckdb.DuckDBPyConnection, study_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """The study's node_checks rows become ``rows``: a prescreen rerun since replaces the old screen
    whole, so no node keeps a row of a screen that no longer holds. Call it inside a transaction."""
    strangers = sorted({str(row["study_id"]) for row in rows if row["study_id"] != study_id})
    if strangers:
        raise StoreError(f"node checks of study {study_id} name another study ({', '.join(strangers[:3])}): nothing stored")
    connection.execute("DELETE FROM node_checks WHERE study_id = ?", [study_id])
    _insert(connection, "node_checks", NODE_CHECK_COLUMNS, rows)


def node_history(connection: duckdb.DuckDBPyConnection, node: str) -> pd.DataFrame:
    """Every stored prescreen row of ``node``, oldest check first (then by study and device), so
    that a node getting slower over weeks reads down the table."""
    columns = list(NODE_CHECK_COLUMNS)
    frame = pd.DataFrame(_fetch(connection, "SELECT * FROM node_checks WHERE node = ?", [node]), columns=columns)
    if frame.empty:
        return frame
    # ISO 8601 text with any offset: ordered as instants, not as strings
    started = pd.to_datetime(frame["started_at"], utc=True, format="ISO8601")
    return frame.assign(_started=started).sort_values(["_started", "study_id", "device_index"]).drop(columns="_started").reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Choosing a study: ids, latest, commits, clusters, receipts
# --------------------------------------------------------------------------------------------

SELECTOR_HELP = (
    "a study id (or a unique prefix of one), 'latest', a git commit (7+ hex digits), a cluster name, "
    "CLUSTER:PARTITION, or the receipt a study's store_study step wrote (results/tables/store.json)"
)


def resolve(connection: duckdb.DuckDBPyConnection, selector: str, exclude: str | None = None) -> str:
    """The study id ``selector`` names (see ``SELECTOR_HELP``). 'latest', a commit, a cluster and
    a cluster:partition pick the most recently started matching study other than ``exclude`` (the
    study on the other side of a comparison), so that `latest` means "the one before" when
    comparing with it."""
    if selector.endswith(".json") and Path(selector).is_file():
        receipt = read_json(selector, "store receipt")
        if not isinstance(receipt, Mapping) or not isinstance(receipt.get("study_id"), str) or not receipt["study_id"]:
            raise StoreError(f"{selector} is not a store receipt (its study_id is not a study id): give the receipt rule store_study wrote")
        selector = receipt["study_id"]
    table = studies(connection)
    if table.empty:
        raise StoreError("the results store has no study yet")
    ids = table["study_id"].tolist()
    if selector in ids:
        return selector
    others = table[table["study_id"].ne(exclude)] if exclude else table
    if selector == "latest":
        if others.empty:
            raise StoreError(f"'latest': the store has no study other than {exclude}")
        return others["study_id"].iloc[-1]
    prefixed = [study_id for study_id in ids if study_id.startswith(selector)]
    if len(prefixed) == 1:
        return prefixed[0]
    if len(prefixed) > 1:
        raise StoreError(f"'{selector}' is the start of {len(prefixed)} study ids ({', '.join(prefixed[:4])}): give more of one")
    if re.fullmatch(r"[0-9a-f]{7,40}", selector):
        at = others[others["git_commit"].fillna("").str.split(", ").map(lambda commits: any(c.startswith(selector) for c in commits))]
        if not at.empty:
            return at["study_id"].iloc[-1]
    on = others[others["cluster"].eq(selector)]  # a cluster name, colons and all
    if on.empty and ":" in selector:
        cluster, _, partition = selector.rpartition(":")  # a partition name has no colon; a cluster's may
        on = others[others["cluster"].eq(cluster) & others["partition"].eq(partition)]
    if not on.empty:
        return on["study_id"].iloc[-1]
    raise StoreError(f"no study in the store matches '{selector}' ({SELECTOR_HELP}); `python -m scalerepro.analysis.history.store list` lists them")


# --------------------------------------------------------------------------------------------
# History of the headline cells
# --------------------------------------------------------------------------------------------


def headline_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """The cells a study's history follows: strong scaling (weak when the study has no strong
    scaling), each model at its smallest and largest GPU count."""
    for kind in ("strong", "weak"):
        scaled = runs[runs["study"].eq(kind)]
        if not scaled.empty:
            break
    else:
        return pd.DataFrame(columns=list(CELL_KEYS))
    ends = scaled.groupby("model")["gpus"].agg(["min", "max"])
    chosen = scaled[scaled.apply(lambda r: r["gpus"] in (ends.loc[r["model"], "min"], ends.loc[r["model"], "max"]), axis=1)]
    return chosen[list(CELL_KEYS)].drop_duplicates().reset_index(drop=True)


def history(connection: duckdb.DuckDBPyConnection, study_id: str) -> pd.DataFrame:
    """Each headline cell of ``study_id`` in every stored study that started no later than it:
    median, min and max samples/s over the runs that count, one row per (cell, study)."""
    table = studies(connection)
    this = table[table["study_id"].eq(study_id)]
    if this.empty:
        raise StoreError(f"no study {study_id} in the store")
    started = pd.to_datetime(table["started_at"], utc=True, format="ISO8601")
    earlier = table[started <= started[this.index[0]]]
    runs = runs_of(connection, earlier["study_id"].tolist())
    cells = headline_cells(runs[runs["study_id"].eq(study_id)])
    counted = runs[runs["counts"].eq(True)].merge(cells, on=list(CELL_KEYS))
    if counted.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    grouped = (
        counted.groupby([*CELL_KEYS, "study_id"], dropna=False)
        .agg(
            repeats=("samples_per_s", "count"),
            samples_per_s_median=("samples_per_s", "median"),
            samples_per_s_min=("samples_per_s", "min"),
            samples_per_s_max=("samples_per_s", "max"),
            device_name=("device_name", distinct_joined),
            **{column: (column, "first") for column in CELL_SHOWN},
        )
        .reset_index()
        .merge(earlier[["study_id", "started_at", "git_commit", "git_dirty", "cluster"]], on="study_id")
    )
    grouped["this_study"] = grouped["study_id"].eq(study_id)
    grouped["_started"] = pd.to_datetime(grouped["started_at"], utc=True, format="ISO8601")
    ordered = grouped.sort_values([*CELL_KEYS, "_started"], kind="stable")
    return ordered[list(HISTORY_COLUMNS)].reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _append_command(args: argparse.Namespace) -> int:
    study = read_study(args.matrix, args.config, args.inventory)
    checks = node_check_rows(study.study_id, read_screen(args.prescreen)) if args.prescreen else None
    connection = connect(args.store, lock_timeout_s=args.lock_timeout)
    try:
        # the screen is part of the append: stored with the study's rows, or neither is
        result = append(connection, study, before_commit=None if checks is None else lambda c: replace_node_checks(c, study.study_id, checks))
        stored = len(studies(connection))
        past = history(connection, result.study_id) if args.history else None
    finally:
        connection.close()
    receipt = {
        "store": str(args.store),
        "schema_version": STORE_SCHEMA_VERSION,
        "study_id": result.study_id,
        "new_study": result.new_study,
        "runs_added": result.added,
        "runs_replaced": result.replaced,
        "runs_unchanged": result.unchanged,
        "studies_in_store": stored,
        "repeat_of": result.repeat_of,
        "shares_records_with": result.shares,
        # node_checks rows stored; None: no screen given (the prescreen off), or the study is a repeat
        "node_checks": len(checks) if checks is not None and result.repeat_of is None else None,
    }
    if args.receipt:
        write_text_atomically(args.receipt, json.dumps(receipt, indent=2) + "\n")
    if past is not None:
        write_text_atomically(args.history, past.to_csv(index=False))
    if result.repeat_of is not None:
        print(
            f"store: every record of study {study.study_id} is already stored as study {result.repeat_of}: this study is a repeat of it, nothing stored again",
            file=sys.stderr,
        )
    for other, shared in result.shares.items():
        print(f"store: study {result.study_id} shares {shared} of its records with stored study {other}", file=sys.stderr)
    state = "new study" if result.new_study else "already stored"
    print(
        f"store: {result.study_id} ({state}): {result.added} runs added, {result.replaced} replaced, "
        f"{result.unchanged} unchanged; {stored} stud{'y' if stored == 1 else 'ies'} in {args.store}",
        file=sys.stderr,
    )
    return 0


def _list_command(args: argparse.Namespace) -> int:
    connection = connect(args.store, read_only=True, lock_timeout_s=args.lock_timeout)
    try:
        table = studies(connection)
    finally:
        connection.close()
    shown = ["study_id", "study_name", "started_at", "cluster", "git_commit", "device_name", "runs", "runs_ok"]
    if table.empty:
        print("the store has no study yet")
    else:
        listed = table[shown].assign(git_commit=table["git_commit"].str.slice(0, 12))
        # a stored name is whatever a config or a bundle said: on a terminal it is text, never control
        print(listed.map(lambda value: printable(value) if isinstance(value, str) else value).to_string(index=False))
    return 0


def _migrate_command(args: argparse.Namespace) -> int:
    if not Path(args.store).is_file():  # a writable open would create an empty store at a mistyped path
        raise StoreError(f"no results store at {args.store}: nothing to migrate (check the path)")
    connection = connect(args.store, lock_timeout_s=args.lock_timeout)  # a writable open migrates
    connection.close()
    print(f"store: {args.store} is at schema version {STORE_SCHEMA_VERSION}", file=sys.stderr)
    return 0


_PROG = "scalerepro.analysis.history.store"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--store", required=True, type=Path, help="the DuckDB file (config store.path)")
        sub.add_argument(
            "--lock-timeout",
            type=LOCK_TIMEOUT_S,
            default=DEFAULT_LOCK_TIMEOUT_S,
            metavar="S",
            help="how long to wait for another process's lock on the store (default: %(default)s)",
        )
        return sub

    add = command("append", "append a finished study (idempotent) and write its receipt and history")
    add.add_argument("--matrix", required=True, type=Path, help="results/tables/matrix.csv")
    add.add_argument("--config", required=True, type=Path, help="results/tables/config.json (the resolved config)")
    add.add_argument("--inventory", required=True, type=Path, help="results/inventory/system.json")
    add.add_argument("--receipt", type=Path, help="JSON file saying which study was stored and what changed")
    add.add_argument("--history", type=Path, help="CSV of the study's headline cells across the stored studies")
    add.add_argument("--prescreen", type=Path, help="results/prescreen/screen.json: store each node's prescreen figures (table node_checks)")
    command("list", "list the stored studies, oldest first")
    command("migrate", "bring the store to this version's schema")
    args = parser.parse_args(argv)
    return {"append": _append_command, "list": _list_command, "migrate": _migrate_command}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
