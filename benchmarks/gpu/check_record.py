"""Print a run record's key figures; exit 1 if a figure the run must fill is missing.

    python check_record.py RECORD [--cpu] [--world-size N]

On a GPU run every figure issue 11 asks of a 1-GPU record must be there: NVML energy from the
total-energy counter, power, utilisation, SM clock, MFU against the peak the table gives the
record's own GPU (H100 SXM5 on the H100 kind, H200 SXM on its fallback), step times (CUDA events
on a GPU) and peak CUDA memory; and what reads power capping, from the real NVML calls that the
tests only replay (tests/fixtures/nvml): the lowest SM clock, the enforced power limit and the
clock-event reasons (``{}`` where none was active, so only null fails), and the card's UUID, power
limit and maximum SM clock in ``hardware.gpu``. ``--cpu`` (the CPU
rehearsal) checks only what a CPU run can fill.

A record of several ranks (``--world-size N`` requires N) must hold what only several ranks give:
every rank's memory split, and under DDP the window split from both ranks' all-reduce timing (an
exposed wait, the slowest rank's; a straggler wait, the others'), on CUDA events on a GPU (the
hook's CUDA path). A sharded run (``--parallel fsdp``, tp, ...) has no DDP probe and must say why
for each; it must name its strategy, a mesh over every rank, the state each rank holds and the
bytes its collectives send."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from scalerepro.analysis.tables.readers import cuda_graph_replays
from scalerepro.common import gpu_peaks

parser = argparse.ArgumentParser(prog="check_record.py", description="Print a run record's key figures; exit 1 if one it must fill is missing.")
parser.add_argument("record", type=Path)
parser.add_argument("--cpu", action="store_true", help="a CPU run: check only what a CPU run can fill")
parser.add_argument("--world-size", type=int, help="the ranks the run must have had (a run that fell back to fewer fails)")
args = parser.parse_args()
path, on_cpu = args.record, args.cpu
record = json.loads(Path(path).read_text())
m = record.get("measurements") or {}
parallel, nvml, steps = record.get("parallel") or {}, m.get("nvml") or {}, m.get("step_time_s") or {}
memory, comm, buckets = m.get("memory") or {}, m.get("exposed_communication") or {}, m.get("backward_buckets") or {}
sharding = m.get("sharding") or {}  # null under DDP
strategy, world = sharding.get("strategy") or "ddp", parallel.get("world_size") or 1
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
if args.world_size is not None:
    need[f"world size {args.world_size}"] = world == args.world_size
if world > 1:  # each rank's own figures, gathered
    per_rank = (m.get("memory_split") or {}).get("per_rank") or []
    print(f"  ranks: {world} on {parallel.get('nodes')} node(s) x {parallel.get('ranks_per_node')}, memory split of {len(per_rank)} rank(s)")
    need["ranks per node x nodes = world size"] = (parallel.get("ranks_per_node") or 0) * (parallel.get("nodes") or 0) == world
    need["memory split of every rank"] = len(per_rank) == world
if parallel.get("backend") and strategy == "ddp":  # a process group: DDP's probes must have measured
    need.update({"exposed communication measured": comm.get("reason") is None, "bucket probe measured": buckets.get("reason") is None})
    # the window's steps split on the step timer's clock (CUDA events on a GPU: the hook's CUDA
    # path, unexercised before a GPU session runs this), except under CUDA graphs, where the
    # record must say why not
    split = m.get("window_split") or {}
    print(
        f"  window split: steps={split.get('steps')} compute={split.get('compute_rank_mean_s')} "
        f"exposed wait={split.get('exposed_allreduce_wait_s')} straggler wait={split.get('straggler_wait_s')} clock={split.get('clock')} ({split.get('reason')})"
    )
    if cuda_graph_replays(record):
        need["window split not timed under CUDA graphs, and why"] = bool(split.get("reason"))
    else:
        need["window split measured"] = (
            split.get("reason") is None and split.get("steps") == m.get("measured_steps") and (split.get("compute_rank_mean_s") or 0) > 0
        )
        if world > 1 and not on_cpu:  # the hook's CUDA path at several ranks: launch and completion marked by CUDA events
            need["window split on CUDA events"] = split.get("clock") == "cuda events"
        if world > 1:  # every rank's waits: the last to finish its backward waits for the all-reduce alone, the others besides for it
            need["window split over the ranks: exposed wait > 0, straggler wait"] = (split.get("exposed_allreduce_wait_s") or 0) > 0 and (
                split.get("straggler_wait_s") is not None
            )
    if world > 1:
        need["exposed-communication probe's straggler wait"] = comm.get("straggler_wait_s") is not None
elif strategy != "ddp":  # sharded: no DDP all-reduce to time, and the record says so
    mesh, sent = sharding.get("mesh") or {}, sharding.get("comm_bytes_per_step_analytic") or {}
    print(
        f"  sharding: {strategy} mesh={mesh.get('shape')} {mesh.get('dims')} state bytes/rank max={sharding.get('state_bytes_per_rank_max')} "
        f"sent/step={sent} ({sharding.get('comm_reason')})"
    )
    need.update(
        {
            f"{strategy} mesh over all {world} ranks": math.prod(mesh.get("shape") or [0]) == world,
            "state bytes per rank": (sharding.get("state_bytes_per_rank_max") or 0) > 0,
            "collective bytes per step, or why not": bool(sent) or bool(sharding.get("comm_reason")),
            "no DDP probe, and why (exposed communication, buckets, window split)": all(
                bool(part.get("reason")) for part in (comm, buckets, m.get("window_split") or {})
            ),
        }
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
