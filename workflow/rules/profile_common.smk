# Helpers of the profiling rules (workflow/rules/profile.smk): the profiling config with its
# schema defaults, which runs are profiled, which tools profile them, each job's trainer flags.

import json

# Every key has its schema default (snakemake.utils.validate with set_default, common.smk).
PROFILING = CONFIG["profiling"]


def _profiled_runs():
    """Run ids to profile: the config's list, or (auto) strong scaling, repeat 1, each model at
    1 GPU and at the largest GPU count (weak scaling when strong is disabled)."""
    if PROFILING["runs"] != "auto":
        unknown = [run for run in PROFILING["runs"] if run not in RUNS]
        if unknown:
            raise config_error(
                "profiling.runs",
                f"{unknown[0]} is not a run of this study: see results/tables/matrix.csv",
            )
        return list(PROFILING["runs"])
    study = "strong" if CONFIG["scaling"]["strong"]["enabled"] else "weak"
    ends = {GPU_COUNTS[0], GPU_COUNTS[-1]}
    return [
        run.run_id
        for run in RUNS.values()
        if run.study == study and run.repeat == 1 and run.gpus in ends
    ]


def _profiling_tools():
    """(tools, why the torch fallback replaced what was asked, or None). A Nsight tool needs
    CUDA and its binary; where either is missing the fallback applies if allowed, else an error.
    """
    wanted = PROFILING["tool"]
    if wanted == "torch":
        return ["torch"], None
    asked = ["nsys", "ncu"] if wanted == "auto" else [wanted]
    # On a cluster the tools are looked for on the node that runs the job (run_profile.py).
    found = [t for t in asked if shutil.which(t) or not workflow.local_exec]
    if not found:
        reason = (
            f"{' and '.join(asked)} {'is' if len(asked) == 1 else 'are'} not on PATH"
        )
    elif DEVICE != "cuda":
        reason = f"Nsight tools profile CUDA runs and this study runs on the {DEVICE}"
    else:
        return found, None
    if PROFILING["fallback"]:
        return ["torch"], reason
    raise config_error(
        "profiling.tool",
        f"{wanted} was asked for but {reason}, and profiling.fallback is false: "
        "install Nsight, set profiling.tool: torch, or set profiling.fallback: true",
    )


PROFILED_RUNS = _profiled_runs() if PROFILING["enabled"] else []
PROFILING_TOOLS, PROFILING_FALLBACK_REASON = (
    _profiling_tools() if PROFILING["enabled"] else ([], None)
)
PROFILING_TABLES = [
    f"results/tables/{name}.csv"
    for name in (
        "profiling",
        "profiling_kernels",
        "profiling_roofline",
        "profiling_files",
    )
]


def profiling_tables():
    """The profiling tables as inputs of the plots and the report (none when disabled)."""
    return PROFILING_TABLES if PROFILING["enabled"] else []


def profile_trainer_args(wildcards):
    """The run's own flags, then: stop right after the window, warm up until it, no evaluation,
    no probe, no checkpoints (a profiling job always starts afresh)."""
    window_end = PROFILING["window_start"] + PROFILING["window_steps"]
    record = f"results/profiles/{wildcards.run}/{wildcards.tool}/record.json"
    return [
        *trainer_args(RUNS[wildcards.run], record, ""),
        "--steps", str(window_end), "--warmup-steps", str(PROFILING["window_start"]),
        "--no-eval", "--comm-probe-steps", "0", "--no-resume",
    ]  # fmt: skip


def profile_inputs(wildcards):
    """ncu after nsys (when both run): it profiles the kernels nsys found on top."""
    inputs = data_input(wildcards)
    if wildcards.tool == "ncu" and "nsys" in PROFILING_TOOLS:
        inputs.append(f"results/profiles/{wildcards.run}/nsys/capture.json")
    return inputs


def device_name_flags():
    """--device-name of the GPUs the profiled runs use, where known before they run: this
    machine's (local runs) or reproduce.gpu (a cluster); else the capture names it."""
    name = (
        (LOCAL_GPU_NAMES[0] if LOCAL_GPU_NAMES else None)
        if LOCAL_RUNS
        else CONFIG["reproduce"].get("gpu")
    )
    return ["--device-name", name] if name and DEVICE == "cuda" else []
