"""The prescreen's rule (scalerepro.planning.node_screen): a node below the fraction of its peers'
median on any figure is excluded and named; too few passing nodes stop the study in one line."""

from __future__ import annotations

import json

import pytest

from scalerepro.planning import node_screen
from scalerepro.record.node_check import AllReduceFigure, DeviceFigures, DeviceState, LinkCheck, NodeCheck, read_screen


def _check(node: str, tflops: float, gbps: float = 20.0, busbw: float | None = None, devices: int = 1) -> NodeCheck:
    device = DeviceFigures(
        index=0,
        name="cpu",
        matmul_tflops=tflops,
        matmul_size=512,
        memory_gbps=gbps,
        memory_bytes=1 << 28,
        repeats=9,
        spread=0.02,
        state=DeviceState(reason="a CPU"),
    )
    allreduce = AllReduceFigure(ranks=2, size_bytes=1 << 26, backend="gloo", busbw_gbps=busbw, time_s=0.01) if busbw is not None else None
    return NodeCheck(
        schema_version=1,
        node=node,
        started_at="2026-12-08T00:00:00Z",
        device_type="cpu",
        precision="fp32",
        cores=2,
        seconds=3.0,
        devices=[device.model_copy(update={"index": i}) for i in range(devices)],
        allreduce=allreduce,
        allreduce_reason=None if allreduce else "one rank on the node: no all-reduce within it",
    )


def test_a_node_below_the_fraction_of_the_median_is_excluded_with_its_figure():
    screen = node_screen.judge([_check("node01", 0.1), _check("node02", 0.2), _check("node03", 0.21)], 0.9)
    assert screen.medians["matmul_tflops"] == pytest.approx(0.2)
    assert screen.excluded == ["node01"] and screen.passed == ["node02", "node03"]
    why = screen.nodes[0].excluded_because
    assert why is not None and "matmul_tflops 0.1 TFLOP/s, 0.50 of the median 0.2" in why
    # at the threshold exactly a node passes
    assert node_screen.judge([_check("a", 0.9), _check("b", 1.0), _check("c", 1.0)], 0.9).excluded == []


def test_a_slow_link_alone_excludes_its_node():
    screen = node_screen.judge([_check("node01", 1.0, busbw=2.0), _check("node02", 1.0, busbw=5.0), _check("node03", 1.0, busbw=5.1)], 0.9)
    assert screen.excluded == ["node01"] and "allreduce_busbw_gbps" in (screen.nodes[0].excluded_because or "")


def test_a_figure_is_judged_among_the_nodes_that_have_it():
    checks = [_check("node01", 1.0, busbw=2.0), _check("node02", 1.0), _check("node03", 1.0, busbw=5.1), _check("node04", 1.0, busbw=5.0)]
    screen = node_screen.judge(checks, 0.9)
    assert screen.medians["allreduce_busbw_gbps"] == pytest.approx(5.0) and screen.excluded == ["node01"]
    assert "allreduce_busbw_gbps" not in screen.nodes[1].ratios  # node02 has one rank: nothing to judge


def _link(node: str, busbw: float, reference: str = "node01", hostnames: list[str] | None = None) -> LinkCheck:
    return LinkCheck(
        schema_version=1,
        node=node,
        reference=reference,
        hostnames=hostnames or sorted({node, reference}),
        started_at="2026-12-08T00:00:00Z",
        ranks=8,
        backend="gloo",
        size_bytes=1 << 26,
        busbw_gbps=busbw,
        time_s=0.1,
    )


def test_a_slow_link_to_the_reference_excludes_its_node_and_not_the_reference():
    checks = [_check(f"node0{i}", 1.0) for i in range(1, 5)]
    screen = node_screen.judge(checks, 0.9, links=[_link("node02", 2.0), _link("node03", 10.0), _link("node04", 10.2)])
    assert screen.reference == "node01" and screen.excluded == ["node02"]
    assert "link_busbw_gbps 2 GB/s, 0.20 of the median 10" in (screen.nodes[1].excluded_because or "")
    assert screen.nodes[0].link is None and "link_busbw_gbps" not in screen.nodes[0].figures


def test_a_link_record_from_other_nodes_is_refused():
    # the ranks ran on node01 and node03, but the record says it is node02's link: not its figure
    checks = [_check(f"node0{i}", 1.0) for i in range(1, 4)]
    with pytest.raises(node_screen.ScreenError, match="ran on node01, node03, not on node01 and node02"):
        node_screen.judge(checks, 0.9, links=[_link("node02", 10.0, hostnames=["node01", "node03"])])
    with pytest.raises(node_screen.ScreenError, match="different reference nodes"):
        node_screen.judge(checks, 0.9, links=[_link("node02", 10.0), _link("node03", 10.0, reference="node02")])


def test_one_node_passes_and_says_it_had_no_peers():
    screen = node_screen.judge([_check("only", 0.01)], 0.9)
    assert screen.passed == ["only"] and screen.note and "no peers" in screen.note


def test_too_few_passing_nodes_stop_the_study_in_one_line_naming_them(tmp_path, capsys):
    paths = []
    for check in (_check("node01", 0.05), _check("node02", 0.2)):
        path = tmp_path / f"{check.node}.json"
        path.write_text(json.dumps(check.model_dump(mode="json")))
        paths.append(str(path))
    out = tmp_path / "screen.json"
    assert node_screen.main([*paths, "--fraction", "0.9", "--out", str(out)]) == 0  # one node is enough
    assert read_screen(out).excluded == ["node01"]
    capsys.readouterr()
    assert node_screen.main([*paths, "--fraction", "0.9", "--need-nodes", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "1 of 2 nodes passed" in err and "needs 2" in err and "node01" in err and "prescreen.fraction" in err


def test_a_file_that_is_no_record_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "node01.json"
    bad.write_text(json.dumps({"schema_version": 1, "node": "node01"}))
    assert node_screen.main([str(bad), "--fraction", "0.9", "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(bad) in err and "not a prescreen record" in err
