"""Peak-throughput lookup, Slurm and git facts, and the version and host reports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from scalerepro.common.gpu_peaks import PEAKS, gpu_model
from scalerepro.telemetry.hardware import PRECISIONS, git_info, host_facts, peak_flops, software_versions

T = 1e12


@pytest.mark.parametrize(
    ("device_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM5"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM4"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
        ("NVIDIA H100", "H100 SXM5"),  # no form factor: the highest H100 peak (MFU never overstated)
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "H100 SXM5"),  # a MIG instance: its GPU's entry
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100 SXM4"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GH200 144G HBM3e", "GH200"),
        ("NVIDIA H800", "H800 SXM5"),
        ("NVIDIA H800 PCIe", "H800 PCIe"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A10", None),  # must not match A100 by prefix
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
        ("", None),
        (None, None),
    ],
)
def test_gpu_model_matches_torch_device_names(device_name: str | None, model: str | None) -> None:
    assert gpu_model(device_name) == model


@pytest.mark.parametrize(
    ("device_name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "fp32", 51.2),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA H100 PCIe", "fp16", 756.0),
        ("NVIDIA H100 NVL", "tf32", 417.5),  # 835 with sparsity / 2
        ("NVIDIA H100 NVL", "bf16", 835.5),  # 1671 with sparsity / 2
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "fp32", 60.0),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA A100-PCIE-40GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "fp16", 312.0),
        ("NVIDIA H100", "bf16", 989.4),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("NVIDIA GH200 480GB", "fp32", 66.9),
        ("NVIDIA H800", "bf16", 989.4),
        ("NVIDIA H800 PCIe", "tf32", 378.0),
        ("NVIDIA H200 NVL", "bf16", 835.5),
    ],
)
def test_peak_flops_from_the_table(device_name: str, precision: str, tflops: float) -> None:
    flops, source = peak_flops(device_name, precision)
    assert flops == pytest.approx(tflops * T)
    assert "https://" in source and gpu_model(device_name) in source


@pytest.mark.parametrize(
    ("device_name", "slices", "whole_gpu"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 3, "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 1, "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", 7, "NVIDIA H100 80GB HBM3"),
        ("NVIDIA A100-SXM4-40GB MIG 2g.10gb", 2, "NVIDIA A100-SXM4-40GB"),
        ("NVIDIA H100 NVL MIG 4g.47gb", 4, "NVIDIA H100 NVL"),
    ],
)
def test_a_mig_instance_gets_its_slices_share_of_the_gpus_peak(device_name: str, slices: int, whole_gpu: str) -> None:
    for precision in PRECISIONS:
        flops, source = peak_flops(device_name, precision)
        whole, _ = peak_flops(whole_gpu, precision)
        # MIG instance peak = GPU peak x compute slices / 7
        assert flops == pytest.approx(whole * slices / 7)
        assert f"{slices}/7" in source and "mig-user-guide" in source


def test_a_name_without_form_factor_says_the_sxm_peak_was_assumed() -> None:
    _, source = peak_flops("NVIDIA H100", "bf16")
    assert "no form factor" in source and "torchtitan/pull/554" in source
    _, named = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert "no form factor" not in named


def test_every_table_row_is_dense_and_ordered_by_precision() -> None:
    for peak in PEAKS.values():
        # Tensor-core rates exceed the CUDA-core FP32 rate, and FP16/BF16 run at twice TF32.
        assert peak.fp32 < peak.tf32 < peak.fp16 == peak.bf16
        assert peak.fp16 == pytest.approx(2 * peak.tf32, rel=1e-3)
        assert "https://" in peak.source and ("datasheet" in peak.source.lower() or "whitepaper" in peak.source.lower())


@pytest.mark.parametrize("device_name", ["cpu", None, "NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3 MIG 9g.90gb"])
def test_peak_flops_unknown_is_none_with_reason(device_name: str | None) -> None:
    flops, reason = peak_flops(device_name, "bf16")
    assert flops is None
    assert reason


def test_peak_flops_override_wins_and_is_recorded() -> None:
    flops, source = peak_flops("NVIDIA H100 80GB HBM3", "bf16", override_tflops=700.0)
    assert flops == pytest.approx(700.0 * T)
    assert source.startswith("user override")
    assert peak_flops("cpu", "fp32", override_tflops=1.5)[0] == pytest.approx(1.5 * T)


def test_peak_flops_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="precision"):
        peak_flops("NVIDIA H100 80GB HBM3", "fp8")
    with pytest.raises(ValueError, match="override"):
        peak_flops("NVIDIA H100 80GB HBM3", "bf16", override_tflops=0.0)


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@needs_git
def test_git_info_clean_then_dirty(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("print('v1')\n")
    _git(tmp_path, "add", "train.py")
    _git(tmp_path, "commit", "-q", "-m", "v1")
    sub = tmp_path / "pkg"
    sub.mkdir()  # an empty directory is invisible to git, so the tree is still clean

    clean = git_info(sub)
    assert clean["reason"] is None
    assert isinstance(clean["commit"], str) and len(clean["commit"]) in (40, 64)
    assert clean["dirty"] is False

    (tmp_path / "train.py").write_text("print('v2')\n")
    dirty = git_info(tmp_path)
    assert dirty["commit"] == clean["commit"]
    assert dirty["dirty"] is True


@needs_git
def test_git_info_outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stop git's upward search at tmp_path, in case the temporary directory sits inside a checkout.
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    info = git_info(tmp_path)
    assert info["commit"] is None and info["dirty"] is None
    assert info["reason"]


def test_git_info_missing_directory(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    assert git_info(absent) == {"commit": None, "dirty": None, "reason": f"{absent} is not a directory"}


def test_software_versions_on_this_machine() -> None:
    versions = software_versions()
    assert set(versions) == {
        "python",
        "torch",
        "cuda",
        "cudnn",
        "nccl",
        "torchvision",
        "numpy",
        "nvidia-ml-py",
        "scalerepro",
        "platform",
    }
    for key in ("python", "torch", "numpy", "scalerepro", "platform"):
        assert isinstance(versions[key], str) and versions[key], key
    assert versions["cudnn"] is None or isinstance(versions["cudnn"], int)
    for key in ("cuda", "nccl", "torchvision", "nvidia-ml-py"):
        assert versions[key] is None or isinstance(versions[key], str), key
    json.dumps(versions)


def test_host_facts_on_this_machine() -> None:
    facts = host_facts()
    assert isinstance(facts["hostname"], str) and facts["hostname"]
    assert facts["cpu_model"] is None or isinstance(facts["cpu_model"], str)
    assert isinstance(facts["logical_cpus"], int) and facts["logical_cpus"] >= 1
    assert facts["usable_cpus"] is None or 1 <= facts["usable_cpus"] <= facts["logical_cpus"]
    assert facts["memory_total_bytes"] is None or facts["memory_total_bytes"] > 0
    gpu = facts["gpu"]
    # the card's identity and limits (uuid, power limit, top SM clock) where torch sees a CUDA device
    card = {"uuid", "power_limit_w", "sm_clock_max_mhz"} if gpu["count"] else set()
    assert set(gpu) == {"name", "count", "memory_bytes", "compute_capability", "driver_version", "reason", *card}
    if not gpu["count"]:
        # A CPU machine: nothing about a GPU is invented, and the record says why.
        assert gpu["name"] is None and gpu["memory_bytes"] is None
        assert gpu["compute_capability"] is None
        assert isinstance(gpu["reason"], str) and gpu["reason"]
    else:
        assert isinstance(gpu["name"], str) and gpu["memory_bytes"] > 0
    if gpu["driver_version"] is None:
        assert "driver version" in gpu["reason"]
    json.dumps(facts)
