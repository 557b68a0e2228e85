# The results store (config `store`): each study appends itself to one DuckDB file when its
# aggregation is done, and its headline cells across the stored studies go into the report. With
# `compare.baseline` set, the study is also compared cell by cell with that stored study.
# The store is the team's file, so both steps run on the host that runs Snakemake (localrules).

STORE = CONFIG["store"]["path"]
BASELINE = CONFIG["compare"]["baseline"]
VERSUS_BASELINE = (
    ["results/tables/versus_baseline.csv", "results/tables/versus_baseline.json"]
    if BASELINE is not None
    else []
)
VERSUS_BASELINE_ARGS = (
    " ".join(["--versus-baseline", *VERSUS_BASELINE]) if BASELINE else ""
)
STORE_PLOTS = ["history", *(["versus_baseline"] if BASELINE is not None else [])]


localrules:
    store_study,


rule store_study:
    input:
        matrix="results/tables/matrix.csv",
        runs="results/tables/runs.csv",
        config="results/tables/config.json",
        inventory="results/inventory/system.json",
        code=program_sources("store"),
    output:
        receipt="results/tables/store.json",
        history="results/tables/history.csv",
    log:
        "results/logs/store_study.log",
    conda:
        ENV_ANALYSIS
    params:
        store=STORE,
    shell:
        "python -m scalerepro.analysis.history.store append --store {params.store:q} --matrix {input.matrix}"
        " --config {input.config} --inventory {input.inventory}"
        " --receipt {output.receipt} --history {output.history} > {log} 2>&1"


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
            store=STORE,
            baseline=BASELINE,
            threshold=CONFIG["compare"]["threshold"],
        shell:
            "python -m scalerepro.analysis.history.compare {params.baseline:q} {input.receipt} --store {params.store:q}"
            " --threshold {params.threshold} --csv {output.table} --json {output.facts} > {log} 2>&1"


rule store_plots:
    input:
        history=rules.store_study.output.history,
        versus=VERSUS_BASELINE,
        code=program_sources("plots"),
    output:
        expand("results/plots/{name}.{ext}", name=STORE_PLOTS, ext=["png", "svg"]),
    log:
        "results/logs/store_plots.log",
    conda:
        ENV_ANALYSIS
    resources:
        **CLUSTER_RESOURCES,
    params:
        names=" ".join(STORE_PLOTS),
    shell:
        "python -m scalerepro.analysis.presentation.plots --tables results/tables --out results/plots --only {params.names}"
        " > {log} 2>&1"
