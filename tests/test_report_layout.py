"""The report as a reader's browser lays it out (issue 33, points 7 and 8).

Point 7, on the reports a GPU user reads (``h100_report``: the kept H100 records, rendered; and the
kept one-H100 study of 2026-11-27, rebuilt): at a 1400 px window no table runs past its box, a figure with no data is one line with its reason
(not a large empty box), the GPU/NIC topology shows no raw terminal escapes, and the cost section's
sentence says the figures its table shows.

Point 8, on CPU studies built from records by the real aggregation, figures and report: headers
and axes count ranks, not GPUs; loss and accuracy curves of runs too short to learn say so; the
ablation's bars carry their intervals; the sensitivity heatmap's colours do not make two cells
a few per cent apart within their noise look like opposite ends of the scale.
"""

from __future__ import annotations

import html
import json
import os
import re
import stat
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalerepro.analysis.presentation import formatting, inputs, plots, report
from scalerepro.analysis.tables import aggregate
from scalerepro.telemetry import inventory

from analysis_fixtures import REPO, Study, write_gpu_study
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, kept_study_rebuilt_once
from report_study import CHROMIUM, Chromium

REFERENCES = REPO / "config" / "references.yaml"
TEMPLATES = REPO / "report"
KEPT_H100_INVENTORY = REPO / "benchmarks" / "gpu" / "h100-2026-11-25" / "system.json"
KEPT_H100_STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "study-results"


def section(page: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}">(.*?)</section>', page, re.S)
    assert match, f"no section {section_id}"
    return match.group(1)


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


# --------------------------------------------------------------------------------------------
# Point 7: the H100 report at 1400 px
# --------------------------------------------------------------------------------------------

# Every table of the page with every <details> open: how wide it is against the box it scrolls
# in (scrollWidth > clientWidth: columns hidden past the box's right edge), and the one-line
# figures' heights.
LAYOUT_JS = r"""(() => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  const tables = [...document.querySelectorAll('table')].map(table => {
    let box = table.parentElement;
    while (box && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) box = box.parentElement;
    const headers = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    return {section: table.closest('section[id]').id, headers: headers.slice(0, 4).join(' | '),
            scrolls_in_box: !!box && box.tagName !== 'HTML',
            hidden_px: box ? box.scrollWidth - box.clientWidth : null};
  });
  const folded = [...document.querySelectorAll('figure.plot.not-drawn')].map(f => Math.round(f.getBoundingClientRect().height));
  return JSON.stringify({page_width: document.documentElement.scrollWidth, tables, folded});
})()"""


def browser_layout(page: Path, width: int) -> dict:
    with_profile = page.parent / f"chromium-{width}"
    browser = Chromium(with_profile / "profile", with_profile.with_suffix(".log"))
    try:
        session = browser.open_page(page.as_uri(), width, 1000)
        result = browser.call("Runtime.evaluate", {"expression": LAYOUT_JS, "returnByValue": True}, session)
        return json.loads(result["result"]["value"])
    finally:
        browser.close()


@pytest.fixture(scope="module")
def kept_study(tmp_path_factory) -> RebuiltStudy:
    """The one-H100 study of 2026-11-27 rebuilt: its scaling model predicts every model at 8, 16 and 64 GPUs."""
    return kept_study_rebuilt_once(tmp_path_factory, KEPT_H100_STUDY)


@REBUILDS_A_STUDY
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
@pytest.mark.parametrize("report_of", ["records", "study"])
def test_at_1400_px_no_table_runs_past_its_box_and_empty_figures_are_one_line(report_of, h100_report, kept_study, tmp_path):
    page = tmp_path / "index.html"
    page.write_text(h100_report.html if report_of == "records" else kept_study.html)  # a copy beside the browser's profile
    layout = browser_layout(page, 1400)
    assert layout["page_width"] == 1400  # nothing widens the page itself
    tables = layout["tables"]
    assert len(tables) >= 10 and {"results", "comparison", "failures"} <= {t["section"] for t in tables}
    # each table in a box of its own that scrolls sideways (a narrower window scrolls there)...
    assert all(t["scrolls_in_box"] for t in tables), [t for t in tables if not t["scrolls_in_box"]]
    # ...and at 1400 px none needs to: the per-run measurements and the comparison were cut off
    hidden = [t for t in tables if t["hidden_px"] > 0]
    assert not hidden, hidden
    # each figure without data is one line (the multi-GPU sections of these one-GPU reports are a line
    # each with no figure: tests/test_one_gpu_report.py)
    assert layout["folded"] and max(layout["folded"]) < 50, layout["folded"]


# The section each figure of a multi-GPU section is shown in: a one-GPU report says that section in
# one line, without its figures.
MULTI_GPU_FIGURES = {
    "throughput_vs_gpus": "scaling",
    "efficiency_vs_gpus": "scaling",
    "weak_epoch_time": "scaling",
    "loss_waterfall": "why-not-faster",
    "sensitivity_heatmap": "sensitivity",
    "busbw_vs_size": "communication",
    "predicted_vs_measured_efficiency": "scaling-model",
}


def test_a_figure_drawn_without_data_is_a_line_with_its_reason_not_an_image(h100_report):
    page = h100_report.html
    plots_dir = h100_report.out / "plots"
    for name in report.FIGURE_NAMES:
        why = inputs.not_measured_note((plots_dir / f"{name}.svg").read_bytes(), "svg")
        figure = re.search(rf'<figure class="plot[^"]*" id="fig-{name}">(.*?)</figure>', page, re.S)
        if figure is None:  # shown nowhere: only in a multi-GPU section this one-GPU report says in a line
            assert why is not None and f'<h3 id="{MULTI_GPU_FIGURES[name]}" class="run-in">' in page, name
            continue
        if why is None:  # drawn from data: embedded
            assert "<img" in figure.group(1), name
            continue
        # the placeholder's PNG says the same as its SVG (the report falls back to the PNG)
        assert inputs.not_measured_note((plots_dir / f"{name}.png").read_bytes(), "png") == why
        assert 'class="plot not-drawn"' in figure.group(0) and "<img" not in figure.group(1), name
        assert html.escape(why, quote=False) in figure.group(1) and "not measured" in figure.group(1)
    scaling = re.search(r'<h3 id="scaling" class="run-in">(.*?)<h3 id="why-not-faster"', page, re.S).group(1)
    assert "not measured — every run used 1 GPU, so nothing was scaled" in text_of(scaling) and "<figure" not in scaling


def test_a_figure_with_data_is_never_taken_for_a_placeholder(tmp_path):
    """The note is the placeholder's own metadata: a real figure carries none, whatever it shows."""
    from matplotlib import pyplot

    fig, ax = pyplot.subplots()
    ax.set_title("not measured: a title is not a note")
    for extension in ("svg", "png"):
        fig.savefig(tmp_path / f"drawn.{extension}")
        assert inputs.not_measured_note((tmp_path / f"drawn.{extension}").read_bytes(), extension) is None
    pyplot.close(fig)
    assert report.load_figure(tmp_path, "drawn").uri is not None


def kept_topology() -> str:
    """``nvidia-smi topo -m`` of the H100 host as its inventory kept it: real output, with the ANSI
    escapes (ESC[4m ... ESC[0m) that underline its header row."""
    text = json.loads(KEPT_H100_INVENTORY.read_text(encoding="utf-8"))["nvidia_smi_topo"]
    assert "\x1b[4m" in text and "GPU0" in text  # the defect, as the GPU user saw it
    return text


def test_the_topology_block_shows_no_terminal_escapes(h100_report, tmp_path):
    topology = kept_topology()
    system = tmp_path / "system.json"
    # the inventory kept beside the records (of their machine: the report shows no other), its topology as captured raw
    kept = json.loads(KEPT_H100_INVENTORY.read_text())
    system.write_text(json.dumps({**kept, "nvidia_smi_topo": topology, "nvidia_smi_topo_reason": None}))
    out = h100_report.out
    page = report.render(out / "tables", out / "plots", system, None, REFERENCES, TEMPLATES)
    block = re.search(r'id="inventory-nvidia-smi-topo">.*?<pre class="block">(.*?)</pre>', section(page, "system"), re.S).group(1)
    assert "\x1b" not in block and "[4m" not in block and "[0m" not in block
    assert "GPU0\tCPU Affinity\tNUMA Affinity" in html.unescape(block)  # the table itself is kept


def test_the_inventory_captures_the_topology_without_terminal_escapes(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({kept_topology()!r})\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    text, reason = inventory.nvidia_smi_topology()
    assert reason is None and "\x1b" not in text
    assert text.startswith("\tGPU0\tCPU Affinity") and "Legend:" in text


def test_the_cost_sentence_says_the_figures_of_its_table(h100_report):
    cost = section(h100_report.html, "cost")
    sentence = text_of(re.search(r'<p class="lead">(.*?)</p>', cost, re.S).group(1))
    total = [text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", re.search(r"<tfoot>(.*?)</tfoot>", cost, re.S).group(1))]
    runs, gpu_hours, node_hours, gpu_requested, node_requested = total
    assert f"used {gpu_hours} GPU-hours ({node_hours} node-hours) over {runs} runs" in sentence, (sentence, total)
    assert float(gpu_hours) == pytest.approx(pd.read_csv(h100_report.out / "tables" / "cost.csv")["gpu_hours_used"].iloc[-1], rel=0.02)
    # runs rebuilt from their records have no time limit: the request is unknown, not 0
    assert gpu_requested == node_requested == formatting.MISSING and "not known" in sentence


# --------------------------------------------------------------------------------------------
# Point 8: CPU studies
# --------------------------------------------------------------------------------------------


def write_short_cpu_study(root: Path) -> dict:
    """The README's CPU study in small: ResNet-18 on 1 and 2 gloo ranks for a handful of steps (a
    loss that has not left chance level), a sensitivity sweep whose two cells are 8 % apart with
    CVs near 40 %, and an ablation of three repeats a variant."""
    s = Study(root)
    cpu = {"device_type": "cpu", "device_name": "AMD EPYC"}
    for gpus, throughputs in ((1, (40, 50, 60)), (2, (80, 90, 100))):
        for repeat, samples_per_s in enumerate(throughputs, 1):
            run_id = s.add("strong", gpus, repeat, model="resnet18_cifar", samples_per_s=samples_per_s, **cpu)
            path = root / "runs" / f"{run_id}.json"
            record = json.loads(path.read_text())
            # 3 warm-up steps and a few measured ones: the loss wanders about ln(10), as it did
            record["loss_log"] = [{"step": step, "loss": loss, "samples_per_s": samples_per_s} for step, loss in ((6, 2.351), (10, 2.251), (15, 2.264))]
            record["history"] = [{"epoch": 0, "step": 15, "complete": False, "train_loss": 2.29, "eval_loss": 2.28, "eval_accuracy": 0.17}]
            path.write_text(json.dumps(record))
    for bucket, throughputs in ((1, (600, 1000, 1400)), (25, (680, 1080, 1480))):
        for repeat, samples_per_s in enumerate(throughputs, 1):
            s.add("sensitivity", 2, repeat, model="cnn", variant=f"bucket{bucket}-batch32", bucket_cap_mb=bucket, samples_per_s=samples_per_s, **cpu)
    for variant, throughputs in (("baseline", (90, 100, 110)), ("all", (120, 130, 160))):
        for repeat, samples_per_s in enumerate(throughputs, 1):
            s.add("ablation", 2, repeat, model="cnn", variant=variant, samples_per_s=samples_per_s, **cpu)
    (root / "references.yaml").write_text("references: []\n")
    return {"matrix_path": s.write_matrix(), "comm_paths": [], "references_path": root / "references.yaml"}


def tables_of(args: dict, root: Path) -> Path:
    targets = {
        "checks": {
            "optimisation_gain": {
                "description": "optimisation gain",
                "table": "ablation",
                "where": {"variant": "all"},
                "metric": "gain",
                "direction": "min",
                "threshold": 0.1,
            }
        }
    }
    out = root / "tables"
    aggregate.write_tables(aggregate.aggregate(**args, targets=targets), out)
    return out


@pytest.fixture(scope="module")
def cpu_study(tmp_path_factory) -> tuple[Path, dict, str]:
    """The short CPU study's tables, its figures as plots draws them, and its rendered report."""
    root = tmp_path_factory.mktemp("cpu-study")
    tables = tables_of(write_short_cpu_study(root / "records"), root)
    outcome = plots.draw(plots.read_tables(tables), root / "plots")
    page = report.render(tables, root / "plots", None, None, REFERENCES, TEMPLATES)
    return tables, outcome, page


def headers(fragment: str) -> list[str]:
    return [text_of(header) for header in re.findall(r"<th[^>]*>(.*?)</th>", fragment, re.S)]


def results_own(page: str) -> str:
    """Section 3 up to the scaling-model and profiling subsections it includes (templates of
    their own)."""
    return section(page, "results").split('<h3 id="scaling-model">')[0]


def test_a_cpu_study_counts_ranks_in_headers_titles_and_axes(cpu_study, tmp_path):
    tables, _, page = cpu_study
    shown = headers(results_own(page)) + headers(section(page, "cost"))
    assert {"Ranks", "Samples/s per rank", "Batch per rank", "Rank-hours used"} <= set(shown), shown
    assert not [h for h in shown if "GPU" in h], shown
    assert "Throughput vs ranks" in text_of(results_own(page)) and "all ranks" in text_of(results_own(page))
    assert re.search(r"used [\d.]+ rank-hours \(", text_of(section(page, "cost")))
    # the headline's configurations too: a batch per rank (the README study's said "batch 8/GPU")
    summary = text_of(section(page, "summary"))
    assert re.search(r"batch [\d,]+/rank", summary) and not re.search(r"batch [\d,]+/GPU", summary)
    assert "the rank count" in text_of(results_own(page)) and not re.search(r"GPU count|per-GPU", text_of(results_own(page)))
    figure = plots.throughput_vs_gpus(plots.read_tables(tables))
    assert figure.axes[0].get_xlabel() == "ranks" and "all ranks" in figure.axes[0].get_ylabel()
    # a GPU study keeps its GPUs
    gpu_page = report.render(tables_of(write_gpu_study(tmp_path / "gpu"), tmp_path), None, None, None, REFERENCES, TEMPLATES)
    gpu_headers = headers(results_own(gpu_page)) + headers(section(gpu_page, "cost"))
    assert {"GPUs", "Samples/s per GPU", "GPU-hours used"} <= set(gpu_headers) and not [h for h in gpu_headers if "rank" in h.lower()]
    assert "GPU-hours (" in text_of(section(gpu_page, "cost")) and "all GPUs" in text_of(results_own(gpu_page))


def test_curves_of_runs_too_short_to_learn_say_so_instead_of_plotting_noise(cpu_study, tmp_path):
    tables, outcome, page = cpu_study
    for name in ("loss_curves", "accuracy_curves"):
        assert outcome[name].startswith("not measured: the runs are too short to learn"), outcome[name]
        line = re.search(rf'<figure class="plot not-drawn" id="fig-{name}">(.*?)</figure>', page, re.S)
        assert line and "too short to learn" in line.group(1) and "<img" not in line.group(1)
    assert "2.35 → 2.26 over steps 6–15" in outcome["loss_curves"]  # the figures it judged by
    # a run whose loss did fall is plotted, short or not
    learning = plots.read_tables(tables)
    learning["loss_log"] = learning["loss_log"].assign(loss=lambda f: f["loss"] * np.where(f["step"].eq(15), 0.8, 1.0))
    assert plots.loss_curves(learning).axes


def test_ablation_bars_carry_their_intervals(cpu_study):
    tables, _, _ = cpu_study
    ablation = pd.read_csv(tables / "ablation.csv").set_index("variant")
    assert ablation.loc["all", ["gain_ci_low", "gain_ci_high"]].notna().all()
    figure = plots.ablation_gain(plots.read_tables(tables))
    (ax,) = [ax for ax in figure.axes if ax.get_title()]
    spans = [
        tuple(sorted(segment[:, 1]))
        for container in ax.containers
        if hasattr(container, "has_yerr") and container.has_yerr
        for segment in container.lines[2][0].get_segments()
    ]
    low, high = 100 * ablation.loc["all", "gain_ci_low"], 100 * ablation.loc["all", "gain_ci_high"]
    assert spans == [pytest.approx((low, high))], (spans, low, high)
    assert any("95 % interval" in text.get_text() for legend in figure.legends for text in legend.get_texts())


def test_the_sensitivity_heatmap_does_not_paint_noise_as_extremes(cpu_study):
    tables, _, _ = cpu_study
    cells = pd.read_csv(tables / "sensitivity.csv").set_index("bucket_cap_mb")
    assert cells.loc[25, "samples_per_s_median"] / cells.loc[1, "samples_per_s_median"] == pytest.approx(1.08)
    assert (cells["samples_per_s_cv"] > 0.35).all()
    figure = plots.sensitivity_heatmap(plots.read_tables(tables))
    mesh = figure.axes[0].collections[0]
    colours = mesh.get_facecolors()[:, :3]
    assert len(colours) == 2
    # 8 % apart on a scale from 0: neighbours on the colour map, not its two ends, as a min-to-max
    # scale painted them (dark purple and yellow)
    ends = np.linalg.norm(np.subtract(mesh.cmap(0.0)[:3], mesh.cmap(1.0)[:3]))
    assert np.linalg.norm(colours[0] - colours[1]) < ends / 5, colours
    assert mesh.norm.vmin == 0
    labels = [text.get_text() for text in figure.axes[0].texts]
    assert any("CV 40%" in label for label in labels), labels  # the noise is on the cell
