# CIFAR-10: download (or a pre-staged archive), verify, extract safely, convert to the prepared
# layout the trainer reads. Synthetic data needs none of this. On a cluster it runs on the
# submitting host: login nodes reach the internet, compute nodes often do not. The verified
# archive is kept beside the prepared folder (the fetch's default: its --out's parent), so that
# preparing again does not download again; it is no output, since Snakemake removes a rule's
# outputs before it runs the rule again.


localrules:
    fetch_cifar10,


rule fetch_cifar10:
    output:
        directory(DATA_DIR),
    log:
        "results/logs/fetch_cifar10.log",
    conda:
        ENV_TRAIN
    params:
        source=(
            ["--archive", CONFIG["cifar10"]["archive"]]
            if CONFIG["cifar10"]["archive"]
            else ["--url", CONFIG["cifar10"]["url"]]
        ),
        md5=CONFIG["cifar10"]["md5"] or "",
    shell:
        "python -m scalerepro.data.fetch --out {output:q} {params.source:q} --md5={params.md5:q} > {log:q} 2>&1"
