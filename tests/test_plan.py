"""scalerepro.planning.plan: the invocation's plan without Snakemake's workflow object (config validated,
scheduler chosen, resources and launch flags resolved), on the shipped configs."""

from __future__ import annotations

import copy

import pytest
import yaml

from scalerepro import trainer_flags
from scalerepro.planning import plan as planning
from scalerepro.schedulers.base import LOCAL
from scalerepro.schedulers.slurm import SLURM

from conftest import REPO

SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
REFERENCES = REPO / "config/references.yaml"
H100 = "NVIDIA H100 80GB HBM3"


def _config(*layers: str) -> dict:
    config = {}
    for layer in ("config/config.yaml", *layers):
        config = planning.study.merge(config, yaml.safe_load((REPO / layer).read_text()))
    return config


def _load(config: dict, executor: str | None = None, gpus: int = 0) -> planning.Plan:
    return planning.load(copy.deepcopy(config), schema=SCHEMA, references=REFERENCES, executor=executor, in_job=False, local_gpu_names=[H100] * gpus)


def test_a_cpu_machine_runs_the_cpu_matrix_locally_and_shows_what_slurm_would_be_asked():
    plan = _load(_config())
    assert plan.scheduler is LOCAL and plan.cluster is SLURM and plan.device == "cpu"
    run = next(run for run in plan.study.runs.values() if run.gpus == 2)
    resources = plan.train_resources(run)
    assert (resources["nodes"], resources["gpus"], resources["measured"]) == (1, 0, 1)
    assert resources["slurm_extra"] == "--exclusive --signal=USR1@300"
    assert plan.rerun_command(run) == f"snakemake --cores all --forcerun results/runs/{run.run_id}/record.json"


def test_on_slurm_the_default_study_is_cuda_with_multi_node_jobs_and_their_sbatch_settings():
    config = _config()
    config["gpus_per_node"] = 4  # a cluster's node shape is configured ('auto' reads this machine's)
    plan = _load(config, executor="slurm")
    assert plan.scheduler is SLURM and plan.device == "cuda"
    big = max(plan.study.runs.values(), key=lambda run: run.gpus)
    resources = plan.train_resources(big)
    assert resources["nodes"] == big.nodes > 1 and resources["gres"] == f"gpu:{big.ranks_per_node}"
    assert resources["gpus"] == big.gpus and resources["tasks"] == big.nodes
    launch = plan.launch_args(big.ranks_per_node, big.nodes, big.run_id)
    assert f"--nodes={big.nodes}" in launch and "--slurm-gpus" in launch
    assert plan.rerun_command(big).startswith("snakemake --profile slurm ")


def test_a_local_gpu_machine_profiles_with_its_gpu_named_and_nsight_missing_falls_back_to_torch():
    plan = _load(_config(), gpus=8)
    assert plan.device == "cuda" and plan.profiled_device_name() == H100
    profiling = planning.profiling_plan(plan, local_exec=True, which=lambda tool: None)
    assert profiling.tools == ("torch",) and "not on PATH" in profiling.fallback_reason
    found = planning.profiling_plan(plan, local_exec=True, which=lambda tool: f"/usr/bin/{tool}")
    assert found.tools == ("nsys", "ncu") and found.fallback_reason is None
    args = profiling.trainer_args(plan, profiling.runs[0], "torch")
    window, job = plan.config["profiling"], trainer_flags.parse_args(args)
    assert (job.run.steps, job.run.warmup_steps) == (window["window_start"] + window["window_steps"], window["window_start"])
    assert not job.run.eval and job.run.comm_probe_steps == 0 and job.run.record == f"results/profiles/{profiling.runs[0]}/torch/record.json"
    # the profiled run's config otherwise
    assert job.model == plan.study.runs[profiling.runs[0]].config.model and job.perf == plan.study.runs[profiling.runs[0]].config.perf
    # a profiling job starts afresh: no checkpoint directory (an empty one vanished from the shell command), no resume
    assert "--checkpoint-dir" not in args and "--resume" not in args and "" not in args


def test_nsight_asked_without_fallback_is_one_config_error():
    config = _config()
    config["profiling"].update(tool="nsys", fallback=False)
    plan = _load(config, gpus=8)
    with pytest.raises(planning.ConfigError, match=r"^config error at 'profiling.tool': nsys was asked for but nsys is not on PATH"):
        planning.profiling_plan(plan, local_exec=True, which=lambda tool: None)


def test_a_bad_key_is_one_line_naming_it_and_the_schema():
    config = _config()
    config["scaling"]["gpu_count"] = [1, 2]
    with pytest.raises(planning.ConfigError) as refused:
        _load(config)
    message = str(refused.value)
    assert message.startswith("config error at 'scaling': ") and "'gpu_count'" in message and "\n" not in message
    assert message.endswith("(allowed keys and values: workflow/schemas/config.schema.yaml)")


@pytest.mark.parametrize(
    "change, key, message",
    [
        (
            lambda c: c["ablation"].update(optimisations=[{"name": "cl", "flags": []}, {"name": "cl", "flags": ["--channels-last"]}]),
            "ablation.optimisations",
            "the name 'cl' is given twice",
        ),
        (lambda c: c.update(study_name="x" * 4097), "study_name", "a string of 4,097 characters (at most 4096)"),
        (lambda c: c["compare"].update(threshold=float("nan")), "compare.threshold", "nan is not a finite number"),
        (lambda c: c.update(extra=[[[0] * 100] * 100] * 11), "top level", "holds more than 100,000 values"),
    ],
    ids=["duplicate-name", "long-string", "nan", "too-many-values"],
)
def test_what_the_schema_cannot_say_is_refused_first_naming_the_key(change, key, message):
    config = _config()
    change(config)
    with pytest.raises(planning.ConfigError) as refused:
        planning.validate(config, SCHEMA)
    assert str(refused.value).startswith(f"config error at '{key}': ") and message in str(refused.value)


def test_strings_where_the_schema_wants_numbers_are_read_as_yaml_and_kept_only_when_they_fit():
    """What Snakemake's --config makes of compare={baseline: latest, threshold: 0.03}."""
    config = _config()
    config["compare"] = {"baseline": "latest", "threshold": "0.03"}
    config["scaling"]["predict_gpus"] = ["8", "16"]
    config["resources"]["exclusive"] = "false"
    planning.validate(config, SCHEMA)
    assert config["compare"] == {"baseline": "latest", "threshold": 0.03}  # a string where a string is wanted stays
    assert config["scaling"]["predict_gpus"] == [8, 16] and config["resources"]["exclusive"] is False
    config["compare"]["threshold"] = "lots"
    with pytest.raises(planning.ConfigError, match="compare.threshold': 'lots' is not of type 'number'"):
        planning.validate(config, SCHEMA)


def test_a_cells_repeats_are_a_whole_round_apart_in_the_order_snakemake_starts_them():
    """The train jobs' priorities order every run: repeat 1 of each cell, then repeat 2 of each
    cell in the same order, and so on. Sorted as Snakemake starts ready jobs (highest first), two
    repeats of one cell are as many runs apart as the study has cells, so a slowdown shorter than a
    round reaches one repeat of a cell, not two (the defect: priority by repeat alone, which left
    the order within a round to Snakemake, and the last cell of round 1 could open round 2)."""
    plan = _load(_config())
    runs = list(plan.study.runs.values())
    priorities = [plan.train_priority(run) for run in runs]
    assert len(set(priorities)) == len(runs)  # a total order: nothing left to Snakemake's tie-break
    started = [run for _, run in sorted(zip(priorities, runs), key=lambda pair: -pair[0])]
    cells = list(dict.fromkeys(run.cell for run in runs))
    assert len(cells) > 1 and max(run.repeat for run in runs) > 1
    assert [run.repeat for run in started] == sorted(run.repeat for run in runs)  # round after round
    rounds = [[run.cell for run in started if run.repeat == repeat] for repeat in sorted({run.repeat for run in runs})]
    for earlier, later in zip(rounds, rounds[1:]):
        assert [cell for cell in earlier if cell in later] == later  # the same order every round


def test_under_a_budget_only_a_configurations_repeat_1_runs_the_probes():
    """The CPU default has a budget: the probes after the window (exposed communication, buckets)
    run in each cell's repeat 1, which runs whatever the budget chooses, and a later repeat's
    trainer gets them off (the analysis lends it repeat 1's: readers.cell_probes). A study with
    no budget (the GPU default) probes in every repeat. Either way each probe runs only where a
    table reads it: the bucket probe in the one-GPU runs of the strong and weak studies (the
    scaling model replays them), the communication probe in the strong, weak and sensitivity
    studies (the loss decomposition, the scaling model, the sensitivity table), not in the
    ablation's cells, whose table shows no exposed communication."""

    def probes(plan: planning.Plan) -> dict[int, dict[tuple[str, int], set[tuple[int, int, float]]]]:
        found: dict[int, dict[tuple[str, int], set[tuple[int, int, float]]]] = {}
        for run in plan.study.runs.values():
            if not run.runs_itself:
                continue
            resolved = run.config.run
            cell = found.setdefault(run.repeat, {}).setdefault((run.study, run.gpus), set())
            cell.add((resolved.comm_probe_steps, resolved.bucket_probe_steps, resolved.probe_budget_s))
        return found

    def read(study: str, gpus: int) -> tuple[bool, bool]:
        """Whether a table reads the cell's (communication, bucket) probe."""
        return study in ("strong", "weak", "sensitivity"), study in ("strong", "weak") and gpus == 1

    budgeted = probes(_load(_config()))
    assert len(budgeted) > 1 and {"strong", "weak", "sensitivity", "ablation"} <= {study for study, _ in budgeted[1]}
    for cell, found in budgeted[1].items():
        assert all((steps > 0, buckets > 0) == read(*cell) for steps, buckets, _ in found), (cell, found)
    assert all(found == {(0, 0, 0.0)} for repeat, cells in budgeted.items() if repeat > 1 for found in cells.values())
    config = _config()
    config["gpus_per_node"] = 8
    unbudgeted = probes(_load(config, gpus=8))
    assert len(unbudgeted) > 1
    for cells in unbudgeted.values():
        for cell, found in cells.items():
            assert all((steps > 0, buckets > 0) == read(*cell) for steps, buckets, _ in found), (cell, found)


def test_a_cell_that_reads_another_cells_run_gets_the_probes_that_run_takes_for_every_reader():
    """The ablation's "all" is the sensitivity's preset cell on the CPU default: one configuration,
    run once, read by both (whose probes differ: the ablation reads none). The probes stay out of
    what makes two cells one run, and the run takes those of every cell that reads it."""
    plan = _load(_config())
    runs = plan.study.runs
    every = [run for run in runs.values() if run.study == "ablation" and run.variant == "all"]
    assert every and all(run.record_of and runs[run.record_of].study == "sensitivity" for run in every), [(run.run_id, run.record_of) for run in every]
    owner = runs[every[0].record_of]
    assert owner.config.run.comm_probe_steps > 0
