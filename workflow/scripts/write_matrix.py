"""Write the study matrix (one row per expected run) as CSV: the aggregation joins records onto it."""

import csv

rows = snakemake.params.rows  # noqa: F821 - injected by Snakemake
with open(snakemake.output[0], "w", newline="") as stream:  # noqa: F821
    writer = csv.DictWriter(stream, fieldnames=list(rows[0]) if rows else ["run_id"])
    writer.writeheader()
    writer.writerows(rows)
