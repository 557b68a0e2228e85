# One job per training run of the study matrix, and the all-reduce benchmark per GPU count.


localrules:
    code_fingerprint,
    study_budget,


rule code_fingerprint:
    input:
        lambda wc: program_sources(wc.program),
    output:
        program_fingerprint("{program}"),
    log:
        "results/logs/code_fingerprint_{program}.log",
    conda:
        ENV_TRAIN
    script:
        "../scripts/fingerprint.py"


rule train:
    input:
        data=data_input,
        code=program_fingerprint("train"),
        image=container_inputs(),
        screen=PRESCREEN_ORDER,
    output:
        record=RUN_RECORD,
        job=RUN_JOB,
    log:
        "results/runs/{run}/train.log",
    priority: run_priority
    conda:
        ENV_TRAIN
    container:
        RANKS_CONTAINER
    threads: run_threads
    resources:
        **CLUSTER_RESOURCES,
        **RUN_RESOURCES,
    params:
        launch=run_launch_args(),
        args=run_trainer_args,
    # A shell command (not a script), so that `snakemake -n -p` prints every run's flags.
    shell:
        "python -m scalerepro.launching.run_job {output.record:q} {output.job:q} {log:q} {params.launch:q}"
        " -- -m scalerepro.training.train {params.args:q}"


rule comm_benchmark:
    input:
        code=program_fingerprint("comm_benchmark"),
        image=container_inputs(),
        screen=PRESCREEN_ORDER,
    output:
        "results/comm/g{gpus}.json",
    log:
        "results/comm/g{gpus}.log",
    conda:
        ENV_TRAIN
    container:
        RANKS_CONTAINER
    threads: lambda wc: PLAN.ranks_and_nodes(int(wc.gpus))[0]
    resources:
        **CLUSTER_RESOURCES,
        nodes=comm_resources("nodes"),
        gpus=comm_resources("gpus"),
        runtime=comm_resources("runtime"),
        mpi=comm_resources("mpi"),
        tasks_per_gpu=comm_resources("tasks_per_gpu"),
        gres=comm_resources("gres"),
        slurm_extra=comm_resources("slurm_extra"),
        measured=comm_resources("measured"),
    params:
        launch=comm_launch_args,
        sizes=CONFIG["communication"]["sizes_bytes"],
        iterations=CONFIG["communication"]["iterations"],
        device=DEVICE,
    shell:
        "python -m scalerepro.launching.launch {params.launch:q} -- -m scalerepro.training.commbench --out {output:q}"
        " --device {params.device:q} --sizes {params.sizes:q} --iterations {params.iterations:q} > {log:q} 2>&1"


# With a training budget (config `budget`): once the rounds that run whatever they cost (its
# min_repeats) have run, how many more fit, from those jobs' wall times
# (scalerepro.planning.budget). The records the study asks for after it (study_records) are the
# rounds it chose.
checkpoint study_budget:
    input:
        jobs=[job_path(run) for run in PLAN.budget_measured()],
        code=program_sources("budget"),
    output:
        BUDGET_JSON,
    log:
        "results/logs/study_budget.log",
    conda:
        ENV_ANALYSIS
    params:
        jobs=PLAN.budget_jobs(),
        training_s=BUDGET["training_s"] if BUDGET else None,
        min_repeats=BUDGET["min_repeats"] if BUDGET else None,
    script:
        "../scripts/study_budget.py"
