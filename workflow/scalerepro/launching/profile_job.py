"""One profiling job: the run's training job again, over the profiling window only, under one
tool; then ``capture.json`` saying what ran.

    python -m scalerepro.launching.profile_job --tool TOOL --capture DIR/capture.json --log LOG
        [--no-fallback] [--fallback-reason WHY] [--ranks 0] [--window-start N] [--window-steps N]
        [--ncu-kernels N] --launch LAUNCH_FLAGS... -- TRAINER_FLAGS...

  torch  the trainer with --profile-mode torch: rank 0 writes trace.json and operators.csv
  nsys   each profiled rank under `nsys profile` (scalerepro.launching.nsight), then
         `nsys export --type sqlite` of every rank's report
  ncu    rank 0 under `ncu`, one launch of each launch configuration of the top kernels by time
         (from the nsys export when nsys ran, else of every kernel of the window)

A tool missing at run time (a cluster node without Nsight) falls back to torch.profiler unless
``--no-fallback``; then the job fails with one line saying so. A capture that fails (the tool or
the trainer exits non-zero: an unknown metric, no access to the counters) still writes
capture.json, with ``"status": "failed"`` and the exit code, and the job exits 0: the report shows
the failure with its error (as a failed training run's record does). This module imports no torch.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from scalerepro.common.cli import CommandError, OneLineErrorParser, error_boundary
from scalerepro.common.files import write_json_atomically
from scalerepro.launching.nsight import NCU_CLOCK_CONTROL, top_kernel_names

_PROG = "scalerepro.launching.profile_job"
TOOLS = ("torch", "nsys", "ncu")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """(options, the launcher's flags, the trainer's flags)."""
    argv = list(argv)
    usage = "python -m scalerepro.launching.profile_job OPTIONS --launch LAUNCH_FLAGS... -- TRAINER_FLAGS..."
    parser = OneLineErrorParser(prog=_PROG, usage=usage)
    if "--" not in argv or "--launch" not in argv[: argv.index("--")]:
        parser.error("expected OPTIONS --launch LAUNCH_FLAGS... -- TRAINER_FLAGS...")
    head, trainer = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    options, launch = head[: head.index("--launch")], head[head.index("--launch") + 1 :]
    parser.add_argument("--tool", choices=TOOLS, required=True)
    parser.add_argument("--capture", type=Path, required=True, help="the capture.json to write; the tool's files go beside it")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--no-fallback", dest="fallback", action="store_false", help="fail when nsys/ncu is missing (default: torch.profiler)")
    parser.add_argument("--fallback-reason", default=None, help="why the plan already fell back to torch (recorded)")
    parser.add_argument("--ranks", default="0", help="the ranks nsys profiles (nsight's --ranks)")
    parser.add_argument("--window-start", type=int, default=10)
    parser.add_argument("--window-steps", type=int, default=2)
    parser.add_argument("--ncu-kernels", type=int, default=10, help="ncu: how many of the top kernels by time")
    return parser.parse_args(options), launch, trainer


def command(tool: str, out_dir: Path, launch: Sequence[str], trainer: Sequence[str], ranks: str, ncu_kernels: int) -> list[str]:
    """The launcher command that runs the trainer under ``tool``."""
    launcher = [sys.executable, "-m", "scalerepro.launching.launch", *launch, "--"]
    if tool == "torch":
        return [*launcher, "-m", "scalerepro.training.train", *trainer, "--profile-mode", "torch", "--profile-dir", str(out_dir)]
    wrapper = ["-m", "scalerepro.launching.nsight", "--tool", tool, "--ranks", "0" if tool == "ncu" else ranks, "--out-dir", str(out_dir)]
    if tool == "ncu":
        # the top kernels of rank 0's nsys export (NCCL's never: ncu must not replay them); without
        # an export every non-NCCL kernel of the window, one launch of each launch configuration
        exports = sorted((out_dir.parent / "nsys").glob("rank0*.sqlite"))
        names = top_kernel_names(exports[0], ncu_kernels) if exports else []
        wrapper += ["--ncu-kernel-names", *names] if names else []
    return [*launcher, *wrapper, "--", *trainer, "--profile-mode", "cuda_api"]


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    args, launch, trainer = parse_args(argv)
    out_dir = args.capture.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    tool, fallback_reason = args.tool, args.fallback_reason or None
    if tool in ("nsys", "ncu") and shutil.which(tool) is None:
        if not args.fallback:
            raise CommandError(
                f"{tool} is not on PATH on {shlex.quote(socket.gethostname())} and profiling.fallback is false: install Nsight or set profiling.tool: torch"
            )
        # the rule's output names the tool asked for; the files in it say torch.profiler made them
        fallback_reason, tool = f"{tool} is not on PATH on the node that ran the job", "torch"
    window = ["--profile-window-start", str(args.window_start), "--profile-window-steps", str(args.window_steps)]
    run = command(tool, out_dir, launch, [*trainer, *window], args.ranks, args.ncu_kernels)
    with open(args.log, "a") as log:
        log.write(f"$ {shlex.join(run)}\n")
        log.flush()
        code = subprocess.run(run, stdout=log, stderr=subprocess.STDOUT).returncode
        if code == 0 and tool == "nsys":
            for report in sorted(out_dir.glob("*.nsys-rep")):
                export = ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(report.with_suffix(".sqlite")), str(report)]
                log.write(f"$ {shlex.join(export)}\n")
                log.flush()
                code = code or subprocess.run(export, stdout=log, stderr=subprocess.STDOUT).returncode
    # the tool's own version line ("NVIDIA (R) Nsight Compute Command Line Profiler ... Version 2025.3.1.0"):
    # the ncu CSV does not carry it
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines() if tool != "torch" else []
    capture = {
        "tool": tool,
        "requested": args.tool,
        "fallback_reason": fallback_reason,
        "command": run,
        "tool_version": version[-1] if version else None,
        "clock_control": NCU_CLOCK_CONTROL if tool == "ncu" else None,
        "window_start": args.window_start,
        "window_steps": args.window_steps,
        "status": "ok" if code == 0 else "failed",
        "exit_code": code,
    }
    write_json_atomically(args.capture, capture)
    if code != 0:
        # as a failed training run: the workflow goes on, and the report shows this capture as
        # failed with the error its files hold (scalerepro.analysis.profiles.failures)
        print(f"profiling {out_dir.parent.name} with {tool} failed (exit {code}): capture.json says so; see {args.log}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
