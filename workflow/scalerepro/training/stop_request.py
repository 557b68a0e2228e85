"""The stop signals a rank honours: set a flag, let the loop stop at a step all ranks agree on."""

from __future__ import annotations

import signal


class StopRequest:
    """SIGTERM / SIGUSR1 (Slurm's preemption warning, ``--signal=USR1@...``) set a flag; the loop
    finishes the current step, checkpoints and exits with EXIT_PREEMPTED.

    Installed for the whole life of the process (``scalerepro.training.train.main``): a launcher that
    stops the ranks after a peer failed sends SIGTERM, and a rank that is still writing its
    failure record must not be killed by it half-way."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum: int, frame: object) -> None:
        self.signal_name = signal.Signals(signum).name

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
