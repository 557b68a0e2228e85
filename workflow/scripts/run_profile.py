"""Run one profiling job (a Snakemake script): the run's training job again, over the profiling
window only, under one tool; then write ``capture.json`` saying what ran.

  torch  the trainer with --profile-mode torch: rank 0 writes trace.json and operators.csv
  nsys   each profiled rank under `nsys profile` (scalerepro.profile_rank), then
         `nsys export --type sqlite` of every rank's report
  ncu    rank 0 under `ncu`, one launch of each launch configuration of the top kernels by time
         (from the nsys export when nsys ran, else of every kernel of the window)

A tool missing at run time (a cluster node without Nsight) falls back to torch.profiler when
profiling.fallback allows it, else the job fails with one line saying so.
"""

import json
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from scalerepro.profile_rank import NCU_CLOCK_CONTROL, top_kernel_names

p = snakemake.params  # noqa: F821 - injected by Snakemake
out_dir = Path(snakemake.output.capture).parent  # noqa: F821
out_dir.mkdir(parents=True, exist_ok=True)
log_path = snakemake.log[0]  # noqa: F821
tool, fallback_reason = p.tool, p.fallback_reason
if tool in ("nsys", "ncu") and shutil.which(tool) is None:
    if not p.fallback:
        sys.exit(f"profiling: {tool} is not on PATH on {shlex.quote(socket.gethostname())} and profiling.fallback is false: install Nsight or set profiling.tool: torch")
    # the rule's output names the tool asked for; the files in it say torch.profiler made them
    fallback_reason, tool = f"{tool} is not on PATH on the node that ran the job", "torch"

window = ["--profile-window-start", str(p.window_start), "--profile-window-steps", str(p.window_steps)]
trainer = [*p.args, *window]


if tool == "torch":
    command = [sys.executable, "-m", "scalerepro.launch", *p.launch, "--", "-m", "scalerepro.train", *trainer, "--profile-mode", "torch", "--profile-dir", str(out_dir)]
else:
    ranks = "0" if tool == "ncu" else str(p.ranks)
    wrapper = ["-m", "scalerepro.profile_rank", "--tool", tool, "--ranks", ranks, "--out-dir", str(out_dir)]
    if tool == "ncu":
        # the top kernels of rank 0's nsys export (NCCL's never: ncu must not replay them); without
        # an export every non-NCCL kernel of the window, one launch of each launch configuration
        exports = sorted((out_dir.parent / "nsys").glob("rank0*.sqlite"))
        names = top_kernel_names(exports[0], p.ncu_kernels) if exports else []
        wrapper += ["--ncu-kernel-names", *names] if names else []
    command = [sys.executable, "-m", "scalerepro.launch", *p.launch, "--", *wrapper, "--", *trainer, "--profile-mode", "cuda_api"]

with open(log_path, "a") as log:
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if code == 0 and tool == "nsys":
        for report in sorted(out_dir.glob("*.nsys-rep")):
            export = ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(report.with_suffix(".sqlite")), str(report)]
            log.write(f"$ {shlex.join(export)}\n")
            log.flush()
            code = code or subprocess.run(export, stdout=log, stderr=subprocess.STDOUT).returncode
if code != 0:
    sys.exit(f"profiling {out_dir.parent.name} with {tool} failed (exit {code}): see {log_path}")
# the tool's own version line ("NVIDIA (R) Nsight Compute Command Line Profiler ... Version 2025.3.1.0"):
# the ncu CSV does not carry it
version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip().splitlines() if tool != "torch" else []
capture = {"tool": tool, "requested": p.tool, "fallback_reason": fallback_reason, "command": command,
           "tool_version": version[-1] if version else None, "clock_control": NCU_CLOCK_CONTROL if tool == "ncu" else None,
           "window_start": p.window_start, "window_steps": p.window_steps}  # fmt: skip
Path(snakemake.output.capture).write_text(json.dumps(capture, indent=2) + "\n")  # noqa: F821
