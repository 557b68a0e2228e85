"""The package's layout holds: its sides import only downward, no two modules import each other,
each fact is written once, and the sides that need no torch import without it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
import tomllib
import yaml

from scalerepro.common import gpu_peaks, source_closure

from conftest import REPO

PACKAGE = REPO / "workflow" / "scalerepro"
MODULES = sorted(".".join(path.relative_to(REPO / "workflow").with_suffix("").parts).removesuffix(".__init__") for path in PACKAGE.rglob("*.py"))
# The sides, lowest first: a module may import its own side and the sides below it, never one
# above (docs/architecture.md). The analysis side stands apart: it imports only `common` and the
# record's model, `record`, and no side imports it (the two sides of a run meet in the record's
# model, never in each other's code).
LAYERS = ("common", "record", "trainer_flags", "schedulers", "telemetry", "models", "data", "parallel", "training", "launching", "planning")
APART = {"analysis": {"common", "record", "analysis"}}
# What needs no torch: the workflow's planning and launching, the analysis, and what they import.
TORCH_FREE = (
    "scalerepro.planning",
    "scalerepro.launching",
    "scalerepro.analysis",
    "scalerepro.common",
    "scalerepro.record",
    "scalerepro.schedulers",
    "scalerepro.trainer_flags",
    "scalerepro.data.fetch",
)


def _side(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def _imports() -> dict[str, set[str]]:
    """Each module -> the package modules it imports anywhere (module level, in functions, for
    type checking: ast, not a run)."""
    out = {}
    for module in MODULES:
        path = source_closure.module_file(PACKAGE, module)
        out[module] = {m for m in source_closure._imported(PACKAGE, path) if m in MODULES and m != module}
    return out


def test_every_side_imports_only_downward():
    wrong = []
    for module, imported in _imports().items():
        side = _side(module)
        for other in imported:
            target = _side(other)
            if target in ("__init__", side):
                continue
            if side in APART or target in APART:
                allowed = target in APART.get(side, set())
            else:
                allowed = side in LAYERS and target in LAYERS and LAYERS.index(target) < LAYERS.index(side)
            if not allowed:
                wrong.append(f"{module} -> {other}")
    assert wrong == [], "imports that run upward or across:\n" + "\n".join(sorted(wrong))
    assert {_side(m) for m in MODULES} - {"__init__"} == set(LAYERS) | set(APART), "a side that LAYERS does not place"


def test_no_import_circle():
    """No module reaches itself through the imports of others (a deferred import still counts)."""
    graph = _imports()
    circles = []
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            module, path = stack.pop()
            for nxt in graph[module]:
                if nxt == start:
                    circles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert circles == []


def _module_constants() -> dict[str, list[str]]:
    """Public UPPER_CASE names assigned at module level -> the modules that assign them."""
    found: dict[str, list[str]] = {}
    for module in MODULES:
        tree = ast.parse(source_closure.module_file(PACKAGE, module).read_text())
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    if name.isupper() and not name.startswith("_"):
                        found.setdefault(name, []).append(module)
    return found


def test_each_fact_is_written_once():
    """A constant written in two modules drifts: EXIT_PREEMPTED was in three, the verdict and
    status vocabularies in the aggregation and the report, the range prefix in the trainer and
    the profile reader. One module owns each; the others import it."""
    twice = {name: modules for name, modules in _module_constants().items() if len(modules) > 1}
    assert twice == {}


def test_the_gpu_peaks_are_one_table():
    """MFU (the rank) and the roofline (the analysis) count against the same peaks: the package's
    table; the references file keeps none of its own, and the configured default is in it."""
    references = yaml.safe_load((REPO / "config/references.yaml").read_text())
    assert "gpu_peaks" not in references
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["study"]["properties"]["profiling"]["properties"]["gpu_peaks"]["default"] in gpu_peaks.PEAKS
    for entry in gpu_peaks.PEAKS.values():
        assert entry.fp32 < entry.tf32 < entry.fp16 == entry.bf16 and entry.fp16 == pytest.approx(2 * entry.tf32, rel=1e-3)
        assert entry.fp8 is None or entry.fp8 == pytest.approx(2 * entry.bf16, rel=1e-3)
        assert all(gpu_peaks.peaks_key(name) == entry.key for name in entry.device_names), entry.key


def test_the_sides_without_torch_import_without_it():
    """The workflow (planning, launching) and the analysis import with torch unimportable, every
    module of them in one process (and each alone, below)."""
    modules = [m for m in MODULES if m.startswith(TORCH_FREE)]
    code = "import sys; sys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in modules)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]


ANALYSIS_MODULES = [m for m in MODULES if m.startswith("scalerepro.analysis")]
# One process imports each module with no module of the package loaded before it (the others it
# imported are dropped after it), torch unimportable; libraries such as pandas stay loaded, so the
# whole check costs one interpreter's start-up rather than one per module.
EACH_ALONE = """
import importlib, json, sys, traceback
sys.modules["torch"] = None
failures = {}
for module in sys.argv[1:]:
    for name in [n for n in sys.modules if n == "scalerepro" or n.startswith("scalerepro.")]:
        del sys.modules[name]
    try:
        importlib.import_module(module)
    except BaseException:
        failures[module] = traceback.format_exc()[-2000:]
print(json.dumps(failures))
"""


@pytest.fixture(scope="module")
def analysis_import_failures() -> dict[str, str]:
    result = subprocess.run([sys.executable, "-c", EACH_ALONE, *ANALYSIS_MODULES], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", ANALYSIS_MODULES)
def test_each_analysis_module_imports_alone_without_torch(module, analysis_import_failures):
    assert module not in analysis_import_failures, analysis_import_failures[module]


def test_the_install_extras_match_the_sides():
    """The analysis environment installs no torch: the package has no dependency of its own, its
    `analysis` extra none of torch's, and envs/analysis.yaml installs the package with that extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    torch_side = {"torch", "torchvision", "nvidia-ml-py"}

    def names(requirements):
        return {r.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower() for r in requirements}

    assert not names(project["dependencies"]) & torch_side
    assert not names(extras["analysis"]) & torch_side and not names(extras["workflow"]) & torch_side
    assert torch_side <= names(extras["train"])
    env = yaml.safe_load((REPO / "envs/analysis.yaml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    assert "-e ..[analysis]" in pip and not names(p for p in pip if not p.startswith("-e")) & torch_side


def test_the_per_gpu_micro_batch_has_one_name():
    """From config to store the per-GPU micro-batch is `per_gpu_batch` (`--per-gpu-batch`,
    record `batch.per_gpu`); the old names live on only where old files are read: the store's
    migration and the record reader's fallback for schema-2 records."""
    old = ("per_rank_batch", "--batch-size", "slurm_job_id", '"per_rank": config')
    # the store's RENAMED_RUN_COLUMNS (version 1's names); the record upgrade's RENAMED_FLAGS (an old
    # record's command line shown in today's names)
    allowed = {PACKAGE / "analysis/history/store_file.py", PACKAGE / "record/upgrade.py"}
    places = [
        *PACKAGE.rglob("*.py"),
        *(REPO / "workflow/rules").glob("*.smk"),
        *(REPO / "config").glob("*.yaml"),
        *(REPO / "workflow/schemas").iterdir(),
        *(REPO / "report").rglob("*.j2"),
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
    found = [f"{path.relative_to(REPO)}: {name}" for path in places if path not in allowed for name in old if name in path.read_text()]
    assert found == []


def test_each_module_of_the_package_is_one_job_under_600_lines():
    """As torchtitan's, each module does one job: the trainer hands its measuring, probing,
    evaluating and checkpointing to modules of their own, the scaling model its fit, inputs and
    table. Every module of the package stays under 600 lines with no function over 100, and each
    of training/ opens with a docstring whose first line says its job."""
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) < 600, f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines"
        long = [
            f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100
        ]
        assert long == [], f"{path.relative_to(PACKAGE)}: {long}"
        if path.parent.name == "training":
            docstring = ast.get_docstring(ast.parse(text))
            assert docstring and docstring.splitlines()[0].strip(), f"{path.name}: no docstring saying its job"


def test_the_package_code_the_workflow_parses_with_needs_only_the_workflow_extra():
    """What workflow/rules/common.smk imports of the package, it imports with the analysis side's
    and the rank's libraries unimportable: the `workflow` extra alone parses the Snakefile, whatever
    a Snakemake plugin happens to install beside it (the fresh install is tests/test_install.py's)."""
    common = (REPO / "workflow/rules/common.smk").read_text()
    imports = [line for line in common.splitlines() if line.startswith(("from scalerepro", "import scalerepro"))]
    assert imports, "common.smk imports nothing of the package: this test no longer reads what it parses with"
    blocked = ("pandas", "numpy", "matplotlib", "seaborn", "duckdb", "rocrate", "torch")
    code = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked) + "\n".join(imports)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO / "workflow")
    assert result.returncode == 0, result.stderr[-2000:]
