"""Write the study matrix (one row per expected run) as CSV: the aggregation joins records onto it.
Where the study has a training budget, the expected runs are those of the rounds of repeats it
chose (scalerepro.planning.budget). The log says how many runs the matrix plans."""

import csv
from pathlib import Path

from scalerepro.planning.budget import rows_within

rows = snakemake.params.rows  # noqa: F821 - injected by Snakemake
out = snakemake.output[0]  # noqa: F821
rows, why = rows_within(rows, snakemake.input.budget[0] if snakemake.input.budget else None)  # noqa: F821
with open(out, "w", newline="") as stream:
    writer = csv.DictWriter(stream, fieldnames=list(rows[0]) if rows else ["run_id"])
    writer.writeheader()
    writer.writerows(rows)
Path(snakemake.log[0]).write_text(f"{out}: {len(rows)} planned runs{why}\n")  # noqa: F821
