# scalerepro: a distributed deep-learning scaling study, from config to report.
# Rules live in workflow/rules/*.smk, helpers in workflow/rules/common.smk.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/container.smk"
include: "workflow/rules/inventory.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        "results/report/index.html",


onsuccess:
    print(f"report: {Path('results/report/index.html').resolve()}")
