"""Run one profiling job (a Snakemake script): the run's training job again, over the profiling
window only, under one tool; then write ``capture.json`` saying what ran.

  torch  the trainer with --profile-mode torch: rank 0 writes trace.json and operators.csv
  nsys   each profiled rank under `nsys profile` (scalerepro.profile_rank), then
         `nsys export --type sqlite` of every rank's report
  ncu    rank 0 under `ncu` for the top kernels by time (from the nsys export when nsys ran,
         else the first kernels of the window)

A tool missing at run time (a cluster node without Nsight) falls back to torch.profiler when
profiling.fallback allows it, else the job fails with one line saying so.
"""

import json
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

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


def top_kernel_regex(nsys_dir: Path, count: int):
    """The ``count`` kernels with the most time in the nsys export of rank 0, as an ncu regex."""
    exports = sorted(nsys_dir.glob("rank0*.sqlite"))
    if not exports:
        return None
    with sqlite3.connect(exports[0]) as db:
        names = [row[0] for row in db.execute(
            "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s ON s.id = k.shortName "
            "GROUP BY s.value ORDER BY SUM(k.end - k.start) DESC LIMIT ?", (count,))]  # fmt: skip
    return "^(" + "|".join(re.escape(name) for name in names) + ")$" if names else None


if tool == "torch":
    command = [sys.executable, "-m", "scalerepro.launch", *p.launch, "--", "-m", "scalerepro.train", *trainer, "--profile-mode", "torch", "--profile-dir", str(out_dir)]
else:
    ranks = "0" if tool == "ncu" else str(p.ranks)
    wrapper = ["-m", "scalerepro.profile_rank", "--tool", tool, "--ranks", ranks, "--out-dir", str(out_dir)]
    if tool == "ncu":
        wrapper += ["--ncu-kernels", str(p.ncu_kernels)]
        regex = top_kernel_regex(out_dir.parent / "nsys", p.ncu_kernels)
        wrapper += ["--ncu-kernel-regex", regex] if regex else []
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
capture = {"tool": tool, "requested": p.tool, "fallback_reason": fallback_reason, "command": command,
           "window_start": p.window_start, "window_steps": p.window_steps}  # fmt: skip
Path(snakemake.output.capture).write_text(json.dumps(capture, indent=2) + "\n")  # noqa: F821
