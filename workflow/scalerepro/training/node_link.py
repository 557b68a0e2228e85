"""The prescreen's measurement of one link: an all-reduce across two nodes, the reference node and
another, with every rank of each, launched exactly like training (``scalerepro.launching.launch``:
torchrun locally, srun and torchrun on a cluster; NCCL on GPUs, gloo on CPUs). Rank 0 writes one
``LinkCheck`` record (``scalerepro.record.node_check``).

    python -m scalerepro.launching.launch --nodes=2 ... -- -m scalerepro.training.node_link \\
        --out results/prescreen/links/<reference>/<node>.json --peer <node> --reference <reference>

One message size, large enough that bandwidth, not latency, sets its time (256 MiB on GPUs, 64 MiB
on CPUs), timed as ``scalerepro.training.commbench`` times every size: the slowest rank's median of
single all-reduces; busbw = S / t x 2 (n - 1) / n (nccl-tests' bus bandwidth).
"""

from __future__ import annotations

from scalerepro.common.cli import CommandError, OneLineErrorParser, bounded_float, bounded_int, error_boundary, output_path
from scalerepro.common.files import utc_now, write_json_atomically
from scalerepro.record.node_check import LinkCheck
from scalerepro.training import commbench, distributed

_PROG = "scalerepro.training.node_link"
GPU_LINK_BYTES = 256 << 20
CPU_LINK_BYTES = 64 << 20


class NodeLinkError(CommandError):
    """A link check that cannot measure a link: one line naming why and the fix."""


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_path, help="the link's record (JSON), written by rank 0")
    # not --node: torchrun, which passes these on, takes any prefix of its --node-rank as its own
    parser.add_argument("--peer", required=True, help="the node whose link to the reference this is")
    parser.add_argument("--reference", required=True, help="the reference node")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--iterations", type=bounded_int(1, 10_000), default=10, help="timed all-reduces (default: %(default)s)")
    parser.add_argument("--dist-timeout-s", type=bounded_float(1, 3600), default=300.0)
    args = parser.parse_args(argv)
    started_at = utc_now()
    try:
        ctx = distributed.setup(args.device, args.dist_timeout_s)
    except distributed.DistributedSetupError as error:
        raise NodeLinkError(str(error)) from None
    if ctx.num_nodes < 2:
        raise NodeLinkError(
            f"the ranks ran on {ctx.num_nodes} node ({', '.join(sorted(set(ctx.hostnames)))}): a link needs two; launch it with --nodes=2 on {args.reference} and {args.peer}"
        )
    size = GPU_LINK_BYTES if ctx.device.type == "cuda" else CPU_LINK_BYTES
    (row,) = commbench.run(ctx, [size], args.iterations, warmup=2)
    if ctx.is_main:
        check = LinkCheck(
            schema_version=1,
            node=args.peer,
            reference=args.reference,
            hostnames=sorted(set(ctx.hostnames)),
            started_at=started_at,
            ranks=ctx.world_size,
            backend="nccl" if ctx.backend == "nccl" else "gloo",
            size_bytes=size,
            busbw_gbps=row["busbw_gbps"],
            time_s=row["time_us_median"] / 1e6,
        )
        write_json_atomically(args.out, check.model_dump(mode="json"))
        print(f"{args.reference} <-> {args.peer}: all-reduce busbw {check.busbw_gbps:.3g} GB/s ({check.ranks} ranks, {check.backend})", flush=True)
    distributed.finish(ctx, clean=True)
    return 0


if __name__ == "__main__":
    distributed.leave(main())
