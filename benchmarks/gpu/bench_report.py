"""The optimised rows of ``benchmarks/trainer_throughput.py --json`` files against issue 11's
H100 goals: value, goal met or by how much missed, MFU, step time, peak memory, ratio."""

from __future__ import annotations

import json
import sys

GOALS = {  # model: (figure, goal on one H100, unit)
    "resnet50": ("samples_per_s", 5000, "img/s"),
    "resnet18_cifar": ("samples_per_s", 50000, "img/s"),
    "gpt2_small": ("tokens_per_s", 450000, "tok/s"),
    "bert_base": ("samples_per_s", 4000, "seq/s"),
    "vit_b_16": ("samples_per_s", 1500, "img/s"),
}
for path in sys.argv[1:]:
    document = json.load(open(path))
    for model, pair in document["results"].items():
        key, goal, unit = GOALS.get(model, ("samples_per_s", None, "samples/s"))
        baseline, optimised = pair.get("baseline") or {}, pair.get("optimised") or {}
        if not optimised.get("ok"):
            print(f"BENCH {model:15s} optimised FAILED: {optimised.get('error')}")
            continue
        value, mfu = optimised[key] or 0.0, optimised["mfu"]
        verdict = "no goal" if goal is None else ("MEETS" if value >= goal else f"MISSES, {value / goal:.0%} of") + f" goal {goal:,}"
        ratio = f"{optimised['samples_per_s'] / baseline['samples_per_s']:.2f}x the baseline" if baseline.get("ok") else "baseline failed"
        print(f"BENCH {model:15s} batch {optimised['batch']:4d}: {value:12,.0f} {unit} ({verdict}) "
              f"MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'} step {1e3 * optimised['step_median_s']:.1f} ms "
              f"peak {optimised['peak_memory_bytes'] / 2**30:.1f} GiB ({optimised['memory_kind']}), {ratio} [{document['device']}]")  # fmt: skip
