"""The HTML report: self-contained, escaped, honest about holes, every section showing what the
study's tables hold (the study is report_study's)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalerepro.analysis.presentation import formatting, headline, report, report_facts
from scalerepro.analysis.tables import cell_tables

from report_study import EVIL, H100, REFERENCES, SXM_CONDITIONS, TEMPLATES, Tags, list_table_digests, render_study, rendered_study, section, write_study


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[dict[str, Path], str, Path]:
    return rendered_study(tmp_path_factory)


def test_report_is_self_contained(study):
    _, page, _ = study
    tags = Tags(page)
    assert not tags.named("link") and not tags.named("script") and not tags.named("iframe")
    images = tags.named("img")
    assert len(images) == len(report.FIGURE_NAMES) - 1  # energy_per_sample is missing on purpose
    for attrs in images:
        assert attrs["src"].startswith(("data:image/svg+xml;base64,", "data:image/png;base64,")), attrs["src"][:60]
        base64.b64decode(attrs["src"].split(",", 1)[1], validate=True)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    hrefs = [attrs["href"] for attrs in tags.named("a")]
    assert hrefs and all(href.startswith("#") for href in hrefs)
    ids = {attrs["id"] for _, attrs in tags.tags if "id" in attrs}
    assert {href[1:] for href in hrefs} <= ids  # every table-of-contents link has its target


def test_sections_in_order(study):
    _, page, _ = study
    order = ["summary", "system", "results", "comparison", "failures", "cost", "reproducibility"]
    positions = [page.index(f'<section id="{name}">') for name in order]
    assert positions == sorted(positions)


def test_figures_prefer_svg_fall_back_to_png_and_show_holes(study):
    _, page, _ = study
    throughput = re.search(r'<figure class="plot" id="fig-throughput_vs_gpus">(.*?)</figure>', page, re.S).group(1)
    assert 'src="data:image/svg+xml;base64,' in throughput
    loss = re.search(r'<figure class="plot" id="fig-loss_curves">(.*?)</figure>', page, re.S).group(1)
    assert 'src="data:image/png;base64,' in loss
    energy = re.search(r'<figure class="plot" id="fig-energy_per_sample">(.*?)</figure>', page, re.S).group(1)
    assert "<img" not in energy
    assert "Figure missing:" in energy and "energy_per_sample.svg" in energy


def test_summary_checks_and_headline(study):
    _, page, _ = study
    summary = section(page, "summary")
    # Badges carry the status as text, not only as colour.
    assert '<span class="badge not-measured">not measured</span>' in summary
    assert '<span class="badge fail">fail</span>' in summary
    assert '<span class="badge pass">pass</span>' in summary
    # an interval that holds the threshold: inconclusive, the interval beside the value
    assert '<span class="badge inconclusive">inconclusive</span>' in summary and "1.0 % – 12.0 %" in summary
    assert 'id="cpu-study"' not in summary and 'id="noisy"' not in summary  # a GPU study, no noisy cell
    assert "1 failed" in summary and "1 preempted" in summary and "1 missing" in summary
    assert H100 in summary
    resnet = re.search(r"<tr>\s*<td>resnet50</td>(.*?)</tr>", summary, re.S).group(1)
    # 1 GPU: the strong-scaling cell, median of its three repeats.
    assert '<td class="num">2,900</td>' in resnet and "n=3: min – max" in resnet
    # 8 GPUs: the ablation's "all" variant beats the strong-scaling cell (21,070, median of the
    # two repeats left after the preemption).
    # one run: its window's mean, its median step's rate beneath
    assert f'<td class="num">{8 * 1020 * 2.86:,.0f}<br>' in resnet and "ablation · all · bf16" in resnet
    assert "91.0 %" in summary  # strong efficiency at 8 GPUs


def test_results_tables(study):
    _, page, _ = study
    results = section(page, "results")
    strong = re.search(r"<h4>Strong scaling</h4>(.*?)</table>", results, re.S).group(1)
    resnet8 = re.search(r"<tr><td>resnet50</td><td class=\"num\">8</td>(.*?)</tr>", strong, re.S).group(1)
    # 2 of 3 repeats (one preempted): flagged; median, range, per GPU, step time (ms), efficiency.
    assert '<td class="num short">2 / 3</td>' in resnet8
    for text in ("21,070", "21,028 – 21,112", "2,634", "12.2", "7.27×", "8.00×", "90.8 %"):
        assert f'<td class="num">{text}</td>' in resnet8, text
    assert '<td class="num">+186.0 %</td>' in results  # ablation "all": 2.86x the baseline
    assert '<td class="num">256 MiB</td>' in results and '<td class="num">40.2 %</td>' in results
    # the fixture study has no parallelism study (its own test below): every other table measured
    assert "Not measured" not in results.replace(_parallelism_html(page), "")


def test_scaling_model_section(study):
    _, page, _ = study
    model = section(page, "results").split('id="scaling-model"')[1]
    for text in ("11.9", "−2.5 %", "93.0 %", "26.0 %", "370.5", "6.6"):
        assert f'<td class="num">{text}</td>' in model, text
    assert "prediction only: beyond the 8 GPUs the study ran on" in model and "t_ring(S, N)" in model
    assert "NVLink 4" in model and "ConnectX-7" in model and "nvidia.com" in model  # the links and their sources


def test_scaling_model_shows_the_cluster_and_its_typical_error_only_on_a_cluster_row(tmp_path):
    def scaling_model_rows(page: str) -> dict[str, dict[str, str]]:
        """The scaling-model tables' rows by GPU count, each as {header: cell text} over the table
        shown and the folded ones (which hold the columns the first one leaves out)."""
        model = section(page, "results").split('id="scaling-model"')[1]
        found: dict[str, dict[str, str]] = {}
        for table in re.findall(r"<table>(.*?)</table>", model.split("Links assumed beyond")[0], re.S):
            headers = re.findall(r"<th[^>]*>(.*?)</th>", table)
            for row in re.findall(r"<tr><td.*?</tr>", table, re.S):
                cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
                found.setdefault(cells[headers.index("GPUs")], {}).update(zip(headers, cells, strict=True))
        return found

    paths = write_study(tmp_path)
    plain = scaling_model_rows(render_study(paths, tmp_path / "plain.html"))
    # no cluster configured: neither column, not even as a column of dashes
    assert set(plain) == {"8", "64"} and not {"Typical error (±)", "Cluster"} & set(plain["64"])
    table = pd.read_csv(paths["tables"] / "scaling_model.csv")
    predicted = table["basis"] == "predicted"
    table["typical_error"] = table["cluster"] = None
    table.loc[predicted, ["typical_error", "cluster", "network"]] = [0.011, "dgx_h100", "NVIDIA DGX H100, 8 GPUs/node"]
    table.to_csv(paths["tables"] / "scaling_model.csv", index=False)
    list_table_digests(paths["tables"])  # the test's change stands in for the aggregation's table
    on_cluster = scaling_model_rows(render_study(paths, tmp_path / "cluster.html"))
    assert on_cluster["64"]["Typical error (±)"] == "1.1 %" and on_cluster["64"]["Cluster"] == "dgx_h100"
    # the cluster's network is said once above the table (its rows would repeat it), not in "α, B from"
    assert on_cluster["64"]["Nodes"] == "8" and on_cluster["64"]["α, B from"] == "—"
    assert "run on <code>dgx_h100</code></strong>" in section(render_study(paths, tmp_path / "cluster.html"), "results").split('id="scaling-model"')[1]
    # the measured count keeps its own network: no cluster, no typical error
    assert on_cluster["8"]["Typical error (±)"] == "—" and on_cluster["8"]["Cluster"] == "—"


def test_headline_takes_the_best_configuration_by_median():
    """Variant a has one lucky repeat (1000) but median 100; c is faster but failed; d ran with
    a world size other than planned (consistent false): neither counts, which the report reads
    from the aggregation's ``counts`` column rather than deciding again."""
    runs = pd.DataFrame(
        {
            "model": ["m"] * 7,
            "gpus": [1] * 7,
            "status": ["ok"] * 5 + ["failed", "ok"],
            "consistent": [True] * 6 + [False],
            "counts": [True] * 5 + [False, False],
            "study": ["ablation"] * 7,
            "variant": ["a", "a", "a", "b", "b", "c", "d"],
            "samples_per_s": [100.0, 100.0, 1000.0, 300.0, 310.0, 5000.0, 9999.0],
        }
    ).assign(
        cell=lambda frame: "ablation_m_g1_" + frame["variant"],
        nodes=1,
        **dict.fromkeys(("tokens_per_s", "step_time_median_s", "epoch_time_s", "exposed_comm_fraction", "mfu", "peak_memory_bytes"), float("nan")),
        device_name="NVIDIA H100 80GB HBM3",
    )
    (row,) = headline.headline(runs, cell_tables.cells_table(runs), pd.DataFrame())
    assert row["one"]["samples_per_s"] == 305.0 and "b" in row["one"]["config"] and row["one"]["repeats"] == 2
    assert row["at_max"] is None and row["strong"] is None
    assert [r["run_id"] for r in report_facts.inconsistent(runs.assign(run_id=list("abcdefg")))] == ["g"]


def test_failed_preempted_and_missing_runs_are_listed_with_their_rerun_command(study):
    paths, page, _ = study
    failures = section(page, "failures")
    runs = pd.read_csv(paths["tables"] / "runs.csv")
    unfinished = runs[runs.status != "ok"]
    assert set(unfinished.status) == {"failed", "preempted", "missing"}
    for run in unfinished.itertuples():
        assert run.run_id in failures
        assert f"<code>{run.rerun}</code>" in failures
        assert f'<span class="badge {run.status}">{run.status}</span>' in failures
    assert "NCCL error in ProcessGroupNCCL.cpp:1970" in failures
    assert "no run record at results/runs/weak_bert_base_g4_r1/record.json" in failures
    assert "SIGTERM" in failures
    # ... and they are holes in the tables, not dropped: the cell says 2 of 3 repeats.
    assert "2 / 3" in section(page, "results")


def test_escaping(tmp_path):
    paths = write_study(tmp_path, evil=True)
    page = render_study(paths, tmp_path / "index.html")
    assert "<script" not in page.lower()
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    for where in ("summary", "system", "failures", "reproducibility", "results"):
        assert escaped in section(page, where), where
    assert not Tags(page).named("script")


def test_system_inventory_renders_generically(study):
    _, page, _ = study
    system = section(page, "system")
    assert "dgx-h100-017" in system and "Intel(R) Xeon(R) Platinum 8480C" in system
    assert "79.6 GiB" in system  # 85,520,809,984 B
    assert system.count(H100) >= 8
    assert re.search(r'<pre class="block">\s*GPU0\s+GPU1', system)
    assert "400 Gb/sec (4X NDR)" in system and "4181999" in system


def test_comparison_sets_each_reference_beside_its_own_runs(study):
    _, page, _ = study
    comparison = section(page, "comparison")
    reproduction, context = comparison.split('<h3 id="context">')
    assert "1.01×" in reproduction and '<span class="badge reproduced">reproduced</span>' in reproduction  # 20,950 / 20,728
    assert "0.87×" in reproduction and '<span class="badge below">below</span>' in reproduction  # 12,100 / 13,856
    assert "20,900 – 21,000" in reproduction and "n=2, CV 0.3 %" in reproduction  # the measured median's interval
    assert '<span class="badge noisy">noisy</span>' in reproduction  # the TF32 cell: CV 9.4 %
    # both sets of conditions, side by side
    assert f"published: {SXM_CONDITIONS}<br>measured: {SXM_CONDITIONS}; optimizer sgd" in reproduction
    # not comparable names the condition, and why; MLPerf says what it ran on
    assert '<span class="badge not-comparable">not comparable: data</span>' in reproduction
    assert "real ImageNet decoded by DALI" in reproduction and "MXNet (NVIDIA Release 23.04)" in reproduction
    assert "±10.0 %" in comparison  # the tolerance, stated
    # another GPU (and the seed's H100 of unstated form factor) is context, folded apart
    assert "lambda-rn50-a100sxm-fp16-8" in context and "seed-resnet50-8" in context and "expected (seed document)" in context
    assert "lambda-rn50-a100sxm-fp16-8" not in reproduction and "never a pass or fail" in context
    assert "NVIDIA H100 SXM5 80GB" in comparison and "989.4" in comparison and "datasheet" in comparison
    assert "bf16 (TFLOP/s)" in comparison and "NVML: NVIDIA H100 80GB HBM3" in comparison  # peaks by device name


def test_cost_and_reproducibility(study):
    _, page, _ = study
    cost = section(page, "cost")
    assert "19.0 GPU-hours" in cost and "18.5 node-hours" in cost
    assert '<th scope="row">Total</th>' in cost
    repro = section(page, "reproducibility")
    assert "7333a9c6cdfbdc5a5b41d26536c88629aaf3162c" in repro
    assert "<details" in repro and "snakemake --cores all --forcerun results/runs/strong_resnet50_g1_r1/record.json" in repro
    assert "--forcerun &lt;rule&gt;" in repro
    assert "&#34;resolved_gpu_counts&#34;" in repro or "&quot;resolved_gpu_counts&quot;" in repro  # the config, escaped
    assert "2.6.0a0+ecf3bae40a.nv25.01" in repro and 'href="#inventory-software"' in repro
    assert 'id="inventory-software"' in section(page, "system") and "2.25.1" in section(page, "system")


def test_number_formats():
    assert formatting.fmt_rate(21111.4) == "21,111" and formatting.fmt_rate(45.27) == "45" and formatting.fmt_rate(3.14159) == "3.1"
    assert formatting.fmt_auto(0.05123) == "0.0512" and formatting.fmt_auto(20.974) == "20.97" and formatting.fmt_auto(467.53) == "467.5"
    assert formatting.fmt_percent(0.9312) == "93.1 %" and formatting.fmt_percent_value(96.54) == "96.5 %"
    assert formatting.fmt_gain(0.3104) == "+31.0 %" and formatting.fmt_gain(-0.04) == "−4.0 %"
    assert formatting.fmt_bytes(1024) == "1 KiB" and formatting.fmt_bytes(268435456) == "256 MiB"
    assert formatting.fmt_bytes(1536) == "1.5 KiB" and formatting.fmt_bytes(85_520_809_984) == "79.6 GiB"
    assert formatting.fmt_milliseconds(0.0412) == "41.2" and formatting.fmt_sig(0.00213) == "0.00213"
    assert formatting.fmt_ratio(1.5523) == "1.55×" and formatting.fmt_int(4182000.0) == "4,182,000"
    assert formatting.fmt_text(4182000.0) == "4182000" and formatting.fmt_text(0.123456) == "0.1235"
    assert formatting.breakable(f"strong_g8{EVIL}") == "strong_<wbr>g8&lt;script&gt;alert(1)&lt;/script&gt;"
    for missing in (None, float("nan"), float("inf"), "", pd.NA):
        for fmt in formatting.FORMATS.values():
            assert fmt(missing) == "—"


def test_missing_and_empty_inputs_are_holes_not_crashes(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "runs.csv").write_text("")  # empty file
    (tables / "scaling.csv").write_text("study,model,gpus,samples_per_s_median\n")  # header only
    (tables / "checks.csv").write_text("check,target,value,status,detail\n")
    # sensitivity, ablation, communication, comparison, cost: absent
    page = report.render(tables, tmp_path / "no-plots", tmp_path / "none.json", tmp_path / "none.json", REFERENCES, TEMPLATES)
    assert page.count("Figure missing:") == len(report.FIGURE_NAMES)
    assert "<img" not in page
    assert "Not measured: runs.csv has no rows: there are no runs" in section(page, "summary")
    assert "Not measured: checks.csv has no rows." in section(page, "summary")
    results = section(page, "results")
    assert "Not measured: scaling.csv has no rows." in results
    assert "Not measured: sensitivity.csv is not there." in results
    assert "No inventory" in section(page, "system")
    assert "No configuration" in section(page, "reproducibility")
    assert "Not measured: cost.csv is not there." in section(page, "cost")
    # no published comparison table: a hole saying so, not "every reference stands beside a run"
    assert section(page, "comparison").count("Not measured: published_comparison.csv is not there.") == 2


def test_a_cpu_study_says_why_gpu_figures_are_missing(tmp_path):
    paths = write_study(tmp_path)
    runs = pd.read_csv(paths["tables"] / "runs.csv")
    runs[["gpu_util_mean_pct", "power_mean_w", "energy_j", "energy_per_sample_j", "mfu"]] = float("nan")
    recorded = runs.status != "missing"
    runs.loc[recorded, "nvml_reason"] = "CPU run: NVML measures NVIDIA GPUs only"
    runs.loc[recorded, ["device_type", "device_name"]] = ["cpu", "AMD EPYC 7763 64-Core Processor"]
    runs.to_csv(paths["tables"] / "runs.csv", index=False)
    list_table_digests(paths["tables"])  # the test's change stands in for the aggregation's table
    inventory = json.loads(paths["inventory"].read_text())
    inventory.update(gpus=[], gpu_reason="NVML could not be initialised: NVML Shared Library Not Found", nvidia_smi_topo=None)
    paths["inventory"].write_text(json.dumps(inventory))
    page = render_study(paths, tmp_path / "index.html")
    assert "ranks, not GPUs" in section(page, "summary")
    # said plainly: one host's cores measure the pipeline, not a cluster
    banner = re.search(r'<p class="note warn" id="cpu-study">(.*?)</p>', section(page, "summary"), re.S).group(1)
    assert "measure the\npipeline" in banner or "measure the pipeline" in banner.replace("\n", " ")
    assert "not a cluster" in banner and "judged at CPU scale" in banner
    assert "CPU study." in section(page, "comparison")
    energy = re.search(r'<h3 id="energy">(.*?)<h3 id="per-run">', page, re.S).group(1)
    assert "Not measured" in energy and "<q>CPU run: NVML measures NVIDIA GPUs only</q>" in energy
    assert "<table" not in energy
    system = section(page, "system")
    assert "NVML could not be initialised: NVML Shared Library Not Found" in system and "<pre" not in system


def _parallelism_html(page: str) -> str:
    return re.search(r'<h3 id="parallelism">(.*?)<h3 id="communication">', page, re.S).group(1)


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_the_parallelism_section_compares_the_strategies_and_names_what_is_not_measured(tmp_path, device_type):
    from scalerepro.analysis.tables import aggregate

    from analysis_fixtures import TOKENS, write_parallelism_study

    tables = aggregate.aggregate(**write_parallelism_study(tmp_path / "study", device_type), targets={})
    aggregate.write_tables(tables, tmp_path / "tables")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"parallelism": {"enabled": True, "strategies": ["ddp", "fsdp", "tp", "fsdp+tp"]}}))
    page = report.render(tmp_path / "tables", None, None, config, REFERENCES, TEMPLATES)
    part = _parallelism_html(page)
    assert f'<span class="secno">{report.section_numbers()["parallelism"]}</span> Parallelism strategies' in part
    throughput, memory = (table.split("</tbody>")[0] for table in part.split("<tbody>")[1:3])
    body = throughput + memory
    for table in (throughput, memory):
        strategies = re.findall(r"<code>(ddp|fsdp|tp|fsdp\+tp)</code>", table)
        assert strategies == ["ddp", "fsdp", "tp", "fsdp+tp"]  # one row each, in the study's order
    assert "2 / 2" in body and "2 / 3" in body  # n of each cell: fsdp counts 2 of its 3 repeats
    assert "40 – 44" in body and f"{42 * TOKENS:,}" in body and f"{42 * TOKENS // 2:,}" in body  # interval, tokens/s, per GPU
    assert "762.9 MiB" in memory  # fsdp: 500 MB all-gather + 300 MB reduce-scatter per step
    assert "all_gather 500,000,000 B; reduce_scatter 300,000,000 B" in memory
    assert "not measured: communication per step (not counted under --parallel tp" in body
    assert "not measured: no completed repeat of 1 planned" in body  # the failed fsdp+tp cell
    text = " ".join(part.split())
    assert "the largest model that fits in a GPU's memory" in text and "the exposed share of communication" in text
    assert ("This is a CPU study" in text) == (device_type == "cpu")
    if device_type == "cpu":
        assert "not the strategies' speed" in text and "not measured: MFU (no GPU" in body


def test_the_parallelism_section_says_why_it_is_empty(study, tmp_path):
    paths, page, _ = study
    assert "Not measured: the configuration has no parallelism study" in _parallelism_html(page)
    config = json.loads(paths["config"].read_text())
    paths["config"].write_text(json.dumps({**config, "parallelism": {"enabled": False}}))
    try:
        page = render_study(paths, tmp_path / "index.html")
    finally:
        paths["config"].write_text(json.dumps(config))
    assert "Not measured: the parallelism study is disabled in the configuration (parallelism.enabled: false)." in _parallelism_html(page)
    assert "<table" not in _parallelism_html(page)


def test_noisy_cells_are_flagged_in_tables_and_summary(tmp_path):
    paths = write_study(tmp_path)
    scaling = pd.read_csv(paths["tables"] / "scaling.csv")
    noisy = (scaling.study == "strong") & (scaling.model == "bert_base") & (scaling.gpus == 4)
    scaling["samples_per_s_cv"] = 0.004
    scaling["noisy"] = False
    scaling.loc[noisy, ["samples_per_s_cv", "noisy", "samples_per_s_ci_low", "samples_per_s_ci_high"]] = [0.12, True, 5000.0, 6400.0]
    scaling.to_csv(paths["tables"] / "scaling.csv", index=False)
    list_table_digests(paths["tables"])  # the test's change stands in for the aggregation's table
    page = render_study(paths, tmp_path / "index.html")
    summary = section(page, "summary")
    assert 'id="noisy"' in summary and "1 cell vary more than the target" in summary
    assert "scaling: study strong, model bert_base, GPUs 4 — CV 12.0 % over 3 repeats" in summary
    strong = re.search(r"<h4>Strong scaling</h4>(.*?)</table>", section(page, "results"), re.S).group(1)
    row = re.search(r"<tr><td>bert_base</td><td class=\"num\">4</td>(.*?)</tr>", strong, re.S).group(1)
    assert '<td class="num">noisy</td>' in row and '<td class="num">12.0 %</td>' in row and "5,000 – 6,400" in row


def test_missing_optional_columns_show_a_dash(tmp_path):
    paths = write_study(tmp_path)
    scaling = pd.read_csv(paths["tables"] / "scaling.csv").drop(columns=["epoch_time_s", "ideal_speedup", "repeats_total"])
    scaling.to_csv(paths["tables"] / "scaling.csv", index=False)
    runs = pd.read_csv(paths["tables"] / "runs.csv").drop(columns=["error", "git_dirty", "consistent", "mfu"])
    runs.to_csv(paths["tables"] / "runs.csv", index=False)
    list_table_digests(paths["tables"])  # the test's change stands in for the aggregation's table
    page = render_study(paths, tmp_path / "index.html")
    results = section(page, "results")
    assert '<td class="num">—</td>' in results
    assert "no error recorded" in section(page, "failures")


def test_runs_without_torch(tmp_path):
    """The command line works as a module and never imports torch (the analysis env has none)."""
    paths = write_study(tmp_path)
    out = tmp_path / "out" / "index.html"
    code = (
        "import runpy, sys\n"
        "sys.modules['torch'] = None  # importing torch now raises ImportError\n"
        "sys.argv[0] = 'scalerepro.analysis.presentation.report'\n"
        "runpy.run_module('scalerepro.analysis.presentation.report', run_name='__main__')\n"
    )
    args = [
        "--tables",
        paths["tables"],
        "--plots",
        paths["plots"],
        "--inventory",
        paths["inventory"],
        "--config",
        paths["config"],
        "--references",
        REFERENCES,
        "--templates",
        TEMPLATES,
        "--out",
        out,
    ]
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.is_file() and "report:" in done.stderr
