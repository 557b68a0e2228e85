"""Where a study's files lie, and the one rule by which every reader finds a run's record.

The workflow writes a study into one folder, ``results/`` beside the Snakefile: the matrix at
``results/tables/matrix.csv`` names each run's record as ``results/runs/<run>/record.json``,
relative to the folder that holds ``results/``. A study is read again later from wherever it was
copied and whatever its folder is now called (``rebuild --results``, ``store append``,
``predict --study``): its records are then the ones *inside that folder*. Resolving the matrix's
path against the working directory, or against the folder's parent, reads whatever lies there
(another study's ``results/`` beside this one), so that is never done: a recorded path whose first
part is ``results`` names the study folder itself, a relative path is inside it, and a path that
lands outside it is refused (``OutsideStudy``).

Standard library only: the planner writes these paths, the analysis reads them.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

# The study folder as the workflow names it, and each run's record inside it (the train rule's
# output: {run} is its wildcard).
RESULTS_DIR = "results"
RUN_RECORD = f"{RESULTS_DIR}/runs/{{run}}/record.json"
# the training job's own account beside it (its wall time: scalerepro.launching.run_job)
RUN_JOB = f"{RESULTS_DIR}/runs/{{run}}/job.json"


def run_record(run_id: str, record_of: str = "") -> str:
    """The record a run reads, as the study names it: its own, or, where another cell of the study
    runs the same trainer run (``record_of``), that run's."""
    return RUN_RECORD.format(run=record_of or run_id)


# The profiling tables (tables/<name>.csv), written when the study profiles its runs.
PROFILING_TABLE_NAMES = ("profiling", "profiling_kernels", "profiling_roofline", "profiling_files")


class OutsideStudy(ValueError):
    """A record path of a study's matrix that does not lie inside the study's own folder."""


def study_folder_of(matrix: str | os.PathLike[str]) -> Path:
    """The study folder a matrix belongs to: the folder holding ``tables/`` where the matrix is
    ``<study>/tables/matrix.csv`` (as the workflow writes it), else the matrix's own folder."""
    matrix = Path(matrix)
    return matrix.parent.parent if matrix.parent.name == "tables" else matrix.parent


def record_file(recorded: str, study: str | os.PathLike[str]) -> Path:
    """The file a matrix's record path names, inside ``study`` (the study folder, whatever it is
    called now): ``results/runs/x/record.json`` is ``<study>/runs/x/record.json``, another
    relative path is relative to ``<study>``, an absolute one stays as it is. Raises
    OutsideStudy where the file is not inside ``study`` (through ``..``, or an absolute path
    elsewhere). The test is on the path as written, not on where links lead: a study whose
    ``runs/`` is a link to scratch storage is still read."""
    folder = Path(os.path.normpath(Path(study).absolute()))
    if os.path.isabs(recorded):
        found = Path(os.path.normpath(recorded))
    else:
        parts = PurePosixPath(recorded.replace(os.sep, "/")).parts
        found = Path(os.path.normpath(folder.joinpath(*(parts[1:] if parts[:1] == (RESULTS_DIR,) else parts))))
    if not found.is_relative_to(folder):
        raise OutsideStudy(f"{recorded} ({found}) lies outside the study folder {folder}")
    return found
