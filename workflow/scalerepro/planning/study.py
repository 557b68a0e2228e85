"""The study model: the validated config in, every training run of the study out.

Pure Python (no Snakemake, no torch), so the matrix can be unit-tested on its own; the rules
(workflow/rules/*.smk) only wire what it resolves. A study is

* strong scaling: one global batch per model (``scaling.strong.global_batch``, default the per-GPU
  batch x the largest GPU count), the same at every count N. Each GPU's share G/N runs as micro-
  batches of at most the model's per-GPU batch, gradients accumulated over them;
* weak scaling: the per-GPU batch and the per-GPU data fixed, so an epoch grows with N;
* sensitivity: bucket size x per-GPU batch x precision at one count;
* ablation: a baseline, each optimisation alone on top of it, then all of them;
* parallelism: each language model under each strategy (ddp, fsdp, tp, fsdp+tp) at each GPU
  count, the global batch the same for every strategy at a count (per_gpu_batch x N), so their
  throughput, memory and communication compare like with like;
* reproduce: one run under the conditions of each published reference (config/references.yaml)
  whose GPU model and count this machine or cluster has, so the report can set it beside the
  publication.

Each run carries its trainer config (``scalerepro.trainer_flags.TrainConfig``): the user's flag
lists of the config, each read once by the trainer's own parser (so a flag the trainer would
refuse is a config error before anything runs), over the settings the study sets itself, with the
preset resolved as the trainer resolves it. What the matrix says of a run that its flags leave to
the trainer (precision, bucket size, strategy) is then what the trainer will do, never a restated
default, and a job's command line is rendered once from the config (``Study.trainer_args``). What
the study sets itself (the batch and its accumulation, ...) no user's flags may set again
(``STUDY_SET_FLAGS``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scalerepro import trainer_flags
from scalerepro.common import batch_split
from scalerepro.common.cli import CommandError
from scalerepro.parallel import mesh

DATA_DIR = "results/data/cifar10"
STUDIES = ("strong", "weak", "sensitivity", "ablation", "parallelism", "reproduce")
# the studies whose one-GPU runs' bucket probe the scaling model replays (scaling_model, model_inputs)
BUCKET_PROFILE_STUDIES = ("strong", "weak")
# the studies whose exposed-communication probe a table reads: the loss decomposition and the
# scaling model (strong, weak), the sensitivity table's column; the ablation, parallelism and
# reproduce tables show none (the runs table shows every run's, "-" where it was off)
COMM_PROBE_STUDIES = ("strong", "weak", "sensitivity")


class StudyError(CommandError, ValueError):
    """A config the study cannot be built from; one line naming the key and the fix."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"config error at '{key}': {message}")


@dataclass(frozen=True)
class Run:
    """One training job of the study: a cell of the matrix and one repeat of it."""

    run_id: str
    study: str  # one of STUDIES
    model: str
    gpus: int
    nodes: int
    ranks_per_node: int
    repeat: int
    variant: str
    config: trainer_flags.TrainConfig  # what the trainer runs (where it writes: Study.trainer_args)
    reference: str  # the reference a reproduce run stands beside ("" for the others)
    data_parallel: int  # replicas reading different data (ranks of a TP group read one batch)
    # the run whose record this one reads, where an earlier cell runs the same trainer run (the
    # strong and weak cells at the largest count, at one batch): "" where the run is its own
    record_of: str = ""

    @property
    def per_gpu_batch(self) -> int:
        """The micro-batch of each rank."""
        return self.config.run.per_gpu_batch

    @property
    def grad_accum_steps(self) -> int:
        return self.config.optim.grad_accum_steps

    @property
    def precision(self) -> str:
        return self.config.perf.precision

    @property
    def bucket_cap_mb(self) -> float:
        return self.config.parallel.bucket_cap_mb

    @property
    def parallel(self) -> str:
        """The trainer's --parallel strategy."""
        return self.config.parallel.parallel

    @property
    def runs_itself(self) -> bool:
        """Whether a training job runs this run (else its cell reads ``record_of``'s record)."""
        return not self.record_of

    @property
    def global_batch(self) -> int:
        return mesh.global_batch(self.per_gpu_batch, self.grad_accum_steps, self.data_parallel or self.gpus)

    @property
    def cell(self) -> str:
        """The cell this run repeats: its run id without the repeat (``strong_resnet50_g2``)."""
        return self.run_id.removesuffix(f"_r{self.repeat}")


@dataclass(frozen=True)
class Study:
    config: dict[str, Any]
    device: str  # cuda | cpu
    local: bool  # the ranks run on this machine (no scheduler)
    gpus_per_node: int
    gpu_counts: tuple[int, ...]
    runs: dict[str, Run]

    @property
    def comm_gpu_counts(self) -> list[int]:
        return [n for n in self.gpu_counts if n > 1] if self.config["communication"]["enabled"] else []

    def trainer_args(self, run: Run, record: str, checkpoint_dir: str | None, **settings: Any) -> list[str]:
        """The trainer's command line for one job of ``run``: its config, writing its record to
        ``record`` and its checkpoints to ``checkpoint_dir`` (none, and so no resume, without it),
        with the fields ``settings`` names (dest names) set as the job needs them."""
        job = {"record": record, "checkpoint_dir": checkpoint_dir or None, "resume": bool(checkpoint_dir), **settings}
        return trainer_flags.render_argv(trainer_flags.with_values(run.config, job))

    def uses_cifar(self, run: Run) -> bool:
        return self.config["data"] == "cifar10" and run.config.data.data != "synthetic"

    def exclusive(self) -> bool:
        """Measured runs have their machine (locally) or their nodes (Slurm) to themselves."""
        return self.config["resources"].get("exclusive", True)


def resolve_device(config: dict[str, Any], *, on_cluster: bool, local_gpus: int) -> str:
    """auto: the GPUs when there are any (or the jobs run on a cluster), else the CPU."""
    if config["device"] != "auto":
        return config["device"]
    return "cuda" if local_gpus or on_cluster else "cpu"


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two config mappings; lists and scalars in ``overrides`` replace."""
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def build(config: dict[str, Any], *, on_cluster: bool, local_gpus: int, local_gpu_name: str | None = None, references: Sequence[dict[str, Any]] = ()) -> Study:
    """The study of a validated ``config`` (cpu_overrides already applied where they apply)."""
    device = resolve_device(config, on_cluster=on_cluster, local_gpus=local_gpus)
    local = not on_cluster
    gpus_per_node = _gpus_per_node(config, device, local, local_gpus)
    gpu_counts = _gpu_counts(config, local, gpus_per_node)
    if device == "cuda" and local and max(gpu_counts) > local_gpus:
        raise StudyError(
            "scaling.gpu_counts",
            f"the study asks for {max(gpu_counts)} GPUs but this machine has {local_gpus}: lower scaling.gpu_counts, or run on a cluster with --profile slurm",
        )
    if config["warmup_steps"] >= config["steps"]:
        raise StudyError("warmup_steps", f"{config['warmup_steps']} warm-up steps leave none of the {config['steps']} steps measured: lower it below steps")
    shell = Study(config, device, local, gpus_per_node, tuple(gpu_counts), {})
    builder = _Builder(shell)
    builder.scaling()
    builder.sensitivity()
    builder.ablation()
    builder.parallelism()
    builder.reproduce(references, local_gpu_name if local else config.get("reproduce", {}).get("gpu"))
    return Study(config, device, local, gpus_per_node, tuple(gpu_counts), {run_id: builder.probed(run) for run_id, run in builder.runs.items()})


def nodes_for(gpus: int, gpus_per_node: int, local: bool, key: str) -> tuple[int, int]:
    """(ranks per node, nodes) of a job over ``gpus`` GPUs: nodes = ceil(gpus / gpus_per_node).
    Locally there is one node; several nodes must split the ranks evenly."""
    nodes = -(-gpus // gpus_per_node)
    if nodes > 1 and local:
        raise StudyError(
            key,
            f"a run over {gpus} ranks needs {nodes} nodes of gpus_per_node={gpus_per_node}, and local runs have one: "
            f"ask for at most {gpus_per_node}, raise gpus_per_node, or run with --profile slurm",
        )
    if gpus % nodes:
        raise StudyError(key, f"{gpus} GPUs do not split evenly over {nodes} nodes of {gpus_per_node}: choose a multiple of gpus_per_node")
    return gpus // nodes, nodes


def strong_batches(global_batch: int, gpus: int, per_gpu_batch: int, key: str) -> tuple[int, int]:
    """(micro-batch, accumulation steps) of one GPU's share of a strong-scaling global batch
    (common.batch_split.strong_split), or a config error naming ``key``."""
    try:
        return batch_split.strong_split(global_batch, gpus, per_gpu_batch)
    except batch_split.BatchSplitError as error:
        raise StudyError(key, f"{error}: choose a multiple of every GPU count") from None


def _gpus_per_node(config: dict[str, Any], device: str, local: bool, local_gpus: int) -> int:
    if config["gpus_per_node"] != "auto":
        return config["gpus_per_node"]
    if device == "cuda" and local:
        return max(local_gpus, 1)
    raise StudyError("gpus_per_node", "'auto' only resolves on a local GPU machine: set gpus_per_node in the config")


def _gpu_counts(config: dict[str, Any], local: bool, gpus_per_node: int) -> list[int]:
    counts = config["scaling"]["gpu_counts"]
    if counts == "auto":
        limit = gpus_per_node if local else config["scaling"]["max_gpus"]
        counts = [2**k for k in range(int(math.log2(limit)) + 1)]
    return sorted(counts)


# Trainer flags the study sets for every run itself, and what sets them: in trainer_args or a
# model's args each would be overridden without a word (--record, --checkpoint-dir, --resume and
# --progress come after them) or would make the run another than the matrix says (--run-id,
# --seed: every repeat alike, --device).
STUDY_SET_FLAGS = {
    "--record": "the workflow writes each run's record to results/runs/<run>/record.json",
    "--checkpoint-dir": "the workflow gives each run its own folder under results/runs/<run>",
    "--resume": "the workflow resumes every run that has a checkpoint",
    "--progress": "the workflow turns the progress bar off in its logs",
    "--run-id": "the study matrix names each run",
    "--seed": "each repeat is seeded with its number",
    "--device": "the config key device sets it",
    "--per-gpu-batch": "each study chooses its runs' micro-batch (models.<model>.per_gpu_batch, sensitivity.per_gpu_batch, a reference's)",
    "--grad-accum-steps": "strong scaling splits its global batch into micro-batches and accumulation",
}


def refuse_study_set_flags(flags: Sequence[str], key: str) -> None:
    """A StudyError at ``key`` for the first of ``flags`` the study sets itself (``--flag value`` or
    ``--flag=value``)."""
    for flag in flags:
        name = str(flag).split("=", 1)[0]
        if name in STUDY_SET_FLAGS:
            raise StudyError(key, f"{flag} is a flag the study sets for every run ({STUDY_SET_FLAGS[name]}): remove it")


def read_flags(flags: Sequence[str], key: str) -> dict[str, Any]:
    """The settings a user's flag list (config ``key``) gives, read by the trainer's own parser
    (dest name -> value); a flag the study sets itself, or one the trainer refuses, is a config
    error at ``key``."""
    refuse_study_set_flags(flags, key)
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):
            return trainer_flags.given_values(list(flags))
    except SystemExit:
        reason = (refused.getvalue().strip().splitlines() or ["refused"])[-1]
        raise StudyError(key, f"the trainer refuses these flags: {reason.removeprefix(f'{trainer_flags.build_parser().prog}: error: ')}") from None


def trainer_run_key(config: trainer_flags.TrainConfig) -> str:
    """What makes two planned runs one trainer run: every setting the trainer reads but what names
    and places a run (its id, record, checkpoints), its seed (each repeat has its own) and the
    probes after its window, which measure nothing of the window and which the run takes for
    every cell that reads its record (_Builder.probed)."""
    settings = dataclasses.asdict(config)
    settings["run"].update(run_id=None, seed=None, record=None, checkpoint_dir=None, resume=None, progress=None)
    settings["run"].update(comm_probe_steps=None, bucket_probe_steps=None, probe_budget_s=None)
    return json.dumps(settings, sort_keys=True, default=str)


class _Builder:
    def __init__(self, study: Study):
        self.study, self.config = study, study.config
        self.runs: dict[str, Run] = {}
        # (trainer run, repeat) -> the run that runs it: a later cell of one configuration reads its record
        self.owners: dict[tuple[str, int, int], str] = {}
        self.trainer_args = read_flags(self.config["trainer_args"], "trainer_args")
        self.model_args = {model: read_flags(entry.get("args", []), f"models.{model}.args") for model, entry in self.config["models"].items()}

    def cell_config(
        self, model: str, per_gpu_batch: int, layers: Sequence[dict[str, Any]], flags_key: str, grad_accum_steps: int = 1
    ) -> trainer_flags.TrainConfig:
        """A cell's trainer config: the study's settings, then the user's flags (trainer_args, the
        model's args), then the cell's ``layers`` (read_flags, or what the cell sets), each later
        one winning, and the preset resolved for the fields none of the flags sets; a config the
        trainer refuses is an error at ``flags_key``."""
        study = {
            "model": model,
            "data": DATA_DIR if self.config["data"] == "cifar10" else "synthetic",
            "per_gpu_batch": per_gpu_batch,
            "grad_accum_steps": grad_accum_steps,
            "steps": self.config["steps"],
            "warmup_steps": self.config["warmup_steps"],
            "device": self.study.device,
            "progress": "off",
        }
        given = {name: value for layer in (self.trainer_args, self.model_args.get(model, {}), *layers) for name, value in layer.items()}
        config = trainer_flags.with_preset(trainer_flags.with_values(trainer_flags.TrainConfig(), {**study, **given}), given)
        try:
            config.validate()
        except trainer_flags.TrainerConfigError as error:
            raise StudyError(flags_key, f"the trainer refuses these flags: {error}") from None
        return config

    def add(
        self,
        study: str,
        model: str,
        gpus: int,
        repeats: int,
        variant: str,
        config: trainer_flags.TrainConfig,
        key: str,
        flags_key: str,
        reference: str = "",
    ) -> None:
        """Add ``repeats`` runs of one cell of trainer ``config`` (cell_config); ``key`` names the
        setting that chose its GPU count, ``flags_key`` the one its flags came from (both named by
        the errors). The repeats differ in seed and run id only."""
        ranks_per_node, nodes = nodes_for(gpus, self.study.gpus_per_node, self.study.local, key)
        if study != "reproduce":
            self.per_gpu_batch(model, key)  # the model has its entry
        data_parallel = data_parallel_size(config.parallel, gpus, ranks_per_node, flags_key)
        trainer_run = trainer_run_key(config)
        for repeat in range(1, repeats + 1):
            run_id = "_".join(part for part in (study, model, f"g{gpus}", variant, f"r{repeat}") if part)
            # one trainer run, one job: a cell whose run an earlier cell runs already reads that run's record
            owner = self.owners.setdefault((trainer_run, gpus, repeat), run_id)
            run_config = trainer_flags.with_values(config, {"seed": repeat, "run_id": run_id})
            self.runs[run_id] = Run(
                run_id, study, model, gpus, nodes, ranks_per_node, repeat, variant, run_config, reference, data_parallel, "" if owner == run_id else owner
            )

    def probed(self, run: Run) -> Run:
        """``run`` with the probes after its window that the analysis reads of it, or of a cell
        that reads its record (``record_of``), the others off.

        The bucket probe (backward phases and DDP bucket ready times) feeds the scaling model,
        which replays the one-GPU runs of the strong and weak studies alone
        (scalerepro.analysis.tables.scaling_model); the exposed-communication probe is read in
        COMM_PROBE_STUDIES. Anywhere else their steps would be recorded and never read: the
        bucket probe's eager steps were 2 of a 2-rank ResNet-18 job's slowest 10 on a slow CPU,
        and the communication probe of the ablation's emulated-bf16 cell 21 s of a 362 s study.
        Under a study budget the probes measure each configuration once, in its repeat 1, which
        runs whatever the budget chooses; a later repeat times its window only, and the analysis
        gives it its cell's probe (scalerepro.analysis.tables.readers.cell_probes). Without a budget
        every repeat probes."""
        probed = run.repeat == 1 or not self.config["budget"].get("training_s")
        readers = [run, *(other for other in self.runs.values() if other.record_of == run.run_id)]
        off: dict[str, Any] = {} if probed else {"probe_budget_s": 0.0}
        if not probed or not any(reader.study in COMM_PROBE_STUDIES for reader in readers):
            off["comm_probe_steps"] = 0
        if not probed or not any(reader.gpus == 1 and reader.study in BUCKET_PROFILE_STUDIES for reader in readers):
            off["bucket_probe_steps"] = 0
        return dataclasses.replace(run, config=trainer_flags.with_values(run.config, off))

    def per_gpu_batch(self, model: str, key: str) -> int:
        """The model's per-GPU batch (models.<model>); a model without an entry is an error at ``key``."""
        if model not in self.config["models"]:
            raise StudyError(key, f"{model} has no entry under models: add models.{model}.per_gpu_batch")
        return self.config["models"][model]["per_gpu_batch"]

    def scaling(self) -> None:
        scaling, counts = self.config["scaling"], self.study.gpu_counts
        strong_batch = scaling["strong"].get("global_batch", {})
        for model in scaling["models"]:
            batch = self.per_gpu_batch(model, "scaling.models")
            flags_key = f"trainer_args' or 'models.{model}.args"
            global_batch = strong_batch.get(model, batch * max(counts))
            for gpus in counts:
                if scaling["strong"]["enabled"]:
                    key = f"scaling.strong.global_batch.{model}" if model in strong_batch else f"models.{model}.per_gpu_batch"
                    micro, accum = strong_batches(global_batch, gpus, batch, key)
                    config = self.cell_config(model, micro, (), flags_key, grad_accum_steps=accum)
                    self.add("strong", model, gpus, self.config["repeats"], "", config, "scaling.gpu_counts", flags_key)
                if scaling["weak"]["enabled"]:
                    weak = {"data": "synthetic", "synthetic_samples": scaling["weak"]["samples_per_gpu"] * gpus}
                    config = self.cell_config(model, batch, [weak], flags_key)
                    self.add("weak", model, gpus, self.config["repeats"], "", config, "scaling.gpu_counts", flags_key)

    def _gpus(self, choice: int | str) -> int:
        return max(self.study.gpu_counts) if choice == "max" else int(choice)

    def sensitivity(self) -> None:
        sens = self.config["sensitivity"]
        if not sens["enabled"]:
            return
        for bucket in sens["bucket_cap_mb"]:
            for batch in sens["per_gpu_batch"]:
                for precision in sens["precision"]:
                    variant = f"bucket{bucket:g}-batch{batch}-{precision}"
                    # "preset": the precision the preset picks on this device (on a CPU, bf16 only where native)
                    cell = {"bucket_cap_mb": float(bucket), **({"precision": precision} if precision != "preset" else {})}
                    config = self.cell_config(sens["model"], batch, [cell], "sensitivity")
                    self.add("sensitivity", sens["model"], self._gpus(sens["gpus"]), sens["repeats"], variant, config, "sensitivity.gpus", "sensitivity")

    def ablation(self) -> None:
        abl = self.config["ablation"]
        if not abl["enabled"]:
            return
        model, gpus, batch = abl["model"], self._gpus(abl["gpus"]), self.per_gpu_batch(abl["model"], "ablation.model")
        baseline = read_flags(abl["baseline"], "ablation.baseline")
        variants = {"baseline": {}, **{o["name"]: read_flags(o["flags"], f"ablation.optimisations ({o['name']})") for o in abl["optimisations"]}}
        for variant, flags in variants.items():
            key = f"ablation.optimisations ({variant})"
            self.add("ablation", model, gpus, abl["repeats"], variant, self.cell_config(model, batch, [baseline, flags], key), "ablation.gpus", key)
        # "all" is the study's own preset (trainer_args) as it resolves on the machine it runs on,
        # not the optimisations' flags stacked: on a CPU that emulates bf16 the preset trains fp32,
        # which the bf16 cell alone measures against the baseline (the ablation table names the
        # levers each cell's records resolved)
        key = "ablation (all: trainer_args)"
        self.add("ablation", model, gpus, abl["repeats"], "all", self.cell_config(model, batch, (), key), "ablation.gpus", key)

    def parallelism(self) -> None:
        """Each model under each strategy at each GPU count of ``parallelism.gpu_counts`` (auto:
        the study's counts above 1). At N GPUs every strategy trains the same global batch,
        per_gpu_batch x N, each data-parallel replica reading N / replicas of it (one replica
        under tp, N / tp-size under fsdp+tp). fsdp+tp is planned where the GPUs hold at least two
        TP groups (fewer would be tp alone), tp where they are at least two."""
        par = self.config.get("parallelism", {})
        if not par.get("enabled", False):
            return
        counts = [n for n in self.study.gpu_counts if n > 1] if par["gpu_counts"] == "auto" else par["gpu_counts"]
        strategies = {strategy: read_flags(par["args"].get(strategy, []), f"parallelism.args.{strategy}") for strategy in par["strategies"]}
        for model in par["models"]:
            batch = self.per_gpu_batch(model, "parallelism.models")
            for gpus in counts:
                ranks_per_node, _ = nodes_for(gpus, self.study.gpus_per_node, self.study.local, "parallelism.gpu_counts")
                for strategy, flags in strategies.items():
                    key = f"parallelism.args.{strategy}"
                    # synthetic tokens: the study's data: cifar10 is images, and these are language models
                    config = self.cell_config(model, batch, [{"data": "synthetic", "parallel": strategy}, flags], key)
                    tp_size = mesh.default_tp_size(strategy, gpus, ranks_per_node, config.parallel.tp_size) or 1
                    if (strategy == "tp" and gpus < 2) or (strategy == "fsdp+tp" and gpus // tp_size < 2):
                        continue
                    per_replica = batch * gpus // data_parallel_size(config.parallel, gpus, ranks_per_node, key)
                    config = trainer_flags.with_values(config, {"per_gpu_batch": per_replica})
                    self.add("parallelism", model, gpus, par["repeats"], strategy.replace("+", "-"), config, "parallelism.gpu_counts", key)

    def reproduce(self, references: Sequence[dict[str, Any]], gpu_name: str | None) -> None:
        """A run under each reference's conditions, where this machine (or the cluster's
        ``reproduce.gpu``) is the reference's GPU model with enough GPUs; the others are shown
        as not comparable by the report, naming the condition that differs."""
        settings = self.config.get("reproduce", {})
        if not settings.get("enabled", True) or gpu_name is None:
            return
        available = max(self.study.gpu_counts) if self.study.local else self.config["scaling"]["max_gpus"]
        scheduled = set()
        for reference in references:
            trainer, conditions = reference.get("trainer"), reference.get("conditions") or {}
            if trainer is None or conditions.get("gpu") != gpu_name or reference["gpus"] > available:
                continue
            # one run per distinct trainer run: references that share one (a series re-measured
            # on a newer software stack) are set beside the same run by the comparison
            identity = (trainer["model"], reference["gpus"], trainer["per_gpu_batch"], tuple(trainer.get("flags", ())))
            if identity in scheduled:
                continue
            scheduled.add(identity)
            key = f"references: {reference['id']}"
            config = self.cell_config(trainer["model"], trainer["per_gpu_batch"], [read_flags(trainer.get("flags", ()), key)], key)
            self.add("reproduce", trainer["model"], reference["gpus"], settings.get("repeats", 1), _variant(reference["id"]), config, key, key, reference["id"])


def data_parallel_size(parallel: trainer_flags.ParallelConfig, gpus: int, ranks_per_node: int, key: str) -> int:
    """How many replicas read different data under the trainer's ``parallel`` settings on
    ``gpus`` ranks (scalerepro.parallel.mesh, as the trainer computes it)."""
    tp_size = mesh.default_tp_size(parallel.parallel, gpus, ranks_per_node, parallel.tp_size)
    try:
        return mesh.data_parallel_coordinates(parallel.parallel, 0, gpus, tp_size)[1]
    except mesh.ParallelError as error:
        raise StudyError(key, str(error)) from None


def _variant(reference_id: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in reference_id)


def matrix_rows(study: Study, record_path, rerun_command) -> list[dict[str, Any]]:
    """The study matrix as rows for matrix.csv (what the aggregation joins records onto)."""
    return [
        {
            "run_id": run.run_id,
            "study": run.study,
            "model": run.model,
            "gpus": run.gpus,
            "nodes": run.nodes,
            "gpus_per_node": study.gpus_per_node,
            "repeat": run.repeat,
            "variant": run.variant,
            "precision": run.precision,
            "per_gpu_batch": run.per_gpu_batch,
            "grad_accum_steps": run.grad_accum_steps,
            "global_batch": run.global_batch,
            "bucket_cap_mb": run.bucket_cap_mb,
            "parallel": run.parallel,
            "data_parallel": run.data_parallel or run.gpus,
            "reference": run.reference,
            "runtime_min": study.config["resources"]["runtime_min"],
            # what the record must state beside the batches (scalerepro.record.cell.PLANNED)
            "device": study.device,
            "data": "cifar10" if study.uses_cifar(run) else "synthetic",
            "purpose": "measurement",
            "record_of": run.record_of,  # the run whose record this row reads, where another cell runs it
            "cell": run.cell,  # the cell the run repeats (scalerepro.record.cell holds its runs to one configuration)
            "record": record_path(run),
            "rerun": rerun_command(run),
        }
        for run in study.runs.values()
    ]
