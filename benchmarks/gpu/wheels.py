"""Download, into .whl/, the wheels the GPU machine lacks for the workflow (Snakemake and what it
needs, pydantic for the run record's model): each package of those requirements' closure that
is installed here and not in device_packages.txt, at the version installed here (the one the
test suite ran with), for CPython 3.12 on manylinux x86-64. A package published as an sdist
only is built into a wheel here (they are pure Python). Run from the repository root, where the
development environment is installed; the device README says how a call carries .whl/.

    python benchmarks/gpu/wheels.py [--out .whl]"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# duckdb: the store rule (results/history.duckdb); pydantic: the run record's model (scalerepro.record)
ROOTS = ("snakemake", "jsonschema", "duckdb", "pydantic")
DEVICE_PYTHON = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
PLATFORMS = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["--platform=manylinux2014_x86_64"]


def on_device() -> set[str]:
    text = (Path(__file__).with_name("device_packages.txt")).read_text()
    return {canonicalize_name(word) for line in text.splitlines() if not line.startswith("#") for word in line.split()}


def closure(roots: tuple[str, ...], present: set[str]) -> dict[str, str]:
    """name -> version installed here, for every requirement reachable from ``roots`` on the
    device's Python that the device lacks."""
    wanted, todo = {}, list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in wanted or name in present:
            continue
        wanted[name] = metadata.version(name)  # PackageNotFoundError: install the dev environment first
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(DEVICE_PYTHON):
                todo.append(requirement.name)
    return wanted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".whl"))
    args = parser.parse_args()
    args.out.mkdir(exist_ok=True)
    wanted = closure(ROOTS, on_device())
    pip = [sys.executable, "-m", "pip", "-q"]
    for name, version in sorted(wanted.items()):
        spec = f"{name}=={version}"
        binary = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version=3.12", "--implementation=cp", *PLATFORMS, "-d", str(args.out), spec]
        if subprocess.run(binary, capture_output=True).returncode != 0:
            built = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(args.out), spec], capture_output=True, text=True)
            if built.returncode != 0:
                print(f"wheels: no wheel for {spec}: {built.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            print(f"{spec}: built here (sdist only)")
    size = sum(f.stat().st_size for f in args.out.glob("*.whl"))
    print(f"{len(wanted)} packages, {len(list(args.out.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
