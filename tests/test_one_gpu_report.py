"""A one-GPU report tells the one-GPU story, on the reports a GPU user reads:
the kept H100 records' (``h100_report``) and the kept one-H100 study of 2026-11-27 rebuilt.

Every counted run of both used one H100. The report leads with the headline and the published
figures beside it; each multi-GPU section it cannot fill is one line; the energy figure sets each
model's energy per image or per token beside the others'; throughput against a single GPU count
is no figure; and the scaling model's predictions read at a 1400 px window. A study that scaled
keeps its order and its sections (tests/test_report.py, the README CPU study's checks).
"""

from __future__ import annotations

import json
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
import seaborn
from matplotlib import pyplot

from scalerepro.analysis.presentation import inputs, plots, report

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, kept_study_rebuilt_once, rebuild_kept_study, section, table_rows, visible
from report_study import CHROMIUM, Chromium

STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "study-results"
CPU_STUDY = REPO / "tests" / "fixtures" / "studies" / "cpu-readme-a0f872f"
# The multi-GPU sections a one-GPU report cannot fill, by anchor; the scaling model is one of them
# where it has no prediction to show (the records' report: no scaling study to replay).
ONE_LINE = ("scaling", "why-not-faster", "sensitivity", "parallelism", "communication")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> RebuiltStudy:
    return kept_study_rebuilt_once(tmp_path_factory, STUDY)


def section_order(page: str) -> list[str]:
    return re.findall(r'<section id="([a-z-]+)">', page)


@REBUILDS_A_STUDY
def test_a_one_gpu_report_leads_with_its_summary_then_the_published_figures(h100_report, study):
    for page in (h100_report.html, study.html):
        assert "One-GPU benchmark" in re.search(r"<h1>(.*?)</h1>", page).group(1)
        order = section_order(page)
        assert order[:3] == ["summary", "comparison", "system"], order
        assert order[3:] == ["prescreen", "results", "failures", "cost", "reproducibility", "history"], order
        # the numbers and the contents follow the order: "Measured vs published" is section 2
        assert '<h2><span class="secno">2</span> Measured vs published</h2>' in page
        contents = re.findall(r'<li><a href="#([a-z-]+)">', page.split("</nav>")[0])
        assert contents == order
    # a study that scaled keeps SECTIONS' order
    assert report.report_sections(False) == report.SECTIONS


@REBUILDS_A_STUDY
@pytest.mark.parametrize("report_of", ["records", "study"])
def test_each_multi_gpu_section_of_a_one_gpu_report_is_one_line(report_of, h100_report, study):
    page = h100_report.html if report_of == "records" else study.html
    anchors = (*ONE_LINE, "scaling-model") if report_of == "records" else ONE_LINE
    for anchor in anchors:
        part = section(page, anchor)
        # its heading and one line: no formula, no note, no table, no figure, and the anchor kept
        assert part.startswith(f'id="{anchor}" class="run-in">'), part[:200]
        assert len(re.findall(r"<p[ >]", part)) == 1 and '<p class="single-line">' in part, part
        assert not re.search(r"<table|<figure|<img|class=\"formula\"|class=\"note", part), part
        line = visible(part.split('<p class="single-line">')[1])
        assert line.startswith(("not measured — every run used 1 GPU", "no prediction — no strong or weak scaling run here")), line
    # the scaling model of a study with predictions shows them; its multi-GPU account is folded away
    if report_of == "study":
        model = section(page, "scaling-model")
        shown = re.sub(r"<details.*?</details>", "", model, flags=re.S)
        assert "predictions only — every run used 1 GPU; the alpha-beta model replays" in visible(shown) and "dgx_h100" in visible(shown)
        assert not re.search(r'class="formula"|class="note"', shown), shown
        assert "t_ring(S, N)" in model  # in the fold, for whoever opens it
        assert len(table_rows(shown)) == 1 + 24 + 18  # the header, each model strong at 1, 8, 16 and 64 GPUs and weak at 8, 16, 64


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
@pytest.mark.slow
def test_at_1400_px_each_one_line_section_is_one_line_and_the_prediction_rows_are_short(h100_report, study, tmp_path):
    # each run-in heading's line: the distinct line tops its text is laid out at, beside the heading's top
    lines_js = r"""(() => JSON.stringify([...document.querySelectorAll('h3.run-in')].map(h => {
      const text = document.createRange();
      text.selectNodeContents(h.nextElementSibling);
      const tops = [...text.getClientRects()].map(r => Math.round(r.top)).sort((a, b) => a - b);
      const lines = tops.filter((top, i) => i === 0 || top - tops[i - 1] > 8).length;  // a <code> sits a few px lower on its line
      return {anchor: h.id, lines: lines, heading_top: Math.round(h.getBoundingClientRect().top), line_top: tops[0]};
    })))()"""
    # the prediction table's rows' heights, and how far each table after the heading (folded ones open) runs past its box
    rows_js = r"""(() => JSON.stringify({
      rows: [...document.querySelectorAll('#scaling-model ~ .table-wrap')[0].querySelectorAll('tbody tr')]
        .map(r => Math.round(r.getBoundingClientRect().height)),
      hidden: [...document.querySelectorAll('#scaling-model ~ .table-wrap, #scaling-model ~ details .table-wrap')]
        .map(b => b.scrollWidth - b.clientWidth)}))()"""
    found = {}
    for name, page in (("records", h100_report.html), ("study", study.html)):
        path = tmp_path / f"{name}.html"
        path.write_text(page)
        browser = Chromium(tmp_path / f"profile-{name}", tmp_path / f"chromium-{name}.log")
        try:
            session = browser.open_page(path.as_uri(), 1400, 1000)
            found[name] = json.loads(browser.call("Runtime.evaluate", {"expression": lines_js, "returnByValue": True}, session)["result"]["value"])
            if name == "study":
                browser.call("Runtime.evaluate", {"expression": "document.querySelectorAll('details').forEach(d => d.open = true)"}, session)
                table = json.loads(browser.call("Runtime.evaluate", {"expression": rows_js, "returnByValue": True}, session)["result"]["value"])
        finally:
            browser.close()
    assert {line["anchor"] for line in found["records"]} == {*ONE_LINE, "scaling-model"}
    for line in found["records"] + found["study"]:
        # the line runs on from its heading and takes one line of the page
        assert line["lines"] == 1 and abs(line["heading_top"] - line["line_top"]) < 12, line
    # the prediction table's rows are one or two lines each (its notes were clipped past 1400 px in rows 150 px tall)
    assert len(table["rows"]) == 24 + 18 and max(table["rows"]) < 50, table["rows"]
    assert table["hidden"] and not any(table["hidden"]), table["hidden"]  # no table of the section runs past its box


def drawn_as_in_the_report(figure_function, tables):
    """A figure drawn under the theme plots.draw gives the report's figures (its fonts decide what fits), the rc left as it was."""
    with matplotlib.rc_context():
        seaborn.set_theme(context="notebook", style="whitegrid")
        figure = figure_function(tables)
        figure.canvas.draw()
    return figure


def cut_off(figure) -> dict[str, float]:
    """How far (inches) what the figure draws (titles, labels, ticks, legends) reaches past each of its edges."""
    figure.canvas.draw()
    drawn = figure.get_tightbbox(figure.canvas.get_renderer())
    width, height = figure.get_size_inches()
    past = {"left": -drawn.x0, "bottom": -drawn.y0, "right": drawn.x1 - width, "top": drawn.y1 - height}
    return {edge: round(inches, 2) for edge, inches in past.items() if inches > 0.01}


def test_the_energy_figure_of_the_records_report_is_drawn_per_image_and_per_token(h100_report):
    out = h100_report.out
    assert inputs.not_measured_note((out / "plots" / "energy_per_sample.svg").read_bytes(), "svg") is None  # drawn, not a line
    shown = re.search(r'<figure class="plot" id="fig-energy_per_sample">(.*?)</figure>', h100_report.html, re.S)
    assert shown and "<img" in shown.group(1)
    figure = drawn_as_in_the_report(plots.energy_per_sample, plots.read_tables(out / "tables"))
    try:
        image, token = [ax for ax in figure.axes if ax.get_xlabel()]
        assert image.get_xlabel() == "mJ per training image (log scale)" and token.get_xlabel() == "mJ per training token (log scale)"
        assert [label.get_text() for label in image.get_yticklabels()] == ["resnet18_cifar", "resnet50", "vit_b_16"]
        assert [label.get_text() for label in token.get_yticklabels()] == ["bert_base", "gpt2_small", "llama_1b"]
        # Llama's 22 J a sequence is 2,048 tokens' energy: per token it stands beside BERT's and GPT-2's
        runs = pd.read_csv(out / "tables" / "runs.csv")
        llama = runs[runs["counts"] & runs["model"].eq("llama_1b")]
        per_token = 1e3 * llama["energy_per_sample_j"] / llama["tokens_per_sample"]
        gross = token.collections[-1].get_offsets()[0][0]  # the last row's fastest configuration, gross
        assert per_token.min() <= gross <= per_token.max() and 5 < gross < 20
        assert figure.get_size_inches()[0] <= 7.5 and not cut_off(figure), cut_off(figure)
    finally:
        pyplot.close(figure)


@REBUILDS_A_STUDY
def test_throughput_against_one_gpu_count_is_a_line_and_many_models_a_grid(study, tmp_path):
    tables = plots.read_tables(study.results / "tables")
    assert tables["scaling"]["gpus"].eq(1).all() and tables["scaling"]["model"].nunique() == 6
    with pytest.raises(plots.NotMeasured, match="every scaling run used 1 GPU: throughput against the GPU count needs two counts or more"):
        plots.throughput_vs_gpus(tables)
    assert "<img" not in section(study.html, "scaling") and 'id="fig-throughput_vs_gpus"' not in study.html
    # the same six models at 1 and 2 GPUs: a grid two panels wide, not a strip of six
    faster = {f"samples_per_s_{stat}": 1.8 * tables["scaling"][f"samples_per_s_{stat}"] for stat in ("median", "min", "max")}
    two = tables["scaling"].assign(gpus=2, **faster)
    tables["scaling"] = pd.concat([tables["scaling"], two], ignore_index=True)
    figure = drawn_as_in_the_report(plots.throughput_vs_gpus, tables)
    try:
        panels = [ax for ax in figure.axes if ax.get_title()]
        assert len(panels) == 6 and len({round(ax.get_position().x0, 2) for ax in panels}) == 2
        assert figure.get_size_inches()[0] <= 10.4 and not cut_off(figure), cut_off(figure)
    finally:
        pyplot.close(figure)


@REBUILDS_A_STUDY
def test_the_prediction_table_shows_a_few_columns_and_folds_the_rest(study):
    model = section(study.html, "scaling-model")
    headers = table_rows(model)[0]
    assert headers == [
        "Study",
        "Model",
        "GPUs",
        "Nodes",
        "Basis",
        "Step predicted (ms)",
        "Efficiency predicted",
        "Typical error (±)",
        "Loss mostly from",
        "Note",
    ]
    folded = re.search(r"<details.*?</details>", model, re.S).group(0)
    every = {header for row in table_rows(folded) for header in row}
    for column in (
        "Step measured (ms)",
        "Efficiency predicted",
        "Lost to fixed per-step cost",
        "Lost to exposed all-reduce",
        "Cluster",
        "Micro-batch per GPU",
        "Exposed all-reduce (ms)",
        "α, B from",
        "k from",
    ):
        assert column in every, column
    rows = {(row[0], row[1], row[2]): row for row in table_rows(model.split("<details")[0])[1:]}
    # the reference row's measured step under its (absent) prediction; a predicted row's own figures
    assert rows[("strong", "resnet50", "1")][5] == "— measured 45.3 ms" and rows[("strong", "resnet50", "1")][9].startswith("the reference")
    # a strong row holds a global batch someone would run: ResNet-50 at 8 GPUs 10,240 (Lambda's 8 x 1,280),
    # 5 micro-batches of 256 a GPU, the one-GPU micro-batch (no bound); at 64 GPUs 160 a GPU, below every
    # measured micro-batch with no batch curve: an upper bound. A weak row at the one-GPU batch
    # spends 1.5 % of its step in communication, ten times its regime's back-tested rows': no error bar
    assert rows[("strong", "resnet50", "8")][4:8] == ["predicted", "226.9", "99.9 %", "—"]
    assert rows[("strong", "resnet50", "64")][6] == "98.5 % an upper bound"
    assert rows[("weak", "resnet50", "8")][4:8] == ["predicted", "45.4", "99.7 %", "—"]
    regimes = visible(model)
    assert "ddp, one node, batch held, compute as given: its 12 rows here carry no error bar: not comparable to its back-test's rows" in regimes
    assert np.all([len(row) == 10 for row in rows.values()])


@REBUILDS_A_STUDY
def test_a_study_that_scaled_keeps_its_order_and_its_multi_gpu_sections(tmp_path):
    """The README's CPU study (1 and 2 ranks) as the workflow wrote it: every multi-GPU section has content, and keeps it."""
    page = rebuild_kept_study(CPU_STUDY, tmp_path).html
    assert section_order(page) == [anchor for anchor, _, _ in report.SECTIONS]
    assert 'class="run-in"' not in page and 'class="single-line"' not in page
    assert "Strong scaling keeps the global batch fixed" in visible(section(page, "scaling")) and "<table" in section(page, "scaling")
    assert 'class="formula"' in section(page, "why-not-faster") and "<table" in section(page, "why-not-faster")
    for anchor in ("sensitivity", "parallelism", "communication"):
        assert "<table" in section(page, anchor), anchor
    model = re.sub(r"<details.*?</details>", "", section(page, "scaling-model"), flags=re.S)
    assert "t_ring(S, N)" in model and "Compute inflation: ranks that share a node" in visible(model)  # the model's account, not folded
