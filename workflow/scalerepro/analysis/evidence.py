"""What a run record must be to count as evidence: bounded, readable, the run its plan names, and
every measured figure a finite number on the right side of zero.

The rank writes a record; the analysis reads it (``tables.readers``, the scaling model's profile,
``predict --record``, ``rebuild --records``). A record is a claim, not a figure to publish: a file
that is too large or nested too deep to be a record, a record of another run (copied over, or a
matrix pointing at the wrong path), or a figure that is negative, infinite, NaN or text is refused
here, named, and counted as a hole (the run is missing or failed, never an ok run with a number).

The bounds are data (``FIGURE_BOUNDS``: one line per figure, its range and unit), checked by one
function, the way ``history.study_rows.check_rows`` checks what the store takes.

On the analysis side: no torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerepro.common.cli import CommandError

# A record is tens to hundreds of KiB (its loss log grows with the steps: 100,000 logged steps are
# ~10 MiB); 64 MiB is no record, and reading it whole is what a bound is for.
MAX_RECORD_BYTES = 64 << 20


class EvidenceError(CommandError, ValueError):
    """A file that is not a run record, or a record that is not evidence; one line naming it."""


def read_json_document(path: str | os.PathLike[str], what: str = "run record", max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``, read within bounds: at most ``max_bytes``, nested no deeper than
    Python's parser allows (a RecursionError is an EvidenceError here), UTF-8, an object at the top.
    FileNotFoundError passes through (a missing record is a hole of its own kind)."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise EvidenceError(f"{what} {path} is {size / 2**20:.0f} MiB, larger than any {what} ({max_bytes >> 20} MiB): not read")
    try:
        document = json.loads(path.read_bytes())
    except RecursionError:
        raise EvidenceError(f"{what} {path} is nested deeper than any {what}: not read") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise EvidenceError(f"{what} {path} is not JSON ({str(error).splitlines()[0][:120]})") from None
    if not isinstance(document, dict):
        raise EvidenceError(f"{what} {path} holds a JSON {type(document).__name__}, not an object")
    return document


@dataclass(frozen=True)
class Bound:
    """A measured figure's range: above ``low`` (or at it, ``low_inclusive``), at most ``high``."""

    low: float = 0.0
    low_inclusive: bool = True
    high: float = math.inf
    unit: str = ""
    integer: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not such a figure, or None (None itself is "not measured": allowed)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r}, not a number"
        if self.integer and not isinstance(value, int):
            return f"{value!r}, not a whole number"
        if not math.isfinite(value):
            return f"{value!r}, not a finite number"
        if value < self.low or (value == self.low and not self.low_inclusive):
            side = "at least" if self.low_inclusive else "above"
            return f"{value!r}, where a measured one is {side} {self.low:g}{' ' + self.unit if self.unit else ''}"
        if value > self.high:
            return f"{value!r}, where a measured one is at most {self.high:g}{' ' + self.unit if self.unit else ''}"
        return None


POSITIVE = Bound(0.0, low_inclusive=False)
UNIT_INTERVAL = Bound(0.0, high=1.0)
# runs.csv column -> the range of the figure a record gives it (tables.readers reads them; a record
# with one out of range is no evidence: the run is refused, not published)
FIGURE_BOUNDS: dict[str, Bound] = {
    "samples_per_s": Bound(0.0, False, unit="samples/s"),
    "tokens_per_s": Bound(0.0, False, unit="tokens/s"),
    "step_time_median_s": Bound(0.0, False, unit="s"),
    "step_time_p10_s": Bound(0.0, False, unit="s"),
    "step_time_p90_s": Bound(0.0, False, unit="s"),
    "epoch_time_s": Bound(0.0, False, unit="s"),
    "window_s": Bound(0.0, False, unit="s"),
    "measured_steps": Bound(0.0, integer=True),
    "mfu": UNIT_INTERVAL,
    "exposed_comm_fraction": UNIT_INTERVAL,
    "data_stall_fraction": UNIT_INTERVAL,
    "data_wait_s": Bound(unit="s"),
    "sync_step_s": Bound(0.0, False, unit="s"),
    "nosync_step_s": Bound(0.0, False, unit="s"),
    "nosync_rank_mean_s": Bound(0.0, False, unit="s"),
    "straggler_wait_s": Bound(unit="s"),
    "sync_compute_rank_mean_s": Bound(0.0, False, unit="s"),
    "window_compute_rank_mean_s": Bound(0.0, False, unit="s"),
    "window_exposed_wait_s": Bound(unit="s"),
    "window_straggler_wait_s": Bound(unit="s"),
    "window_data_wait_rank_mean_s": Bound(unit="s"),
    "gpu_util_mean_pct": Bound(high=100.0, unit="%"),
    "power_mean_w": Bound(unit="W"),
    "energy_j": Bound(unit="J"),
    "energy_per_sample_j": Bound(unit="J"),
    "energy_per_sample_net_j": Bound(low=-math.inf, unit="J"),  # net of idle power: below 0 is noise, not nonsense
    "idle_power_w": Bound(unit="W"),
}


def figure_problems(fields: Mapping[str, Any], bounds: Mapping[str, Bound] = FIGURE_BOUNDS) -> list[str]:
    """"<column> is <why>" for every figure of ``fields`` outside its bound."""
    return [f"{name} is {why}" for name, bound in bounds.items() if name in fields and (why := bound.problem(fields[name]))]


# matrix column -> (where the record states it, what it is called in a message)
IDENTITY: dict[str, tuple[tuple[str, ...], str]] = {
    "run_id": (("run_id",), "run id"),
    "model": (("model", "name"), "model"),
}


def dig(document: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a record (nested objects), or None where any step is absent."""
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def identity_problem(document: Mapping[str, Any], planned: Mapping[str, Any]) -> str | None:
    """Why the record is not the run its plan names (its run id or model differ), or None. The GPU
    count, node count, per-GPU batch and strategy are compared where runs.csv is made
    (``consistent``); these two say whose record it is at all."""
    differs = []
    for column, (where, name) in IDENTITY.items():
        value = dig(document, where)
        if value is not None and column in planned and str(value) != str(planned[column]):
            differs.append(f"{name} {value!r}, not {planned[column]!r}")
    return f"it is another run's record ({'; '.join(differs)})" if differs else None
