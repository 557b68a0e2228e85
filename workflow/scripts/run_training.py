"""Run one training job of the study (a Snakemake script: ``snakemake`` describes the job).

Outcomes, read from the run record the trainer wrote:
  ok         -> the job succeeds;
  failed     -> the job succeeds too: the record documents the failure and the report shows the
                run as a hole with its error (rerun it with --forcerun once fixed);
  preempted  -> the job fails (exit 75), so Snakemake's retry (or the next invocation) resumes it
                from its checkpoint;
  no record  -> the job fails with the launcher's exit code: see the log.
"""

import json
import shlex
import subprocess
import sys
from pathlib import Path

EXIT_PREEMPTED = 75

record = Path(snakemake.output.record)  # noqa: F821 - injected by Snakemake
# scalerepro.launch starts the ranks: torchrun here, or one srun task per node inside a Slurm job.
command = [sys.executable, "-m", "scalerepro.launch", *snakemake.params.launch, "--", "-m", "scalerepro.train", *snakemake.params.args]  # noqa: F821
with open(snakemake.log[0], "a") as log:  # noqa: F821
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode

status = json.loads(record.read_text())["status"] if record.exists() else None
if status == "ok" and code == 0:
    sys.exit(0)
if status == "failed":
    print(f"{record.parent.name}: the run failed; its record holds the error (log: {snakemake.log[0]})", file=sys.stderr)  # noqa: F821
    sys.exit(0)
if status == "preempted":
    print(f"{record.parent.name}: preempted; rerun resumes from its checkpoint", file=sys.stderr)
    sys.exit(EXIT_PREEMPTED)
print(f"{record.parent.name}: the launcher exited {code} without a record: see {snakemake.log[0]}", file=sys.stderr)  # noqa: F821
sys.exit(code or 1)
