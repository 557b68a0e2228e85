# The results store (config `store`): each study appends itself to one DuckDB file when its
# aggregation is done, and its headline cells across the stored studies go into the report. With
# `compare.baseline` (BASELINE) set, the study is also compared cell by cell with that stored
# study. The store is the team's file, so its steps run on the host that runs Snakemake
# (localrules).


localrules:
    store_study,
    store_plots,


rule store_study:
    input:
        matrix=MATRIX_CSV,
        runs="results/tables/runs.csv",
        config=STUDY_CONFIG_JSON,
        inventory=INVENTORY_JSON,
        prescreen=PRESCREEN_INPUT,
        code=program_sources("store"),
    output:
        receipt="results/tables/store.json",
        history=HISTORY_CSV,
    log:
        "results/logs/store_study.log",
    conda:
        ENV_ANALYSIS
    params:
        store=CONFIG["store"]["path"],
        prescreen=lambda wc, input: (
            ["--prescreen", input.prescreen[0]] if input.prescreen else []
        ),
    shell:
        "python -m scalerepro.analysis.history.store append --store {params.store:q} --matrix {input.matrix:q}"
        " --config {input.config:q} --inventory {input.inventory:q} {params.prescreen:q}"
        " --receipt {output.receipt:q} --history {output.history:q} > {log:q} 2>&1"


if BASELINE is not None:

    localrules:
        compare,

    rule compare:
        input:
            receipt=rules.store_study.output.receipt,
            code=program_sources("compare"),
        output:
            table=VERSUS_BASELINE[0],
            facts=VERSUS_BASELINE[1],
        log:
            "results/logs/compare.log",
        conda:
            ENV_ANALYSIS
        params:
            store=CONFIG["store"]["path"],
            baseline=BASELINE,
            threshold=CONFIG["compare"]["threshold"],
        shell:
            "python -m scalerepro.analysis.history.compare {params.baseline:q} {input.receipt:q} --store {params.store:q}"
            " --threshold {params.threshold:q} --csv {output.table:q} --json {output.facts:q} > {log:q} 2>&1"


rule store_plots:
    input:
        history=rules.store_study.output.history,
        versus=VERSUS_BASELINE,
        code=program_sources("plots"),
    output:
        plots=STORE_PLOT_FILES,
    log:
        "results/logs/store_plots.log",
    conda:
        ENV_ANALYSIS
    params:
        tables=folder_of("input.history"),
        out=folder_of("output.plots"),
        names=STORE_PLOTS,
    shell:
        "python -m scalerepro.analysis.presentation.plots --tables {params.tables:q} --out {params.out:q} --only {params.names:q}"
        " > {log:q} 2>&1"
