"""Print a run record's key figures; exit 1 if a figure the run must fill is missing.

    python check_record.py RECORD [--cpu]

On a GPU run every figure issue 11 asks of a 1-GPU record must be there: NVML energy from the
total-energy counter, power, utilisation, SM clock, MFU against the peak the table gives the
record's own GPU (H100 SXM5 on the H100 kind, H200 SXM on its fallback), step times (CUDA events
on a GPU) and peak CUDA memory; and what reads power capping, from the real NVML calls that the
tests only replay (tests/fixtures/nvml): the lowest SM clock, the enforced power limit and the
clock-event reasons (``{}`` where none was active, so only null fails), and the card's UUID, power
limit and maximum SM clock in ``hardware.gpu``. ``--cpu`` (the CPU
rehearsal) checks only what a CPU run can fill."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scalerepro.analysis.tables.readers import cuda_graph_replays
from scalerepro.common import gpu_peaks

path, on_cpu = sys.argv[1], "--cpu" in sys.argv[2:]
record = json.loads(Path(path).read_text())
m = record.get("measurements") or {}
parallel, nvml, steps = record.get("parallel") or {}, m.get("nvml") or {}, m.get("step_time_s") or {}
memory, comm, buckets = m.get("memory") or {}, m.get("exposed_communication") or {}, m.get("backward_buckets") or {}
versions = record.get("versions") or {}
print(
    f"{path}: status={record['status']} launcher={parallel.get('launcher')} backend={parallel.get('backend')} "
    f"device={parallel.get('device_type')} world={parallel.get('world_size')} gpu={record['hardware']['gpu']['name']} "
    f"torch={versions.get('torch')} cuda={versions.get('cuda')} nccl={versions.get('nccl')}"
)
print(
    f"  samples/s={m.get('samples_per_s')} tokens/s={m.get('tokens_per_s')} step median s={steps.get('median')} "
    f"p10={steps.get('p10')} p90={steps.get('p90')} window_s={m.get('window_s')} measured steps={m.get('measured_steps')} "
    f"data_stall={m.get('data_stall_fraction')}"
)
print(f"  mfu={m.get('mfu')} peak/device={m.get('peak_flops_per_device')} source={(m.get('peak_flops_source') or '')[:50]!r}")
print(
    f"  nvml available={nvml.get('available')} reason={nvml.get('reason')} energy_j={nvml.get('energy_j')} "
    f"method={nvml.get('energy_method')} power_mean_w={nvml.get('power_mean_w')} util_mean={nvml.get('gpu_util_mean_pct')} "
    f"sm_clock_mean={nvml.get('sm_clock_mean_mhz')} samples={nvml.get('samples')} window_s={nvml.get('window_s')}"
)
gpu_facts = record["hardware"]["gpu"]
print(
    f"  purpose={record.get('purpose')} sm_clock min/max/card max={nvml.get('sm_clock_min_mhz')}/{nvml.get('sm_clock_max_mhz')}/"
    f"{nvml.get('sm_clock_max_supported_mhz')} power limit W={nvml.get('power_limit_w')} temperature mean/max={nvml.get('temperature_mean_c')}/"
    f"{nvml.get('temperature_max_c')} clock event reasons={nvml.get('clock_event_reasons')}"
)
print(f"  card uuid={gpu_facts.get('uuid')} power_limit_w={gpu_facts.get('power_limit_w')} sm_clock_max_mhz={gpu_facts.get('sm_clock_max_mhz')}")
print(
    f"  energy/sample J={m.get('energy_per_sample_j')} allocated max bytes={memory.get('allocated_bytes_max')} "
    f"exposed_comm={comm.get('fraction')} ({comm.get('reason')}) buckets={len(buckets.get('buckets') or [])} "
    f"({buckets.get('layout_source')}) fwd/bwd/opt s={buckets.get('forward_s')}/{buckets.get('backward_s')}/{buckets.get('optimizer_s')}"
)
need = {"status ok": record["status"] == "ok", "samples_per_s": bool(m.get("samples_per_s")), "step median": bool(steps.get("median"))}
if parallel.get("backend"):  # a process group: DDP's probes must have measured
    need.update({"exposed communication measured": comm.get("reason") is None, "bucket probe measured": buckets.get("reason") is None})
    # the window's steps split on the step timer's clock (CUDA events on a GPU: the hook's CUDA
    # path, unexercised before a GPU session runs this), except under CUDA graphs, where the
    # record must say why not
    split = m.get("window_split") or {}
    print(
        f"  window split: steps={split.get('steps')} compute={split.get('compute_rank_mean_s')} "
        f"exposed wait={split.get('exposed_allreduce_wait_s')} clock={split.get('clock')} ({split.get('reason')})"
    )
    if cuda_graph_replays(record):
        need["window split not timed under CUDA graphs, and why"] = bool(split.get("reason"))
    else:
        need["window split measured"] = (
            split.get("reason") is None and split.get("steps") == m.get("measured_steps") and (split.get("compute_rank_mean_s") or 0) > 0
        )
if not on_cpu:
    expected_peak = gpu_peaks.gpu_model(record["hardware"]["gpu"]["name"])  # None: a GPU the table lacks
    need.update(
        {
            "device cuda": parallel.get("device_type") == "cuda",
            "mfu": m.get("mfu") is not None,
            f"peak = the table's {expected_peak}": bool(expected_peak) and expected_peak in (m.get("peak_flops_source") or ""),
            "nvml energy_j": bool(nvml.get("energy_j")),
            "nvml total-energy counter": nvml.get("energy_method") == "total_energy_counter",
            "nvml power, utilisation, SM clock": None not in (nvml.get("power_mean_w"), nvml.get("gpu_util_mean_pct"), nvml.get("sm_clock_mean_mhz")),
            "nvml lowest SM clock, power limit, clock-event reasons": None
            not in (nvml.get("sm_clock_min_mhz"), nvml.get("power_limit_w"), nvml.get("clock_event_reasons")),
            "hardware.gpu uuid, power limit, maximum SM clock": str(gpu_facts.get("uuid")).startswith("GPU-")
            and None not in (gpu_facts.get("power_limit_w"), gpu_facts.get("sm_clock_max_mhz")),
            "energy_per_sample_j": bool(m.get("energy_per_sample_j")),
            "peak CUDA memory": bool(memory.get("allocated_bytes_max")),
        }
    )
missing = [what for what, ok in need.items() if not ok]
print("  CHECK " + ("OK" if not missing else "FAILED: " + ", ".join(missing)))
raise SystemExit(1 if missing else 0)
