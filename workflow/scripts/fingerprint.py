"""Write the SHA-256 of each source file of one program and of them all: the file its jobs depend on."""

import hashlib
from pathlib import Path

total = hashlib.sha256()
lines = []
for source in sorted(snakemake.input):  # noqa: F821 - injected by Snakemake
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    total.update(f"{digest}  {source}\n".encode())
    lines.append(f"{digest}  {source}")
Path(snakemake.output[0]).write_text("\n".join([*lines, f"{total.hexdigest()}  (all)"]) + "\n")  # noqa: F821
