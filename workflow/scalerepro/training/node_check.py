"""The prescreen's measurement of one node: what its devices do alone, before a scaling study
trusts them. Run once per node; writes one ``NodeCheck`` record (``scalerepro.record.node_check``).

    python -m scalerepro.training.node_check --out results/prescreen/nodes/<node>.json \\
        --device cpu|cuda --precision fp32|bf16|fp16|tf32 [--node NAME] [--seconds S] [--ranks N]

For each device (each visible CUDA device; on the CPU one device, the cores of this process's
affinity), after a warm-up, timed repeats of

    matmul   C = A @ B, n x n at the precision's dtype: TFLOP/s = 2 n^3 / median time; spread =
             (p90 - p10) / median, the repeats' scatter (a throttled or shared device shows here)
    copy     dst.copy_(src) of one buffer: GB/s = 2 x bytes / median time (read + write, as
             STREAM's copy counts)

then the device's state as its copy ended (clock, temperature, power, NVML's clock-event
reasons). With two ranks or more, an all-reduce among them (NCCL on GPUs, gloo on the CPU, each
rank its share of the cores): busbw = size / t x 2 (n - 1) / n with t the slowest rank's median
time (nccl-tests' bus bandwidth, as ``scalerepro.training.commbench`` reports it).

Each repeat is timed alone (CUDA events on a GPU, the host's clock on the CPU), so that the
median and the quantiles are of single operations. ``--seconds`` is the check's budget, all
figures together (the process's start and the ranks' aside): half for the matmuls, a quarter for
the copies, each shared evenly among the devices, which run one after the other, so that each
card's figures are its own; a quarter for the all-reduce.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing

from scalerepro.common.cli import CommandError, OneLineErrorParser, bounded_float, bounded_int, error_boundary, output_path
from scalerepro.common.files import utc_now, write_json_atomically
from scalerepro.record.node_check import NODE_CHECK_SCHEMA_VERSION, AllReduceFigure, DeviceFigures, DeviceState, NodeCheck
from scalerepro.telemetry import hardware, nvml
from scalerepro.training import distributed

_PROG = "scalerepro.training.node_check"

GPU_MATMUL_SIZE = 8192  # ~1.6 ms in bf16 on an H100: long enough for the kernel to reach its rate
GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 256 << 20  # larger than the L3 of the CPUs a study runs on: a copy of memory, not of a cache
GPU_ALLREDUCE_BYTES = 256 << 20
CPU_ALLREDUCE_BYTES = 64 << 20

# Fewer than this many repeats gives no p10/p90 worth the name; more than the maximum only costs time.
MIN_REPEATS, MAX_REPEATS = 5, 100_000
# The share of an operation's budget spent warming up (clocks rising, caches and kernels chosen).
WARMUP_SHARE = 0.1
# A CPU matmul whose single call takes more than this share of its budget is halved in size: the
# precision has no fast kernel on this CPU (fp16 on most), and the repeats must still fit.
SLOW_CALL_SHARE = 0.25
SMALLEST_MATMUL = 128

ONE_RANK_REASON = "one rank on the node: no all-reduce within it"
_DIST_TIMEOUT = datetime.timedelta(minutes=5)


class NodeCheckError(CommandError):
    """A check that cannot run as asked: the message names the flag and the fix."""


def cpu_matmul_size(cores: int) -> int:
    """n of the CPU's matmul, from its cores: one product takes ~10-50 ms in fp32 (~15 ms for
    1024 on 2 AVX-512 cores; ~100 GFLOP/s a core), long enough to time on the host's clock and
    short enough for dozens of repeats. From the cores alone, never from a timing, so that peers
    with the same cores run the same n and their rates compare."""
    if cores <= 8:
        return 1024
    return 2048 if cores <= 64 else 4096


def matmul_dtype(precision: str) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)


def set_precision(precision: str) -> None:
    """TF32 matmuls for tf32, IEEE fp32 otherwise: what the trainer sets
    (``scalerepro.training.run_setup.set_precision``; that module pulls in the models, too slow
    to import for a check that must start fast), so fp32 products here run as a rank's do."""
    tf32 = precision == "tf32"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
    else:  # torch before 2.9
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_each(op: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``op``, each timed alone."""
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        _sync(device)
        for start, end in events:
            start.record()
            op()
            end.record()
        _sync(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        op()
        seconds.append(time.perf_counter() - started)
    return seconds


def warm_up(op: Callable[[], object], device: torch.device, budget_s: float) -> float:
    """Run ``op`` at least twice and for ``WARMUP_SHARE`` of the budget; the last call's seconds."""
    began, calls, last = time.perf_counter(), 0, 0.0
    while calls < 2 or time.perf_counter() - began < WARMUP_SHARE * budget_s:
        started = time.perf_counter()
        op()
        _sync(device)
        last, calls = time.perf_counter() - started, calls + 1
    return last


def repeats_for(budget_s: float, call_s: float) -> int:
    """As many repeats as the rest of the budget holds, within [MIN_REPEATS, MAX_REPEATS]."""
    fit = int((1 - WARMUP_SHARE) * budget_s / max(call_s, 1e-9))
    return min(max(fit, MIN_REPEATS), MAX_REPEATS)


def spread(seconds: list[float]) -> float:
    """(p90 - p10) / median, at most 1: a spread that wide already says the device is unfit, and
    the record bounds it to [0, 1]."""
    deciles = statistics.quantiles(seconds, n=10, method="inclusive")
    return min((deciles[-1] - deciles[0]) / statistics.median(seconds), 1.0)


def measure_matmul(device: torch.device, precision: str, size: int, budget_s: float) -> tuple[float, int, int, float]:
    """(TFLOP/s, n, repeats, spread) of n x n @ n x n at the precision's dtype."""
    dtype = matmul_dtype(precision)
    while True:
        # random values (zeros run faster on some units), drawn in fp32: not every dtype has a CPU randn
        a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
        c = torch.empty_like(a)

        def product(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> object:
            return torch.matmul(a, b, out=c)

        started = time.perf_counter()
        product()
        _sync(device)
        # a GPU's first call also pays cuBLAS's start, and every precision has fast kernels there
        if device.type == "cuda" or time.perf_counter() - started <= SLOW_CALL_SHARE * budget_s or size <= SMALLEST_MATMUL:
            break
        size //= 2
    call_s = warm_up(product, device, budget_s)
    seconds = time_each(product, device, repeats_for(budget_s, call_s))
    return 2 * size**3 / statistics.median(seconds) / 1e12, size, len(seconds), spread(seconds)


def measure_copy(device: torch.device, size_bytes: int, budget_s: float) -> float:
    """GB/s of dst.copy_(src) over ``size_bytes``, counting the read and the write."""
    source = torch.ones(size_bytes, dtype=torch.uint8, device=device)
    target = torch.zeros_like(source)  # written once, so that no page is first touched inside a repeat

    def copy() -> object:
        return target.copy_(source)

    call_s = warm_up(copy, device, budget_s)
    seconds = time_each(copy, device, repeats_for(budget_s, call_s))
    return 2 * size_bytes / statistics.median(seconds) / 1e9


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cpu_temperature_c(sys_root: Path = Path("/sys")) -> float | None:
    """The hottest CPU package or die sensor: hwmon's coretemp (Intel) or k10temp (AMD), else the
    x86_pkg_temp thermal zone; None where neither is there (most VMs)."""
    readings = []
    for hwmon in sorted((sys_root / "class/hwmon").glob("hwmon*")):
        name = (hwmon / "name").read_text().strip() if (hwmon / "name").is_file() else ""
        if name in ("coretemp", "k10temp", "zenpower"):
            readings += [_read_number(sensor) for sensor in hwmon.glob("temp*_input")]
    if not any(r is not None for r in readings):
        for zone in sorted((sys_root / "class/thermal").glob("thermal_zone*")):
            if (zone / "type").is_file() and (zone / "type").read_text().strip() == "x86_pkg_temp":
                readings.append(_read_number(zone / "temp"))
    present = [r / 1000.0 for r in readings if r is not None]  # millidegrees
    return max(present) if present else None


def cpu_state(cores: list[int], sys_root: Path = Path("/sys")) -> DeviceState:
    """The cores' mean current frequency (cpufreq), the CPU's temperature; no power on a CPU."""
    frequencies = [_read_number(sys_root / f"devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq") for core in cores]
    khz = [f for f in frequencies if f is not None]
    temperature = cpu_temperature_c(sys_root)
    missing = []
    if not khz:
        missing.append("clock: no readable cpufreq scaling_cur_freq for these cores")
    if temperature is None:
        missing.append("temperature: no coretemp/k10temp hwmon or x86_pkg_temp thermal zone")
    missing.append("power: not measured on a CPU")
    return DeviceState(
        clock_mhz=sum(khz) / len(khz) / 1000.0 if khz else None,
        temperature_c=temperature,
        power_w=None,
        clock_event_reasons=None,
        reason="; ".join(missing),
    )


def gpu_state(index: int) -> DeviceState:
    """The GPU's SM clock, temperature, power and clock-event reasons from NVML, read now."""
    # nvml's opener, shared with its sampler, so both find the card the same way (by UUID)
    library, handle, _, why = nvml._open_device(nvml.nvml_uuid_for_torch_device(index))
    if why is not None:
        return DeviceState(reason=why)
    refused: list[str] = []

    def query(what: str, read: Callable[[], float]) -> float | None:
        try:
            return float(read())
        except library.NVMLError as error:
            refused.append(f"{what}: {error}")
            return None

    try:
        clock = query("SM clock", lambda: library.nvmlDeviceGetClockInfo(handle, library.NVML_CLOCK_SM))
        temperature = query("temperature", lambda: library.nvmlDeviceGetTemperature(handle, library.NVML_TEMPERATURE_GPU))
        power_mw = query("power", lambda: library.nvmlDeviceGetPowerUsage(handle))
        reasons: dict[str, bool] | None = None
        read_reasons = nvml.clock_event_reasons_function(library, handle)
        mask = None if read_reasons is None else query("clock-event reasons", lambda: read_reasons(handle))
        if mask is None and read_reasons is None:
            refused.append("clock-event reasons: this pynvml has no such query")
        if mask is not None:
            bits = nvml.clock_event_reason_bits(library)
            active = set(nvml.decode_clock_event_reasons(int(mask), bits))
            reasons = {name: name in active for name, _ in bits} | {name: True for name in active}
    finally:
        with contextlib.suppress(library.NVMLError):  # the figures are read; a failed shutdown loses nothing
            library.nvmlShutdown()
    return DeviceState(
        clock_mhz=clock,
        temperature_c=temperature,
        power_w=None if power_mw is None else power_mw / 1000.0,
        clock_event_reasons=reasons,
        reason="; ".join(refused) or None,
    )


def measure_device(device: torch.device, name: str, precision: str, size: int, copy_bytes: int, seconds: float, cores: list[int]) -> DeviceFigures:
    """One device's figures within ``seconds``: its share of the check's budget."""
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the timing events are recorded on the current device's stream
    tflops, size, repeats, scatter = measure_matmul(device, precision, size, seconds / 2)
    gbps = measure_copy(device, copy_bytes, seconds / 4)
    if device.type == "cuda":
        state = gpu_state(device.index or 0)
        torch.cuda.empty_cache()  # the next card's check, and the all-reduce's ranks, get the memory
    else:
        state = cpu_state(cores)
    return DeviceFigures(
        index=device.index or 0,
        name=name,
        matmul_tflops=tflops,
        matmul_size=size,
        memory_gbps=gbps,
        memory_bytes=copy_bytes,
        repeats=repeats,
        spread=scatter,
        state=state,
    )


def rank_cores(cores: list[int], ranks: int, rank: int) -> list[int]:
    """This rank's contiguous share of the cores (neighbours share caches), as even as they split."""
    return cores[rank * len(cores) // ranks : (rank + 1) * len(cores) // ranks]


def _allreduce_rank(rank: int, ranks: int, device_type: str, cores: list[int], folder: str, size_bytes: int, budget_s: float) -> None:
    """One rank of the all-reduce (a spawned process): its median; rank 0 writes the slowest's."""
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        mine = rank_cores(cores, ranks, rank)
        os.sched_setaffinity(0, mine)
        torch.set_num_threads(len(mine))
        device = torch.device("cpu")
    store = dist.FileStore(os.path.join(folder, "store"), ranks)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", store=store, rank=rank, world_size=ranks, timeout=_DIST_TIMEOUT)
    try:
        tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)

        def all_reduce() -> object:
            return dist.all_reduce(tensor)

        # every rank must run as many repeats as the others: the slowest rank's estimate decides
        estimate = torch.tensor([warm_up(all_reduce, device, budget_s)], dtype=torch.float64, device=device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
        repeats = repeats_for(budget_s, float(estimate.item()))
        dist.barrier()
        slowest = torch.tensor([statistics.median(time_each(all_reduce, device, repeats))], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            Path(folder, "result.json").write_text(json.dumps({"time_s": float(slowest.item())}))
    finally:
        dist.destroy_process_group()


def measure_allreduce(device_type: str, ranks: int, cores: list[int], seconds: float) -> AllReduceFigure:
    size_bytes = GPU_ALLREDUCE_BYTES if device_type == "cuda" else CPU_ALLREDUCE_BYTES
    folder = tempfile.mkdtemp(prefix="scalerepro-node-check-")
    try:
        # spawn, not fork: a forked child of a process with CUDA up, or OpenMP's threads, can hang
        torch.multiprocessing.start_processes(
            _allreduce_rank, args=(ranks, device_type, cores, folder, size_bytes, seconds / 4), nprocs=ranks, join=True, start_method="spawn"
        )
        time_s = json.loads(Path(folder, "result.json").read_text())["time_s"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return AllReduceFigure(
        ranks=ranks,
        size_bytes=size_bytes,
        backend="nccl" if device_type == "cuda" else "gloo",
        busbw_gbps=size_bytes / time_s * 2 * (ranks - 1) / ranks / 1e9,
        time_s=time_s,
    )


def _ranks(device_type: str, asked: int | None, cores: list[int]) -> int:
    """The all-reduce's ranks, checked against the devices there are."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise NodeCheckError(
                "--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False): run it on a GPU node, or give --device cpu"
            )
        count = torch.cuda.device_count()
        if asked is not None and asked > count:
            raise NodeCheckError(f"--ranks {asked}: this node shows {count} CUDA device(s), one rank each: give --ranks {count} or fewer")
        return count if asked is None else asked
    if asked is not None and asked > len(cores):
        raise NodeCheckError(f"--ranks {asked}: this process may run on {len(cores)} core(s), one rank needs one at least: give --ranks {len(cores)} or fewer")
    return 1 if asked is None else asked


def _summary(check: NodeCheck) -> str:
    def span(values: list[float], digits: int) -> str:
        low, high = min(values), max(values)
        return f"{low:.{digits}f}" if low == high else f"{low:.{digits}f}-{high:.{digits}f}"

    devices = check.devices
    many = f" over {len(devices)} devices" if len(devices) > 1 else ""
    tflops = span([d.matmul_tflops for d in devices], 3)
    gbps = span([d.memory_gbps for d in devices], 1)
    allreduce = check.allreduce
    collective = (
        "no all-reduce (one rank)" if allreduce is None else f"all-reduce busbw {allreduce.busbw_gbps:.2f} GB/s ({allreduce.ranks} ranks, {allreduce.backend})"
    )
    return f"{check.node}: {check.device_type} {check.precision} matmul {tflops} TFLOP/s (n={devices[0].matmul_size}), copy {gbps} GB/s{many}; {collective}"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_path, help="the node's record (JSON) to write")
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16", "tf32"], required=True, help="the study's precision: the matmul's dtype")
    parser.add_argument("--node", help="the node's name in the record (default: this host's name)")
    parser.add_argument("--seconds", type=bounded_float(0.1, 3600), default=2.0, help="the check's time budget, all figures together (default: %(default)s)")
    parser.add_argument("--ranks", type=bounded_int(1, 4096), help="ranks of the all-reduce (default: the CUDA devices on cuda, 1 on cpu)")
    args = parser.parse_args(argv)
    here = distributed.node_name()
    if args.node is not None and args.node != here:
        # the record would be another node's figures under this one's name
        raise NodeCheckError(f"--node {args.node!r}, but this process runs on {here!r}: run the check on {args.node} (Slurm: --nodelist), or leave --node out")
    began, started_at = time.monotonic(), utc_now()
    cores = sorted(os.sched_getaffinity(0))
    ranks = _ranks(args.device, args.ranks, cores)
    set_precision(args.precision)
    if args.device == "cuda":
        count = torch.cuda.device_count()
        devices = [
            measure_device(torch.device("cuda", k), torch.cuda.get_device_name(k), args.precision, GPU_MATMUL_SIZE, GPU_COPY_BYTES, args.seconds / count, cores)
            for k in range(count)
        ]
    else:
        torch.set_num_threads(len(cores))
        name = hardware.host_facts(import_torch=False)["cpu_model"] or "unknown CPU"
        devices = [measure_device(torch.device("cpu"), name, args.precision, cpu_matmul_size(len(cores)), CPU_COPY_BYTES, args.seconds, cores)]
    allreduce = measure_allreduce(args.device, ranks, cores, args.seconds) if ranks > 1 else None
    check = NodeCheck(
        schema_version=NODE_CHECK_SCHEMA_VERSION,
        node=here,
        started_at=started_at,
        device_type=args.device,
        precision=args.precision,
        cores=len(cores),
        seconds=time.monotonic() - began,
        devices=devices,
        allreduce=allreduce,
        allreduce_reason=None if allreduce is not None else ONE_RANK_REASON,
    )
    write_json_atomically(args.out, check.model_dump(mode="json"))
    print(_summary(check), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
