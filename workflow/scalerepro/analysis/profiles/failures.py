"""A profiler capture that failed, in one line: the error its tool or the trainer printed.

A profiling job that fails writes ``capture.json`` with ``"status": "failed"`` and its exit code
(``scalerepro.launching.profile_job``), so the workflow goes on and the report shows the failure;
the error itself is in the files the job left: ncu's own lines (``==ERROR== ...``, in
``kernels.csv``: ncu writes everything it prints to its --log-file), nsys's, and the trainer's
output in ``profile.log``. ``failure`` finds it there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What an error line looks like, most telling first: the profiler's own error lines (an unknown
# metric, no access to the counters: "==ERROR== ERR_NVGPUCTRPERM ..."), then a Python exception's
# last line, then any line that says error or failed.
ERROR_LINES: tuple[re.Pattern[str], ...] = (
    re.compile(r"==ERROR==.*"),
    re.compile(r"^\s*(\[[^\]]*\]:)?\s*[A-Za-z_.]*(Error|Exception)\b.*"),
    re.compile(r".*\b(error|failed)\b.*", re.IGNORECASE),
)
# the files of a tool's folder that hold its messages, in the order they are searched
MESSAGE_FILES = ("kernels.csv", "profile.log")
NAMED = 3  # error lines kept
_LAST_BYTES = 1 << 20  # a log's tail: a failure is at its end, and ncu's CSV can be large


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    with open(path, "rb") as stream:
        stream.seek(max(0, path.stat().st_size - _LAST_BYTES))
        text = stream.read().decode(errors="replace")
    # ncu's table rows are data, never an error; the job's own "$ command" echo is neither
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(('"', "$ "))]


def error_lines(tool_dir: Path) -> list[str]:
    """The error lines of a failed capture's files (``ERROR_LINES``, the first pattern that
    matches any line), at most ``NAMED``, without repeats; empty when none says error."""
    lines = [line for name in MESSAGE_FILES for line in _lines(tool_dir / name)]
    for pattern in ERROR_LINES:
        found = list(dict.fromkeys(line for line in lines if pattern.search(line)))
        if found:
            return found[-NAMED:] if pattern is not ERROR_LINES[0] else found[:NAMED]
    return []


def failure(tool_dir: Path, capture: Mapping[str, Any], reason: str | None = None) -> dict[str, Any]:
    """One failed capture: its tool, exit code, the error in one line (``error_lines``, else the
    ``reason`` given or the capture's own, else the last line of its log) and where its log is."""
    tool_dir = Path(tool_dir)
    lines = error_lines(tool_dir)
    log = tool_dir / "profile.log"
    last = _lines(log)[-1:] if log.is_file() else []
    # without an error line, the tool's last warning (ncu: "==WARNING== No kernels were profiled.")
    warning = [line for name in MESSAGE_FILES for line in _lines(tool_dir / name) if line.startswith("==WARNING==")][-1:]
    given = "; ".join(filter(None, [reason or capture.get("reason"), *warning])) or None
    error = " / ".join(lines) or given or (f"no error line; the log ends: {last[0]}" if last else "no error line and no log")
    code = capture.get("exit_code")
    return {
        "tool": tool_dir.name,
        "exit_code": code,
        "error": f"{error} (exit {code}; log: {log})" if code is not None else f"{error} (log: {log})",
        "log": str(log),
    }
