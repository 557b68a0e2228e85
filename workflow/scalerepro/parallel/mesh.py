"""The shape of a strategy's DeviceMesh and which ranks read which data, without torch: the
trainer (scalerepro.parallel) builds the mesh from it, and the study model (scalerepro.planning.study)
reads from it how many data-parallel replicas a cell has; both take the global batch from
``global_batch``, so a cell's global batch is the one the trainer will run."""

from __future__ import annotations

from scalerepro.common.cli import CommandError

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "tp", "fsdp+tp", "pp")


class ParallelError(CommandError, ValueError):
    """A strategy that cannot apply to this model or world size; one line naming the fix."""


def mesh_shape(strategy: str, world_size: int, tp_size: int | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The DeviceMesh shape and dimension names of ``strategy`` on ``world_size`` ranks."""
    if strategy == "fsdp":
        return (world_size,), ("dp",)
    if strategy == "tp":
        return (world_size,), ("tp",)
    if strategy == "pp":
        return (world_size,), ("pp",)
    if strategy == "fsdp+tp":
        tp = tp_size or 0
        if tp < 2 or world_size % tp or world_size // tp < 2:
            raise ParallelError(
                f"--parallel fsdp+tp needs --tp-size of at least 2 dividing the {world_size} ranks into at least 2 "
                f"data-parallel groups (got --tp-size {tp_size}): use --parallel tp or fsdp alone, or change --tp-size"
            )
        return (world_size // tp, tp), ("dp", "tp")
    raise ParallelError(f"--parallel {strategy} has no device mesh here (ddp is set up by the trainer)")


def default_tp_size(strategy: str, world_size: int, ranks_per_node: int, tp_size: int | None) -> int | None:
    """--tp-size as given, else all ranks under tp and one node's ranks under fsdp+tp (TP's
    per-layer collectives stay on the fast intra-node links)."""
    if tp_size is not None:
        return tp_size
    return {"tp": world_size, "fsdp+tp": ranks_per_node}.get(strategy)


def data_parallel_coordinates(strategy: str, rank: int, world_size: int, tp_size: int | None) -> tuple[int, int]:
    """(this rank's data-parallel index, data-parallel size) before any mesh exists: the mesh is
    row-major over ranks, so under fsdp+tp rank r is in dp group r // tp; TP ranks and pipeline
    stages read the same batch."""
    if strategy in ("tp", "pp"):
        return 0, 1
    if strategy == "fsdp+tp":
        (dp, tp), _ = mesh_shape(strategy, world_size, tp_size)
        return rank // tp, dp
    return rank, world_size


def global_batch(per_gpu_batch: int, grad_accum_steps: int, data_parallel: int) -> int:
    """The samples of one optimizer step over all ranks: the trainer's, and the study model's
    figure of a cell (``data_parallel`` from data_parallel_coordinates)."""
    # global batch = micro-batch of each replica x accumulation steps x data-parallel replicas
    return per_gpu_batch * grad_accum_steps * data_parallel
