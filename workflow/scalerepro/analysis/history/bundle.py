"""Bundles: one archive of a study, to attach to a paper or a repository and to load into
another team's results store.

    python -m scalerepro.analysis.history.bundle export --out study.zip [--results results] \
        [--store results/history.duckdb] [--workflow .]
    python -m scalerepro.analysis.history.bundle import study.zip --store results/history.duckdb \
        [--expect-sha256 HEX] [--extract DIR]

Export takes the study whose files are in ``--results`` (the one its receipt,
results/tables/store.json, names) and its rows in the store, and writes one zip:

    ro-crate-metadata.json    Workflow Run RO-Crate 0.5 metadata (RO-Crate 1.1, ``rocrate``): the
    ro-crate-preview.html     workflow (Snakefile) as main entity, one CreateAction for the study
                              (start, end, the resolved config as its object, every file it
                              wrote as its result); the preview is its human-readable page
    manifest-sha256.txt       sha256 of every other file, in ``sha256sum`` format (in an unpacked
                              bundle, ``sha256sum -c manifest-sha256.txt`` checks it)
    store/study.json          the study's rows in the store (what import loads): its studies and
                              runs rows; its prescreen's node_checks rows stay in the store
    commands.sh               per run: the trainer's exact command line, from its record, and the
                              command that reruns it in the workflow
    Snakefile, workflow/rules/*.smk                 the workflow (its commit is in the rows)
    results/tables/*          every table, summary.json, config.json (the resolved config)
    results/runs/<run>/record.json, results/plots/*, results/report/index.html,
    results/inventory/system.json

A record that differs from the one the store holds (rerun since the study was stored) stops the
export: the bundle would not be what the rows say.

Import checks, before it writes anything: the file is a complete zip (a truncated one has lost
its central directory), no entry is a link or has an unsafe path, every file is in the manifest
and every manifest entry is a file, and each sha256 matches (with ``--expect-sha256``, the
archive's own digest too), and every run row is what the record it carries measured (each
figure, status and time its record's, within rounding; every figure inside its bound; a run
counted only where it is ok: ``study_rows.check_records``), whoever reads the bundle (``compare``
too). Then it adds the study to the store in one transaction: a study already stored with the same
rows is left as it is, one stored with other rows is refused, and records stored under another
study id are refused (they would count twice in the history). Each
import is a row of the store's ``imports`` table, written in the same transaction, and the files
``--extract`` unpacks are renamed into place inside it too: any refusal or failure is one line
and leaves the store, and the extract directory, as they were.

What checksums cannot catch: a bundle whose files *and* manifest were rewritten together (its
rows are held to its records, but a record rewritten with its rows is a consistent forgery).
Export prints the archive's sha256 and writes it to ``<bundle>.sha256``: publish it beside the
bundle, and import with ``--expect-sha256``.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import duckdb

from scalerepro.analysis.columns import AGGREGATE_TABLES
from scalerepro.analysis.history import store, store_file, study_rows
from scalerepro.analysis.history.store_file import StoreError
from scalerepro.common import study_layout
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary, output_path
from scalerepro.common.files import atomic_file, sha256_of, utc_now, write_text_atomically
from scalerepro.record.read import from_document

MANIFEST = "manifest-sha256.txt"
STUDY_ROWS = "store/study.json"
COMMANDS = "commands.sh"
# The Workflow Run Crate profiles the crate conforms to (https://w3id.org/ro/wfrun/).
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
}
WFRUN_CONTEXT = "https://w3id.org/ro/terms/workflow-run/context"
MEDIA_TYPES = {
    ".json": "application/json",
    ".csv": "text/csv",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".html": "text/html",
    ".sh": "text/x-shellscript",
    ".smk": "text/plain",
}


class BundleError(CommandError):
    """A bundle that cannot be written or read, in one line that says what to do."""


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


# A bundle is a stranger's file: what it may make this process read or hold is bounded, and every
# member is hashed as a stream (a 1 GiB member of a 2 MB zip took 2.2 GB of memory when read whole).
MAX_MANIFEST_BYTES = 16 << 20
MAX_ROWS_BYTES = 512 << 20
MAX_BUNDLE_MEMBER_BYTES = 4 << 30
_CHUNK = 1 << 20


def _opened(archive: zipfile.ZipFile, name: str, limit: int, path: Path):
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise BundleError(f"{path}: {name} would be {info.file_size} bytes, more than a bundle member may be ({limit}): refusing it")
    return archive.open(info)


def _chunks(archive: zipfile.ZipFile, name: str, limit: int, path: Path) -> Iterator[bytes]:
    """The member in chunks, never more than ``limit`` bytes whatever its header says."""
    read = 0
    with _opened(archive, name, limit, path) as stream:
        while chunk := stream.read(_CHUNK):
            read += len(chunk)
            if read > limit:
                raise BundleError(f"{path}: {name} is more than {limit} bytes: refusing it")
            yield chunk


def _read_bounded(archive: zipfile.ZipFile, name: str, limit: int, path: Path) -> bytes:
    return b"".join(_chunks(archive, name, limit, path))


def _streamed_sha256(archive: zipfile.ZipFile, name: str, limit: int, path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in _chunks(archive, name, limit, path):
        digest.update(chunk)
    return digest.hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rows_document(study: study_rows.StoredStudy) -> dict[str, Any]:
    return {"schema_version": store_file.STORE_SCHEMA_VERSION, "study": study.row, "runs": study.runs}


def _commands(study: study_rows.StoredStudy) -> str:
    """A shell file: each run's trainer command (from its record) and its workflow rerun command."""
    lines = ["#!/bin/sh", f"# The exact command lines of study {study.study_id}, one block per run.", ""]
    for run in study.runs:
        lines.append(f"# {run['run_id']} ({run['status']})")
        if run["record"] is not None:
            command = from_document(json.loads(run["record"])).record.command_line
            lines.append(f"# trainer, as the record has it:\n# {shlex.join(command)}")
        lines.append("# rerun in the workflow:")
        lines.append(f"snakemake --cores all --forcerun results/runs/{shlex.quote(run['run_id'])}/record.json")
        lines.append("")
    return "\n".join(lines)


def _study_files(results: Path, study: study_rows.StoredStudy) -> dict[str, Path]:
    """Bundle path -> file, for everything the study wrote that a reader needs."""
    files: dict[str, Path] = {}

    inside = results.resolve()

    def add(path: Path) -> None:
        # a link (or a linked folder) may point anywhere: a bundle ships only the study's own files
        if not path.resolve().is_relative_to(inside) or path.is_symlink():
            raise BundleError(f"{path} is a symbolic link (to {path.resolve()}): export packs only the study's own files; replace the link with the file")
        files[f"results/{path.relative_to(results).as_posix()}"] = path

    for folder, patterns in (
        ("tables", ("*",)),
        ("plots", ("*.png", "*.svg")),
        ("report", ("index.html",)),
        ("inventory", ("system.json",)),
    ):
        for pattern in patterns:
            for path in sorted((results / folder).glob(pattern)):
                if path.is_file() and not path.name.startswith("."):
                    add(path)
    lost = [f"tables/{name}.csv" for name in AGGREGATE_TABLES if not (results / "tables" / f"{name}.csv").is_file()]
    lost += [name for name in ("tables/summary.json", "tables/matrix.csv", "tables/config.json", "report/index.html") if not (results / name).is_file()]
    if lost:
        raise BundleError(
            f"{results} lacks {len(lost)} of the study's outputs ({', '.join(lost[:4])}{', ...' if len(lost) > 4 else ''}): "
            "run the workflow again (it rebuilds them), then export"
        )
    for run in study.runs:
        if run["record"] is None:
            continue
        # the record the run reads, as the study names it: its own, or the run's whose record it reuses
        path = results / Path(study_layout.run_record(run["run_id"], run["record_of"])).relative_to(study_layout.RESULTS_DIR)
        if not path.is_file() or path.read_text(encoding="utf-8") != run["record"]:
            raise BundleError(
                f"{path} is not the record the store holds for {run['run_id']} (rerun since the study was stored?): "
                "run the workflow again so that store_study stores it, then export"
            )
        add(path)
    return files


def _crate(stage: Path, sources: Mapping[str, Path], study: study_rows.StoredStudy, workflow_files: Sequence[str]) -> None:
    """Write the files and their Workflow Run RO-Crate metadata into ``stage``."""
    from rocrate.model.contextentity import ContextEntity
    from rocrate.rocrate import ROCrate

    crate = ROCrate(gen_preview=True, version="1.1")
    row = study.row
    crate.name = f"scalerepro study {study.study_id}"
    crate.description = (
        f"A distributed deep-learning scaling study ({row.get('study_name')}) run by scalerepro on {row.get('cluster')}: "
        f"{row.get('runs')} runs ({row.get('runs_ok')} counted), devices {row.get('device_name')}, commit {row.get('git_commit')}."
    )
    crate.license = "Apache-2.0"
    crate.metadata.extra_contexts.append(WFRUN_CONTEXT)
    workflow = crate.add_workflow(
        sources["Snakefile"],
        "Snakefile",
        main=True,
        lang="snakemake",
        properties={"name": "scalerepro scaling study workflow", "version": row.get("git_commit") or "unknown"},
    )
    parts = [crate.add_file(sources[name], name, properties={"encodingFormat": "text/plain"}) for name in workflow_files]
    if parts:
        workflow["hasPart"] = parts
    for profile, name in PROFILES.items():
        entity = crate.add(ContextEntity(crate, profile, properties={"@type": "CreativeWork", "name": name, "version": "0.5"}))
        crate.root_dataset.append_to("conformsTo", entity)
    results = []
    config = None
    for name in sorted(sources):
        if name == "Snakefile" or name in workflow_files:
            continue
        media = MEDIA_TYPES.get(PurePosixPath(name).suffix)
        entity = crate.add_file(sources[name], name, properties={"encodingFormat": media} if media else None)
        if name == "results/tables/config.json":
            entity["name"] = "the resolved study configuration"
            config = entity
        else:
            results.append(entity)
    action = crate.add_action(
        workflow,
        identifier=f"#study-{study.study_id}",
        object=[config] if config is not None else None,
        result=results,
        properties={
            "name": f"scalerepro study {study.study_id}",
            "startTime": row.get("started_at"),
            "endTime": row.get("ended_at"),
        },
    )
    crate.root_dataset["mentions"] = [action]
    crate.write(stage)


def export_bundle(
    results: str | Path,
    store_path: str | Path,
    out: str | Path,
    workflow_dir: str | Path = ".",
    lock_timeout_s: float = store_file.DEFAULT_LOCK_TIMEOUT_S,
) -> str:
    """Write the bundle of the study in ``results``; returns the archive's sha256."""
    results, out, workflow_dir = Path(results), Path(out), Path(workflow_dir)
    receipt = results / "tables" / "store.json"
    try:
        study_id = json.loads(receipt.read_text())["study_id"]
    except (OSError, ValueError, KeyError):
        raise BundleError(f"{receipt} is missing or has no study_id: run the workflow (rule store_study) first") from None
    connection = store_file.connect(store_path, read_only=True, lock_timeout_s=lock_timeout_s)
    try:
        study = store.load_study(connection, study_id)
    finally:
        connection.close()
    sources = _study_files(results, study)
    snakefile = workflow_dir / "Snakefile"
    if not snakefile.is_file():
        raise BundleError(f"no Snakefile in {workflow_dir}: give the repository with --workflow")
    rules = sorted((workflow_dir / "workflow" / "rules").glob("*.smk"))
    workflow_files = [f"workflow/rules/{path.name}" for path in rules]
    sources.update({"Snakefile": snakefile, **dict(zip(workflow_files, rules))})
    with tempfile.TemporaryDirectory(prefix="scalerepro-bundle-") as temporary:
        generated = Path(temporary) / "generated"
        generated.mkdir()
        for name, text in (
            (STUDY_ROWS, json.dumps(_rows_document(study), indent=1) + "\n"),
            (COMMANDS, _commands(study)),
        ):
            path = generated / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            sources[name] = path
        stage = Path(temporary) / "stage"
        _crate(stage, sources, study, workflow_files)
        members = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())
        manifest = "".join(f"{_sha256((stage / name).read_bytes())}  {name}\n" for name in members)
        (stage / MANIFEST).write_text(manifest, encoding="utf-8")
        with atomic_file(out) as stream, zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in [MANIFEST, *members]:
                archive.write(stage / name, name)
    digest = sha256_of(out)
    # atomically, like the bundle: a full disk must not leave a 0-byte checksum beside a whole zip
    write_text_atomically(f"{out}.sha256", f"{digest}  {out.name}\n")
    return digest


# --------------------------------------------------------------------------------------------
# Reading and importing
# --------------------------------------------------------------------------------------------


@dataclass
class Bundle:
    path: Path
    sha256: str
    study: study_rows.StoredStudy
    members: dict[str, str]  # name -> sha256 (the manifest, verified)


def _safe(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and "\\" not in name and not path.is_absolute() and ".." not in path.parts and name == path.as_posix()


def _members(archive: zipfile.ZipFile) -> Iterator[zipfile.ZipInfo]:
    for info in archive.infolist():
        if info.is_dir():
            continue
        if stat.S_ISLNK(info.external_attr >> 16):
            raise BundleError(f"entry {info.filename!r} is a symbolic link: bundles hold plain files only")
        if not _safe(info.filename):
            raise BundleError(f"entry {info.filename!r} has an unsafe path (absolute, '..' or backslashes)")
        yield info


def read_bundle(path: str | Path, expect_sha256: str | None = None) -> Bundle:
    """The bundle's study, once every check of the module docstring has passed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise BundleError(f"cannot read the bundle {path}: {error.strerror}") from None
    digest = _sha256(data)
    if expect_sha256 is not None and digest != expect_sha256.lower():
        raise BundleError(f"{path} has sha256 {digest}, not the expected {expect_sha256}: it is not the published bundle")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = list(_members(archive))
            names = [info.filename for info in infos]
            if len(set(names)) != len(names):
                raise BundleError(f"{path} lists an entry twice: refusing it")
            if MANIFEST not in names:
                raise BundleError(f"{path} has no {MANIFEST}: it is not a scalerepro bundle")
            listed: dict[str, str] = {}
            for line in _read_bounded(archive, MANIFEST, MAX_MANIFEST_BYTES, path).decode("utf-8").splitlines():
                checksum, _, name = line.partition("  ")
                if len(checksum) != 64 or not name:
                    raise BundleError(f"{path}: {MANIFEST} has a malformed line {line[:80]!r}")
                listed[name] = checksum
            present = set(names) - {MANIFEST}
            if present - set(listed):
                raise BundleError(f"{path} holds files its manifest does not list (e.g. {sorted(present - set(listed))[0]}): refusing it")
            if set(listed) - present:
                raise BundleError(f"{path} lacks files its manifest lists (e.g. {sorted(set(listed) - present)[0]}): it is incomplete")
            for name in sorted(present):
                if _streamed_sha256(archive, name, MAX_BUNDLE_MEMBER_BYTES, path) != listed[name]:
                    raise BundleError(f"{path}: {name} does not match its checksum in {MANIFEST}: the bundle was altered or damaged")
            rows = json.loads(_read_bounded(archive, STUDY_ROWS, MAX_ROWS_BYTES, path).decode("utf-8"))
    except (RuntimeError, NotImplementedError) as error:  # an encrypted member, an unknown compression method
        raise BundleError(f"{path}: a member cannot be read ({error}): a scalerepro bundle is a plain zip") from None
    except zipfile.BadZipFile as error:
        raise BundleError(f"{path} is not a complete zip archive (truncated or damaged: {error}): fetch the bundle again") from None
    except (KeyError, ValueError) as error:
        raise BundleError(f"{path}: {STUDY_ROWS} is missing or unreadable ({error})") from None
    if rows.get("schema_version") == 2 and isinstance(rows.get("runs"), list):
        # version 2's rows: the same columns under their old names (store_file.MIGRATIONS[3])
        renamed = {old: new for new, old in store_file.RENAMED_RUN_COLUMNS.items()}
        rows = {**rows, "schema_version": 3, "runs": [{renamed.get(k, k): v for k, v in run.items()} if isinstance(run, dict) else run for run in rows["runs"]]}
    if rows.get("schema_version") == 3:
        rows = {**rows, "schema_version": 4}  # store_file.MIGRATIONS[4] changed the imports table only: the same rows
    if rows.get("schema_version") == 4 and isinstance(rows.get("runs"), list):
        # version 4's rows: every run its own (store_file.MIGRATIONS[5] added record_of)
        rows = {**rows, "schema_version": 5, "runs": [{**run, "record_of": ""} if isinstance(run, dict) else run for run in rows["runs"]]}
    if rows.get("schema_version") == 5 and isinstance(rows.get("runs"), list):
        # version 5's rows: each run's cell, as the study named its runs <cell>_r<repeat> (store_file.MIGRATIONS[6])
        rows = {**rows, "schema_version": 6, "runs": [{**run, "cell": _cell_of(run)} if isinstance(run, dict) else run for run in rows["runs"]]}
    if rows.get("schema_version") == 6:
        # store_file.MIGRATIONS[7] added the node_checks table, which stays in its store: the same rows
        rows = {**rows, "schema_version": 7}
    if rows.get("schema_version") != store_file.STORE_SCHEMA_VERSION:
        raise BundleError(
            f"{path} holds rows of store schema version {rows.get('schema_version')}, this scalerepro reads "
            f"{store_file.STORE_SCHEMA_VERSION}: import it with the scalerepro that wrote it"
        )
    study_row, runs = rows.get("study") or {}, rows.get("runs") or []
    if set(study_row) != set(store_file.STUDY_COLUMNS) or any(set(run) != set(store_file.STORED_RUN_COLUMNS) for run in runs):
        raise BundleError(f"{path}: {STUDY_ROWS} does not have the store's columns")
    study = study_rows.StoredStudy(study_row, runs)
    try:
        study_rows.check_rows(study)  # before the store is opened: a refused bundle leaves no file behind
    except StoreError as error:
        raise BundleError(f"{path}: {error}") from None
    strangers = sorted({str(run["study_id"]) for run in runs if run["study_id"] != study_row["study_id"]})
    if strangers:
        raise BundleError(
            f"{path}: {STUDY_ROWS} holds runs of another study ({', '.join(strangers[:3])}) than its own "
            f"({study_row['study_id']}): a bundle adds only its own study"
        )
    return Bundle(path, digest, study, listed)


def import_bundle(
    path: str | Path,
    store_path: str | Path,
    expect_sha256: str | None = None,
    extract: str | Path | None = None,
    lock_timeout_s: float = store_file.DEFAULT_LOCK_TIMEOUT_S,
) -> tuple[Bundle, store.AppendResult]:
    """Verify the bundle, then add its study to the store and unpack it into ``extract``: all of
    it or, on any refusal or failure, none of it (no row stored, no file left)."""
    bundle = read_bundle(path, expect_sha256)
    target = None if extract is None else Path(extract)
    if target is not None:
        if target.is_symlink():  # the files would land wherever the link points
            raise BundleError(f"{target} is a symbolic link: give a new directory (not a link) to --extract")
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise BundleError(f"{target} is not an empty directory: give a new directory to --extract")
    staging = None if target is None else _unpack(bundle, target)  # beside the target
    placed = False

    def record_and_place(connection: duckdb.DuckDBPyConnection) -> None:
        # Inside the append's transaction: if the files cannot be put in place, nothing is stored.
        nonlocal placed
        connection.execute("INSERT INTO imports VALUES (?, ?, ?, ?)", [bundle.sha256, bundle.study.study_id, str(bundle.path), utc_now()])
        if staging is not None and target is not None:
            if target.exists():
                target.rmdir()  # empty, checked before
            staging.rename(target)
            placed = True

    try:
        connection = store_file.connect(store_path, lock_timeout_s=lock_timeout_s)
        try:
            result = store.append(connection, bundle.study, keep_appended_at=True, replace=False, before_commit=record_and_place)
        finally:
            connection.close()
    except BaseException:
        if placed and target is not None:  # the COMMIT failed after the rename: the files go too
            shutil.rmtree(target, ignore_errors=True)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return bundle, result


def _cell_of(run: Mapping[str, Any]) -> str:
    """The cell of a run a bundle of store version 5 holds: its run id less _r<repeat>, as the
    migration to version 6 takes it (store_file.MIGRATIONS[6])."""
    return re.sub(r"_r[0-9]+$", "", str(run.get("run_id")))


def _unpack(bundle: Bundle, target: Path) -> Path:
    """Unpack the verified bundle into a hidden directory beside ``target``; each file is checked
    again as it is written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with zipfile.ZipFile(bundle.path) as archive:
            for name in [MANIFEST, *bundle.members]:
                destination = staging / name
                destination.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with open(destination, "wb") as stream:  # in chunks: never the whole member in memory
                    for chunk in _chunks(archive, name, MAX_MANIFEST_BYTES if name == MANIFEST else MAX_BUNDLE_MEMBER_BYTES, bundle.path):
                        digest.update(chunk)
                        stream.write(chunk)
                if name != MANIFEST and digest.hexdigest() != bundle.members[name]:
                    raise BundleError(f"{bundle.path} changed while it was unpacked: {name}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


_PROG = "scalerepro.analysis.history.bundle"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write the bundle of the study in --results")
    export.add_argument("--out", required=True, type=output_path, help="the bundle to write (.zip)")
    export.add_argument("--results", type=Path, default=Path("results"), help="the study's results directory (default: %(default)s)")
    export.add_argument("--workflow", type=Path, default=Path("."), help="the repository the study ran from (default: %(default)s)")
    imported = commands.add_parser("import", help="verify a bundle and add its study to a store")
    imported.add_argument("bundle", type=Path)
    imported.add_argument("--expect-sha256", help="the bundle's published sha256 (its .sha256 file)")
    imported.add_argument("--extract", type=Path, help="also unpack the verified files into this new directory")
    for sub in (export, imported):
        sub.add_argument(
            "--store",
            type=Path,
            default=Path("results/history.duckdb"),
            help="the results store (default: %(default)s)",
        )
        sub.add_argument(
            "--lock-timeout",
            type=store_file.LOCK_TIMEOUT_S,
            default=store_file.DEFAULT_LOCK_TIMEOUT_S,
            help="seconds to wait for the store's lock",
        )
    args = parser.parse_args(argv)
    if args.command == "export":
        if args.out.suffix != ".zip":
            raise BundleError(f"{args.out}: a bundle is a zip archive, name it <something>.zip")
        digest = export_bundle(args.results, args.store, args.out, args.workflow, args.lock_timeout)
        print(f"bundle: {args.out} sha256 {digest} (also in {args.out}.sha256)")
    else:
        bundle, result = import_bundle(args.bundle, args.store, args.expect_sha256, args.extract, args.lock_timeout)
        state = "added" if result.new_study else "already in the store, unchanged"
        print(f"bundle: {bundle.study.study_id} from {args.bundle} ({len(bundle.members)} files verified): {state} in {args.store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
