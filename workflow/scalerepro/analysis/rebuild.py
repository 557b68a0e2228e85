"""Regenerate the tables, figures and report of a finished study from its files alone: no run,
no benchmark, no Snakemake.

    python -m scalerepro.analysis.rebuild --results results

What it reads under ``--results`` (what the workflow left there): ``tables/matrix.csv`` (the
planned runs, with the path of each record), the records it names, ``tables/config.json`` (the
resolved config: the targets and the counts the scaling model predicts), ``comm/g*.json``,
``profiles/*/`` (when the study was profiled: each run's captures summarised again, its
summary.json where the captures are gone), ``inventory/system.json``; and
``--references`` (``config/references.yaml``) and ``--templates`` (``report/``). It writes what
the aggregate, plots and report rules write: ``tables/*.csv`` and ``summary.json``,
``plots/*.png|svg``, ``report/index.html``. A record path in the matrix that is relative is
resolved against the directory that holds ``--results`` (where the workflow ran), so a copied
results folder rebuilds where it lies.

Use it after changing the analysis code, the references or the templates, or to read an old
study's records with today's statistics.

    python -m scalerepro.analysis.rebuild --records DIR --out OUT

The same report from a folder of run records that no study planned (runs of the trainer by hand,
records kept from a GPU session): every ``*.json`` in ``DIR`` that is a run record becomes one run
(``record_matrix``: its model, GPU count, precision, per-GPU batch and configuration as the record
states them; records of one configuration are repeats of one cell), an all-reduce result of
``scalerepro.training.commbench`` beside them is the communication table, a system inventory
(``scalerepro.telemetry.inventory``'s ``system.json``) the system section, and any other JSON is
named and left out. ``OUT`` gets ``tables/``, ``plots/`` and ``report/index.html``.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from scalerepro.analysis import columns
from scalerepro.analysis.evidence import read_json_document
from scalerepro.analysis.presentation import plots, report
from scalerepro.analysis.profiles import captures
from scalerepro.analysis.tables import aggregate, readers
from scalerepro.analysis.tables.readers import RECORDS_STUDY, dig
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import write_text_atomically


def _targets(config: dict) -> dict[str, Any]:
    """The targets the aggregation knows (checks included), from the resolved config."""
    return {key: value for key, value in (config.get("targets") or {}).items() if key in columns.TARGETS}


def _is_run_record(document: Any) -> bool:
    return isinstance(document, dict) and {"schema_version", "run_id", "status", "measurements"} <= document.keys()


def _is_comm_result(document: Any) -> bool:
    return isinstance(document, dict) and {"world_size", "results", "time_definitions"} <= document.keys()


def _is_inventory(document: Any) -> bool:
    """What scalerepro.telemetry.inventory writes (results/inventory/system.json)."""
    return isinstance(document, dict) and {"hostname", "collected_at", "gpus", "software"} <= document.keys()


# The knobs that make two records of one preset label different configurations (a preset's
# content can change between versions: the optimised preset compiles the conv nets with CUDA
# graphs since 2026-11-26)
CONFIG_KNOBS = ("compile", "channels_last", "cudnn_benchmark", "loader", "optimizer_impl", "grad_accum_steps")


def variant_of(record: dict[str, Any]) -> str:
    """What configuration a record ran, in a few words: its preset and each flag that departs from
    it (``optimised, precision=fp16``)."""
    knobs = record.get("knobs") or {}
    overrides = knobs.get("preset_overrides") or {}
    return ", ".join([str(knobs.get("preset") or "no preset"), *(f"{name}={value}" for name, value in sorted(overrides.items()))])


def _read_folder(records_dir: Path) -> tuple[list[tuple[Path, dict]], list[Path], list[Path], list[str]]:
    if not records_dir.is_dir():
        raise CommandError(f"{records_dir}: no such folder of run records (give the folder that holds the *.json records)")
    records, comm, inventories, skipped = [], [], [], []
    for path in sorted(records_dir.glob("*.json")):
        try:
            document = read_json_document(path, what="JSON file")
        except (OSError, ValueError) as error:  # EvidenceError among them: too large, too deep, not JSON
            skipped.append(f"{path.name} (unreadable: {error})")
            continue
        if _is_comm_result(document):
            comm.append(path)
        elif _is_inventory(document):
            inventories.append(path)
        elif _is_run_record(document):
            records.append((path, document))
        else:
            skipped.append(f"{path.name} (not a run record)")
    return records, comm, inventories, skipped


def record_matrix(records_dirs: Sequence[Path]) -> tuple[pd.DataFrame, list[Path], list[Path], list[str]]:
    """A study matrix for the run records in ``records_dirs`` (module docstring), the commbench
    results and system inventories beside them, and the names of the other JSON files, which are
    left out. A run's id is its file's name less .json, prefixed with its folder's name when
    several folders are read."""
    rows, comm, inventories, skipped = [], [], [], []
    for records_dir in records_dirs:
        records, found_comm, found_inventories, found_skipped = _read_folder(records_dir)
        comm += found_comm
        inventories += found_inventories
        skipped += [f"{records_dir.name}/{name}" if len(records_dirs) > 1 else name for name in found_skipped]
        for path, document in records:
            get = lambda *keys: dig(document, keys)  # noqa: E731
            gpus = get("parallel", "gpus") or get("parallel", "world_size") or 1
            command = get("command_line")
            rows.append({
                "run_id": f"{records_dir.resolve().name}_{path.stem}" if len(records_dirs) > 1 else path.stem,
                "study": RECORDS_STUDY, "model": get("model", "name"), "gpus": gpus,
                "nodes": get("parallel", "nodes") or 1, "gpus_per_node": get("parallel", "gpus_per_node") or gpus,
                "variant": variant_of(document), "precision": get("precision"),
                "per_gpu_batch": get("batch", "per_gpu") or get("batch", "per_rank"),  # schema 2 named it per_rank
                "grad_accum_steps": get("batch", "grad_accum_steps") or 1, "global_batch": get("batch", "global"),
                "bucket_cap_mb": get("knobs", "bucket_cap_mb"), "parallel": get("parallel", "strategy") or "ddp",
                "data_parallel": None, "reference": "", "runtime_min": None, "record": str(path.resolve()),
                "rerun": shlex.join(str(word) for word in command) if isinstance(command, list) else "",
                **{f"knob_{knob}": str(get("knobs", knob)) for knob in CONFIG_KNOBS},
            })  # fmt: skip
    if not rows:
        raise CommandError(f"{', '.join(map(str, records_dirs))}: no run record among the JSON files there (a run record is what python -m scalerepro.training.train --record writes)")
    matrix = pd.DataFrame(rows)
    if matrix["run_id"].duplicated().any():
        raise CommandError(f"two records are named {sorted(matrix.loc[matrix.run_id.duplicated(), 'run_id'])[0]}: give folders of different names")
    # Records of one label whose resolved knobs differ are different cells: the label says which knobs.
    label = ["model", "gpus", "precision", "per_gpu_batch", "variant"]
    knobs = [f"knob_{knob}" for knob in CONFIG_KNOBS]
    for _, group in matrix.groupby(label, dropna=False):
        differing = [k for k in knobs if group[k].nunique() > 1]
        if differing:
            suffix = group[differing].apply(lambda row: ", ".join(f"{k.removeprefix('knob_')} {v}" for k, v in row.items()), axis=1)
            matrix.loc[group.index, "variant"] = group["variant"] + " (" + suffix + ")"
    matrix["repeat"] = matrix.groupby(label, dropna=False).cumcount() + 1
    order = [*columns.MATRIX_COLUMNS, *(c for c in columns.OPTIONAL_MATRIX_COLUMNS if c not in columns.MATRIX_COLUMNS)]
    return matrix[order], comm, inventories, skipped


def rebuild_records(records_dirs: Sequence[Path], out: Path, references: Path, templates: Path, study_config: Path | None) -> dict[str, object]:
    """The report of folders of run records no study planned, written under ``out``; the targets
    (checks) and the scaling model's predictions are those of ``study_config`` where given."""
    matrix, comm, inventories, skipped = record_matrix(records_dirs)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} is a file: give a folder for tables/, plots/ and report/")
    config: dict[str, Any] = {}
    if study_config is not None:
        try:
            loaded = yaml.safe_load(study_config.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise CommandError(f"--config {study_config}: cannot be read as YAML ({error}): give a study config such as config/config.yaml") from None
        config = {key: loaded[key] for key in ("targets", "scaling") if isinstance(loaded, dict) and key in loaded}
    names = ", ".join(d.resolve().name for d in records_dirs)
    config.update(study_name=f"run records of {names}", records_dirs=[str(d.resolve()) for d in records_dirs])
    (out / "tables").mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / "tables" / "matrix.csv", matrix.to_csv(index=False))
    write_text_atomically(out / "tables" / "config.json", json.dumps(config, indent=1))
    if comm:
        (out / "comm").mkdir(exist_ok=True)
        for index, path in enumerate(comm):  # named as the workflow names them: g<gpus>.json
            document = json.loads(path.read_bytes())
            write_text_atomically(out / "comm" / f"g{document['world_size']}{'' if index == 0 else f'-{index}'}.json", json.dumps(document))
    if inventories:  # the system the records ran on; the report describes one, the first folder's
        (out / "inventory").mkdir(exist_ok=True)
        write_text_atomically(out / "inventory" / "system.json", inventories[0].read_text())
        skipped += [f"{path} (a second inventory: the report describes the first, {inventories[0]})" for path in inventories[1:]]
    done = rebuild(out, references, templates)
    done["skipped"] = skipped
    return done


def rebuild(results: Path, references: Path, templates: Path) -> dict[str, object]:
    """Tables, figures and report from the files under ``results`` (module docstring)."""
    tables_dir = results / "tables"
    matrix_path = tables_dir / "matrix.csv"
    if not matrix_path.is_file():
        raise CommandError(f"{matrix_path}: no study matrix (run the workflow's study_matrix rule, or point --results at a study)")
    config_path = tables_dir / "config.json"
    config = read_json_document(config_path, what="resolved config") if config_path.is_file() else {}
    # the aggregation's checks (empty, not CSV, columns, repeated run ids) on the user's file, so that
    # an error names it, not the scratch copy with resolved paths made below
    readers.read_matrix(matrix_path)
    # record paths relative to where the workflow ran (the folder holding results/)
    matrix = pd.read_csv(matrix_path, dtype=str, keep_default_na=False)
    base = results.resolve().parent
    matrix["record"] = [r if os.path.isabs(r) or not r else str(base / r) for r in matrix["record"]]
    with tempfile.TemporaryDirectory() as scratch:
        resolved = Path(scratch) / "matrix.csv"
        matrix.to_csv(resolved, index=False)
        comm = sorted((results / "comm").glob("g*.json"))
        scaling = config.get("scaling") or {}
        predict = scaling.get("predict_gpus", list(aggregate.scaling_model.DEFAULT_PREDICT_GPUS))
        tables = aggregate.aggregate(resolved, comm, references, _targets(config), predict, scaling.get("predict_cluster"))
    summary = aggregate.write_tables(tables, tables_dir)
    summaries = captures.study_summaries(results, config, matrix)  # made again from the captures, with today's code
    if summaries:
        for name, table in captures.tables(summaries).items():
            write_text_atomically(tables_dir / f"{name}.csv", table.to_csv(index=False))
    drawn = plots.draw(plots.read_tables(tables_dir), results / "plots")
    out = results / "report" / "index.html"
    inventory = results / "inventory" / "system.json"
    html = report.render(tables_dir, results / "plots", inventory, config_path, references, templates, out.parent)
    write_text_atomically(out, html)
    return {"summary": summary, "figures": drawn, "profiled_runs": len(summaries), "report": out}


_PROG = "scalerepro.analysis.rebuild"
# the workflow checkout that holds this package (workflow/scalerepro/analysis/rebuild.py)
_CHECKOUT = Path(__file__).resolve().parents[3]


def _from_here_or_checkout(relative: str) -> Path:
    """A default input: where the command runs when it is there (a workflow's root), else the file
    of the checkout this package belongs to, so a rebuild run from any folder finds its references."""
    here = Path(relative)
    return here if here.exists() or not (_CHECKOUT / relative).exists() else _CHECKOUT / relative


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=None, help="the study's results folder (default: results)")
    parser.add_argument("--records", type=Path, nargs="+", default=None, help="instead: folders of run records no study planned (with --out)")
    parser.add_argument("--config", type=Path, default=None, help="with --records: the study config whose targets and predictions apply (default config/config.yaml)")
    parser.add_argument("--out", type=Path, default=None, help="with --records: the folder that gets tables/, plots/ and report/")
    parser.add_argument("--references", type=Path, default=None, help="published figures, GPU peaks, links (default config/references.yaml)")
    parser.add_argument("--templates", type=Path, default=None, help="directory holding templates/ and style.css (default report/)")
    args = parser.parse_args(argv)
    args.references = args.references or _from_here_or_checkout("config/references.yaml")
    args.templates = args.templates or _from_here_or_checkout("report")
    if args.config is None:
        default_config = _from_here_or_checkout("config/config.yaml")
        args.config = default_config if default_config.is_file() else None
    elif not args.config.is_file():
        parser.error(f"--config {args.config}: no such file (the study config whose targets and predictions apply)")
    if args.records is not None:
        if args.results is not None or args.out is None:
            parser.error("--records needs --out (the folder to write) and no --results")
        done = rebuild_records(args.records, args.out, args.references, args.templates, args.config)
        if done["skipped"]:
            print(f"rebuild: left out {len(done['skipped'])} JSON files: {'; '.join(done['skipped'])}", file=sys.stderr)
    else:
        if args.out is not None:
            parser.error("--out goes with --records; a study's results folder is rebuilt in place (--results)")
        done = rebuild(args.results or Path("results"), args.references, args.templates)
    summary = done["summary"]
    print(
        f"rebuild: {summary['runs']} runs {summary['status']}, checks {summary['checks']}, comparison "
        f"{summary['comparison']}; {sum(1 for v in done['figures'].values() if v == 'drawn')} figures; "
        f"report {done['report']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
