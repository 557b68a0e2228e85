"""One driver per study folder: a second ``snakemake`` that would run jobs where another is running
them is refused with a line that says so, before Snakemake builds its DAG.

Without it the second driver met the first one's outputs in progress and stopped with Snakemake's
``IncompleteFilesException``, advising ``--rerun-incomplete``, which would have rebuilt what the
first driver was writing. Snakemake's own lock (.snakemake/locks) is checked only after that.

The lock is an advisory ``flock`` on ``.snakemake/scalerepro-driver.lock`` in the working folder,
held by the driver process for its lifetime: the kernel drops it when the process ends, however it
ends, so no stale lock outlives a killed driver (Snakemake's lock files do, hence ``--unlock``). The
file says who holds it (pid, start, command line). An invocation that runs no job (a dry run, a
lint, a listing) takes no lock; where one is held it warns, and the caller has Snakemake leave the
running driver's outputs in progress alone (``Hold.beside_driver``, ``again_ignoring_incomplete``:
else a dry run beside the driver stopped with ``IncompleteFilesException`` on a record a training
job had written while Snakemake still marked it in progress). ``flock`` is local to a host: two drivers on two login nodes sharing the
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
from typing import IO, NamedTuple

from scalerepro.common.cli import CommandError

LOCK_FILE = Path(".snakemake") / "scalerepro-driver.lock"
# Snakemake options with which it runs no job
NOT_RUNNING_JOBS = {
    "--dry-run",
    "--dryrun",
    "--lint",
    "--list",
    "--list-rules",
    "--list-target-rules",
    "--summary",
    "--detailed-summary",
    "--dag",
    "--rulegraph",
    "--filegraph",
    "--d3dag",
    "--unlock",
    "--cleanup-metadata",
    "--cleanup-shadow",
    "--list-changes",
    "--lc",
    "--list-code-changes",
    "--list-input-changes",
    "--list-params-changes",
    "--list-version-changes",
    "--list-untracked",
    "--delete-all-output",
    "--delete-temp-output",
    "--containerize",
    "--export-cwl",
    "--archive",
    "--print-compilation",
    "--version",
    "--help",
    "--report",
    "--generate-unit-tests",
}
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


IGNORE_INCOMPLETE = "--ignore-incomplete"
WARNED = "SCALEREPRO_WARNED_BESIDE_DRIVER"  # set for the process run again: the warning is said once


def again_ignoring_incomplete(argv: Sequence[str]) -> None:
    """Run this invocation (one that runs no job, beside a running driver) again as itself with
    Snakemake's --ignore-incomplete: the driver's outputs in progress are not incomplete files to
    refuse. Snakemake sets its execution settings only after it has read the Snakefile, so the flag
    cannot be set from here; the process is replaced, once (the flag given, it goes on)."""
    if IGNORE_INCOMPLETE in argv or "--ii" in argv:
        return
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "snakemake", *argv[1:], IGNORE_INCOMPLETE], {**os.environ, WARNED: "1"})


class Hold(NamedTuple):
    handle: IO[str] | None  # the lock, held while this file stays open; None for an invocation that runs no job
    beside_driver: bool  # another driver holds the lock: its outputs in progress are not this invocation's to judge


def hold(workdir: Path, argv: Sequence[str]) -> Hold:
    """The driver lock of ``workdir``, held while the returned handle stays open (keep a reference
    for the process's lifetime). Raises DriverBusy when another process holds it and this one would
    run jobs."""
    path = workdir / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not said who it is"
        handle.close()
        message = (
            f"another snakemake is running this study in {workdir} ({holder}): wait for it to finish, or stop it, "
            "then run again (--rerun-incomplete would redo the jobs it is running)"
        )
        if runs_jobs(argv):
            raise DriverBusy(message) from None
        if not os.environ.get(WARNED):
            print(f"warning: {message}; the jobs this shows are as that driver has left them so far", file=sys.stderr, flush=True)
        return Hold(None, True)
    if not runs_jobs(argv):
        handle.close()  # the lock goes with the file
        return Hold(None, False)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, since {started}: {shlex.join(['snakemake', *argv[1:]])}\n")
    handle.flush()
    return Hold(handle, False)
