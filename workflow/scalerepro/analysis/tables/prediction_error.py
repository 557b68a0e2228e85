"""The scaling model's error bars: what a back-test on published scaling series measured, by regime.

benchmarks/predict_published.py gives the model, per published series, the smaller counts only
(the one-node figure; on a series of three or more counts, the straggler spread is fitted on the
counts below the held-back ones) and predicts the held-back largest counts; each held-back row's
error is e = predicted / published - 1 of the published figure. A regime is where a row's
prediction stands on four axes:

    strategy   ddp | fsdp | 3d                      (how the gradients and parameters move)
    nodes      one node | 2-8 nodes | 9+ nodes      (9+: more than 64 GPUs at 8 a node)
    batch      held | above the knee | below the knee | changed, no curve
               the per-GPU micro-batch against the given figure's: held, or changed and placed
               against the batch curve's knee, m_knee = 9 a / b for t(m) = a + b m (the batch
               whose fixed per-step cost a is a tenth of its step: at or above it the compute is
               within 10 % of proportional to the batch, below it the fixed cost matters)
    compute    as given | batch curve | proportional
               where the compute at the new micro-batch comes from: the given figure (batch held),
               a measured batch curve, or the assumption that it is proportional to the batch

Per regime the table holds the median and the largest |e| over its held-back rows, the rows
themselves, and the ranges the rows spanned of what the four axes do not bin: the share of the
predicted step that is communication (every collective's time over the step, overlapped or not)
and the micro-batches a step. ``prediction_error_by_regime`` in config/references.yaml holds it as
data, with the command that measured it and the rule (``comparable``, with its reason) by which a
prediction is comparable to its regime's rows. A prediction carries its own regime's figures
(``error_columns``): ``typical_error`` (the median |e|), ``regime`` (the key) and ``error_basis``
(the rows behind it); a regime no back-test covered carries no error, and says so
(``NO_BACK_TEST``): a figure measured on another regime is not this one's error bar; nor is one
measured on rows whose communication was a far smaller share of their step, or that accumulated
another number of micro-batches (``NO_ERROR_BAR``, with the row's figure beside the rows' range).

This module is on the analysis side: it never imports torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REGIME_STRATEGIES = ("ddp", "fsdp", "3d")
NODE_REGIMES = ("one node", "2-8 nodes", "9+ nodes")
BATCH_REGIMES = ("held", "above the knee", "below the knee", "changed, no curve")
COMPUTE_REGIMES = ("as given", "batch curve", "proportional")
NO_BACK_TEST = "no back-test of this regime"
NO_ERROR_BAR = "no error bar"
# the fixed per-step cost's share of the step at the knee: t(0) / t(m_knee) = a / (a + b m_knee)
KNEE_FIXED_SHARE = 0.1


@dataclass(frozen=True)
class Regime:
    """Where a prediction stands (module docstring)."""

    strategy: str
    nodes: str
    batch: str
    compute: str

    @property
    def key(self) -> str:
        return f"{self.strategy}, {self.nodes}, batch {self.batch}, compute {self.compute}"


def node_regime(nodes: int) -> str:
    """one node (n = 1), 2-8 nodes, 9+ nodes."""
    return NODE_REGIMES[0] if nodes <= 1 else NODE_REGIMES[1] if nodes <= 8 else NODE_REGIMES[2]


def knee(intercept_s: float, slope_s: float) -> float:
    """m_knee = (1 / f - 1) a / b = 9 a / b for f = 0.1: the batch at which the curve's fixed
    per-step cost a is the share f of the step a + b m."""
    return (1 / KNEE_FIXED_SHARE - 1) * intercept_s / slope_s


def regime_of(strategy: str, nodes: int, micro_batch: int, given_micro_batch: int, curve_knee: float | None) -> Regime:
    """The regime of a prediction at ``micro_batch`` per GPU from a figure (or one-GPU run) at
    ``given_micro_batch``; ``curve_knee``: the knee of the batch curve the compute came from, None
    where it came from none (proportional, or the batch held)."""
    if strategy not in REGIME_STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is none of {', '.join(REGIME_STRATEGIES)}")
    if micro_batch == given_micro_batch:
        batch, compute = BATCH_REGIMES[0], COMPUTE_REGIMES[0]
    elif curve_knee is None:
        batch, compute = BATCH_REGIMES[3], COMPUTE_REGIMES[2]
    else:
        batch, compute = BATCH_REGIMES[1] if micro_batch >= curve_knee else BATCH_REGIMES[2], COMPUTE_REGIMES[1]
    return Regime(strategy, node_regime(nodes), batch, compute)


@dataclass(frozen=True)
class BackTestedRow:
    """One held-back row of the back-test: its regime, name ("<series> <GPUs>"), error e, the
    share of its predicted step that is communication and its micro-batches a step."""

    regime: Regime
    name: str
    error: float
    comm_share: float
    micro_batches: int


@dataclass(frozen=True)
class RegimeError:
    """The back-tested error of one regime: median and largest |predicted / published - 1|, and
    the ranges its rows spanned (module docstring)."""

    regime: Regime
    median: float
    largest: float
    rows: tuple[str, ...]  # the held-back rows behind it, "<series> <GPUs>"
    comm_share: tuple[float, float]  # the rows' smallest and largest communication share of the step
    micro_batches: tuple[int, int]  # the rows' fewest and most micro-batches a step


def _share(value: float) -> str:
    """A share of the step, to two decimals below 1 % (the back-test's smallest are 0.1 %)."""
    return f"{value:.2%}" if value < 0.01 else f"{value:.1%}"


@dataclass(frozen=True)
class Comparable:
    """When a prediction is comparable to its regime's back-tested rows: its communication share
    at most ``comm_share_factor`` x the rows' largest, its micro-batches a step within theirs;
    ``reason`` says why (references.yaml's ``prediction_error_by_regime.comparable``)."""

    comm_share_factor: float
    reason: str

    def why_not(self, found: RegimeError, comm_share: float, micro_batches: int) -> str | None:
        """Why a prediction is not comparable to ``found``'s rows; None where it is."""
        low, high = found.comm_share
        if comm_share > self.comm_share_factor * high:
            # the rule (comm_share_factor x their largest) is said once, above the table
            return f"communication is {_share(comm_share)} of this step, its regime's back-tested rows {_share(low)}-{_share(high)}"
        fewest, most = found.micro_batches
        if not fewest <= micro_batches <= most:
            span = f"{fewest}" if fewest == most else f"{fewest}-{most}"
            return f"{micro_batches} micro-batch{'' if micro_batches == 1 else 'es'} a step, its regime's back-tested rows {span}"
        return None


@dataclass(frozen=True)
class ErrorTable:
    """``prediction_error_by_regime`` of references.yaml: each regime's back-tested error and the
    rule of a comparable prediction."""

    regimes: dict[str, RegimeError]  # by Regime.key
    command: str  # the benchmark command that measured it
    comparable: Comparable

    def for_regime(self, regime: Regime) -> RegimeError | None:
        return self.regimes.get(regime.key)


def back_tested(rows: Iterable[BackTestedRow]) -> list[RegimeError]:
    """Each regime's median and largest |e| over its held-back rows, and the ranges they span, in
    the order the regimes first appear."""
    grouped: dict[str, list[BackTestedRow]] = {}
    for row in rows:
        grouped.setdefault(row.regime.key, []).append(row)
    return [
        RegimeError(
            group[0].regime,
            statistics.median(abs(r.error) for r in group),
            max(abs(r.error) for r in group),
            tuple(r.name for r in group),
            (min(r.comm_share for r in group), max(r.comm_share for r in group)),
            (min(r.micro_batches for r in group), max(r.micro_batches for r in group)),
        )
        for group in grouped.values()
    ]


def to_document(errors: Iterable[RegimeError], command: str, protocol: str, comparable: Mapping[str, Any]) -> dict[str, Any]:
    """``prediction_error_by_regime`` as references.yaml holds it (errors rounded to 0.1 point,
    shares of the step to 0.01 point); ``comparable``: the rule as references.yaml holds it."""
    return {
        "command": command,
        "protocol": protocol,
        "comparable": dict(comparable),
        "regimes": [
            {
                "strategy": e.regime.strategy,
                "nodes": e.regime.nodes,
                "batch": e.regime.batch,
                "compute": e.regime.compute,
                "median": round(e.median, 3),
                "largest": round(e.largest, 3),
                "comm_share": [round(e.comm_share[0], 4), round(e.comm_share[1], 4)],
                "micro_batches": list(e.micro_batches),
                "rows": list(e.rows),
            }
            for e in errors
        ],
    }


def error_table_of(references: Mapping[str, Any]) -> ErrorTable | None:
    """``prediction_error_by_regime`` of a references document (the loader has checked its form); None without one."""
    entry = references.get("prediction_error_by_regime")
    if not entry:
        return None
    regimes = {}
    for item in entry["regimes"]:
        regime = Regime(item["strategy"], item["nodes"], item["batch"], item["compute"])
        low, high = item["comm_share"]
        fewest, most = item["micro_batches"]
        regimes[regime.key] = RegimeError(regime, float(item["median"]), float(item["largest"]), tuple(item["rows"]), (low, high), (fewest, most))
    rule = entry["comparable"]
    return ErrorTable(regimes, entry["command"], Comparable(float(rule["comm_share_factor"]), rule["reason"]))


def error_columns(regime: Regime, table: ErrorTable | None, comm_share: float, micro_batches: int) -> dict[str, Any]:
    """A prediction's ``regime``, ``typical_error`` (its regime's median |e|, None where no
    back-test covered it or its rows are not comparable to this prediction: ``comm_share``, the
    share of its step that is communication, and ``micro_batches`` a step) and ``error_basis``
    (the rows behind it, or why there is none)."""
    found = table.for_regime(regime) if table is not None else None
    if table is None or found is None:
        return {"regime": regime.key, "typical_error": None, "error_basis": NO_BACK_TEST}
    why_not = table.comparable.why_not(found, comm_share, micro_batches)
    if why_not is not None:
        return {"regime": regime.key, "typical_error": None, "error_basis": f"{NO_ERROR_BAR}: {why_not}"}
    rows = ", ".join(found.rows)
    return {
        "regime": regime.key,
        "typical_error": found.median,
        "error_basis": (
            f"back-test of {table.command}: median ±{found.median:.1%}, largest ±{found.largest:.1%} over "
            f"{len(found.rows)} held-back row{'' if len(found.rows) == 1 else 's'} ({rows})"
        ),
    }
