"""Run workflow/scripts/run_profile.py (the profile rule's script) without Snakemake, for the GPU
machine, which has none: a `snakemake` object with the params the rule gives it (its `params:`
in workflow/rules/profile.smk; keep the two in step).

    python run_profile_shim.py RUN_DIR TOOL NCU_KERNELS -- TRAINER_FLAGS..."""

from __future__ import annotations

import runpy
import sys
import types

run_dir, tool, ncu_kernels = sys.argv[1:4]
trainer = sys.argv[sys.argv.index("--") + 1 :]
params = types.SimpleNamespace(
    tool=tool, fallback=True, fallback_reason=None, ranks="0", window_start=10, window_steps=2, ncu_kernels=int(ncu_kernels),
    launch=["--nodes=1", "--ranks-per-node=1", "--cpus-per-node=8", "--port=29400", "--name=profile_smoke"], args=trainer,
)  # fmt: skip
snakemake = types.SimpleNamespace(
    params=params, output=types.SimpleNamespace(capture=f"{run_dir}/{tool}/capture.json"), log=[f"{run_dir}/{tool}/profile.log"]
)  # fmt: skip
runpy.run_path("workflow/scripts/run_profile.py", init_globals={"snakemake": snakemake}, run_name="__main__")
