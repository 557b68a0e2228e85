# One job per training run of the study matrix, and the all-reduce benchmark per GPU count.


localrules:
    trainer_fingerprint,


rule trainer_fingerprint:
    input:
        trainer_sources(),
    output:
        TRAINER_FINGERPRINT,
    log:
        "results/logs/trainer_fingerprint.log",
    conda:
        ENV_TRAIN
    script:
        "../scripts/fingerprint.py"


rule train:
    input:
        data=data_input,
        package=TRAINER_FINGERPRINT,
        image=container_inputs(),
    output:
        record="results/runs/{run}/record.json",
    log:
        "results/runs/{run}/train.log",
    conda:
        ENV_TRAIN
    container:
        CONTAINER
    threads: lambda wc: RUNS[wc.run].ranks_per_node * STUDY["resources"]["cpus_per_gpu"]
    resources:
        nodes=run_resources("nodes"),
        tasks=run_resources("tasks"),
        gpus=run_resources("gpus"),
        gpus_per_node=run_resources("gpus_per_node"),
        cpus_per_task=run_resources("cpus_per_task"),
        mem_mb=run_resources("mem_mb"),
        runtime=run_resources("runtime"),
    params:
        launcher=lambda wc: launcher(RUNS[wc.run].ranks_per_node, RUNS[wc.run].nodes),
        args=lambda wc: trainer_args(
            RUNS[wc.run],
            f"results/runs/{wc.run}/record.json",
            f"results/runs/{wc.run}/checkpoints",
        ),
    script:
        "../scripts/run_training.py"


rule comm_benchmark:
    input:
        package=TRAINER_FINGERPRINT,
        image=container_inputs(),
    output:
        "results/comm/g{gpus}.json",
    log:
        "results/comm/g{gpus}.log",
    conda:
        ENV_TRAIN
    container:
        CONTAINER
    threads: lambda wc: ranks_and_nodes(int(wc.gpus))[0]
    resources:
        nodes=lambda wc: ranks_and_nodes(int(wc.gpus))[1],
        gpus=lambda wc: int(wc.gpus) if DEVICE == "cuda" else 0,
        runtime=15,
    params:
        launcher=lambda wc: " ".join(launcher(*ranks_and_nodes(int(wc.gpus)))),
        sizes=" ".join(str(size) for size in STUDY["communication"]["sizes_bytes"]),
        iterations=STUDY["communication"]["iterations"],
        device=DEVICE,
    shell:
        "python {params.launcher} -m scalerepro.commbench --out {output} --device {params.device}"
        " --sizes {params.sizes} --iterations {params.iterations} > {log} 2>&1"
