"""The results store's DuckDB file: its tables and schema version, the migrations between
versions, opening it (waiting out another process's lock, refusing a damaged or foreign file)
and all-or-nothing transactions. What the tables hold is in ``scalerepro.analysis.history.store``.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import duckdb

from scalerepro.common.cli import CommandError, bounded_float
from scalerepro.common.files import current_umask

STORE_SCHEMA_VERSION = 7
DEFAULT_LOCK_TIMEOUT_S = 60.0
# --lock-timeout: seconds, at most a day (a typo must not wait for ever).
LOCK_TIMEOUT_S = bounded_float(0, 24 * 3600)

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
    # the run whose record this row reads, where another cell of the study runs the same trainer run
    # (the strong and weak cells at the largest count, at one batch); "" where the run is its own
    "record_of": "VARCHAR",
    # the cell the run repeats (the matrix's: scalerepro.record.cell)
    "cell": "VARCHAR",
}
STORED_RUN_COLUMNS = tuple(RUN_TYPES)

# The prescreen's figures (record.node_check), one row per study, node and device: kept so that a
# node getting slower over weeks shows across studies. A node's all-reduce is the node's, on each
# of its devices' rows; excluded_because is null where the node passed.
NODE_CHECK_TYPES: dict[str, str] = {
    "study_id": "VARCHAR NOT NULL",
    "node": "VARCHAR NOT NULL",
    "started_at": "VARCHAR NOT NULL",
    "device_type": "VARCHAR",
    "precision": "VARCHAR",
    "device_index": "INTEGER NOT NULL",
    "device_name": "VARCHAR",
    "matmul_tflops": "DOUBLE",
    "memory_gbps": "DOUBLE",
    "allreduce_busbw_gbps": "DOUBLE",
    "link_busbw_gbps": "DOUBLE",
    "link_reference": "VARCHAR",
    "clock_mhz": "DOUBLE",
    "temperature_c": "DOUBLE",
    "power_w": "DOUBLE",
    "excluded_because": "VARCHAR",
    "fraction": "DOUBLE",
}
NODE_CHECK_COLUMNS = tuple(NODE_CHECK_TYPES)


def _create_table_sql(table: str, types: Mapping[str, str], key: str = "") -> str:
    """The CREATE TABLE statement of ``table`` with ``types``' columns (``key``: a table constraint after them)."""
    columns = ", ".join(f'"{name}" {kind}' for name, kind in types.items())
    return f"CREATE TABLE {table} ({columns}{key})"


# version -> the statements that take a store from the previous version to it. Never edit a
# released step: add the next one (and a test that migrates a file of the previous version).
# Columns renamed since version 1 (new name: old name); version 1's runs table had the old ones.
RENAMED_RUN_COLUMNS = {"per_gpu_batch": "per_rank_batch", "scheduler_job_id": "slurm_job_id"}
# Columns added since version 1, by the version that added them (each its own migration step).
ADDED_RUN_COLUMNS = {"record_of": 5, "cell": 6}
_RUN_TYPES_V1 = {RENAMED_RUN_COLUMNS.get(name, name): kind for name, kind in RUN_TYPES.items() if name not in ADDED_RUN_COLUMNS}

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
        _create_table_sql("studies", STUDY_TYPES),
        _create_table_sql("runs", _RUN_TYPES_V1, ", PRIMARY KEY (study_id, run_id)"),
    ),
    # Bundles: which studies came from which bundle (the studies and runs rows stay exactly as
    # exported, so where a study came from is kept beside them).
    2: ("CREATE TABLE imports (bundle_sha256 VARCHAR PRIMARY KEY, study_id VARCHAR NOT NULL, path VARCHAR, imported_at VARCHAR NOT NULL)",),
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
    # A row may read another cell's run: the study runs one trainer run once (record_of)
    5: ("ALTER TABLE runs ADD COLUMN record_of VARCHAR DEFAULT ''",),
    # Each run names its cell, the matrix's; before, a study named its runs <cell>_r<repeat>
    6: ("ALTER TABLE runs ADD COLUMN cell VARCHAR DEFAULT ''", "UPDATE runs SET cell = regexp_replace(run_id, '_r[0-9]+$', '')"),
    # The prescreen's figures of each node the study screened (store.append_node_checks)
    7: (_create_table_sql("node_checks", NODE_CHECK_TYPES, ", PRIMARY KEY (study_id, node, device_index)"),),
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
        _create_store_file(path)
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
                f"the results store {path} has schema version {version}, newer than this scalerepro understands ({STORE_SCHEMA_VERSION}): upgrade scalerepro"
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
    query = "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
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
            names = [column for column, _ in described]
            every_value = ", ".join(f'max(length(CAST("{column}" AS VARCHAR)))' for column in names)
            connection.execute(f'SELECT count(*), {every_value} FROM "{table}"').fetchall()
    except duckdb.Error as error:
        raise StoreError(_damaged(path, error)) from None


def _create_store_file(path: Path) -> None:
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
