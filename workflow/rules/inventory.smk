# What the study ran on, collected on a compute node like the training runs (GPU, topology,
# InfiniBand, versions).


rule system_inventory:
    input:
        code=program_fingerprint("inventory"),
        image=container_inputs(),
    output:
        INVENTORY_JSON,
    log:
        "results/logs/system_inventory.log",
    conda:
        ENV_TRAIN
    container:
        CONTAINER
    resources:
        **CLUSTER_RESOURCES,
        gres="gpu:1" if SLURM_GPUS else None,
        gpus=1 if DEVICE == "cuda" else 0,
        gpus_per_node=1 if DEVICE == "cuda" else 0,
        runtime=10,
    shell:
        "python -m scalerepro.telemetry.inventory --out {output:q} > {log:q} 2>&1"
