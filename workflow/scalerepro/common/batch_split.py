"""How one GPU's share of a strong-scaling global batch runs: the one rule the planner schedules by
and the scaling model predicts by (integers only: no GPU trains a fraction of a sample)."""

from __future__ import annotations

import math


class BatchSplitError(ValueError):
    """A global batch that has no split over the GPUs asked for."""


def strong_split(global_batch: int, gpus: int, max_micro_batch: int) -> tuple[int, int]:
    """(micro-batch per GPU, accumulation steps) of a global batch G over N GPUs.

    share = G / N must be whole; it runs as the fewest micro-batches of at most ``max_micro_batch``
    that divide it evenly: accumulation = the smallest a >= ceil(share / max_micro_batch) dividing
    share, micro-batch = share / a. G = 96 over 2 GPUs at most 32 a micro-batch: share 48, a = 2,
    two micro-batches of 24."""
    if global_batch % gpus:
        raise BatchSplitError(f"the global batch {global_batch} does not split evenly over {gpus} GPUs")
    share = global_batch // gpus
    steps = next(a for a in range(math.ceil(share / max_micro_batch), share + 1) if share % a == 0)
    return share // steps, steps
