"""What ran a benchmark: GPU peak throughput, software versions, host, git state, Slurm job.

Everything here is read, never assumed: a fact that cannot be read on this machine is None, with
the reason beside it. torch is imported inside the functions that need it, so importing this
module works without torch, and the CPU build of torch is enough to call any of them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

TFLOPS = 1e12  # FLOP/s per TFLOP/s

_H100_WHITEPAPER = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, A100/H100 comparison table, "
    "dense figures (https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper)"
)
_H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column, per GPU "
    "(https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)"
)
_H200_DATASHEET = (
    "NVIDIA H200 Tensor Core GPU datasheet / product page technical specifications "
    "(https://www.nvidia.com/en-us/data-center/h200/)"
)
_GH200_DATASHEET = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet, Hopper GPU column "
    "(https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip)"
)
_H800_DATASHEET = (
    "NVIDIA H800 Tensor Core GPU datasheet / product page technical specifications "
    "(https://www.nvidia.cn/data-center/h800/)"
)
_A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet; the same figures for 40 GB and 80 GB, SXM4 and PCIe "
    "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
)
# Datasheets print tensor-core figures "with sparsity" (2:4 structured); the dense rate, which is
# what a dense matmul can reach, is half of it (NVIDIA's footnote: "Shown with sparsity.
# Specifications are one-half lower without sparsity").
_SPARSE_TO_DENSE = 0.5

# A MIG instance gets a whole number of the GPU's 7 compute slices ("3g.40gb": 3 of 7; A100,
# H100, H200 and GH200 all have 7): NVIDIA Multi-Instance GPU User Guide, "Supported MIG
# Profiles", whose tables give each profile's fraction of the SMs as <slices>/7
# (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html#supported-mig-profiles).
# The clock is the whole GPU's, so the instance's peak is that fraction of the GPU's.
MIG_COMPUTE_SLICES = 7
_MIG_USER_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html#supported-mig-profiles"
_MIG_PROFILE = re.compile(r"\bMIG\s+(\d+)g\.(\d+)gb", re.IGNORECASE)
# Devices that report "NVIDIA H100" / "NVIDIA H800" with no form factor: the 96 GB HBM2e SXM
# parts do (pytorch/torchtitan pull request 554, https://github.com/pytorch/torchtitan/pull/554,
# where a memory-size rule was rejected for exactly that reason), while the PCIe and NVL cards
# name themselves. Rule: take the SXM part, the variant with the highest peak, so that MFU can
# only be understated, never overstated; the record's peak source says it was assumed.
_BARE_NAME_RULE = (
    "the device name gives no form factor: the SXM part is assumed (the highest peak, so MFU is "
    "never overstated; PCIe and NVL cards report it in their names; https://github.com/pytorch/torchtitan/pull/554)"
)


@dataclass(frozen=True)
class PeakThroughput:
    """Dense peak FLOP/s of one GPU (not a node) per precision, and where the numbers come from.

    ``fp32`` is the non-tensor-core (CUDA core) FMA rate; ``tf32``/``fp16``/``bf16`` are tensor
    core rates with FP32 accumulation, without sparsity.
    """

    model: str
    fp32: float
    tf32: float
    fp16: float
    bf16: float
    source: str

    def flops(self, precision: str) -> float:
        return float(getattr(self, precision))


PEAKS: dict[str, PeakThroughput] = {
    peak.model: peak
    for peak in (
        # Whitepaper dense figures; they agree with 132 SMs * 128 FP32 lanes * 2 FLOP/FMA *
        # 1.98 GHz = 66.9 T and 132 SMs * 4096 dense FP16 FLOP/clk * 1.83 GHz = 989.4 T.
        # The datasheet prints the same rounded: 67, TF32 989* / 2, FP16/BF16 1979* / 2.
        PeakThroughput(
            "H100 SXM5", 66.9 * TFLOPS, 494.7 * TFLOPS, 989.4 * TFLOPS, 989.4 * TFLOPS,
            _H100_WHITEPAPER,
        ),
        # Whitepaper dense figures (114 SMs); the datasheet's PCIe column: 51, 756* / 2, 1513* / 2.
        PeakThroughput(
            "H100 PCIe", 51.2 * TFLOPS, 378.0 * TFLOPS, 756.0 * TFLOPS, 756.0 * TFLOPS,
            _H100_WHITEPAPER,
        ),
        # Datasheet, per GPU: FP32 60; TF32 835*, FP16/BF16 1671* (with sparsity).
        PeakThroughput(
            "H100 NVL", 60.0 * TFLOPS, 835.0 * _SPARSE_TO_DENSE * TFLOPS,
            1671.0 * _SPARSE_TO_DENSE * TFLOPS, 1671.0 * _SPARSE_TO_DENSE * TFLOPS,
            _H100_DATASHEET + "; tensor figures printed with sparsity, halved",
        ),
        # The H200 datasheet prints exactly the H100 SXM datasheet's compute figures (FP32 67;
        # TF32 989*, FP16/BF16 1979*): same GH100 die, SM count and clocks, more and faster
        # memory. So the H100 SXM5 whitepaper's unrounded dense figures apply.
        PeakThroughput(
            "H200 SXM", 66.9 * TFLOPS, 494.7 * TFLOPS, 989.4 * TFLOPS, 989.4 * TFLOPS,
            _H200_DATASHEET + "; identical compute figures to H100 SXM, so " + _H100_WHITEPAPER,
        ),
        # Datasheet, H200 NVL column: FP32 60; TF32 835*, FP16/BF16 1671* (with sparsity).
        PeakThroughput(
            "H200 NVL", 60.0 * TFLOPS, 835.0 * _SPARSE_TO_DENSE * TFLOPS,
            1671.0 * _SPARSE_TO_DENSE * TFLOPS, 1671.0 * _SPARSE_TO_DENSE * TFLOPS,
            _H200_DATASHEET + ", H200 NVL column; tensor figures printed with sparsity, halved",
        ),
        # Datasheet: FP32 19.5; TF32 156, FP16/BF16 312 (dense; 312*/624* with sparsity).
        # Datasheet, Hopper GPU column: FP32 67; TF32 494 (989*), FP16/BF16 990 (1979*): the GH100
        # die with 132 SMs at 1.98 GHz as in H100 SXM, so the whitepaper's unrounded figures apply.
        PeakThroughput(
            "GH200", 66.9 * TFLOPS, 494.7 * TFLOPS, 989.4 * TFLOPS, 989.4 * TFLOPS,
            _GH200_DATASHEET + "; identical compute figures to H100 SXM, so " + _H100_WHITEPAPER,
        ),
        # Datasheet, H800 SXM5: FP32 67; TF32 989*, FP16/BF16 1979* (with sparsity): the H100 SXM
        # compute figures (the H800 differs in FP64 and NVLink bandwidth only).
        PeakThroughput(
            "H800 SXM5", 66.9 * TFLOPS, 494.7 * TFLOPS, 989.4 * TFLOPS, 989.4 * TFLOPS,
            _H800_DATASHEET + ", SXM column; identical compute figures to H100 SXM, so " + _H100_WHITEPAPER,
        ),
        # Datasheet, H800 PCIe: FP32 51; TF32 756*, FP16/BF16 1513*: the H100 PCIe figures.
        PeakThroughput(
            "H800 PCIe", 51.2 * TFLOPS, 378.0 * TFLOPS, 756.0 * TFLOPS, 756.0 * TFLOPS,
            _H800_DATASHEET + ", PCIe column; identical compute figures to H100 PCIe, so " + _H100_WHITEPAPER,
        ),
        PeakThroughput(
            "A100 SXM4", 19.5 * TFLOPS, 156.0 * TFLOPS, 312.0 * TFLOPS, 312.0 * TFLOPS,
            _A100_DATASHEET,
        ),
        PeakThroughput(
            "A100 PCIe", 19.5 * TFLOPS, 156.0 * TFLOPS, 312.0 * TFLOPS, 312.0 * TFLOPS,
            _A100_DATASHEET,
        ),
    )
}


def gpu_model(gpu_name: str | None) -> str | None:
    """The :data:`PEAKS` key for a device name as torch/NVML report it, or None if not known.

    Names seen in the wild: "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    "NVIDIA H100" (96 GB SXM parts, see ``_BARE_NAME_RULE``), "NVIDIA H800", "NVIDIA H800 PCIe",
    "NVIDIA GH200 480GB", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"; a MIG instance
    appends its profile ("NVIDIA H100 80GB HBM3 MIG 3g.40gb") and maps to its GPU's entry.
    """
    if not gpu_name:
        return None
    tokens = set(re.split(r"[^A-Z0-9]+", _MIG_PROFILE.sub("", gpu_name).upper()))
    if "GH200" in tokens:
        return "GH200"
    if "H100" in tokens:
        if "NVL" in tokens:
            return "H100 NVL"
        if "PCIE" in tokens:
            return "H100 PCIe"
        return "H100 SXM5"  # "80GB HBM3", "SXM5", or no form factor at all (_BARE_NAME_RULE)
    if "H800" in tokens:
        return "H800 PCIe" if "PCIE" in tokens else "H800 SXM5"
    if "H200" in tokens:
        # The SXM part reports plain "NVIDIA H200"; the only other H200 is the NVL (PCIe card).
        return "H200 NVL" if "NVL" in tokens else "H200 SXM"
    if "A100" in tokens:
        if "PCIE" in tokens:
            return "A100 PCIe"
        if any(t.startswith("SXM") for t in tokens):
            return "A100 SXM4"
        return None
    return None


def _names_no_form_factor(gpu_name: str) -> bool:
    tokens = set(re.split(r"[^A-Z0-9]+", _MIG_PROFILE.sub("", gpu_name).upper()))
    return bool(tokens & {"H100", "H800"}) and not tokens & {"NVL", "PCIE", "HBM3"} and not any(t.startswith("SXM") for t in tokens)


def mig_slices(gpu_name: str | None) -> tuple[int, str] | None:
    """(compute slices of 7, profile) of a MIG instance's device name, or None for a whole GPU."""
    found = _MIG_PROFILE.search(gpu_name or "")
    if found is None:
        return None
    return int(found.group(1)), f"{found.group(1)}g.{found.group(2)}gb"


def peak_flops(
    gpu_name: str | None, precision: str, override_tflops: float | None = None
) -> tuple[float | None, str]:
    """Dense peak FLOP/s of one GPU at ``precision``, and its source; or (None, the reason).

    ``precision`` names the arithmetic the matmuls and convolutions actually run in. Note that
    torch runs FP32 convolutions on TF32 tensor cores by default on Ampere and newer
    (``torch.backends.cudnn.allow_tf32`` is True) while FP32 matmuls stay FP32
    (``torch.backends.cuda.matmul.allow_tf32`` is False): pick "tf32" for an FP32 conv net.

    ``override_tflops`` (TFLOP/s, per GPU) wins over the table, for a GPU it lacks or a clock-
    capped part, and is recorded as a user override.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if override_tflops is not None:
        if not override_tflops > 0:
            raise ValueError(f"override_tflops must be positive, got {override_tflops!r}")
        return override_tflops * TFLOPS, f"user override ({override_tflops} TFLOP/s per GPU)"
    if not gpu_name:
        return None, "no GPU: peak throughput is tabulated for NVIDIA GPUs only"
    model = gpu_model(gpu_name)
    if model is None:
        return None, (
            f"no peak-throughput entry for {gpu_name!r} (known: {', '.join(PEAKS)}); "
            "pass a user override"
        )
    peak = PEAKS[model]
    source = f"{model}, dense {precision}: {peak.source}"
    if _names_no_form_factor(gpu_name):
        source += f"; {_BARE_NAME_RULE}"
    mig = mig_slices(gpu_name)
    if mig is None:
        return peak.flops(precision), source
    # MIG instance peak = GPU peak x compute slices / 7
    slices, profile = mig
    if not 1 <= slices <= MIG_COMPUTE_SLICES:
        return None, f"MIG profile {profile} of {gpu_name!r} claims {slices} of {MIG_COMPUTE_SLICES} compute slices: pass a user override"
    return peak.flops(precision) * slices / MIG_COMPUTE_SLICES, (
        f"MIG {profile}: {slices}/{MIG_COMPUTE_SLICES} of the GPU's compute slices ({_MIG_USER_GUIDE}) x {source}"
    )


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
        versions["nccl"] = ".".join(str(part) for part in nccl[:3]) + "".join(
            str(part) for part in nccl[3:]
        )
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
    """The visible CUDA devices, described by device 0 (nodes are assumed homogeneous)."""
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

