"""SIGTERM to the workflow's driver (Snakemake) stops it as Snakemake means to, never hangs it.

Snakemake 9's scheduler answers SIGTERM with a graceful stop (no new job; the running ones
finish): its handler takes the scheduler's lock, a ``threading.Lock``, which the main thread
holds while it finishes jobs. A handler runs in the main thread, so a SIGTERM that arrives while
the main thread holds the lock waits for it forever. A checkpoint widens that window: finishing
one re-evaluates the DAG under the lock (after the study budget's ``study_budget``: under a
second on a 2-core Xeon, longer on a slower machine), and a driver stopped there by ``kill``,
``timeout`` or the end of the batch job that runs it never exits (the suite's two-drivers test
hung 120 s on it in CI).

``run_stop_handler_off_the_main_thread`` replaces the handler with one that runs Snakemake's in a
thread of its own: that thread waits for the lock while the main thread finishes what it holds
it for, and then the stop is what Snakemake would have made of it. The workflow's ``onstart``
hook calls it; the scheduler installs its handler before the hook runs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def run_stop_handler_off_the_main_thread(signum: int = signal.SIGTERM) -> bool:
    """Run the handler now installed for ``signum`` in a new thread each time the signal comes;
    False (nothing changed) where the handler is not Python's (the default or ignored)."""
    handler = signal.getsignal(signum)
    if not callable(handler):
        return False

    def in_a_thread(received: int, frame: FrameType | None) -> None:
        # daemon: a driver that exits meanwhile does not wait for a stop it no longer needs
        threading.Thread(target=handler, args=(received, frame), name=f"{signal.Signals(received).name} handler", daemon=True).start()

    signal.signal(signum, in_a_thread)
    return True
