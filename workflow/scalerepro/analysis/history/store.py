"""The results store: every study kept in one DuckDB file, so studies can be compared across runs,
commits and clusters (``scalerepro.analysis.history.compare``) and shipped as bundles (``scalerepro.analysis.history.bundle``).

    python -m scalerepro.analysis.history.store append --store results/history.duckdb \
        --matrix results/tables/matrix.csv --config results/tables/config.json \
        --inventory results/inventory/system.json \
        --receipt results/tables/store.json --history results/tables/history.csv
    python -m scalerepro.analysis.history.store list --store results/history.duckdb
    python -m scalerepro.analysis.history.store migrate --store results/history.duckdb

The file is embedded (no server) and its path is the config's ``store.path``: point every study
of a team at one shared file and each appends itself when its aggregation is done (rule
``store_study``). Query it with any DuckDB client, e.g.
``duckdb results/history.duckdb "SELECT study_id, cluster, git_commit FROM studies"``.

Tables (columns in ``STUDY_COLUMNS`` and ``STORED_RUN_COLUMNS``; timestamps are ISO 8601 UTC text as
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
imports -- one row per import of a bundle (``scalerepro.analysis.history.bundle``): bundle_sha256, study_id, path,
    imported_at.

Appending. A study is appended in one transaction. Appending the same study again changes
nothing; a run whose row differs (rerun since) replaces its row, and the study row follows. The
receipt (``--receipt``) says what was added, replaced and left unchanged.

Concurrency. DuckDB lets one process at a time open the file for writing. A writer (or a reader)
that finds it locked says so in one line on stderr and retries with backoff for up to
``--lock-timeout`` seconds, then stops with a one-line error naming the process holding the
lock; a transaction is all or nothing, so a killed writer never leaves half a study.

Schema version. ``store_meta.schema_version`` says which layout a file has. Opening an older
file for writing migrates it, in one transaction, through ``MIGRATIONS`` (a new file goes through
the same steps from 0); a read-only open of an older file, or any open of a newer one, is a
one-line error saying what to do.

History (``--history``): each headline cell of the study (strong scaling, each model at its
smallest and largest GPU count; weak scaling when there is no strong) in every stored study that
started no later than this one: median, min and max samples/s over the runs that count.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from scalerepro.analysis.columns import CELL_KEYS, HISTORY_COLUMNS
from scalerepro.analysis.tables import cell_tables, readers
from scalerepro.common.cli import CommandError, OneLineErrorParser, bounded_float, error_boundary
from scalerepro.common.files import atomic_file, current_umask, sha256_of, utc_now

STORE_SCHEMA_VERSION = 4
DEFAULT_LOCK_TIMEOUT_S = 60.0
# --lock-timeout: seconds, at most a day (a typo must not wait for ever).
LOCK_TIMEOUT_S = bounded_float(0, 24 * 3600)
# Config sections that say where a study is kept and what it is compared with, not what it ran.
UNHASHED_CONFIG_KEYS = ("store", "compare")

STUDY_TYPES: dict[str, str] = {
    "study_id": "VARCHAR PRIMARY KEY",
    "config_hash": "VARCHAR NOT NULL",
    "started_at": "VARCHAR NOT NULL",
    "ended_at": "VARCHAR",
    "study_name": "VARCHAR",
    "git_commit": "VARCHAR",
    "git_dirty": "BOOLEAN",
    "cluster": "VARCHAR",
    "partition": "VARCHAR",
    "node_list": "VARCHAR",
    "container_image": "VARCHAR",
    "container_digest": "VARCHAR",
    "torch_version": "VARCHAR",
    "cuda_version": "VARCHAR",
    "nccl_version": "VARCHAR",
    "driver_version": "VARCHAR",
    "device_type": "VARCHAR",
    "device_name": "VARCHAR",
    "runs": "INTEGER",
    "runs_ok": "INTEGER",
    "config_json": "VARCHAR",
    "inventory_json": "VARCHAR",
    "appended_at": "VARCHAR NOT NULL",
}
STUDY_COLUMNS = tuple(STUDY_TYPES)

RUN_TYPES: dict[str, str] = {
    "study_id": "VARCHAR NOT NULL",
    "run_id": "VARCHAR NOT NULL",
    "study": "VARCHAR",
    "model": "VARCHAR",
    "gpus": "INTEGER",
    "nodes": "INTEGER",
    "gpus_per_node": "INTEGER",
    "repeat": "INTEGER",
    "variant": "VARCHAR",
    "precision": "VARCHAR",
    "per_gpu_batch": "INTEGER",
    "global_batch": "INTEGER",
    "bucket_cap_mb": "DOUBLE",
    "status": "VARCHAR",
    "counts": "BOOLEAN",
    "error": "VARCHAR",
    "consistent": "BOOLEAN",
    "samples_per_s": "DOUBLE",
    "tokens_per_s": "DOUBLE",
    "step_time_median_s": "DOUBLE",
    "step_time_p10_s": "DOUBLE",
    "step_time_p90_s": "DOUBLE",
    "epoch_time_s": "DOUBLE",
    "window_s": "DOUBLE",
    "mfu": "DOUBLE",
    "exposed_comm_fraction": "DOUBLE",
    "data_stall_fraction": "DOUBLE",
    "gpu_util_mean_pct": "DOUBLE",
    "power_mean_w": "DOUBLE",
    "energy_per_sample_j": "DOUBLE",
    "peak_memory_bytes": "BIGINT",
    "duration_s": "DOUBLE",
    "started_at": "VARCHAR",
    "ended_at": "VARCHAR",
    "git_commit": "VARCHAR",
    "git_dirty": "BOOLEAN",
    "cluster": "VARCHAR",
    "partition": "VARCHAR",
    "node_list": "VARCHAR",
    "scheduler_job_id": "VARCHAR",
    "device_type": "VARCHAR",
    "device_name": "VARCHAR",
    "torch_version": "VARCHAR",
    "cuda_version": "VARCHAR",
    "nccl_version": "VARCHAR",
    "driver_version": "VARCHAR",
    "record_sha256": "VARCHAR",
    "record": "VARCHAR",
}
STORED_RUN_COLUMNS = tuple(RUN_TYPES)


def _create(table: str, types: Mapping[str, str], key: str = "") -> str:
    columns = ", ".join(f'"{name}" {kind}' for name, kind in types.items())
    return f"CREATE TABLE {table} ({columns}{key})"


# version -> the statements that take a store from the previous version to it. Never edit a
# released step: add the next one (and a test that migrates a file of the previous version).
# Columns renamed since version 1 (new name: old name); version 1's runs table had the old ones.
RENAMED_RUN_COLUMNS = {"per_gpu_batch": "per_rank_batch", "scheduler_job_id": "slurm_job_id"}
_RUN_TYPES_V1 = {RENAMED_RUN_COLUMNS.get(name, name): kind for name, kind in RUN_TYPES.items()}

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        _create("studies", STUDY_TYPES),
        _create("runs", _RUN_TYPES_V1, ", PRIMARY KEY (study_id, run_id)"),
    ),
    # Bundles: which studies came from which bundle (the studies and runs rows stay exactly as
    # exported, so where a study came from is kept beside them).
    2: (
        "CREATE TABLE imports (bundle_sha256 VARCHAR PRIMARY KEY, study_id VARCHAR NOT NULL, "
        "path VARCHAR, imported_at VARCHAR NOT NULL)",
    ),
    # One name per quantity from config to store: the per-GPU micro-batch is per_gpu_batch (the
    # config's name), the batch system's job id scheduler_job_id (Slurm is one of its backends).
    3: tuple(f'ALTER TABLE runs RENAME COLUMN "{old}" TO "{new}"' for new, old in RENAMED_RUN_COLUMNS.items()),
    # Every import of a bundle is a row (version 2 kept one per bundle: a second import of the
    # same file replaced the first one's where and when).
    4: (
        "CREATE TABLE imports_v4 (bundle_sha256 VARCHAR NOT NULL, study_id VARCHAR NOT NULL, "
        "path VARCHAR, imported_at VARCHAR NOT NULL, PRIMARY KEY (bundle_sha256, imported_at))",
        "INSERT INTO imports_v4 SELECT bundle_sha256, study_id, path, imported_at FROM imports",
        "DROP TABLE imports",
        "ALTER TABLE imports_v4 RENAME TO imports",
    ),
}
assert sorted(MIGRATIONS) == list(range(1, STORE_SCHEMA_VERSION + 1))


class StoreError(CommandError):
    """A problem with the store or its input, in one line that says what to do."""


# --------------------------------------------------------------------------------------------
# Opening: the lock, the schema version
# --------------------------------------------------------------------------------------------

_LOCKED = re.compile(r"Could not set lock on file|Conflicting lock is held")
_DAMAGED = re.compile(r"not a valid DuckDB database file|Could not read enough bytes|Failure while replaying WAL|Corrupt|checksum", re.I)
_HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def connect(
    path: str | os.PathLike[str],
    read_only: bool = False,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    say: Callable[[str], None] = _stderr,
) -> duckdb.DuckDBPyConnection:
    """Open the store, waiting for another process's lock with bounded retry, and bring a
    writable one to the current schema version. Read-only opens need an existing file."""
    path = Path(path)
    if read_only and not path.is_file():
        raise StoreError(
            f"no results store at {path}: a study appends itself there when its aggregation is done "
            "(rule store_study), or load a bundle with `python -m scalerepro.analysis.history.bundle import`"
        )
    if not read_only and not path.exists():
        _create(path)
    deadline = time.monotonic() + lock_timeout_s
    delay, waited = 0.05, False
    while True:
        try:
            connection = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as error:
            message = str(error)
            if _DAMAGED.search(message):
                raise StoreError(_damaged(path, error)) from None
            if not _LOCKED.search(message):
                raise StoreError(
                    f"cannot open the results store {path}: {message.splitlines()[0][:300]}: check that it and its "
                    "directory can be read (and written, to append) and that the file system has space"
                ) from None
            holder = _HOLDER.search(message)
            who = f"process {holder.group(2)} ({holder.group(1)})" if holder else "another process"
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"the results store {path} stayed locked by {who} for {lock_timeout_s:g} s: let it finish "
                    "(or stop it) and run again, or raise --lock-timeout"
                ) from None
            if not waited:
                say(f"store: {path} is locked by {who}; waiting up to {lock_timeout_s:g} s")
                waited = True
            # Exponential backoff with jitter, so that writers released together do not collide again.
            time.sleep(min(delay * (1 + random.random()), max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 1.0)
    try:
        try:
            version = schema_version(connection, path)
        except duckdb.Error as error:
            raise StoreError(_damaged(path, error)) from None
        if version > STORE_SCHEMA_VERSION:
            raise StoreError(
                f"the results store {path} has schema version {version}, newer than this scalerepro "
                f"understands ({STORE_SCHEMA_VERSION}): upgrade scalerepro"
            )
        if version < STORE_SCHEMA_VERSION:
            if read_only:
                raise StoreError(
                    f"the results store {path} has schema version {version} (current: {STORE_SCHEMA_VERSION}): "
                    f"migrate it with `python -m scalerepro.analysis.history.store migrate --store {path}`"
                )
            try:
                migrate(connection, version)
            except duckdb.Error as error:  # a table or column an older version had is not there
                raise StoreError(_damaged(path, error)) from None
        verify(connection, path)
    except BaseException:
        connection.close()
        raise
    return connection


def _damaged(path: Path, cause: duckdb.Error | str) -> str:
    what = str(cause).splitlines()[0]
    return (
        f"the results store {path} is damaged ({what[:300]}): move it aside and restore it from a copy, or let the "
        "next study start a new store there and import the bundles of the studies it held"
    )


@functools.cache
def expected_shape() -> tuple[tuple[str, str, str], ...]:
    """(table, column, type) of every column a store at the current schema has: what the
    migrations from 0 make, so the shape is written once, in ``MIGRATIONS``."""
    with duckdb.connect(":memory:") as connection:
        migrate(connection, 0)
        return _shape(connection)


def _shape(connection: duckdb.DuckDBPyConnection) -> tuple[tuple[str, str, str], ...]:
    query = (
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
    )
    return tuple(connection.execute(query).fetchall())


def verify(connection: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a store that some reader would fail on later, with a traceback: every table and
    column of the current schema present with its type, and every block of every table
    readable (a truncated or overwritten file fails DuckDB's block checks here, once, rather
    than in the middle of a comparison). Reading every column costs milliseconds per MB."""
    try:
        found = set(_shape(connection))
        tables = {table: [(column, kind) for name, column, kind in expected_shape() if name == table] for table, _, _ in expected_shape()}
        lacking = []
        for table, columns in tables.items():
            gone = [f"{column} {kind}" for column, kind in columns if (table, column, kind) not in found]
            if len(gone) == len(columns):
                lacking.append(f"table {table}")
            elif gone:
                lacking.append(f"{table} column{'s' * (len(gone) > 1)} {', '.join(gone[:4])}{' ...' * (len(gone) > 4)}")
        if lacking:
            raise StoreError(_damaged(path, f"it lacks {'; '.join(lacking)}"))
        for table, described in tables.items():
            columns = [column for column, _ in described]
            every_value = ", ".join(f'max(length(CAST("{column}" AS VARCHAR)))' for column in columns)
            connection.execute(f'SELECT count(*), {every_value} FROM "{table}"').fetchall()
    except duckdb.Error as error:
        raise StoreError(_damaged(path, error)) from None


def _create(path: Path) -> None:
    """Create a store so that no process ever opens a half-made file: two processes creating the
    same new file at once make one of them read it before its header is written ("not a valid
    DuckDB database file"). So the store is made complete, at the current schema, in a private
    directory beside it, then hard-linked to its name, which fails if another process was first
    (and then that process's store is used)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        made = private / path.name
        with duckdb.connect(str(made)) as connection:
            migrate(connection, 0)
        os.chmod(made, 0o666 & ~current_umask())  # a shared store is readable by the group, like any file
        try:
            os.link(made, path)
        except FileExistsError:
            pass
        except OSError as error:
            raise StoreError(f"cannot create the results store {path}: {error.strerror}") from None
    finally:
        shutil.rmtree(private, ignore_errors=True)


def schema_version(connection: duckdb.DuckDBPyConnection, path: Path | None = None) -> int:
    """The store's schema version; 0 for an empty file. A DuckDB file that is not a store is an error."""
    tables = {row[0] for row in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "store_meta" not in tables:
        if tables:
            raise StoreError(
                f"{path or 'this DuckDB file'} is not a scalerepro results store (it has tables {sorted(tables)[:8]} "
                "but no store_meta): give the path of a results store"
            )
        return 0
    row = connection.execute("SELECT value FROM store_meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        return 0
    if not str(row[0]).isdigit():
        raise StoreError(_damaged(path or Path("?"), f"its schema_version is {str(row[0])[:40]!r}, not a number"))
    return int(row[0])


@contextlib.contextmanager
def transaction(connection: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """All of the block or none of it. A write the file system refuses (a full disk, a directory
    where DuckDB cannot create its ``.wal``) ends DuckDB's transaction itself; that first error,
    not the ROLLBACK's "no transaction is active", is the one to report."""
    connection.execute("BEGIN TRANSACTION")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException as error:
        with contextlib.suppress(duckdb.Error):
            connection.execute("ROLLBACK")
        if isinstance(error, (duckdb.IOException, duckdb.TransactionException)):
            raise StoreError(
                f"cannot write the results store {_file_of(connection)}: {str(error).splitlines()[0][:300]}: free space on its file system and "
                "make its directory writable (DuckDB writes a .wal file beside it), then run again; nothing was stored"
            ) from None
        raise


def _file_of(connection: duckdb.DuckDBPyConnection) -> str:
    with contextlib.suppress(duckdb.Error):
        query = "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
        row = connection.execute(query).fetchone()
        if row and row[0]:
            return str(row[0])
    return "(its path unknown)"


def migrate(connection: duckdb.DuckDBPyConnection, version: int, to: int = STORE_SCHEMA_VERSION) -> None:
    """Take the store from ``version`` to ``to`` through each step of ``MIGRATIONS``, in one transaction."""
    with transaction(connection):
        for step in range(version + 1, to + 1):
            for statement in MIGRATIONS[step]:
                connection.execute(statement)
        connection.execute("INSERT OR REPLACE INTO store_meta VALUES ('schema_version', ?)", [str(to)])


# --------------------------------------------------------------------------------------------
# A study, from the files its workflow wrote
# --------------------------------------------------------------------------------------------


@dataclass
class Study:
    """One study as rows of the store: its ``studies`` row and its ``runs`` rows."""

    row: dict[str, Any]
    runs: list[dict[str, Any]]

    @property
    def study_id(self) -> str:
        return self.row["study_id"]


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the resolved config as canonical JSON, without ``UNHASHED_CONFIG_KEYS``."""
    measured = {key: value for key, value in config.items() if key not in UNHASHED_CONFIG_KEYS}
    return hashlib.sha256(canonical_json(measured).encode("utf-8")).hexdigest()


def make_study_id(hash_hex: str, started_at: str) -> str:
    start = datetime.datetime.fromisoformat(started_at).astimezone(datetime.timezone.utc)
    return f"{hash_hex[:12]}-{start.strftime('%Y%m%dT%H%M%S')}.{start.microsecond // 1000:03d}Z"


def _plain(value: Any) -> Any:
    """A pandas/numpy cell as a plain Python value; NaN and NA as None."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _dig(document: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(document, Mapping):
            return None
        document = document.get(key)
    return document


def _joined(values: Iterable[Any]) -> str | None:
    """Distinct values, sorted and ", "-joined (None when there are none)."""
    distinct = sorted({str(value) for value in values if value is not None and value != ""})
    return ", ".join(distinct) or None


def _read_json(path: str | os.PathLike[str], what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"no {what} at {path}: run the workflow up to it first") from None
    except ValueError as error:
        raise StoreError(f"{path} is not valid JSON ({error}): rerun the rule that writes the {what}") from None


def read_study(
    matrix_path: str | os.PathLike[str],
    config_path: str | os.PathLike[str],
    inventory_path: str | os.PathLike[str],
) -> Study:
    """The study the workflow's files describe: the matrix joined with the records (as the
    aggregation joins them), the resolved config and the system inventory."""
    config = _read_json(config_path, "resolved config")
    inventory = _read_json(inventory_path, "system inventory")
    try:
        matrix = readers.read_matrix(matrix_path)
    except FileNotFoundError:
        raise StoreError(f"no study matrix at {matrix_path}: run the workflow up to it first") from None
    runs, _, _ = readers.read_runs(matrix)
    runs = runs.assign(counts=cell_tables.counts(runs))
    scheduler = inventory.get("scheduler") or {}
    cluster = scheduler.get("cluster_name") or inventory.get("hostname")
    partition = scheduler.get("partition")
    drivers = [gpu.get("driver") for gpu in inventory.get("gpus") or []]

    rows = []
    for run in runs.to_dict("records"):
        text = document = None
        if run["status"] != "missing":  # aggregate read and parsed it
            text = Path(run["record"]).read_text(encoding="utf-8")
            document = json.loads(text)
        row = {column: _plain(run.get(column)) for column in STORED_RUN_COLUMNS if column in run}
        row.update(
            variant=run["variant"] or "",
            cluster=_dig(document, "scheduler", "cluster_name") or cluster if document else None,
            partition=_dig(document, "scheduler", "partition") or partition if document else None,
            node_list=_joined(_dig(document, "parallel", "hostnames") or []),
            cuda_version=_dig(document, "versions", "cuda"),
            nccl_version=_dig(document, "versions", "nccl"),
            driver_version=_dig(document, "hardware", "gpu", "driver_version"),
            record_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest() if text is not None else None,
            record=text,
        )
        rows.append({column: row.get(column) for column in STORED_RUN_COLUMNS})

    started = [row["started_at"] for row in rows if row["started_at"]]
    if not started:
        raise StoreError(f"no run of the study in {matrix_path} has a record: there is nothing to store yet")
    first = min(started, key=lambda stamp: datetime.datetime.fromisoformat(stamp))
    ended = [row["ended_at"] for row in rows if row["ended_at"]]
    digest = config_hash(config)
    study_id = make_study_id(digest, first)
    for row in rows:
        row["study_id"] = study_id
    container = config.get("container") or {}
    sif = Path(container["sif"]) if container.get("enabled") and container.get("sif") else None
    dirty = {row["git_dirty"] for row in rows if row["git_dirty"] is not None}
    study = {
        "study_id": study_id,
        "config_hash": digest,
        "started_at": first,
        "ended_at": max(ended, key=lambda stamp: datetime.datetime.fromisoformat(stamp)) if ended else None,
        "study_name": config.get("study_name"),
        "git_commit": _joined(row["git_commit"] for row in rows),
        "git_dirty": (True in dirty) if dirty else None,
        "cluster": cluster,
        "partition": partition,
        "node_list": _joined(host for row in rows for host in (row["node_list"] or "").split(", ")),
        "container_image": container.get("base_image") if container.get("enabled") else None,
        "container_digest": f"sha256:{sha256_of(sif)}" if sif is not None and sif.is_file() else None,
        "torch_version": _joined(row["torch_version"] for row in rows),
        "cuda_version": _joined(row["cuda_version"] for row in rows),
        "nccl_version": _joined(row["nccl_version"] for row in rows),
        "driver_version": _joined(drivers) or _joined(row["driver_version"] for row in rows),
        "device_type": _joined(row["device_type"] for row in rows),
        "device_name": _joined(row["device_name"] for row in rows),
        "runs": len(rows),
        "runs_ok": sum(bool(row["counts"]) for row in rows),
        "config_json": canonical_json(config),
        "inventory_json": canonical_json(inventory),
        "appended_at": None,  # set when appended
    }
    return Study(study, rows)


# --------------------------------------------------------------------------------------------
# Writing and reading studies
# --------------------------------------------------------------------------------------------


# DuckDB column type -> the pandas dtype that carries it, nulls included, without loss.
_PANDAS_DTYPES = {"VARCHAR": "string", "INTEGER": "Int64", "BIGINT": "Int64", "DOUBLE": "Float64", "BOOLEAN": "boolean"}
_TYPES = {"studies": STUDY_TYPES, "runs": RUN_TYPES}


# Python types a column takes (bool is an int to Python: refused where a number is meant).
_ACCEPTS = {"VARCHAR": (str,), "INTEGER": (int,), "BIGINT": (int,), "DOUBLE": (int, float), "BOOLEAN": (bool,)}
_INTEGER_RANGE = {"INTEGER": 2**31, "BIGINT": 2**63}
_TIMESTAMPS = ("started_at", "ended_at", "appended_at")
MAX_TEXT = 1 << 20  # a field's characters (a record or a config as JSON is the longest, far below)


def _field_problem(name: str, kind: str, value: Any) -> str | None:
    """Why ``value`` cannot be column ``name`` of SQL type ``kind`` (None: it can)."""
    base, required = kind.split()[0], "NOT NULL" in kind or "PRIMARY KEY" in kind
    if value is None:
        return "missing" if required else None
    accepted = _ACCEPTS[base]
    if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
        return f"a {type(value).__name__}, not {base.lower()}"
    if base in _INTEGER_RANGE and not -_INTEGER_RANGE[base] <= value < _INTEGER_RANGE[base]:
        return f"{value} is outside the range of {base.lower()}"
    if base == "DOUBLE" and not math.isfinite(value):
        return f"{value} is not a finite number"
    if base == "VARCHAR" and len(value) > MAX_TEXT:
        return f"{len(value)} characters, more than {MAX_TEXT}"
    if name in _TIMESTAMPS:
        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            return f"{value[:40]!r} is not an ISO 8601 time"
    return None


def check_rows(study: Study) -> None:
    """Every field of the study's rows fits its column (type, range, format): what the store
    accepts, every reader can read. Raises StoreError naming the first field that does not."""
    for where, row, types in (("study", study.row, STUDY_TYPES), *((f"run {i}", run, RUN_TYPES) for i, run in enumerate(study.runs))):
        for name, kind in types.items():
            problem = _field_problem(name, kind, row.get(name))
            if problem:
                raise StoreError(f"study {str(study.row.get('study_id'))[:80]!r}: {where}: {name} is {problem}: nothing stored")


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
    study_id: str
    new_study: bool
    added: int
    replaced: int
    unchanged: int


def append(
    connection: duckdb.DuckDBPyConnection,
    study: Study,
    keep_appended_at: bool = False,
    replace: bool = True,
    before_commit: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
) -> AppendResult:
    """Add the study, or bring its stored rows up to date, in one transaction. The same study
    again changes nothing. ``keep_appended_at``: keep the row's own ``appended_at`` (an import
    that reproduces a study exactly), else it is now. ``replace=False``: a study stored with
    other rows is an error (and nothing changes), not an update. ``before_commit`` runs inside
    the transaction, last: what it writes, and whether it fails, is part of the append."""
    row = dict(study.row)
    if not keep_appended_at or not row.get("appended_at"):
        row["appended_at"] = utc_now()
    check_rows(Study(row, study.runs))
    strangers = sorted({str(run.get("study_id")) for run in study.runs if run.get("study_id") != study.study_id})
    if strangers:
        # a study adds its own runs only: a row naming another study would change that study
        raise StoreError(f"study {study.study_id} holds runs of another study ({', '.join(strangers[:3])}): nothing stored")
    with transaction(connection):
        existing = _fetch(connection, "SELECT * FROM studies WHERE study_id = ?", [study.study_id])
        stored = {r["run_id"]: r for r in _fetch(connection, "SELECT * FROM runs WHERE study_id = ?", [study.study_id])}
        if existing and not replace:
            differing = sum(stored.get(run["run_id"]) != run for run in study.runs) + len(
                set(stored) - {r["run_id"] for r in study.runs}
            )
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
                connection.execute(
                    "DELETE FROM runs WHERE study_id = ? AND run_id = ?", [study.study_id, run["run_id"]]
                )
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
    return AppendResult(study.study_id, not existing, added, replaced, unchanged)


def load_study(connection: duckdb.DuckDBPyConnection, study_id: str) -> Study:
    """A stored study, exactly as stored."""
    rows = _fetch(connection, "SELECT * FROM studies WHERE study_id = ?", [study_id])
    if not rows:
        raise StoreError(f"no study {study_id} in the store")
    runs = _fetch(connection, "SELECT * FROM runs WHERE study_id = ? ORDER BY run_id", [study_id])
    return Study(rows[0], runs)


def studies(connection: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every stored study, oldest first (by start time)."""
    frame = pd.DataFrame(_fetch(connection, "SELECT * FROM studies"), columns=list(STUDY_COLUMNS))
    if frame.empty:
        return frame
    started = pd.to_datetime(frame["started_at"], utc=True, format="ISO8601")
    return (
        frame.assign(_started=started)
        .sort_values(["_started", "study_id"])
        .drop(columns="_started")
        .reset_index(drop=True)
    )


def runs_of(connection: duckdb.DuckDBPyConnection, study_ids: Sequence[str]) -> pd.DataFrame:
    """The runs of the given studies, without their record text."""
    columns = [c for c in STORED_RUN_COLUMNS if c != "record"]
    if not study_ids:
        return pd.DataFrame(columns=columns)
    names = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join("?" for _ in study_ids)
    return pd.DataFrame(
        _fetch(connection, f"SELECT {names} FROM runs WHERE study_id IN ({marks})", list(study_ids)), columns=columns
    )


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
        receipt = _read_json(selector, "store receipt")
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
        raise StoreError(
            f"'{selector}' is the start of {len(prefixed)} study ids ({', '.join(prefixed[:4])}): give more of one"
        )
    if re.fullmatch(r"[0-9a-f]{7,40}", selector):
        at = others[
            others["git_commit"]
            .fillna("")
            .str.split(", ")
            .map(lambda commits: any(c.startswith(selector) for c in commits))
        ]
        if not at.empty:
            return at["study_id"].iloc[-1]
    on = others[others["cluster"].eq(selector)]  # a cluster name, colons and all
    if on.empty and ":" in selector:
        cluster, _, partition = selector.rpartition(":")  # a partition name has no colon; a cluster's may
        on = others[others["cluster"].eq(cluster) & others["partition"].eq(partition)]
    if not on.empty:
        return on["study_id"].iloc[-1]
    raise StoreError(
        f"no study in the store matches '{selector}' ({SELECTOR_HELP}); "
        "`python -m scalerepro.analysis.history.store list` lists them"
    )


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
    chosen = scaled[
        scaled.apply(lambda r: r["gpus"] in (ends.loc[r["model"], "min"], ends.loc[r["model"], "max"]), axis=1)
    ]
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
            device_name=("device_name", _joined),
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


def _write_json(path: Path, document: Any) -> None:
    with atomic_file(path) as stream:
        stream.write((json.dumps(document, indent=2) + "\n").encode("utf-8"))


def _write_csv(path: Path, frame: pd.DataFrame) -> None:
    with atomic_file(path) as stream:
        stream.write(frame.to_csv(index=False).encode("utf-8"))


def _append_command(args: argparse.Namespace) -> int:
    study = read_study(args.matrix, args.config, args.inventory)
    connection = connect(args.store, lock_timeout_s=args.lock_timeout)
    try:
        result = append(connection, study)
        stored = len(studies(connection))
        past = history(connection, study.study_id) if args.history else None
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
    }
    if args.receipt:
        _write_json(args.receipt, receipt)
    if past is not None:
        _write_csv(args.history, past)
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
        print(table[shown].assign(git_commit=table["git_commit"].str.slice(0, 12)).to_string(index=False))
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
            "--lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S",
            help="how long to wait for another process's lock on the store (default: %(default)s)",
        )  # fmt: skip
        return sub

    add = command("append", "append a finished study (idempotent) and write its receipt and history")
    add.add_argument("--matrix", required=True, type=Path, help="results/tables/matrix.csv")
    add.add_argument("--config", required=True, type=Path, help="results/tables/config.json (the resolved config)")
    add.add_argument("--inventory", required=True, type=Path, help="results/inventory/system.json")
    add.add_argument("--receipt", type=Path, help="JSON file saying which study was stored and what changed")
    add.add_argument("--history", type=Path, help="CSV of the study's headline cells across the stored studies")
    command("list", "list the stored studies, oldest first")
    command("migrate", "bring the store to this version's schema")
    args = parser.parse_args(argv)
    return {"append": _append_command, "list": _list_command, "migrate": _migrate_command}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
