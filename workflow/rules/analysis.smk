# Records -> tidy tables -> figures. This side needs no torch: it reads run records only.
# Every step runs on the host that runs Snakemake (localrules): seconds of pandas and matplotlib,
# which on a cluster would otherwise wait in the GPU partition's queue behind training jobs.

import json


localrules:
    study_matrix,
    study_config,
    aggregate,
    plots,


rule study_matrix:
    input:
        budget=BUDGET_INPUT,
    output:
        MATRIX_CSV,
    log:
        "results/logs/study_matrix.log",
    conda:
        ENV_ANALYSIS
    params:
        rows=matrix_rows(),
    script:
        "../scripts/write_matrix.py"


rule study_config:
    output:
        STUDY_CONFIG_JSON,
    log:
        "results/logs/study_config.log",
    conda:
        ENV_ANALYSIS
    params:
        config={
            **CONFIG,
            "resolved_device": DEVICE,
            "resolved_gpu_counts": GPU_COUNTS,
            "resolved_gpus_per_node": GPUS_PER_NODE,
        },
    script:
        "../scripts/write_json.py"


rule aggregate:
    input:
        matrix=MATRIX_CSV,
        records=study_records,
        comm=COMM_JSONS,
        references=REFERENCES_YAML,
        inventory=INVENTORY_JSON,
        code=program_sources("aggregate"),
    output:
        tables=report(
            AGGREGATE_CSVS,
            caption="../../report/captions/tables.rst",
            category="Tables",
        ),
        summary=SUMMARY_JSON,
    log:
        "results/logs/aggregate.log",
    conda:
        ENV_ANALYSIS
    params:
        out=folder_of("output.summary"),
        # the config's targets (checks included) as JSON
        targets=json.dumps(CONFIG["targets"]),
        predict=CONFIG["scaling"].get("predict_gpus", []),
        cluster=(
            ["--predict-cluster", CONFIG["scaling"]["predict_cluster"]]
            if CONFIG["scaling"].get("predict_cluster")
            else []
        ),
    shell:
        "python -m scalerepro.analysis.tables.aggregate --matrix {input.matrix:q} --comm {input.comm:q}"
        " --references {input.references:q} --inventory {input.inventory:q}"
        " --out {params.out:q} --targets {params.targets:q}"
        " --predict-gpus {params.predict:q} {params.cluster:q} > {log:q} 2>&1"


rule plots:
    input:
        tables=rules.aggregate.output.tables,
        profiling=PROFILING_PLAN.tables(),
        code=program_sources("plots"),
    output:
        plots=report(
            PLOT_FILES,
            caption="../../report/captions/figures.rst",
            category="Figures",
        ),
    log:
        "results/logs/plots.log",
    conda:
        ENV_ANALYSIS
    params:
        tables=folder_of("input.tables"),
        out=folder_of("output.plots"),
    shell:
        "python -m scalerepro.analysis.presentation.plots --tables {params.tables:q} --out {params.out:q} > {log:q} 2>&1"
