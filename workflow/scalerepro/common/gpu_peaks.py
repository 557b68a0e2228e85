"""The GPU peak table: dense peak throughput and memory bandwidth of each GPU the project knows,
with where each figure comes from. It is the one copy: the rank takes the MFU denominator from it
(``scalerepro.telemetry.hardware.peak_flops``), the analysis the roofs of the roofline
(``scalerepro.analysis.profiles.roofline``) and the report its table of peaks. Standard library
only: both sides import it.

Figures are TFLOP/s (TB/s for memory) per GPU, dense (no 2:4 sparsity). Datasheets print tensor
figures "with sparsity"; the dense rate, what a dense matmul can reach, is half of it (NVIDIA's
footnote: "Shown with sparsity. Specifications are one-half lower without sparsity"). ``fp32`` is
the CUDA-core (non-tensor) FMA rate, the roof of the SASS FP counters; ``tf32``/``fp16``/``bf16``/
``fp8`` are tensor-core rates with FP32 accumulation. None: the source gives no such figure (fp8 on
Ampere), or no source for it is recorded here; the figures that need it say so.

How the H100 SXM5 figures check out: 132 SMs x 128 FP32 lanes x 2 FLOP/FMA x 1.98 GHz = 66.9 T,
and 132 SMs x 4096 dense FP16 FLOP/clock x 1.83 GHz = 989.4 T; the datasheet prints the same
rounded (67; TF32 989*/2; FP16/BF16 1979*/2). H200, GH200 and H800 SXM5 are the same GH100 die,
SM count and clocks (their datasheets print the H100 SXM compute figures), so the whitepaper's
unrounded figures apply to them; they differ in memory (and the H800 in FP64 and NVLink).

Each figure holds at the SM clock it is quoted at, which is what scaling a peak to the clock a card
held needs: the tensor rates of an H100 SXM5 at 1,830 MHz, its CUDA-core rates at 1,980 MHz
(above). The PCIe column's are derived the same way from its 114 SMs: 756 T / (114 x 4096) =
1,620 MHz tensor, 51.2 T / (114 x 256) = 1,755 MHz CUDA-core. The A100's datasheet rates are all
at its 1,410 MHz boost clock (108 SMs x 2048 dense FP16 FLOP/clk x 1.41 GHz = 312 T; 108 x 128 x
1.41 GHz = 19.5 T fp32). The NVL datasheets give no clock and no SM count their rates would
check against: their clocks are None, and no figure is scaled by one.

``fp16_cuda_core``/``bf16_cuda_core`` are the non-tensor (CUDA-core) half-precision rates, the
roof of a kernel whose FLOPs are in the SASS half-precision counters (packed HFMA2, two lanes per
FP32 lane: 2 x the fp32 rate on Hopper). The whitepaper prints them for SXM5 and PCIe; the NVL's
datasheet prints none, so its entry derives them (SM count x clock x FLOP/clk/SM, said in its
source); None elsewhere: no recorded source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TFLOPS = 1e12  # FLOP/s per TFLOP/s
TBPS = 1e12  # bytes/s per TB/s

_H100_WHITEPAPER = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, A100/H100 comparison table, "
    "dense figures (https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper)"
)
_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet / product page technical specifications (https://www.nvidia.com/en-us/data-center/h200/)"
_GH200_DATASHEET = "NVIDIA GH200 Grace Hopper Superchip datasheet, Hopper GPU column (https://resources.nvidia.com/en-us-grace-cpu/grace-hopper-superchip)"
_H800_DATASHEET = "NVIDIA H800 Tensor Core GPU datasheet / product page technical specifications (https://www.nvidia.cn/data-center/h800/)"
_A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet; the same compute figures for 40 GB and 80 GB, SXM4 and PCIe "
    "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
)
_SPARSE_TO_DENSE = 0.5
# the whitepaper's A100/H100 comparison table, "Peak FP16 TFLOPS (non-Tensor)" and "Peak BF16 TFLOPS (non-Tensor)"
_H100_WHITEPAPER_NON_TENSOR = "non-tensor (CUDA-core) FP16 and BF16 from the same whitepaper table's Peak FP16/BF16 TFLOPS (non-Tensor) rows"


@dataclass(frozen=True)
class GpuPeaks:
    key: str  # the table's key (config `profiling.gpu_peaks` names one)
    model: str  # the compute part, as the record's MFU source names it ("H100 SXM5")
    name: str  # the full product name, memory included
    device_names: tuple[str, ...]  # what NVML/torch call it, exactly (documentation: matching is by rules)
    fp64: float | None
    fp32: float
    tf32: float
    fp16: float
    bf16: float
    fp8: float | None
    hbm_tbps: float | None
    source: str
    fp16_cuda_core: float | None = None  # non-tensor fp16 (HFMA2 on the CUDA cores), dense
    bf16_cuda_core: float | None = None  # non-tensor bf16 (HFMA2.BF16 on the CUDA cores), dense
    # The SM clocks the figures are quoted at: the tensor-core rates (tf32, fp16, bf16, fp8) and the
    # CUDA-core ones (fp64, fp32, the non-tensor half rates) may be quoted at different clocks
    # (H100 SXM5: 1,830 and 1,980 MHz). None where the source quotes none and none is derivable.
    tensor_clock_mhz: float | None = None
    cuda_core_clock_mhz: float | None = None
    sms: int | None = None  # streaming multiprocessors: rate = SMs x FLOP/clk/SM x clock (test_hardware checks each)
    # The most power the part can be set to draw (the datasheet's "max thermal design power", which
    # an operator may configure lower): a card's power limit is at most this. None: no source here.
    power_limit_max_w: float | None = None

    def tflops(self, precision: str) -> float | None:
        """Dense TFLOP/s at ``precision`` (fp64, fp32, tf32, fp16, bf16, fp8), None where unknown."""
        return getattr(self, precision)

    def clock_mhz(self, units: str) -> float | None:
        """The SM clock the ``units``' ("tensor" or "cuda_core") figures are quoted at, None where unknown."""
        return self.tensor_clock_mhz if units == "tensor" else self.cuda_core_clock_mhz

    def cuda_core_tflops(self, precision: str) -> float | None:
        """Non-tensor (CUDA-core) TFLOP/s at ``precision`` (fp64, fp32, fp16, bf16), None where unknown."""
        return {"fp64": self.fp64, "fp32": self.fp32, "fp16": self.fp16_cuda_core, "bf16": self.bf16_cuda_core}.get(precision)


_TABLE = (
    GpuPeaks(
        "h100_sxm",
        "H100 SXM5",
        "NVIDIA H100 SXM5 80GB",
        ("NVIDIA H100 80GB HBM3",),
        33.5,
        66.9,
        494.7,
        989.4,
        989.4,
        1978.9,
        3.35,
        f"{_H100_WHITEPAPER}; HBM3 3.35 TB/s from the {_H100_DATASHEET}; {_H100_WHITEPAPER_NON_TENSOR}: 133.8",
        fp16_cuda_core=133.8,
        bf16_cuda_core=133.8,
        sms=132,
        tensor_clock_mhz=1830.0,
        cuda_core_clock_mhz=1980.0,
        power_limit_max_w=700.0,  # the H100 datasheet's SXM column: "Max thermal design power (TDP) up to 700W (configurable)"
    ),
    # the whitepaper's PCIe column (114 SMs); the datasheet's: 51, 756*/2, 1513*/2
    GpuPeaks(
        "h100_pcie",
        "H100 PCIe",
        "NVIDIA H100 PCIe 80GB",
        ("NVIDIA H100 PCIe",),
        25.6,
        51.2,
        378.0,
        756.0,
        756.0,
        1513.0,
        2.0,
        f"{_H100_WHITEPAPER}, H100 PCIe column; HBM2e 2.0 TB/s from the {_H100_DATASHEET}; {_H100_WHITEPAPER_NON_TENSOR}, PCIe column: 102.4",
        fp16_cuda_core=102.4,
        bf16_cuda_core=102.4,
        sms=114,
        tensor_clock_mhz=1620.0,
        cuda_core_clock_mhz=1755.0,
    ),
    # datasheet, H100 NVL column per GPU: FP32 60; TF32 835*, FP16/BF16 1671*, FP8 3341* (with sparsity)
    GpuPeaks(
        "h100_nvl",
        "H100 NVL",
        "NVIDIA H100 NVL 94GB",
        ("NVIDIA H100 NVL",),
        30.0,
        60.0,
        835.0 * _SPARSE_TO_DENSE,
        1671.0 * _SPARSE_TO_DENSE,
        1671.0 * _SPARSE_TO_DENSE,
        3341.0 * _SPARSE_TO_DENSE,
        3.9,
        f"{_H100_DATASHEET}, H100 NVL column, per GPU; tensor figures printed with sparsity, halved; non-tensor FP16 and BF16 "
        "120, derived: the datasheet prints none, and a Hopper SM issues 512 half-precision FLOP/clk (HFMA2) against 256 FP32 "
        "FLOP/clk, so SM count x clock x 512 = 2 x its FP32 60 (the whitepaper's SXM5 and PCIe columns: 133.8 = 2 x 66.9, "
        "102.4 = 2 x 51.2)",
        fp16_cuda_core=120.0,
        bf16_cuda_core=120.0,
    ),
    GpuPeaks(
        "h200",
        "H200 SXM",
        "NVIDIA H200 SXM 141GB",
        ("NVIDIA H200",),
        33.5,
        66.9,
        494.7,
        989.4,
        989.4,
        1978.9,
        4.8,
        f"{_H200_DATASHEET}: identical compute figures to H100 SXM, so the {_H100_WHITEPAPER}; HBM3e 4.8 TB/s; "
        f"{_H100_WHITEPAPER_NON_TENSOR}, H100 SXM5 column: 133.8",
        fp16_cuda_core=133.8,
        bf16_cuda_core=133.8,
        sms=132,
        tensor_clock_mhz=1830.0,
        cuda_core_clock_mhz=1980.0,
    ),
    # datasheet, H200 NVL column: FP32 60; TF32 835*, FP16/BF16 1671* (with sparsity)
    GpuPeaks(
        "h200_nvl",
        "H200 NVL",
        "NVIDIA H200 NVL",
        ("NVIDIA H200 NVL",),
        None,
        60.0,
        835.0 * _SPARSE_TO_DENSE,
        1671.0 * _SPARSE_TO_DENSE,
        1671.0 * _SPARSE_TO_DENSE,
        None,
        None,
        f"{_H200_DATASHEET}, H200 NVL column; tensor figures printed with sparsity, halved",
    ),
    # datasheet, Hopper GPU column: FP32 67; TF32 494 (989*), FP16/BF16 990 (1979*)
    GpuPeaks(
        "gh200",
        "GH200",
        "NVIDIA GH200 Grace Hopper Superchip (Hopper GPU)",
        ("NVIDIA GH200 480GB",),
        None,
        66.9,
        494.7,
        989.4,
        989.4,
        None,
        None,
        f"{_GH200_DATASHEET}: identical compute figures to H100 SXM, so the {_H100_WHITEPAPER}",
        sms=132,
        tensor_clock_mhz=1830.0,
        cuda_core_clock_mhz=1980.0,
    ),
    # datasheet, H800 SXM5: the H100 SXM compute figures (the H800 differs in FP64 and NVLink)
    GpuPeaks(
        "h800_sxm",
        "H800 SXM5",
        "NVIDIA H800 SXM5",
        ("NVIDIA H800",),
        None,
        66.9,
        494.7,
        989.4,
        989.4,
        None,
        None,
        f"{_H800_DATASHEET}, SXM column: identical compute figures to H100 SXM, so the {_H100_WHITEPAPER}",
        sms=132,
        tensor_clock_mhz=1830.0,
        cuda_core_clock_mhz=1980.0,
    ),
    GpuPeaks(
        "h800_pcie",
        "H800 PCIe",
        "NVIDIA H800 PCIe",
        ("NVIDIA H800 PCIe",),
        None,
        51.2,
        378.0,
        756.0,
        756.0,
        None,
        None,
        f"{_H800_DATASHEET}, PCIe column: identical compute figures to H100 PCIe, so the {_H100_WHITEPAPER}",
        sms=114,
        tensor_clock_mhz=1620.0,
        cuda_core_clock_mhz=1755.0,
    ),
    # datasheet: FP32 19.5; TF32 156, FP16/BF16 312 (dense; 312*/624* with sparsity); no FP8 on Ampere
    GpuPeaks(
        "a100_sxm_80gb",
        "A100 SXM4",
        "NVIDIA A100 SXM4 80GB",
        ("NVIDIA A100-SXM4-80GB",),
        9.7,
        19.5,
        156.0,
        312.0,
        312.0,
        None,
        2.039,
        f"{_A100_DATASHEET}; HBM2e 2,039 GB/s for the 80GB SXM4",
        sms=108,
        tensor_clock_mhz=1410.0,
        cuda_core_clock_mhz=1410.0,
    ),
    GpuPeaks(
        "a100_sxm_40gb",
        "A100 SXM4",
        "NVIDIA A100 SXM4 40GB",
        ("NVIDIA A100-SXM4-40GB",),
        9.7,
        19.5,
        156.0,
        312.0,
        312.0,
        None,
        1.555,
        f"{_A100_DATASHEET}; HBM2 1,555 GB/s for the 40GB",
        sms=108,
        tensor_clock_mhz=1410.0,
        cuda_core_clock_mhz=1410.0,
    ),
    GpuPeaks(
        "a100_pcie_80gb",
        "A100 PCIe",
        "NVIDIA A100 PCIe 80GB",
        ("NVIDIA A100 80GB PCIe",),
        9.7,
        19.5,
        156.0,
        312.0,
        312.0,
        None,
        1.935,
        f"{_A100_DATASHEET}; HBM2e 1,935 GB/s for the 80GB PCIe",
        sms=108,
        tensor_clock_mhz=1410.0,
        cuda_core_clock_mhz=1410.0,
    ),
    GpuPeaks(
        "a100_pcie_40gb",
        "A100 PCIe",
        "NVIDIA A100 PCIe 40GB",
        ("NVIDIA A100-PCIE-40GB",),
        9.7,
        19.5,
        156.0,
        312.0,
        312.0,
        None,
        None,
        _A100_DATASHEET,
        sms=108,
        tensor_clock_mhz=1410.0,
        cuda_core_clock_mhz=1410.0,
    ),
)
PEAKS: dict[str, GpuPeaks] = {entry.key: entry for entry in _TABLE}

# A MIG instance gets a whole number of the GPU's 7 compute slices ("3g.40gb": 3 of 7; A100,
# H100, H200 and GH200 all have 7): NVIDIA Multi-Instance GPU User Guide, "Supported MIG
# Profiles", whose tables give each profile's fraction of the SMs as <slices>/7. The clock is the
# whole GPU's, so the instance's peak is that fraction of the GPU's.
MIG_COMPUTE_SLICES = 7
MIG_USER_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html#supported-mig-profiles"
_MIG_PROFILE = re.compile(r"\bMIG\s+(\d+)g\.(\d+)gb", re.IGNORECASE)
_NSYS_SUFFIX = re.compile(r"\s*\(compute capability [^)]*\)$")  # nsys writes "name (compute capability 9.0)"
# Devices that report "NVIDIA H100" / "NVIDIA H800" with no form factor: the 96 GB HBM2e SXM
# parts do (pytorch/torchtitan pull request 554, where a memory-size rule was rejected for exactly
# that reason), while the PCIe and NVL cards name themselves. Rule: take the SXM part, the variant
# with the highest peak, so that MFU can only be understated, never overstated.
BARE_NAME_RULE = (
    "the device name gives no form factor: the SXM part is assumed (the highest peak, so MFU is "
    "never overstated; PCIe and NVL cards report it in their names; https://github.com/pytorch/torchtitan/pull/554)"
)


def _tokens(device_name: str) -> set[str]:
    return set(re.split(r"[^A-Z0-9]+", _MIG_PROFILE.sub("", _NSYS_SUFFIX.sub("", device_name)).upper()))


def peaks_key(device_name: str | None) -> str | None:
    """The table's key for a device name as NVML/torch (or nsys) report it, None if not known.

    Names seen in the wild: "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    "NVIDIA H100" (96 GB SXM parts, see ``BARE_NAME_RULE``), "NVIDIA H800", "NVIDIA H800 PCIe",
    "NVIDIA GH200 480GB", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"; a MIG instance
    appends its profile ("NVIDIA H100 80GB HBM3 MIG 3g.40gb") and maps to its GPU's entry.
    """
    if not device_name:
        return None
    tokens = _tokens(device_name)
    if "GH200" in tokens:
        return "gh200"
    if "H100" in tokens:
        return "h100_nvl" if "NVL" in tokens else "h100_pcie" if "PCIE" in tokens else "h100_sxm"
    if "H800" in tokens:
        return "h800_pcie" if "PCIE" in tokens else "h800_sxm"
    if "H200" in tokens:
        # The SXM part reports plain "NVIDIA H200"; the only other H200 is the NVL (PCIe card).
        return "h200_nvl" if "NVL" in tokens else "h200"
    if "A100" in tokens:
        memory = "40gb" if "40GB" in tokens else "80gb"
        if "PCIE" in tokens:
            return f"a100_pcie_{memory}"
        if any(t.startswith("SXM") for t in tokens):
            return f"a100_sxm_{memory}"
    return None


def gpu_model(device_name: str | None) -> str | None:
    """The compute part of a device name ("H100 SXM5"), None if the table does not know it."""
    key = peaks_key(device_name)
    return PEAKS[key].model if key else None


def names_no_form_factor(device_name: str) -> bool:
    tokens = _tokens(device_name)
    return bool(tokens & {"H100", "H800"}) and not tokens & {"NVL", "PCIE", "HBM3"} and not any(t.startswith("SXM") for t in tokens)


def mig_slices(device_name: str | None) -> tuple[int, str] | None:
    """(compute slices of 7, profile) of a MIG instance's device name, or None for a whole GPU."""
    found = _MIG_PROFILE.search(device_name or "")
    if found is None:
        return None
    return int(found.group(1)), f"{found.group(1)}g.{found.group(2)}gb"
