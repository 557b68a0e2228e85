"""Honest labels (issue #66, part 4), on the kept H100 output and the CPU README study: a shrunk
model headlined with its shape, per-run checks judging measurements only, the final loss as the
last logged one with a spike flagged, rerun commands in today's CLI with no machine path, and a
loss-curve figure readable at the report's width."""

from __future__ import annotations

import re
import shutil

import pandas as pd

from scalerepro.analysis import rebuild
from scalerepro.analysis.presentation import plots
from scalerepro.record import columns, read, upgrade

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, kept_study_tables, section_element, table_rows, visible

KEPT = REPO / "benchmarks" / "gpu"
CPU_STUDY = REPO / "tests" / "fixtures" / "studies" / "cpu-readme-a0f872f"
STUDY_27 = KEPT / "h100-2026-11-27" / "study-results"


def test_a_shrunk_model_is_headlined_with_its_shape(tmp_path, monkeypatch):
    """The CPU README study's gpt2_small is 2 layers and 137k parameters, not GPT-2 small's 12 and 124M."""
    results, _ = kept_study_tables(CPU_STUDY, tmp_path, monkeypatch)
    summary = visible(section_element((results / "report" / "index.html").read_text(), "summary"))
    assert "gpt2_small (2 layers, 137k params)" in summary


def test_a_per_run_check_leaves_out_a_lever_run(h100_report):
    """The DataLoader record degraded on purpose (a lever: loader=dataloader against its preset)
    is not what gpu_utilisation judges, and the check's detail says what it left out."""
    row = pd.read_csv(h100_report.out / "tables" / "checks.csv").set_index("check").loc["gpu_utilisation"]
    assert "dataloader" not in row["detail"].split(";")[0]
    assert row["measured"] > 42.84  # the DataLoader run's figure
    assert "left out, not a measurement of a configuration as meant" in row["detail"]


def test_the_final_loss_is_the_last_logged_one_and_a_spike_is_flagged():
    """ResNet-18's epoch mean (2.776) carries its 21.6 at step 10; the run ended at 2.02."""
    record = read.read(STUDY_27 / "runs" / "strong_resnet18_cifar_g1_r1" / "record.json").record
    row = columns.row(record)
    assert row["final_train_loss"] == record.loss_log[-1].loss
    assert abs(row["final_train_loss"] - 2.021) < 0.001
    assert row["loss_spike"].startswith("21.6 at step 10")
    calm = read.read(STUDY_27 / "runs" / "strong_vit_b_16_g1_r1" / "record.json").record
    assert columns.row(calm)["loss_spike"] is None


def test_old_rerun_commands_read_in_todays_cli_with_no_machine_path(h100_report):
    rerun = section_element(h100_report.html, "reproducibility")
    assert not re.search(r"(/opt/|/work/|/home/|/tmp/|\.venv/)", rerun)
    commands = [row[-1] for row in table_rows(rerun) if row and row[0].startswith("h100-")]
    assert len(commands) == 22
    assert all(command.startswith(("python -m scalerepro.training.train ", "# not runnable with today's code")) for command in commands)
    assert not any(" --batch-size " in command.split(" # today")[0] for command in commands)
    old = read.read(KEPT / "h100-2026-11-25" / "bert_base-optimised-frontier.json").record
    command = upgrade.rerun_command(old.command_line)
    assert command.startswith("python -m scalerepro.training.train --model bert_base --per-gpu-batch 256 ")


@REBUILDS_A_STUDY
def test_the_loss_curves_are_a_readable_grid_with_a_spike_off_the_axis(tmp_path, monkeypatch):
    """Six models made a strip 7.4 times as wide as high; the ResNet-18 spike flattened its curve."""
    results, _ = kept_study_tables(STUDY_27, tmp_path, monkeypatch)
    figure = plots.loss_curves(plots.read_tables(results / "tables"))
    width, height = figure.get_size_inches()
    assert width / height < 3
    (resnet18,) = [ax for ax in figure.axes if ax.get_title() == "resnet18_cifar"]
    assert resnet18.get_ylim()[1] < 3 and any("spike 21.6 at step 10" in text.get_text() for text in resnet18.texts)


@REBUILDS_A_STUDY
def test_a_check_means_one_thing_in_every_report(tmp_path, capsys, monkeypatch):
    """The 11-26 study's config judged gpu_utilisation by the mean over its runs, which hides a
    host-bound run behind fast ones; today's config judges the worst run. Rebuilt with today's
    config, the study keeps its threshold and selection and the check means what it means in
    every other report, and the rebuild says what changed."""
    from scalerepro.analysis.tables import checking

    study = tmp_path / "results"
    shutil.copytree(KEPT / "h100-2026-11-26" / "study-results", study)
    monkeypatch.setattr(rebuild.plots, "draw", lambda tables, out: [])
    rebuild.rebuild(study, REPO / "config" / "references.yaml", REPO / "report", REPO / "config" / "config.yaml")
    said = capsys.readouterr().err
    assert "check gpu_utilisation: judged as config.yaml defines it today, at the study's threshold; the study's config had reduce 'mean'" in said
    row = pd.read_csv(study / "tables" / "checks.csv").set_index("check").loc["gpu_utilisation"]
    assert row["target"].startswith("GPU utilisation of every completed run: the worst gpu_util_mean_pct > 80.0%"), row["target"]
    # the worst of its five counted runs, not their mean (98.3 %)
    runs = pd.read_csv(study / "tables" / "runs.csv")
    counted = runs[runs["counts"].astype(bool) & ~checking.lever_or_smoke(runs)]
    assert row["value"] == f"{counted['gpu_util_mean_pct'].min():.1f}%"
