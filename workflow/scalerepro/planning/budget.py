"""The study's budget: how many repeats of each cell fit a wall-time budget for the training jobs,
from what the first repeats took on the machine the study runs on.

The repeats run in rounds (scalerepro.planning.plan.Plan.train_priority): every cell's repeat 1,
then every cell's repeat 2, and so on. With ``budget.training_s`` set, the workflow runs the
rounds that run whatever they cost (``budget.min_repeats``, the floor: an interval needs two
repeats), then its ``study_budget`` checkpoint calls ``choose_repeats`` on those jobs' wall times
(each job's ``job.json``, written by scalerepro.launching.run_job), and only the rounds that fit
are run, planned (matrix.csv) and reported. A later round's cost is predicted from the last
measured one: each of its jobs costs what the same cell's last measured repeat took, less the
probes after its window (``probes_s`` in job.json; under a budget only repeat 1 runs them,
scalerepro.planning.study). Round 1 is no guide where a later round can be measured: it
carries the study's one-off start-up, which a later round does not pay (in a README study the
first job took 2.1 s beyond its record's own span, its later repeats 0.4 s). With
``min_repeats: 1`` round 1 is all there is to predict from, and the prediction errs high by that
start-up. On a slow machine the floor exceeds the budget, and the choice says by how much; a
faster machine may finish under it.

Standard library only (the checkpoint runs in the analysis environment).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BudgetError(ValueError):
    """The round-1 jobs' wall times cannot be read or do not match the plan."""


@dataclass(frozen=True)
class PlannedJob:
    """A training job of the plan: a run that runs itself (a row that reads another cell's record
    costs nothing), its cell, and its repeat (its round)."""

    run_id: str
    cell: str
    repeat: int


@dataclass(frozen=True)
class JobWall:
    """One training job's account (``job.json``): its wall seconds, and those its probes took."""

    wall_s: float
    probes_s: float = 0.0

    @property
    def without_probes_s(self) -> float:
        """What the job would take with its probes off: a later repeat's predicted cost."""
        return max(self.wall_s - self.probes_s, 0.0)


def read_job_wall(path: str | os.PathLike[str]) -> tuple[str, JobWall]:
    """The run and the account of one training job, from the ``job.json`` its run_job wrote (a
    job.json from before ``probes_s`` counts its probes as none)."""
    try:
        job = json.loads(Path(path).read_text())
        return str(job["run"]), JobWall(float(job["wall_s"]), float(job.get("probes_s") or 0.0))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BudgetError(f"{path}: not a training job's job.json ({error}): rerun the job with snakemake --forcerun {path}") from None


def floor_rounds(repeats: Iterable[int], min_repeats: int) -> int:
    """The rounds that run whatever they cost: ``min_repeats``, or every planned one where fewer."""
    return min(min_repeats, max(repeats, default=0))


def choose_repeats(jobs: Sequence[PlannedJob], walls_s: Mapping[str, JobWall], training_s: float, min_repeats: int) -> dict[str, Any]:
    """The repeats the budget allows, and why: the most rounds whose training time (the floor's
    rounds as measured, each later job at its cell's last measured repeat less that job's probes)
    is within ``training_s``, and at least the floor (``floor_rounds``)."""
    planned = max((job.repeat for job in jobs), default=0)
    floor = floor_rounds((job.repeat for job in jobs), min_repeats)
    measured = sorted((job for job in jobs if job.repeat <= floor), key=lambda job: job.repeat)
    missing = sorted(job.run_id for job in measured if job.run_id not in walls_s)
    if missing:
        raise BudgetError(f"no wall time for the measured jobs {', '.join(missing)}: the checkpoint needs each one's job.json")
    basis = {job.cell: job for job in measured}  # each cell's last measured repeat
    orphans = sorted(job.run_id for job in jobs if job.cell not in basis)
    if orphans:
        raise BudgetError(f"{', '.join(orphans)}: a repeat of a cell with no measured repeat to predict its cost from")

    def cost_s(job: PlannedJob) -> float:
        """A measured job as it took; a later one at what its cell's last measured repeat took less its probes."""
        return walls_s[job.run_id].wall_s if job.repeat <= floor else walls_s[basis[job.cell].run_id].without_probes_s

    rounds_s = [round(sum(cost_s(job) for job in jobs if job.repeat == r), 3) for r in range(1, planned + 1)]
    cumulative = [round(sum(rounds_s[:r]), 3) for r in range(1, planned + 1)]
    fits = max((r for r in range(1, planned + 1) if cumulative[r - 1] <= training_s), default=0)
    repeats = max(fits, floor)
    if not planned:
        reason = "no training job is planned"
    elif repeats == planned and fits == planned:
        reason = f"all {planned} planned repeats fit: about {cumulative[-1]:.0f} s of training in the {training_s:.0f} s budget"
    elif fits >= floor:
        reason = (
            f"{repeats} of {planned} planned repeats: about {cumulative[repeats - 1]:.0f} s of training; "
            f"repeat {repeats + 1} would take it to about {cumulative[repeats]:.0f} s, over the {training_s:.0f} s budget"
        )
    else:
        reason = (
            f"{repeats} of {planned} planned repeats, the floor (budget.min_repeats): "
            f"about {cumulative[repeats - 1]:.0f} s of training, over the {training_s:.0f} s budget"
        )
    return {
        "training_budget_s": training_s,
        "min_repeats": min_repeats,
        "planned_repeats": planned,
        "repeats": repeats,
        "measured_rounds": floor,
        "measured_jobs": len(measured),
        "measured_s": cumulative[floor - 1] if floor else 0.0,
        # each round's training time: the floor's rounds measured, the later ones predicted from the last of them
        "rounds_s": rounds_s,
        "predicted_training_s": cumulative[repeats - 1] if repeats else 0.0,
        "over_budget": bool(repeats) and cumulative[repeats - 1] > training_s,
        "reason": reason,
        "measured_walls_s": {job.run_id: walls_s[job.run_id].wall_s for job in measured},
        "measured_probes_s": {job.run_id: walls_s[job.run_id].probes_s for job in measured},
    }


def write_choice(
    jobs: Iterable[Mapping[str, Any]], job_files: Iterable[str | os.PathLike[str]], training_s: float, min_repeats: int, out: str | os.PathLike[str]
) -> dict[str, Any]:
    """The checkpoint's program: read the measured jobs' ``job.json`` files, choose, write ``out``."""
    planned = [PlannedJob(str(job["run_id"]), str(job["cell"]), int(job["repeat"])) for job in jobs]
    walls = dict(read_job_wall(path) for path in job_files)
    choice = choose_repeats(planned, walls, training_s, min_repeats)
    Path(out).write_text(json.dumps(choice, indent=2) + "\n")
    return choice


def read_choice(path: str | os.PathLike[str]) -> int:
    """The repeats a written choice allows (what the workflow's input functions plan with)."""
    try:
        return int(json.loads(Path(path).read_text())["repeats"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise BudgetError(f"{path}: not the study budget's choice ({error}): delete it and run the workflow again") from None


def rows_within(rows: Sequence[Mapping[str, Any]], choice: str | os.PathLike[str] | None) -> tuple[list[Mapping[str, Any]], str]:
    """The matrix rows of the rounds a written choice keeps (all without one), and a note of what
    it left out for the log."""
    if choice is None:
        return list(rows), ""
    repeats = read_choice(choice)
    kept = [row for row in rows if int(row["repeat"]) <= repeats]
    return kept, f" (the budget's {repeats} repeats a cell: {len(rows) - len(kept)} planned runs left out)"
