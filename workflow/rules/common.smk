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
from snakemake.utils import validate

REPO = Path(workflow.basedir)
PACKAGE = REPO / "workflow" / "scalerepro"
# The study model, from this checkout's package (it imports neither torch nor Snakemake).
sys.path.insert(0, str(PACKAGE.parent))
from scalerepro import study
from scalerepro.files import trainer_source_files

ENV_TRAIN = "../../envs/train.yaml"
ENV_ANALYSIS = "../../envs/analysis.yaml"


def _local_gpu_names():
    """The names of this machine's GPUs, from nvidia-smi (the workflow's own environment needs no
    torch): "GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)" -> "NVIDIA H100 80GB HBM3"."""
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if listed.returncode != 0:
        return []
    return [
        line.split(": ", 1)[1].split(" (UUID")[0]
        for line in listed.stdout.splitlines()
        if line.startswith("GPU ")
    ]


CONFIG_SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def config_error(key, message):
    """The one-line error of a bad config value: where it is, what is wrong, what to do."""
    return WorkflowError(f"config error at '{key}': {message}")


def validate_config(values):
    """snakemake.utils.validate (which also fills in the schema's defaults), its first problem
    turned into one line naming the key."""
    try:
        validate(values, CONFIG_SCHEMA, set_default=True)
    except WorkflowError as wrapped:
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
        raise config_error(
            where,
            f"{message} (allowed keys and values: {CONFIG_SCHEMA.relative_to(REPO)})",
        ) from None


validate_config(config)
LOCAL_GPU_NAMES = _local_gpu_names()


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
DEVICE = study.resolve_device(
    config, on_slurm=ON_SLURM, local_gpus=len(LOCAL_GPU_NAMES)
)
if config["device"] == "auto" and DEVICE == "cpu":
    config = study.merge(config, config.get("cpu_overrides", {}))
    validate_config(config)
CONFIG = config
try:
    STUDY = study.build(
        CONFIG,
        on_slurm=ON_SLURM,
        local_gpus=len(LOCAL_GPU_NAMES),
        local_gpu_name=LOCAL_GPU_NAMES[0] if LOCAL_GPU_NAMES else None,
        references=yaml.safe_load(
            (REPO / "config" / "references.yaml").read_text()
        ).get("references", []),
    )
except study.StudyError as error:
    raise WorkflowError(str(error)) from None
GPUS_PER_NODE, GPU_COUNTS, RUNS = (
    STUDY.gpus_per_node,
    list(STUDY.gpu_counts),
    STUDY.runs,
)
COMM_GPU_COUNTS = STUDY.comm_gpu_counts
DATA_DIR = study.DATA_DIR
if LOCAL_RUNS and "gpus" not in workflow.global_resources:
    # The local scheduler then never runs more GPU ranks at once than there are GPUs.
    workflow.register_resource("gpus", len(LOCAL_GPU_NAMES))
if LOCAL_RUNS and STUDY.exclusive() and "measured" not in workflow.global_resources:
    # One measured job at a time: two on one machine share its cores, memory bandwidth and
    # GPUs, and each measures the other (resources.exclusive: false packs them).
    workflow.register_resource("measured", 1)


def ranks_and_nodes(gpus):
    """(ranks per node, nodes) for a job over ``gpus`` GPUs (scalerepro.study.nodes_for)."""
    return study.nodes_for(gpus, GPUS_PER_NODE, LOCAL_RUNS, "scaling.gpu_counts")


def record_path(run):
    return f"results/runs/{run.run_id}/record.json"


# One file standing for the trainer's sources: each training job depends on it rather than on
# every source file, which keeps DAG construction fast for thousand-run matrices.
TRAINER_FINGERPRINT = "results/fingerprints/trainer.sha256"


def trainer_sources():
    """The torch side of the package: editing any of it reruns the training jobs."""
    return [str(path) for path in trainer_source_files(PACKAGE)]


def analysis_module(name):
    """The source of one analysis step: editing it reruns that step and what follows only."""
    shared = [PACKAGE / "files.py", PACKAGE / "analysis" / "__init__.py"]
    return [str(path) for path in (*shared, PACKAGE / "analysis" / f"{name}.py")]


def data_input(wildcards):
    return [DATA_DIR] if STUDY.uses_cifar(RUNS[wildcards.run]) else []


def trainer_args(run, record, checkpoint_dir):
    """Every flag of one run (scalerepro.study.Study.trainer_args)."""
    return STUDY.trainer_args(run, record, checkpoint_dir)


def run_resources(key):
    """Per-run resources derived from the run's GPU count (``key`` names the resource)."""

    def resource(wildcards):
        run = RUNS[wildcards.run]
        per_gpu = CONFIG["resources"]
        return {
            "nodes": run.nodes,
            "tasks": run.nodes,
            "gpus": run.gpus if DEVICE == "cuda" else 0,
            "gpus_per_node": run.ranks_per_node if DEVICE == "cuda" else 0,
            "cpus_per_task": run.ranks_per_node * per_gpu["cpus_per_gpu"],
            "mem_mb": run.ranks_per_node * per_gpu["mem_mb_per_gpu"],
            "runtime": per_gpu["runtime_min"],
            "measured": 1,
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
    return study.matrix_rows(STUDY, record_path, rerun_command)


def targets_args():
    """--targets of scalerepro.analysis.aggregate: the config's targets (checks included) as JSON."""
    import json

    return "--targets " + shlex.quote(json.dumps(CONFIG["targets"], sort_keys=False))


wildcard_constraints:
    run=r"[A-Za-z0-9_.-]+",
    gpus=r"\d+",


CONTAINER = CONFIG["container"]["sif"] if CONFIG["container"]["enabled"] else None
# Rules that start ranks run the container themselves on Slurm (inside each node's srun task,
# since srun is not in the image); elsewhere Snakemake's container: directive does it.
RANKS_CONTAINER = None if ON_SLURM else CONTAINER


def container_inputs():
    """The image a job runs in, as an input, so that it is built first (containers enabled)."""
    return [CONTAINER] if CONTAINER else []


SLURM = CONFIG["slurm"]
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
    args = [
        f"--nodes={nodes}", f"--ranks-per-node={ranks_per_node}",
        f"--cpus-per-node={ranks_per_node * CONFIG['resources']['cpus_per_gpu']}",
        f"--port={SLURM['rendezvous_port']}", f"--name={name}",
        *(["--slurm-gpus"] if SLURM_GPUS else []),
        *(f"--env={key}={value}" for key, value in SLURM["env"].items()),
        *([f"--container={CONTAINER}"] if CONTAINER and ON_SLURM else []),
    ]  # fmt: skip
    return args


def slurm_resources(ranks_per_node, nodes, signal=False, measured=True):
    """sbatch settings of a job that starts ranks: ``nodes`` nodes with ``ranks_per_node`` GPUs
    each (``--gres=gpu:<n>`` is per node), one task per node holding all its CPUs.

    ``mpi`` (any value) tells the plugin's job step that the job starts its own srun step;
    without it the rule would run inside an ``srun -n1`` step, which Slurm's warning signal
    reaches and kills. Its empty value keeps sbatch's MPI task-count checks out of the way.
    ``tasks_per_gpu=0`` stops the plugin from asking for one task per GPU. A measured job gets
    whole nodes (``--exclusive``) unless resources.exclusive is false."""
    return {
        "mpi": "",
        "tasks_per_gpu": 0,
        "gres": f"gpu:{ranks_per_node}" if SLURM_GPUS else None,
        # The plugin pastes slurm_extra into its sbatch shell command: every token is quoted
        # (and the schema allows only --name[=value] tokens of shell-inert characters).
        "slurm_extra": shlex.join(
            [
                *SLURM["extra"],
                *(["--exclusive"] if measured and STUDY.exclusive() else []),
                *([f"--signal=USR1@{SLURM['signal_before_end_s']}"] if signal else []),
            ]
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

# The figures scalerepro.analysis.plots writes: the one list, in the package.
from scalerepro.analysis.figures import FIGURE_NAMES as PLOT_NAMES
