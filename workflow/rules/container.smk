# The Apptainer image the training rules run in when container.enabled is true
# (snakemake --software-deployment-method apptainer). With containers disabled this rule is not
# in the DAG and apptainer is never needed.


rule build_container:
    input:
        definition="containers/scalerepro.def",
        package=program_sources("train") + program_sources("profile"),
        pyproject="pyproject.toml",
    output:
        CONFIG["container"]["sif"],
    log:
        "results/logs/build_container.log",
    conda:
        ENV_TRAIN
    resources:
        **CLUSTER_RESOURCES,
    params:
        base_image=CONFIG["container"]["base_image"],
    shell:
        """
        if ! command -v apptainer >/dev/null; then
            echo "build_container: apptainer is not installed on $(hostname): install it, build the image elsewhere and copy it to "{output:q}", or set container.enabled: false" | tee {log:q} >&2
            exit 1
        fi
        apptainer build --force --build-arg BASE_IMAGE={params.base_image:q} {output:q} {input.definition:q} >{log:q} 2>&1
        """
