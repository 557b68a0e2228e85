# Helpers shared by the rules: configuration (validated, CPU overrides applied), the study
# matrix (one Run per training job), per-run resources and launch commands.

import copy
import math
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml
from snakemake.cli import get_profile_dir
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
PACKAGE = REPO / "workflow" / "scalerepro"
# The trainer's presets, from this checkout's package (scalerepro.config imports no torch).
sys.path.insert(0, str(PACKAGE.parent))
from scalerepro.config import DEFAULT_PRESET, PRESETS

ENV_TRAIN = "../../envs/train.yaml"
ENV_ANALYSIS = "../../envs/analysis.yaml"


def _local_gpu_count():
    """GPUs on this machine, from nvidia-smi (the workflow's own environment needs no torch)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return (
        sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
        if listed.returncode == 0
        else 0
    )


def _merge(base, overrides):
    """Deep-merge two config mappings; lists and scalars in ``overrides`` replace."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


CONFIG_SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def validate_config(values):
    """Check the config against its JSON Schema; the first problem becomes one line naming the key."""
    schema = yaml.safe_load(CONFIG_SCHEMA.read_text())
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(values),
        key=lambda e: e.path,
    )
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(part) for part in error.absolute_path) or "top level"
        message = (
            f"unknown key {error.instance!r}"
            if "propertyNames" in error.schema_path
            else error.message
        )
        raise WorkflowError(
            f"config error at '{where}': {message} (allowed keys and values: {CONFIG_SCHEMA.relative_to(REPO)})"
        )


validate_config(config)
LOCAL_GPUS = _local_gpu_count()


def _profile_executor(name):
    """The executor a Snakemake profile names, found where Snakemake finds profiles."""
    found = get_profile_dir(name)
    return (
        (yaml.safe_load(found[1].read_text()) or {}).get("executor") if found else None
    )


def _submits_to_slurm(argv):
    """Whether this invocation submits its jobs to Slurm. Snakemake reads the Snakefile before it
    sets up the executor (workflow.local_exec is still True here), and the study's shape depends
    on the answer (device, GPU counts), so read it where Snakemake does: --executor/-e, else the
    profile (--profile or $SNAKEMAKE_PROFILE)."""
    executor, profile = None, os.environ.get("SNAKEMAKE_PROFILE")
    for flag, value in zip(argv, argv[1:]):
        if flag in ("--executor", "-e"):
            executor = value
        elif flag == "--profile":
            profile = value
    for arg in argv:
        if arg.startswith("--executor="):
            executor = arg.split("=", 1)[1]
        elif arg.startswith("--profile="):
            profile = arg.split("=", 1)[1]
    if executor is None and profile:
        executor = _profile_executor(profile)
    return executor == "slurm"


# The jobs run on Slurm: this process submits them (--profile slurm), or it is one of them
# (Snakemake re-runs the workflow inside each job; there the study must resolve exactly as it
# did on the login node).
ON_SLURM = (
    _submits_to_slurm(sys.argv)
    if workflow.is_main_process
    else "SLURM_JOB_ID" in os.environ
)
# Where the ranks run: on this machine only when nothing is submitted.
LOCAL_RUNS = not ON_SLURM
# The device every training run uses. "auto" picks the GPUs when there are any (or the jobs run
# on a cluster), else the CPU, and only then does the small cpu_overrides matrix apply.
DEVICE = (
    config["device"]
    if config["device"] != "auto"
    else ("cuda" if LOCAL_GPUS or ON_SLURM else "cpu")
)
if config["device"] == "auto" and DEVICE == "cpu":
    config = _merge(config, config.get("cpu_overrides", {}))
    validate_config(config)
STUDY = config


def _gpus_per_node():
    if STUDY["gpus_per_node"] != "auto":
        return STUDY["gpus_per_node"]
    if DEVICE == "cuda" and LOCAL_RUNS:
        return max(LOCAL_GPUS, 1)
    raise WorkflowError(
        "gpus_per_node is 'auto', which only a local GPU machine can resolve: set gpus_per_node in the config"
    )


GPUS_PER_NODE = _gpus_per_node()


def _gpu_counts():
    counts = STUDY["scaling"]["gpu_counts"]
    if counts == "auto":
        limit = GPUS_PER_NODE if LOCAL_RUNS else STUDY["scaling"]["max_gpus"]
        counts = [2**k for k in range(int(math.log2(limit)) + 1)]
    return sorted(counts)


GPU_COUNTS = _gpu_counts()
if DEVICE == "cuda" and LOCAL_RUNS and max(GPU_COUNTS) > LOCAL_GPUS:
    raise WorkflowError(
        f"the study asks for {max(GPU_COUNTS)} GPUs but this machine has {LOCAL_GPUS}: "
        "lower scaling.gpu_counts, or run on a cluster with --profile slurm"
    )
if LOCAL_RUNS and "gpus" not in workflow.global_resources:
    # The local scheduler then never runs more GPU ranks at once than there are GPUs.
    workflow.register_resource("gpus", LOCAL_GPUS)


def ranks_and_nodes(gpus):
    """(ranks per node, nodes) for a job over ``gpus`` GPUs: nodes = ceil(gpus / gpus_per_node)."""
    nodes = -(-gpus // GPUS_PER_NODE)
    if gpus % nodes:
        raise WorkflowError(
            f"{gpus} GPUs do not split evenly over {nodes} nodes of {GPUS_PER_NODE}: choose a multiple of gpus_per_node"
        )
    return gpus // nodes, nodes


@dataclass(frozen=True)
class Run:
    """One training job of the study: a cell of the matrix and one repeat of it."""

    run_id: str
    study: str  # strong | weak | sensitivity | ablation
    model: str
    gpus: int
    repeat: int
    variant: str
    per_gpu_batch: int
    precision: str
    bucket_cap_mb: float
    args: tuple  # trainer flags specific to this run

    @property
    def ranks_per_node(self):
        return ranks_and_nodes(self.gpus)[0]

    @property
    def nodes(self):
        return ranks_and_nodes(self.gpus)[1]

    @property
    def global_batch(self):
        return self.per_gpu_batch * self.gpus


def _flag(args, name, default):
    """The last value given for ``name`` in a flag list (argparse semantics), else ``default``."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    return values[-1] if values else default


def resolved_precision(flags):
    """The precision a trainer given ``flags`` runs in: --precision, else its preset's."""
    preset = _flag(flags, "--preset", DEFAULT_PRESET)
    return _flag(flags, "--precision", PRESETS.get(preset, {}).get("precision", "fp32"))


def _resolve_gpus(choice):
    return max(GPU_COUNTS) if choice == "max" else choice


def _runs():
    runs = []

    def add(study, model, gpus, repeats, variant, per_gpu_batch, args):
        args = (*STUDY["models"].get(model, {}).get("args", []), *args)
        # The run's flags in the order trainer_args() gives them to the trainer.
        flags = [*STUDY["trainer_args"], *args]
        for repeat in range(1, repeats + 1):
            name = "_".join(
                part
                for part in (study, model, f"g{gpus}", variant, f"r{repeat}")
                if part
            )
            runs.append(
                Run(
                    run_id=name,
                    study=study,
                    model=model,
                    gpus=gpus,
                    repeat=repeat,
                    variant=variant,
                    per_gpu_batch=per_gpu_batch,
                    precision=resolved_precision(flags),
                    bucket_cap_mb=float(_flag(flags, "--bucket-cap-mb", 25.0)),
                    args=tuple(args),
                )
            )

    scaling, repeats = STUDY["scaling"], STUDY["repeats"]
    for model in scaling["models"]:
        if model not in STUDY["models"]:
            raise WorkflowError(
                f"scaling.models lists {model}, which has no entry under models: add models.{model}.per_gpu_batch"
            )
        batch = STUDY["models"][model]["per_gpu_batch"]
        # Strong scaling: the global batch of the smallest count stays fixed, split over N GPUs.
        global_batch = batch * GPU_COUNTS[0]
        for gpus in GPU_COUNTS:
            if scaling["strong"]["enabled"]:
                if global_batch % gpus:
                    raise WorkflowError(
                        f"strong scaling of {model}: global batch {global_batch} does not split over {gpus} GPUs: "
                        f"make models.{model}.per_gpu_batch x {GPU_COUNTS[0]} divisible by every GPU count"
                    )
                add("strong", model, gpus, repeats, "", global_batch // gpus, ())
            if scaling["weak"]["enabled"]:
                # Weak scaling: per-GPU batch and per-GPU data fixed, so an epoch grows with N.
                samples = scaling["weak"]["samples_per_gpu"] * gpus
                add(
                    "weak",
                    model,
                    gpus,
                    repeats,
                    "",
                    batch,
                    ("--data", "synthetic", "--synthetic-samples", str(samples)),
                )

    sens = STUDY["sensitivity"]
    if sens["enabled"]:
        for bucket in sens["bucket_cap_mb"]:
            for batch in sens["per_gpu_batch"]:
                for precision in sens["precision"]:
                    variant = f"bucket{bucket:g}-batch{batch}-{precision}"
                    args = ("--bucket-cap-mb", f"{bucket:g}", "--precision", precision)
                    add(
                        "sensitivity",
                        sens["model"],
                        _resolve_gpus(sens["gpus"]),
                        sens["repeats"],
                        variant,
                        batch,
                        args,
                    )

    abl = STUDY["ablation"]
    if abl["enabled"]:
        batch = STUDY["models"][abl["model"]]["per_gpu_batch"]
        gpus = _resolve_gpus(abl["gpus"])
        variants = {
            "baseline": [],
            **{o["name"]: o["flags"] for o in abl["optimisations"]},
        }
        variants["all"] = [flag for o in abl["optimisations"] for flag in o["flags"]]
        for variant, flags in variants.items():
            add(
                "ablation",
                abl["model"],
                gpus,
                abl["repeats"],
                variant,
                batch,
                (*abl["baseline"], *flags),
            )
    return {run.run_id: run for run in runs}


RUNS = _runs()
COMM_GPU_COUNTS = (
    [n for n in GPU_COUNTS if n > 1] if STUDY["communication"]["enabled"] else []
)
DATA_DIR = "results/data/cifar10"


def record_path(run):
    return f"results/runs/{run.run_id}/record.json"


# One file standing for the trainer's sources: each training job depends on it rather than on
# every source file, which keeps DAG construction fast for thousand-run matrices.
TRAINER_FINGERPRINT = "results/fingerprints/trainer.sha256"


def trainer_sources():
    """The torch side of the package: editing any of it reruns the training jobs."""
    return sorted(str(p) for p in PACKAGE.rglob("*.py") if "analysis" not in p.parts)


def analysis_module(name):
    """The source of one analysis step: editing it reruns that step and what follows only."""
    shared = [PACKAGE / "files.py", PACKAGE / "analysis" / "__init__.py"]
    return [str(path) for path in (*shared, PACKAGE / "analysis" / f"{name}.py")]


def data_input(wildcards):
    run = RUNS[wildcards.run]
    uses_cifar = (
        STUDY["data"] == "cifar10"
        and _flag(list(run.args), "--data", None) != "synthetic"
    )
    return [DATA_DIR] if uses_cifar else []


def trainer_args(run, record, checkpoint_dir):
    """Every flag of one run: the study's, the run's, then where it writes."""
    data = DATA_DIR if STUDY["data"] == "cifar10" else "synthetic"
    return [
        "--model", run.model, "--data", data, "--batch-size", str(run.per_gpu_batch),
        "--steps", str(STUDY["steps"]), "--warmup-steps", str(STUDY["warmup_steps"]),
        "--seed", str(run.repeat), "--device", DEVICE, "--run-id", run.run_id,
        *STUDY["trainer_args"], *run.args,
        "--record", record, "--checkpoint-dir", checkpoint_dir, "--resume", "--progress", "off",
    ]  # fmt: skip


def run_resources(key):
    """Per-run resources derived from the run's GPU count (``key`` names the resource)."""

    def resource(wildcards):
        run = RUNS[wildcards.run]
        per_gpu = STUDY["resources"]
        return {
            "nodes": run.nodes,
            "tasks": run.nodes,
            "gpus": run.gpus if DEVICE == "cuda" else 0,
            "gpus_per_node": run.ranks_per_node if DEVICE == "cuda" else 0,
            "cpus_per_task": run.ranks_per_node * per_gpu["cpus_per_gpu"],
            "mem_mb": run.ranks_per_node * per_gpu["mem_mb_per_gpu"],
            "runtime": per_gpu["runtime_min"],
            **slurm_resources(run.ranks_per_node, run.nodes, signal=True),
        }[key]

    return resource


def comm_resources(key):
    """The Slurm resources (``key`` names one) of the all-reduce benchmark over ``wildcards.gpus``."""
    return lambda wildcards: slurm_resources(*ranks_and_nodes(int(wildcards.gpus)))[key]


def rerun_command(run):
    where = "--profile slurm" if ON_SLURM else "--cores all"
    return f"snakemake {where} --forcerun {record_path(run)}"


def matrix_rows():
    """The study matrix as rows for matrix.csv (what the aggregation joins records onto)."""
    return [
        {
            "run_id": run.run_id,
            "study": run.study,
            "model": run.model,
            "gpus": run.gpus,
            "nodes": run.nodes,
            "gpus_per_node": GPUS_PER_NODE,
            "repeat": run.repeat,
            "variant": run.variant,
            "precision": run.precision,
            "per_rank_batch": run.per_gpu_batch,
            "global_batch": run.global_batch,
            "bucket_cap_mb": run.bucket_cap_mb,
            "runtime_min": STUDY["resources"]["runtime_min"],
            "record": record_path(run),
            "rerun": rerun_command(run),
        }
        for run in RUNS.values()
    ]


def targets_args():
    return " ".join(
        f"--target {key}={value}" for key, value in STUDY["targets"].items()
    )


wildcard_constraints:
    run=r"[A-Za-z0-9_.-]+",
    gpus=r"\d+",


CONTAINER = STUDY["container"]["sif"] if STUDY["container"]["enabled"] else None
# Rules that start ranks run the container themselves on Slurm (inside each node's srun task,
# since srun is not in the image); elsewhere Snakemake's container: directive does it.
RANKS_CONTAINER = None if ON_SLURM else CONTAINER


def container_inputs():
    """The image a job runs in, as an input, so that it is built first (containers enabled)."""
    return [CONTAINER] if CONTAINER else []


SLURM = STUDY["slurm"]
SLURM_GPUS = DEVICE == "cuda" if SLURM["gpus"] == "auto" else SLURM["gpus"]
# Account, partition, QoS and constraint of every job the workflow submits (unset ones omitted).
CLUSTER_RESOURCES = {
    resource: SLURM[key]
    for resource, key in (
        ("slurm_account", "account"),
        ("slurm_partition", "partition"),
        ("qos", "qos"),
        ("constraint", "constraint"),
    )
    if SLURM[key] is not None
}


def launch_args(ranks_per_node, nodes, name):
    """Flags of ``python -m scalerepro.launch`` for a job of ``nodes`` x ``ranks_per_node`` ranks:
    torchrun on this machine, or (inside a Slurm job) one srun task per node running torchrun.
    """
    if nodes > 1 and LOCAL_RUNS:
        raise WorkflowError(
            f"a run over {nodes} nodes needs the Slurm executor: run with --profile slurm "
            f"(locally at most {GPUS_PER_NODE} ranks fit on this machine)"
        )
    args = [
        f"--nodes={nodes}", f"--ranks-per-node={ranks_per_node}",
        f"--cpus-per-node={ranks_per_node * STUDY['resources']['cpus_per_gpu']}",
        f"--port={SLURM['rendezvous_port']}", f"--name={name}",
        *(["--slurm-gpus"] if SLURM_GPUS else []),
        *(f"--env={key}={value}" for key, value in SLURM["env"].items()),
        *([f"--container={CONTAINER}"] if CONTAINER and ON_SLURM else []),
    ]  # fmt: skip
    return args


def slurm_resources(ranks_per_node, nodes, signal=False):
    """sbatch settings of a job that starts ranks: ``nodes`` nodes with ``ranks_per_node`` GPUs
    each (``--gres=gpu:<n>`` is per node), one task per node holding all its CPUs.

    ``mpi`` (any value) tells the plugin's job step that the job starts its own srun step;
    without it the rule would run inside an ``srun -n1`` step, which Slurm's warning signal
    reaches and kills. Its empty value keeps sbatch's MPI task-count checks out of the way.
    ``tasks_per_gpu=0`` stops the plugin from asking for one task per GPU."""
    return {
        "mpi": "",
        "tasks_per_gpu": 0,
        "gres": f"gpu:{ranks_per_node}" if SLURM_GPUS else None,
        "slurm_extra": " ".join(
            part
            for part in (
                SLURM["extra"],
                f"--signal=USR1@{SLURM['signal_before_end_s']}" if signal else "",
            )
            if part
        )
        or None,
    }


def _check_slurm_partition():
    """On the submitting host: the scheduler answers and the configured partition exists."""
    if not (ON_SLURM and workflow.is_main_process):
        return
    listed = subprocess.run(
        ["sinfo", "--noheader", "--format=%R"], capture_output=True, text=True
    )
    if listed.returncode != 0:
        raise WorkflowError(
            "the Slurm controller does not answer (sinfo: "
            f"{listed.stderr.strip().splitlines()[-1] if listed.stderr.strip() else 'no output'}): "
            "check `scontrol ping` and that SLURM_CONF points at this cluster"
        )
    partitions = sorted(set(listed.stdout.split()))
    if SLURM["partition"] is not None and SLURM["partition"] not in partitions:
        raise WorkflowError(
            f"config error at 'slurm.partition': {SLURM['partition']!r} is not a partition of this "
            f"cluster (sinfo lists: {', '.join(partitions)}): set slurm.partition in config/config.yaml"
        )


_check_slurm_partition()

# The figures scalerepro.analysis.plots writes (tests check the two lists agree).
PLOT_NAMES = [
    "throughput_vs_gpus",
    "efficiency_vs_gpus",
    "weak_epoch_time",
    "sensitivity_heatmap",
    "ablation_gain",
    "loss_curves",
    "accuracy_curves",
    "energy_per_sample",
    "busbw_vs_size",
    "profile_breakdown",
    "roofline",
    "predicted_vs_measured_efficiency",
]
