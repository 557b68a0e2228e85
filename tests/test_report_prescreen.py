"""The report's "Nodes screened" section (issue 68): the prescreen's screen rendered through the
report's entry point, as a reader sees it: the rule with its threshold and reason, the medians, the
excluded node with its figure and ratio, the one-node note; the line a study without the prescreen
shows; and a screen file that is not one refused in one line naming it."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from scalerepro.analysis.presentation import report
from scalerepro.analysis.presentation.formatting import fmt_auto
from scalerepro.planning import node_screen
from scalerepro.record.node_check import AllReduceFigure, DeviceFigures, DeviceState, LinkCheck, NodeCheck, NodeScreen

from report_study import REFERENCES, TEMPLATES, render_study, section, write_study

REASON = "a node 10 % slower holds back every synchronous step"


def _gpu_check(node: str, tflops: float, busbw: float | None = 180.0, temperature: float = 61.0) -> NodeCheck:
    """A two-GPU node as the check records it: the second card a little slower, its clock events named."""

    def device(index: int, scale: float) -> DeviceFigures:
        state = DeviceState(clock_mhz=1980.0, temperature_c=temperature, power_w=690.0, clock_event_reasons={"sw_power_cap": index == 1, "hw_slowdown": False})
        return DeviceFigures(
            index=index, name="NVIDIA H100 80GB HBM3", matmul_tflops=tflops * scale, matmul_size=8192, memory_gbps=2900.0, memory_bytes=1 << 30,
            repeats=9, spread=0.01, state=state,
        )  # fmt: skip

    allreduce = AllReduceFigure(ranks=2, size_bytes=1 << 28, backend="nccl", busbw_gbps=busbw, time_s=0.004) if busbw is not None else None
    return NodeCheck(
        schema_version=1,
        node=node,
        started_at="2026-12-08T00:00:00Z",
        device_type="cuda",
        precision="bf16",
        cores=16,
        seconds=42.5,
        devices=[device(0, 1.0), device(1, 0.99)],
        allreduce=allreduce,
        allreduce_reason=None if allreduce else "one rank on the node: no all-reduce within it",
    )


def _cpu_check(node: str) -> NodeCheck:
    device = DeviceFigures(
        index=0, name="cpu", matmul_tflops=0.2, matmul_size=512, memory_gbps=20.0, memory_bytes=1 << 28, repeats=9, spread=0.02,
        state=DeviceState(clock_mhz=2400.0, reason="a CPU reports no temperature or power here"),
    )  # fmt: skip
    return NodeCheck(
        schema_version=1, node=node, started_at="2026-12-08T00:00:00Z", device_type="cpu", precision="fp32", cores=2, seconds=3.0,
        devices=[device], allreduce=None, allreduce_reason="one rank on the node: no all-reduce within it",
    )  # fmt: skip


def _write(screen: NodeScreen, path: Path) -> Path:
    path.write_text(json.dumps(screen.model_dump(mode="json")))
    return path


def _render(tmp_path: Path, *extra: str) -> tuple[int, str]:
    paths = write_study(tmp_path / "study")
    out = tmp_path / "report" / "index.html"
    argv = ["--tables", str(paths["tables"]), "--plots", str(paths["plots"]), "--inventory", str(paths["inventory"]), "--config", str(paths["config"])]
    code = report.main([*argv, "--references", str(REFERENCES), "--templates", str(TEMPLATES), "--out", str(out), *extra])
    return code, out.read_text(encoding="utf-8") if out.is_file() else ""


def text(fragment: str) -> str:
    """A fragment as a reader sees it: tags dropped, entities and spaces resolved."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def test_an_excluded_node_is_named_with_its_figure_and_ratio_under_the_rule_and_its_reason(tmp_path):
    checks = [_gpu_check("gpu-a01", 700.0), _gpu_check("gpu-a02", 500.0), _gpu_check("gpu-a03", 710.0, busbw=120.0)]
    screen = node_screen.judge(checks, 0.9, REASON)
    assert screen.excluded == ["gpu-a02", "gpu-a03"]  # the case: one slow at matmul, one slow on its link
    code, page = _render(tmp_path, "--prescreen", str(_write(screen, tmp_path / "screen.json")))
    assert code == 0
    shown = text(section(page, "prescreen"))
    # the rule in one sentence, the threshold with its reason, and the medians with their units
    assert "A node below 0.9 of the median of the nodes on any figure it has (matmul, memory copy, within-node all-reduce bus bandwidth" in shown
    assert f"the threshold is 0.9 because {REASON}" in shown
    median_tflops = screen.medians["matmul_tflops"]  # the slowest device's of each node: 693 (700 x 0.99)
    assert f"Medians: matmul {fmt_auto(median_tflops)} TFLOP/s; memory copy 2,900 GB/s; within-node all-reduce bus bandwidth 180.0 GB/s." in shown
    # the excluded nodes named, each with the figure and the ratio that excluded it
    assert shown.count("Excluded: gpu-a02 (matmul_tflops 495 TFLOP/s, 0.71 of the median") == 1
    assert "gpu-a03 (allreduce_busbw_gbps 120 GB/s, 0.67 of the median 180)" in shown
    assert "Every node passed" not in shown
    # one row per node and device: each figure with its ratio to the median, the card's state at the end
    rows = re.findall(r"<tr>(.*?)</tr>", section(page, "prescreen"), re.S)
    cells = [[text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]
    body = [row for row in cells if row]
    assert [row[:2] for row in body] == [[node, f"{i}: NVIDIA H100 80GB HBM3"] for node in ("gpu-a01", "gpu-a02", "gpu-a03") for i in (0, 1)]
    slow = body[3]  # gpu-a02's second card: 500 x 0.99 TFLOP/s
    assert slow[2].startswith(f"495.0 ({fmt_auto(495 / median_tflops)}×); n ") and slow[3] == "2,900 (1.00×)" and slow[4] == "180.0 (1.00×)"
    assert slow[5] == "not measured: one node, or prescreen.links is false"
    assert slow[6:10] == ["1,980", "61", "sw_power_cap", "42.5"] and slow[10].startswith("excluded: matmul_tflops 495 TFLOP/s")
    assert body[0][8] == "none" and body[0][10] == "passed"
    assert body[4][4] == "120.0 (0.667×)"


def test_one_node_says_it_had_no_peers_and_unreported_figures_say_why(tmp_path):
    screen = node_screen.judge([_cpu_check("laptop")], 0.9, REASON)
    code, page = _render(tmp_path, "--prescreen", str(_write(screen, tmp_path / "screen.json")))
    assert code == 0
    shown = text(section(page, "prescreen"))
    assert "Every node passed (1 screened)." in shown and "one node: no peers to judge it against, so it passes." in shown
    row = [text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", section(page, "prescreen"), re.S)]
    assert row[4] == "none: one rank on the node: no all-reduce within it"
    assert row[6] == "2,400" and row[7] == row[8] == "not reported"
    assert "Not reported: laptop, device 0: a CPU reports no temperature or power here." in shown  # why, said once


def test_without_the_prescreen_the_section_says_it_was_not_run(tmp_path):
    paths = write_study(tmp_path / "study")
    page = render_study(paths, tmp_path / "report" / "index.html")
    shown = text(section(page, "prescreen"))
    assert shown.startswith(f"{report.section_numbers()['prescreen']} Nodes screened")
    assert "not run: the study kept no prescreen screen" in shown and "<table" not in section(page, "prescreen")
    # placed before the scaling results
    assert page.index('<section id="prescreen">') < page.index('<section id="results">')


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ({"fraction": 0.9, "medians": {}, "nodes": [{"node": "n1"}]}, "not a prescreen screen"),
        ("[1, 2]", "holds a JSON list, not an object"),
        ("{", "is not JSON"),
    ],
)
def test_a_screen_that_is_not_one_is_a_one_line_error_naming_the_file(tmp_path, capsys, content, said):
    path = tmp_path / "screen.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    code, page = _render(tmp_path, "--prescreen", str(path))
    err = capsys.readouterr().err.strip()
    assert code == 2 and page == ""
    assert "\n" not in err and err.startswith("scalerepro.analysis.presentation.report: error: ") and str(path) in err and said in err
    assert "snakemake --forcerun prescreen" in err


def test_links_show_against_their_median_and_the_reference_is_named(tmp_path):
    def link(node: str, busbw: float) -> LinkCheck:
        return LinkCheck(
            schema_version=1,
            node=node,
            reference="gpu-a01",
            hostnames=sorted({"gpu-a01", node}),
            started_at="2026-12-08T00:00:00Z",
            ranks=16,
            backend="nccl",
            size_bytes=256 << 20,
            busbw_gbps=busbw,
            time_s=0.01,
        )

    checks = [_gpu_check(f"gpu-a0{i}", 700.0) for i in range(1, 5)]
    screen = node_screen.judge(checks, 0.9, REASON, links=[link("gpu-a02", 190.0), link("gpu-a03", 95.0), link("gpu-a04", 188.0)])
    code, page = _render(tmp_path, "--prescreen", str(_write(screen, tmp_path / "screen.json")))
    assert code == 0
    shown = text(section(page, "prescreen"))
    assert "links are all-reduces with gpu-a01" in shown and "Excluded: gpu-a03 (link_busbw_gbps 95 GB/s, 0.51 of the median 188)" in shown
    rows = [[text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in re.findall(r"<tr>(.*?)</tr>", section(page, "prescreen"), re.S)]
    body = [row for row in rows if row]
    assert body[0][5] == "the reference node" and body[4][5] == "95.00 (0.505×)"
