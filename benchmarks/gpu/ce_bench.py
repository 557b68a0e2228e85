"""What GPT-2's loss costs per step at batch 32 x 1024 on the GPU: F.cross_entropy over the
32,768 x 50,304 logits under bf16 autocast, eager (the trainer before issue 13) against compiled
(what --compile does now: scalerepro.training.objective.ModelWithLoss puts the loss in the compiled region).
CUDA events around 10 fwd+bwd after 3 warm-ups; random logits and targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    raise SystemExit("ce_bench: needs CUDA (skipped)")
logits = torch.randn(32 * 1024, 50304, device="cuda", dtype=torch.bfloat16, requires_grad=True)
targets = torch.randint(0, 50257, (32 * 1024,), device="cuda")


def loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(x, t)


for label, fn in (("eager", loss), ("torch.compile", torch.compile(loss))):
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fn(logits, targets).backward()
        logits.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fn(logits, targets).backward()
        logits.grad = None
    end.record()
    torch.cuda.synchronize()
    print(
        f"GPT-2 loss fwd+bwd, 32768 x 50304 logits, {label}: {start.elapsed_time(end) / 10:.1f} ms/step, "
        f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )
