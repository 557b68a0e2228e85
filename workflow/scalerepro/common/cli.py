"""What every command line of the package shares (standard library only: both sides use it).

The error boundary. A command's expected failures are the user's to fix: a bad argument; a
missing, damaged, locked, read-only or full file; a bad bundle or config. Each prints one line,
``<prog>: error: <cause>: <fix>``, and exits 2 (EXIT_USAGE), with the traceback only under
``--debug``. Expected means: a ``CommandError`` (each side's error classes derive from it, and
their messages name the file and the fix) or an ``OSError`` (a file the command was told to read
or write). Anything else is a bug in scalerepro and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import functools
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

from scalerepro.common.exits import EXIT_USAGE

DEBUG_FLAG = "--debug"


class CommandError(Exception):
    """An expected failure: the message names what is wrong and how to put it right."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on a bad flag; print one line, like every other
    failure. Every parser, sub-commands' too, takes ``--debug`` (read by ``error_boundary``)."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an expected failure")

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


# What to do about an operating-system error, by errno: the one line's fix.
_OS_FIXES = {
    errno.ENOSPC: "the file system is full: free space there or write elsewhere, then run again",
    errno.EDQUOT: "the disk quota is used up: free space there or write elsewhere, then run again",
    errno.EFBIG: "the file size limit was reached (ulimit -f, or the file system's): raise it or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "permission denied: check the file's and its directory's permissions",
    errno.EPERM: "operation not permitted: check the file's and its directory's permissions",
    errno.ENOENT: "no such file or directory: check the path",
    errno.EISDIR: "it is a directory: name a file",
    errno.ENOTDIR: "a part of the path is not a directory: check the path",
    errno.EIO: "an I/O error from the device: check the file system",
}


def describe_os_error(error: OSError) -> str:
    """One line for an OSError: the file, what happened and what to do."""
    fix = _OS_FIXES.get(error.errno) if error.errno is not None else None
    if error.filename is None:  # e.g. "No usable temporary directory found in [...]" on a full disk
        general = "check free space and permissions on that file system"
        return f"{error.strerror or error}: {general if error.errno in (errno.ENOENT, None) or fix is None else fix}"
    return f"cannot use {error.filename}: {fix or f'{error.strerror or error}: check the file and the file system'}"


def _debug_requested(argv: Sequence[str]) -> bool:
    # Whatever follows "--" belongs to the program a launcher starts, not to this command.
    options = list(argv)[: list(argv).index("--")] if "--" in argv else argv
    return DEBUG_FLAG in options


def error_boundary(prog: str) -> Callable[[Callable[[list[str]], int]], Callable[[Sequence[str] | None], int]]:
    """Wrap a command's ``main(argv) -> exit code``: expected failures become one line and exit 2."""

    def wrap(main: Callable[[list[str]], int]) -> Callable[[Sequence[str] | None], int]:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            arguments = list(sys.argv[1:] if argv is None else argv)
            try:
                return main(arguments)
            except (CommandError, OSError) as error:
                if _debug_requested(arguments):
                    raise
                message = describe_os_error(error) if isinstance(error, OSError) else str(error)
                print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
                return EXIT_USAGE
            except KeyboardInterrupt:
                if _debug_requested(arguments):
                    raise
                print(f"{prog}: interrupted: what it writes is written whole or not at all; run it again", file=sys.stderr)
                return 128 + 2  # the shell's code for SIGINT

        return run

    return wrap


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (a count that a bug or a typo must not make
    zero, negative or large enough to take the machine's memory)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside [{low}, {high}]")
        return value

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def bounded_float(low: float, high: float, *, high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (or [low, high) with ``high_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = low <= value < high if high_open else low <= value <= high
        if not inside:  # also refuses NaN, which no comparison holds for
            raise argparse.ArgumentTypeError(f"{text} is outside [{low}, {high}{')' if high_open else ']'}")
        return value

    parse.__name__ = "number"
    return parse


def output_path(text: str) -> Path:
    """An argparse type for a file the command writes: refused at once when it names a directory
    (rather than after the work, when the rename over it fails)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: name a file")
    return path


# GPUs, nodes, ranks, cores: at least one, and no more than a machine room holds.
COUNT = bounded_int(1, 1 << 20)
