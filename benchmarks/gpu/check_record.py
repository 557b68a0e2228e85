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
import math
from pathlib import Path

from scalerepro.common import gpu_peaks
from scalerepro.common.cuda_graphs import replays_cuda_graphs
from scalerepro.record.measured import Measurements
from scalerepro.record.read import read

parser = argparse.ArgumentParser(prog="check_record.py", description="Print a run record's key figures; exit 1 if one it must fill is missing.")
parser.add_argument("record", type=Path)
parser.add_argument("--cpu", action="store_true", help="a CPU run: check only what a CPU run can fill")
parser.add_argument("--world-size", type=int, help="the ranks the run must have had (a run that fell back to fewer fails)")
args = parser.parse_args()
path, on_cpu = args.record, args.cpu
reading = read(path)  # today's model of it: a record this code cannot read stops here, in one line
record = reading.record
m = record.measurements
if m is None:
    print(f"{path}: status={record.status}: no measurements ({record.error.message if record.error else 'no error stated'})")
    raise SystemExit(1)
parallel, nvml, steps, gpu = record.parallel, m.nvml, m.step_time_s, record.hardware.gpu
comm, buckets, split, sharding = m.exposed_communication, m.backward_buckets, m.window_split, m.sharding
strategy, world = parallel.strategy, parallel.world_size or 1
print(
    f"{path}: status={record.status} launcher={parallel.launcher} backend={parallel.backend} device={parallel.device_type} "
    f"world={parallel.world_size} gpu={gpu.name} torch={record.versions.get('torch')} cuda={record.versions.get('cuda')} nccl={record.versions.get('nccl')}"
)
print(
    f"  samples/s={m.samples_per_s} tokens/s={m.tokens_per_s} step median s={steps.median} p10={steps.p10} p90={steps.p90} "
    f"window_s={m.window_s} measured steps={m.measured_steps} data_stall={m.data_stall_fraction}"
)
peak = m.peak
print(
    f"  mfu={m.mfu} peak/device={peak.flops_per_s if peak else None} {peak.precision if peak else ''} {peak.units if peak else ''} "
    f"at {peak.clock_mhz if peak else None} MHz ({peak.part if peak else m.peak_reason})"
)
print(
    f"  nvml available={nvml.available} reason={nvml.reason} energy_j={nvml.energy_j} method={nvml.energy_method} "
    f"power_mean_w={nvml.power_mean_w} util_mean={nvml.gpu_util_mean_pct} sm_clock_mean={nvml.sm_clock_mean_mhz} samples={nvml.samples} window_s={nvml.window_s}"
)
print(
    f"  purpose={record.purpose} sm_clock min/max/card max={nvml.sm_clock_min_mhz}/{nvml.sm_clock_max_mhz}/{nvml.sm_clock_max_supported_mhz} "
    f"power limit W={nvml.power_limit_w} temperature mean/max={nvml.temperature_mean_c}/{nvml.temperature_max_c} clock event reasons={nvml.clock_event_reasons}"
)
print(f"  card uuid={gpu.uuid} power_limit_w={gpu.power_limit_w} sm_clock_max_mhz={gpu.sm_clock_max_mhz}")
print(
    f"  energy/sample J={m.energy_per_sample_j} allocated max bytes={m.memory.allocated_bytes_max} "
    f"exposed_comm={comm.fraction} ({comm.reason}) buckets={len(buckets.buckets) if buckets else 0} "
    f"({buckets.layout_source if buckets else None}) fwd/bwd/opt s={buckets.forward_s if buckets else None}/"
    f"{buckets.backward_s if buckets else None}/{buckets.optimizer_s if buckets else None}"
)
need = {"status ok": record.status == "ok", "samples_per_s": bool(m.samples_per_s), "step median": bool(steps.median)}
need["figures agree with each other (scalerepro.record.evidence)"] = not reading.problems
if args.world_size is not None:
    need[f"world size {args.world_size}"] = world == args.world_size
if world > 1:  # each rank's own figures, gathered
    per_rank = m.memory_split.per_rank if m.memory_split else []
    print(f"  ranks: {world} on {parallel.nodes} node(s) x {parallel.ranks_per_node}, memory split of {len(per_rank)} rank(s)")
    need["ranks per node x nodes = world size"] = (parallel.ranks_per_node or 0) * (parallel.nodes or 0) == world
    need["memory split of every rank"] = len(per_rank) == world


def _window_split(m: Measurements) -> None:
    """The window's steps split on the step timer's clock (CUDA events on a GPU: the hook's CUDA
    path, unexercised before a GPU session runs this), except under CUDA graphs, where the record
    must say why not."""
    assert split is not None
    print(
        f"  window split: steps={split.steps} compute={split.compute_rank_mean_s} exposed wait={split.exposed_allreduce_wait_s} "
        f"straggler wait={split.straggler_wait_s} clock={split.clock} ({split.reason})"
    )
    if replays_cuda_graphs(parallel.device_type, record.knobs.compile):
        need["window split not timed under CUDA graphs, and why"] = bool(split.reason)
        return
    need["window split measured"] = split.reason is None and split.steps == m.measured_steps and (split.compute_rank_mean_s or 0) > 0
    if world > 1 and not on_cpu:  # the hook's CUDA path at several ranks: launch and completion marked by CUDA events
        need["window split on CUDA events"] = split.clock == "cuda events"
    if world > 1:  # every rank's waits: the last to finish its backward waits for the all-reduce alone, the others besides for it
        need["window split over the ranks: exposed wait > 0, straggler wait"] = (split.exposed_allreduce_wait_s or 0) > 0 and split.straggler_wait_s is not None


if parallel.backend and strategy == "ddp":  # a process group: DDP's probes must have measured
    need.update({"exposed communication measured": comm.reason is None, "bucket probe measured": buckets is not None and buckets.reason is None})
    need["window split recorded"] = split is not None
    if split is not None:
        _window_split(m)
    if world > 1:
        need["exposed-communication probe's straggler wait"] = comm.straggler_wait_s is not None
elif strategy != "ddp":  # sharded: no DDP all-reduce to time, and the record says so
    mesh = sharding.mesh if sharding else None
    sent = (sharding.comm_bytes_per_step_analytic if sharding else None) or {}
    print(
        f"  sharding: {strategy} mesh={mesh.shape if mesh else None} {mesh.dims if mesh else None} "
        f"state bytes/rank max={sharding.state_bytes_per_rank_max if sharding else None} sent/step={sent} ({sharding.comm_reason if sharding else None})"
    )
    need.update(
        {
            f"{strategy} mesh over all {world} ranks": math.prod(mesh.shape if mesh else [0]) == world,
            "state bytes per rank": ((sharding.state_bytes_per_rank_max if sharding else None) or 0) > 0,
            "collective bytes per step, or why not": bool(sent) or bool(sharding and sharding.comm_reason),
            "no DDP probe, and why (exposed communication, buckets, window split)": bool(comm.reason)
            and bool(buckets and buckets.reason)
            and bool(split and split.reason),
        }
    )
if not on_cpu:
    expected = gpu_peaks.gpu_model(gpu.name)  # None: a GPU the table lacks
    need.update(
        {
            "device cuda": parallel.device_type == "cuda",
            "mfu": m.mfu is not None,
            f"peak = the table's {expected}": bool(expected) and peak is not None and peak.part == expected,
            "the peak's clock (MFU at the clock held)": peak is not None and peak.clock_mhz is not None,
            "nvml energy_j": bool(nvml.energy_j),
            "nvml total-energy counter": nvml.energy_method == "total_energy_counter",
            "nvml power, utilisation, SM clock": None not in (nvml.power_mean_w, nvml.gpu_util_mean_pct, nvml.sm_clock_mean_mhz),
            "nvml lowest SM clock, power limit, clock-event reasons": None not in (nvml.sm_clock_min_mhz, nvml.power_limit_w, nvml.clock_event_reasons),
            "hardware.gpu uuid, power limit, maximum SM clock": str(gpu.uuid).startswith("GPU-") and None not in (gpu.power_limit_w, gpu.sm_clock_max_mhz),
            "energy_per_sample_j": bool(m.energy_per_sample_j),
            "peak CUDA memory": bool(m.memory.allocated_bytes_max),
        }
    )
missing = [what for what, ok in need.items() if not ok]
print("  CHECK " + ("OK" if not missing else "FAILED: " + ", ".join(missing)))
raise SystemExit(1 if missing else 0)
