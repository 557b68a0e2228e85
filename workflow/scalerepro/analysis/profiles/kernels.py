"""What a GPU kernel is, from its name: its kind (convolution, GEMM, a fused Triton elementwise
kernel ...), the class of the step's breakdown it counts in (``STEP_CLASSES``), whether it is
matrix work that may run on the tensor cores, the precision its name states, and a name short
enough to read; and the kernels of an Nsight Compute capture by time.

The kinds are data (``KERNEL_KINDS``: the first pattern that matches names the kind), so a kernel
family this table lacks is one line here, never a branch of code.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

# (kind, pattern over the kernel's name), first match wins. The Triton rules come first: Inductor
# names a fused kernel after every op it fused ("..._convolution_backward_native_batch_norm_..."),
# so the words of its name say what it fused, not what it is; "triton_tem" is a Triton template
# (max-autotune's GEMM or convolution).
KERNEL_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE))
    for kind, pattern in (
        ("communication (NCCL)", r"nccl"),
        ("GEMM/convolution (Triton template)", r"^triton_tem"),
        ("fused elementwise (Triton)", r"^triton_poi"),
        ("fused reduction (Triton)", r"^triton_(red|per)"),
        ("attention", r"flash|fmha|attention|sdpa"),
        # set-up and layout kernels that some GEMM and convolution libraries launch beside their own
        ("layout / set-up", r"init_device_workspace|memset|padding|transpose|nchwToNhwc|nhwcToNchw"),
        # cuDNN's and CUTLASS's implicit-GEMM convolutions: fprop forward, dgrad/wgrad backward
        ("convolution", r"conv|fprop|dgrad|wgrad|implicit_?gemm"),
        # cuBLAS(Lt) and CUTLASS GEMMs; nvjet is cuBLAS's Hopper GEMM family; splitKreduce finishes a split-K GEMM
        ("GEMM", r"gemm|nvjet|cublas|xmma|cutlass"),
        ("normalisation", r"batch_?norm|layer_?norm|group_?norm|rms_?norm|welford"),
        ("optimizer (multi-tensor)", r"multi_tensor|adam|sgd|foreach"),
        ("softmax / reduction (ATen)", r"softmax|reduce|_sum|mean"),
        ("elementwise (ATen)", r"elementwise|functor|copy|fill|index|cat_|scatter|gather"),
    )
)
OTHER_KIND = "other"

# The classes a step's time is split into (the report's breakdown of the step), each a few kinds:
# what a reader can act on (a convolution or GEMM is matrix work; normalisation and elementwise
# work is memory traffic that fusion can remove; copies move, cast or fill memory and do no math).
STEP_CLASSES = ("convolution", "GEMM", "attention", "normalisation and elementwise", "optimizer", "communication", "copies", "other")
KIND_CLASSES = {
    "communication (NCCL)": "communication",
    "attention": "attention",
    "layout / set-up": "copies",
    "convolution": "convolution",
    "GEMM": "GEMM",
    "normalisation": "normalisation and elementwise",
    "fused elementwise (Triton)": "normalisation and elementwise",
    "fused reduction (Triton)": "normalisation and elementwise",
    "softmax / reduction (ATen)": "normalisation and elementwise",
    "elementwise (ATen)": "normalisation and elementwise",
    "optimizer (multi-tensor)": "optimizer",
    OTHER_KIND: "other",
}
# Kernels that only move, cast or fill memory, whatever their kind: ATen's copy and fill kernels,
# and Inductor kernels that fused nothing but copies, casts and views ("triton_poi_fused__to_copy_1").
COPY_KERNEL = re.compile(
    r"direct_copy|copy_kernel|memcpy|memset|FillFunctor|^triton_\w{3}_fused_((_to_copy|clone|copy_?|new_zeros|zeros|squeeze|unsqueeze|view|permute)_)+\d+$",
    re.IGNORECASE,
)
# The kinds whose work is matrix multiplication, and so may run on the tensor cores; any other
# kernel is never set under a tensor roof, whatever the tensor-pipe counter shows (Hopper's counts
# the half-precision FMAs an elementwise kernel issues to the tensor pipe, HFMA2.MMA, as busy).
MATRIX_KINDS = frozenset({"GEMM/convolution (Triton template)", "attention", "convolution", "GEMM"})

# (precision, pattern over the kernel's name) of the tensor-core precisions a name states: cuDNN's
# "bf16bf16_bf16f32", CUTLASS's "tensorop_s16816gemm_bf16", cuBLAS's "tf32"; first match wins
# (bf16 before fp16: "bf16" contains "f16").
NAME_PRECISIONS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (precision, re.compile(pattern, re.IGNORECASE))
    for precision, pattern in (
        ("fp8", r"e4m3|e5m2|fp8"),
        ("bf16", r"bf16|bfloat16"),
        ("tf32", r"tf32"),
        ("fp16", r"f16|half|h884|h1688|h16816"),
    )
)


def kernel_kind(name: str) -> str:
    """The kind of the kernel called ``name`` (``KERNEL_KINDS``), ``OTHER_KIND`` when none matches."""
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), OTHER_KIND)


def kernel_class(name: str, kind: str | None = None) -> str:
    """The class of the step's breakdown (``STEP_CLASSES``) the kernel called ``name`` counts in:
    a copy by its name, else its kind's class (a Triton template by what its name says it fused)."""
    kind = kind or kernel_kind(name)
    if COPY_KERNEL.search(name):
        return "copies"
    if kind == "GEMM/convolution (Triton template)":
        return "convolution" if re.search(r"conv", name, re.IGNORECASE) else "GEMM"
    return KIND_CLASSES.get(kind, "other")


def name_precision(name: str) -> str | None:
    """The tensor-core precision the kernel's name states, None when it states none."""
    return next((precision for precision, pattern in NAME_PRECISIONS if pattern.search(name)), None)


def short_name(name: str, limit: int = 90) -> str:
    """A demangled kernel name cut to what a reader needs: no ``void``, no parameter list, and
    template arguments kept to the first level (``Kernel<cutlass_tensorop_bf16_s16816fprop...>``,
    ``Kernel<conv::ImplicitGemmConvolution<…>>``), at most ``limit`` characters."""
    text = re.sub(r"^void\s+", "", name.strip())
    out, depth = [], 0
    for char in text:
        if char == "(" and depth == 0:
            break  # the parameter list
        if char == "<":
            depth += 1
            if depth == 2:
                out.append("<…")
            if depth >= 2:
                continue
        elif char == ">":
            depth -= 1
            if depth >= 1:
                if depth == 1:
                    out.append(">")
                continue
        elif depth >= 2:
            continue
        out.append(char)
    short = re.sub(r",\s*", ", ", "".join(out)).strip()
    return short if len(short) <= limit else short[: limit - 1] + "…"


def ncu_kernel_times(launches: pd.DataFrame) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The kernels of an Nsight Compute capture by time (every kernel, longest first), and what
    their times are of.

    ncu replays each profiled launch, and the project's command profiles one launch of each launch
    configuration (``--filter-mode per-launch-config --launch-count 1``): a kernel's ``total_s``
    is the sum over its configurations of one launch each, and ``share`` is its part of that sum
    over every configuration, not of the step (a configuration the step launches several times,
    the same convolution in several blocks, counts once). ``calls`` is the number of its
    configurations profiled. Launches without a duration are counted in ``basis`` and left out."""
    timed = launches[launches["duration"].notna()]
    total = float(timed["duration"].sum())
    grouped = timed.groupby("kernel", sort=False)["duration"].agg(calls="count", total_s="sum").reset_index()
    grouped = grouped.sort_values(["total_s", "kernel"], ascending=[False, True], kind="stable")
    rows = [
        {
            "name": row.kernel,
            "kind": kernel_kind(row.kernel),
            "class": kernel_class(row.kernel),
            "calls": int(row.calls),
            "total_s": float(row.total_s),
            "mean_us": float(row.total_s) / row.calls * 1e6,
            "share": float(row.total_s) / total if total else None,
        }
        for row in grouped.itertuples()
    ]
    basis = {
        "source": "ncu",
        "launch_configurations": int(len(timed)),
        "kernels": int(grouped.shape[0]),
        "untimed_launches": int(len(launches) - len(timed)),
        "total_s": total,
        "what": (
            f"Nsight Compute: one launch of each of {len(timed)} launch configurations ({grouped.shape[0]} kernels), "
            f"{total * 1e3:.3g} ms in all; a share is of that sum, not of the step (a configuration the step "
            "launches several times counts once)"
        ),
    }
    return rows, basis
