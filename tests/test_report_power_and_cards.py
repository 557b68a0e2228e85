"""The power, energy, throughput and card figures of the H100 reports, chased against the kept
records and the inventories kept beside them (issue #66, "Figures that are wrong"):

* the mean power is the energy counter's delta over the NVML window (the power samples are 1 s
  moving averages on Hopper and read low over a window of seconds);
* energy per sample divides the energy and the samples of one window;
* the power read before step 1 (with the CUDA context up) is named for what it is, not "idle";
* one run's headline figure is its window mean, with its median step's rate beside it;
* what a record lacks of its card comes from the inventory kept in its own folder, never another's,
  and the hosts table has a row per card and day.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from scalerepro.analysis.presentation import inventory_view

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, kept_study_tables, rebuild_from_records, section, table_rows, visible

KEPT = REPO / "benchmarks" / "gpu"
STUDY = KEPT / "h100-2026-11-27" / "study-results"
RESNET18 = "strong_resnet18_cifar_g1_r1"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The kept one-H100 study of 2026-11-27 rebuilt without its figures: its runs.csv and page."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        results, _ = kept_study_tables(STUDY, tmp_path_factory.mktemp("power"), monkeypatch)
    finally:
        monkeypatch.undo()
    runs = pd.read_csv(results / "tables" / "runs.csv").set_index("run_id")
    return runs, (results / "report" / "index.html").read_text()


def _record(run_id: str) -> dict:
    return json.loads((STUDY / "runs" / run_id / "record.json").read_text())


def test_power_is_the_energy_counters_mean_over_the_nvml_window(study):
    runs, page = study
    nvml = _record(RESNET18)["measurements"]["nvml"]
    counter = nvml["energy_j"] / nvml["window_s"]  # 2,157.839 J / 3.175 s = 679.7 W
    assert counter == pytest.approx(679.7, abs=0.1) and nvml["power_mean_w"] == pytest.approx(608.5, abs=0.1)
    assert runs.loc[RESNET18, "power_w"] == pytest.approx(counter) and runs.loc[RESNET18, "power_basis"] == "energy counter"
    # the headline, the bottleneck finding and the energy tables read it, not the samples' 609 W
    headline = {row[0].split()[0]: row for row in table_rows(section(page, "headline"))}
    assert "680 W of 700 W per GPU" in headline["resnet18_cifar"][4], headline["resnet18_cifar"]
    energy = {row[0].replace(" ", ""): row for row in table_rows(section(page, "energy"))[1:] if len(row) > 8}
    assert energy[RESNET18][6:8] == ["680", "609"]  # the mean power, then the samples' mean beside it


def test_energy_per_sample_divides_one_windows_energy_and_samples(study):
    runs, _ = study
    for run_id in ("strong_resnet18_cifar_g1_r1", "strong_llama_1b_g1_r1", "ablation_resnet18_cifar_g1_bf16_r1"):
        m = _record(run_id)["measurements"]
        nvml = m["nvml"]
        # the NVML window's mean power x the measured steps' seconds / their samples
        same_window = nvml["energy_j"] / nvml["window_s"] * m["window_s"] / m["measured_samples"]
        above = (nvml["energy_j"] / nvml["window_s"] - nvml["idle_power_w"]) * m["window_s"] / m["measured_samples"]
        assert runs.loc[run_id, "energy_per_sample_j"] == pytest.approx(same_window, rel=1e-9)
        assert runs.loc[run_id, "energy_per_sample_net_j"] == pytest.approx(above, rel=1e-9)
    # ResNet-18: the record's figure puts the NVML window's energy (3.175 s) over the steps' samples (3.103 s)
    stated = _record(RESNET18)["measurements"]["energy_per_sample_j"]
    assert runs.loc[RESNET18, "energy_per_sample_j"] == pytest.approx(stated * 3.103050 / 3.174856, rel=1e-5)


def test_the_power_before_step_1_is_named_for_what_it_is(study):
    _, page = study
    shown = visible(page)
    assert "Power before step 1, context up (W)" in table_rows(section(page, "energy"))[0]
    assert "nvidia-smi's idle reading can be well below it" in shown
    for word in ("Idle power", "idle power", "net of idle"):
        assert word not in shown, word


def test_one_runs_headline_figure_is_its_window_mean_with_its_median_steps_rate(study):
    runs, page = study
    rows = table_rows(section(page, "headline"))
    assert rows[0][1] == "Window mean img/s, 1 GPU", rows[0]
    resnet18 = next(row for row in rows if row[0].startswith("resnet18_cifar"))
    # 1,024 images / 0.0123619 s, the median step; the window's mean is 80,189
    median_step = 1024 / runs.loc[RESNET18, "step_time_median_s"]
    assert round(median_step) == 82_835
    assert resnet18[1].startswith("80,189 one run: its window's mean; median step 82,835"), resnet18[1]


@REBUILDS_A_STUDY
def test_a_records_card_comes_from_the_inventory_in_its_own_folder(tmp_path):
    """The 2026-11-26 records name no card, no power limit and no top clock; nvidia-smi's query
    kept beside them gives 700 W and 1,980 MHz (and no UUID)."""
    done = rebuild_from_records((KEPT / "h100-2026-11-26",), tmp_path / "out")
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "out" / "report" / "index.html").read_text()
    assert "power limit 700 W" in visible(section(page, "headline")), visible(section(page, "headline"))[:600]
    headline = {row[0].split()[0]: row for row in table_rows(section(page, "headline"))}
    assert "of 1,980" in headline["resnet50"][4] and "of 700 W per GPU" in headline["resnet50"][4], headline["resnet50"]
    assert "from the inventory beside the records" in headline["resnet50"][4]
    hosts = table_rows(section(page, "hosts"))[1:]
    assert [row[4] for row in hosts] == ["not recorded: the record (before schema 4) and any inventory beside it name none"]


@REBUILDS_A_STUDY
def test_one_row_per_card_and_day_and_no_record_takes_another_folders_inventory(h100_report, tmp_path):
    """The records of 2026-11-25 (a system inventory beside them, card GPU-decde575-…) and of
    2026-11-26 (nvidia-smi's query beside them, no UUID): a row a day, and the second day's records
    never take the first folder's card, though the report's system section describes that folder's."""
    hosts = table_rows(section(h100_report.html, "hosts"))[1:]
    cards = {row[7][:10]: row[4] for row in hosts}
    assert len(hosts) == 2, hosts
    assert cards["2026-11-25"] == "GPU-decde575-c257-69ae-0f43-c505c5bc60e3 (from the inventory beside the record: system.json)"
    assert cards["2026-11-27"].startswith("not recorded"), cards
    # ViT-B/16 ran on both days: one card named, one run's not
    vit = next(row for row in table_rows(section(h100_report.html, "headline")) if row[0].startswith("vit_b_16"))
    assert "pooled over 1 card (GPU-decde575-c…) and 1 run whose card is not recorded" in vit[2], vit[2]
    # the second day's records with nothing beside them: still no card, and no limit from the first folder's
    bare = tmp_path / "bare"
    bare.mkdir()
    for record in (KEPT / "h100-2026-11-26").glob("*.json"):
        shutil.copy(record, bare)
    done = rebuild_from_records((KEPT / "h100-2026-11-25", bare), tmp_path / "out")
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "out" / "report" / "index.html").read_text()
    cards = {row[7][:10]: row[4] for row in table_rows(section(page, "hosts"))[1:]}
    assert cards["2026-11-27"].startswith("not recorded") and cards["2026-11-25"].startswith("GPU-decde575"), cards


def test_an_inventory_of_another_host_or_of_several_cards_gives_no_card():
    gpu = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-a", "power_limit_w": 700.0, "max_sm_clock_mhz": 1980}
    runs = pd.DataFrame([{"run_id": "r", "device_type": "cuda", "device_name": gpu["name"], "hostname": "vm", "gpus": 1, "gpu_uuid": None}])
    same_host = inventory_view.cards_beside(runs, REPO / "no-such-study", {"hostname": "vm", "gpus": [gpu]})
    assert same_host.loc[0, "gpu_uuid"] == "GPU-a" and same_host.loc[0, "power_limit_w"] == 700.0
    other_host = inventory_view.cards_beside(runs, REPO / "no-such-study", {"hostname": "node7", "gpus": [gpu]})
    assert other_host.loc[0, "gpu_uuid"] is None and other_host.loc[0, "card_basis"] is None
    # eight cards of the model: which ran the run cannot be told, their common limit can
    eight = inventory_view.cards_beside(runs, REPO / "no-such-study", {"hostname": "vm", "gpus": [{**gpu, "uuid": f"GPU-{i}"} for i in range(8)]})
    assert eight.loc[0, "gpu_uuid"] is None and eight.loc[0, "power_limit_w"] == 700.0


def test_nvidia_smis_capture_reads_as_the_inventory_kept_beside_the_records():
    for folder, uuid in (("h100-2026-11-26", None), ("h100-2026-11-27", "GPU-5ea3e17d-f7f0-939b-7945-1fb9aba95633")):
        (gpu,) = inventory_view.smi_gpus((KEPT / folder / "nvidia-smi.txt").read_text())
        assert (gpu["name"], gpu.get("uuid"), gpu["power_limit_w"], gpu["max_sm_clock_mhz"]) == ("NVIDIA H100 80GB HBM3", uuid, 700.0, 1980.0)


def test_the_hosts_table_has_a_row_per_card_and_day():
    """Two sessions' runs on one host whose records name no card may be on two cards of it."""
    run = {"status": "ok", "device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "hostname": "vm", "gpu_uuid": None}
    runs = pd.DataFrame([{**run, "started_at": "2026-11-25T17:31:01+00:00"}, {**run, "started_at": "2026-11-27T11:17:08+00:00"}])
    assert [row["started"] for row in inventory_view.hosts_of_runs(runs)] == [
        "2026-11-25 17:31 – 2026-11-25 17:31 UTC",
        "2026-11-27 11:17 – 2026-11-27 11:17 UTC",
    ]


@REBUILDS_A_STUDY
def test_a_kept_study_without_an_inventory_takes_its_card_from_the_capture_its_user_names(tmp_path, monkeypatch, capsys):
    """The 11-26 study kept no inventory of its own; the session's nvidia-smi capture beside it
    names the card's 700 W limit and 1,980 MHz top clock. Named with --inventory, the report takes
    them from it and says so; unnamed, the limit is not recorded; a study with an inventory of its
    own refuses one."""
    from scalerepro.analysis import rebuild

    monkeypatch.setattr(rebuild.plots, "draw", lambda tables, out: {})  # no figure: the page is what is read
    refs = ["--references", str(REPO / "config" / "references.yaml")]
    templates = ["--templates", str(REPO / "report")]
    pages = {}
    for named in (False, True):
        study = tmp_path / f"named-{named}"
        shutil.copytree(KEPT / "h100-2026-11-26" / "study-results", study)
        extra = ["--inventory", str(KEPT / "h100-2026-11-26" / "nvidia-smi.txt")] if named else []
        assert rebuild.main(["--results", str(study), *refs, *templates, *extra]) == 0
        pages[named] = visible((study / "report" / "index.html").read_text())
    assert "(H100 SXM5, 79.2 GiB memory, power limit not recorded (neither the records nor an inventory kept beside them name it))" in pages[False]
    assert "(H100 SXM5, 79.2 GiB memory, power limit 700 W)" in pages[True]
    assert "SM 1,839 MHz of 1,980" in pages[True] and "limit and top clock from the inventory beside the records" in pages[True]
    own = tmp_path / "own"
    shutil.copytree(STUDY, own)
    capsys.readouterr()
    assert rebuild.main(["--results", str(own), *refs, *templates, "--inventory", str(KEPT / "h100-2026-11-26" / "nvidia-smi.txt")]) != 0
    assert "is the study's own inventory; leave --inventory out" in capsys.readouterr().err
