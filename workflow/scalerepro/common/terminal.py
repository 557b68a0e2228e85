"""Terminal control sequences out of captured tool output. ``nvidia-smi topo -m`` underlines its
header row with ANSI escapes (ESC[4m ... ESC[0m) even when its output is a pipe; kept as they
are, they reach the report as raw characters. The inventory strips them when it captures the
output (``scalerepro.telemetry.inventory``), the report again when it shows an inventory written
before that (``scalerepro.analysis.presentation.inputs``)."""

from __future__ import annotations

import re

# ECMA-48: a CSI sequence (ESC [ or the 8-bit CSI, parameter bytes, intermediate bytes, one final
# byte: colours, underline, cursor moves), an OSC string (ESC ], up to BEL or ESC \), or any other
# escape (ESC, intermediate bytes, one final byte: a charset switch ESC ( B) or a lone ESC; the
# alternatives are tried in that order.
TERMINAL_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?")


def strip_terminal_escapes(text: str) -> str:
    """``text`` without its terminal control sequences; tabs and newlines stay."""
    return TERMINAL_ESCAPE.sub("", text)


# C0 and C1 control characters (carriage return, backspace, BEL...) but tab and newline
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """One cell of a table printed on a terminal: without escape sequences, every other control
    character shown as its escape (a stored study name carrying ESC[2J must not clear the screen)."""
    return CONTROL.sub(lambda match: repr(match.group())[1:-1], strip_terminal_escapes(text))
