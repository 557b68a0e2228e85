"""The study model on its own (no Snakemake): strong-scaling batches, node shapes, reproduction
runs, and each run's trainer config: the user's flags read by the trainer's own parser, and the
job's command line rendered from it."""

from __future__ import annotations

import copy

import pytest
import yaml

from scalerepro import trainer_flags
from scalerepro.planning import plan, study

from conftest import REPO

H100 = "NVIDIA H100 80GB HBM3"


def _config(**changes) -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = config
        for key in parents:
            node = node[key]
        node[leaf] = copy.deepcopy(value)
    return config


def _gpu_study(gpus: int = 8, references=(), **changes) -> study.Study:
    return study.build(_config(gpus_per_node=8, **changes), on_cluster=False, local_gpus=gpus, local_gpu_name=H100, references=list(references))


@pytest.mark.parametrize(
    ("global_batch", "gpus", "per_gpu", "expected"),
    [(2048, 8, 256, (256, 1)), (2048, 1, 256, (256, 8)), (96, 1, 40, (32, 3)), (100, 1, 30, (25, 4)), (7, 1, 32, (7, 1))],
)
def test_a_gpus_share_of_the_global_batch_runs_as_whole_micro_batches(global_batch, gpus, per_gpu, expected):
    micro, accum = study.strong_batches(global_batch, gpus, per_gpu, "key")
    assert (micro, accum) == expected and micro * accum * gpus == global_batch and micro <= per_gpu


def test_strong_scaling_keeps_the_global_batch_of_the_largest_count_at_every_count():
    """The global batch was per_gpu_batch x the smallest count while config and README said the
    largest: at 8 GPUs that is 8x smaller than documented."""
    runs = _gpu_study().runs
    strong = [r for r in runs.values() if r.study == "strong" and r.model == "resnet50" and r.repeat == 1]
    assert [r.gpus for r in strong] == [1, 2, 4, 8]
    assert {r.global_batch for r in strong} == {256 * 8}
    assert [(r.per_gpu_batch, r.grad_accum_steps) for r in strong] == [(256, 8), (256, 4), (256, 2), (256, 1)]


def test_a_global_batch_that_does_not_split_is_a_config_error_naming_the_key():
    with pytest.raises(study.StudyError, match=r"config error at 'scaling.strong.global_batch.resnet50': the global batch 2052"):
        _gpu_study(scaling__strong__global_batch={"resnet50": 2052})


def test_more_ranks_than_a_node_holds_is_an_error_locally_and_more_nodes_on_slurm():
    with pytest.raises(study.StudyError, match=r"config error at 'scaling.gpu_counts': a run over 16 ranks needs 2 nodes"):
        study.build(_config(gpus_per_node=8, scaling__gpu_counts=[8, 16]), on_cluster=False, local_gpus=16)
    on_slurm = study.build(_config(gpus_per_node=8, scaling__gpu_counts=[8, 16]), on_cluster=True, local_gpus=0)
    assert {(r.gpus, r.nodes, r.ranks_per_node) for r in on_slurm.runs.values() if r.study == "strong"} == {(8, 1, 8), (16, 2, 8)}


def test_the_precision_and_bucket_of_a_run_are_what_the_trainer_resolves():
    runs = _gpu_study().runs
    assert runs["ablation_resnet50_g8_baseline_r1"].precision == "fp32"
    assert runs["ablation_resnet50_g8_bf16_r1"].precision == "bf16"
    assert runs["sensitivity_resnet50_g8_bucket100-batch256-bf16_r1"].bucket_cap_mb == 100.0


def test_a_flag_the_trainer_refuses_is_a_config_error_before_anything_runs():
    with pytest.raises(study.StudyError, match=r"config error at 'models.resnet50.args': the trainer refuses these flags: .*--no-such-flag"):
        _gpu_study(models__resnet50__args=["--no-such-flag"])
    # what a list alone does not refuse, the run's whole config may: the trainer's checks of it, at the cell's key
    with pytest.raises(study.StudyError, match=r"at 'trainer_args' or 'models.resnet18_cifar.args': the trainer refuses these flags: give --steps or --epochs"):
        _gpu_study(trainer_args=["--preset", "optimised", "--epochs", "1"])


REFERENCES = [
    {
        "id": "lambda-rn50-h100-1",
        "gpus": 1,
        "conditions": {"gpu": H100},
        "trainer": {"model": "resnet50", "per_gpu_batch": 1280, "flags": ["--precision", "fp16"]},
    },
    {"id": "lambda-rn50-h100-16", "gpus": 16, "conditions": {"gpu": H100}, "trainer": {"model": "resnet50", "per_gpu_batch": 1280, "flags": []}},
    {"id": "dle-rn50-a100-1", "gpus": 1, "conditions": {"gpu": "NVIDIA A100-SXM4-80GB"}, "trainer": {"model": "resnet50", "per_gpu_batch": 256, "flags": []}},
    {"id": "mlperf-rn50", "gpus": 1, "conditions": {"gpu": H100}, "trainer": None, "unmatched": "MXNet + DALI"},
]


def test_a_reproduce_run_is_scheduled_for_each_reference_this_machine_can_match():
    runs = _gpu_study(references=REFERENCES).runs
    reproduce = sorted((r for r in runs.values() if r.study == "reproduce"), key=lambda r: r.repeat)
    assert {(r.reference, r.gpus, r.per_gpu_batch, r.precision) for r in reproduce} == {("lambda-rn50-h100-1", 1, 1280, "fp16")}
    assert [r.repeat for r in reproduce] == [1, 2, 3]  # a verdict stands on an interval (config: reproduce.repeats)
    assert reproduce[0].run_id == "reproduce_resnet50_g1_lambda-rn50-h100-1_r1"
    cpu = study.build(study.merge(_config(), _config()["cpu_overrides"]), on_cluster=False, local_gpus=0, references=REFERENCES)
    assert not [r for r in cpu.runs.values() if r.study == "reproduce"]  # on a CPU every reference is another device
    twin = {**REFERENCES[0], "id": "lambda-rn50-h100-1-ngc2403"}  # the same trainer run, newer stack
    assert {r.reference for r in _gpu_study(references=[REFERENCES[0], twin]).runs.values() if r.study == "reproduce"} == {"lambda-rn50-h100-1"}
    cluster = study.build(_config(gpus_per_node=8, scaling__max_gpus=16, reproduce__gpu=H100), on_cluster=True, local_gpus=0, references=REFERENCES)
    assert sorted({r.reference for r in cluster.runs.values() if r.study == "reproduce"}) == ["lambda-rn50-h100-1", "lambda-rn50-h100-16"]


def test_the_gpu_study_runs_the_optimised_trainer_outside_the_ablation():
    """The study's cells (strong, weak, sensitivity) take the study's trainer_args; only the
    ablation starts from its baseline."""
    gpu = _gpu_study()
    for run in gpu.runs.values():
        if run.study in ("strong", "weak"):
            assert run.config.perf.preset == "optimised" and run.precision != "fp32", run.run_id


def test_every_strategy_trains_the_same_global_batch_at_a_gpu_count_and_fsdp_tp_needs_two_tp_groups():
    """8 GPUs on one node: tp is one replica of 8 ranks, fsdp+tp (TP over one node's 8 ranks)
    would be a single TP group, i.e. tp alone, so it is planned only across nodes."""
    runs = _gpu_study().runs
    cells = {(r.model, r.gpus, r.parallel): r for r in runs.values() if r.study == "parallelism"}
    for gpus in (2, 4, 8):
        at = {strategy: cells[("gpt2_medium", gpus, strategy)] for strategy in ("ddp", "fsdp", "tp")}
        assert {r.global_batch for r in at.values()} == {8 * gpus}  # per_gpu_batch 8 x N
        assert (at["ddp"].per_gpu_batch, at["tp"].per_gpu_batch, at["tp"].data_parallel) == (8, 8 * gpus, 1)
    assert not any(strategy == "fsdp+tp" for _, _, strategy in cells)
    on_nodes = study.build(_config(gpus_per_node=4, scaling__gpu_counts=[8]), on_cluster=True, local_gpus=0)
    both = [r for r in on_nodes.runs.values() if r.study == "parallelism" and r.parallel == "fsdp+tp"]
    assert {(r.model, r.gpus, r.data_parallel, r.per_gpu_batch) for r in both} == {("gpt2_medium", 8, 2, 32), ("llama_1b", 8, 2, 4)}
    assert all(r.global_batch == r.gpus * study_batch for r, study_batch in ((r, 8 if r.model == "gpt2_medium" else 1) for r in both))


def _cpu_study(**changes) -> study.Study:
    config = _config(**changes)
    return study.build(study.merge(config, config["cpu_overrides"]), on_cluster=False, local_gpus=0)


def test_one_trainer_run_runs_once_and_every_cell_of_it_reads_its_record():
    """The strong and weak cells at the largest count run one configuration where the strong global
    batch is the per-GPU batch times that count: 3 of the CPU study's 12 ResNet-18 runs measured
    what 3 others measured."""
    runs = _cpu_study().runs
    largest = max(r.gpus for r in runs.values() if r.study == "weak")
    for repeat in (1, 2, 3):
        strong = runs[f"strong_resnet18_cifar_g{largest}_r{repeat}"]
        weak = runs[f"weak_resnet18_cifar_g{largest}_r{repeat}"]
        assert (strong.global_batch, strong.grad_accum_steps) == (weak.global_batch, weak.grad_accum_steps)
        assert {strong.record_of, weak.record_of} == {"", min(strong.run_id, weak.run_id, key=list(runs).index)}
        assert plan.record_path(weak) == plan.record_path(strong)
    # a repeat is its own run (another seed), and one GPU is two configurations: the strong cell
    # accumulates the global batch, the weak one steps a GPU's batch
    assert runs["weak_resnet18_cifar_g2_r2"].record_of != "strong_resnet18_cifar_g2_r1"
    assert not runs["weak_resnet18_cifar_g1_r1"].record_of and not runs["strong_resnet18_cifar_g1_r1"].record_of
    assert runs["strong_resnet18_cifar_g1_r1"].grad_accum_steps == largest
    jobs = [r for r in runs.values() if r.runs_itself]
    assert len({plan.record_path(r) for r in jobs}) == len(jobs)  # no two jobs write one record


def test_the_ablations_all_is_the_studys_preset_as_it_resolves_here():
    """With every optimisation's flags stacked, "all" set bf16 on a CPU that emulates it while the
    preset itself trains fp32 there: the optimisation check failed at -40 %. "All" is the preset."""
    cpu = _cpu_study()
    ablation = {r.variant: r for r in cpu.runs.values() if r.study == "ablation" and r.repeat == 1}
    strong = next(r for r in cpu.runs.values() if r.study == "strong")
    assert ablation["all"].config.perf.preset == strong.config.perf.preset == "optimised" != ablation["baseline"].config.perf.preset
    assert ablation["all"].precision == strong.precision
    assert "bf16" in {r.precision for r in ablation.values()}  # the bf16 cell keeps measuring bf16


def test_the_planner_and_the_scaling_model_split_a_strong_batch_alike():
    """Global batch 96 on 2 GPUs at micro-batch 32: the planner ran 2 x 24 while the model, which
    needed the share to be a multiple of 32, said the batch does not split."""
    from scalerepro.analysis.tables import scaling_model

    assert study.strong_batches(96, 2, 32, "key") == scaling_model.strong_split(96, 2, 32) == (24, 2)
    for global_batch, gpus, micro in ((2048, 8, 256), (100, 1, 30), (7, 1, 32), (96, 4, 32), (96, 3, 20)):
        assert study.strong_batches(global_batch, gpus, micro, "key") == scaling_model.strong_split(global_batch, gpus, micro)
    assert scaling_model.strong_split(97, 2, 32) == "the global batch 97 does not split evenly over 2 GPUs"


@pytest.mark.parametrize("where", ["cpu", "gpu8"])
def test_each_jobs_command_line_is_its_runs_trainer_config(where):
    """The planner renders a job's argv once from the run's typed config (trainer_flags.render_argv);
    the trainer reads it back as exactly that config, where the job writes set as the job sets it."""
    built = _cpu_study() if where == "cpu" else _gpu_study(references=REFERENCES)
    assert {run.study for run in built.runs.values()} >= {"strong", "weak", "ablation"}
    for run in built.runs.values():
        argv = built.trainer_args(run, f"results/runs/{run.run_id}/record.json", f"results/runs/{run.run_id}/checkpoints")
        expected = trainer_flags.with_values(
            run.config, {"record": f"results/runs/{run.run_id}/record.json", "checkpoint_dir": f"results/runs/{run.run_id}/checkpoints", "resume": True}
        )
        assert trainer_flags.parse_args(argv) == expected, run.run_id
        assert (run.config.run.seed, run.config.run.run_id, run.config.parallel.device) == (run.repeat, run.run_id, built.device)
        flags = [word.split("=")[0] for word in argv if word.startswith("--")]
        assert len(flags) == len(set(flags)), argv  # each setting once: nothing overrides what the argv said before
