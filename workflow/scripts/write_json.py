"""Write the resolved study configuration as JSON (shown in the report's reproducibility section).
The log names the resolved values, which the config file alone does not say."""

import json
from pathlib import Path

config = snakemake.params.config  # noqa: F821 - injected by Snakemake
out = snakemake.output[0]  # noqa: F821
with open(out, "w") as stream:
    json.dump(config, stream, indent=2, sort_keys=True)
    stream.write("\n")
resolved = ", ".join(f"{key}={config[key]}" for key in sorted(config) if key.startswith("resolved_"))
Path(snakemake.log[0]).write_text(f"{out}: {resolved or 'the study configuration'}\n")  # noqa: F821
