"""The report's "Nodes screened" section: the prescreen's screen (``record.node_check.NodeScreen``,
results/prescreen/screen.json) laid out as the rule in one sentence, the medians it judged against,
which nodes it excluded and why, and one row per node and device with what each measured.

The numbers are the screen's; this module only writes them (three significant figures, with their
units) so that the template stays a table. A study without the prescreen shows one line saying so.
On the analysis side: it never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerepro.analysis.presentation.formatting import fmt_auto, fmt_int, fmt_number
from scalerepro.record.node_check import SCREEN_FIGURES, DeviceFigures, DeviceState, NodeScreen, NodeVerdict, read_screen

NOT_RUN = "not run: the study kept no prescreen screen (prescreen.enabled was false, or the study is older than the prescreen)"

# The table's columns: (key, header, format); every value is written here, so each is text.
PRESCREEN_COLUMNS = (
    ("node", "Node", "text"),
    ("device", "Device", "text"),
    ("matmul", "Matmul TFLOP/s (× median)", "text"),
    ("memory", "Memory copy GB/s (× median)", "text"),
    ("allreduce", "All-reduce bus bandwidth GB/s (× median)", "text"),
    ("link", "Link to the reference node, GB/s (× median)", "text"),
    ("clock", "Clock at end, MHz", "text"),
    ("temperature", "Temperature at end, °C", "text"),
    ("clock_events", "Clock-event reasons at end", "text"),
    ("seconds", "Check, s", "text"),
    ("verdict", "Verdict", "text"),
)


def _against(value: float | None, median: float | None) -> str | None:
    """A figure with its ratio to the median, "1.23 (0.500×)"; the figure alone where nothing was compared."""
    if value is None:
        return None
    return fmt_auto(value) if median is None else f"{fmt_auto(value)} ({fmt_auto(value / median)}×)"


def _state(value: float | None) -> str:
    """A reading at the end; why one is missing is said once, under the table (``describe_screen``)."""
    return fmt_int(value) if value is not None else "not reported"


def _clock_events(state: DeviceState) -> str:
    """The NVML clock-event reasons active at the end by name; "none" where none was."""
    if state.clock_event_reasons is None:
        return "not reported"
    active = sorted(name for name, on in state.clock_event_reasons.items() if on)
    return ", ".join(active) or "none"


def _link(verdict: NodeVerdict, screen: NodeScreen) -> str:
    if verdict.link is not None:
        return _against(verdict.link.busbw_gbps, screen.medians.get("link_busbw_gbps")) or ""
    if screen.reference == verdict.node:
        return "the reference node"
    return "not measured: one node, or prescreen.links is false"


def _row(verdict: NodeVerdict, device: DeviceFigures, screen: NodeScreen) -> dict[str, Any]:
    check, medians = verdict.check, screen.medians
    allreduce = (
        _against(check.allreduce.busbw_gbps, medians.get("allreduce_busbw_gbps"))
        if check.allreduce is not None
        else f"none: {check.allreduce_reason or 'no reason given'}"
    )
    return {
        "node": verdict.node,
        "device": f"{device.index}: {device.name}",
        # the repeats' spread beside the matmul: a figure's n and its scatter, (p90 - p10) / median
        "matmul": f"{_against(device.matmul_tflops, medians.get('matmul_tflops'))}; n {device.repeats}, spread {device.spread:.0%}",
        "memory": _against(device.memory_gbps, medians.get("memory_gbps")),
        "allreduce": allreduce,
        "link": _link(verdict, screen),
        "clock": _state(device.state.clock_mhz),
        "temperature": _state(device.state.temperature_c),
        "clock_events": _clock_events(device.state),
        "seconds": fmt_number(check.seconds),
        "verdict": "passed" if verdict.excluded_because is None else f"excluded: {verdict.excluded_because}",
    }


def rule_sentence(screen: NodeScreen) -> str:
    """The rule as applied, with its threshold and the reason for it."""
    why = f"because {screen.reason}" if screen.reason else "(no reason given: set prescreen.reason)"
    judged = ", ".join(SCREEN_FIGURES[name][0] for name in SCREEN_FIGURES if name in screen.medians) or "nothing"
    reference = f"; links are all-reduces with {screen.reference}" if screen.reference else ""
    return (
        f"A node below {screen.fraction:g} of the median of the nodes on any figure it has ({judged}; a node's figure is its "
        f"slowest device's{reference}) is excluded; the threshold is {screen.fraction:g} {why}."
    )


def describe_screen(screen: NodeScreen) -> dict[str, Any]:
    """The section's content from a screen."""
    medians = [
        f"{SCREEN_FIGURES.get(name, (name, ''))[0]} {fmt_auto(value)} {SCREEN_FIGURES.get(name, (name, ''))[1]}".strip()
        for name, value in screen.medians.items()
    ]
    excluded = [f"{verdict.node} ({verdict.excluded_because})" for verdict in screen.nodes if verdict.excluded_because is not None]
    return {
        "run": True,
        "not_run": None,
        "rule": rule_sentence(screen),
        "medians": medians,
        "excluded": excluded,
        "outcome": f"Excluded: {'; '.join(excluded)}." if excluded else f"Every node passed ({len(screen.nodes)} screened).",
        "note": screen.note,
        "rows": [_row(verdict, device, screen) for verdict in screen.nodes for device in verdict.check.devices],
        "unreported": sorted(
            {
                f"{verdict.node}, device {device.index}: {device.state.reason}"
                for verdict in screen.nodes
                for device in verdict.check.devices
                if device.state.reason
            }
        ),
        "columns": PRESCREEN_COLUMNS,
    }


def prescreen_section(screen_path: Path | None) -> dict[str, Any]:
    """The section: the screen at ``screen_path`` described, or the line a study without one shows.
    A file that is not a screen is a one-line error naming it (``record.node_check.read_screen``)."""
    if screen_path is None:
        return {
            "run": False,
            "not_run": NOT_RUN,
            "rule": None,
            "medians": [],
            "excluded": [],
            "outcome": None,
            "note": None,
            "rows": [],
            "unreported": [],
            "columns": PRESCREEN_COLUMNS,
        }
    return describe_screen(read_screen(screen_path))
