"""The Snakemake workflow end to end on the CPU (config/ci.yaml): CIFAR-10 fetched from a local
HTTP server in the official archive format, 1 and 2 gloo ranks, strong and weak scaling,
sensitivity, ablation, the all-reduce benchmark, aggregation, plots and the report; then the
tables are checked against the records, reruns are checked with dry runs, bad configs are refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import yaml

from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES
from scalerepro.common import cpu_features
from scalerepro.launching import fork_server

from conftest import REPO, load_record
from workflow_runs import COPY_IGNORE, SNAKEMAKE, cifar_server, snakemake, workflow_env  # noqa: F401 - cifar_server: a fixture, used by name

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(tmp_path_factory, cifar_server):  # noqa: F811 - the imported fixture
    """The CI study run once in a copy of the repository; yields the copy."""
    workdir = tmp_path_factory.mktemp("study") / "scalerepro"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    url, md5 = cifar_server
    started = time.monotonic()
    result = snakemake(workdir, "--cores", "2", "--configfile", "config/ci.yaml", "--config", f"cifar10={{url: '{url}', md5: '{md5}'}}")
    elapsed = time.monotonic() - started
    logs = "\n".join(f"--- {p}\n{p.read_text()[-1500:]}" for p in sorted((workdir / "results").rglob("*.log")) if p.stat().st_size)
    assert result.returncode == 0, result.stderr[-6000:] + logs[-6000:]
    print(f"CI study: the whole DAG in {elapsed:.0f} s")
    workdir.joinpath("study_output").write_text(result.stdout + result.stderr)
    workdir.joinpath("study_args").write_text(json.dumps([url, md5]))
    return workdir


# The CI study's training runs: strong and weak 1 and 2 GPUs x 2 repeats, sensitivity 2, ablation 4,
# parallelism 2 (fsdp and tp of a tiny GPT).
# training jobs: the matrix's rows less those that read another cell's run (record_of). Where the
# preset trains bf16 (a CPU with native bf16: scalerepro.common.cpu_features), the sensitivity's
# bf16 cell at 25 MB runs what a weak 2-GPU repeat runs and one run serves both; elsewhere the
# preset trains fp32 and they are two runs.
CI_RUNS = 14 if cpu_features.native_bf16()[0] else 15
# the matrix's rows: the store holds one a cell run, a row that reads another's run included
CI_ROWS = 16


def _records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: load_record(p) for p in sorted((workdir / "results/runs").glob("*/record.json"))}


def test_the_whole_dag_ran_and_every_record_is_valid(study):
    records = _records(study)
    matrix = pd.read_csv(study / "results/tables/matrix.csv")
    # one run for one configuration: a row that reads another cell's run has no record of its own
    owner = {run: of if isinstance(of, str) and of else run for run, of in zip(matrix.run_id, matrix.record_of)}
    assert set(records) == set(owner.values()) and len(records) == CI_RUNS
    records = {run: records[of] for run, of in owner.items()}
    assert all(r["status"] == "ok" for r in records.values()), {k: r["error"] for k, r in records.items() if r["status"] != "ok"}
    # every rank forked by the invocation's fork server (torch imported once), none a new process
    logs = {run: (study / f"results/runs/{run}/train.log").read_text() for run in set(owner.values())}
    assert all(fork_server.FORKED_LINE in log and "starts as a new process" not in log for log in logs.values()), logs
    strong2 = records["strong_cnn_g2_r1"]
    assert strong2["parallel"]["world_size"] == 2 and strong2["parallel"]["backend"] == "gloo"
    # strong scaling: one global batch (per-GPU batch 16 x the largest count, 2) at every count;
    # one GPU runs it as 2 accumulated micro-batches of 16
    assert strong2["batch"]["global_batch"] == records["strong_cnn_g1_r1"]["batch"]["global_batch"] == 32
    assert records["strong_cnn_g1_r1"]["batch"]["grad_accum_steps"] == 2 and strong2["batch"]["grad_accum_steps"] == 1
    assert strong2["data"]["kind"] == "cifar10" and strong2["data"]["train_samples"] == 500
    weak2 = records["weak_cnn_g2_r1"]
    assert weak2["data"]["kind"] == "synthetic" and weak2["data"]["train_samples"] == 512 and weak2["batch"]["micro_batch"] == 16
    assert records["ablation_cnn_g2_all_r1"]["knobs"]["loader"] == "device"
    assert records["ablation_cnn_g2_all_r1"]["knobs"]["optimizer_impl"] == "fused"
    assert records["sensitivity_cnn_g2_bucket1-batch16-bf16_r1"]["knobs"]["bucket_cap_mb"] == 1.0
    manifest = json.loads((study / "results/data/cifar10/manifest.json").read_text())
    assert manifest["source"].startswith("http://127.0.0.1:")
    comm = json.loads((study / "results/comm/g2.json").read_text())
    assert comm["world_size"] == 2 and [r["size_bytes"] for r in comm["results"]] == [4096, 1048576]
    inventory = json.loads((study / "results/inventory/system.json").read_text())
    assert inventory["gpus"] == [] and inventory["gpu_reason"]
    for name in ("index.html",):
        assert (study / "results/report" / name).stat().st_size > 10_000


def test_the_torch_fallback_profiled_the_ci_study_and_the_report_shows_it(study):
    profiling = pd.read_csv(study / "results/tables/profiling.csv").set_index("run_id")
    assert sorted(profiling.index) == ["strong_cnn_g1_r1", "strong_cnn_g2_r1"]  # each model at 1 GPU and the largest count
    assert set(profiling.tools) == {"torch"} and set(profiling.source) == {"torch.profiler (CPU operators)"}
    shares = profiling[["compute_fraction", "exposed_comm_fraction", "data_wait_fraction", "idle_fraction"]].sum(axis=1)
    assert shares.tolist() == pytest.approx([1.0, 1.0])
    assert profiling.loc["strong_cnn_g2_r1", "communication_s"] > 0 and profiling.loc["strong_cnn_g1_r1", "communication_s"] == 0
    assert profiling.classification.notna().all() and profiling.evidence.str.contains("exposed communication").all()
    for run_id in profiling.index:
        raw = study / "results/profiles" / run_id / "torch"
        assert (raw / "trace.json").stat().st_size > 1000 and (raw / "operators.csv").is_file()
    html = (study / "results/report/index.html").read_text()
    assert "Fallback: torch.profiler" in html and 'href="../profiles/strong_cnn_g2_r1/torch/trace.json"' in html
    assert profiling.loc["strong_cnn_g2_r1", "classification"] in html


def _config_with(tmp_path: Path, **profiling) -> Path:
    config = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    config["profiling"].update(profiling)
    path = tmp_path / "profiling.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_profiling_disabled_puts_no_profiling_rule_in_the_dag(tmp_path):
    result = snakemake(REPO, "-n", "--configfile", str(_config_with(tmp_path, enabled=False)), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    assert "train " in jobs and "profile" not in jobs


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here: its absence cannot be shown")
def test_profiling_with_nsys_missing_falls_back_or_fails_with_one_line(tmp_path):
    refused = snakemake(REPO, "-n", "--configfile", str(_config_with(tmp_path, tool="nsys", fallback=False)), timeout=120)
    assert refused.returncode != 0
    assert (
        "config error at 'profiling.tool': nsys was asked for but nsys is not on PATH, and profiling.fallback is false: install Nsight, "
        "set profiling.tool: torch, or set profiling.fallback: true"
    ) in refused.stdout + refused.stderr
    fallback = snakemake(REPO, "-n", "--configfile", str(_config_with(tmp_path, tool="nsys", fallback=True)), timeout=120)
    assert fallback.returncode == 0 and "results/profiles/strong_cnn_g2_r1/torch/capture.json" in fallback.stdout


def test_measured_runs_never_overlap(study):
    """Two measured runs at once on two cores measured each other (2-rank cells at 8 % strong
    efficiency); the local scheduler now runs one measured job at a time."""
    windows = sorted((r["started_at"], r["ended_at"], run) for run, r in _records(study).items())
    overlapping = [(a[2], b[2]) for a, b in zip(windows, windows[1:]) if b[0] < a[1]]
    assert not overlapping, overlapping
    activity = [r["measurements"]["host_activity"]["other_cpu_fraction_max"] for r in _records(study).values()]
    assert all(fraction is not None for fraction in activity)


def test_tables_match_the_records(study):
    records = _records(study)
    runs = pd.read_csv(study / "results/tables/runs.csv").set_index("run_id")
    for run_id, record in records.items():
        assert runs.loc[run_id, "samples_per_s"] == pytest.approx(record["measurements"]["samples_per_s"])
        assert runs.loc[run_id, "status"] == record["status"]
        # The matrix's precision is the trainer's, preset included (the cells run --preset optimised).
        assert runs.loc[run_id, "precision"] == record["precision"]["name"], run_id
    scaling = pd.read_csv(study / "results/tables/scaling.csv")
    for (kind, gpus), cell in scaling.groupby(["study", "gpus"]):
        values = [records[f"{kind}_cnn_g{gpus}_r{k}"]["measurements"]["samples_per_s"] for k in (1, 2)]
        assert cell["samples_per_s_median"].item() == pytest.approx(statistics.median(values))
        assert cell["samples_per_s_min"].item() == pytest.approx(min(values))
    strong = scaling[scaling.study == "strong"].set_index("gpus")
    # strong efficiency E = throughput(N) / (N x throughput(1))
    expected = strong.loc[2, "samples_per_s_median"] / (2 * strong.loc[1, "samples_per_s_median"])
    assert strong.loc[2, "efficiency"] == pytest.approx(expected)
    weak = scaling[scaling.study == "weak"].set_index("gpus")
    assert weak.loc[2, "efficiency"] == pytest.approx(weak.loc[1, "epoch_time_s"] / weak.loc[2, "epoch_time_s"])
    ablation = pd.read_csv(study / "results/tables/ablation.csv").set_index("variant")
    base = records["ablation_cnn_g2_baseline_r1"]["measurements"]["samples_per_s"]
    fused = records["ablation_cnn_g2_fused_optimizer_r1"]["measurements"]["samples_per_s"]
    assert ablation.loc["fused_optimizer", "gain"] == pytest.approx(fused / base - 1)
    checks = pd.read_csv(study / "results/tables/checks.csv")
    # a CPU study: every check it can measure is judged, and says it is a CPU study's verdict
    judged = checks[checks.status != "not measured"]
    assert len(checks) == 6 and len(judged) >= 4 and set(judged.status) <= {"pass", "fail", "inconclusive"}
    assert judged.detail.str.startswith("a CPU study, judged at CPU scale").all()
    assert checks.set_index("check").loc["gpu_utilisation", "status"] == "not measured"
    comparison = pd.read_csv(study / "results/tables/comparison.csv")
    assert comparison.verdict.eq("not comparable: GPU").all() and comparison.differs.str.startswith("GPU (this study ran on CPU").all()
    assert {"samples_per_s_cv", "samples_per_s_ci_low", "noisy"} <= set(scaling.columns)
    comm = pd.read_csv(study / "results/tables/communication.csv")
    assert sorted(comm.size_bytes) == [4096, 1048576]
    assert comm.busbw_gbps.tolist() == pytest.approx((comm.algbw_gbps * 2 * (2 - 1) / 2).tolist())


def test_the_parallelism_table_and_section_show_the_fsdp_and_tp_cells(study):
    records = _records(study)
    table = pd.read_csv(study / "results/tables/parallelism.csv").set_index("parallel")
    assert sorted(table.index) == ["fsdp", "tp"] and table["gpus"].eq(2).all() and table["repeats_ok"].eq(1).all()
    for strategy, cell in table.iterrows():
        (run_id,) = [r for r, record in records.items() if r.startswith(f"parallelism_gpt2_small_g2_{strategy}_")]
        measured = records[run_id]["measurements"]
        assert cell["samples_per_s_median"] == pytest.approx(measured["samples_per_s"]) and measured["samples_per_s"] > 0
        assert cell["tokens_per_s_per_gpu"] == pytest.approx(measured["tokens_per_s"] / 2)  # tokens/s / gpus
        assert cell["state_bytes_per_rank_max"] == measured["sharding"]["state_bytes_per_rank_max"] > 0
    assert table.loc["fsdp", "comm_bytes_per_step"] > 0 and table.loc["tp", "comm_bytes_per_step"] > 0
    assert "tp_all_gather" in table.loc["tp", "comm_by_collective"] and "all_gather" in table.loc["fsdp", "comm_by_collective"]
    page = (study / "results/report/index.html").read_text()
    part = page.split('<h3 id="parallelism">')[1].split('<h3 id="communication">')[0]
    assert "<code>fsdp</code>" in part and "<code>tp</code>" in part and "This is a CPU study" in part


def test_the_scaling_model_predicts_the_cpu_runs(study):
    model = pd.read_csv(study / "results/tables/scaling_model.csv")
    measured = model[model.basis.eq("measured") & model.gpus.eq(2)].set_index("study")
    assert set(measured.index) == {"strong", "weak"} and measured.step_time_predicted_s.notna().all(), model.note.tolist()
    assert measured.network.str.startswith("fit to g2.json").all()
    beyond = model[model.basis.eq("predicted")]
    assert sorted(set(beyond.gpus)) == [4, 8, 16] and beyond.efficiency_predicted.notna().all()
    assert "Scaling model" in (study / "results/report/index.html").read_text()
    # the model above replays the one-GPU runs' bucket probe; no other run takes one
    buckets = {
        run: json.loads((study / f"results/runs/{run}/record.json").read_text())["measurements"]["backward_buckets"]
        for run in ("strong_cnn_g1_r1", "strong_cnn_g2_r1")
    }
    assert buckets["strong_cnn_g1_r1"]["steps"] > 0 and buckets["strong_cnn_g2_r1"]["reason"] == "--bucket-probe-steps 0"


def test_nothing_left_to_do_and_reruns_are_exact(study, tmp_path):
    """Each edit reruns exactly the rules whose programs import the edited file
    (scalerepro.common.source_closure): a planning edit reruns nothing, a training edit every
    training and profiling job and what follows them, an analysis edit the steps that import it."""

    def planned(*args: str, workdir: Path = study) -> dict[str, int]:
        url, md5 = json.loads((study / "study_args").read_text())
        result = snakemake(workdir, "-n", "--configfile", "config/ci.yaml", "--config", f"cifar10={{url: '{url}', md5: '{md5}'}}", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        text = result.stdout + result.stderr
        if "Nothing to be done" in text:
            return {}
        table = text.split("Job stats:")[1].split("\n\n")[0].splitlines()[3:]
        return {line.split()[0]: int(line.split()[1]) for line in table if line.split() and line.split()[0] != "total"}

    assert planned() == {}
    # a lost table is rebuilt, and what is made from it, not passed over ("Nothing to be done")
    lost = study / "results/tables/cost.csv"
    kept, times = lost.read_bytes(), lost.stat()
    lost.unlink()
    try:
        rebuilt = planned()
    finally:
        lost.write_bytes(kept)
        os.utime(lost, ns=(times.st_atime_ns, times.st_mtime_ns))  # as it was: nothing newer than its consumers
    assert rebuilt.get("aggregate") == 1 and "train" not in rebuilt, rebuilt

    def edited(path: Path) -> dict[str, int]:
        # A real edit: Snakemake compares the content of small inputs, not only their mtime.
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit\n")
        try:
            return planned()
        finally:
            path.write_bytes(original)

    # The study moved to another folder (mtimes kept, as cp -a or rsync -a keep them) is still done.
    moved = tmp_path / "moved" / "scalerepro"
    shutil.copytree(study, moved, symlinks=True)
    assert planned(workdir=moved) == {}
    # Planning code runs in no job: editing it reruns nothing (it reran every training job while
    # every .py outside analysis/ counted as trainer code).
    for planning_module in ("planning/study.py", "planning/plan.py", "planning/submission.py", "data/fetch.py"):
        assert edited(study / "workflow/scalerepro" / planning_module) == {}, planning_module
    after_trainer_edit = edited(study / "workflow/scalerepro/training/trainer.py")
    # every training job runs again: the CI study's two rounds are the budget's floor, which the
    # study_budget checkpoint's choice is made from again (and the matrix of the runs it keeps)
    matrix = pd.read_csv(study / "results/tables/matrix.csv")
    measured = int(matrix.record_of.isna().sum())
    assert after_trainer_edit == {
        "code_fingerprint": 2,
        "train": measured,
        "study_budget": 1,
        "study_matrix": 1,
        "aggregate": 1,
        "plots": 1,
        "report": 1,
        "all": 1,
        "profile": 2,
        "profile_summary": 2,
        "profile_table": 1,
        "store_study": 1,
        "store_plots": 1,
    }
    # the launcher starts every job's ranks, the comm benchmark's too
    assert edited(study / "workflow/scalerepro/launching/launch.py") == {**after_trainer_edit, "code_fingerprint": 3, "comm_benchmark": 1}
    assert edited(study / "workflow/scalerepro/analysis/profiles/captures.py") == {"profile_summary": 2, "profile_table": 1, "plots": 1, "report": 1, "all": 1}
    assert edited(study / "report/templates/report.html.j2") == {"report": 1, "all": 1}
    assert edited(study / "workflow/scalerepro/analysis/presentation/plots.py") == {"plots": 1, "store_plots": 1, "report": 1, "all": 1}
    assert edited(study / "workflow/scalerepro/analysis/history/store.py") == {"store_study": 1, "store_plots": 1, "report": 1, "all": 1}
    assert planned("--forcerun", "aggregate") == {"aggregate": 1, "store_study": 1, "plots": 1, "store_plots": 1, "report": 1, "all": 1}
    # the prescreen reruns when its code changes, or on request: its screen is an input of the report
    # and the store, and only an order for the training runs (ancient), which it does not rerun
    rescreened = {"prescreen_node": 1, "prescreen": 1, "store_study": 1, "store_plots": 1, "report": 1, "all": 1}
    assert edited(study / "workflow/scalerepro/training/node_check.py") == {**rescreened, "code_fingerprint": 1}
    assert edited(study / "workflow/scalerepro/planning/node_screen.py") == {key: n for key, n in rescreened.items() if key != "prescreen_node"}
    assert planned("--forcerun", "prescreen_node") == rescreened
    one_run = {"train": 1, "aggregate": 1, "store_study": 1, "plots": 1, "store_plots": 1, "report": 1, "all": 1}
    # a run of the floor's rounds is one the budget's choice is made from: the checkpoint chooses again
    assert planned("--forcerun", "results/runs/strong_cnn_g1_r1/record.json") == {**one_run, "study_budget": 1, "study_matrix": 1}
    assert planned("--forcerun", "results/runs/strong_cnn_g1_r2/record.json") == {**one_run, "study_budget": 1, "study_matrix": 1}


def test_the_workflow_is_lint_clean_and_formatted():
    lint = snakemake(REPO, "--lint", "--configfile", "config/ci.yaml", timeout=120)
    assert lint.returncode == 0 and "Congratulations" in lint.stdout + lint.stderr, lint.stdout[-3000:]
    env = workflow_env()
    fmt = subprocess.run(
        [str(Path(sys.executable).parent / "snakefmt"), "--check", "Snakefile", "workflow/rules"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stderr


def test_the_study_report_in_headless_chromium(study, tmp_path):
    from report_study import CHROMIUM, Chromium

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
    browser = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        session = browser.open_page((study / "results/report/index.html").as_uri(), 1400, 3000)
        found = browser.problems(session)
        shot = study / "results/report/screenshot.png"
        browser.screenshot(session, shot, 1400)
    finally:
        browser.close()
    # every figure is drawn or, with nothing to draw, one line saying why (class "plot not-drawn")
    not_drawn = (study / "results/report/index.html").read_text().count('class="plot not-drawn"')
    assert len(found["images"]) + not_drawn == len(FIGURE_NAMES) and len(found["images"]) >= 6 and not found["broken_images"], found["images"]
    assert not found["errors"] and not found["foreign_requests"], found
    print(f"\nscreenshot of the CI study's report: {shot}")


def test_more_gpus_than_the_machine_has_is_an_error_before_anything_runs(tmp_path):
    config = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    config.update(device="cuda")  # this machine has no GPU; the CI study asks for 2
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake(REPO, "-n", "--configfile", str(path), timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the study asks for 2 GPUs but this machine has 0" in output, output[-2000:]


def test_containers_need_apptainer_only_when_enabled(tmp_path):
    if shutil.which("apptainer"):
        pytest.skip("apptainer is installed here: the refusal cannot be shown")
    workdir = tmp_path / "repo"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    disabled = snakemake(workdir, "-n", "--configfile", "config/ci.yaml", timeout=120)
    assert disabled.returncode == 0 and "build_container" not in disabled.stdout
    config = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    config["container"]["enabled"] = True
    (workdir / "containers.yaml").write_text(yaml.safe_dump(config))
    enabled = snakemake(workdir, "results/containers/scalerepro.sif", "--cores", "1", "--configfile", "containers.yaml", timeout=300)
    assert enabled.returncode != 0
    assert "apptainer is not installed" in (workdir / "results/logs/build_container.log").read_text()


# ---- the study's trainer flags, resolved as the trainer resolves them -------------------------


def _machine_with_gpus(tmp_path: Path, gpus: int) -> dict[str, str]:
    """The environment of a machine whose `nvidia-smi -L` lists ``gpus`` H100s: the workflow counts
    this machine's GPUs with exactly that command (schedulers.local_gpu_names), and a dry run asks the
    hardware nothing else. The listing is nvidia-smi's format."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08x}-5b9d-ab3c-d5c0-8b8b2e5a1d4e)" for i in range(gpus))
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 9\ncat <<"LIST"\n{listing}\nLIST\n')
    fake.chmod(0o755)
    env = workflow_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def _planned_trainer_flags(env: dict[str, str], *args: str) -> dict[str, list[str]]:
    """run id -> the flags `snakemake -n -p` prints for its trainer."""
    import shlex

    result = subprocess.run([*SNAKEMAKE, "-n", "-p", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = {}
    for line in result.stdout.splitlines():
        if line.startswith("Shell command: python -m scalerepro.launching.run_job "):
            argv = shlex.split(line.removeprefix("Shell command: "))
            flags = argv[argv.index("scalerepro.training.train") + 1 :]
            runs[flags[flags.index("--run-id") + 1]] = flags
    return runs


def _resolved(flags: list[str]):
    from scalerepro.trainer_flags import parse_args

    return parse_args(flags)


def test_the_gpu_study_trains_every_cell_optimised_and_the_baseline_only_in_the_ablation(tmp_path):
    from scalerepro.trainer_flags import CONV_NETS, preset_values

    runs = _planned_trainer_flags(_machine_with_gpus(tmp_path, 8))
    assert "strong_resnet50_g8_r1" in runs and "sensitivity_resnet50_g8_bucket25-batch256-tf32_r1" in runs, sorted(runs)[:20]
    cells = {run: _resolved(flags) for run, flags in runs.items() if not run.startswith(("ablation_", "reproduce_"))}
    assert len(cells) >= 100
    for run, config in cells.items():
        conv = config.model.model in CONV_NETS
        assert config.parallel.device == "cuda", run
        # CUDA graphs for the conv nets where a step is one micro-batch (scalerepro.trainer_flags.preset_values)
        graphs = conv and config.optim.grad_accum_steps == 1 and config.parallel.parallel == "ddp"
        assert config.perf.preset == "optimised" and config.perf.compile == ("reduce-overhead" if graphs else "default"), run
        # the tp cells' one documented exception (config parallelism.args.tp): TP leaves the tied embeddings
        # plain tensors beside DTensors, which the fused and foreach kernels refuse to mix
        optimizer = "for-loop" if config.parallel.parallel == "tp" else "fused"
        assert config.data.loader == "device" and config.optim.optimizer_impl == optimizer, run
        assert config.perf.channels_last is conv and config.perf.cudnn_benchmark is conv, run
        expected_precision = run.split("-")[-1].split("_")[0] if run.startswith("sensitivity_") else "bf16"
        assert config.perf.precision == expected_precision, run

    baseline = _resolved(runs["ablation_resnet50_g8_baseline_r1"])
    assert (baseline.perf.preset, baseline.perf.precision, baseline.perf.compile, baseline.data.loader, baseline.optim.optimizer_impl) == (
        "baseline",
        "fp32",
        "none",
        "dataloader",
        "foreach",
    )
    assert not baseline.perf.channels_last and not baseline.perf.cudnn_benchmark
    # Every lever of the ablation together is the optimised preset.
    # ("all" is the preset: the strong cell at 8 GPUs runs it, and the ablation's row reads its record)
    everything = _resolved(runs.get("ablation_resnet50_g8_all_r1") or runs["strong_resnet50_g8_r1"])
    resolved = {**vars(everything.perf), **vars(everything.data), **vars(everything.optim)}
    assert {name: resolved[name] for name in preset_values("optimised", "resnet50")} == preset_values("optimised", "resnet50")


@pytest.mark.parametrize("onednn_cap", [None, "AVX512_CORE"])
def test_the_cpu_study_runs_the_optimised_preset_with_compilation_off_and_bf16_only_where_native(onednn_cap):
    """The CPU study's cells train bf16 where the planning CPU runs it natively, else fp32 (oneDNN
    held below AVX512_CORE_BF16 stands for a CPU without avx512_bf16), and the matrix says which."""
    env = {**workflow_env(), "ONEDNN_MAX_CPU_ISA": onednn_cap or ""}  # None: no cap, also where the suite runs under one
    runs = _planned_trainer_flags(env)  # this machine: no nvidia-smi, so the CPU overrides
    native = cpu_features.native_bf16(environ=env)[0]
    with mock.patch.dict(os.environ, {"ONEDNN_MAX_CPU_ISA": onednn_cap or ""}):  # the planner's view, here
        cells = {run: _resolved(flags) for run, flags in runs.items() if not run.startswith(("ablation_", "reproduce_"))}
    assert cells and all(c.parallel.device == "cpu" for c in cells.values())
    expected = "bf16" if native else "fp32"
    for run, config in cells.items():
        assert (config.perf.preset, config.perf.precision, config.perf.compile, config.data.loader) == ("optimised", expected, "none", "device"), run


def test_the_report_line_names_a_report_built_by_this_run_only(study, tmp_path):
    assert f"report: {study / 'results/report/index.html'}" in (study / "study_output").read_text()
    workdir = tmp_path / "repo"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    config_only = snakemake(workdir, "results/tables/config.json", "--cores", "1", "--configfile", "config/ci.yaml", timeout=300)
    assert config_only.returncode == 0, config_only.stderr[-2000:]
    assert (workdir / "results/tables/config.json").exists()
    assert "report:" not in config_only.stdout + config_only.stderr
    # an invocation that starts no rank starts no fork server (no torch import beside its jobs)
    assert not (workdir / "results/logs/fork_server.log").exists()


def test_the_budget_checkpoint_read_the_floors_job_walls_and_kept_the_floor(study):
    """ci.yaml's budget (1 s) is below what round 1 takes: the study_budget checkpoint, after the
    floor's two rounds, keeps them, over budget, from the wall times run_job wrote beside each
    record, and the report says so."""
    choice = json.loads((study / "results/tables/budget.json").read_text())
    matrix = pd.read_csv(study / "results/tables/matrix.csv")
    owners = matrix[matrix.record_of.isna()].run_id
    assert choice["repeats"] == choice["planned_repeats"] == choice["measured_rounds"] == 2 and choice["over_budget"] is True
    assert sorted(choice["measured_walls_s"]) == sorted(owners) and choice["measured_jobs"] == len(owners)
    for run, wall in choice["measured_walls_s"].items():
        job = json.loads((study / f"results/runs/{run}/job.json").read_text())
        logged = (study / f"results/runs/{run}/train.log").read_text().split("run_job: launcher and ranks took ")[-1]
        record = json.loads((study / f"results/runs/{run}/record.json").read_text())
        probes_s = record["measurements"]["probes_s"]
        assert job == {"run": run, "wall_s": wall, "launcher_exit": 0, "probes_s": round(probes_s, 3)} and float(logged.split()[0]) == pytest.approx(
            wall, abs=0.001
        )
        assert 0 <= probes_s < wall and choice["measured_probes_s"][run] == job["probes_s"]
    assert choice["measured_s"] == pytest.approx(sum(choice["measured_walls_s"].values()), abs=0.01)
    assert "the floor" in choice["reason"] and len(matrix) == CI_ROWS
    html = (study / "results/report/index.html").read_text()
    line = html.split('<dd id="budget">')[1].split("</dd>")[0]
    assert "up to 2 a cell, of the 2 planned" in " ".join(line.split()) and "over budget" in line


def test_a_later_repeat_runs_no_probe_and_takes_its_cells(study):
    """Under the CI study's budget only repeat 1 of a configuration runs the probes: repeat 2's
    record says its probe was off, and the analysis gives it repeat 1's overlap cost, named in
    runs.csv (probe_of) and in the loss decomposition's note."""
    measurements = json.loads((study / "results/runs/strong_cnn_g2_r2/record.json").read_text())["measurements"]
    assert measurements["exposed_communication"]["reason"] == "--comm-probe-steps 0" and not measurements["backward_buckets"]["steps"]
    assert json.loads((study / "results/runs/strong_cnn_g2_r1/record.json").read_text())["measurements"]["exposed_communication"]["steps"] > 0
    runs = pd.read_csv(study / "results/tables/runs.csv")
    two = runs[runs.study.eq("strong") & runs.gpus.eq(2)].set_index("repeat")
    assert two["probe_of"].tolist() == ["strong_cnn_g2_r1", "strong_cnn_g2_r1"]
    assert two.loc[2, "sync_compute_rank_mean_s"] == two.loc[1, "sync_compute_rank_mean_s"] and math.isnan(two.loc[2, "exposed_comm_fraction"])
    decomposition = pd.read_csv(study / "results/tables/loss_decomposition.csv")
    note = decomposition[decomposition.study.eq("strong") & decomposition.gpus.eq(2)].note.iloc[0]
    assert "the overlap cost of 1 of 2 runs is strong_cnn_g2_r1's probe" in note, note


def test_a_rebuilt_report_keeps_the_budgets_choice(study, tmp_path):
    """``rebuild --results`` (no Snakemake) reads the study's budget.json where its config set a
    budget, as the report rule passes it."""
    from scalerepro.analysis import rebuild

    results = tmp_path / "results"
    shutil.copytree(study / "results", results, symlinks=True)
    (results / "report/index.html").unlink()
    rebuild.rebuild(results, REPO / "config/references.yaml", REPO / "report")
    page = (results / "report/index.html").read_text()
    assert '<dd id="budget">up to 2 a cell, of the 2 planned' in page


def test_a_smaller_budget_leaves_out_the_later_rounds_and_trains_nothing(study, tmp_path):
    """A budget of one repeat (min_repeats 1) on the finished CI study: the checkpoint chooses
    again (its settings changed), the matrix then plans round 1 only, and what remains to do is
    the analysis of fewer runs, no training."""
    workdir = tmp_path / "study"
    shutil.copytree(study, workdir, symlinks=True)
    config = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    config["budget"] = {"training_s": 1, "min_repeats": 1}
    url, md5 = json.loads((study / "study_args").read_text())
    config["cifar10"] = {**config["cifar10"], "url": url, "md5": md5}
    (workdir / "one.yaml").write_text(yaml.safe_dump(config))
    chosen = snakemake(workdir, "results/tables/matrix.csv", "--cores", "1", "--configfile", "one.yaml", timeout=300)
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert json.loads((workdir / "results/tables/budget.json").read_text())["repeats"] == 1
    matrix = pd.read_csv(workdir / "results/tables/matrix.csv")
    assert set(matrix.repeat) == {1} and len(matrix) < CI_ROWS
    left = snakemake(workdir, "-n", "--configfile", "one.yaml", timeout=300)
    assert left.returncode == 0, left.stderr[-3000:]
    jobs = left.stdout.split("Job stats:")[1].split("\n\n")[0]
    assert "aggregate" in jobs and "train" not in jobs and "study_budget" not in jobs, jobs


def test_the_study_round_trips_through_a_bundle(study, tmp_path):
    """The study the workflow stored, exported as a bundle and imported into another store: the
    same rows and the same records, a row that reads another cell's run (record_of: the "all"
    ablation cell reads the strong 2-rank cell's) included. Export looked for such a row's record
    at its own run id and failed ("... is not the record the store holds")."""
    from scalerepro.analysis.history import store, store_file

    matrix = pd.read_csv(study / "results/tables/matrix.csv", keep_default_na=False)
    assert matrix["record_of"].ne("").any()  # the case
    bundle, other, unpacked = tmp_path / "ci.zip", tmp_path / "other.duckdb", tmp_path / "unpacked"
    module = [sys.executable, "-m", "scalerepro.analysis.history.bundle"]
    exported = subprocess.run(
        [*module, "export", "--out", str(bundle), "--workflow", str(study)], cwd=study, env=workflow_env(), capture_output=True, text=True
    )
    assert exported.returncode == 0, exported.stderr
    imported = subprocess.run(
        [*module, "import", str(bundle), "--store", str(other), "--extract", str(unpacked)], env=workflow_env(), capture_output=True, text=True
    )
    assert imported.returncode == 0, imported.stderr
    study_id = json.loads((study / "results/tables/store.json").read_text())["study_id"]
    with store_file.connect(study / "results/history.duckdb", read_only=True) as first, store_file.connect(other, read_only=True) as second:
        sent, received = store.load_study(first, study_id), store.load_study(second, study_id)
    assert received.row == sent.row and received.runs == sent.runs
    for run in received.runs:
        if run["record"] is not None:  # each run's record as the study names it, unpacked as stored
            path = Path("results/runs") / (run["record_of"] or run["run_id"]) / "record.json"
            assert (unpacked / path).read_text() == run["record"] == (study / path).read_text(), run["run_id"]


def test_the_study_is_stored_and_a_rerun_compares_with_it(study, tmp_path):
    """The first study in a store: its receipt, its rows, the report's empty history. Then the run
    that started first is rerun, which makes a new study (the study id is the config hash and the
    first start time), compared with the first by the compare rule (compare.baseline: latest):
    every cell without the rerun run holds the same runs on both sides, so its ratio is exactly 1."""
    import duckdb

    receipt = json.loads((study / "results/tables/store.json").read_text())
    assert receipt["new_study"] and receipt["runs_added"] == CI_ROWS and receipt["studies_in_store"] == 1
    with duckdb.connect(str(study / "results/history.duckdb"), read_only=True) as connection:
        assert connection.execute("SELECT count(*), count(record) FROM runs WHERE counts").fetchone() == (CI_ROWS, CI_ROWS)
    section = (study / "results/report/index.html").read_text().split('<section id="history">')[1]
    assert "This is the first study in the results store <code>results/history.duckdb</code>" in section
    assert "No baseline set." in section

    records = _records(study)
    first = min(records, key=lambda run: records[run]["started_at"])
    config = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    config["compare"] = {"baseline": "latest", "threshold": 0.03}
    (tmp_path / "compare.yaml").write_text(yaml.safe_dump(config))
    url, md5 = json.loads((study / "study_args").read_text())
    result = snakemake(
        study,
        "--cores",
        "2",
        "--configfile",
        str(tmp_path / "compare.yaml"),
        "--config",
        f"cifar10={{url: '{url}', md5: '{md5}'}}",
        "--forcerun",
        f"results/runs/{first}/record.json",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    new = json.loads((study / "results/tables/store.json").read_text())
    assert new["new_study"] and new["studies_in_store"] == 2 and new["study_id"] != receipt["study_id"]
    facts = json.loads((study / "results/tables/versus_baseline.json").read_text())
    assert facts["baseline"]["study_id"] == receipt["study_id"] and facts["candidate"]["study_id"] == new["study_id"]
    assert facts["environment_differences"] == [] and facts["config_differences"] == []
    table = pd.read_csv(study / "results/tables/versus_baseline.csv", keep_default_na=False)
    matrix = pd.read_csv(study / "results/tables/matrix.csv", keep_default_na=False).set_index("run_id")
    keys = ["study", "model", "variant", "precision", "per_gpu_batch", "gpus"]
    has_rerun = (table[keys] == matrix.loc[first, keys]).all(axis=1)
    assert has_rerun.sum() == 1 and len(table) == len(matrix.groupby(keys))
    untouched = table[~has_rerun]
    assert (untouched.ratio.astype(float) == 1.0).all()
    expected = untouched.baseline_repeats.astype(int).ge(2).map({True: "no significant change", False: "too few repeats"})
    assert untouched.verdict.tolist() == expected.tolist()  # one repeat a side (sensitivity, ablation): no interval
    html = (study / "results/report/index.html").read_text().split('<section id="history">')[1]
    assert 'alt="Candidate vs baseline, per cell"' in html and 'alt="Headline cells across studies"' in html


def _job_processes(workdir: Path) -> list[str]:
    """The package's processes (run_job, launcher, ranks) running in ``workdir``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "scalerepro." in command and os.readlink(entry / "cwd") == str(workdir):
                found.append(f"{entry.name}: {command[:120]}")
        except (OSError, ValueError):
            continue
    return found


def test_a_killed_driver_leaves_no_rank_running(study, tmp_path):
    """SIGKILL of Snakemake during a training job: its launcher and ranks ran on for a minute and
    then wrote an `ok` record after a rerun had said there was nothing to do. Now the launcher
    sees its driver gone within a second and stops its ranks (and a rank dies with its
    launcher, whatever kills it); the two commands of docs/study.md, "When a run is interrupted", recover."""
    workdir = tmp_path / "killed"
    shutil.copytree(study, workdir, symlinks=True)
    url, md5 = json.loads((study / "study_args").read_text())
    args = ["--configfile", "config/ci.yaml", "--config", f"cifar10={{url: '{url}', md5: '{md5}'}}", "steps=100000"]
    target = "results/runs/strong_cnn_g1_r1/record.json"
    driver = subprocess.Popen(
        [*SNAKEMAKE, target, "--cores", "2", "--forcerun", target, *args],
        cwd=workdir,
        env=workflow_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any("scalerepro.training.train" in p and "launch" not in p for p in _job_processes(workdir)):
            assert driver.poll() is None and time.monotonic() < deadline, "the training job never started"
            time.sleep(0.5)
        time.sleep(2)  # the rank is in its loop
    finally:
        driver.kill()  # SIGKILL: Snakemake cleans nothing up
        driver.wait()
    killed_at = time.monotonic()
    while _job_processes(workdir) and time.monotonic() - killed_at < 20:
        time.sleep(0.5)
    assert _job_processes(workdir) == [], "still running 20 s after the driver was killed"
    print(f"\nno job process left {time.monotonic() - killed_at:.1f} s after SIGKILL of Snakemake")
    # The unfinished run is no output, whatever Snakemake's incomplete marks say: a job the budget's
    # checkpoint added (a later round) was never checked against them, and its preempted record
    # stood as done ("Nothing to be done" after --unlock and --rerun-incomplete).
    run = workdir / "results/runs/strong_cnn_g1_r1"
    assert not (run / "record.json").exists() and load_record(run / "record.preempted.json")["status"] == "preempted"
    unlocked = snakemake(workdir, "--unlock", *args)
    assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    planned = snakemake(workdir, target, "-n", "--rerun-incomplete", *args)
    assert planned.returncode == 0 and "strong_cnn_g1_r1" in planned.stdout + planned.stderr, planned.stderr[-2000:]


def test_after_a_trainer_edit_the_rerun_measures_again(study):
    """Last in this file: it edits the study's trainer. Every train job reruns (the trainer's
    fingerprint changed) and each must measure anew, not resume a finished run and record nothing."""
    before = _records(study)
    trainer = study / "workflow/scalerepro/training/trainer.py"
    trainer.write_text(trainer.read_text() + "\n# an edit: the rerun must measure again\n")
    url, md5 = json.loads((study / "study_args").read_text())
    targets = [f"results/runs/{run}/record.json" for run in ("strong_cnn_g1_r1", "strong_cnn_g2_r1")]
    result = snakemake(study, *targets, "--cores", "2", "--configfile", "config/ci.yaml", "--config", f"cifar10={{url: '{url}', md5: '{md5}'}}")
    assert result.returncode == 0, result.stderr[-4000:]
    for run in ("strong_cnn_g1_r1", "strong_cnn_g2_r1"):
        record = load_record(study / f"results/runs/{run}/record.json")
        assert record["run_id"] == run and record["started_at"] > before[run]["ended_at"]
        assert record["status"] == "ok" and record["steps"]["resumed_from"] is None
        assert record["measurements"]["measured_steps"] == 6 and record["measurements"]["samples_per_s"] > 0
        assert not list((study / f"results/runs/{run}/checkpoints").glob("step-*.pt"))


def test_snakemake_report_zip_holds_the_figures_tables_and_report(study, tmp_path):
    """`snakemake --report` on the finished CI study (no job runs): the rules' report() outputs."""
    import zipfile

    from scalerepro.analysis.presentation.figure_names import FIGURE_NAMES

    url, md5 = json.loads((study / "study_args").read_text())
    archive = tmp_path / "report.zip"
    result = snakemake(study, "--report", str(archive), "--configfile", "config/ci.yaml", "--config", f"cifar10={{url: '{url}', md5: '{md5}'}}", timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    names = zipfile.ZipFile(archive).namelist()
    for expected in [*(f"{n}.svg" for n in FIGURE_NAMES), *(f"{n}.png" for n in FIGURE_NAMES), "checks.csv", "scaling.csv", "index.html"]:
        assert any(name.endswith("/" + expected) for name in names), f"{expected} not in the report archive"


def test_a_copy_of_the_workflow_runs_its_own_package_not_the_installed_one(tmp_path):
    """The development environment installs this checkout editable; a copy of the workflow
    elsewhere (a benchmark's before/after, a user's second checkout) must run the copy's package in
    its jobs, or the code its fingerprints hash is not the code that runs. Each process that
    imports the copy's package leaves a mark naming the file it imported."""
    workdir = tmp_path / "copy"
    shutil.copytree(REPO, workdir, ignore=COPY_IGNORE)
    marks = tmp_path / "marks"
    marks.mkdir()
    init = workdir / "workflow" / "scalerepro" / "__init__.py"
    init.write_text(init.read_text() + f"\nimport os as _os\nopen({str(marks)!r} + f'/{{_os.getpid()}}', 'w').write(__file__)\n")
    done = snakemake(workdir, "results/inventory/system.json", "--cores", "1", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {path.read_text() for path in marks.iterdir()}
    # the Snakemake process itself and the inventory job (python -m scalerepro.telemetry.inventory) each imported the copy's package
    assert len(list(marks.iterdir())) >= 2 and imported == {str(init)}
