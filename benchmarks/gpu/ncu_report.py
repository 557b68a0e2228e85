"""What ncu wrote, read by the project's own readers (scalerepro.analysis.profiles: ncu, roofline): the name
layout, the problems it reports, each launch's duration, tensor-pipe share and FLOPs, whether
tensor-core kernels (GEMM/conv) are among them, and the roofline on the H100 SXM peaks of
config/references.yaml. Exit 1 if the CSV cannot be read or holds no tensor-core kernel.

    python ncu_report.py KERNELS_CSV [PRECISION]"""

from __future__ import annotations

import re
import sys

from scalerepro.analysis.profiles.intervals import ProfileError
from scalerepro.analysis.profiles.ncu import read_ncu_csv
from scalerepro.analysis.profiles.roofline import gpu_peaks, roofline

path, precision = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "bf16"
GEMM_OR_CONV = re.compile(r"gemm|xmma|cutlass|nvjet|fprop|dgrad|wgrad|conv|mma", re.IGNORECASE)
try:
    reading = read_ncu_csv(path)
except (OSError, ProfileError) as error:
    raise SystemExit(f"NCU REPORT FAILED: {error}") from None
frame = reading.launches
print(f"{path}: {len(frame)} launches, layout {reading.layout!r}, compute capability {reading.compute_capabilities}")
for problem in reading.problems:
    print(f"  problem: {problem}")
print(frame[["id", "kernel", "duration", "tensor_pipe_pct", "flops", "dram_bytes"]].to_string(max_colwidth=60))
peaks = gpu_peaks("h100_sxm", precision)


def tflops(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e12:.1f}"


for row in roofline(frame, peaks):
    fraction = "n/a" if row["flops_fraction"] is None else f"{row['flops_fraction']:.0%}"
    print(
        f"ROOFLINE {row['kernel'][:56]:56s} x{row['launches']} {1e6 * row['duration_s']:9.1f} us  "
        f"{tflops(row['achieved_flops_per_s'])} of {tflops(row['peak_flops_per_s'])} TFLOP/s ({fraction}, {row['peak']}) "
        f"bound={row['bound']} tensor={row['tensor_work']}"
    )
# tensor-core work: the tensor pipe busy where the capture measured it, else a GEMM/conv name
busy = frame["tensor_pipe_pct"].fillna(0) > 0
named = frame["kernel"].map(lambda kernel: bool(GEMM_OR_CONV.search(kernel)))
tensor_core = sorted(set(frame.loc[busy | (frame["tensor_pipe_pct"].isna() & named), "kernel"]))
print(
    f"tensor-core kernels among the profiled: {len(tensor_core)} (tensor pipe busy: {int(busy.sum())} launches; "
    f"GEMM/conv by name: {int(named.sum())}): {[k[:50] for k in tensor_core][:6]}"
)
raise SystemExit(0 if tensor_core else 1)
