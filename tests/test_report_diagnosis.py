"""Issue 66, point 2: the diagnosis comes first and rests on evidence, on the kept H100 output:
the records of 2026-11-25 and -26 (``h100_report``), the one-H100 studies of 2026-11-27 and -26
rebuilt with today's code.

What it pins: "What bounds each model" sits under the headline, before the published figures;
the reproduction table's references with no run scheduled fold into one line; a verdict rests on
the profile, the power against the limit with the clock, and the MFU, never on NVML's GPU
utilisation, and says "unknown" with what is missing where none holds; the 11-26 records get the
same verdict pooled with the 11-25 ones as in their own study, which kept neither a power limit
nor a top clock; and power-capped language models take the levers of a matmul at its cap."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from scalerepro.analysis.presentation import bottlenecks
from scalerepro.analysis.tables.reproduction import UNSCHEDULED_VERDICT

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, diagnosis_rows, kept_study_rebuilt_once, section, section_element, table_rows, visible

KEPT = REPO / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> RebuiltStudy:
    """The one-H100 study of 2026-11-27: report (b)."""
    return kept_study_rebuilt_once(tmp_path_factory, KEPT / "h100-2026-11-27" / "study-results")


@pytest.fixture(scope="module")
def study_26(tmp_path_factory) -> RebuiltStudy:
    """The one-H100 study of 2026-11-26, whose records the 11-26 records folder holds: report (c)."""
    return kept_study_rebuilt_once(tmp_path_factory, KEPT / "h100-2026-11-26" / "study-results")


@REBUILDS_A_STUDY
def test_the_diagnosis_sits_under_the_headline_before_the_published_figures(h100_report, study):
    for page in (h100_report.html, study.html):
        summary = section_element(page, "summary")
        assert summary.index('id="headline"') < summary.index('id="bottlenecks"')  # in the summary, after the numbers
        assert page.index('id="bottlenecks"') < page.index('<section id="comparison">')
        assert page.count('id="bottlenecks"') == 1
        assert 'href="#bottlenecks"' in page.split("</nav>")[0]  # in the contents
        assert '<h3 id="bottlenecks"><span class="secno">1.1</span> What bounds each model</h3>' in page
        assert 'href="#bottlenecks"' in section(page, "profiling")  # the profiling section points up to it


@REBUILDS_A_STUDY
def test_references_with_no_run_scheduled_fold_into_one_line(study):
    comparison = pd.read_csv(study.results / "tables" / "comparison.csv")
    on_this_gpu = comparison[comparison["group"].eq("reproduction")]
    unscheduled = on_this_gpu[on_this_gpu["verdict"].eq(UNSCHEDULED_VERDICT)]
    assert len(unscheduled) and len(unscheduled) < len(on_this_gpu)
    shown = section(study.html, "reproduction")
    table = shown.split('<p class="note" id="unscheduled">', 1)[0]
    rows = table_rows(table)[1:]
    assert len(rows) == len(on_this_gpu) - len(unscheduled)  # every other reference keeps its row
    assert not [row for row in rows if "no run scheduled" in " ".join(row)]
    line = shown.split('<p class="note" id="unscheduled">', 1)[1].split("</p>", 1)[0]
    assert visible(line).startswith(f"{len(unscheduled)} references on this GPU had no run scheduled")
    assert re.findall(r'<code class="ref-id">(.*?)</code>', line) == list(unscheduled["reference"])  # each named, once


@REBUILDS_A_STUDY
def test_a_verdict_rests_on_evidence_not_on_gpu_utilisation(h100_report, study, study_26):
    for page in (h100_report.html, study.html, study_26.html):
        rows = diagnosis_rows(page)
        assert not [row for found in rows.values() for row in found if "utilisation" in " ".join(row)]
    # ResNet-50 of 11-27 at 13.8 % MFU and its clock at the top: not profiled, so unknown, saying what is missing
    [(what, evidence, lever)] = diagnosis_rows(study.html)["resnet50"]
    assert what == "unknown"
    assert evidence.startswith("no profile; 663 W of 700, SM clock 1,980 of 1,980 MHz: not power-bound (power 94.8 % of the limit, under 95 %)")
    assert evidence.endswith("MFU 12.8 % at the clock held: under 40 %, not shown matmul-bound")
    assert lever.startswith("profile it")
    # ResNet-50 of 11-26, profiled: memory-bound, and the row names the run its profile is of
    resnet50 = section(study_26.html, "bottlenecks").split("resnet50", 1)[1]
    assert "profile: strong_resnet50_g1_r1" in visible(resnet50.split("</td>", 1)[0])
    [(what, evidence, _)] = diagnosis_rows(study_26.html)["resnet50"]
    assert what == "memory-bound normalisation and elementwise kernels"
    assert evidence.startswith("67 % of the captured kernel time")


@REBUILDS_A_STUDY
def test_the_11_26_records_get_the_same_verdict_pooled_and_in_their_own_study(h100_report, study_26):
    """The 11-26 study kept no inventory and its records (schema 3) name neither the power limit
    nor the top clock: the datasheet's stand in, so the verdict does not hang on an inventory
    kept beside other records. (The records' report reads no profile: ResNet-50's is only in (c).)"""
    pooled, own = diagnosis_rows(h100_report.html), diagnosis_rows(study_26.html)
    assert set(own) <= set(pooled)
    verdicts = {model: ([row[0] for row in pooled[model]], [row[0] for row in own[model]]) for model in own if model != "resnet50"}
    assert {model: a for model, (a, b) in verdicts.items() if a == b} == {
        "bert_base": ["power-bound"],
        "gpt2_small": ["power-bound matmuls"],
        "resnet18_cifar": ["unknown"],
        "vit_b_16": ["power-bound"],
    }
    assert own["bert_base"][0][1].startswith("685 W of 700 (datasheet), SM clock 1,812 of 1,980 MHz")


@REBUILDS_A_STUDY
def test_power_capped_language_models_take_the_levers_of_a_matmul_at_its_cap(study):
    rows = diagnosis_rows(study.html)
    for model in ("llama_1b", "gpt2_small"):
        [(what, evidence, lever)] = rows[model]
        assert what == "power-bound matmuls"
        assert "at the clock held: the matmuls take at least that share of the step" in evidence
        assert lever.startswith("FP8 matmuls (Transformer Engine or torchao float8") and "a larger batch" in lever and "fused attention" in lever
    assert rows["llama_1b"][0][1] == "693 W of 700, SM clock 1,550 of 1,980 MHz; MFU 62.9 % at the clock held: the matmuls take at least that share of the step"


def test_a_gemm_dominant_profile_is_matmul_bound_whatever_the_mfu():
    columns = bottlenecks.CLASS_COLUMNS
    profile = {columns["GEMM"]: 0.6, columns["normalisation and elementwise"]: 0.4}
    assert bottlenecks.matmul_bound({"mfu": 0.1}, profile) == "GEMMs 60 % of the profiled kernel time"
    assert bottlenecks.matmul_bound({"mfu": 0.1}, {**profile, columns["GEMM"]: 0.3}) is None
    assert bottlenecks.matmul_bound({"mfu": 0.45, "clocks": {"mfu_at_clock": 0.39}}, None) is None  # the MFU at the clock held decides


def test_the_datasheet_stands_in_only_for_what_the_records_and_inventory_lack():
    clocks = {"power_per_gpu_w": 690.0, "power_limit_w": None, "sm_mean_mhz": 1700.0, "sm_top_mhz": None}
    filled = bottlenecks.with_datasheet_limits(clocks, "NVIDIA H100 80GB HBM3")
    assert (filled["power_limit_w"], filled["sm_top_mhz"]) == (700.0, 1980.0)
    assert bottlenecks.power_bound(filled)["evidence"] == "690 W of 700 (datasheet), SM clock 1,700 of 1,980 MHz"
    assert bottlenecks.with_datasheet_limits({**clocks, "power_limit_w": 600.0}, "NVIDIA H100 80GB HBM3")["power_limit_w"] == 600.0
    assert bottlenecks.with_datasheet_limits(clocks, "NVIDIA A100-SXM4-80GB")["power_limit_w"] is None  # no datasheet power here
