"""System inventory: what the study ran on, collected where the training runs.

    python -m scalerepro.telemetry.inventory --out results/inventory/system.json

GPUs from NVML (name, memory, driver, max clocks, power limit, PCI bus, UUID), the GPU/NIC
topology matrix from ``nvidia-smi topo -m`` when present, CPU and memory, InfiniBand ports from
sysfs, software versions and the Slurm job. Whatever cannot be read is null with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from scalerepro import schedulers
from scalerepro.common.cli import OneLineErrorParser, error_boundary, output_path
from scalerepro.common.files import utc_now, write_json_atomically
from scalerepro.common.terminal import strip_terminal_escapes
from scalerepro.telemetry import hardware

_SYSFS_INFINIBAND = Path("/sys/class/infiniband")


def nvml_gpus() -> tuple[list[dict[str, Any]], str | None]:
    """Every GPU NVML sees (physical indices, not CUDA_VISIBLE_DEVICES'), or ([], why not)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return [], f"NVML could not be initialised: {error}"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()

        def read(function: Any, *args: Any) -> Any:
            try:
                return function(*args)
            except pynvml.NVMLError:
                return None  # not supported on this GPU

        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = read(pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_limit_mw = read(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            pci = read(pynvml.nvmlDeviceGetPciInfo, handle)
            gpus.append(
                {
                    "index": index,
                    "name": read(pynvml.nvmlDeviceGetName, handle),
                    "uuid": read(pynvml.nvmlDeviceGetUUID, handle),
                    "pci_bus_id": pci.busId if pci is not None else None,
                    "memory_bytes": memory.total if memory is not None else None,
                    "driver": driver,
                    "max_sm_clock_mhz": read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
                    "max_memory_clock_mhz": read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
                    "power_limit_w": power_limit_mw / 1000 if power_limit_mw is not None else None,
                }
            )
        return gpus, None if gpus else "NVML reports no GPU"
    finally:
        pynvml.nvmlShutdown()


def nvidia_smi_topology() -> tuple[str | None, str | None]:
    """``nvidia-smi topo -m``: which GPUs and NICs share NVLink, a PCIe switch, a CPU socket."""
    if shutil.which("nvidia-smi") is None:
        return None, "nvidia-smi is not on the PATH"
    result = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return None, f"nvidia-smi topo -m failed: {(result.stderr or result.stdout).strip()[:200]}"
    # it underlines its header row with ANSI escapes even into a pipe: the record keeps the text
    return strip_terminal_escapes(result.stdout), None


def infiniband_ports(root: Path = _SYSFS_INFINIBAND) -> list[dict[str, Any]]:
    """InfiniBand/RoCE ports from sysfs: device, port, state, rate (e.g. '400 Gb/sec (4X NDR)')."""
    ports = []
    for port in sorted(root.glob("*/ports/*")):

        def text(name: str) -> str | None:
            try:
                return (port / name).read_text().strip()
            except OSError:
                return None

        ports.append(
            {
                "device": port.parent.parent.name,
                "port": int(port.name),
                "state": text("state"),
                "rate": text("rate"),
                "link_layer": text("link_layer"),
            }
        )
    return ports


def collect() -> dict[str, Any]:
    host = hardware.host_facts()
    gpus, gpu_reason = nvml_gpus()
    topology, topology_reason = nvidia_smi_topology()
    return {
        "hostname": host["hostname"],
        "collected_at": utc_now(),
        "cpu": {"model": host["cpu_model"], "logical_cpus": host["logical_cpus"], "usable_cpus": host["usable_cpus"]},
        "memory_total_bytes": host["memory_total_bytes"],
        "gpus": gpus,
        "gpu_reason": gpu_reason,
        "cuda_visible": host["gpu"],
        "nvidia_smi_topo": topology,
        "nvidia_smi_topo_reason": topology_reason,
        "infiniband": infiniband_ports(),
        "software": hardware.software_versions(),
        "scheduler": schedulers.current().job_facts(os.environ),
    }


_PROG = "scalerepro.telemetry.inventory"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_path, help="JSON file to write")
    args = parser.parse_args(argv)
    inventory = collect()
    write_json_atomically(args.out, inventory)
    gpus = ", ".join(sorted({g["name"] for g in inventory["gpus"] if g["name"]})) or f"no GPU ({inventory['gpu_reason']})"
    print(f"{inventory['hostname']}: {inventory['cpu']['model']}, {inventory['cpu']['usable_cpus']} usable CPUs, GPUs: {gpus}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
