# Every node the study will use, measured alone and judged against its peers before the scaling
# runs (scalerepro.training.node_check and node_link, scalerepro.planning.node_screen). The jobs
# that start ranks wait for the screen (PRESCREEN_ORDER: an ancient input, an order and not
# content, so that a screen made again reruns none of them) and are submitted without the nodes
# it excluded: Snakemake evaluates a job's resources again once its inputs are there.


localrules:
    prescreen,


rule prescreen_node:
    input:
        code=program_fingerprint("node_check"),
    output:
        PRESCREEN_NODE_JSON,
    log:
        "results/prescreen/nodes/{node}.log",
    conda:
        ENV_TRAIN
    container:
        RANKS_CONTAINER
    resources:
        **CLUSTER_RESOURCES,
        **PRESCREEN_RESOURCES,
    params:
        device=DEVICE,
        precision=PRESCREEN_PRECISION,
        seconds=CONFIG["prescreen"]["seconds"],
    shell:
        "python -m scalerepro.training.node_check --out {output:q} --node {wildcards.node:q} --device {params.device:q}"
        " --precision {params.precision:q} --seconds {params.seconds:q} > {log:q} 2>&1"


rule prescreen_link:
    input:
        code=program_fingerprint("node_link"),
    output:
        PRESCREEN_LINK_JSON,
    log:
        "results/prescreen/links/{reference}/{node}.log",
    conda:
        ENV_TRAIN
    container:
        RANKS_CONTAINER
    resources:
        **CLUSTER_RESOURCES,
        **PRESCREEN_LINK_RESOURCES,
    params:
        launch=prescreen_link_launch_args,
        device=DEVICE,
    shell:
        "python -m scalerepro.launching.launch {params.launch:q} -- -m scalerepro.training.node_link --out {output:q}"
        " --peer {wildcards.node:q} --reference {wildcards.reference:q} --device {params.device:q} > {log:q} 2>&1"


rule prescreen:
    input:
        nodes=expand(PRESCREEN_NODE_JSON, node=PRESCREEN_NODES),
        links=expand(
            PRESCREEN_LINK_JSON,
            reference=PRESCREEN_REFERENCE,
            node=PRESCREEN_LINK_NODES,
        ),
        code=program_sources("node_screen"),
    output:
        PRESCREEN_JSON,
    log:
        "results/logs/prescreen.log",
    # a verdict, not a transient failure: the same records give it again
    retries: 0
    conda:
        ENV_ANALYSIS
    params:
        fraction=CONFIG["prescreen"]["fraction"],
        reason=CONFIG["prescreen"]["reason"],
        need_nodes=PRESCREEN_NEED_NODES,
    shell:
        "python -m scalerepro.planning.node_screen {input.nodes:q} --links {input.links:q} --fraction {params.fraction:q}"
        " --reason {params.reason:q} --need-nodes {params.need_nodes:q} --out {output:q} > {log:q}"
