"""All-reduce bus bandwidth over message sizes: the table nccl-tests' all_reduce_perf gives,
measured with torch.distributed and launched exactly like training (torchrun, srun, NCCL/gloo).

    torchrun --nproc-per-node 8 -m scalerepro.training.commbench --out comm.json

For each size S (bytes), after ``--warmup`` untimed all-reduces, ``--iterations`` timed ones back
to back on n ranks. Two times per size, from the same iterations:

    t      the slowest rank's median time of one all-reduce (each timed alone: CUDA events
           around it, or the host clock on gloo). NOT nccl-tests' time: a median is robust
           to a stray slow iteration, and the slowest rank is the one a collective waits
           for. time_us_median, algbw_gbps, busbw_gbps, and what the scaling model reads.
    t_nt   nccl-tests' time (src/common.cu, BenchTime, default -a 1): the wall time of all
           iterations together divided by their number, averaged over the ranks.
           nccl_tests_time_us, nccl_tests_algbw_gbps, nccl_tests_busbw_gbps: compare
           these with an all_reduce_perf log.

Bandwidths, nccl-tests' definitions (its doc/PERFORMANCE.md), for either time T:

    algbw = S / T                       bytes a rank contributes per second
    busbw = algbw * 2 (n - 1) / n       bytes per second over the busiest link of a ring all-reduce,
                                        comparable with the hardware's link bandwidth
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from scalerepro import schedulers
from scalerepro.common.cli import OneLineErrorParser, bounded_float, bounded_int, error_boundary, output_path
from scalerepro.common.files import utc_now, write_json_atomically
from scalerepro.telemetry import hardware
from scalerepro.training import distributed

DEFAULT_SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB, x4


def _time_all_reduce(tensor: torch.Tensor, iterations: int, warmup: int) -> tuple[list[float], float]:
    """(seconds of each all-reduce, seconds of all of them together: first start to last end)."""
    for _ in range(warmup):
        dist.all_reduce(tensor)
    if tensor.is_cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)]
        torch.cuda.synchronize()
        dist.barrier()
        for start, end in events:
            start.record()
            dist.all_reduce(tensor)
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in events], events[0][0].elapsed_time(events[-1][1]) / 1e3
    dist.barrier()
    seconds = []
    first = time.perf_counter()
    for _ in range(iterations):
        started = time.perf_counter()
        dist.all_reduce(tensor)  # gloo on the CPU: returns when the reduction is complete
        seconds.append(time.perf_counter() - started)
    return seconds, time.perf_counter() - first


def bandwidths(size_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s: algbw = S / t, busbw = algbw * 2 (n - 1) / n (nccl-tests)."""
    algbw = size_bytes / seconds
    return algbw, algbw * 2 * (ranks - 1) / ranks


def run(ctx: distributed.DistContext, sizes: list[int], iterations: int, warmup: int) -> list[dict]:
    rows = []
    n = ctx.world_size
    for size in sizes:
        tensor = torch.ones(max(size // 4, 1), dtype=torch.float32, device=ctx.device)
        seconds_each, all_seconds = _time_all_reduce(tensor, iterations, warmup)
        median, fastest = statistics.median(seconds_each), min(seconds_each)
        # The slowest rank's median is the collective's time.
        slowest = distributed.all_reduce_max(ctx, torch.tensor([median, fastest], dtype=torch.float64, device=ctx.device)).tolist()
        # nccl-tests: all iterations' time / iterations, the mean over ranks
        nccl_tests = distributed.all_reduce_sum(ctx, torch.tensor([all_seconds / iterations], dtype=torch.float64, device=ctx.device)).item() / n
        seconds = slowest[0]
        bytes_ = tensor.numel() * 4
        algbw, busbw = bandwidths(bytes_, seconds, n)
        nt_algbw, nt_busbw = bandwidths(bytes_, nccl_tests, n)
        rows.append(
            {
                "size_bytes": bytes_,
                "dtype": "float32",
                "iterations": iterations,
                "time_us_median": seconds * 1e6,
                "time_us_min": slowest[1] * 1e6,
                "algbw_gbps": algbw / 1e9,
                "busbw_gbps": busbw / 1e9,
                "nccl_tests_time_us": nccl_tests * 1e6,
                "nccl_tests_algbw_gbps": nt_algbw / 1e9,
                "nccl_tests_busbw_gbps": nt_busbw / 1e9,
            }
        )
    return rows


_PROG = "scalerepro.training.commbench"


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_path, help="JSON file to write (rank 0)")
    parser.add_argument(
        "--sizes",
        type=bounded_int(4, 1 << 34),
        nargs="+",
        default=DEFAULT_SIZES,
        help="message sizes in bytes, 4 B to 16 GiB (default 1 KiB..256 MiB, x4)",
    )
    parser.add_argument("--iterations", type=bounded_int(1, 100_000), default=20, help="timed all-reduces per size")
    parser.add_argument("--warmup", type=bounded_int(0, 100_000), default=5, help="untimed all-reduces per size")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--dist-timeout-s", type=bounded_float(1, 7 * 24 * 3600), default=300.0)
    parser.add_argument(
        "--process-group-at-one-rank",
        action="store_true",
        help="run at one rank too, on a communicator of one (times the local all-reduce; busbw is 0 by its definition)",
    )
    args = parser.parse_args(argv)
    started_at = utc_now()
    try:
        ctx = distributed.setup(args.device, args.dist_timeout_s, group_at_one_rank=args.process_group_at_one_rank)
    except distributed.DistributedSetupError as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 1
    if not ctx.distributed:
        print(
            "scalerepro.training.commbench: error: an all-reduce needs at least 2 ranks: launch with torchrun --nproc-per-node N (N >= 2) or srun, "
            "or pass --process-group-at-one-rank to time a communicator of one",
            file=sys.stderr,
        )
        return 2
    rows = run(ctx, sorted(args.sizes), args.iterations, args.warmup)
    if ctx.is_main:
        write_json_atomically(
            args.out,
            {
                "world_size": ctx.world_size,
                # what time_us_median and nccl_tests_time_us are (module docstring)
                "time_definitions": {
                    "time_us_median": "slowest rank's median of single all-reduces",
                    "nccl_tests_time_us": "nccl-tests: all iterations' wall time / iterations, mean over ranks",
                },
                "nodes": ctx.num_nodes,
                "backend": ctx.backend,
                "device_type": ctx.device.type,
                "hostnames": sorted(set(ctx.hostnames)),
                "started_at": started_at,
                "ended_at": utc_now(),
                "versions": hardware.software_versions(),
                "scheduler": schedulers.current().job_facts(os.environ),
                "results": rows,
            },
        )
        for row in rows:
            print(
                f"{row['size_bytes']:>12} B  {row['time_us_median']:>12.1f} us  algbw {row['algbw_gbps']:8.3f} GB/s  busbw {row['busbw_gbps']:8.3f} GB/s"
                f"  (nccl-tests' time {row['nccl_tests_time_us']:.1f} us, busbw {row['nccl_tests_busbw_gbps']:.3f} GB/s)",
                flush=True,
            )
    distributed.finish(ctx, clean=True)
    return 0


if __name__ == "__main__":
    distributed.leave(main())
