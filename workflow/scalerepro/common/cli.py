"""What every command line of the package shares (standard library only: both sides use it)."""

from __future__ import annotations

import argparse
import typing


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on a bad flag; print one line, like every other failure."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
