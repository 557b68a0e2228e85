"""The source files a program of the package runs: the modules its entry module imports, found by
reading the imports (never by importing anything), followed through the package, with the
``__init__.py`` of every package on the way (Python runs those too).

This is how a change reruns exactly what it affects. A training job depends on the closure of
the launcher and ``scalerepro.training.train``, an analysis step on the closure of its own entry
module; a checkpoint records the hash of the rank's closure. So an edit of planning code (which
no rank imports) reruns no training job and leaves every checkpoint resumable, and an edit of
any module a rank imports, however indirectly, reruns every training job. Imports inside
functions count as well: a module that may run is part of the program.

Standard library only: the workflow (no torch) and the rank both use it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

PACKAGE_NAME = "scalerepro"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../scalerepro
RANK_ENTRY = "scalerepro.training.train"


def module_file(package_dir: Path, module: str) -> Path | None:
    """The file of ``module`` (dotted, inside the package), or None when it is not one of its modules."""
    parts = module.split(".")
    if parts[0] != PACKAGE_NAME:
        return None
    base = package_dir.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _module_name(package_dir: Path, path: Path) -> str:
    relative = path.relative_to(package_dir).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join((PACKAGE_NAME, *parts))


def _imported(package_dir: Path, path: Path) -> frozenset[str]:
    """The package's modules ``path`` imports anywhere in its text (relative imports resolved)."""
    return _imports_in_text(package_dir, path, path.read_text())


# Parsing the workflow asks for the closure of each of its programs, which share most of their
# modules, and parsing the texts was most of a dry run's time (benchmarks/README.md, "The test
# suite's time, round 2"): each text is parsed once a process, keyed by the text itself, so an
# edit is read as an edit.
@functools.cache
def _imports_in_text(package_dir: Path, path: Path, text: str) -> frozenset[str]:
    here = _module_name(package_dir, path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package the module is in
    found: set[str] = set()
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return frozenset(name for name in found if name.split(".")[0] == PACKAGE_NAME)


def source_files(entries: Iterable[str], package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every file of the package that running any of ``entries`` (dotted module names) may
    execute, in path order."""
    seen: set[Path] = set()
    pending = list(entries)
    while pending:
        module = pending.pop()
        parts = module.split(".")
        # importing a.b.c runs a/__init__, a/b/__init__ and a/b/c
        for depth in range(1, len(parts) + 1):
            path = module_file(package_dir, ".".join(parts[:depth]))
            if path is None or path in seen:
                continue
            seen.add(path)
            pending.extend(_imported(package_dir, path))
    return sorted(seen)


def code_hash(entries: Iterable[str], package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over ``source_files(entries)`` as (path relative to the package, bytes), in path order."""
    digest = hashlib.sha256()
    for path in source_files(entries, package_dir):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run_jobs_from_this_checkout(environ: dict, package_parent: Path = PACKAGE_DIR.parent) -> None:
    """Put ``package_parent`` first on every job's PYTHONPATH (``environ``: the workflow's own).

    A job is a new process: without this it imports the package an editable install points at,
    which is another checkout's where the workflow is a copy, and the code the fingerprints above
    hash would not be the code that runs."""
    kept = [p for p in environ.get("PYTHONPATH", "").split(":") if p and p != str(package_parent)]
    environ["PYTHONPATH"] = ":".join([str(package_parent), *kept])
