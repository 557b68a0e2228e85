"""Slurm node lists, without torch: the launcher (``scalerepro.launch``) runs before any rank
and must start fast, and the process-group setup (``scalerepro.distributed``) reads the same lists."""

from __future__ import annotations

import re


def first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression, e.g. ``gpu[007-010,012],login1`` -> ``gpu007``.

    Slurm's ``scontrol show hostnames`` does this too, but it is not on every compute node's PATH
    inside containers; the first host needs only the prefix and the first number of the first range.
    """
    match = re.match(r"^([^\[,]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"cannot parse the Slurm node list {nodelist!r}")
    prefix, ranges = match.groups()
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first  # keeps zero padding: "007" stays "007"
