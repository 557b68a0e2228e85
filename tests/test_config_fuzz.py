"""Bad configs, through the real workflow: each is refused before any job runs, with one line
that starts with "config error at '<key>'" and names the key; no string of the config reaches a
shell unquoted (payloads that would create a file never do)."""

from __future__ import annotations

import ast
import concurrent.futures
import copy
import itertools
import string
from pathlib import Path

import pytest
import yaml

from scalerepro.analysis.tables import check_definitions
from scalerepro.planning import plan as planning
from scalerepro.planning import study
from scalerepro.schedulers.base import SchedulerError

from conftest import REPO
from workflow_runs import snakemake

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
# Two Snakemake dry runs at a time, one core each (tests/conftest.py: all_cores).
pytestmark = [pytest.mark.slow, pytest.mark.all_cores]

MARK = "/tmp/scalerepro-injected"  # a payload that ran would create this file
PAYLOAD = f"$(touch {MARK})"

# (id, dotted key to set, value, text the error line must contain)
BAD = [
    ("compare-threshold-nan", "compare.threshold", float("nan"), "compare.threshold': nan is not a finite number"),
    ("tolerance-nan", "targets.reproduce_tolerance", float("nan"), "targets.reproduce_tolerance': nan is not a finite number"),
    ("inf-in-overrides", "cpu_overrides.targets.reproduce_tolerance", float("inf"), "inf is not a finite number"),
    ("unknown-top-key", "colour", "blue", "colour"),
    ("unknown-nested-key", "scaling.strong.enable", True, "enable"),
    ("study-name-empty", "study_name", "", "study_name"),
    ("study-name-space", "study_name", "my study", "study_name"),
    ("device-enum", "device", "tpu", "device"),
    ("data-enum", "data", "imagenet", "data"),
    ("gpus-per-node-zero", "gpus_per_node", 0, "gpus_per_node"),
    ("repeats-float", "repeats", 1.5, "repeats"),
    ("repeats-zero", "repeats", 0, "repeats"),
    ("steps-string", "steps", "ten", "steps"),
    ("warmup-negative", "warmup_steps", -1, "warmup_steps"),
    ("warmup-not-below-steps", "warmup_steps", 8, "warmup_steps"),
    ("trainer-args-not-list", "trainer_args", "--precision bf16", "trainer_args"),
    ("trainer-args-empty-item", "trainer_args", ["--precision", ""], "trainer_args"),
    ("trainer-args-space", "trainer_args", ["--precision bf16"], "trainer_args"),
    ("model-unknown", "models.alexnet", {"per_gpu_batch": 8}, "alexnet"),
    ("model-no-batch", "models.cnn", {"args": []}, "per_gpu_batch"),
    ("model-batch-zero", "models.cnn.per_gpu_batch", 0, "per_gpu_batch"),
    ("scaling-model-unknown", "scaling.models", ["alexnet"], "alexnet"),
    ("sensitivity-model-unknown", "sensitivity.model", "alexnet", "sensitivity.model"),
    ("scaling-models-empty", "scaling.models", [], "scaling.models"),
    ("gpu-counts-zero", "scaling.gpu_counts", [0, 2], "gpu_counts"),
    ("gpu-counts-repeat", "scaling.gpu_counts", [1, 1], "gpu_counts"),
    ("gpu-counts-beyond-one-node", "scaling.gpu_counts", [1, 2, 4], "scaling.gpu_counts"),
    ("strong-global-batch-indivisible", "scaling.strong.global_batch", {"cnn": 33}, "scaling.strong.global_batch.cnn"),
    ("strong-global-batch-unknown-model", "scaling.strong.global_batch", {"alexnet": 32}, "alexnet"),
    ("reproduce-gpu-shell", "reproduce.gpu", "H100; rm -rf /", "reproduce.gpu"),
    ("resources-exclusive-string", "resources.exclusive", "yes", "resources.exclusive"),
    ("weak-samples-zero", "scaling.weak.samples_per_gpu", 0, "samples_per_gpu"),
    ("sensitivity-gpus-beyond-one-node", "sensitivity.gpus", 4, "sensitivity.gpus"),
    ("sensitivity-bucket-zero", "sensitivity.bucket_cap_mb", [0], "bucket_cap_mb"),
    ("sensitivity-precision", "sensitivity.precision", ["fp8"], "precision"),
    ("ablation-model-unknown", "ablation.model", "alexnet", "ablation.model"),
    ("ablation-flag-refused", "ablation.optimisations", [{"name": "x", "flags": ["--no-such-flag"]}], "ablation.optimisations"),
    ("ablation-gpus-string", "ablation.gpus", "all", "ablation.gpus"),
    ("ablation-name-reserved", "ablation.optimisations", [{"name": "all", "flags": []}], "name"),
    ("ablation-no-flags", "ablation.optimisations", [{"name": "bf16"}], "flags"),
    ("comm-size-tiny", "communication.sizes_bytes", [1], "sizes_bytes"),
    ("cifar-md5-short", "cifar10.md5", "abc", "md5"),
    ("cifar-url-not-url", "cifar10.url", "cifar.tar.gz", "url"),
    ("cifar-archive-empty", "cifar10.archive", "", "archive"),
    ("container-sif-space", "container.sif", "results/my image.sif", "container.sif"),
    ("container-sif-suffix", "container.sif", "results/image.img", "container.sif"),
    ("container-image-empty", "container.base_image", "", "container.base_image"),
    ("slurm-extra-string", "slurm.extra", "--exclusive", "slurm.extra"),
    ("slurm-extra-not-a-flag", "slurm.extra", ["exclusive"], "slurm.extra"),
    ("slurm-partition-empty", "slurm.partition", "", "slurm.partition"),
    ("slurm-account-space", "slurm.account", "my account", "slurm.account"),
    ("slurm-env-bad-name", "slurm.env", {"NCCL IFNAME": "ib0"}, "NCCL IFNAME"),
    ("slurm-port-low", "slurm.rendezvous_port", 80, "rendezvous_port"),
    ("resources-cpus-zero", "resources.cpus_per_gpu", 0, "cpus_per_gpu"),
    ("target-check-unknown-metric", "targets.checks.strong_efficiency.metric", "speed", "targets.checks.strong_efficiency.metric"),
    ("profiling-tool-enum", "profiling.tool", "vtune", "profiling.tool"),
    ("profiling-run-unknown", "profiling.runs", ["strong_cnn_g64_r1"], "profiling.runs"),
    ("profiling-window-zero", "profiling.window_steps", 0, "window_steps"),
    ("cpu-overrides-slurm", "cpu_overrides.slurm", {"partition": "gpu"}, "slurm"),
    ("store-path-suffix", "store.path", "results/history.db", "store.path"),
    ("store-unknown-key", "store.url", "duckdb://x", "url"),
    ("compare-threshold-one", "compare.threshold", 1.0, "compare.threshold"),
    ("compare-baseline-empty", "compare.baseline", "", "compare.baseline"),
    (
        "ablation-name-twice",
        "ablation.optimisations",
        [{"name": "cl", "flags": ["--channels-last"]}, {"name": "cl", "flags": []}],
        "ablation.optimisations': the name 'cl' is given twice",
    ),
    ("scaling-models-repeat", "scaling.models", ["cnn", "cnn"], "scaling.models"),
    ("study-name-5000-characters", "study_name", "x" * 5000, "study_name': a string of 5,000 characters"),
    (
        "check-selects-on-an-unknown-column",
        "targets.checks.strong_efficiency.where",
        {"colour": "red"},
        "targets.checks.strong_efficiency.where': scaling.csv has no column 'colour'",
    ),
]
# Values that fit their schema pattern but for a trailing line break (a pattern's `$` matches
# before a final newline, and JSON Schema searches a pattern rather than matching it): each
# passed the schema and split the command line it reached. (key, value, where the error points)
NOT_ONE_LINE = [
    ("study_name", "ci\n", "study_name"),
    ("scaling.predict_cluster", "dgx_h100\n", "scaling.predict_cluster"),
    ("trainer_args", ["--seed=1\n"], "trainer_args.0"),
    ("ablation.optimisations", [{"name": "cl\n", "flags": ["--channels-last"]}], "ablation.optimisations.0.name"),
    ("slurm.account", "team\n", "slurm.account"),
    ("slurm.constraint", "h100\n", "slurm.constraint"),
    ("slurm.extra", ["--exclusive\n"], "slurm.extra.0"),
    ("slurm.env", {"NCCL_SOCKET_IFNAME": "ib0\n"}, "slurm.env.NCCL_SOCKET_IFNAME"),
    ("cifar10.md5", "c58f30108f718f92721af3b95e74349a\n", "cifar10.md5"),
    ("container.base_image", "nvcr.io/nvidia/pytorch:25.01-py3\n", "container.base_image"),
    ("container.sif", "results/containers/scalerepro.sif\n", "container.sif"),
    ("store.path", "results/history.duckdb\n", "store.path"),
    ("compare.baseline", "latest\n", "compare.baseline"),
    ("profiling.gpu_peaks", "h100_sxm\n", "profiling.gpu_peaks"),
    ("reproduce.gpu", "NVIDIA H100 80GB HBM3\n", "reproduce.gpu"),
]


def _first_string(value) -> str:
    return value if isinstance(value, str) else _first_string(next(iter(value.values())) if isinstance(value, dict) else value[0])


BAD += [(f"{where}-not-one-line", dotted, value, f"{where}': {_first_string(value)!r} holds a line break") for dotted, value, where in NOT_ONE_LINE]
BAD += [
    ("slurm-env-key-not-one-line", "slurm.env", {"NCCL_SOCKET_IFNAME\n": "ib0"}, "slurm.env': the key 'NCCL_SOCKET_IFNAME\\n' holds a line break"),
    # the aggregation reads the preset only after every training job has run
    (
        "predict-cluster-unknown",
        "scaling.predict_cluster",
        "dgx_z",
        "scaling.predict_cluster': unknown cluster preset 'dgx_z': choose one of dgx_a100, dgx_h100",
    ),
]
# Every config string that reaches a shell (or the Slurm plugin's sbatch command), with a payload.
INJECTIONS = [
    ("inject-gpu-peaks", "profiling.gpu_peaks", f"h100_sxm; touch {MARK}", "profiling.gpu_peaks"),
    ("inject-base-image", "container.base_image", f"nvcr.io/nvidia/pytorch:25.01-py3 {PAYLOAD}", "container.base_image"),
    ("inject-sif", "container.sif", f"results/{PAYLOAD}.sif", "container.sif"),
    ("inject-slurm-extra", "slurm.extra", [f"--comment={PAYLOAD}"], "slurm.extra"),
    ("inject-slurm-constraint", "slurm.constraint", f"h100`touch {MARK}`", "slurm.constraint"),
    ("inject-cifar-md5", "cifar10.md5", f"'; touch {MARK}; '", "cifar10.md5"),
    ("inject-trainer-args", "trainer_args", [f"--seed=1;touch {MARK}"], "trainer_args"),
    ("inject-store-path", "store.path", f"results/{PAYLOAD}.duckdb", "store.path"),
    ("inject-compare-baseline", "compare.baseline", f"latest; touch {MARK}", "compare.baseline"),
]


def _config_with(dotted: str, value) -> dict:
    config = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    *parents, leaf = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = copy.deepcopy(value)
    return config


def _refusal(tmp_path: Path, case: tuple, *args: str) -> tuple[str, str | None, str]:
    name, dotted, value, named = case
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_config_with(dotted, value)))
    result = snakemake(REPO, *args, "--configfile", str(path), timeout=180)
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("config error at '")]
    return name, (errors[0] if len(errors) == 1 and result.returncode != 0 else None), output[-1500:]


# One case of each kind of refusal goes through a real Snakemake dry run (the rest in-process,
# through the same calls, below): the schema, a non-finite number, a duplicate name, a long string,
# the study's own checks, a check's columns, the profiling plan.
THROUGH_SNAKEMAKE = (
    "unknown-nested-key",
    "compare-threshold-nan",
    "ablation-name-twice",
    "study-name-5000-characters",
    "gpu-counts-beyond-one-node",
    "check-selects-on-an-unknown-column",
    "profiling-run-unknown",
    "scaling.predict_cluster-not-one-line",
    "predict-cluster-unknown",
)


def _refused_in_process(case: tuple) -> str | None:
    """The error of what workflow/rules/common.smk runs when Snakemake loads the workflow, on the
    config Snakemake would make (config/config.yaml, then the case's --configfile over it)."""
    _, dotted, value, _ = case
    config = study.merge(yaml.safe_load((REPO / "config/config.yaml").read_text()), _config_with(dotted, value))
    try:
        plan = planning.load(
            config,
            schema=REPO / "workflow/schemas/config.schema.yaml",
            references=REPO / "config/references.yaml",
            executor=None,
            in_job=False,
            local_gpu_names=[],
        )
        planning.profiling_plan(plan, local_exec=True)
        check_definitions.parse_checks(plan.config["targets"])
    except (planning.ConfigError, study.StudyError, SchedulerError, check_definitions.CheckConfigError) as error:
        return str(error)
    return None


def test_at_least_forty_bad_configs_are_each_refused_with_one_line_naming_the_key(tmp_path):
    assert len(BAD) + len(INJECTIONS) >= 40
    cases = {case[0]: case for case in BAD + INJECTIONS}
    assert set(THROUGH_SNAKEMAKE) <= set(cases)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda name: _refusal(tmp_path, cases[name], "-n"), THROUGH_SNAKEMAKE))
    for name, case in cases.items():
        if name not in THROUGH_SNAKEMAKE:
            error = _refused_in_process(case)
            outcomes.append((name, error if error and error.startswith("config error at '") and "\n" not in error else None, str(error)))
    wrong = {name: output for name, error, output in outcomes if error is None or cases[name][3] not in error}
    assert not wrong, "\n\n".join(f"{name}:\n{output}" for name, output in wrong.items())


@pytest.mark.parametrize("case", INJECTIONS, ids=[case[0] for case in INJECTIONS])
def test_no_injected_command_runs(tmp_path, case):
    """A real run (not a dry run) of the targets that would use each string."""
    Path(MARK).unlink(missing_ok=True)
    name, error, output = _refusal(tmp_path, case, "results/tables/matrix.csv", "--cores", "1")
    assert error is not None and case[3] in error, output
    assert not Path(MARK).exists(), f"{name}: the payload ran"


def test_yaml_aliases_that_expand_past_the_bound_are_refused_in_seconds(tmp_path):
    """600 bytes of nested aliases (10 lists of 10 aliases of the list before) stand for 10^10
    values: the dry run hung walking them. Now the first walk stops at the bound."""
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = tmp_path / "bomb.yaml"
    path.write_text((REPO / "config/ci.yaml").read_text() + "\n".join(bomb) + "\n")
    result = snakemake(REPO, "-n", "--configfile", str(path), timeout=60)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("config error at '")]
    assert result.returncode != 0 and errors == [
        "config error at 'top level': the config holds more than 100,000 values (YAML aliases nested in lists expand to that): write the values out"
    ], result.stderr[-1500:]


def test_a_mapping_given_with_config_on_the_command_line_keeps_its_numbers():
    """Snakemake reads `--config 'compare={...}'` with YAML's BaseLoader (every value a string):
    the threshold was refused as "'0.03' is not of type 'number'"."""
    result = snakemake(REPO, "-n", "--configfile", "config/ci.yaml", "--config", "compare={baseline: latest, threshold: 0.03}")
    assert result.returncode == 0 and "rule compare:" in result.stdout, result.stderr[-1500:]
    refused = snakemake(REPO, "-n", "--configfile", "config/ci.yaml", "--config", "compare={baseline: latest, threshold: lots}")
    assert "config error at 'compare.threshold': 'lots' is not of type 'number'" in refused.stdout + refused.stderr


def test_the_default_and_ci_configs_are_accepted():
    for extra in ([], ["--configfile", "config/ci.yaml"]):
        result = snakemake(REPO, "-n", *extra, timeout=180)
        assert result.returncode == 0, result.stderr[-2000:]


def _shell_commands() -> dict[str, str]:
    """Each rule's ``shell:`` command as Snakemake formats it (its string literals joined), by rule."""
    commands = {}
    for path in sorted((REPO / "workflow/rules").glob("*.smk")):
        lines, rule = path.read_text().splitlines(), None
        for number, line in enumerate(lines):
            words = line.split()
            if len(words) == 2 and words[0] in ("rule", "checkpoint") and words[1].endswith(":"):
                rule = words[1][:-1]
            if line.strip() == "shell:":
                indent = len(line) - len(line.lstrip())
                body = itertools.takewhile(lambda text, indent=indent: not text.strip() or len(text) - len(text.lstrip()) > indent, lines[number + 1 :])
                commands[f"{path.name}: {rule}"] = ast.literal_eval("(" + "\n".join(body) + ")")
    return commands


def test_every_shell_command_quotes_every_value_it_interpolates():
    """A value on a command line unquoted is split by a space or a line break, or run by a `;`:
    every field of every rule's shell command is shell-quoted ({x:q}; a list, each item)."""
    commands = _shell_commands()
    shells = sum(path.read_text().count("shell:") for path in (REPO / "workflow/rules").glob("*.smk"))
    assert len(commands) == shells and "analysis.smk: aggregate" in commands, sorted(commands)
    unquoted = [
        f"{rule}: {{{field}{':' + spec if spec else ''}}}"
        for rule, command in commands.items()
        for _, field, spec, _ in string.Formatter().parse(command)
        if field is not None and not (spec or "").endswith("q")
    ]
    assert not unquoted, "unquoted in a shell command:\n" + "\n".join(unquoted)
