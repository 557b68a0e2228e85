"""Reading torch.profiler's Chrome trace and the operator table the trainer writes beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.profiles.intervals import COLLECTIVE_OP, NCCL_KERNEL, TOP_KERNELS, ProfileError, Timeline, subtract, union
from scalerepro.common.range_names import RANGE_PREFIX

# --------------------------------------------------------------------------------------------
# torch.profiler fallback: the Chrome trace and the operator table
# --------------------------------------------------------------------------------------------


def read_torch_trace(path: str | os.PathLike[str]) -> Timeline:
    """The fallback's Chrome trace (``export_chrome_trace``; times in microseconds). With CUDA
    kernels in it, kernels are compute and NCCL kernels communication, as with nsys. On a CPU, the
    training thread's operators outside data loading are compute and the collective ops (gloo's,
    on its own threads) are communication: host-side figures, labelled so."""
    path = Path(path)
    try:
        events = json.loads(path.read_text())["traceEvents"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ProfileError(f"{path}: not a Chrome trace from torch.profiler ({error})") from None
    spans = pd.DataFrame(
        [
            {"name": e["name"], "cat": e.get("cat", ""), "tid": e.get("tid"), "start": e["ts"] * 1e-6, "end": (e["ts"] + e["dur"]) * 1e-6}
            for e in events
            if e.get("ph") == "X" and "dur" in e and "ts" in e
        ],
        columns=["name", "cat", "tid", "start", "end"],
    )
    steps = spans[spans["name"].eq(RANGE_PREFIX + "step")]
    if steps.empty:
        raise ProfileError(f"{path}: no {RANGE_PREFIX}step range: the trace does not come from the trainer's profiling window")
    window = (steps["start"].min(), steps["end"].max())
    data = spans[spans["name"].eq(RANGE_PREFIX + "data")]
    data_wait = list(zip(data["start"], data["end"]))
    kernels = spans[spans["cat"].eq("kernel")]
    if len(kernels):
        # the step ranges are host time; the profiler stops after a synchronize, so every kernel in
        # the trace from the first step on belongs to the window, and the window ends with the last
        window = (window[0], max(window[1], kernels.loc[kernels["start"] >= window[0], "end"].max()))
    if len(kernels):
        source, calls_frame = "torch.profiler (CUDA kernels)", kernels
        is_comm = kernels["name"].str.match(NCCL_KERNEL)
    else:
        main = steps["tid"].iloc[0]
        collectives = spans[spans["name"].str.match(COLLECTIVE_OP)]
        ops = spans[spans["cat"].eq("cpu_op") & spans["tid"].eq(main) & ~spans["name"].str.match(COLLECTIVE_OP)]
        ops = ops[~ops["name"].str.startswith("c10d::")]  # the collective's launch, not its work
        # outermost operators only: nested ones would count their parents' time twice in the sums
        outer = union(zip(ops["start"], ops["end"]))
        starts = {s for s, _ in outer}
        top_level = ops[ops["start"].isin(starts)].drop_duplicates("start")
        calls_frame = pd.concat([top_level, collectives])
        is_comm = calls_frame["name"].str.match(COLLECTIVE_OP)
        source = "torch.profiler (CPU operators)"
    spans_list = list(zip(calls_frame["start"], calls_frame["end"]))
    compute = [span for span, comm in zip(spans_list, is_comm) if not comm]
    if source.endswith("CPU operators)"):
        compute = subtract(compute, data_wait)  # the DataLoader's own ops are input, not compute
    return Timeline(
        source=source,
        rank="rank 0",
        window=window,
        steps=len(steps),
        compute=compute,
        communication=[span for span, comm in zip(spans_list, is_comm) if comm],
        data_wait=data_wait,
        calls=pd.DataFrame(
            {
                "name": calls_frame["name"].to_numpy(),
                "kind": is_comm.map({True: "communication", False: "compute"}).to_numpy(),
                "duration_s": (calls_frame["end"] - calls_frame["start"]).to_numpy(),
                "start": calls_frame["start"].to_numpy(),
                "end": calls_frame["end"].to_numpy(),
            }
        ),
        window_label=f"{len(steps)} {RANGE_PREFIX}step ranges" + (", to the end of their last kernel" if len(kernels) else ""),
    )


def read_operator_table(path: str | os.PathLike[str], count: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The fallback's operators.csv (``scalerepro.telemetry.ranges``): the ``count`` operators with the
    most self time (device time first, where there is any)."""
    table = pd.read_csv(path)
    ranked = table.sort_values(["self_device_time_total_us", "self_cpu_time_total_us"], ascending=False).head(count)
    return ranked.to_dict("records")
