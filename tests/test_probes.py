"""The exposed-communication probe's order of steps (scalerepro.training.probes.probe_schedule):
its timed sync step must be the step the window times, one that follows a sync step."""

from __future__ import annotations

import pytest

from scalerepro.training.probes import PROBE_RUN, probe_schedule


@pytest.mark.parametrize("steps", [1, 2, PROBE_RUN, 6, 10])
def test_every_timed_sync_step_follows_a_sync_step(steps):
    schedule = probe_schedule(steps)
    assert schedule[0] == (False, False)  # a warm-up step, untimed
    assert sum(1 for sync, timed in schedule if timed and sync) == steps
    assert sum(1 for sync, timed in schedule if timed and not sync) == steps
    for (before, _), (sync, timed) in zip(schedule, schedule[1:]):
        if sync and timed:
            assert before, schedule  # after a no-sync step it would time the ranks' drift as communication
    # the kinds alternate in short runs, so that a burst of load falls on both
    longest, run = 0, 0
    for (before, _), (sync, _) in zip(schedule, schedule[1:]):
        run = run + 1 if sync == before else 0
        longest = max(longest, run + 1)
    assert longest <= PROBE_RUN + 1
