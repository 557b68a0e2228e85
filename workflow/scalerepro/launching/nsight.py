"""Start one rank of a profiling job: under Nsight Systems or Nsight Compute when it is a profiled
rank, else the plain trainer. The launcher (torchrun, srun) runs this once per rank:

    torchrun --nproc-per-node 8 -m scalerepro.launching.nsight --tool nsys --ranks 0 --out-dir DIR -- <trainer flags>

It replaces itself (exec) with the tool or the trainer, so the launcher's signals and exit codes
reach the trainer unchanged. Needs no torch: it only builds a command line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sqlite3
import sys

from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary

# Nsight Compute: only the raw metrics the roofline and the summary read (no sections: a section
# prints display names, "Duration", "Achieved Occupancy"..., which change between ncu versions,
# and costs replay passes). With --print-metric-name name and --print-units base every row
# carries the raw name and the base unit (nsecond/ns, byte, byte/second, %).
NCU_METRICS = (
    "gpu__time_duration.sum",  # duration of the launch
    "dram__bytes.sum",  # DRAM bytes read + written
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",  # compute (SM) throughput, % of peak
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",  # memory throughput, % of peak
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
    "sm__maximum_warps_per_active_cycle_pct",  # theoretical occupancy
    # FP32/FP16/FP64 add, mul, fma thread instructions: FLOPs = ADD + MUL + 2 FMA
    *(f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in ("f", "h", "d") for op in ("add", "mul", "fma")),
)
# The tensor-pipe utilisation metric has another name on each generation (compute capability
# major): one ncu does not know is an error that loses the whole profile, so it is chosen per GPU.
TENSOR_PIPE_METRICS = {
    7: ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",),  # Volta, Turing
    8: ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",),  # Ampere, Ada
    # Hopper: one cycles counter for warpgroup MMA (wgmma: HGMMA, QGMMA), mma.sync (HMMA) and the
    # half-precision FMAs issued to the tensor pipe (HFMA2.MMA) alike; ncu 2025.3 on an H100
    # describes it so and knows no separate gmma cycles counter (its --query-metrics lists none, and
    # one metric ncu does not know fails the whole profile). The wgmma instruction count tells a
    # kernel that reaches the wgmma peak from one that cannot (scalerepro.analysis.profiles.roofline.roofline).
    9: ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed", "sm__inst_executed_pipe_tensor_op_gmma.sum"),
}
# ncu's --clock-control: "none" leaves the GPU's clocks as the run has them (ncu's default, "base",
# locks them at base clock; kernel times at base clock set against boost-clock peaks read low).
# The capture records it (scalerepro.launching.profile_job).
NCU_CLOCK_CONTROL = "none"
# ncu replays a kernel to collect its counters; replaying an NCCL kernel serialises this rank
# while its peers wait inside the collective, and the job hangs (NVIDIA/nccl issues 466 and
# 536, nccl-tests issue 101). Kernel names are matched by ncu's "function" base, the plain
# function name, which is also what nsys exports as shortName; NCCL's all start with "nccl".
NOT_NCCL = "^(?!nccl)"


def tensor_pipe_metrics(compute_major: int | None) -> tuple[str, ...]:
    """The tensor-pipe metric(s) for a GPU of compute capability ``compute_major``.x; none
    (with a one-line warning) for a generation not in TENSOR_PIPE_METRICS, whose tensor-core
    kernels then have no FLOP estimate and the summary says so."""
    metrics = TENSOR_PIPE_METRICS.get(compute_major) if compute_major is not None else None
    if metrics is None:
        gpu = f"compute capability {compute_major}.x" if compute_major is not None else "this GPU (NVML could not tell its compute capability)"
        print(
            f"scalerepro.launching.nsight: warning: no tensor-pipe metric known for {gpu}: "
            "tensor-core kernels get no FLOP estimate (add one to TENSOR_PIPE_METRICS)",
            file=sys.stderr,
        )
        return ()
    return metrics


def gpu_compute_major() -> int | None:
    """Compute capability major of this node's first GPU (NVML), None where NVML cannot tell.
    A node's GPUs are one model on the clusters this runs on."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver on this node: the warning in tensor_pipe_metrics says what it costs
        return None
    try:
        return int(pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))[0])
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def ncu_kernel_regex(names: list[str] | None = None) -> str:
    """The ncu --kernel-name regex: ``names`` exactly (none: any kernel), never an NCCL kernel."""
    chosen = "(?:" + "|".join(re.escape(name) for name in names) + ")$" if names else ""
    return NOT_NCCL + chosen


def top_kernel_names(nsys_sqlite: str | os.PathLike[str], count: int) -> list[str]:
    """The ``count`` non-NCCL kernels (nsys shortName) with the most total time in an nsys export."""
    with contextlib.closing(sqlite3.connect(f"file:{nsys_sqlite}?mode=ro", uri=True)) as db:
        return [
            row[0]
            for row in db.execute(
                "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s ON s.id = k.shortName "
                "WHERE s.value NOT LIKE 'nccl%' GROUP BY s.value ORDER BY SUM(k.end - k.start) DESC LIMIT ?",
                (count,),
            )
        ]


def rank_from_environment() -> int:
    """This process's global rank as torchrun (RANK) or srun (SLURM_PROCID) sets it; 0 alone."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


def command(
    tool: str, ranks: str, out_dir: str, rank: int, trainer: list[str], ncu_kernel_names: list[str] | None = None, tensor_metrics: tuple[str, ...] = ()
) -> list[str]:
    """The command this rank execs: the trainer, under ``tool`` when ``rank`` is profiled."""
    if ranks != "all" and rank != 0:
        return trainer
    if tool == "nsys":
        # CUDA, NVTX (the trainer's ranges and NCCL's own) and OS-runtime calls, only between the
        # trainer's cudaProfilerStart and cudaProfilerStop (the profiling window).
        return [
            "nsys",
            "profile",
            "--trace=cuda,nvtx,osrt",
            "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop",
            "--force-overwrite=true",
            "--output",
            os.path.join(out_dir, f"rank{rank}"),
            *trainer,
        ]
    if tool == "ncu":
        # One launch of each launch configuration (kernel, grid, block) of the chosen kernels in the
        # profiling window: with a plain --launch-count N the first N matching launches are
        # profiled, and one frequent kernel can take every slot. The clocks are left as the run
        # has them (ncu's default locks them at base clock, and the roofline's peaks are at boost).
        return [
            "ncu",
            "--profile-from-start",
            "off",
            "--clock-control",
            NCU_CLOCK_CONTROL,
            "--filter-mode",
            "per-launch-config",
            "--launch-count",
            "1",
            "--kernel-name-base",
            "function",
            "--kernel-name",
            "regex:" + ncu_kernel_regex(ncu_kernel_names),
            "--metrics",
            ",".join((*NCU_METRICS, *tensor_metrics)),
            "--print-metric-name",
            "name",
            "--print-units",
            "base",
            "--csv",
            "--page",
            "details",
            "--log-file",
            os.path.join(out_dir, "kernels.csv"),
            *trainer,
        ]
    raise ValueError(f"unknown profiling tool {tool!r}")


_PROG = "scalerepro.launching.nsight"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--tool", required=True, choices=["nsys", "ncu"])
    parser.add_argument("--ranks", default="0", choices=["0", "all"])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument(
        "--ncu-kernel-names", nargs="*", default=None, help="profile only these kernels (nsys shortName; default: every non-NCCL kernel of the window)"
    )
    parser.add_argument("trainer", nargs=argparse.REMAINDER, help="-- then the trainer's flags")
    args = parser.parse_args(argv)
    flags = args.trainer[1:] if args.trainer[:1] == ["--"] else args.trainer
    trainer = [sys.executable, "-m", "scalerepro.training.train", *flags]
    rank = rank_from_environment()
    tensor = tensor_pipe_metrics(gpu_compute_major()) if args.tool == "ncu" and (args.ranks == "all" or rank == 0) else ()
    cmd = command(args.tool, args.ranks, args.out_dir, rank, trainer, args.ncu_kernel_names, tensor)
    if shutil.which(cmd[0]) is None:  # else execvp's ENOENT reads as a missing file or a full disk
        suite = "Nsight Systems (nsys)" if args.tool == "nsys" else "Nsight Compute (ncu)"
        raise CommandError(
            f"{cmd[0]} is not installed here (not on PATH): install {suite} or use the container, or set profiling.tool: torch (or profiling.fallback: true)"
        )
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)
    raise AssertionError("execvp returned")


if __name__ == "__main__":
    sys.exit(main())
