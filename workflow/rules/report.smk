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
            " ".join(["--versus-baseline", *input.versus]) if input.versus else ""
        ),
        budget=lambda wc, input: f"--budget {input.budget[0]}" if input.budget else "",
    shell:
        "python -m scalerepro.analysis.presentation.report --tables {params.tables} --plots {params.plots}"
        " --inventory {input.inventory} --config {input.config} --references {input.references}"
        " --history {input.history} {params.versus} {params.budget}"
        " --templates {params.templates} --out {output} > {log} 2>&1"
