"""The study's budget: how many rounds of repeats fit, from what the floor's rounds took (scalerepro.planning.budget).
The checkpoint that runs it inside the workflow is tested on the CI study (test_workflow.py)."""

from __future__ import annotations

import json

import pytest

from scalerepro.planning.budget import BudgetError, JobWall, PlannedJob, choose_repeats, read_choice, read_job_wall, rows_within, write_choice


def _jobs(cells: dict[str, int]) -> list[PlannedJob]:
    """Every repeat of each cell (cell -> its repeats)."""
    return [PlannedJob(f"{cell}_r{r}", cell, r) for cell, repeats in cells.items() for r in range(1, repeats + 1)]


# the floor's two rounds as measured: round 1 with the study's one-off start-up (the first job
# 5 s slower) and the probes of repeat 1, round 2 as a later round runs; a slow cell (30 s), a
# quick one (10 s) and one run once (5 s, as the parallelism cells are), so a later round costs 40 s
CELLS = {"strong_g2": 4, "weak_g1": 4, "parallel_fsdp": 1}
WALLS = {
    "strong_g2_r1": JobWall(36.0, 1.0),
    "weak_g1_r1": JobWall(10.0),
    "parallel_fsdp_r1": JobWall(5.0),
    "strong_g2_r2": JobWall(30.0),
    "weak_g1_r2": JobWall(10.0),
}


@pytest.mark.parametrize(
    ("training_s", "repeats", "over"),
    [
        (171.0, 4, False),  # 51 + 40 + 40 + 40: all four fit exactly
        (170.9, 3, False),  # the fourth would take it to 171 s
        (131.0, 3, False),
        (130.9, 2, False),
        (91.0, 2, False),
        (90.9, 2, True),  # the floor of two, over budget
        (1.0, 2, True),
    ],
)
def test_the_budget_keeps_the_rounds_that_fit_and_the_floor_whatever_they_cost(training_s, repeats, over):
    choice = choose_repeats(_jobs(CELLS), WALLS, training_s, min_repeats=2)
    assert choice["repeats"] == repeats and choice["over_budget"] is over
    # the floor's rounds measured, each later round predicted from its cells' repeat 2: the
    # once-run cell costs nothing after round 1
    assert choice["rounds_s"] == [51.0, 40.0, 40.0, 40.0] and choice["measured_s"] == 91.0
    assert choice["measured_rounds"] == 2 and choice["measured_jobs"] == 5
    assert choice["predicted_training_s"] == [51.0, 91.0, 131.0, 171.0][repeats - 1]
    assert choice["planned_repeats"] == 4 and f"{repeats}" in choice["reason"]


def test_a_later_round_is_predicted_from_the_last_measured_one_not_round_ones_start_up():
    """Round 1 carries the study's one-off start-up and repeat 1's probes; round 2, which the
    floor runs anyway, is what a later round costs. Predicted from round 1 (less its probes) a
    later round would cost 45 s: three rounds in 180 s where four fit (51 + 3 x 40 = 171)."""
    choice = choose_repeats(_jobs(CELLS), WALLS, 180.0, min_repeats=2)
    assert choice["repeats"] == 4 and choice["rounds_s"][2:] == [40.0, 40.0]
    assert choice["measured_walls_s"] == {run: wall.wall_s for run, wall in WALLS.items()}
    assert choice["measured_probes_s"]["strong_g2_r1"] == 1.0


def test_with_a_floor_of_one_a_later_round_is_round_one_less_its_probes():
    """Under a budget only repeat 1 runs the probes after its window (scalerepro.planning.study):
    with min_repeats 1 a later round costs round 1's jobs less their probes (job.json's probes_s).
    Counted in full, 12 s of probes a job would have predicted 64 s a later round."""
    walls = {"strong_g2_r1": JobWall(30.0, 12.0), "weak_g1_r1": JobWall(10.0, 2.0), "parallel_fsdp_r1": JobWall(5.0, 1.0)}
    choice = choose_repeats(_jobs({"strong_g2": 3, "weak_g1": 3, "parallel_fsdp": 1}), walls, 100.0, min_repeats=1)
    assert choice["rounds_s"] == [45.0, 26.0, 26.0] and choice["repeats"] == 3 and choice["predicted_training_s"] == 97.0
    assert choice["measured_rounds"] == 1 and choice["measured_probes_s"] == {"strong_g2_r1": 12.0, "weak_g1_r1": 2.0, "parallel_fsdp_r1": 1.0}


def test_a_floor_above_the_planned_repeats_keeps_the_plan():
    """min_repeats 2 where every cell runs once: one round, which is all there is."""
    choice = choose_repeats(_jobs({"a": 1, "b": 1}), {"a_r1": JobWall(3.0), "b_r1": JobWall(4.0)}, 1.0, min_repeats=2)
    assert choice["repeats"] == 1 and choice["planned_repeats"] == 1 and choice["over_budget"]


def test_the_budget_refuses_a_measured_job_without_its_wall_time():
    with pytest.raises(BudgetError, match="weak_g1_r2"):
        choose_repeats(_jobs(CELLS), {k: v for k, v in WALLS.items() if k != "weak_g1_r2"}, 100.0, 2)


def test_a_job_json_that_is_not_one_is_refused_with_its_path_and_the_fix(tmp_path):
    path = tmp_path / "job.json"
    path.write_text("{not json")
    with pytest.raises(BudgetError, match=r"job\.json: not a training job's job\.json .*--forcerun"):
        read_job_wall(path)
    path.write_text(json.dumps({"run": "a_r1"}))
    with pytest.raises(BudgetError, match="wall_s"):
        read_job_wall(path)


def test_the_choice_written_is_read_back_and_keeps_the_matrix_rows_of_its_rounds(tmp_path):
    files = []
    for run, wall in WALLS.items():
        files.append(tmp_path / f"{run}.json")
        files[-1].write_text(json.dumps({"run": run, "wall_s": wall.wall_s, "launcher_exit": 0, "probes_s": None}))
    jobs = [{"run_id": j.run_id, "cell": j.cell, "repeat": j.repeat} for j in _jobs(CELLS)]
    out = tmp_path / "budget.json"
    written = write_choice(jobs, files, 131.0, 2, out)
    assert read_choice(out) == written["repeats"] == 3
    rows = [{"run_id": j["run_id"], "repeat": j["repeat"]} for j in jobs]
    kept, why = rows_within(rows, out)
    assert [row["run_id"] for row in kept] == ["strong_g2_r1", "strong_g2_r2", "strong_g2_r3", "weak_g1_r1", "weak_g1_r2", "weak_g1_r3", "parallel_fsdp_r1"]
    assert "2 planned runs left out" in why
    assert rows_within(rows, None) == (rows, "")
    out.write_text("[]")
    with pytest.raises(BudgetError, match="not the study budget's choice"):
        read_choice(out)


def test_a_study_that_plans_no_training_job_chooses_none_and_says_so():
    choice = choose_repeats([], {}, 60.0, min_repeats=2)
    assert choice["repeats"] == choice["planned_repeats"] == 0 and choice["rounds_s"] == [] and not choice["over_budget"]
    assert choice["reason"] == "no training job is planned"
