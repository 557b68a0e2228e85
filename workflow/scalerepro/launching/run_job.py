"""Run one training job of the study and turn its record into the job's exit status.

    python -m scalerepro.launching.run_job RECORD JOB LOG LAUNCH_FLAGS... -- -m scalerepro.training.train TRAINER_FLAGS...

The workflow's ``train`` rule runs this as its shell command, so ``snakemake -n -p`` prints every
run's launcher and trainer flags. JOB (``job.json``) is the job's own account beside the record:
its wall time from the launcher's start to its end, the launcher's exit code, and the seconds
its probes after the window took (the record's ``measurements.probes_s``; null without them): the
study's budget, scalerepro.planning.budget, predicts later rounds from them. ``scalerepro.launching.launch``
starts the ranks (torchrun here, one srun task per node inside a Slurm job); everything they
print goes to LOG. Outcomes, read from the
record the ranks (or, when they wrote none, the launcher) wrote:

  ok         -> exit 0;
  failed     -> exit 0 too: the record documents the failure and the report shows the run as a
                hole with its error (rerun it with --forcerun once fixed);
  preempted  -> exit 75, so Snakemake's retry (or the next invocation) resumes it from its
                checkpoint; the record is moved aside first (``record.preempted.json``): an
                unfinished run is no output, even where no Snakemake is left to delete it (a
                driver killed with SIGKILL, whose incomplete marks Snakemake never checks for a
                job a checkpoint added);
  no record  -> the launcher's exit code: see LOG.

This module imports no torch.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from scalerepro.common.cli import error_boundary
from scalerepro.common.exits import EXIT_PREEMPTED
from scalerepro.common.files import write_text_atomically
from scalerepro.record.read import read

PREEMPTED_RECORD = "record.preempted.json"  # where an unfinished run's record goes: beside, never the job's output


@error_boundary("scalerepro.launching.run_job")
def main(argv: list[str]) -> int:
    if len(argv) < 4 or "--" not in argv[3:]:
        print("usage: python -m scalerepro.launching.run_job RECORD JOB LOG LAUNCH_FLAGS... -- -m scalerepro.training.train FLAGS...", file=sys.stderr)
        return 2
    record, job, log_path, launch_argv = Path(argv[0]), Path(argv[1]), argv[2], argv[3:]
    command = [sys.executable, "-m", "scalerepro.launching.launch", *launch_argv]
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        started = time.monotonic()
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
        wall_s = time.monotonic() - started
        # the job's cost beside its record's own duration: what starting the launcher and the
        # ranks (Python, torch) adds (benchmarks/readme_study_bench.py reads this line)
        log.write(f"run_job: launcher and ranks took {wall_s:.3f} s wall, exit {code}\n")
    written, unreadable = None, None
    try:
        written = read(record).record
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as error:  # a record the ranks wrote that no reader can take
        unreadable = str(error)
    probes_s = written.measurements.probes_s if written is not None and written.measurements is not None else None
    account = {"run": record.parent.name, "wall_s": round(wall_s, 3), "launcher_exit": code, "probes_s": None if probes_s is None else round(probes_s, 3)}
    write_text_atomically(job, json.dumps(account) + "\n")

    status = written.status if written is not None else None
    if unreadable is not None:
        print(f"{record.parent.name}: {unreadable} (log: {log_path})", file=sys.stderr)
        return code or 1
    if status == "ok" and code == 0:
        return 0
    if status == "failed":
        print(f"{record.parent.name}: the run failed; its record holds the error (log: {log_path})", file=sys.stderr)
        return 0
    if status == "preempted":
        record.replace(record.with_name(PREEMPTED_RECORD))
        print(f"{record.parent.name}: preempted (its record now {PREEMPTED_RECORD}); a rerun resumes from its checkpoint", file=sys.stderr)
        return EXIT_PREEMPTED
    print(f"{record.parent.name}: the launcher exited {code} without a record: see {log_path}", file=sys.stderr)
    return code or 1


if __name__ == "__main__":
    sys.exit(main())
