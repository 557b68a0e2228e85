"""Regenerate the tables, figures and report of a finished study from its files alone: no run, no benchmark, no Snakemake.

    python -m scalerepro.analysis.rebuild --results DIR

``DIR`` is a study folder as the workflow wrote it (``results/``), wherever it now lies and
whatever it is now called (a kept study copied elsewhere). What it reads there:
``tables/matrix.csv`` (the planned runs, with the path of each record), the records it names,
``tables/config.json`` (the resolved config: the targets and the counts the scaling model
predicts), ``comm/g*.json``, ``profiles/*/`` (when the study was profiled: each run's captures
summarised again, its summary.json where the captures are gone), ``inventory/system.json``; and
``--references`` (``config/references.yaml``) and ``--templates`` (``report/``). It writes what
the aggregate, plots and report rules write: ``tables/*.csv`` and ``summary.json``,
``plots/*.png|svg``, ``report/index.html``. Every record path of the matrix resolves inside
``DIR`` (``results/runs/<run>/record.json`` is ``DIR/runs/<run>/record.json``:
``scalerepro.common.study_layout``); one that lies outside it is refused, and a file beside the
records that is not of this study's runs (another study's profiles, another machine's inventory,
an all-reduce over another backend) is left out and named (``scalerepro.analysis.study_files``).

Use it after changing the analysis code, the references or the templates, or to read an old
study's records with today's statistics.

    python -m scalerepro.analysis.rebuild --records DIR... --out OUT

The same report from folders of run records that no study planned (runs of the trainer by hand,
records kept from a GPU session): every ``*.json`` in each ``DIR`` that is a run record becomes one
run (``record_matrix``: its model, rank and node counts, precision, batches, strategy, device, data,
shape and configuration as the record states them, and its purpose: a smoke run is a cell of its
own and counts in no figure; records of one configuration are repeats of one cell, and one run kept
under two names counts once), an all-reduce result of ``scalerepro.training.commbench`` beside them
is the communication table, a system inventory (``scalerepro.telemetry.inventory``'s
``system.json``) the system section, and any other JSON is named and left out. ``OUT`` becomes a
study folder of its own: ``runs/`` (a copy of each record), ``tables/``, ``plots/`` and
``report/index.html``, and reads again with ``--results OUT``.

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd
import yaml

from scalerepro.analysis import columns, study_files
from scalerepro.analysis.presentation import inventory_view, plots, report
from scalerepro.analysis.profiles import captures
from scalerepro.analysis.tables import aggregate, check_definitions, readers
from scalerepro.analysis.tables.readers import RECORDS_STUDY
from scalerepro.common import study_layout, yaml_text
from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import read_json_object, write_text_atomically
from scalerepro.record import upgrade
from scalerepro.record.cell import RUN_CONDITIONS
from scalerepro.record.model import RunRecord
from scalerepro.record.read import Reading, RecordUnreadable, from_document


def _targets(config: dict) -> dict[str, Any]:
    """The targets the aggregation knows (checks included), from the resolved config."""
    return {key: value for key, value in (config.get("targets") or {}).items() if key in columns.TARGETS}


# What a check measures: a check of one name means one thing in every report. A study keeps its
# own threshold and selection (a CPU study's are its cpu_overrides'); the rest is today's.
CHECK_MEANING = ("description", "table", "metric", "reduce", "direction", "strict", "unit")


def _checks_as_defined_today(targets: dict[str, Any], today: Path | None) -> tuple[dict[str, Any], list[str]]:
    """``targets`` with each check that ``today`` (config/config.yaml) also defines judged as
    today's defines it (CHECK_MEANING) at the study's threshold and selection, and a line for each
    check whose meaning that changed. A study's check today's config lacks stays as it was."""
    if today is None or not isinstance(targets.get("checks"), dict):
        return targets, []
    try:
        defined = ((yaml_text.safe_load(today.read_text()) or {}).get("targets") or {}).get("checks") or {}
    except (OSError, yaml.YAMLError, AttributeError) as error:
        raise CommandError(f"--config {today}: cannot be read as a study config ({error}): give one such as config/config.yaml") from None
    checks, changed = {}, []
    for name, entry in targets["checks"].items():
        current = defined.get(name)
        if not isinstance(entry, dict) or not isinstance(current, dict):
            checks[name] = entry
            continue
        checks[name] = {**{key: current[key] for key in CHECK_MEANING if key in current}, **{key: entry[key] for key in ("threshold", "where") if key in entry}}
        unstated = {key: getattr(check_definitions.Check, key, None) for key in CHECK_MEANING}  # a key left out is its default
        differs = [f"{key} {entry.get(key, unstated[key])!r}" for key in CHECK_MEANING[1:] if entry.get(key, unstated[key]) != current.get(key, unstated[key])]
        if differs:
            changed.append(f"check {name}: judged as {today.name} defines it today, at the study's threshold; the study's config had {', '.join(differs)}")
    return {**targets, "checks": checks}, changed


def _is_run_record(document: Any) -> bool:
    return isinstance(document, dict) and {"schema_version", "run_id", "status", "measurements"} <= document.keys()


def _is_comm_result(document: Any) -> bool:
    return isinstance(document, dict) and {"world_size", "results", "time_definitions"} <= document.keys()


def _is_inventory(document: Any) -> bool:
    """What scalerepro.telemetry.inventory writes (results/inventory/system.json)."""
    return isinstance(document, dict) and {"hostname", "collected_at", "gpus", "software"} <= document.keys()


# What makes two records of one preset label different configurations, beside the columns of
# the matrix (model, GPUs, nodes, precision, batches, strategy, device, data, purpose): a
# preset's content can change between versions (the optimised preset compiles the conv nets
# with CUDA graphs in later versions), a model's shape can be set by flags, and one label can
# have run on two GPU models. Each field of the records' cells (scalerepro.record.cell) that
# differs between records of one label is named in the variant, in these words.
CONDITION_WORDS = {"image_size": "image", "seq_len": "sequence", "device_name": "on"}
# the order the variant names them in: the levers first, then the shape and the device
_NAMED_FIRST = ("compile", "channels_last", "cudnn_benchmark", "loader", "optimizer_impl", "image_size", "seq_len", "device_name")
SAID = (*_NAMED_FIRST, *(field for field in RUN_CONDITIONS if field not in _NAMED_FIRST))
LABEL = ["model", "gpus", "nodes", "precision", "per_gpu_batch", "grad_accum_steps", "parallel", "device", "data", "purpose", "variant"]
# What a profile beside records looks like (Nsight's reports and text, a kept study's profiles/): a
# records-only report reads none of it, and names it.
PROFILES_BESIDE = ("*.ncu-rep", "*.nsys-rep", "ncu*.txt", "nsys*.txt", "*/profiles")


def variant_of(record: RunRecord) -> str:
    """What configuration a record ran, in a few words: its preset and each flag that departs from
    it (``optimised, precision=fp16``), and ``smoke run`` where it was one."""
    knobs = record.knobs
    words = [str(knobs.preset or "no preset"), *(f"{name}={value}" for name, value in sorted(knobs.preset_overrides.items()))]
    return ", ".join(words + (["smoke run"] if record.purpose != "measurement" else []))


def _read_folder(records_dir: Path) -> tuple[list[tuple[Path, Reading]], list[Path], list[Path], list[str]]:
    if not records_dir.is_dir():
        raise CommandError(f"{records_dir}: no such folder of run records (give the folder that holds the *.json records)")
    records, comm, inventories, skipped = [], [], [], []
    for path in sorted(records_dir.glob("*.json")):
        try:
            document = read_json_object(path, what="JSON file")
        except (OSError, ValueError) as error:  # JsonFileError among them: too large, too deep, not JSON
            skipped.append(f"{path.name} (unreadable: {error})")
            continue
        if _is_comm_result(document):
            comm.append(path)
        elif _is_inventory(document):
            inventories.append(path)
        elif _is_run_record(document):
            try:
                records.append((path, from_document(document)))
            except RecordUnreadable as error:
                skipped.append(f"{path.name} (a run record this code cannot read: {error})")
        else:
            skipped.append(f"{path.name} (not a run record)")
    return records, comm, inventories, skipped


def _without_copies(found: list[tuple[str, Path, Reading]]) -> tuple[list[tuple[str, Path, Reading]], list[str]]:
    """The records with each run once: two files that hold one run (the same run id and start time)
    count once, the first by name, and the other is named; two that claim one run with different
    contents are both left out (which is the run's own cannot be told)."""
    by_run: dict[tuple[str, str], list[tuple[str, Path, Reading]]] = {}
    for entry in found:
        record = entry[2].record
        by_run.setdefault((record.run_id, record.started_at), []).append(entry)
    kept, skipped = [], []
    for (run_id, started), entries in by_run.items():
        first = entries[0]
        if len(entries) == 1:
            kept += entries
        elif all(entry[2].record == first[2].record for entry in entries[1:]):
            kept.append(first)
            skipped += [f"{entry[0]} (a copy of {first[0]}: run {run_id} started {started}, counted once)" for entry in entries[1:]]
        else:
            skipped += [f"{entry[0]} (run {run_id} started {started} is claimed by {len(entries)} different records: none is counted)" for entry in entries]
    return kept, skipped


def record_matrix(records_dirs: Sequence[Path]) -> tuple[pd.DataFrame, dict[str, Path], list[Path], list[Path], list[str]]:
    """A study matrix for the run records in ``records_dirs`` (module docstring), each record's
    file by run id, the commbench results and system inventories beside them, and the other JSON
    files, named with why they are left out. A run's id is its file's name less .json, prefixed
    with its folder's name when several folders are read. A cell is every condition that changes
    the figure (the records' cells: scalerepro.record.cell); where records of one label differ in
    a condition, the variant names it."""
    found, comm, inventories, skipped = [], [], [], []
    for records_dir in records_dirs:
        records, found_comm, found_inventories, found_skipped = _read_folder(records_dir)
        comm += found_comm
        inventories += found_inventories
        prefix = f"{records_dir.resolve().name}/" if len(records_dirs) > 1 else ""
        skipped += [f"{prefix}{name}" for name in found_skipped]
        found += [(f"{prefix}{path.name}", path, reading) for path, reading in records]
    found, copies = _without_copies(found)
    skipped += copies
    rows, files, conditions = [], {}, []
    for name, path, reading in found:
        record, cell = reading.record, reading.cell
        # a matrix's gpus are the ranks it plans (Cell.planned: world size), as a study's are;
        # ranks that share a card under gloo are each a rank (the record's cards make its MFU)
        gpus = record.parallel.world_size or 1
        run_id = name.removesuffix(".json").replace("/", "_")
        files[run_id] = path
        conditions.append({field: str(getattr(cell, field)) for field in SAID})
        rows.append(
            {
                "run_id": run_id,
                "study": RECORDS_STUDY,
                "model": cell.model,
                "gpus": gpus,
                "nodes": record.parallel.nodes or 1,
                "gpus_per_node": record.parallel.ranks_per_node or gpus,
                "variant": variant_of(record),
                "precision": cell.precision,
                "per_gpu_batch": cell.micro_batch,
                "grad_accum_steps": cell.grad_accum_steps,
                "global_batch": cell.global_batch,
                "bucket_cap_mb": cell.bucket_cap_mb,
                "parallel": cell.strategy,
                "data_parallel": None,
                "reference": "",
                "runtime_min": None,
                "device": cell.device_type or "",
                "data": cell.data or "",
                "purpose": cell.purpose,
                "record_of": "",
                "record": study_layout.run_record(run_id),
                "rerun": upgrade.rerun_command(record.command_line),
            }
        )
    if not rows:
        raise CommandError(
            f"{', '.join(map(str, records_dirs))}: no run record among the JSON files there (a run record is what python -m scalerepro.training.train --record writes)"
        )
    matrix = pd.DataFrame(rows)
    if matrix["run_id"].duplicated().any():
        raise CommandError(f"two records are named {sorted(matrix.loc[matrix.run_id.duplicated(), 'run_id'])[0]}: give folders of different names")
    # Records of one label whose conditions differ are different cells: the label says which.
    recorded = pd.DataFrame(conditions, index=matrix.index)
    for _, group in matrix.groupby(LABEL, dropna=False):
        differing = [field for field in SAID if recorded.loc[group.index, field].nunique() > 1]
        if differing:
            said = recorded.loc[group.index, differing].apply(lambda row: ", ".join(f"{CONDITION_WORDS.get(k, k)} {v}" for k, v in row.items()), axis=1)
            matrix.loc[group.index, "variant"] = group["variant"] + " (" + said + ")"
    matrix["repeat"] = matrix.groupby(LABEL, dropna=False).cumcount() + 1
    # one cell per label: every planned column and the variant, which names what else differs
    matrix["cell"] = matrix[LABEL].astype(str).agg(" | ".join, axis=1)
    order = [*columns.MATRIX_COLUMNS, *(c for c in columns.OPTIONAL_MATRIX_COLUMNS if c not in columns.MATRIX_COLUMNS)]
    return matrix[order], files, comm, inventories, skipped


class Rebuilt(TypedDict):
    """What a rebuild wrote: the summary of the tables, each figure's state, the count of
    profiled runs, the report's path, and why any input was left out."""

    summary: dict[str, Any]
    figures: dict[str, str]
    profiled_runs: int
    report: Path
    left_out: list[str]


class RebuiltRecords(Rebuilt):
    """A rebuild of run records no study planned, with the files it did not read as records."""

    skipped: list[str]


def _inventories_beside(record: Path, inventories: Sequence[Path]) -> dict[str, Path]:
    """The inventories kept in a record's own folder, by the name a run's folder keeps them under:
    its system inventory (none where the folder holds two: which is the record's cannot be told)
    and nvidia-smi's query of the session's card."""
    found: dict[str, Path] = {}
    systems = [path for path in inventories if path.parent == record.parent]
    if len(systems) == 1:
        found[inventory_view.SYSTEM_JSON] = systems[0]
    if (record.parent / inventory_view.NVIDIA_SMI).is_file():
        found[inventory_view.NVIDIA_SMI] = record.parent / inventory_view.NVIDIA_SMI
    return found


def rebuild_records(records_dirs: Sequence[Path], out: Path, references: Path, templates: Path, study_config: Path | None) -> RebuiltRecords:
    """The report of folders of run records no study planned, written under ``out`` as a study
    folder of its own (each record copied to ``runs/<run>/record.json``, so that ``out`` reads
    again as any study does); the targets (checks) and the scaling model's predictions are those
    of ``study_config`` where given."""
    matrix, files, comm, inventories, skipped = record_matrix(records_dirs)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out} is a file: give a folder for tables/, plots/ and report/")
    config: dict[str, Any] = {}
    if study_config is not None:
        try:
            loaded = yaml_text.safe_load(study_config.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise CommandError(f"--config {study_config}: cannot be read as YAML ({error}): give a study config such as config/config.yaml") from None
        config = {key: loaded[key] for key in ("targets", "scaling") if isinstance(loaded, dict) and key in loaded}
        config["targets_from"] = study_config.name  # the config the checks were taken from: no study ran with it
    names = ", ".join(d.resolve().name for d in records_dirs)
    config.update(
        study_name=f"run records of {names}",
        records_dirs=[d.resolve().name for d in records_dirs],
        profiles_not_read=[
            f"{d.resolve().name}/{path.relative_to(d)}" for d in records_dirs for pattern in PROFILES_BESIDE for path in sorted(d.glob(pattern))
        ],
    )
    (out / "tables").mkdir(parents=True, exist_ok=True)
    for run_id, path in files.items():
        write_text_atomically(out / "runs" / run_id / "record.json", path.read_text(encoding="utf-8"))
        for name, kept in _inventories_beside(path, inventories).items():  # what the record lacks of its card (inventory_view.cards_beside)
            write_text_atomically(out / "runs" / run_id / inventory_view.RUN_INVENTORY / name, kept.read_text(encoding="utf-8", errors="replace"))
    write_text_atomically(out / "tables" / "matrix.csv", matrix.to_csv(index=False))
    write_text_atomically(out / "tables" / "config.json", json.dumps(config, indent=1))
    if comm:
        (out / "comm").mkdir(exist_ok=True)
        for index, path in enumerate(comm):  # named as the workflow names them: g<gpus>.json
            document = json.loads(path.read_bytes())
            write_text_atomically(out / "comm" / f"g{document['world_size']}{'' if index == 0 else f'-{index}'}.json", json.dumps(document))
    if inventories:  # the system the records ran on: the report describes one, the first whose machine the records name
        (out / "inventory").mkdir(exist_ok=True)
        write_text_atomically(out / "inventory" / "system.json", inventories[0].read_text())
        skipped += [
            f"{path.parent.name}/{path.name} (a second inventory: the report describes {inventories[0].parent.name}/{inventories[0].name}, and "
            "lists every host and card the records name)"
            for path in inventories[1:]
        ]
    return RebuiltRecords(**rebuild(out, references, templates), skipped=skipped)


def keep_inventory(results: Path, capture: Path) -> None:
    """Keep ``capture``, an nvidia-smi query of the card a study ran on that its user names, in the
    study's inventory folder, where the report reads what the records lack of their card
    (inventory_view.study_inventory). Refused where the study has an inventory of its own, or where
    the file is no such capture."""
    folder = results / inventory_view.RUN_INVENTORY
    if (folder / inventory_view.SYSTEM_JSON).is_file():
        raise CommandError(f"--inventory {capture}: {folder / inventory_view.SYSTEM_JSON} is the study's own inventory; leave --inventory out")
    try:
        text = capture.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise CommandError(f"--inventory {capture}: cannot be read ({error.strerror})") from None
    if not inventory_view.smi_gpus(text):
        raise CommandError(f"--inventory {capture}: no GPU in it: give the output of nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv")
    write_text_atomically(folder / inventory_view.NVIDIA_SMI, text)


def rebuild(results: Path, references: Path, templates: Path, checks_from: Path | None = None) -> Rebuilt:
    """Tables, figures and report from the files under ``results`` (module docstring). Every
    record path of its matrix resolves inside ``results`` (readers.read_matrix), whatever the
    folder is called and wherever it lies; one that does not is refused. A check ``checks_from``
    (today's study config) also defines is judged as it defines it (_checks_as_defined_today)."""
    tables_dir = results / "tables"
    matrix_path = tables_dir / "matrix.csv"
    if not matrix_path.is_file():
        raise CommandError(f"{matrix_path}: no study matrix (run the workflow's study_matrix rule, or point --results at a study)")
    config_path = tables_dir / "config.json"
    config = read_json_object(config_path, what="resolved config") if config_path.is_file() else {}
    matrix = readers.read_matrix(matrix_path, results)
    comm = sorted((results / "comm").glob("g*.json"))
    scaling = config.get("scaling") or {}
    predict = scaling.get("predict_gpus", list(aggregate.scaling_model.DEFAULT_PREDICT_GPUS))
    inventory = results / "inventory" / "system.json"
    system = read_json_object(inventory, what="system inventory", max_bytes=64 << 20) if inventory.is_file() else None
    targets, redefined = _checks_as_defined_today(_targets(config), checks_from)
    tables, left_out = aggregate.aggregate_study(matrix_path, comm, references, targets, predict, scaling.get("predict_cluster"), results, system)
    for line in redefined:
        print(f"rebuild: {line}", file=sys.stderr)
    summaries, not_this_study = captures.study_summaries(results, config, matrix)  # made again from the captures, with today's code
    left_out += not_this_study
    if summaries:
        for name, table in captures.tables(summaries).items():
            write_text_atomically(tables_dir / f"{name}.csv", table.to_csv(index=False))
    left_out += _foreign_profiling_rows(tables_dir, tables["runs"])
    summary = aggregate.write_tables(tables, tables_dir, left_out)
    drawn = plots.draw(plots.read_tables(tables_dir), results / "plots")
    out = results / "report" / "index.html"
    # the study budget's choice, where the study's config set a budget (its checkpoint wrote it)
    budget = tables_dir / "budget.json" if ((config.get("budget") or {}).get("training_s") is not None) else None
    # the prescreen's screen, where the study ran one (a study from before the prescreen has none)
    screen = results / "prescreen" / "screen.json"
    html = report.render(
        tables_dir,
        results / "plots",
        inventory,
        config_path,
        references,
        templates,
        out.parent,
        budget_path=budget,
        prescreen_path=screen if screen.is_file() else None,
    )
    write_text_atomically(out, html)
    return {"summary": summary, "figures": drawn, "profiled_runs": len(summaries), "report": out, "left_out": left_out}


def _foreign_profiling_rows(tables_dir: Path, runs: pd.DataFrame) -> list[str]:
    """The profiling tables in ``tables_dir`` keep only the profiles of this study's runs
    (study_files.profile_problem: tables another study left there are not this study's); each
    profile dropped is named with why."""
    profiling = tables_dir / "profiling.csv"
    if not profiling.is_file() or profiling.stat().st_size == 0:
        return []
    rows = pd.read_csv(profiling, dtype={"run_id": str})
    if "run_id" not in rows.columns:
        return []
    problems = {
        str(run_id): why
        for run_id, tools in zip(rows["run_id"], rows.get("tools", [None] * len(rows)))
        if (why := study_files.profile_problem(run_id, tools, runs))
    }
    if not problems:
        return []
    for name in study_layout.PROFILING_TABLE_NAMES:
        path = tables_dir / f"{name}.csv"
        if path.is_file() and path.stat().st_size:
            table = pd.read_csv(path, dtype={"run_id": str})
            if "run_id" in table.columns:
                write_text_atomically(path, table[~table["run_id"].astype(str).isin(problems)].to_csv(index=False))
    return [str(study_files.LeftOut(f"tables/profiling.csv, run {run_id}", f"{why}: dropped from the profiling tables")) for run_id, why in problems.items()]


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
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=None, help="the study's folder, whatever it is called (default: results)")
    parser.add_argument("--records", type=Path, nargs="+", default=None, help="instead: folders of run records no study planned (with --out)")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="with --records: the study config whose targets and predictions apply; with --results: whose check definitions apply (default config/config.yaml)",
    )
    parser.add_argument("--out", type=Path, default=None, help="with --records: the folder that gets tables/, plots/ and report/")
    parser.add_argument(
        "--inventory",
        type=Path,
        default=None,
        help="with --results: an nvidia-smi capture (--query-gpu ... --format=csv) of the study's card, kept beside a study that has no inventory of its own",
    )
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
        records = rebuild_records(args.records, args.out, args.references, args.templates, args.config)
        if records["skipped"]:
            print(f"rebuild: left out {len(records['skipped'])} JSON files: {'; '.join(records['skipped'])}", file=sys.stderr)
        done: Rebuilt = records
    else:
        if args.out is not None:
            parser.error("--out goes with --records; a study's results folder is rebuilt in place (--results)")
        if args.inventory is not None:
            keep_inventory(args.results or Path("results"), args.inventory)
        done = rebuild(args.results or Path("results"), args.references, args.templates, args.config)
    for line in done["left_out"]:
        print(f"rebuild: left out {line}", file=sys.stderr)
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
