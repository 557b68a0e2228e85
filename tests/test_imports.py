"""Each module of the package imports on its own (no import circle hides behind another
module's import order), and the analysis side never imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

MODULES = sorted(
    ".".join(path.relative_to(REPO / "workflow").with_suffix("").parts)
    for path in (REPO / "workflow/scalerepro").rglob("*.py")
    if path.name != "__main__.py"
)


def _circles() -> list[tuple[str, str]]:
    """Pairs of package modules that import each other anywhere: at module level, inside a
    function (a deferred import is still a circle) or for type checking (ast, not a run)."""
    import ast

    imports: dict[str, set[str]] = {}
    for module in MODULES:
        path = REPO / "workflow" / (module.replace(".", "/") + ".py")
        package = module.rsplit(".", 1)[0] if not path.name == "__init__.py" else module
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        imports[module.removesuffix(".__init__")] = found & {m.removesuffix(".__init__") for m in MODULES}
    return sorted((a, b) for a in imports for b in imports[a] if a < b and a in imports.get(b, set()))


def test_no_two_modules_import_each_other():
    """aggregate and scaling_model imported each other (a deferred import hid it); buckets.probe
    drove a Trainer it imported for type checking (issue 16: the probe runs the trainer's step)."""
    assert _circles() == []


@pytest.mark.parametrize("module", [m for m in MODULES if ".analysis." in m])
def test_each_analysis_module_imports_alone_without_torch(module):
    code = f"import sys; sys.modules['torch'] = None\nimport {module}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
