"""containers/scalerepro.def's own %post install and %test, run against this checkout, so that a
module the image's self-test names but the package no longer has fails here, not in a user's
`apptainer build` on a cluster.

Apptainer is not needed: the %files are copied into a scratch root, %post runs there (its paths
moved under the root) in a new virtual environment that sees this venv's packages, offline (what
%post pins must already be installed at those versions), and %test runs with that environment's
python first on PATH, so it imports the installed copy of the package, as in the image. The
%test's NCCL assertion holds for a CUDA build of torch only, a condition in the script itself:
in the image it still asserts NCCL.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path, PurePosixPath

import pytest

from conftest import REPO, clean_env

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

DEFINITION = REPO / "containers" / "scalerepro.def"


def _sections(text: str) -> dict[str, str]:
    """The definition's sections (%post, %test, ...) by name, each its lines as written."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("%"):
            current = sections.setdefault(line.split()[0][1:], [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in sections.items()}


def _copy_files(files: str, root: Path) -> set[PurePosixPath]:
    """The %files section's sources, from the checkout into ``root``; their destinations."""
    destinations = set()
    for line in files.splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        source, destination = line.split()
        target = root / destination.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / source, target)
        destinations.add(PurePosixPath(destination))
    return destinations


def _under_root(script: str, destinations: set[PurePosixPath], root: Path) -> str:
    """``script`` with each absolute path that is a %files destination, or a folder of one, moved
    under ``root``."""
    moved = {str(path) for destination in destinations for path in (destination, *destination.parents) if str(path) != "/"}
    return re.sub(r"(?<![\w./-])/[\w./-]+", lambda found: f"{root}{found[0]}" if found[0].rstrip("/") in moved else found[0], script)


def _image_like_environment(folder: Path) -> Path:
    """A new virtual environment whose python also imports this venv's packages (torch and the
    rest, as the image's base provides them), but not its editable scalerepro; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True)
    # a plain path: the folder's own .pth files (this venv's editable scalerepro) are not read
    Path(site.stdout.strip(), "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder / "bin"


def _run(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # Apptainer runs a section's script with /bin/sh -e
    return subprocess.run(["/bin/sh", "-e", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_image_installs_the_package_and_passes_its_own_self_test(tmp_path):
    sections = _sections(DEFINITION.read_text())
    assert {"files", "post", "test"} <= set(sections), sorted(sections)
    root = tmp_path / "root"
    destinations = _copy_files(sections["files"], root)
    bin_folder = _image_like_environment(tmp_path / "env")
    env = clean_env(PATH=f"{bin_folder}:{clean_env()['PATH']}", PIP_NO_INDEX="1", PIP_CONFIG_FILE="/dev/null", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # offline, the build uses the setuptools installed here (pip reads "0" as --no-build-isolation)
    env["PIP_NO_BUILD_ISOLATION"] = "0"
    for name in ("PYTHONPATH", "PIP_FIND_LINKS"):
        env.pop(name, None)

    post = _run(_under_root(sections["post"], destinations, root), env, tmp_path)
    assert post.returncode == 0, post.stdout[-3000:] + post.stderr[-3000:]
    installed = subprocess.run(["python", "-c", "import scalerepro; print(scalerepro.__file__)"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert Path(installed.stdout.strip()).is_relative_to(tmp_path / "env"), installed.stdout + installed.stderr

    test = _run(sections["test"], env, tmp_path)
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]
    assert "resnet50 train FLOPs/sample" in test.stdout, test.stdout
