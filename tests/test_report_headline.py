"""The report's first read (issue 33, points 1, 3 and 6), on the report a GPU user reads: the one
rendered from the H100 records the project kept (``h100_report``), and the one-H100 study's own
results folder (benchmarks/gpu/h100-2026-11-26/study-results).

1. The title and summary say what the study was; per model, the headline gives the best figure
   with its unit, precision, batch, data, device (form factor, memory, power limit), MFU against a
   named peak, peak memory against the card's, n and spread, and no efficiency where nothing scaled.
3. Every MFU column names the peak it is against; an fp32 run says TF32 was off.
6. A check's figure within rounding of its threshold shows the digits that tell them apart; GPU
   utilisation is judged on the worst run, not on a mean.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scalerepro.analysis import rebuild
from scalerepro.analysis.presentation import inputs, report
from scalerepro.analysis.tables import check_definitions, checking
from scalerepro.common import gpu_peaks

from h100_report import H100_RECORDS, kept_study_tables, visible

REPO = Path(__file__).resolve().parents[1]
ONE_H100_STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-26" / "study-results"


def text(fragment: str) -> str:
    """A fragment of the page as a reader sees it: tags dropped, entities and spaces resolved."""
    spaced = re.sub(r"<br>|</t[dh]>", " ", fragment)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", spaced)).split())


def headline(page: str) -> str:
    return page.split('<h3 id="headline">')[1].split("</section>")[0]


def headline_tables(page: str) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    """Each headline table by its caption: its headers and its rows by model, as text."""
    tables = {}
    for table in re.findall(r'<table class="headline">(.*?)</table>', headline(page), re.S):
        caption = text(re.search(r"<caption>(.*?)</caption>", table, re.S).group(1))
        headers = [text(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)]
        rows = [[text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]
        # a row by its model, the first word of its first cell (its shape and any flag follow it)
        tables[caption] = (headers, {cells[0].split()[0]: dict(zip(headers, cells, strict=True)) for cells in rows if cells})
    return tables


def counted_runs(out: Path) -> pd.DataFrame:
    runs = pd.read_csv(out / "tables" / "runs.csv")
    return runs[runs["counts"]]


def test_the_title_and_summary_name_the_study_and_what_it_was(h100_report):
    name = json.loads((h100_report.out / "tables" / "config.json").read_text())["study_name"]
    assert name == "run records of h100-2026-11-25, h100-2026-11-26"
    title = html.unescape(re.search(r"<title>(.*?)</title>", h100_report.html).group(1))
    heading = html.unescape(re.search(r"<h1>(.*?)</h1>", h100_report.html).group(1))
    # every record ran on one GPU: a benchmark, not a "scaling study"
    assert heading == f"One-GPU benchmark — {name}" and title == f"scalerepro: {heading}"
    study = text(re.search(r'<dd id="study-identity">(.*?)</dd>', h100_report.html, re.S).group(1))
    assert study == f"{name}: one-GPU benchmark; every run used 1 GPU, so nothing was scaled: no scaling efficiency or speedup"


def _record(run_id: str) -> dict:
    """The kept record a run of the records-only report is (its id: <folder>_<file>)."""
    folder, name = run_id.split("_", 1)
    return json.loads((REPO / "benchmarks" / "gpu" / folder / f"{name}.json").read_text())


def test_the_headline_gives_each_model_its_best_figure_with_what_it_takes_to_read_it(h100_report):
    runs = counted_runs(h100_report.out)
    tables = headline_tables(h100_report.html)
    images = tables["Image models: images per second (the whole job, all GPUs)"]
    language = tables["Language models: tokens per second (sequences per second beneath) (the whole job, all GPUs)"]
    assert set(images[1]) == {"resnet18_cifar", "resnet50", "vit_b_16"} and set(language[1]) == {"bert_base", "gpt2_small", "llama_1b"}
    # the figure is the median over repeats, or one run's window mean, said; a language model's is its tokens/s
    assert images[0][1:3] == ["Median (n = 1: window mean) img/s, 1 GPU", "Spread"]
    assert language[0][1:3] == ["Median (n = 1: window mean) tokens/s, 1 GPU", "Spread"]
    peak = gpu_peaks.PEAKS["h100_sxm"].bf16
    for headers, _ in (images, language):
        assert f"MFU vs {peak:.0f} TFLOP/s dense bf16 (H100 SXM5)" in headers and "Clock and power (NVML)" in headers
        assert not {"Max GPUs", "Strong-scaling efficiency"} & set(headers)  # one GPU: nothing scaled, no tautology

    # BERT: two records of one configuration (the 25th's and the 26th's): their median is their
    # mean, which no run measured, so the two runs are shown, in tokens/s
    bert = runs[runs["model"].eq("bert_base")]
    row = language[1]["bert_base"]
    low, high = bert["tokens_per_s"].min(), bert["tokens_per_s"].max()
    assert len(bert) == 2 and row[language[0][1]] == f"{bert['tokens_per_s'].median():,.0f} {bert['samples_per_s'].median():,.0f} sequences/s"
    assert row["Spread"].startswith(f"{low:,.0f} and {high:,.0f} n=2: the median is their mean, which no run measured"), row["Spread"]
    assert "pooled over 2 commits, each with uncommitted changes" in row["Spread"]
    assert "bf16 · batch 256/GPU" in row["Configuration"] and row["Configuration"].endswith("synthetic data")

    # Llama: one counted run (the probe's failure does not count): its own spread over its steps,
    # its clock and power held against the card's, MFU at that clock, and its peak memory withheld
    # (a schema-2 record's peak included the probes: 65.0 GiB where the fixed trainer measured 42.7)
    (llama,) = runs[runs["model"].eq("llama_1b")].itertuples()
    record = _record(llama.run_id)
    tokens = record["batch"]["global"] * record["model"]["tokens_per_sample"]  # a schema-2 record, as kept
    steps = record["measurements"]["step_time_s"]
    row = language[1]["llama_1b"]
    assert (
        row["Spread"] == f"{tokens / steps['p90']:,.0f} – {tokens / steps['p10']:,.0f} n=1: its p10 – p90 steps, of {record['measurements']['measured_steps']}"
    )
    nvml = record["measurements"]["nvml"]
    clock = row["Clock and power (NVML)"]
    assert clock.startswith(
        # the power: the energy counter's delta over the NVML window, not the samples' mean
        f"SM {nvml['sm_clock_mean_mhz']:,.0f} MHz of 1,980 {nvml['energy_j'] / nvml['window_s']:.0f} W of 700 W per GPU, {nvml['temperature_max_c']:.0f} °C max"
    )
    assert "clock events not recorded (before schema 4)" in clock
    mfu = row[f"MFU vs {peak:.0f} TFLOP/s dense bf16 (H100 SXM5)"]
    # MFU at the clock held = MFU x the clock the peak is quoted at / mean clock: the H100 SXM5's dense
    # bf16 989.4 TFLOP/s is 132 SMs x 4,096 FLOP/clk x 1,830 MHz, not at its 1,980 MHz top clock
    assert mfu == f"{100 * llama.mfu:.1f} % {100 * llama.mfu * 1830 / nvml['sm_clock_mean_mhz']:.1f} % at the clock held"
    assert pd.isna(llama.peak_memory_bytes) and record["measurements"]["memory"]["allocated_bytes_max"] > 60 * 2**30
    assert row["Peak memory per GPU (share of its memory)"] == "— withheld: a schema-2 record's peak may include the probes"

    # ResNet-18's best replays CUDA graphs: its peak is the reserved one, said to be an upper bound
    row = images[1]["resnet18_cifar"]
    assert "batch 1,024/GPU" in row["Configuration"] and row["Peak memory per GPU (share of its memory)"].endswith("reserved, an upper bound")

    # the device, with its form factor, its memory and its power limit (the records carry none: the
    # inventory kept beside the 2026-11-25 records, NVML's enforced limit)
    (memory_bytes,) = set(runs["gpu_memory_bytes"])
    device = text(re.search(r'<p class="lead" id="headline-device">(.*?)</p>', h100_report.html, re.S).group(1))
    assert device == f"Every figure below ran on NVIDIA H100 80GB HBM3 (H100 SXM5, {memory_bytes / 2**30:.1f} GiB memory, power limit 700 W)."


def test_a_one_gpu_study_shows_no_scaling_efficiency(tmp_path, monkeypatch):
    """The one-H100 study's own results: its strong-scaling rows are at 1 GPU only, where the
    efficiency is 1 by definition; the headline shows none rather than "100 % at 1 GPUs"."""
    results, done = kept_study_tables(ONE_H100_STUDY, tmp_path, monkeypatch)
    strong = pd.read_csv(results / "tables" / "scaling.csv").query("study == 'strong' and repeats_ok > 0")
    assert len(strong) >= 5 and strong["gpus"].eq(1).all() and strong["efficiency"].eq(1.0).all()  # the tautology is in the table
    page = done["report"].read_text()
    assert re.search(r"<h1>One-GPU benchmark — h100-one-gpu</h1>", page)
    shown = text(headline(page))
    assert "Strong-scaling efficiency" not in shown and "100.0 %" not in shown and "1.00×" not in shown
    assert "every run used 1 GPU, so nothing was scaled" in shown


def test_every_mfu_column_names_its_peak_and_fp32_says_tf32_was_off(h100_report):
    headers = [text(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", h100_report.html, re.S)]
    mfu = [h for h in headers if "MFU" in h]
    assert len(mfu) >= 3 and all(re.search(r"MFU vs .*(TFLOP/s|dense peak)", h) for h in mfu), mfu
    # the per-run table mixes bf16, fp16 and fp32 on one H100: the part in the header, each peak under its value
    per_run = h100_report.html.split('id="per-run"')[1].split("</table>")[0]
    assert "MFU vs the H100 SXM5 dense peak under it" in text(per_run)
    fp32 = gpu_peaks.PEAKS["h100_sxm"].fp32
    row = next(text(r) for r in re.findall(r"<tr>(.*?)</tr>", per_run, re.S) if "resnet50-baseline-baseline" in text(r))
    assert f"vs {fp32:.1f} TFLOP/s dense fp32, TF32 off" in row, row
    fp16 = next(text(r) for r in re.findall(r"<tr>(.*?)</tr>", per_run, re.S) if "optimised-fp16" in text(r))
    assert f"vs {gpu_peaks.PEAKS['h100_sxm'].fp16:.0f} TFLOP/s dense fp16" in fp16


def test_gpu_utilisation_is_judged_on_the_worst_run(h100_report):
    """A host-bound run (the -25 ResNet-18 frontier at 50 %) fails the check; a mean over the others
    hid it. The DataLoader lever (43 %) and the smoke run with DDP at one rank (32 %) are no
    measurement of a configuration as meant: they count in no per-run check."""
    runs = counted_runs(h100_report.out)
    runs = runs[~checking.lever_or_smoke(runs)]
    worst = runs.loc[runs["gpu_util_mean_pct"].idxmin()]
    assert runs["gpu_util_mean_pct"].mean() > 80 > worst["gpu_util_mean_pct"]  # where a mean passes
    row = pd.read_csv(h100_report.out / "tables" / "checks.csv").set_index("check").loc["gpu_utilisation"]
    assert row["status"] == "fail" and row["measured"] == worst["gpu_util_mean_pct"]
    assert row["detail"].startswith(f"worst run_id {worst['run_id']}: ")
    summary = h100_report.html.split('id="checks"')[1].split('id="headline"')[0]
    check = text(re.search(r"<tr><td>gpu_utilisation</td>(.*?)</tr>", summary, re.S).group(1))
    assert check.startswith(
        f"GPU utilisation of every completed run: the worst gpu_util_mean_pct > 80.0% over the runs rows where counts = True "
        f"{worst['gpu_util_mean_pct']:.1f}% — fail "
    ), check
    assert "record_ddp_w1" not in row["detail"] and runs["run_id"].str.contains("record_").sum() == 0


def test_a_figure_within_rounding_of_its_threshold_shows_the_digits_that_decide(h100_report):
    runs = pd.read_csv(h100_report.out / "tables" / "runs.csv")
    utilisation = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["targets"]["checks"]["gpu_utilisation"]
    worst = runs.loc[runs["counts"] & ~checking.lever_or_smoke(runs), "gpu_util_mean_pct"].min()
    for threshold in (worst - 0.001, worst + 0.001):  # either side, 0.001 points away
        (check,) = check_definitions.parse_checks({"checks": {"gpu_utilisation": {**utilisation, "threshold": threshold}}})
        assert check.text(worst) == check.text(threshold)  # one decimal cannot tell them apart
        row = checking.evaluate(check, {"runs": runs})
        assert row["value"] != check.text(threshold), row
        shown = float(row["value"].rstrip("%"))
        # the digits shown say the verdict: over the threshold passes (> strict), at or under it fails
        assert row["status"] == ("pass" if shown > threshold else "fail") == ("pass" if worst > threshold else "fail")


def test_a_data_stall_a_record_holds_on_the_host_clock_is_withheld_and_the_check_says_why(h100_report):
    # GPU records before schema 4 hold the host's wait in the fetch: under CUDA graphs a host that runs
    # ahead blocks there (ResNet-18: 4.5 % in one session, 7.2 % in the next, neither a stall)
    runs = pd.read_csv(h100_report.out / "tables" / "runs.csv")
    assert runs.loc[runs["counts"], "data_stall_fraction"].isna().all()
    assert runs.loc[runs["counts"], "withheld"].str.contains("data_stall_fraction").all()
    row = pd.read_csv(h100_report.out / "tables" / "checks.csv").set_index("check").loc["data_stall"]
    assert row["status"] == "not measured" and "withheld: on a GPU, a record that does not name the clock of its data wait" in row["detail"]


def test_the_power_limit_is_the_inventorys_where_the_study_took_one(h100_report, tmp_path):
    """The records carry no power limit; a study's inventory (NVML, scalerepro.telemetry.inventory)
    does. Its facts here are those nvidia-smi gave on the card of the 2026-11-26 records."""
    smi = (H100_RECORDS[1] / "nvidia-smi.txt").read_text().splitlines()
    facts = dict(zip([h.strip() for h in smi[0].split(",")], [v.strip() for v in smi[1].split(",")]))
    limit = float(facts["power.limit [W]"].removesuffix(" W"))
    runs = counted_runs(h100_report.out)
    inventory = tmp_path / "system.json"
    inventory.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "name": facts["name"],
                        "memory_bytes": int(runs["gpu_memory_bytes"].iloc[0]),
                        "driver": facts["driver_version"],
                        "power_limit_w": limit,
                    }
                ]
            }
        )
    )
    tables = h100_report.out / "tables"
    page = report.render(tables, None, inventory, tables / "config.json", REPO / "config" / "references.yaml", REPO / "report")
    device = text(re.search(r'<p class="lead" id="headline-device">(.*?)</p>', page, re.S).group(1))
    assert device.endswith(f"(H100 SXM5, 79.2 GiB memory, power limit {limit:.0f} W).") and limit == 700


def test_one_gpu_figures_that_could_only_show_a_definition_are_lines_saying_so(h100_report, tmp_path, monkeypatch):
    """A 1-GPU all-reduce moves no byte (bus bandwidth = algbw x 2(N-1)/N = 0): the kept records'
    one-GPU benchmark drew an empty log-scale chart; and a one-GPU study drew efficiency 100 % at 1 GPU."""
    page = h100_report.html
    busbw = (h100_report.out / "plots" / "busbw_vs_size.svg").read_bytes()
    assert "no all-reduce benchmark" in inputs.not_measured_note(busbw, "svg")
    # the report says so in the communication section's one line, with no figure
    communication = page.split('<h3 id="communication" class="run-in">')[1].split("<h3")[0]
    assert "an all-reduce needs two GPUs or more" in text(communication) and "<figure" not in communication
    # the one-rank result is no measurement of a link: left out of the tables, and said so in the summary
    assert pd.read_csv(h100_report.out / "tables" / "communication.csv").empty
    summary = visible(page.split('<section id="summary">')[1].split('id="checks"')[0])
    assert "Left out comm/g1.json: an all-reduce at one rank moves no data" in summary
    results, _ = kept_study_tables(ONE_H100_STUDY, tmp_path, monkeypatch)
    with pytest.raises(rebuild.plots.NotMeasured, match="efficiency at 1 GPU is 100 % by definition"):
        rebuild.plots.efficiency_vs_gpus(rebuild.plots.read_tables(results / "tables"))


def test_the_headline_names_no_ddp_bucket_at_one_gpu(h100_report):
    """DDP buckets exist only where gradients are all-reduced; every kept record ran on 1 GPU."""
    shown = text(headline(h100_report.html))
    assert "batch 256/GPU" in shown and not re.search(r"bucket \d", shown)
