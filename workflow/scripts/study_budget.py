"""The study_budget checkpoint: the repeats that fit the training budget (scalerepro.planning.budget)."""

from pathlib import Path

from scalerepro.planning import budget

choice = budget.write_choice(
    snakemake.params.jobs,  # noqa: F821 - injected by Snakemake
    snakemake.input.jobs,  # noqa: F821
    snakemake.params.training_s,  # noqa: F821
    snakemake.params.min_repeats,  # noqa: F821
    snakemake.output[0],  # noqa: F821
)
Path(snakemake.log[0]).write_text(f"{snakemake.output[0]}: {choice['reason']}\n")  # noqa: F821
