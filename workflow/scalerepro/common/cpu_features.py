"""Whether this CPU trains bf16 natively: the optimised preset's precision on a CPU (bf16 where it
is native, fp32 where it would be emulated), decided alike by the planner and the trainer. Reads
/proc/cpuinfo and the environment only, no torch.

bf16 autocast on a CPU runs its convolutions and matrix products in oneDNN. With the AVX512_BF16
instructions (``avx512_bf16``, AMD Zen 4 on, Intel Cooper Lake and Sapphire Rapids on) or AMX
(``amx_bf16``) they take half the bytes of fp32 at up to twice the rate; without them oneDNN converts
to fp32 and back around every operation. On the development VM (AMD EPYC, avx512_bf16), ResNet-18
at CIFAR shapes trained at 117.7 samples/s in bf16 and 85.6 in fp32; with oneDNN held below
AVX512_CORE_BF16 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``) at 39.7 and 92.4 (one run each, 7 measured
steps): emulated bf16 was 2.3x slower than fp32. An Intel Xeon without avx512_bf16 ran the README
study's bf16 cells 35 % slower than fp32 (both in benchmarks/README.md).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path

# oneDNN's CPU ISA names (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA before oneDNN 2.0), lowest first;
# two names on one rank are aliases. bf16 dot products need AVX512_CORE_BF16 or above.
ONEDNN_ISA_RANK = {
    "SSE41": 0,
    "AVX": 1,
    "AVX2": 2,
    "AVX2_VNNI": 3,
    "AVX2_VNNI_2": 4,
    "AVX512_CORE": 5,
    "AVX512_CORE_VNNI": 6,
    "AVX512_CORE_BF16": 7,
    "AVX10_1_512": 8,
    "AVX512_CORE_FP16": 8,
    "AVX10_1_512_AMX": 9,
    "AVX512_CORE_AMX": 9,
    "AVX10_1_512_AMX_FP16": 10,
    "AVX512_CORE_AMX_FP16": 10,
    "AVX10_2_512": 11,
    "AVX10_2_512_AMX_2": 12,
    "ALL": 99,
    "DEFAULT": 99,
}
BF16_ISA = "AVX512_CORE_BF16"
# /proc/cpuinfo flags of native bf16 arithmetic: x86 (AVX512_BF16, AMX), Arm (FEAT_BF16)
BF16_FLAGS_X86 = ("avx512_bf16", "amx_bf16")
BF16_FLAGS_ARM = ("bf16",)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (x86 "flags", Arm "Features")."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def native_bf16(cpuinfo: str | None = None, environ: Mapping[str, str] | None = None, machine: str | None = None) -> tuple[bool, str]:
    """(whether bf16 runs natively here, one line saying why). ``cpuinfo`` defaults to
    /proc/cpuinfo (absent: not native), ``environ`` to os.environ, ``machine`` to platform.machine()."""
    environ = os.environ if environ is None else environ
    machine = machine or platform.machine()
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False, "no /proc/cpuinfo to tell whether this CPU has native bf16: fp32 is the safe default"
    flags = cpu_flags(cpuinfo)
    wanted = BF16_FLAGS_ARM if machine in ("aarch64", "arm64") else BF16_FLAGS_X86
    found = sorted(flags.intersection(wanted))
    if not found:
        return False, f"this CPU has no native bf16 ({' or '.join(wanted)} not among its /proc/cpuinfo flags): oneDNN would emulate it"
    for variable in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        cap = environ.get(variable, "").strip().upper()
        if cap and cap in ONEDNN_ISA_RANK and ONEDNN_ISA_RANK[cap] < ONEDNN_ISA_RANK[BF16_ISA]:
            return False, f"{variable}={cap} keeps oneDNN below {BF16_ISA}: bf16 would be emulated although the CPU has {', '.join(found)}"
    return True, f"this CPU has native bf16 ({', '.join(found)})"
