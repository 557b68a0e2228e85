"""The MFU peak (scalerepro.record.peak) from the GPU peak table, Slurm and git facts, and the version and host reports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from scalerepro.common.gpu_peaks import PEAKS, gpu_model
from scalerepro.record.base import Precision
from scalerepro.record.peak import ARITHMETIC, part_words, peak_for, rate_words
from scalerepro.telemetry.hardware import git_info, host_facts, software_versions

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
def test_the_peak_comes_from_the_table(device_name: str, precision: Precision, tflops: float) -> None:
    peak, reason = peak_for(device_name, precision)
    assert peak is not None and reason is None
    assert peak.flops_per_s == pytest.approx(tflops * T) and peak.basis == "table" and peak.part == gpu_model(device_name)
    # fp32 with TF32 off runs on the CUDA cores; every other precision on the tensor cores
    assert peak.units == ("cuda_core" if precision == "fp32" else "tensor") and peak.precision == precision
    assert "https://" in peak.source and gpu_model(device_name) in peak.source


# FLOP per clock per SM, dense: Hopper's tensor cores do 4,096 fp16/bf16 FLOP/clk (2,048 tf32), its
# CUDA cores 256 fp32 (128 lanes x FMA); Ampere's A100 half of each
FLOP_PER_CLOCK = {"H": {"fp32": 256, "tf32": 2048, "bf16": 4096}, "A": {"fp32": 128, "tf32": 1024, "bf16": 2048}}


@pytest.mark.parametrize("key", [key for key, entry in PEAKS.items() if entry.sms is not None])
def test_each_peak_is_its_sms_times_its_flop_per_clock_times_the_clock_it_is_quoted_at(key: str) -> None:
    """rate = SMs x FLOP/clk/SM x clock: the tensor rates of an H100 SXM5 at 1,830 MHz and its
    CUDA-core rates at 1,980 MHz (the whitepaper's), so that an MFU is scaled to the clock a card held
    from the clock its peak is quoted at, not the card's top clock (issue 64: 8.2 % high)."""
    entry = PEAKS[key]
    per_clock = FLOP_PER_CLOCK[entry.model[0] if entry.model[0] in "A" else "H"]
    for precision, rate in (("fp32", entry.fp32), ("tf32", entry.tf32), ("bf16", entry.bf16)):
        clock = entry.clock_mhz("cuda_core" if precision == "fp32" else "tensor")
        assert clock is not None
        # the datasheets round to three or four figures
        assert rate * T == pytest.approx(entry.sms * per_clock[precision] * clock * 1e6, rel=5e-3), (key, precision)


def test_an_h100s_dense_bf16_peak_is_quoted_at_1830_mhz_and_its_fp32_at_1980() -> None:
    bf16, _ = peak_for("NVIDIA H100 80GB HBM3", "bf16")
    fp32, _ = peak_for("NVIDIA H100 80GB HBM3", "fp32")
    assert bf16 is not None and fp32 is not None and (bf16.clock_mhz, fp32.clock_mhz) == (1830.0, 1980.0)
    nvl, _ = peak_for("NVIDIA H100 NVL", "bf16")
    assert nvl is not None and nvl.clock_mhz is None  # its datasheet quotes no clock: none is guessed


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
    for precision in ARITHMETIC:
        peak, _ = peak_for(device_name, precision)
        whole, _ = peak_for(whole_gpu, precision)
        assert peak is not None and whole is not None
        # MIG instance peak = GPU peak x compute slices / 7
        assert peak.flops_per_s == pytest.approx(whole.flops_per_s * slices / 7)
        assert (peak.mig_slices, peak.clock_mhz) == (slices, whole.clock_mhz) and f"{slices}/7" in peak.source and "mig-user-guide" in peak.source
        assert f"{slices}/7 of the GPU" in (part_words(peak) or "")


def test_a_name_without_form_factor_says_the_sxm_peak_was_assumed() -> None:
    peak, _ = peak_for("NVIDIA H100", "bf16")
    assert peak is not None and peak.form_factor_assumed and "no form factor" in peak.source and "torchtitan/pull/554" in peak.source
    assert part_words(peak) == "H100 SXM5, form factor assumed"
    named, _ = peak_for("NVIDIA H100 80GB HBM3", "bf16")
    assert named is not None and not named.form_factor_assumed and "no form factor" not in named.source


def test_every_table_row_is_dense_and_ordered_by_precision() -> None:
    for peak in PEAKS.values():
        # Tensor-core rates exceed the CUDA-core FP32 rate, and FP16/BF16 run at twice TF32.
        assert peak.fp32 < peak.tf32 < peak.fp16 == peak.bf16
        assert peak.fp16 == pytest.approx(2 * peak.tf32, rel=1e-3)
        assert "https://" in peak.source and ("datasheet" in peak.source.lower() or "whitepaper" in peak.source.lower())


@pytest.mark.parametrize("device_name", ["cpu", None, "NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3 MIG 9g.90gb"])
def test_an_unknown_peak_is_none_with_reason(device_name: str | None) -> None:
    peak, reason = peak_for(device_name, "bf16")
    assert peak is None
    assert reason


def test_a_peak_override_wins_and_is_recorded() -> None:
    peak, _ = peak_for("NVIDIA H100 80GB HBM3", "bf16", override_tflops=700.0)
    assert peak is not None and peak.flops_per_s == pytest.approx(700.0 * T)
    assert peak.basis == "user override" and peak.source.startswith("user override") and peak.clock_mhz is None
    assert (rate_words(peak), part_words(peak)) == ("700 TFLOP/s per GPU", "user override")
    cpu, _ = peak_for("cpu", "fp32", override_tflops=1.5)
    assert cpu is not None and cpu.flops_per_s == pytest.approx(1.5 * T)


def test_peak_for_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="precision"):
        peak_for("NVIDIA H100 80GB HBM3", "fp8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="override"):
        peak_for("NVIDIA H100 80GB HBM3", "bf16", override_tflops=0.0)


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
