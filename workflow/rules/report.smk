# The self-contained HTML report: one file, CSS and figures inlined, opens offline.


rule report:
    input:
        tables=rules.aggregate.output.tables,
        summary=rules.aggregate.output.summary,
        plots=rules.plots.output,
        profiling=PROFILING_PLAN.tables(),
        inventory="results/inventory/system.json",
        config="results/tables/config.json",
        references="config/references.yaml",
        history=rules.store_study.output.history,
        store_plots=rules.store_plots.output,
        versus=VERSUS_BASELINE,
        code=program_sources("report"),
        templates=sorted(
            str(p.relative_to(REPO))
            for p in (REPO / "report").rglob("*")
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
    resources:
        **CLUSTER_RESOURCES,
    params:
        versus=VERSUS_BASELINE_ARGS,
    shell:
        "python -m scalerepro.analysis.presentation.report --tables results/tables --plots results/plots"
        " --inventory {input.inventory} --config {input.config} --references {input.references}"
        " --history {input.history} {params.versus}"
        " --templates report --out {output} > {log} 2>&1"
