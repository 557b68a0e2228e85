# scalerepro: a distributed deep-learning scaling study, from config to report.
# Rules live in workflow/rules/*.smk; what they share is in workflow/rules/common.smk, included
# first (the rule files need nothing of each other).
import time
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# When this invocation started: the report line below names a report built by it, not one left
# from an earlier run (or none at all, when only some other target was asked for).
STARTED = time.time()


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/container.smk"
include: "workflow/rules/inventory.smk"
include: "workflow/rules/prescreen.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/report.smk"


# Every file the report, the store and a bundle are made from is a target: one that is lost (a
# killed step, a full disk, a hand) is rebuilt, where Snakemake would pass over a missing
# intermediate whose consumers exist.
rule all:
    default_target: True
    input:
        "results/report/index.html",
        rules.study_matrix.output,
        rules.study_config.output,
        rules.system_inventory.output,
        PRESCREEN_INPUT,
        study_records,
        BUDGET_INPUT,
        COMM_JSONS,
        rules.aggregate.output,
        rules.plots.output,
        PROFILING_PLAN.tables(),
        rules.store_study.output,
        rules.store_plots.output,


onstart:
    # a SIGTERM while Snakemake's scheduler holds its lock would hang it (the module says why)
    driver_signals.run_stop_handler_off_the_main_thread()
    start_fork_server()


onerror:
    stop_fork_server()


onsuccess:
    stop_fork_server()
    report_html = Path("results/report/index.html")
    if report_html.exists() and report_html.stat().st_mtime >= STARTED:
        print(f"report: {report_html.resolve()}")
