# What the rule files share, each defined here once. A rule file needs this file included before
# it and nothing of another rule file, so the rule files may be included in any order.
#
#   the plan       PLAN, PROFILING_PLAN, CONFIG, STUDY, DEVICE, RUNS, GPU_COUNTS, GPUS_PER_NODE,
#                  COMM_GPU_COUNTS, BASELINE, BUDGET, planning (the module: its PROFILING_TABLES)
#   software       ENV_TRAIN, ENV_ANALYSIS, CONTAINER, RANKS_CONTAINER, container_inputs
#   resources      CLUSTER_RESOURCES, RUN_RESOURCES, SLURM_GPUS, comm_resources, run_threads,
#                  run_priority
#   files          the files rules of more than one rule file name (DATA_DIR, RUN_RECORD,
#                  record_path, MATRIX_CSV, ... below), program_sources, program_fingerprint,
#                  data_input, study_records (the runs the budget chose: budgeted_repeats)
#   flags          run_launch_args, run_trainer_args, comm_launch_args, matrix_rows, folder_of (a
#                  program's folder argument, from a declared input or output)
#   hooks          start_fork_server, stop_fork_server, driver_signals (the Snakefile's onstart,
#                  onsuccess, onerror)
#
# Parsing this file also changes the process it runs in; every such change is in the section
# "What parsing changes" below, and nowhere else in the rule files.

import os
import sys
from collections import Counter
from pathlib import Path

import yaml
from snakemake.cli import get_profile_dir
from snakemake.exceptions import WorkflowError

REPO = Path(workflow.basedir)
PACKAGE = REPO / "workflow" / "scalerepro"
# The plan, from this checkout's package (it imports no torch, and no pandas: the `workflow`
# extra alone parses the rules). The one change to this process made before that section: the
# package must be importable before the plan can be made.
sys.path.insert(0, str(PACKAGE.parent))
from scalerepro import schedulers
from scalerepro.analysis.columns import AGGREGATE_TABLES
from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES
from scalerepro.analysis.tables import check_definitions
from scalerepro.common import driver_lock
from scalerepro.common.source_closure import run_jobs_from_this_checkout, source_files
from scalerepro.launching import driver_signals, fork_server
from scalerepro.planning import budget
from scalerepro.planning import plan as planning
from scalerepro.planning import study
from scalerepro.record import node_check
from scalerepro.planning.plan import RUN_JOB, RUN_RECORD, job_path, record_path
from scalerepro.schedulers.base import SchedulerError

# ---- The plan ---------------------------------------------------------------------------------


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
        PLAN.check_scheduler()
    # the nodes the prescreen measures, listed once, on the submitting host (a job needs none)
    PRESCREEN_NODES = (
        PLAN.prescreen_nodes()
        if PLAN.config["prescreen"]["enabled"] and workflow.is_main_process
        else []
    )
    PROFILING_PLAN = planning.profiling_plan(PLAN, local_exec=workflow.local_exec)
    # the checks select on the aggregation's columns: refused now, not after the tables are made
    check_definitions.parse_checks(PLAN.config["targets"])
except (
    planning.ConfigError,
    study.StudyError,
    SchedulerError,
    check_definitions.CheckConfigError,
) as error:
    raise WorkflowError(str(error)) from None

CONFIG, STUDY, DEVICE = PLAN.config, PLAN.study, PLAN.device
RUNS, GPU_COUNTS, GPUS_PER_NODE = (
    STUDY.runs,
    list(STUDY.gpu_counts),
    STUDY.gpus_per_node,
)
COMM_GPU_COUNTS = STUDY.comm_gpu_counts
# the stored study this one is compared with (config `compare.baseline`), or None
BASELINE = CONFIG["compare"]["baseline"]
# the training budget (config `budget`), or None: every planned repeat runs
BUDGET = PLAN.budget
# the prescreen (config `prescreen`): the nodes it measures, the study's most common precision
# (what a matmul of the scaling runs uses), the nodes the largest run needs
PRESCREEN = CONFIG["prescreen"]["enabled"]
PRESCREEN_PRECISION = Counter(run.precision for run in RUNS.values()).most_common(1)[0][
    0
]
PRESCREEN_NEED_NODES = max(run.nodes for run in RUNS.values())
# the node every link is measured to (the first), and the nodes whose link to it is measured
PRESCREEN_REFERENCE = PRESCREEN_NODES[0] if PRESCREEN_NODES else None
PRESCREEN_LINK_NODES = PRESCREEN_NODES[1:] if CONFIG["prescreen"]["links"] else []


# ---- What parsing changes ---------------------------------------------------------------------
# Beyond the names it defines (and the sys.path entry above), parsing the workflow changes the
# process and the study folder in these ways only.

# Every job's program, a new process, imports this checkout's package too (PYTHONPATH).
run_jobs_from_this_checkout(os.environ, PACKAGE.parent)
# One driver per study folder, refused before the DAG meets the other's jobs in progress; held
# (the open file) for this process's lifetime. An invocation that runs no job beside a running
# driver starts again as itself with --ignore-incomplete (the process is replaced).
try:
    DRIVER_LOCK = (
        driver_lock.hold(Path.cwd(), sys.argv) if workflow.is_main_process else None
    )
except driver_lock.DriverBusy as error:
    raise WorkflowError(str(error)) from None
if DRIVER_LOCK is not None and DRIVER_LOCK.beside_driver:
    driver_lock.again_ignoring_incomplete(sys.argv)
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


# ---- The fork server: the hooks' (Snakefile) -------------------------------------------------
# A local CPU study's ranks are forked from one process that imported torch once
# (scalerepro.launching.fork_server; resources.fork_server: false turns it off). The onstart hook
# starts it and names its socket in this process's environment, which every job inherits (and
# removes an inherited name when it is off); the onsuccess and onerror hooks stop it, and it
# ends with this process whatever ends it.
FORK_SERVER = []  # (the server, its socket) while one runs


# The rules whose jobs start ranks (scalerepro.launching.launch), and the checkpoint after which
# more training jobs may join the DAG.
RANK_RULES = ("train", "comm_benchmark", "profile")


def _invocation_starts_ranks():
    """Whether this invocation has a job that starts ranks to run, or the budget's checkpoint
    (which may add training jobs): an invocation that only analyses imports no torch."""
    rules = {job.rule.name for job in workflow.dag.needrun_jobs()}
    return bool(rules & {*RANK_RULES, "study_budget"})


def start_fork_server():
    server = fork_server.start_for_jobs(
        PLAN.local_runs
        and DEVICE == "cpu"
        and CONFIG["resources"].get("fork_server", True)
        and _invocation_starts_ranks(),
        os.getpid(),
        Path("results/logs/fork_server.log"),
    )
    if server is not None:
        FORK_SERVER.append(server)


def stop_fork_server():
    os.environ.pop(fork_server.SOCKET_ENV, None)
    while FORK_SERVER:
        fork_server.stop(*FORK_SERVER.pop())


# ---- Software ---------------------------------------------------------------------------------

ENV_TRAIN = "../../envs/train.yaml"
ENV_ANALYSIS = "../../envs/analysis.yaml"
CONTAINER, RANKS_CONTAINER = PLAN.container, PLAN.ranks_container()


def container_inputs():
    """The image a job runs in, as an input, so that it is built first (containers enabled)."""
    return [CONTAINER] if CONTAINER else []


# ---- Files that rules of more than one rule file name -----------------------------------------

DATA_DIR = study.DATA_DIR
MATRIX_CSV = "results/tables/matrix.csv"
STUDY_CONFIG_JSON = "results/tables/config.json"
INVENTORY_JSON = "results/inventory/system.json"
REFERENCES_YAML = "config/references.yaml"
COMM_JSONS = expand("results/comm/g{gpus}.json", gpus=COMM_GPU_COUNTS)
# each node's prescreen record, and the screen over them (the prescreen rule's output)
PRESCREEN_NODE_JSON = "results/prescreen/nodes/{node}.json"
# a link's record names its reference in its path: a job (which lists no nodes) knows it from there
PRESCREEN_LINK_JSON = "results/prescreen/links/{reference}/{node}.json"
PRESCREEN_JSON = "results/prescreen/screen.json"
PRESCREEN_INPUT = [PRESCREEN_JSON] if PRESCREEN else []
# what the jobs that start ranks wait for: the screen as an order, not as content (ancient), so
# that a screen made again reruns none of them (a checkpoint's pending output would)
PRESCREEN_ORDER = [ancient(PRESCREEN_JSON)] if PRESCREEN else []
# the study budget's choice of repeats (the study_budget checkpoint's output), where there is a budget
BUDGET_JSON = "results/tables/budget.json"
BUDGET_INPUT = [BUDGET_JSON] if BUDGET else []
# the aggregation's tables (results/tables/<name>.csv) and its summary
AGGREGATE_CSVS = expand("results/tables/{table}.csv", table=AGGREGATE_TABLES)
SUMMARY_JSON = "results/tables/summary.json"
PLOT_FILES = expand("results/plots/{name}.{ext}", name=FIGURE_NAMES, ext=["png", "svg"])
# the results store's: this study's place among the stored ones, and its comparison with
# BASELINE (none without one)
HISTORY_CSV = "results/tables/history.csv"
STORE_PLOTS = ["history", *(["versus_baseline"] if BASELINE is not None else [])]
STORE_PLOT_FILES = expand(
    "results/plots/{name}.{ext}", name=STORE_PLOTS, ext=["png", "svg"]
)
VERSUS_BASELINE = (
    ["results/tables/versus_baseline.csv", "results/tables/versus_baseline.json"]
    if BASELINE is not None
    else []
)

# The programs the rules run, each by its entry modules: a rule depends on the files those import
# (scalerepro.common.source_closure), so an edit reruns exactly the rules that run the edited
# code. A job that starts ranks depends on one fingerprint file of its program's sources rather
# than on each file, which keeps DAG construction fast for thousand-run matrices.
PROGRAMS = {
    "train": (
        "scalerepro.launching.run_job",
        "scalerepro.launching.launch",
        "scalerepro.training.train",
    ),
    "comm_benchmark": ("scalerepro.launching.launch", "scalerepro.training.commbench"),
    "profile": (
        "scalerepro.launching.profile_job",
        "scalerepro.launching.launch",
        "scalerepro.launching.nsight",
        "scalerepro.training.train",
    ),
    "inventory": ("scalerepro.telemetry.inventory",),
    "node_check": ("scalerepro.training.node_check",),
    "node_link": ("scalerepro.launching.launch", "scalerepro.training.node_link"),
    "node_screen": ("scalerepro.planning.node_screen",),
    "budget": ("scalerepro.planning.budget",),
    "aggregate": ("scalerepro.analysis.tables.aggregate",),
    "plots": ("scalerepro.analysis.presentation.plots",),
    "store": ("scalerepro.analysis.history.store",),
    "compare": ("scalerepro.analysis.history.compare",),
    "profile_summary": ("scalerepro.analysis.profiles.captures",),
    "report": ("scalerepro.analysis.presentation.report",),
}


wildcard_constraints:
    run=r"[A-Za-z0-9_.-]+",
    program="|".join(PROGRAMS),
    gpus=r"\d+",
    node=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    reference=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


def program_sources(program):
    """The package files ``program`` runs, relative to the workflow's directory (a study moved
    to another folder keeps its inputs' names, and so stays up to date)."""
    return [
        str(path.relative_to(REPO)) for path in source_files(PROGRAMS[program], PACKAGE)
    ]


def program_fingerprint(program):
    return f"results/fingerprints/{program}.sha256"


def budgeted_repeats():
    """The repeats the study runs: every planned one without a budget, else the study_budget
    checkpoint's choice (Snakemake runs the checkpoint, after the floor's rounds, before asking again).
    """
    if BUDGET is None:
        return None
    return budget.read_choice(checkpoints.study_budget.get().output[0])


def study_records(wildcards):
    """The records of the runs the study runs (the budget's rounds)."""
    return [record_path(run) for run in PLAN.runs_within(budgeted_repeats())]


def data_input(wildcards):
    return [DATA_DIR] if STUDY.uses_cifar(RUNS[wildcards.run]) else []


# ---- Resources --------------------------------------------------------------------------------

SLURM_GPUS = PLAN.cluster_gpus
CLUSTER_RESOURCES = PLAN.queue_resources()


def off_excluded_nodes(key, resources):
    """A resource of a job that starts ranks: its slurm_extra keeps it off the nodes the
    prescreen excluded."""
    if key != "slurm_extra":
        return lambda wildcards: resources(wildcards)[key]
    return lambda wildcards: (
        " ".join(
            filter(
                None, (resources(wildcards)[key], *PLAN.excluding(prescreen_excluded()))
            )
        )
        or None
    )


def run_resources(key):
    """One resource (``key``) of a training or profiling job, from its run's GPU count."""
    return off_excluded_nodes(key, lambda wc: PLAN.train_resources(RUNS[wc.run]))


def prescreen_excluded():
    """The nodes the prescreen excluded (none before it ran, or without it)."""
    if not PRESCREEN or not Path(PRESCREEN_JSON).is_file():
        return []
    return node_check.read_screen(PRESCREEN_JSON).excluded


PRESCREEN_LINK_RESOURCES = {
    key: (
        lambda wildcards, key=key: PLAN.prescreen_link_resources(
            wildcards.node, wildcards.reference
        ).get(key)
    )
    for key in (
        "nodes",
        "gpus",
        "runtime",
        "mpi",
        "tasks_per_gpu",
        "gres",
        "slurm_extra",
        "measured",
    )
}


def prescreen_link_launch_args(wildcards):
    return PLAN.launch_args(STUDY.gpus_per_node, 2, f"prescreen_link_{wildcards.node}")


PRESCREEN_RESOURCES = {
    key: (lambda wildcards, key=key: PLAN.prescreen_resources(wildcards.node)[key])
    for key in (
        "nodes",
        "tasks",
        "gpus",
        "gpus_per_node",
        "cpus_per_task",
        "mem_mb",
        "runtime",
        "mpi",
        "tasks_per_gpu",
        "gres",
        "slurm_extra",
        "measured",
    )
}


# What a job that runs one run of the matrix (its training, or a profile of it) asks of the
# scheduler, beside CLUSTER_RESOURCES.
RUN_RESOURCES = {
    key: run_resources(key)
    for key in (
        "nodes",
        "tasks",
        "gpus",
        "gpus_per_node",
        "cpus_per_task",
        "mem_mb",
        "runtime",
        "mpi",
        "tasks_per_gpu",
        "gres",
        "slurm_extra",
        "measured",
    )
}


def run_threads(wildcards):
    return PLAN.train_threads(RUNS[wildcards.run])


def run_priority(wildcards):
    """Repeat 1 of every cell, in one order, before any repeat 2 (scalerepro.planning.plan.Plan.train_priority)."""
    return PLAN.train_priority(RUNS[wildcards.run])


def comm_resources(key):
    """One resource (``key``) of the all-reduce benchmark over ``wildcards.gpus`` GPUs."""
    return off_excluded_nodes(key, lambda wc: PLAN.comm_resources(int(wc.gpus)))


# ---- Flags ------------------------------------------------------------------------------------


def run_launch_args(prefix=""):
    """scalerepro.launching.launch's flags for the job of ``wildcards.run`` (named ``prefix`` then the run id)."""
    return lambda wc: PLAN.launch_args(
        RUNS[wc.run].ranks_per_node, RUNS[wc.run].nodes, f"{prefix}{wc.run}"
    )


def run_trainer_args(wildcards, output):
    """Every trainer flag of one training job (scalerepro.planning.study.Study.trainer_args): its
    record is the job's output, its checkpoints go in a folder beside it."""
    return STUDY.trainer_args(
        RUNS[wildcards.run],
        output.record,
        str(Path(output.record).parent / "checkpoints"),
    )


def comm_launch_args(wildcards):
    gpus = int(wildcards.gpus)
    return PLAN.launch_args(*PLAN.ranks_and_nodes(gpus), f"comm_g{gpus}")


def matrix_rows():
    """The study matrix as rows for matrix.csv (what the aggregation joins records onto): every
    planned run (the rule keeps those of the rounds the budget chose, where there is one).
    """
    return PLAN.matrix_rows()


def folder_of(name):
    """A params function: the folder that holds the rule's input or output ``name`` (e.g.
    "output.summary"; a list of files: its first's), for the programs that take a folder
    rather than its files."""
    side, key = name.split(".")

    def folder(wildcards, input, output):
        files = getattr({"input": input, "output": output}[side], key)
        return str(Path(files if isinstance(files, str) else files[0]).parent)

    return folder
