"""Write the resolved study configuration as JSON (shown in the report's reproducibility section)."""

import json

with open(snakemake.output[0], "w") as stream:  # noqa: F821 - injected by Snakemake
    json.dump(snakemake.params.config, stream, indent=2, sort_keys=True)  # noqa: F821
    stream.write("\n")
