# Helpers shared by the rules: configuration (validated, CPU overrides applied), the study
# matrix (one Run per training job), per-run resources and launch commands.

import copy
import math
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
PACKAGE = REPO / "workflow" / "scalerepro"
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
# The device every training run uses. "auto" picks the GPUs when there are any (or the jobs run
# on a cluster), else the CPU, and only then does the small cpu_overrides matrix apply.
DEVICE = (
    config["device"]
    if config["device"] != "auto"
    else ("cuda" if LOCAL_GPUS or not workflow.local_exec else "cpu")
)
if config["device"] == "auto" and DEVICE == "cpu":
    config = _merge(config, config.get("cpu_overrides", {}))
    validate_config(config)
STUDY = config


def _gpus_per_node():
    if STUDY["gpus_per_node"] != "auto":
        return STUDY["gpus_per_node"]
    if DEVICE == "cuda" and workflow.local_exec:
        return max(LOCAL_GPUS, 1)
    raise WorkflowError(
        "gpus_per_node is 'auto', which only a local GPU machine can resolve: set gpus_per_node in the config"
    )


GPUS_PER_NODE = _gpus_per_node()


def _gpu_counts():
    counts = STUDY["scaling"]["gpu_counts"]
    if counts == "auto":
        limit = GPUS_PER_NODE if workflow.local_exec else STUDY["scaling"]["max_gpus"]
        counts = [2**k for k in range(int(math.log2(limit)) + 1)]
    return sorted(counts)


GPU_COUNTS = _gpu_counts()
if DEVICE == "cuda" and workflow.local_exec and max(GPU_COUNTS) > LOCAL_GPUS:
    raise WorkflowError(
        f"the study asks for {max(GPU_COUNTS)} GPUs but this machine has {LOCAL_GPUS}: "
        "lower scaling.gpu_counts, or run on a cluster with --profile slurm"
    )
if workflow.local_exec and "gpus" not in workflow.global_resources:
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


def _resolve_gpus(choice):
    return max(GPU_COUNTS) if choice == "max" else choice


def _runs():
    runs = []

    def add(study, model, gpus, repeats, variant, per_gpu_batch, args):
        args = (*STUDY["models"].get(model, {}).get("args", []), *args)
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
                    precision=_flag(list(args), "--precision", "fp32"),
                    bucket_cap_mb=float(_flag(list(args), "--bucket-cap-mb", 25.0)),
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
        }[key]

    return resource


def rerun_command(run):
    return f"snakemake --cores all --forcerun {record_path(run)}"


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


def container_inputs():
    """The image a job runs in, as an input, so that it is built first (containers enabled)."""
    return [CONTAINER] if CONTAINER else []


def launcher(ranks, nodes=1):
    """How a job starts its ranks: torchrun, one process per GPU (or CPU rank) of this node."""
    if nodes > 1:
        raise WorkflowError(
            f"a run over {nodes} nodes needs the Slurm executor: run with --profile slurm "
            f"(locally at most {GPUS_PER_NODE} ranks fit on this machine)"
        )
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]


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
    "predicted_vs_measured_efficiency",
]
