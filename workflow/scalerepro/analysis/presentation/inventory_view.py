"""What the report's system section shows of the inventory: its entries laid out generically, in its own order, as lists, tables and text.

The inventory is ``scalerepro.telemetry.inventory``'s JSON as written (``inputs.readable_inventory``
strips its terminal escapes first); this module only lays it out and gives its keys headings, so
a key the inventory gains shows without a change here.

On the analysis side: no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.presentation.formatting import MISSING, fmt_bytes, fmt_int, fmt_text, label
from scalerepro.analysis.values import finite_number

# Headings for the inventory keys scalerepro.telemetry.inventory writes; any other key gets label(key).
INVENTORY_TITLES = {
    "hostname": "Host name",
    "collected_at": "Collected at",
    "memory_total_bytes": "Memory",
    "gpu_reason": "Why no GPU was read",
    "nvidia_smi_topo_reason": "Why no GPU topology was read",
    "cpu": "CPU",
    "gpus": "GPUs (NVML)",
    "cuda_visible": "CUDA devices visible to torch",
    "nvidia_smi_topo": "GPU and NIC topology (nvidia-smi topo -m)",
    "infiniband": "InfiniBand ports",
    "software": "Software",
    "scheduler": "Scheduler job",
}


def describe_inventory(inventory: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Lay the inventory out generically, in its own order: top-level scalars as one list
    ("host"), then each mapping as a list, each list of mappings as a table (columns = union of
    keys), each multi-line text as preformatted text. Keys ending in ``_bytes`` get IEC units."""
    if inventory is None:
        return None
    if not isinstance(inventory, Mapping):
        return {"host": [("inventory", json.dumps(inventory))], "blocks": []}

    def value(key: str, item: Any, exact: bool = True) -> str:
        if isinstance(item, (dict, list)):
            return json.dumps(item, sort_keys=True)
        if str(key).endswith("_bytes") and finite_number(item) is not None:
            return f"{fmt_bytes(item)} ({fmt_int(item)} B)" if exact else fmt_bytes(item)
        return fmt_text(item)

    def numeric(item: Any) -> bool:
        return isinstance(item, (int, float)) and not isinstance(item, bool)

    host: list[tuple[str, str]] = []
    blocks: list[dict[str, Any]] = []
    for key, item in inventory.items():
        title = INVENTORY_TITLES.get(key, label(key))
        if isinstance(item, str) and "\n" in item:
            blocks.append({"kind": "text", "key": key, "title": title, "text": item})
        elif isinstance(item, Mapping):
            blocks.append(
                {
                    "kind": "pairs",
                    "key": key,
                    "title": title,
                    "items": [(label(k), value(k, v)) for k, v in item.items()],
                }
            )
        elif isinstance(item, list) and item and all(isinstance(entry, Mapping) for entry in item):
            columns = list(dict.fromkeys(k for entry in item for k in entry))
            blocks.append(
                {
                    "kind": "table",
                    "key": key,
                    "title": title,
                    "columns": [(label(column), all(numeric(e.get(column)) for e in item if e.get(column) is not None)) for column in columns],
                    "rows": [[value(column, entry.get(column), exact=False) for column in columns] for entry in item],
                }
            )
        elif isinstance(item, list):
            host.append((title, ", ".join(value(key, entry) for entry in item) if item else "none"))
        elif item is None and str(key).endswith("_reason"):
            continue  # a reason is shown where there is one: a field that was read has none
        else:
            host.append((title, value(key, item)))
    return {"host": host, "blocks": blocks}


# runs.csv columns -> the heading of the hosts-and-cards table's column
HOST_COLUMNS = {
    "hostname": "Host",
    "cpu_model": "CPU",
    "usable_cpus": "Usable CPUs",
    "device_name": "GPU",
    "gpu_uuid": "Card (UUID)",
    "gpu_driver": "Driver",
}


def hosts_of_runs(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """Every host and card the completed runs ran on, one row per card and day (its runs and the
    span of their start times): runs of two days on one host may be on two cards of it. Each card
    as the record names it, else as the inventory beside the record does (``cards_beside``, which
    says so); a card neither names reads "not recorded". The study's inventory describes one
    machine; this is every one the figures came from."""
    if runs.empty or "status" not in runs.columns:
        return []
    done = runs[runs["status"].eq("ok")].copy()
    if done.empty:
        return []
    gpu = done["device_type"].eq("cuda") if "device_type" in done.columns else pd.Series(False, index=done.index)
    for column in HOST_COLUMNS:
        done[column] = done[column].astype(object) if column in done.columns else None
    basis = done["card_basis"] if "card_basis" in done.columns else pd.Series(None, index=done.index, dtype=object)
    named = gpu & done["gpu_uuid"].notna() & basis.notna()
    done.loc[named, "gpu_uuid"] = done.loc[named, "gpu_uuid"].astype(str) + " (" + basis[named].astype(str) + ")"
    done.loc[~gpu, ["device_name", "gpu_uuid", "gpu_driver"]] = "no GPU"
    done.loc[gpu & done["gpu_uuid"].isna(), "gpu_uuid"] = "not recorded: the record (before schema 4) and any inventory beside it name none"
    if "cpu_model" in done.columns and "device_name" in done.columns:  # a CPU run's device_name is its CPU
        done.loc[~gpu & done["cpu_model"].isna(), "cpu_model"] = runs.loc[done.index[~gpu & done["cpu_model"].isna()], "device_name"]
    stamps = pd.to_datetime(done.get("started_at", pd.Series(None, index=done.index)), utc=True, errors="coerce", format="ISO8601")
    done["day"] = stamps.dt.strftime("%Y-%m-%d").astype(object)
    found = []
    for key, group in done.groupby([*HOST_COLUMNS, "day"], dropna=False, sort=True):
        started = stamps[group.index].dropna()
        found.append(
            {
                **{column: fmt_text(value) for column, value in zip(HOST_COLUMNS, key)},
                "runs": len(group),
                "started": f"{started.min():%Y-%m-%d %H:%M} – {started.max():%Y-%m-%d %H:%M} UTC" if len(started) else MISSING,
            }
        )
    return found


# --- what a record lacks of its card, from the inventory kept beside it ---------------------------

# runs.csv column -> the key of an inventory's GPU entry (scalerepro.telemetry.inventory) that gives it
CARD_FACTS = {"gpu_uuid": "uuid", "power_limit_w": "power_limit_w", "sm_clock_max_supported_mhz": "max_sm_clock_mhz"}
# A run's own inventory: rebuild --records copies the inventories kept in a record's folder here
# (runs/<run>/inventory/), the system inventory and nvidia-smi's query of the session's card.
RUN_INVENTORY = "inventory"
SYSTEM_JSON, NVIDIA_SMI = "system.json", "nvidia-smi.txt"
# nvidia-smi --query-gpu=... --format=csv column -> the inventory key (benchmarks/gpu/smoke.sh's query)
_SMI_KEYS = {"name": "name", "uuid": "uuid", "power.limit [W]": "power_limit_w", "clocks.max.sm [MHz]": "max_sm_clock_mhz"}
_SMI_NUMBER = re.compile(r"^\s*([0-9.]+)\s*(W|MHz)\s*$")


def smi_gpus(text: str) -> list[dict[str, Any]]:
    """The GPUs of an ``nvidia-smi --query-gpu=... --format=csv`` capture, as inventory entries
    (CARD_FACTS' keys, where its query asked for them): the header line names the columns, each
    following line of as many fields is a GPU; any other line (a kernel version after it) is not."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if line.split(",")[0].strip() == "name"), None)
    if header is None:
        return []
    columns = [column.strip() for column in lines[header].split(",")]
    gpus = []
    for line in lines[header + 1 :]:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(columns):
            continue
        entry: dict[str, Any] = {}
        for column, field in zip(columns, fields):
            if column in _SMI_KEYS:
                number = _SMI_NUMBER.match(field)
                entry[_SMI_KEYS[column]] = float(number.group(1)) if number else field
        gpus.append(entry)
    return gpus


def _own_inventory(run_folder: Path) -> tuple[list[Mapping[str, Any]], str | None, str] | None:
    """The GPUs the inventory kept in a run's own folder lists, the host it names (None:
    nvidia-smi's capture names none) and its file; None where the run's folder keeps none."""
    folder = run_folder / RUN_INVENTORY
    system = folder / SYSTEM_JSON
    if system.is_file():
        try:
            document = json.loads(system.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            document = None
        if isinstance(document, Mapping):
            return [gpu for gpu in document.get("gpus") or () if isinstance(gpu, Mapping)], str(document.get("hostname") or ""), SYSTEM_JSON
    smi = folder / NVIDIA_SMI
    if smi.is_file():
        gpus: list[Mapping[str, Any]] = list(smi_gpus(smi.read_text(encoding="utf-8", errors="replace")))
        return gpus, None, NVIDIA_SMI
    return None


def study_inventory(study: Path, system: Any) -> Mapping[str, Any] | None:
    """The study's own inventory, for what its records lack of their card: its system inventory
    (``system``, inventory/system.json, read already), else the nvidia-smi capture kept in its
    inventory folder (rebuild --inventory puts one there), which names no host."""
    if isinstance(system, Mapping):
        return system
    smi = study / RUN_INVENTORY / NVIDIA_SMI  # not its system.json: the caller refused that one or found none
    if not smi.is_file():
        return None
    return {"hostname": None, "gpus": smi_gpus(smi.read_text(encoding="utf-8", errors="replace")), "source": f"{RUN_INVENTORY}/{NVIDIA_SMI}"}


def cards_beside(runs: pd.DataFrame, study: Path, inventory: Any) -> pd.DataFrame:
    """``runs`` with what each GPU record lacks of its card (CARD_FACTS: its UUID, power limit and
    top SM clock) taken from the inventory kept beside it, and ``card_basis`` naming that file
    (None: the record's own). Beside a record is its own folder's inventory (``RUN_INVENTORY``),
    else the study's (``inventory``, already one of the runs' machines); never another folder's.
    An inventory counts only where it names the run's host (nvidia-smi's capture in the run's
    own folder names none) and lists its GPU model; a card's UUID only where it lists one GPU
    of that model and the run used one: of several cards, which ran it cannot be told."""
    if runs.empty or "device_type" not in runs.columns:
        return runs
    runs = runs.copy()
    for column in (*CARD_FACTS, "card_basis"):
        runs[column] = runs[column].astype(object) if column in runs.columns else None
    study_gpus = [gpu for gpu in (inventory.get("gpus") or ()) if isinstance(gpu, Mapping)] if isinstance(inventory, Mapping) else []
    # an nvidia-smi capture names no host (study_inventory): None
    study_host = (str(inventory["hostname"]) if inventory.get("hostname") is not None else None) if isinstance(inventory, Mapping) else ""
    study_source = str(inventory.get("source") or f"{RUN_INVENTORY}/{SYSTEM_JSON}") if isinstance(inventory, Mapping) else ""
    for index, run in runs[runs["device_type"].eq("cuda")].iterrows():
        own = _own_inventory(study / "runs" / str(run.get("run_id")))
        gpus, host, source = own if own is not None else (study_gpus, study_host, study_source)
        if host is not None and host != str(run.get("hostname") or ""):
            continue  # another machine's
        same = [gpu for gpu in gpus if gpu.get("name") == run.get("device_name")]
        count = finite_number(run.get("gpus")) or 1
        taken = []
        for column, key in CARD_FACTS.items():
            values = {gpu.get(key) if column == "gpu_uuid" else finite_number(gpu.get(key)) for gpu in same}
            recorded = run.get(column) is not None and not pd.isna(run.get(column))
            one_card = len(same) == 1 and count == 1
            if recorded or len(values) != 1 or None in values or (column == "gpu_uuid" and not one_card):
                continue
            (value,) = values
            # the record's power limit is the sum over its GPUs (scalerepro.record.measured.Nvml)
            runs.at[index, column] = value * count if column == "power_limit_w" and isinstance(value, float) else value
            taken.append(column)
        if taken:
            runs.at[index, "card_basis"] = f"from the inventory beside the record: {source}" if own is not None else f"from the study's {source}"
    return runs
