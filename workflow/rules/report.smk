# The self-contained HTML report: one file, CSS and figures inlined, opens offline.


rule report:
    input:
        tables=rules.aggregate.output.tables,
        summary=rules.aggregate.output.summary,
        plots=rules.plots.output,
        profiling=profiling_tables(),
        inventory="results/inventory/system.json",
        config="results/tables/config.json",
        references="config/references.yaml",
        code=analysis_module("report"),
        templates=sorted(str(p) for p in (REPO / "report").rglob("*") if p.is_file()),
    output:
        "results/report/index.html",
    log:
        "results/logs/report.log",
    conda:
        ENV_ANALYSIS
    resources:
        **CLUSTER_RESOURCES,
    shell:
        "python -m scalerepro.analysis.report --tables results/tables --plots results/plots"
        " --inventory {input.inventory} --config {input.config} --references {input.references}"
        " --templates report --out {output} > {log} 2>&1"
