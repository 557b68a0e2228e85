# Helpers shared by the rules: the invocation's plan (scalerepro.plan: config validated, study
# matrix, scheduler, resources) and the small input/param functions the rules call.

import json
import os
import shlex
import sys
from pathlib import Path

import yaml
from snakemake.cli import get_profile_dir
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
PACKAGE = REPO / "workflow" / "scalerepro"
# The plan, from this checkout's package (it imports no torch).
sys.path.insert(0, str(PACKAGE.parent))
from scalerepro import plan as planning
from scalerepro import schedulers, study
from scalerepro.analysis.figures import FIGURE_NAMES as PLOT_NAMES
from scalerepro.files import trainer_source_files
from scalerepro.plan import record_path

ENV_TRAIN = "../../envs/train.yaml"
ENV_ANALYSIS = "../../envs/analysis.yaml"


def _profile_executor(name):
    """The executor a Snakemake profile names, found where Snakemake finds profiles."""
    found = get_profile_dir(name)
    return (
        (yaml.safe_load(found[1].read_text()) or {}).get("executor") if found else None
    )


try:
    PLAN = planning.load(
        config,
        schema=REPO / "workflow" / "schemas" / "config.schema.yaml",
        references=REPO / "config" / "references.yaml",
        executor=schedulers.invocation_executor(
            sys.argv, os.environ, _profile_executor
        ),
        # Snakemake re-runs the workflow inside each job: there the study must resolve
        # exactly as it did on the submitting host.
        in_job=not workflow.is_main_process,
        local_gpu_names=schedulers.local_gpu_names(),
    )
    if workflow.is_main_process and not PLAN.local_runs:
        PLAN.scheduler.check(PLAN.config[PLAN.scheduler.name])
    PROFILING_PLAN = planning.profiling_plan(PLAN, local_exec=workflow.local_exec)
except (planning.ConfigError, study.StudyError, schedulers.SchedulerError) as error:
    raise WorkflowError(str(error)) from None

CONFIG, STUDY, DEVICE = PLAN.config, PLAN.study, PLAN.device
RUNS, GPU_COUNTS, GPUS_PER_NODE = (
    STUDY.runs,
    list(STUDY.gpu_counts),
    STUDY.gpus_per_node,
)
COMM_GPU_COUNTS = STUDY.comm_gpu_counts
DATA_DIR = study.DATA_DIR
CONTAINER, RANKS_CONTAINER = PLAN.container, PLAN.ranks_container()
SLURM_GPUS = PLAN.cluster_gpus
CLUSTER_RESOURCES = PLAN.queue_resources()
if PLAN.local_runs and "gpus" not in workflow.global_resources:
    # The local scheduler then never runs more GPU ranks at once than there are GPUs.
    workflow.register_resource("gpus", len(PLAN.local_gpu_names))
if (
    PLAN.local_runs
    and STUDY.exclusive()
    and "measured" not in workflow.global_resources
):
    # One measured job at a time: two on one machine share its cores, memory bandwidth and
    # GPUs, and each measures the other (resources.exclusive: false packs them).
    workflow.register_resource("measured", 1)

# One file standing for the trainer's sources: each training job depends on it rather than on
# every source file, which keeps DAG construction fast for thousand-run matrices.
TRAINER_FINGERPRINT = "results/fingerprints/trainer.sha256"


wildcard_constraints:
    run=r"[A-Za-z0-9_.-]+",
    gpus=r"\d+",


def trainer_sources():
    """The torch side of the package: editing any of it reruns the training jobs."""
    return [str(path) for path in trainer_source_files(PACKAGE)]


def analysis_module(name):
    """The source of one analysis step: editing it reruns that step and what follows only."""
    shared = [PACKAGE / "files.py", PACKAGE / "analysis" / "__init__.py"]
    return [str(path) for path in (*shared, PACKAGE / "analysis" / f"{name}.py")]


def data_input(wildcards):
    return [DATA_DIR] if STUDY.uses_cifar(RUNS[wildcards.run]) else []


def container_inputs():
    """The image a job runs in, as an input, so that it is built first (containers enabled)."""
    return [CONTAINER] if CONTAINER else []


def run_resources(key):
    """One resource (``key``) of a training or profiling job, from its run's GPU count."""
    return lambda wildcards: PLAN.train_resources(RUNS[wildcards.run])[key]


def run_threads(wildcards):
    return PLAN.train_threads(RUNS[wildcards.run])


def run_priority(wildcards):
    """Repeat 1 of every cell before any repeat 2 (scalerepro.plan.Plan.train_priority)."""
    return PLAN.train_priority(RUNS[wildcards.run])


def comm_resources(key):
    """One resource (``key``) of the all-reduce benchmark over ``wildcards.gpus`` GPUs."""
    return lambda wildcards: PLAN.comm_resources(int(wildcards.gpus))[key]


def run_launch_args(prefix=""):
    """scalerepro.launch's flags for the job of ``wildcards.run`` (named ``prefix`` then the run id)."""
    return lambda wc: PLAN.launch_args(
        RUNS[wc.run].ranks_per_node, RUNS[wc.run].nodes, f"{prefix}{wc.run}"
    )


def run_trainer_args(wildcards):
    """Every trainer flag of one training job (scalerepro.study.Study.trainer_args)."""
    run_dir = f"results/runs/{wildcards.run}"
    return STUDY.trainer_args(
        RUNS[wildcards.run], f"{run_dir}/record.json", f"{run_dir}/checkpoints"
    )


def comm_launch_args(wildcards):
    gpus = int(wildcards.gpus)
    return shlex.join(PLAN.launch_args(*PLAN.ranks_and_nodes(gpus), f"comm_g{gpus}"))


def matrix_rows():
    """The study matrix as rows for matrix.csv (what the aggregation joins records onto)."""
    return PLAN.matrix_rows()


def targets_args():
    """--targets of scalerepro.analysis.aggregate: the config's targets (checks included) as JSON."""
    return f"--targets {shlex.quote(json.dumps(CONFIG['targets']))}"


# ---- profiling (workflow/rules/profile.smk) ----
PROFILING = CONFIG["profiling"]
PROFILED_RUNS = list(PROFILING_PLAN.runs)
PROFILING_TOOLS = list(PROFILING_PLAN.tools)
PROFILING_FALLBACK_REASON = PROFILING_PLAN.fallback_reason
PROFILING_TABLES = list(planning.PROFILING_TABLES)


def profiling_tables():
    """The profiling tables as inputs of the plots and the report (none when disabled)."""
    return PROFILING_PLAN.tables()


def profile_trainer_args(wildcards):
    return PROFILING_PLAN.trainer_args(PLAN, wildcards.run, wildcards.tool)


def profile_inputs(wildcards):
    """ncu after nsys (when both run): it profiles the kernels nsys found on top."""
    inputs = data_input(wildcards)
    if wildcards.tool == "ncu" and "nsys" in PROFILING_TOOLS:
        inputs.append(f"results/profiles/{wildcards.run}/nsys/capture.json")
    return inputs


def device_name_flags():
    """--device-name of the GPUs the profiled runs use, where known before they run."""
    name = PLAN.profiled_device_name()
    return ["--device-name", name] if name else []
