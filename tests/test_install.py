"""Installing scalerepro on a machine with no network (a cluster's login or GPU node).

``pip install -e .`` builds in an isolated environment and fetches the build backend
(setuptools) from the index first, which fails offline. docs/install.md, "Install without network":
``--no-build-isolation`` builds with the setuptools already installed, ``--no-index`` keeps pip
off the network. This test runs exactly that on a copy of the sources.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from conftest import REPO, clean_env

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

PACKAGE = REPO / "workflow" / "scalerepro"


def _offline_env(**extra: str) -> dict[str, str]:
    """No index, and no user or site pip configuration that could name one."""
    return clean_env(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)


def test_the_build_backend_is_installed_so_an_offline_build_can_use_it():
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    for text in requires:
        requirement = Requirement(text)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            raise AssertionError(f"build requirement {text} is not installed: an offline build cannot run") from None
        assert requirement.specifier.contains(installed, prereleases=True), f"{requirement.name} {installed} does not meet {text}"


def test_the_package_installs_without_network(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(PACKAGE, source / "workflow" / "scalerepro", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", "--target", str(site), str(source)],
        env=_offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    modules = {path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py")}
    installed = {path.relative_to(site / "scalerepro") for path in (site / "scalerepro").rglob("*.py")}
    assert modules <= installed, f"missing from the installed package: {sorted(map(str, modules - installed))}"
    # The installed copy imports (the torch-free modules; torch comes from the environment).
    probe = subprocess.run(
        [sys.executable, "-c", "import scalerepro.launching.launch, scalerepro.trainer_flags; print(scalerepro.__file__)"],
        env=_offline_env(PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(site)


# The checks .ci/run makes with the tools of the test extra, cheapest first, so that a lint, format
# or type error fails CI in seconds rather than after the 17-minute suite.
CI_TOOL_STEPS = ("ruff check", "ruff format --check", "mypy", "pytest")


def test_ci_lints_formats_and_checks_types_before_the_tests():
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")]
    steps = [step.strip() for line in lines for step in line.split("&&")]
    tools = tuple(step.removeprefix(".venv/bin/") for step in steps if step.startswith(".venv/bin/") and not step.startswith(".venv/bin/pip"))
    assert tools == CI_TOOL_STEPS
    test_extra = {Requirement(text).name for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]}
    assert {tool.split()[0] for tool in tools} <= test_extra, "every tool .ci/run calls is installed by the test extra"


def test_the_workflow_extra_alone_parses_the_snakefile(tmp_path):
    """A fresh environment with only `.[workflow]` installed (what a cluster's login node needs to
    drive a study) plans the default study: `snakemake -n` in a copy of the repository. The
    package index must be reachable."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(REPO / "envs/cpu-constraints.txt"), f"{REPO}[workflow]"],
        env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    workdir = tmp_path / "repo"
    shutil.copytree(
        REPO, workdir, ignore=shutil.ignore_patterns(".git", ".venv", "results", ".snakemake", "__pycache__", "*.egg-info", "build", ".pytest_cache")
    )
    # only the fresh environment: no PYTHONPATH into this checkout or the test environment's
    env = {key: value for key, value in clean_env().items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    dry_run = subprocess.run([str(venv / "bin" / "snakemake"), "-n"], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert dry_run.returncode == 0, dry_run.stdout[-3000:] + dry_run.stderr[-3000:]
    assert "rule report:" in dry_run.stdout or "localrule report:" in dry_run.stdout, dry_run.stdout[-3000:]
