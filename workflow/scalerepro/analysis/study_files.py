"""Whether a file found beside a study's records is this study's: its system inventory, an
all-reduce benchmark result, a profile.

A study folder (or a folder of records) can hold files that were never made with its runs: an
inventory copied from another machine, an NCCL all-reduce result beside runs that talked over
gloo, the profiling tables another study left in ``tables/``. Each is held against the records
it would be shown with (their hosts, devices, backends and run ids) and, where it does not fit,
left out with one line saying why (``LeftOut``): shown as this study's, it would be a number read
from the wrong file.

On the analysis side: no torch. ``runs`` is the aggregation's runs table (runs.csv).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class LeftOut:
    """A file not shown as this study's, and why (one line)."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def _counted(runs: pd.DataFrame) -> pd.DataFrame:
    """The completed runs (status ok): what the files beside them describe."""
    if runs.empty or "status" not in runs.columns:
        return runs.iloc[0:0]
    return runs[runs["status"].eq("ok")]


def _values(runs: pd.DataFrame, column: str) -> set[str]:
    if column not in runs.columns:
        return set()
    return {str(value) for value in runs[column].dropna() if str(value).strip()}


def _hosts(runs: pd.DataFrame) -> set[str]:
    return {host.strip() for text in _values(runs, "hostname") for host in text.split(",") if host.strip()}


def inventory_problem(inventory: Any, runs: pd.DataFrame) -> str | None:
    """Why a system inventory (``scalerepro.telemetry.inventory``'s system.json) is not of the
    machines the completed runs ran on, or None. It must name the GPU model the runs name (no GPU
    where they ran on the CPU) and, where it was not collected inside a scheduler's job (whose node
    may be another of the same partition), be one of the runs' hosts."""
    if not isinstance(inventory, Mapping):
        return None
    done = _counted(runs)
    if done.empty:
        return None
    gpus = inventory.get("gpus") or []
    inventory_gpus = {str(gpu.get("name")) for gpu in gpus if isinstance(gpu, Mapping) and gpu.get("name")}
    types = _values(done, "device_type")
    run_gpus = _values(done[done["device_type"].eq("cuda")], "device_name") if "device_type" in done.columns else set()
    if types == {"cpu"} and inventory_gpus:
        return f"it lists GPUs ({', '.join(sorted(inventory_gpus))}) where every run ran on the CPU"
    if run_gpus and inventory_gpus and not run_gpus <= inventory_gpus:
        return f"it lists {', '.join(sorted(inventory_gpus))}, where the runs ran on {', '.join(sorted(run_gpus))}"
    if run_gpus and not inventory_gpus:
        return f"it lists no GPU, where the runs ran on {', '.join(sorted(run_gpus))}"
    scheduler = inventory.get("scheduler")
    if not isinstance(scheduler, Mapping):
        scheduler = {}
    in_job = scheduler.get("name") not in (None, "local") or scheduler.get("job_id") not in (None, "")
    host, hosts = inventory.get("hostname"), _hosts(done)
    if not in_job and host and hosts and str(host) not in hosts:
        return f"it was collected on {host}, where the runs ran on {', '.join(sorted(hosts))}"
    return None


def comm_problem(document: Mapping[str, Any], runs: pd.DataFrame) -> str | None:
    """Why an all-reduce benchmark result (``scalerepro.training.commbench``) is not of the
    communication the study's runs used, or None: one rank moves no data (its "bandwidth" is a
    no-op's); the runs' devices and process-group backend must be the result's."""
    world = document.get("world_size")
    if isinstance(world, int) and world <= 1:
        return "an all-reduce at one rank moves no data: its time and bandwidth are a no-op's, not a link's"
    done = _counted(runs)
    types, backends = _values(done, "device_type"), _values(done, "backend")
    device, backend = document.get("device_type"), document.get("backend")
    if device and types and str(device) not in types:
        return f"it ran on {device}, where the runs ran on {', '.join(sorted(types))}"
    if backend and backends and str(backend) not in backends:
        return f"it used {backend}, where the runs' process groups used {', '.join(sorted(backends))}"
    return None


GPU_PROFILERS = ("ncu", "nsys")  # Nsight: they profile CUDA kernels, so only a GPU run has their profiles


def profile_problem(run_id: Any, tools: Any, runs: pd.DataFrame) -> str | None:
    """Why a profile (a row of profiling.csv: its run id and the tools that made it) is not of this
    study's run, or None: the study planned no such run, or an Nsight profile stands beside a run
    that ran on the CPU."""
    run = runs[runs["run_id"].astype(str).eq(str(run_id))] if "run_id" in runs.columns else runs.iloc[0:0]
    if run.empty:
        return f"a profile of run {run_id}, which this study did not plan"
    device = run["device_type"].dropna().iloc[0] if "device_type" in run.columns and run["device_type"].notna().any() else None
    made_by = {tool.strip() for tool in str(tools or "").replace("+", ",").split(",") if tool.strip()}
    if device is not None and device != "cuda" and made_by & set(GPU_PROFILERS):
        return f"an Nsight ({', '.join(sorted(made_by & set(GPU_PROFILERS)))}) profile of run {run_id}, which ran on the {device}"
    return None
