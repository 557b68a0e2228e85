"""The exposed-communication probe's order of steps (scalerepro.training.probes.probe_schedule):
its timed sync step must be the step the window times, one that follows a sync step."""

from __future__ import annotations

import pytest

from scalerepro.training.probes import PROBE_RUN, comm_probe_length, probe_schedule, sized_by_time


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


@pytest.mark.parametrize(
    ("step_s", "communicates", "expected"),
    [
        # 1.5 s at 100 ms is 15 steps: the communication probe's 5 of each kind take 13, the bucket
        # probe's 1 (and its warm-up step) 2 more; a sixth of each kind (15 + 2) would not fit
        (0.100, True, (5, 1)),
        (0.010, True, (6, 2)),  # everything asked for fits
        (0.600, True, (PROBE_RUN, 1)),  # over the budget at the floors, never under them
        (0.100, False, (0, 2)),  # one rank: no all-reduce to probe, the budget goes to the buckets
    ],
)
def test_the_probes_take_as_many_steps_as_fit_their_budget_and_never_fewer_than_their_floors(step_s, communicates, expected):
    sizes = sized_by_time(1.5, step_s, 6, 2, communicates)
    assert (sizes.comm_steps, sizes.bucket_steps) == expected
    cost = (comm_probe_length(sizes.comm_steps) + sizes.bucket_steps + 1) * step_s
    assert ("over" in sizes.reason) == (cost > 1.5 + 1e-9) and f"{cost:.2f} s" in sizes.reason
