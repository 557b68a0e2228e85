# The self-contained HTML report: one file, CSS and figures inlined, opens offline. Made on the
# host that runs Snakemake, as the tables and figures are (analysis.smk says why).


localrules:
    report,


rule report:
    input:
        tables=AGGREGATE_CSVS,
        summary=SUMMARY_JSON,
        plots=PLOT_FILES,
        profiling=PROFILING_PLAN.tables(),
        inventory=INVENTORY_JSON,
        config=STUDY_CONFIG_JSON,
        references=REFERENCES_YAML,
        history=HISTORY_CSV,
        store_plots=STORE_PLOT_FILES,
        versus=VERSUS_BASELINE,
        budget=BUDGET_INPUT,
        prescreen=PRESCREEN_INPUT,
        code=program_sources("report"),
        # what the report program reads of report/: its stylesheet and the templates beside it
        style="report/style.css",
        templates=sorted(
            str(p.relative_to(REPO))
            for p in (REPO / "report" / "templates").rglob("*")
            if p.is_file()
        ),
    output:
        report(
            "results/report/index.html",
            caption="../../report/captions/report.rst",
            category="Report",
        ),
    log:
        "results/logs/report.log",
    conda:
        ENV_ANALYSIS
    params:
        tables=folder_of("input.summary"),
        plots=folder_of("input.plots"),
        templates=folder_of("input.style"),
        versus=lambda wc, input: (
            ["--versus-baseline", *input.versus] if input.versus else []
        ),
        budget=lambda wc, input: ["--budget", input.budget[0]] if input.budget else [],
        prescreen=lambda wc, input: (
            ["--prescreen", input.prescreen[0]] if input.prescreen else []
        ),
    shell:
        "python -m scalerepro.analysis.presentation.report --tables {params.tables:q} --plots {params.plots:q}"
        " --inventory {input.inventory:q} --config {input.config:q} --references {input.references:q}"
        " --history {input.history:q} {params.versus:q} {params.budget:q} {params.prescreen:q}"
        " --templates {params.templates:q} --out {output:q} > {log:q} 2>&1"
