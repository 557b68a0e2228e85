"""The prescreen's rule: which nodes the scaling runs may use.

One slow node decides a synchronous job's step, so every node the study will use is measured
alone first (``scalerepro.training.node_check``: a dense matmul and a memory copy on each device,
an all-reduce within the node) and judged against its peers, not against a datasheet: a node
whose figure is below ``fraction`` of the nodes' median on any figure is excluded. A node is as
fast as its slowest device, so a node's figure is its slowest device's. The median, not the mean
or the best, so that one slow node cannot drag the bar down with it; the fraction is the
config's (``prescreen.fraction``, with its reason there).

With one node there are no peers: it passes, and the screen says so. With fewer passing nodes
than the study's largest count needs, the study stops before its first training job, with one
line naming the excluded nodes and their figures (``ScreenError``).

The screen (``record.node_check.NodeScreen``, written as results/prescreen/screen.json) is what the submission
reads (``excluded``) and what the report shows. Standard library and pydantic only.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import read_json_object, write_json_atomically
from scalerepro.record.node_check import SCREEN_FIGURES, LinkCheck, NodeCheck, NodeScreen, NodeVerdict

Record = TypeVar("Record", NodeCheck, LinkCheck)

_PROG = "scalerepro.planning.node_screen"


class ScreenError(CommandError):
    """Too few nodes passed, or a node's record cannot be read: one line naming it and the fix."""


# Each figure the rule judges (record.node_check.SCREEN_FIGURES), as a node's value: its slowest
# device's, or None where the node has none (one rank: no all-reduce within it).
NODE_FIGURE: dict[str, Callable[[NodeCheck], float | None]] = {
    "matmul_tflops": lambda check: min(device.matmul_tflops for device in check.devices),
    "memory_gbps": lambda check: min(device.memory_gbps for device in check.devices),
    "allreduce_busbw_gbps": lambda check: check.allreduce.busbw_gbps if check.allreduce is not None else None,
}


def judge(checks: Sequence[NodeCheck], fraction: float, reason: str | None = None, links: Sequence[LinkCheck] = ()) -> NodeScreen:
    """Each node's figures against the median of the nodes that have that figure: excluded below
    ``fraction`` of it on any. A node's link figure is its all-reduce with the reference node."""
    if len({check.node for check in checks}) != len(checks):
        raise ScreenError("two prescreen records name the same node: remove the stale one from results/prescreen/nodes and rerun the prescreen")
    by_node = {check.node: check for check in checks}
    link_of = _links_by_node(links, by_node)
    values = {check.node: {name: value for name, of in NODE_FIGURE.items() if (value := of(check)) is not None} for check in checks}
    for node, link in link_of.items():
        values[node]["link_busbw_gbps"] = link.busbw_gbps
    medians = {name: statistics.median(v[name] for v in values.values() if name in v) for name in SCREEN_FIGURES if any(name in v for v in values.values())}
    verdicts = []
    for node, figures in sorted(values.items()):
        ratios = {name: value / medians[name] for name, value in figures.items()}
        low = [
            f"{name} {figures[name]:.3g} {SCREEN_FIGURES[name][1]}, {ratios[name]:.2f} of the median {medians[name]:.3g}"
            for name in SCREEN_FIGURES
            if name in ratios and ratios[name] < fraction
        ]
        verdicts.append(
            NodeVerdict(node=node, figures=figures, ratios=ratios, excluded_because="; ".join(low) or None, check=by_node[node], link=link_of.get(node))
        )
    note = "one node: no peers to judge it against, so it passes" if len(checks) == 1 else None
    reference = next(iter(link_of.values())).reference if link_of else None
    return NodeScreen(fraction=fraction, reason=reason, medians=medians, nodes=verdicts, note=note, reference=reference)


def _links_by_node(links: Sequence[LinkCheck], checks: dict[str, NodeCheck]) -> dict[str, LinkCheck]:
    """Each screened node's link record, refused where it is not a link between that node and the
    one reference every link shares, as its ranks saw the nodes they ran on."""
    found: dict[str, LinkCheck] = {}
    for link in links:
        if link.node not in checks or link.reference not in checks:
            raise ScreenError(
                f"a link record names {link.reference} <-> {link.node}, not two of the screened nodes: remove it from results/prescreen/links and rerun the prescreen"
            )
        if link.hostnames != sorted({link.node, link.reference}):
            raise ScreenError(
                f"the link record of {link.node} ran on {', '.join(link.hostnames)}, not on {link.reference} and {link.node}: "
                "its figure is not that link's; rerun the prescreen (snakemake --forcerun prescreen_link)"
            )
        if link.node in found:
            raise ScreenError(f"two link records name {link.node}: remove the stale one from results/prescreen/links and rerun the prescreen")
        found[link.node] = link
    if len({link.reference for link in found.values()}) > 1:
        raise ScreenError("the link records name different reference nodes: remove results/prescreen/links and rerun the prescreen")
    return found


def require(screen: NodeScreen, needed: int) -> None:
    """Stop the study before its first training job where fewer nodes passed than it needs."""
    if len(screen.passed) >= needed:
        return
    why = "; ".join(f"{verdict.node}: {verdict.excluded_because}" for verdict in screen.nodes if verdict.excluded_because)
    raise ScreenError(
        f"{len(screen.passed)} of {len(screen.nodes)} nodes passed the prescreen and the study's largest count needs {needed} "
        f"(threshold {screen.fraction:g} of the median): {why}; mend or replace those nodes, lower the study's largest count, "
        "or set prescreen.fraction lower with a reason"
    )


def read_records(paths: Sequence[Path], model: type[Record]) -> list[Record]:
    """Each node's (or link's) record, checked against ``model``: a file that is not one is refused
    by name."""
    records = []
    for path in paths:
        try:
            records.append(model.model_validate(read_json_object(path, "prescreen record")))
        except (ValueError, ValidationError) as error:
            first = str(error).splitlines()[0]
            raise ScreenError(f"{path}: not a prescreen record ({first}); delete it and rerun the prescreen (snakemake --forcerun prescreen)") from None
    return records


@error_boundary(_PROG)
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog=_PROG, description="Judge the prescreened nodes against their median; write the screen.")
    parser.add_argument("checks", type=Path, nargs="+", help="each node's prescreen record")
    parser.add_argument("--fraction", type=float, required=True, help="a node below this fraction of the median on any figure is excluded")
    parser.add_argument("--links", type=Path, nargs="*", default=[], help="each node's link record (its all-reduce with the reference node)")
    parser.add_argument("--reason", help="why that fraction (shown with the screen)")
    parser.add_argument("--need-nodes", type=int, default=1, help="the nodes the study's largest count needs")
    parser.add_argument("--out", type=Path, required=True, help="the screen (JSON)")
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1:
        raise ScreenError(f"--fraction {args.fraction:g} is outside (0, 1]: set prescreen.fraction to a share of the median, such as 0.9")
    screen = judge(read_records(args.checks, NodeCheck), args.fraction, args.reason, read_records(args.links, LinkCheck))
    write_json_atomically(args.out, screen.model_dump(mode="json"))
    for verdict in screen.nodes:
        print(f"prescreen {verdict.node}: {'excluded: ' + verdict.excluded_because if verdict.excluded_because else 'passed'}")
    require(screen, args.need_nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
