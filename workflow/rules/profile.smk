# Profiling of selected runs (config `profiling`), in jobs of their own: profiling perturbs
# timing, so the measured runs never run under a profiler. Per run and tool, the training job
# again over the profiling window only (results/profiles/<run>/<tool>/: raw files and
# capture.json), then one summary per run (summary.json: breakdown, top kernels, roofline,
# bottleneck), then the study's profiling tables. With profiling disabled none of it is planned.
# The summaries and tables read the files the profile jobs exported (no profiler needed): they
# run on the host that runs Snakemake, as the rest of the analysis does (analysis.smk).

import json

# The profiled runs, their tools and tables (scalerepro.planning.plan.profiling_plan)
PROFILING = CONFIG["profiling"]
PROFILED_RUNS = list(PROFILING_PLAN.runs)
PROFILING_TOOLS = list(PROFILING_PLAN.tools)
PROFILING_FALLBACK_REASON = PROFILING_PLAN.fallback_reason
PROFILING_TABLES = list(planning.PROFILING_TABLES)


wildcard_constraints:
    tool=r"nsys|ncu|torch",


localrules:
    profile_summary,
    profile_table,


# After the run's measured job, whose record it needs no figure of: a measured run never waits
# behind a profile, and the profile compiles from the Inductor cache the run filled (a profile
# that goes first compiles its model cold, under the profiler: minutes for ResNet-50 under ncu).
# ancient(): an order, not a freshness test: rerunning the run does not redo its profile.
rule profile:
    input:
        data=data_input,
        record=lambda wc: ancient(record_path(RUNS[wc.run])),
        earlier=lambda wc: PROFILING_PLAN.earlier_captures(wc.run, wc.tool),
        code=program_fingerprint("profile"),
        image=container_inputs(),
    output:
        capture="results/profiles/{run}/{tool}/capture.json",
    log:
        "results/profiles/{run}/{tool}/profile.log",
    conda:
        ENV_TRAIN
    container:
        RANKS_CONTAINER
    threads: run_threads
    resources:
        **CLUSTER_RESOURCES,
        **RUN_RESOURCES,
    params:
        fallback=[] if PROFILING["fallback"] else ["--no-fallback"],
        fallback_reason=PROFILING_FALLBACK_REASON or "",
        ranks=PROFILING["ranks"],
        window_start=PROFILING["window_start"],
        window_steps=PROFILING["window_steps"],
        ncu_kernels=PROFILING["ncu_kernels"],
        launch=run_launch_args(prefix="profile_"),
        args=lambda wc: PROFILING_PLAN.trainer_args(PLAN, wc.run, wc.tool),
    shell:
        "python -m scalerepro.launching.profile_job --tool {wildcards.tool:q} --capture {output.capture:q} --log {log:q}"
        " {params.fallback:q} --fallback-reason={params.fallback_reason:q} --ranks {params.ranks:q}"
        " --window-start {params.window_start:q} --window-steps {params.window_steps:q} --ncu-kernels {params.ncu_kernels:q}"
        " --launch {params.launch:q} -- {params.args:q}"


rule profile_summary:
    input:
        captures=lambda wc: expand(
            "results/profiles/{run}/{tool}/capture.json",
            run=wc.run,
            tool=PROFILING_TOOLS,
        ),
        code=program_sources("profile_summary"),
    output:
        summary="results/profiles/{run}/summary.json",
    log:
        "results/profiles/{run}/summary.log",
    conda:
        ENV_ANALYSIS
    params:
        thresholds=json.dumps(PROFILING["classification"]),
        gpu_peaks=PROFILING["gpu_peaks"],
        # the roofline's peaks: the run's precision as the trainer resolves it (a preset's is
        # not on the command line), and the GPU where this machine names it
        precision=lambda wc: RUNS[wc.run].precision,
        device=PLAN.device_name_flags(),
        # the run's folder: the captures' tools' folders are in it, and the summary
        run_dir=folder_of("output.summary"),
    shell:
        "python -m scalerepro.analysis.profiles.captures summarize --run-dir {params.run_dir:q}"
        " --run-id {wildcards.run:q} --gpu-peaks {params.gpu_peaks:q}"
        " --precision {params.precision:q} {params.device:q}"
        " --thresholds {params.thresholds:q} --out {output.summary:q} > {log:q} 2>&1"


rule profile_table:
    input:
        summaries=expand("results/profiles/{run}/summary.json", run=PROFILED_RUNS),
        code=program_sources("profile_summary"),
    output:
        tables=PROFILING_TABLES,
    log:
        "results/logs/profile_table.log",
    conda:
        ENV_ANALYSIS
    params:
        out=folder_of("output.tables"),
    shell:
        "python -m scalerepro.analysis.profiles.captures table --summaries {input.summaries:q}"
        " --out {params.out:q} > {log:q} 2>&1"
