# Records -> tidy tables -> figures. This side needs no torch: it reads run records only.


localrules:
    study_matrix,
    study_config,


rule study_matrix:
    output:
        "results/tables/matrix.csv",
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
        "results/tables/config.json",
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
        matrix="results/tables/matrix.csv",
        records=[record_path(run) for run in RUNS.values()],
        comm=expand("results/comm/g{gpus}.json", gpus=COMM_GPU_COUNTS),
        references="config/references.yaml",
        code=program_sources("aggregate"),
    output:
        tables=report(
            expand("results/tables/{table}.csv", table=AGGREGATE_TABLES),
            caption="../../report/captions/tables.rst",
            category="Tables",
        ),
        summary="results/tables/summary.json",
    log:
        "results/logs/aggregate.log",
    conda:
        ENV_ANALYSIS
    resources:
        **CLUSTER_RESOURCES,
    params:
        comm=lambda wc, input: " ".join(input.comm),
        targets=targets_args(),
        predict=" ".join(str(n) for n in CONFIG["scaling"].get("predict_gpus", [])),
        cluster=(
            f" --predict-cluster {CONFIG['scaling']['predict_cluster']}"
            if CONFIG["scaling"].get("predict_cluster")
            else ""
        ),
    shell:
        "python -m scalerepro.analysis.tables.aggregate --matrix {input.matrix} --comm {params.comm}"
        " --references {input.references} --out results/tables {params.targets}"
        " --predict-gpus {params.predict}{params.cluster} > {log} 2>&1"


rule plots:
    input:
        tables=rules.aggregate.output.tables,
        profiling=PROFILING_PLAN.tables(),
        code=program_sources("plots"),
    output:
        report(
            expand("results/plots/{name}.{ext}", name=PLOT_NAMES, ext=["png", "svg"]),
            caption="../../report/captions/figures.rst",
            category="Figures",
        ),
    log:
        "results/logs/plots.log",
    conda:
        ENV_ANALYSIS
    resources:
        **CLUSTER_RESOURCES,
    shell:
        "python -m scalerepro.analysis.presentation.plots --tables results/tables --out results/plots > {log} 2>&1"
