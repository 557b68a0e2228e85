"""What else ran on this node during a measured window.

A measured run is meant to have its node to itself (the workflow schedules one measured job at a
time locally and asks Slurm for exclusive nodes); this module checks that it did. At the window's
start and end it reads the host's busy CPU time and every process's CPU time (psutil), then reports

    other_cpu_fraction = (host busy CPU seconds - this job's CPU seconds) / (window seconds x logical CPUs)

and the processes outside this job that used the most CPU in the window. The job is this rank's
process tree and that of its parent (the launcher starts the ranks as its children), so the
other local ranks and their loader workers count as the job. Fractions near 0 mean the node was
quiet; a few percent is the OS and monitoring daemons.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

TOP_PROCESSES = 5


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _job_pids() -> set[int]:
    """This process and its descendants, and when a launcher started it (torchrun or
    scalerepro.launching.launch set LOCAL_RANK) the launcher's, which are the other ranks of the node."""
    me = psutil.Process()
    launcher = me.parent() if "LOCAL_RANK" in os.environ else None
    roots = [me] + ([launcher] if launcher is not None else [])
    pids = set()
    for root in roots:
        pids.add(root.pid)
        pids.update(child.pid for child in root.children(recursive=True))
    return pids


def _cpu_seconds() -> dict[int, tuple[str, float]]:
    found = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        times = process.info["cpu_times"]
        if times is not None:
            found[process.pid] = (process.info["name"] or "?", times.user + times.system)
    return found


@dataclass
class HostLoad:
    started: float = 0.0
    busy_at_start: float = 0.0
    processes_at_start: dict[int, tuple[str, float]] = field(default_factory=dict)

    def start(self) -> None:
        self.started, self.busy_at_start, self.processes_at_start = time.monotonic(), _busy_seconds(), _cpu_seconds()

    def stop(self) -> dict[str, Any]:
        """The window's figures (see the module docstring for the formula)."""
        window_s = time.monotonic() - self.started
        busy = _busy_seconds() - self.busy_at_start
        job = _job_pids()
        used = {pid: (name, seconds - self.processes_at_start.get(pid, (name, 0.0))[1]) for pid, (name, seconds) in _cpu_seconds().items()}
        job_seconds = sum(seconds for pid, (_, seconds) in used.items() if pid in job)
        others = sorted(((s, pid, n) for pid, (n, s) in used.items() if pid not in job and s > 0), reverse=True)
        cpus = psutil.cpu_count() or 1
        return {
            "window_s": window_s,
            "logical_cpus": cpus,
            "job_cpu_s": job_seconds,
            "other_cpu_fraction": max(busy - job_seconds, 0.0) / (window_s * cpus) if window_s > 0 else None,
            "top_other_processes": [{"pid": pid, "name": name, "cpu_s": round(seconds, 3)} for seconds, pid, name in others[:TOP_PROCESSES]],
        }
