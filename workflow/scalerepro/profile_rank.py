"""Start one rank of a profiling job: under Nsight Systems or Nsight Compute when it is a profiled
rank, else the plain trainer. The launcher (torchrun, srun) runs this once per rank:

    torchrun --nproc-per-node 8 -m scalerepro.profile_rank --tool nsys --ranks 0 --out-dir DIR -- <trainer flags>

It replaces itself (exec) with the tool or the trainer, so the launcher's signals and exit codes
reach the trainer unchanged. Needs no torch: it only builds a command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Nsight Compute: Speed-of-Light, memory workload and occupancy sections, plus the counters the
# roofline needs (FP add/mul/fma per precision, tensor-pipe activity, DRAM bytes).
NCU_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy")
NCU_METRICS = (
    *(f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in ("f", "h", "d") for op in ("add", "mul", "fma")),
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum",
    "dram__bytes.sum.per_second",
)


def rank_from_environment() -> int:
    """This process's global rank as torchrun (RANK) or srun (SLURM_PROCID) sets it; 0 alone."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


def command(tool: str, ranks: str, out_dir: str, rank: int, trainer: list[str], ncu_kernels: int, ncu_kernel_regex: str | None) -> list[str]:
    """The command this rank execs: the trainer, under ``tool`` when ``rank`` is profiled."""
    if ranks != "all" and rank != 0:
        return trainer
    if tool == "nsys":
        # CUDA, NVTX (the trainer's ranges and NCCL's own) and OS-runtime calls, only between the
        # trainer's cudaProfilerStart and cudaProfilerStop (the profiling window).
        return ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                "--force-overwrite=true", "--output", os.path.join(out_dir, f"rank{rank}"), *trainer]  # fmt: skip
    if tool == "ncu":
        select = ["--kernel-name", f"regex:{ncu_kernel_regex}"] if ncu_kernel_regex else []
        sections = [flag for section in NCU_SECTIONS for flag in ("--section", section)]
        return ["ncu", "--profile-from-start", "off", "--launch-count", str(ncu_kernels), *select, *sections,
                "--metrics", ",".join(NCU_METRICS), "--csv", "--page", "details", "--log-file",
                os.path.join(out_dir, "kernels.csv"), *trainer]  # fmt: skip
    raise ValueError(f"unknown profiling tool {tool!r}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scalerepro.profile_rank", description=__doc__.split("\n")[0])
    parser.add_argument("--tool", required=True, choices=["nsys", "ncu"])
    parser.add_argument("--ranks", default="0", choices=["0", "all"])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--ncu-kernels", type=int, default=8)
    parser.add_argument("--ncu-kernel-regex", default=None)
    parser.add_argument("trainer", nargs=argparse.REMAINDER, help="-- then the trainer's flags")
    args = parser.parse_args(argv)
    flags = args.trainer[1:] if args.trainer[:1] == ["--"] else args.trainer
    trainer = [sys.executable, "-m", "scalerepro.train", *flags]
    cmd = command(args.tool, args.ranks, args.out_dir, rank_from_environment(), trainer, args.ncu_kernels, args.ncu_kernel_regex)
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
