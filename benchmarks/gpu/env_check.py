"""Versions; the peak table's pick for this GPU; the NVML sampler (total-energy counter) on a busy
GPU; the dense bf16 matmul rate; which SDPA kernels run at the models' shapes; torch.compile
(Triton needs a C compiler). On a machine without CUDA it checks what it can (versions, the peak
table on the name the issue gives) and says what it skipped. Exit 1 if a check fails."""

from __future__ import annotations

import subprocess
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from scalerepro.common import gpu_peaks
from scalerepro.record.peak import peak_for
from scalerepro.telemetry.nvml import NvmlSampler, nvml_uuid_for_torch_device

H100_SXM_NAME = "NVIDIA H100 80GB HBM3"  # what torch and NVML call the SXM part
bad: list[str] = []
cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if cuda else H100_SXM_NAME
print(f"torch {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()} nccl {torch.cuda.nccl.version() if cuda else None}")
bf16, fp32 = peak_for(name, "bf16")[0], peak_for(name, "fp32")[0]
where = "" if cuda else " (no CUDA here: the H100 SXM name from issue 11)"
print(
    f"device {name!r}{where} -> peak table {gpu_peaks.gpu_model(name)!r}: "
    + ", ".join(f"{p.precision} {p.flops_per_s:.4g} FLOP/s at {p.clock_mhz} MHz" for p in (bf16, fp32) if p is not None)
)
if "H100" in name and gpu_peaks.gpu_model(name) != "H100 SXM5":
    bad.append("the peak table did not pick H100 SXM5")
if not cuda:
    print("skipped without CUDA: NVML sampler, matmul rate, SDPA kernels, torch.compile on the GPU")
    print("ENV CHECK", "OK (CPU rehearsal)" if not bad else "FAILED: " + ", ".join(bad))
    raise SystemExit(1 if bad else 0)

uuid = nvml_uuid_for_torch_device(0)
smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"], capture_output=True, text=True).stdout.strip()
print(f"torch->NVML uuid {uuid} (nvidia-smi -i 0: {smi})")
if uuid != smi:
    bad.append("the torch device's NVML UUID is not nvidia-smi's GPU 0")
side = 8192
a = torch.randn(side, side, device="cuda", dtype=torch.bfloat16)  # random data: zeros run faster
for _ in range(5):
    a @ a
torch.cuda.synchronize()
sampler = NvmlSampler(uuid, 0.05)
sampler.start()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
products, began = 0, time.time()
while time.time() - began < 4:
    for _ in range(20):
        a @ a
    products += 20
    torch.cuda.synchronize()
end.record()
torch.cuda.synchronize()
summary = sampler.stop()
tflops = products * 2 * side**3 / (start.elapsed_time(end) / 1e3) / 1e12  # 2 n^3 FLOPs per product
print(f"dense bf16 matmul {side}^3: {tflops:.0f} TFLOP/s ({tflops * 1e12 / bf16:.0%} of the table's {bf16 / 1e12:.1f})")
print(
    "NVML:",
    {
        k: summary[k]
        for k in (
            "available",
            "reason",
            "energy_j",
            "energy_method",
            "power_mean_w",
            "power_max_w",
            "gpu_util_mean_pct",
            "sm_clock_mean_mhz",
            "temperature_max_c",
            "samples",
            "window_s",
        )
    },
)
if not summary["energy_j"] or summary["energy_method"] != "total_energy_counter":
    bad.append("NVML total-energy counter")
for batch, seq, causal, what in ((32, 1024, True, "gpt2_small"), (256, 128, False, "bert_base"), (128, 197, False, "vit_b_16")):
    q = torch.randn(batch, 12, seq, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, q, q, is_causal=causal).sum().backward()
        torch.cuda.synchronize()
    kernels = sorted({e.key for e in prof.key_averages() if any(s in e.key.lower() for s in ("flash", "fmha", "cudnn", "attention", "efficient"))})
    print(f"SDPA bf16 {what} shape ({batch},12,{seq},64) causal={causal}: {[k[:60] for k in kernels][:3]}")
compiled = torch.compile(lambda x: F.gelu(x * 2).sum())
print("torch.compile (Triton) OK:", float(compiled(torch.randn(4096, device="cuda"))))
print("ENV CHECK", "OK" if not bad else "FAILED: " + ", ".join(bad))
raise SystemExit(1 if bad else 0)
