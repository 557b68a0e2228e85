"""Write the SHA-256 of each source file of one program and of them all: the file its jobs depend on.
The log says how many files the fingerprint covers and their combined digest."""

import hashlib
from pathlib import Path

total = hashlib.sha256()
lines = []
for source in sorted(snakemake.input):  # noqa: F821 - injected by Snakemake
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    total.update(f"{digest}  {source}\n".encode())
    lines.append(f"{digest}  {source}")
out = snakemake.output[0]  # noqa: F821
Path(out).write_text("\n".join([*lines, f"{total.hexdigest()}  (all)"]) + "\n")
Path(snakemake.log[0]).write_text(f"{out}: {len(lines)} source files, {total.hexdigest()} (all)\n")  # noqa: F821
