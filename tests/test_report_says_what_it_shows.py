"""No sentence of the report contradicts the page, names an internal of this project or a path of
the machine that rendered it: on the reports a GPU user reads, the kept H100 records' (``h100_report``)
and the kept one-H100 study of 2026-11-27 rebuilt in another folder."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, kept_study_rebuilt_once, section, section_element, table_rows, visible

STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "study-results"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> RebuiltStudy:
    return kept_study_rebuilt_once(tmp_path_factory, STUDY)


def test_a_records_report_says_records_not_a_plan_and_reruns_by_the_records_own_command(h100_report):
    page = h100_report.html
    summary = visible(section_element(page, "summary"))
    assert "Runs 22 records:" in summary and "22 planned" not in summary
    assert "which no study planned" in summary and "the checks are config.yaml's" in summary
    reproducibility = visible(section_element(page, "reproducibility"))
    assert "each is rerun by its record's own command line" in reproducibility and "--forcerun" not in reproducibility
    assert "No study ran with a configuration" in reproducibility and "the study ran with" not in reproducibility
    assert "22 of 22 records runs" not in visible(section_element(page, "failures"))


def test_no_sentence_says_not_measured_above_what_was_measured(h100_report):
    page = h100_report.html
    energy = visible(section(page, "energy"))
    # these runs have one GPU count: the figure is each model's energy per image or per token, drawn
    assert "Energy per image and per token" in energy and "not drawn" not in energy
    assert "no completed scaling run recorded GPU energy" not in energy
    runs = pd.read_csv(h100_report.out / "tables" / "runs.csv")
    assert runs.loc[runs["counts"], "energy_per_sample_j"].notna().sum() >= 15
    profiling = visible(section(page, "profiling"))
    assert "profiling.enabled is false" not in profiling and "Not profiled here: a report of records no study planned" in profiling
    assert "h100-2026-11-26/study-results/profiles" in profiling  # the profile beside the records, named
    history = visible(section_element(page, "history"))
    assert "--history" not in history and "only the workflow's report rule reads the store's history" in history


@REBUILDS_A_STUDY
def test_no_internal_word_and_no_path_of_the_rendering_machine(h100_report, study):
    for page, out in ((h100_report.html, h100_report.out), (study.html, study.results)):
        shown = visible(page)
        for internal in ("issue 14", "of this project", "nvidia smi topo reason", "references.yaml: \u201c", "GPU reason"):
            assert internal not in shown, internal
        # (a record's own command line names the GPU machine's paths: the record's words, shown as such)
        for path in (str(out), str(out.parent), str(REPO / "config"), str(REPO / "report")):
            assert path not in page, path


@REBUILDS_A_STUDY
def test_the_ablations_strict_fp32_baseline_is_said_on_its_rows(study):
    rows = {row[2]: row for row in table_rows(section(study.html, "ablation")) if len(row) > 3}
    assert "a baseline stricter than stock PyTorch: fp32 with TF32 off for convolutions as for matmuls" in rows["baseline"][-1]
    assert rows["bf16"][-1] == "a gain against that stricter baseline"


def test_rebuild_help_says_its_first_line_whole():
    done = subprocess.run([sys.executable, "-m", "scalerepro.analysis.rebuild", "--help"], capture_output=True, text=True, timeout=60)
    first = done.stdout.split("\n\n")[1].replace("\n", " ")
    assert done.returncode == 0 and first.endswith("no run, no benchmark, no Snakemake."), first


def test_the_system_section_lists_every_host_and_card_the_records_ran_on(h100_report):
    # the 2026-11-25 session's host had 16 usable CPUs, the 2026-11-26 session's 8: one inventory showed 16 for both
    rows = table_rows(section(h100_report.html, "hosts"))
    hosts = {(row[0], row[2], row[3]): int(row[6]) for row in rows[1:]}
    assert hosts == {("vm", "8", "NVIDIA H100 80GB HBM3"): 5, ("vm", "16", "NVIDIA H100 80GB HBM3"): 16}  # completed runs
