"""What the report's system section shows of the inventory: its entries laid out generically, in its own order, as lists, tables and text.

The inventory is ``scalerepro.telemetry.inventory``'s JSON as written (``inputs.readable_inventory``
strips its terminal escapes first); this module only lays it out and gives its keys headings, so
a key the inventory gains shows without a change here.

On the analysis side: no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    """Every host and card the completed runs ran on, as their records say (one row each: its
    runs and the span of their start times); a record that does not name its card (before schema
    4) says so. The inventory describes one machine; this is every one the figures came from."""
    if runs.empty or "status" not in runs.columns:
        return []
    done = runs[runs["status"].eq("ok")].copy()
    if done.empty:
        return []
    gpu = done["device_type"].eq("cuda") if "device_type" in done.columns else pd.Series(False, index=done.index)
    for column in HOST_COLUMNS:
        done[column] = done[column].astype(object) if column in done.columns else None
    done.loc[~gpu, ["device_name", "gpu_uuid", "gpu_driver"]] = "no GPU"
    done.loc[gpu & done["gpu_uuid"].isna(), "gpu_uuid"] = "not recorded (before schema 4)"
    if "cpu_model" in done.columns and "device_name" in done.columns:  # a CPU run's device_name is its CPU
        done.loc[~gpu & done["cpu_model"].isna(), "cpu_model"] = runs.loc[done.index[~gpu & done["cpu_model"].isna()], "device_name"]
    found = []
    for key, group in done.groupby(list(HOST_COLUMNS), dropna=False, sort=True):
        stamps = pd.to_datetime(group.get("started_at"), utc=True, errors="coerce", format="ISO8601").dropna()
        found.append(
            {
                **{column: fmt_text(value) for column, value in zip(HOST_COLUMNS, key)},
                "runs": len(group),
                "started": f"{stamps.min():%Y-%m-%d %H:%M} – {stamps.max():%Y-%m-%d %H:%M} UTC" if len(stamps) else MISSING,
            }
        )
    return found
