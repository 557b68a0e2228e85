"""Write the study matrix (one row per expected run) as CSV: the aggregation joins records onto it.
The log says how many runs the matrix plans."""

import csv
from pathlib import Path

rows = snakemake.params.rows  # noqa: F821 - injected by Snakemake
out = snakemake.output[0]  # noqa: F821
with open(out, "w", newline="") as stream:
    writer = csv.DictWriter(stream, fieldnames=list(rows[0]) if rows else ["run_id"])
    writer.writeheader()
    writer.writerows(rows)
Path(snakemake.log[0]).write_text(f"{out}: {len(rows)} planned runs\n")  # noqa: F821
