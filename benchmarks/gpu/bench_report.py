"""The rows of ``benchmarks/trainer_throughput.py --json`` files against issue 51's one-H100 goals:
value, goal met or by how much missed, MFU, median step time with its p10-p90 over the measured
steps, peak memory, optimised/baseline where both ran, the first step's wall time (the compile:
cold, or warm from a compile cache) and, where the steps were profiled, the GPU's idle share and
the longest kernel.

    python bench_report.py BENCH_JSON..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOALS = {  # model: (figure, goal on one H100 (issue 51), unit)
    "resnet50": ("samples_per_s", 7300, "img/s"),
    "resnet18_cifar": ("samples_per_s", 90000, "img/s"),
    "gpt2_small": ("tokens_per_s", 520000, "tok/s"),
    "bert_base": ("samples_per_s", 6000, "seq/s"),
    "vit_b_16": ("samples_per_s", 4000, "img/s"),
    "llama_1b": ("tokens_per_s", 68000, "tok/s"),
}
failed = 0
for path in sys.argv[1:]:
    document = json.loads(Path(path).read_text())
    flags = " ".join(document.get("flags") or []) or "preset as is"
    for model, runs in document["results"].items():
        key, goal, unit = GOALS.get(model, ("samples_per_s", None, "samples/s"))
        baseline = runs.get("baseline") or {}
        for config, run in runs.items():
            if not run.get("ok"):
                print(f"BENCH {model:15s} {config} FAILED: {run.get('error')}")
                failed += 1
                continue
            value, mfu = run[key] or 0.0, run["mfu"]
            verdict = "no goal" if goal is None else ("MEETS" if value >= goal else f"MISSES, {value / goal:.0%} of") + f" goal {goal:,}"
            ratio = f", {run['samples_per_s'] / baseline['samples_per_s']:.2f}x the baseline" if config != "baseline" and baseline.get("ok") else ""
            spread = f"p10-p90 {1e3 * run['step_p10_s']:.1f}-{1e3 * run['step_p90_s']:.1f}, n={run['measured_steps']}" if "step_p10_s" in run else ""
            first = run.get("first_step_s")
            cache = "not compiled" if run.get("compile_scope") is None else "warm from the cache" if run.get("compile_cache_loaded") else "cold"
            compiled = "" if first is None else f" first step {first:.1f} s ({cache})"
            top = (run.get("top_kernels") or [{}])[0]
            idle = run.get("idle_fraction")
            profiled = (
                ""
                if not top
                else f" over {run['profiled_steps']} profiled steps GPU idle {'n/a' if idle is None else f'{100 * idle:.1f}%'}, "
                f"longest {top['name'][:60]} {1e3 * top['time_s']:.1f} ms"
            )
            print(
                f"BENCH {model:15s} {config:9s} [{flags}] batch {run['batch']:4d}: {value:12,.0f} {unit} ({verdict}) "
                f"MFU {'n/a' if mfu is None else f'{100 * mfu:.1f}%'} step {1e3 * run['step_median_s']:.1f} ms ({spread}) "
                f"peak {run['peak_memory_bytes'] / 2**30:.1f} GiB ({run['memory_kind']}){ratio}{compiled}{profiled} [{document['device']}]"
            )
raise SystemExit(1 if failed else 0)
