"""What ran a benchmark: software versions, host, git state (the MFU denominator: ``scalerepro.record.peak``).

Everything here is read, never assumed: a fact that cannot be read on this machine is None, with
the reason beside it. torch is imported inside the functions that need it, so importing this
module works without torch, and the CPU build of torch is enough to call any of them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import psutil

from scalerepro.telemetry.nvml import card_limits, nvml_uuid_for_torch_device


def _distribution_version(name: str) -> str | None:
    """Installed version of a distribution, read from its metadata without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions(import_torch: bool = True) -> dict[str, Any]:
    """Versions of the software a run's numbers depend on; None where not installed or no CUDA.

    ``cudnn`` is torch's integer as is (e.g. 90100): its encoding changed between cuDNN 8 and 9,
    so decoding it here could mislabel it. ``import_torch=False`` (the launcher, which must not
    import torch) reads torch's version from its metadata and leaves CUDA, cuDNN and NCCL None.
    """
    from scalerepro import __version__

    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": None,
        "cuda": None,
        "cudnn": None,
        "nccl": None,
        # torchvision is read from metadata, not imported: importing it on a CPU torch can fail
        # (see scalerepro.models._torchvision) and costs seconds.
        "torchvision": _distribution_version("torchvision"),
        "numpy": _distribution_version("numpy"),
        "nvidia-ml-py": _distribution_version("nvidia-ml-py"),
        "scalerepro": __version__,
        "platform": platform.platform(),
    }
    if not import_torch:
        versions["torch"] = _distribution_version("torch")
        return versions
    try:
        import torch
    except ImportError:
        return versions
    versions["torch"] = torch.__version__
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = torch.backends.cudnn.version()
    if torch.cuda.is_available():
        # (major, minor, patch) or (major, minor, patch, suffix) -> "2.21.5" / "2.21.5+cuda12.4"
        nccl = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(str(part) for part in nccl[:3]) + "".join(str(part) for part in nccl[3:])
    return versions


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_total_bytes() -> int | None:
    return psutil.virtual_memory().total


def _driver_version() -> tuple[str | None, str | None]:
    """(NVIDIA driver version, None) from NVML, or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML could not be initialised: {exc}"
    try:
        return pynvml.nvmlSystemGetDriverVersion(), None
    except pynvml.NVMLError as exc:
        return None, f"NVML did not report the driver version: {exc}"
    finally:
        pynvml.nvmlShutdown()


def _gpu_facts(import_torch: bool = True) -> dict[str, Any]:
    """The visible CUDA devices, described by device 0 (nodes are assumed homogeneous).

    Where torch sees a CUDA device, device 0 is named by its NVML UUID (``uuid``, the card itself
    whatever CUDA's numbering), with the power limit it enforces (``power_limit_w``) and its
    maximum SM clock (``sm_clock_max_mhz``) from NVML, each None where NVML does not report it;
    without a CUDA device these three are absent."""
    gpu: dict[str, Any] = {
        "name": None,
        "count": None,
        "memory_bytes": None,
        "compute_capability": None,
        "driver_version": None,
        "reason": None,
    }
    reasons: list[str] = []
    try:
        if not import_torch:
            raise ImportError
        import torch
    except ImportError:
        reasons.append("torch is not installed" if import_torch else "not read: this process imports no torch")
    else:
        gpu["count"] = torch.cuda.device_count()
        if gpu["count"] > 0:
            props = torch.cuda.get_device_properties(0)
            gpu["name"] = props.name
            gpu["memory_bytes"] = props.total_memory
            gpu["compute_capability"] = f"{props.major}.{props.minor}"
            gpu["uuid"] = nvml_uuid_for_torch_device(0)
            limits = card_limits(gpu["uuid"])
            gpu["power_limit_w"], gpu["sm_clock_max_mhz"] = limits["power_limit_w"], limits["sm_clock_max_supported_mhz"]
            if limits["reason"] is not None:
                reasons.append(f"power limit and maximum SM clock: {limits['reason']}")
        else:
            reasons.append("no CUDA device visible to torch")
    gpu["driver_version"], driver_reason = _driver_version()
    if driver_reason is not None:
        reasons.append(f"driver version: {driver_reason}")
    gpu["reason"] = "; ".join(reasons) or None
    return gpu


def host_facts(import_torch: bool = True) -> dict[str, Any]:
    """The machine this process runs on: CPU, memory, and its GPUs (``gpu``; not read without
    ``import_torch``)."""
    try:
        # The CPUs this process may run on (cgroup/cpuset, taskset, Slurm binding), which is what
        # bounds data-loader workers; os.cpu_count() counts the whole machine.
        usable_cpus: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable_cpus = None
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "memory_total_bytes": _memory_total_bytes(),
        "gpu": _gpu_facts(import_torch),
    }


# A guard, not an expectation: both commands take milliseconds on a normal checkout.
_GIT_TIMEOUT_S = 2.0


def _git(args: list[str], cwd: Path) -> tuple[str | None, str | None]:
    """(stdout, None) of a successful git command, or (None, why it failed)."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:  # cwd is checked by the caller, so this is the executable
        return None, "git is not installed"
    except subprocess.TimeoutExpired:
        return None, f"git {args[0]} took longer than {_GIT_TIMEOUT_S} s"
    except OSError as exc:
        return None, f"git could not run: {exc}"
    if done.returncode != 0:
        message = done.stderr.strip().splitlines()
        return None, f"git {' '.join(args)} failed: {message[0] if message else done.returncode}"
    return done.stdout, None


def git_info(start: Path) -> dict[str, Any]:
    """Commit and dirtiness of the checkout containing ``start``; never raises.

    ``dirty`` counts modified, staged and untracked-but-not-ignored files, since any of them can
    change what runs.
    """
    if not start.is_dir():
        return {"commit": None, "dirty": None, "reason": f"{start} is not a directory"}
    commit, reason = _git(["rev-parse", "HEAD"], start)
    if commit is None:
        return {"commit": None, "dirty": None, "reason": reason}
    status, reason = _git(["status", "--porcelain"], start)
    return {
        "commit": commit.strip(),
        "dirty": None if status is None else bool(status.strip()),
        "reason": reason,
    }
