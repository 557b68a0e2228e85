"""The step's kernels (on a CPU, its operators), profiled after the probes in the run's own process."""

from __future__ import annotations

import pytest

from scalerepro.training import kernel_profile

from conftest import load_record, python_train


@pytest.mark.parametrize(
    ("intervals", "busy"),
    [
        ([], 0.0),
        ([(0.0, 2.0), (5.0, 6.0)], 3.0),  # apart: idle between them
        ([(0.0, 4.0), (1.0, 2.0)], 4.0),  # one inside another (two streams): counted once
        ([(3.0, 6.0), (0.0, 4.0)], 6.0),  # overlapping, out of order
        ([(0.0, 1.0), (1.0, 2.0)], 2.0),  # back to back
    ],
)
def test_busy_time_is_the_union_of_the_kernels_intervals(intervals, busy):
    assert kernel_profile.busy_seconds(intervals) == pytest.approx(busy)


@pytest.mark.slow
def test_a_run_records_its_steps_operators_after_the_probes_and_they_add_up_to_the_profiled_steps(tmp_path):
    args = ["--model", "cnn", "--device", "cpu", "--per-gpu-batch", "32", "--steps", "6", "--warmup-steps", "2", "--synthetic-samples", "512"]
    args += ["--no-eval", "--comm-probe-steps", "0", "--bucket-probe-steps", "1", "--num-workers", "0"]
    done = python_train([*args, "--kernel-profile-steps", "3", "--record", str(tmp_path / "profiled.json")])
    assert done.returncode == 0, done.stderr[-2000:]
    record = load_record(tmp_path / "profiled.json")
    kernels, step = record["measurements"]["step_kernels"], record["measurements"]["step_time_s"]["median"]
    assert kernels["steps"] == 3 and kernels["reason"] is None and kernels["idle_fraction"] is None  # a CPU: no device idle time
    # one thread a rank: the operators' own times fall within the profiled steps' wall time
    assert 0 < kernels["time_s"] <= kernels["wall_s"] * 1.02
    # the profiled steps are the window's steps (the profiler's overhead aside)
    assert 0.5 * step < kernels["wall_s"] / 3 < 2.0 * step, (kernels["wall_s"], step)
    convolution = next(entry for entry in kernels["kernels"] if "convolution" in entry["name"] and "backward" not in entry["name"])
    assert convolution["launches"] % 3 == 0 and kernels["launches"] == sum(entry["launches"] for entry in kernels["kernels"])

    done = python_train([*args, "--record", str(tmp_path / "plain.json")])
    assert done.returncode == 0, done.stderr[-2000:]
    off = load_record(tmp_path / "plain.json")["measurements"]["step_kernels"]
    assert off["steps"] == 0 and off["reason"] == "off (--kernel-profile-steps 0)" and off["kernels"] is None
