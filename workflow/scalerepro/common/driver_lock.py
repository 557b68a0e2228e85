"""One driver per study folder: a second ``snakemake`` that would run jobs where another is running
them is refused with a line that says so, before Snakemake builds its DAG.

Without it the second driver met the first one's outputs in progress and stopped with Snakemake's
``IncompleteFilesException``, advising ``--rerun-incomplete``, which would have rebuilt what the
first driver was writing. Snakemake's own lock (.snakemake/locks) is checked only after that.

The lock is an advisory ``flock`` on ``.snakemake/scalerepro-driver.lock`` in the working folder,
held by the driver process for its lifetime: the kernel drops it when the process ends, however it
ends, so no stale lock outlives a killed driver (Snakemake's lock files do, hence ``--unlock``). The
file says who holds it (pid, start, command line). An invocation that runs no job (a dry run, a
lint, a listing) takes no lock; where one is held it warns that the jobs it shows as incomplete are
the running driver's. ``flock`` is local to a host: two drivers on two login nodes sharing the
folder over NFS are not told apart here (Snakemake's lock still stops the second).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from scalerepro.common.cli import CommandError

LOCK_FILE = Path(".snakemake") / "scalerepro-driver.lock"
# Snakemake options with which it runs no job
NOT_RUNNING_JOBS = {
    "--dry-run", "--dryrun", "--lint", "--list", "--list-rules", "--list-target-rules", "--summary",
    "--detailed-summary", "--dag", "--rulegraph", "--filegraph", "--d3dag", "--unlock", "--cleanup-metadata",
    "--cleanup-shadow", "--list-changes", "--lc", "--list-code-changes", "--list-input-changes", "--list-params-changes",
    "--list-version-changes", "--list-untracked", "--delete-all-output", "--delete-temp-output", "--containerize",
    "--export-cwl", "--archive", "--print-compilation", "--version", "--help", "--report", "--generate-unit-tests",
}  # fmt: skip
SHORT_NOT_RUNNING = set("nlSDvh")  # -n (dry run), -l (list), -S / -D (summaries), -v, -h


class DriverBusy(CommandError):
    """Another driver is running jobs in this folder."""


def runs_jobs(argv: Sequence[str]) -> bool:
    """Whether a Snakemake command line runs jobs (not a dry run, a lint, a listing...)."""
    for argument in argv[1:]:
        name = argument.split("=", 1)[0]
        if name in NOT_RUNNING_JOBS:
            return False
        if name.startswith("-") and not name.startswith("--") and SHORT_NOT_RUNNING & set(name[1:]) and name[1:].isalpha():
            return False
    return True


def hold(workdir: Path, argv: Sequence[str]) -> IO[str] | None:
    """The driver lock of ``workdir``, held while the returned file stays open (keep a reference
    for the process's lifetime); None for an invocation that runs no job. Raises DriverBusy when
    another process holds it and this one would run jobs."""
    path = workdir / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not said who it is"
        handle.close()
        message = (f"another snakemake is running this study in {workdir} ({holder}): wait for it to finish, or stop it, "
                   "then run again (--rerun-incomplete would redo the jobs it is running)")  # fmt: skip
        if runs_jobs(argv):
            raise DriverBusy(message) from None
        print(f"warning: {message}; the jobs this shows as incomplete are that driver's", file=sys.stderr, flush=True)
        return None
    if not runs_jobs(argv):
        handle.close()  # the lock goes with the file
        return None
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, since {started}: {shlex.join(['snakemake', *argv[1:]])}\n")
    handle.flush()
    return handle
