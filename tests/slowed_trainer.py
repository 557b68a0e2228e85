"""Test only: the real trainer, with a known slowdown injected into one model's training steps.

    python tests/slowed_trainer.py PLAN.json

PLAN.json is a list of runs, run in order in this one process (one torch import for all of
them, so a test can interleave many short runs of two studies cheaply):

    [{"args": ["--model", "cnn", ...], "slowdown": {"cnn": 2.0}}, ...]

Each run is ``scalerepro.training.train.main(args)``, unchanged, with ``Trainer.train_step`` wrapped for
that run only: after every step of a model named in ``slowdown``, the wrapper waits (factor - 1)
times the time the step took, so that model's steps take ``factor`` times as long and its
samples/s falls by that factor; other models run as they are. This stands for "a trainer change
that slows one model": it lives here, never in the trainer. The wait spins on the clock rather
than sleeping: a sleeping process hands its core to other processes, which evict its caches and
make the next step slower too, so a sleep slows a loaded machine's runs by more than the factor.
Prints one JSON line per run: {"args": ..., "exit": ...}; exits 1 if any run failed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from scalerepro.training import train
from scalerepro.training.trainer import Trainer

_original_step = Trainer.train_step
_slowdown: dict[str, float] = {}


def _slowed_step(self, *args, **kwargs):
    started = time.perf_counter()
    loss = _original_step(self, *args, **kwargs)
    factor = _slowdown.get(self.config.model.model, 1.0)
    if factor > 1.0:
        until = time.perf_counter() + (factor - 1.0) * (time.perf_counter() - started)
        while time.perf_counter() < until:
            pass
    return loss


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    Trainer.train_step = _slowed_step
    failed = 0
    for run in plan:
        _slowdown.clear()
        _slowdown.update(run.get("slowdown") or {})
        code = train.main(list(run["args"]))
        failed += code != 0
        print(json.dumps({"args": run["args"], "exit": code}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
