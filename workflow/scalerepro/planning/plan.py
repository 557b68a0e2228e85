"""One workflow invocation's plan: the config validated, where the jobs run, the study, and what
each job asks of its scheduler. The rules (workflow/rules/*.smk) wire what this resolves.

No torch and no Snakemake workflow object: the config is validated with
``snakemake.utils.validate`` (the workflow's environment has it), everything else is plain
Python, unit-tested in tests/test_plan.py. ``load`` is the one entry point.
"""

from __future__ import annotations

import collections
import functools
import math
import shutil
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scalerepro import schedulers
from scalerepro.common import gpu_peaks, study_layout, yaml_text
from scalerepro.common.cli import CommandError
from scalerepro.common.references import ReferencesError, load_references
from scalerepro.planning import study, submission
from scalerepro.planning.budget import floor_rounds
from scalerepro.planning.study import Run, Study
from scalerepro.schedulers.base import LOCAL, Scheduler


class ConfigError(CommandError, ValueError):
    """A config value the workflow cannot use; one line: where, what is wrong, what to do."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config error at '{key}': {message}")


class ReferencesConfigError(ConfigError):
    """config/references.yaml breaks its schema: the loader's one line as it is, raised as a
    ConfigError because that is what the workflow turns into its one-line WorkflowError."""

    def __init__(self, message: str):
        CommandError.__init__(self, message)


# A config is a few hundred values of a few dozen characters. Far more is a mistake or an attack
# (YAML aliases that nest lists of lists expand 600 bytes into billions of values, which every
# later walk of the config, the schema's first, would take hours over), so the first walk counts
# what it visits and stops at these bounds.
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_TEXT = 4096  # characters in one string


def _not_one_line(text: str) -> str | None:
    """What is wrong with ``text`` where a config string must be one line of printable text, else
    None. Every config string is held to this here, once: the schema's patterns cannot hold them
    to it (a pattern's ``$`` also matches before a final newline, so "dgx_h100\\n" fits
    ``^[a-z0-9_]+$``), and a line break in a value that reaches a command line splits the command."""
    found = next((char for char in text if unicodedata.category(char) in ("Cc", "Zl", "Zp")), None)
    return None if found is None else f"holds a line break or control character ({found!r}): give it on one line, without control characters"


def _first_unusable(config: Any) -> tuple[str, str] | None:
    """The first value planning would misuse, with its key: a number that is not finite (YAML's
    .nan and .inf: JSON Schema's bounds let NaN through, every comparison with it being false), a
    string longer than MAX_CONFIG_TEXT, a string or key that is not one line (``_not_one_line``),
    two items of one list with the same ``name`` (the second would be dropped silently), or more
    than MAX_CONFIG_VALUES values in all."""
    visited = 0
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        where, node = stack.pop()
        visited += 1
        if visited > MAX_CONFIG_VALUES:
            return "top level", (f"the config holds more than {MAX_CONFIG_VALUES:,} values (YAML aliases nested in lists expand to that): write the values out")
        if isinstance(node, float) and not math.isfinite(node):
            return where or "top level", f"{node} is not a finite number: give a number"
        if isinstance(node, str) and len(node) > MAX_CONFIG_TEXT:
            return where or "top level", f"a string of {len(node):,} characters (at most {MAX_CONFIG_TEXT}): shorten it"
        texts = [node] if isinstance(node, str) else [key for key in node if isinstance(key, str)] if isinstance(node, dict) else []
        for text in texts:
            if why := _not_one_line(text):
                return where or "top level", f"{'' if text is node else 'the key '}{text!r} {why}"
        if isinstance(node, list):
            names = [item["name"] for item in node if isinstance(item, dict) and isinstance(item.get("name"), str)]
            repeated = sorted(name for name, count in collections.Counter(names).items() if count > 1)
            if repeated:
                return where or "top level", f"the name {repeated[0]!r} is given twice: give each item its own name"
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((f"{where}.{key}" if where else str(key), value) for key, value in reversed(list(items)))
    return None


# JSON Schema's scalar types, as YAML reads them (a bool is not a number here, as in the schema).
_SCALARS: dict[str, tuple[type, ...]] = {"number": (int, float), "integer": (int,), "boolean": (bool,), "null": (type(None),)}


def _schema_parts(schema: dict[str, Any], definitions: dict[str, Any]) -> list[dict[str, Any]]:
    """The schema and every schema its ``$ref`` and ``allOf`` bring in, each resolved."""
    while "$ref" in schema:
        schema = definitions[schema["$ref"].rsplit("/", 1)[-1]]
    return [schema, *(part for inner in schema.get("allOf", []) for part in _schema_parts(inner, definitions))]


def _typed_scalars(node: Any, schema: dict[str, Any], definitions: dict[str, Any]) -> Any:
    """``node`` with each string that stands where the schema wants only numbers, booleans or
    null read again as YAML, when what it reads as fits. Snakemake's ``--config`` reads the
    values of a mapping given on the command line (``compare={baseline: X, threshold: 0.03}``)
    with YAML's BaseLoader, which makes every scalar a string."""
    parts = _schema_parts(schema, definitions)
    if isinstance(node, dict):
        for key, value in node.items():
            for part in parts:
                others = part.get("additionalProperties")
                inner = part.get("properties", {}).get(key, others if isinstance(others, dict) else None)
                if inner is not None:
                    value = node[key] = _typed_scalars(value, inner, definitions)
        return node
    if isinstance(node, list):
        items = [part["items"] for part in parts if isinstance(part.get("items"), dict)]
        return [_typed_scalars(item, items[0], definitions) for item in node] if items else node
    wanted = {kind for part in parts for kind in ([part["type"]] if isinstance(part.get("type"), str) else part.get("type", []))}
    if not isinstance(node, str) or "string" in wanted or not wanted & set(_SCALARS):
        return node
    try:
        value = yaml.safe_load(node)
    except yaml.YAMLError:
        return node
    if isinstance(value, bool) and node.lower() not in ("true", "false"):
        return node  # YAML 1.1's yes/no/on/off: a word, not a boolean
    fits = any(isinstance(value, _SCALARS[kind]) and not (kind in ("number", "integer") and isinstance(value, bool)) for kind in wanted if kind in _SCALARS)
    return value if fits else node


def validate(config: dict[str, Any], schema: Path) -> None:
    """snakemake.utils.validate (which also fills in the schema's defaults, in place), its first
    problem turned into one line naming the key. What the schema cannot say is refused first
    (``_first_unusable``)."""
    found = _first_unusable(config)
    if found:
        raise ConfigError(*found)
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate as snakemake_validate

    document = yaml_text.safe_load(schema.read_text())
    _typed_scalars(config, document, document.get("$defs", {}))

    try:
        snakemake_validate(config, str(schema), set_default=True)
    except WorkflowError as wrapped:
        if not isinstance(wrapped.__context__, jsonschema.ValidationError):
            raise  # the schema itself did not load: a bug here, not a config error
        # the jsonschema error that validate() wrapped (it keeps only its text in the message)
        error = jsonschema.exceptions.best_match([wrapped.__context__])
        where = ".".join(str(part) for part in error.absolute_path) or "top level"
        if "propertyNames" in error.schema_path:
            message = f"unknown key {error.instance!r}"
        elif error.validator == "pattern" and "description" in error.schema:
            # the schema says in words what a valid value is; the regex alone says little
            message = f"{error.instance!r} is not {error.schema['description']}"
        else:
            message = error.message
        raise ConfigError(where, f"{message} (allowed keys and values: {schema.relative_to(schema.parents[2])})") from None


@dataclass(frozen=True)
class Plan:
    config: dict[str, Any]
    study: Study
    scheduler: Scheduler  # where the jobs run: LOCAL, or the scheduler this invocation submits to
    # Whose submission settings the jobs carry: the scheduler submitted to, else the config's
    # cluster (Slurm), so that a dry run on a laptop shows what a cluster run would submit.
    cluster: Scheduler
    local_gpu_names: tuple[str, ...]

    @property
    def local_runs(self) -> bool:
        return self.scheduler is LOCAL

    @property
    def device(self) -> str:
        return self.study.device

    @property
    def cluster_settings(self) -> dict[str, Any]:
        """The cluster's config section (``slurm:``): queue, extra flags, rendezvous port, env."""
        return self.config[self.cluster.name]

    @property
    def cluster_gpus(self) -> bool:
        """Whether jobs ask the cluster for GPUs (e.g. slurm.gpus: auto follows the device)."""
        asked = self.cluster_settings["gpus"]
        return self.device == "cuda" if asked == "auto" else asked

    @property
    def container(self) -> str | None:
        return self.config["container"]["sif"] if self.config["container"]["enabled"] else None

    def ranks_and_nodes(self, gpus: int) -> tuple[int, int]:
        """(ranks per node, nodes) of a job over ``gpus`` GPUs (scalerepro.planning.study.nodes_for)."""
        return study.nodes_for(gpus, self.study.gpus_per_node, self.local_runs, "scaling.gpu_counts")

    def check_scheduler(self) -> None:
        """On the submitting host: the scheduler jobs go to answers and its settings fit it."""
        submission.for_scheduler(self.scheduler).check(self.config[self.scheduler.name])

    def queue_resources(self) -> dict[str, Any]:
        """Account, partition, QoS and the like, for every job the workflow submits."""
        return submission.for_scheduler(self.cluster).queue_resources(self.cluster_settings)

    def submission(self, ranks_per_node: int, nodes: int, signal: bool = False) -> dict[str, Any]:
        """What the cluster's executor needs to start a job of ``nodes`` x ``ranks_per_node``
        ranks; measured jobs get their nodes to themselves unless resources.exclusive is false."""
        return submission.for_scheduler(self.cluster).submission_resources(
            self.cluster_settings, ranks_per_node, nodes, self.cluster_gpus, signal, self.study.exclusive()
        )

    def train_resources(self, run: Run) -> dict[str, Any]:
        """A training job's resources, from its GPU count (every key a rule resource)."""
        per_gpu, cuda = self.config["resources"], self.device == "cuda"
        return {
            "nodes": run.nodes,
            "tasks": run.nodes,
            "gpus": run.gpus if cuda else 0,
            "gpus_per_node": run.ranks_per_node if cuda else 0,
            "cpus_per_task": run.ranks_per_node * per_gpu["cpus_per_gpu"],
            "mem_mb": run.ranks_per_node * per_gpu["mem_mb_per_gpu"],
            "runtime": per_gpu["runtime_min"],
            "measured": 1,
            **self.submission(run.ranks_per_node, run.nodes, signal=True),
        }

    def prescreen_nodes(self) -> list[str]:
        """The nodes the prescreen measures (scalerepro.planning.node_screen): prescreen.nodes,
        else those the jobs may run on (this host; the Slurm partition's)."""
        listed = self.config["prescreen"]["nodes"]
        if listed:
            return list(listed)
        return submission.for_scheduler(self.scheduler).nodes({} if self.local_runs else self.cluster_settings)

    def prescreen_resources(self, node: str) -> dict[str, Any]:
        """A node's check: the whole node, as a rank of the study would find it, on ``node``."""
        per_gpu, cuda, gpus = self.config["resources"], self.device == "cuda", self.study.gpus_per_node
        asked = self.submission(gpus, 1)
        on_node = submission.for_scheduler(self.scheduler).on_nodes([node])
        extra = " ".join(filter(None, (asked.get("slurm_extra"), on_node.get("slurm_extra")))) or None
        return {
            "nodes": 1,
            "tasks": 1,
            "gpus": gpus if cuda else 0,
            "gpus_per_node": gpus if cuda else 0,
            "cpus_per_task": gpus * per_gpu["cpus_per_gpu"],
            "mem_mb": gpus * per_gpu["mem_mb_per_gpu"],
            "runtime": per_gpu["runtime_min"],
            "measured": 1,
            **asked,
            **({"slurm_extra": extra} if asked or on_node else {}),
        }

    def prescreen_link_resources(self, node: str, reference: str) -> dict[str, Any]:
        """A link's check: every rank of ``reference`` and of ``node``, on those two nodes."""
        gpus, cuda = self.study.gpus_per_node, self.device == "cuda"
        asked = self.submission(gpus, 2)
        pair = submission.for_scheduler(self.scheduler).on_nodes([reference, node])
        extra = " ".join(filter(None, (asked.get("slurm_extra"), pair.get("slurm_extra")))) or None
        return {
            "nodes": 2,
            "gpus": 2 * gpus if cuda else 0,
            "runtime": 15,
            "measured": 1,
            **asked,
            **({"slurm_extra": extra} if asked or pair else {}),
        }

    def excluding(self, nodes: list[str]) -> list[str]:
        """The submission's words that keep the scaling runs off ``nodes`` (the prescreen's)."""
        return submission.for_scheduler(self.scheduler).excluding(nodes)

    def train_threads(self, run: Run) -> int:
        return run.ranks_per_node * self.config["resources"]["cpus_per_gpu"]

    @functools.cached_property
    def _cell_order(self) -> dict[str, int]:
        """Each cell's place in the study's planning order."""
        return {cell: place for place, cell in enumerate(dict.fromkeys(run.cell for run in self.study.runs.values()))}

    def train_priority(self, run: Run) -> int:
        """Snakemake starts ready jobs of higher priority first: every cell's repeat 1, then every
        cell's repeat 2, and so on, the cells in one order in every round. The repeats of a cell
        are then a whole round apart, so a drift of the machine (another job, heat) falls on every
        cell alike instead of on one cell's block of repeats, where it would read as that cell's
        knob; and a slowdown shorter than a round reaches at most one repeat of a cell, which the
        cell's median over its repeats leaves out. (With the order within a round left to
        Snakemake, the last cell of one round could start the next: two of its three repeats back
        to back, both inside one slowdown.)"""
        order = self._cell_order
        return -(run.repeat * len(order) + order[run.cell])

    def comm_resources(self, gpus: int) -> dict[str, Any]:
        """The all-reduce benchmark's resources over ``gpus`` GPUs."""
        ranks_per_node, nodes = self.ranks_and_nodes(gpus)
        return {
            "nodes": nodes,
            "gpus": gpus if self.device == "cuda" else 0,
            "runtime": 15,
            "measured": 1,
            **self.submission(ranks_per_node, nodes),
        }

    def launch_args(self, ranks_per_node: int, nodes: int, name: str) -> list[str]:
        """Flags of ``python -m scalerepro.launching.launch`` for a job of ``nodes`` x ``ranks_per_node``
        ranks: started here, or (inside a cluster job) by the scheduler on every node."""
        cluster = self.cluster_settings
        return [
            f"--nodes={nodes}",
            f"--ranks-per-node={ranks_per_node}",
            f"--cpus-per-node={ranks_per_node * self.config['resources']['cpus_per_gpu']}",
            f"--port={cluster['rendezvous_port']}",
            f"--name={name}",
            *(["--slurm-gpus"] if self.cluster_gpus else []),
            *(f"--env={key}={value}" for key, value in cluster["env"].items()),
            *([f"--container={self.container}"] if self.container and not self.local_runs else []),
        ]

    def ranks_container(self) -> str | None:
        """The image Snakemake runs a rank-starting rule in: on a cluster the launcher runs the
        image itself, inside each node's task (srun is not in the image)."""
        return self.container if self.local_runs else None

    def rerun_command(self, run: Run) -> str:
        where = "--cores all" if self.local_runs else f"--profile {self.scheduler.name}"
        return f"snakemake {where} --forcerun {record_path(run)}"

    def matrix_rows(self) -> list[dict[str, Any]]:
        return study.matrix_rows(self.study, record_path, self.rerun_command)

    @property
    def budget(self) -> dict[str, Any] | None:
        """``budget`` (training_s, min_repeats) where the config sets a training budget, else None:
        every planned repeat runs (scalerepro.planning.budget)."""
        settings = self.config.get("budget") or {}
        if settings.get("training_s") is None:
            return None
        return {"training_s": float(settings["training_s"]), "min_repeats": int(settings["min_repeats"])}  # the schema's default fills it

    def budget_jobs(self) -> list[dict[str, Any]]:
        """The training jobs the budget weighs: every run that runs itself, with its cell and round."""
        return [{"run_id": run.run_id, "cell": run.cell, "repeat": run.repeat} for run in self.study.runs.values() if run.runs_itself]

    def budget_measured(self) -> list[Run]:
        """The jobs of the rounds that run whatever they cost (the budget's floor, min_repeats),
        whose wall times the budget reads before it chooses the rest."""
        floor = floor_rounds([run.repeat for run in self.study.runs.values() if run.runs_itself], self.budget["min_repeats"] if self.budget else 1)
        return [run for run in self.study.runs.values() if run.runs_itself and run.repeat <= floor]

    def runs_within(self, repeats: int | None) -> list[Run]:
        """The runs of the first ``repeats`` rounds (None: every planned run)."""
        return [run for run in self.study.runs.values() if repeats is None or run.repeat <= repeats]

    def device_name_flags(self) -> list[str]:
        """--device-name of the GPUs the profiled runs use, where known before they run."""
        name = self.profiled_device_name()
        return ["--device-name", name] if name else []

    def profiled_device_name(self) -> str | None:
        """The GPU model the profiled runs use, where known before they run: this machine's
        (local runs) or reproduce.gpu (a cluster); the capture names it otherwise."""
        if self.device != "cuda":
            return None
        if self.local_runs:
            return self.local_gpu_names[0] if self.local_gpu_names else None
        return self.config["reproduce"].get("gpu")


from scalerepro.common.study_layout import RUN_JOB, RUN_RECORD  # noqa: E402, F401  (the files a run's training job writes: the rules read them here)


def record_path(run: Run) -> str:
    """The record a run's row reads: its own, or the one of the run that runs its configuration."""
    return study_layout.run_record(run.run_id, run.record_of)


def job_path(run: Run) -> str:
    """The job.json of the training job that runs ``run``'s configuration (its wall time)."""
    return RUN_JOB.format(run=run.record_of or run.run_id)


def load(config: dict[str, Any], *, schema: Path, references: Path, executor: str | None, in_job: bool, local_gpu_names: Sequence[str]) -> Plan:
    """The plan of one invocation. ``executor`` is the one its command line asks for; inside a
    job (Snakemake re-runs the workflow in each), the scheduler whose job this is, so that the
    study resolves exactly as it did on the submitting host."""
    scheduler = schedulers.current() if in_job else schedulers.for_executor(executor)
    on_cluster = scheduler is not LOCAL
    validate(config, schema)
    if config["device"] == "auto" and study.resolve_device(config, on_cluster=on_cluster, local_gpus=len(local_gpu_names)) == "cpu":
        # no GPU here and none asked for: the small CPU matrix
        config = study.merge(config, config.get("cpu_overrides", {}))
        validate(config, schema)
    try:
        document = load_references(references)
    except ReferencesError as error:
        raise ReferencesConfigError(str(error)) from None
    _check_cluster_preset(config["scaling"].get("predict_cluster"), document.get("clusters") or {}, references)
    built = study.build(
        config,
        on_cluster=on_cluster,
        local_gpus=len(local_gpu_names),
        local_gpu_name=local_gpu_names[0] if local_gpu_names else None,
        references=document["references"],
    )
    return Plan(config, built, scheduler, scheduler if on_cluster else schedulers.backend("slurm"), tuple(local_gpu_names))


def _check_cluster_preset(name: str | None, clusters: dict[str, Any], references: Path) -> None:
    """A ConfigError unless ``name`` (scaling.predict_cluster) is null or a preset of
    ``clusters``: the aggregation reads it only after every training job has run."""
    if name is not None and name not in clusters:
        known = ", ".join(sorted(clusters)) or "none"
        raise ConfigError(
            "scaling.predict_cluster", f"unknown cluster preset {name!r}: choose one of {known} (clusters in {Path(*references.parts[-2:])}), or null"
        )


# ---- profiling: which runs, which tools, each job's flags -------------------------------------

PROFILING_TABLES = tuple(f"{study_layout.RESULTS_DIR}/tables/{name}.csv" for name in study_layout.PROFILING_TABLE_NAMES)


@dataclass(frozen=True)
class ProfilingPlan:
    runs: tuple[str, ...]  # run ids to profile
    tools: tuple[str, ...]  # nsys, ncu or torch
    fallback_reason: str | None  # why the torch profiler replaced what was asked, else None
    settings: dict[str, Any]

    def trainer_args(self, plan: Plan, run_id: str, tool: str) -> list[str]:
        """The run's own config, but: stop right after the window, warm up until it, no
        evaluation, no communication probe, no checkpoints (a profiling job always starts afresh)."""
        window = self.settings["window_start"], self.settings["window_start"] + self.settings["window_steps"]
        record = f"results/profiles/{run_id}/{tool}/record.json"
        return plan.study.trainer_args(plan.study.runs[run_id], record, None, steps=window[1], warmup_steps=window[0], eval=False, comm_probe_steps=0)

    def tables(self) -> list[str]:
        """The profiling tables, as inputs of the plots and the report (none when disabled)."""
        return list(PROFILING_TABLES) if self.settings["enabled"] else []

    def earlier_captures(self, run_id: str, tool: str) -> list[str]:
        """What a capture waits for: ncu after nsys (when both run), so that it profiles the
        kernels nsys found on top."""
        return [f"results/profiles/{run_id}/nsys/capture.json"] if tool == "ncu" and "nsys" in self.tools else []


def profiling_plan(plan: Plan, local_exec: bool, which: Callable[[str], str | None] = shutil.which) -> ProfilingPlan:
    settings = plan.config["profiling"]
    if not settings["enabled"]:
        return ProfilingPlan((), (), None, settings)
    if settings["gpu_peaks"] not in gpu_peaks.PEAKS:
        raise ConfigError(
            "profiling.gpu_peaks",
            f"{settings['gpu_peaks']!r} is not in the GPU peak table (scalerepro.common.gpu_peaks): choose one of {', '.join(gpu_peaks.PEAKS)}",
        )
    tools, reason = _profiling_tools(settings, plan.device, local_exec, which)
    return ProfilingPlan(tuple(_profiled_runs(plan, settings)), tuple(tools), reason, settings)


def _profiled_runs(plan: Plan, settings: dict[str, Any]) -> list[str]:
    """The config's list, or (auto) strong scaling, repeat 1, each model at 1 GPU and at the
    largest GPU count (weak scaling when strong is disabled)."""
    runs = plan.study.runs
    if settings["runs"] != "auto":
        unknown = [run for run in settings["runs"] if run not in runs]
        if unknown:
            raise ConfigError("profiling.runs", f"{unknown[0]} is not a run of this study: see results/tables/matrix.csv")
        return list(settings["runs"])
    which_study = "strong" if plan.config["scaling"]["strong"]["enabled"] else "weak"
    ends = {plan.study.gpu_counts[0], plan.study.gpu_counts[-1]}
    return [run.run_id for run in runs.values() if run.study == which_study and run.repeat == 1 and run.gpus in ends]


def _profiling_tools(settings: dict[str, Any], device: str, local_exec: bool, which: Callable[[str], str | None]) -> tuple[list[str], str | None]:
    """(tools, why the torch fallback replaced what was asked, or None). A Nsight tool needs CUDA
    and its binary; where either is missing the fallback applies if allowed, else an error."""
    wanted = settings["tool"]
    if wanted == "torch":
        return ["torch"], None
    asked = ["nsys", "ncu"] if wanted == "auto" else [wanted]
    # On a cluster the tools are looked for on the node that runs the job (scalerepro.launching.profile_job).
    found = [tool for tool in asked if which(tool) or not local_exec]
    if not found:
        reason = f"{' and '.join(asked)} {'is' if len(asked) == 1 else 'are'} not on PATH"
    elif device != "cuda":
        reason = f"Nsight tools profile CUDA runs and this study runs on the {device}"
    else:
        return found, None
    if settings["fallback"]:
        return ["torch"], reason
    raise ConfigError(
        "profiling.tool",
        f"{wanted} was asked for but {reason}, and profiling.fallback is false: install Nsight, set profiling.tool: torch, or set profiling.fallback: true",
    )
