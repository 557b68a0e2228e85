"""ResNet-50's step time against the per-GPU batch, for the scaling model's small-batch curve (issue 38).

The scaling model takes compute time as proportional to the per-GPU batch; MLPerf's 64-GPU ResNet-50
run holds 50 images a GPU, where an H100 is underfilled and the fixed per-step cost does not shrink
(benchmarks/README.md, predict_published.py's one miss). This measures that curve on one GPU.

A bare loop, no scalerepro code but the model's definition and its loss: the optimised preset's
settings written out (bf16 autocast, channels_last, cudnn.benchmark, torch.compile with CUDA graphs,
fused SGD, one fixed batch resident on the device). Each batch is compiled for its own static shape,
as the trainer compiles its one batch; the batch the trainer's frontier ran (256) is measured too,
and the bare loop's figure there against the trainer's record is this curve's calibration. On an
H100 on 2026-11-27, one compilation with the batch marked dynamic (``--dynamic``: one cold compile
for every batch) ran 24.5 % slower than the trainer at 256 (benchmarks/README.md, round 3), so it
does not calibrate; static shapes cost a compile a batch. Step time: CUDA events around each step,
median and p10-p90 over a window of at least --window-s seconds after --warmup steps at that batch.

    python benchmarks/gpu/batch_curve.py [--batches 400 200 100 50 256] [--window-s 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow"))
from scalerepro.models import registry  # noqa: E402
from scalerepro.training.objective import ModelWithLoss  # noqa: E402


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=10)[int(q * 10) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batches", type=int, nargs="+", default=[400, 200, 100, 50, 256])
    parser.add_argument("--warmup", type=int, default=10, help="steps at each batch before its window")
    parser.add_argument("--window-s", type=float, default=2.0)
    parser.add_argument("--compile", default="reduce-overhead", help="torch.compile mode, or none")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dynamic", action="store_true", help="one compile with the batch dimension dynamic (faster to compile, slower to run)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = True
    spec = registry.resolve(args.model)
    model = ModelWithLoss(registry.build(spec), 0.0).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=cuda or None)
    # static: a recompile for each batch (the batches must stay under dynamo's recompile limit, 8)
    forward = torch.compile(model, mode=args.compile, dynamic=args.dynamic) if args.compile != "none" else model
    started = time.perf_counter()
    rows = []
    for batch in args.batches:
        images = torch.randn(batch, 3, spec.image_size, spec.image_size, device=device).to(memory_format=torch.channels_last)
        labels = torch.randint(0, spec.num_classes, (batch,), device=device)
        if args.dynamic:
            torch._dynamo.mark_dynamic(images, 0)
            torch._dynamo.mark_dynamic(labels, 0)

        def step() -> None:
            with torch.autocast(device.type, torch.bfloat16):
                loss = forward((images,), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(args.warmup):
            step()
        if cuda:
            torch.cuda.synchronize()
        times: list[float] = []
        window_start = time.perf_counter()
        while time.perf_counter() - window_start < args.window_s or len(times) < 5:
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                step()
                end.record()
                end.synchronize()  # one step at a time: each time is that step's alone
                times.append(begin.elapsed_time(end) / 1e3)
            else:
                begin_s = time.perf_counter()
                step()
                times.append(time.perf_counter() - begin_s)
        median = statistics.median(times)
        row = {
            "batch": batch,
            "steps": len(times),
            "step_s_median": median,
            "step_s_p10": quantile(times, 0.1),
            "step_s_p90": quantile(times, 0.9),
            "samples_per_s": batch / median,
            "elapsed_s": time.perf_counter() - started,
        }
        rows.append(row)
        print(
            f"CURVE {args.model} batch {batch:>4}: step {median * 1e3:8.2f} ms (p10-p90 {row['step_s_p10'] * 1e3:.2f}-"
            f"{row['step_s_p90'] * 1e3:.2f}, n={len(times)}) = {batch / median:,.0f} img/s, "
            f"{median / batch * 1e3:.3f} ms/image [{time.perf_counter() - started:.0f} s]",
            flush=True,
        )
    # the fixed cost a step pays whatever its batch: the intercept of a least-squares line through
    # (batch, step time); its slope is the time an image adds
    xs, ys = [r["batch"] for r in rows], [r["step_s_median"] for r in rows]
    fit = statistics.linear_regression(xs, ys) if len(set(xs)) > 1 else None
    if fit:
        print(f"CURVE fit: step = {fit.intercept * 1e3:.2f} ms + {fit.slope * 1e3:.4f} ms x batch")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    result = {
        "model": args.model,
        "device": name,
        "torch": torch.__version__,
        "compile": args.compile,
        "shapes": "dynamic" if args.dynamic else "static",
        "rows": rows,
        "fit": {"intercept_s": fit.intercept, "slope_s_per_sample": fit.slope} if fit else None,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
