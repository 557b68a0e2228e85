"""The launcher's record of a run whose ranks wrote none.

Rank 0 writes the record, also for failures it sees. It writes none when it cannot: a rank
blocked in a collective never reaches the stop flag (``scalerepro.training.trainer.StopRequest``), so
NCCL's watchdog aborts it (SIGABRT) after the collective timeout, or torchrun stops it (SIGTERM,
then SIGKILL) when a peer died first; the kernel's OOM killer sends SIGKILL. The launcher
(``scalerepro.launching.launch``) started the ranks and sees them end, so it writes the failed record
then, valid against the run-record schema, with:

* each failed rank's exit code (negative: killed by that signal), rank and host, read from the
  failure report torchrun prints when a worker fails (``ChildFailedError``: blocks of ``host :``,
  ``rank : R (local_rank: L)``, ``exitcode : C`` lines, one per worker it reports as failed,
  those it stopped after the first failure included);
* the last lines each rank printed, read from the console stream: torchrun ``--tee`` prefixes
  each rank's lines with ``[default<local rank>]:`` and, on Slurm, srun ``--label`` prefixes each
  node task's lines with ``<task>:``.

The record is written only when the ranks wrote none during this launch (none there, or one
older than the launch): a record of their own, failed or preempted, is never replaced.

This module imports no torch: the launcher must start fast and may run where torch is absent.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

TAIL_LINES = 30  # lines kept per rank
_REPORT_LINES = 2000  # the launcher's own lines kept (torchrun's failure report is ~12 per rank)

# "<srun task>: " (srun --label), then "[<role><local rank>]:" (torchrun --tee), then the text.
_LINE = re.compile(r"^(?:\s*(?P<task>\d+): )?(?:\[(?P<role>[A-Za-z_]+?)(?P<local>\d+)\]:)?(?P<text>.*)$", re.DOTALL)
# One failed worker in torchrun's report (torch/distributed/elastic/multiprocessing/errors).
_FAILURE = re.compile(
    r"host\s*:\s*(?P<host>\S+)\s*\n\s*rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local_rank>\d+)\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<exit_code>-?\d+)"
)


class RankOutput:
    """The tail of each rank's console output, and the launcher-level lines (torchrun, srun)."""

    def __init__(self, tail_lines: int = TAIL_LINES):
        self._tail_lines = tail_lines
        self._tails: dict[str, deque[str]] = {}
        self._report: deque[str] = deque(maxlen=_REPORT_LINES)
        self._lock = threading.Lock()

    def feed(self, line: str) -> None:
        parts = _LINE.match(line.rstrip("\n"))
        assert parts is not None  # the pattern matches any line
        text = parts["text"]
        with self._lock:
            if parts["local"] is None:
                self._report.append(text)
                return
            where = f"local rank {parts['local']}" if parts["task"] is None else f"node task {parts['task']}, local rank {parts['local']}"
            self._tails.setdefault(where, deque(maxlen=self._tail_lines)).append(text)

    def tails(self) -> dict[str, list[str]]:
        with self._lock:
            return {where: list(lines) for where, lines in sorted(self._tails.items())}

    def report(self) -> str:
        with self._lock:
            return "\n".join(self._report)


def torchrun_failures(report: str) -> list[dict[str, Any]]:
    """The failed workers torchrun reported (each once, by rank), with the signal of a negative exit code."""
    failures: dict[int, dict[str, Any]] = {}
    for found in _FAILURE.finditer(report):
        code = int(found["exit_code"])
        failures[int(found["rank"])] = {
            "rank": int(found["rank"]),
            "local_rank": int(found["local_rank"]),
            "host": found["host"],
            "exit_code": code,
            "signal": _signal_name(-code) if code < 0 else None,
        }
    return [failures[rank] for rank in sorted(failures)]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_watched(command: Sequence[str], output: RankOutput) -> int:
    """Run ``command``, passing its stdout and stderr through to ours line by line while
    ``output`` keeps their tails; return its exit code."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)

    def pump(source: TextIO, sink: TextIO) -> None:
        for line in source:
            sink.write(line)
            sink.flush()
            output.feed(line)

    pumps = [threading.Thread(target=pump, args=pair, daemon=True) for pair in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))]
    for thread in pumps:
        thread.start()
    code = process.wait()
    for thread in pumps:
        thread.join()
    return code


def trainer_record(program: Sequence[str]) -> tuple[Path, list[str]] | None:
    """(record path, trainer flags) when ``program`` is ``-m scalerepro.training.train ... --record PATH``."""
    if list(program[:2]) != ["-m", "scalerepro.training.train"]:
        return None
    from scalerepro.trainer_flags import build_parser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            given, _ = build_parser().parse_known_args(list(program[2:]))
    except SystemExit:  # flags the trainer refused too (it said why)
        return None
    return (Path(given.record), list(program[2:])) if given.record else None


def written_since(path: Path, since: float) -> bool:
    """Whether ``path`` was written at or after ``since`` (POSIX seconds)."""
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def write_failed_record(
    record_path: Path, trainer_argv: list[str], started_at: str, launcher_exit_code: int, output: RankOutput, failures: list[dict[str, Any]] | None = None
) -> str | None:
    """Write the failed record of ranks that wrote none; return its one-line message, or None
    when the trainer's flags do not parse (the trainer said why, and wrote no record either).
    ``failures``: the failed ranks as the launcher saw them end (local runs); None reads them
    from torchrun's failure report in ``output``."""
    from scalerepro.trainer_flags import parse_args
    from scalerepro.training import record

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            config = parse_args(trainer_argv)
    except SystemExit:
        return None
    failures = torchrun_failures(output.report()) if failures is None else failures
    tails = output.tails()
    if failures:
        ended = "; ".join(f"rank {f['rank']} (host {f['host']}) exit {f['exit_code']}" + (f" ({f['signal']})" if f["signal"] else "") for f in failures)
        message = f"the ranks ended without writing a record: {ended} (launcher exit {launcher_exit_code})"
    else:
        message = f"the ranks ended without writing a record and none is reported failed (launcher exit {launcher_exit_code}): see the job's log"
    document = record.build(
        run_id=config.run.run_id or str(uuid.uuid4()),
        status="failed",
        config=config,
        started_at=started_at,
        argv=trainer_argv,
        error={
            "type": "RanksEndedWithoutRecord",
            "message": message,
            "traceback": "\n".join(f"--- {where}: last {len(lines)} lines\n" + "\n".join(lines) for where, lines in tails.items()),
            "launcher_exit_code": launcher_exit_code,
            "ranks": failures,
            "log_tails": tails,
        },
        import_torch=False,
    )
    os.makedirs(record_path.parent, exist_ok=True)
    record.write(record_path, document)
    return message
