"""Checkpoints over usable files only: a finished run leaves none behind and a rerun measures
again; code or configuration changes, finished runs, corrupt, foreign and truncated files are
named and passed over; cleanup never lets such a file take a good checkpoint's place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from scalerepro.common import source_closure
from scalerepro.training import checkpoint_store
from scalerepro.training.train import main

from conftest import load_record

# Starts training processes, torchrun, Snakemake or a cluster: not in the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

RUN = [
    "--model",
    "cnn",
    "--steps",
    "12",
    "--warmup-steps",
    "2",
    "--per-gpu-batch",
    "16",
    "--num-workers",
    "0",
    "--synthetic-samples",
    "1024",
    "--eval-samples",
    "64",
    "--log-interval",
    "4",
]


def _run(tmp_path: Path, *extra: str, capsys=None) -> dict:
    directory = tmp_path / "ckpt"
    assert main([*RUN, "--record", str(tmp_path / "r.json"), "--checkpoint-dir", str(directory), *extra]) == 0
    return load_record(tmp_path / "r.json")


def _fingerprint(**changes) -> dict:
    return {"per_gpu_batch": 16, "seed": 0, "code": checkpoint_store.code_hash(), **changes}


def _state(**changes) -> dict:
    state = {
        "format": checkpoint_store.FORMAT_VERSION,
        "step": 4,
        "final": False,
        "model": {},
        "optimizer": {},
        "scheduler": {},
        "scaler": {},
        "progress": {},
        "rng": [],
        "fingerprint": _fingerprint(),
    }
    state.update(changes)
    return state


def test_a_finished_run_removes_its_checkpoints_once_recorded_and_a_rerun_measures_again(tmp_path):
    """The workflow's train job always passes --checkpoint-dir and --resume (so a preempted job's
    retry continues). A finished run must leave nothing a rerun would resume from."""
    first = _run(tmp_path, "--resume", "--checkpoint-interval", "4")
    assert first["status"] == "ok" and first["checkpoint"] is None
    assert checkpoint_store.list_checkpoints(tmp_path / "ckpt") == []
    rerun = _run(tmp_path, "--resume")
    assert rerun["status"] == "ok" and rerun["steps"]["resumed_from"] is None
    assert rerun["measurements"]["measured_steps"] == 10 and rerun["measurements"]["samples_per_s"] > 0


def test_a_kept_final_checkpoint_is_marked_final_and_never_resumed(tmp_path, capsys):
    first = _run(tmp_path, "--keep-final-checkpoint")
    final = Path(first["checkpoint"])
    assert final.name == "step-00000012.pt" and torch.load(final, weights_only=True)["final"] is True
    rerun = _run(tmp_path, "--keep-final-checkpoint", "--resume")
    assert rerun["steps"]["resumed_from"] is None and rerun["measurements"]["measured_steps"] == 10
    assert rerun["steps"]["checkpoints_skipped"] == [{"path": str(final), "reason": "the final checkpoint of a finished run"}]
    assert f"passing over checkpoint {final}: the final checkpoint of a finished run" in capsys.readouterr().out


def test_a_checkpoint_of_other_trainer_code_starts_the_run_fresh_and_says_so(tmp_path, capsys):
    final = Path(_run(tmp_path, "--keep-final-checkpoint")["checkpoint"])
    state = torch.load(final, weights_only=True)
    state.update(final=False, step=4)
    state["progress"]["step"] = 4
    state["fingerprint"]["code"] = "0" * 64  # as written before an edit of the trainer
    torch.save(state, final.with_name("step-00000004.pt"))
    final.unlink()
    rerun = _run(tmp_path, "--resume")
    assert rerun["steps"]["resumed_from"] is None and rerun["measurements"]["measured_steps"] == 10
    [skipped] = rerun["steps"]["checkpoints_skipped"]
    assert skipped["reason"].startswith("written by other trainer code (code hash 000000000000, now ")
    assert "starting from step 0" in capsys.readouterr().out


def test_the_code_hash_covers_what_a_rank_imports_and_nothing_else(tmp_path):
    """The checkpoint's code hash is the rank's import closure, on a copy of the real package:
    planning and analysis edits leave it (and every checkpoint's resumability) alone; an edit of
    any module the rank imports, however indirectly, changes it."""
    package = tmp_path / "scalerepro"
    shutil.copytree(Path(checkpoint_store.__file__).resolve().parents[1], package, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_closure.code_hash([source_closure.RANK_ENTRY], package)

    def edited(relative: str) -> str:
        path = package / relative
        original = path.read_text()
        path.write_text(original + "\n# an edit\n")
        try:
            return source_closure.code_hash([source_closure.RANK_ENTRY], package)
        finally:
            path.write_text(original)

    for outside in ("planning/study.py", "planning/plan.py", "planning/submission.py", "analysis/tables/aggregate.py", "data/fetch.py", "launching/launch.py"):
        assert edited(outside) == before, f"{outside} runs in no rank"
    for inside in (
        "training/trainer.py",
        "data/sources.py",
        "parallel/mesh.py",
        "schedulers/slurm.py",
        "common/files.py",
        "trainer_flags.py",
        "models/llama.py",
    ):
        assert edited(inside) != before, f"{inside} runs in every rank"
    # An edit that adds an import, in the same process that read the module before (a dry run
    # asks for 13 programs' closures, and reads each text's imports once): the closure follows it.
    trainer = package / "training/trainer.py"
    original = trainer.read_text()
    trainer.write_text(original + "\nimport scalerepro.planning.study\n")
    try:
        assert package / "planning/study.py" in source_closure.source_files([source_closure.RANK_ENTRY], package)
    finally:
        trainer.write_text(original)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ([1, 2], "not a checkpoint (it holds a list)"),
        (_state(format=1), "checkpoint format 1, this trainer reads 2"),
        ({k: v for k, v in _state().items() if k != "fingerprint"}, "incomplete checkpoint (missing fingerprint)"),
        (_state(fingerprint=_fingerprint(code="f" * 64)), "written by other trainer code"),
        (_state(fingerprint=_fingerprint(per_gpu_batch=8)), "written by a different configuration (per_gpu_batch was 8, now 16)"),
        (_state(final=True), "the final checkpoint of a finished run"),
        (_state(step=9), "at step 9 it leaves too few steps for the warm-up and a measured window"),
    ],
)
def test_each_unusable_checkpoint_is_named_with_its_reason(state, reason):
    assert checkpoint_store.unusable_reason(state, _fingerprint(), last_resumable_step=8).startswith(reason)
    assert checkpoint_store.unusable_reason(_state(), _fingerprint(), last_resumable_step=8) is None


def test_resume_passes_over_corrupt_and_foreign_files_to_the_newest_usable_one(tmp_path):
    store = checkpoint_store.CheckpointStore(tmp_path, _fingerprint(), keep=2)
    good = store.save(4, {k: v for k, v in _state().items() if k not in ("format", "step", "final")})
    (tmp_path / "step-00000009.pt").write_bytes(b"PK\x03\x04 truncated by a crash")
    torch.save({"not": "a checkpoint"}, tmp_path / "step-00000008.pt")
    torch.save(["a", "list"], tmp_path / "step-00000007.pt")
    fresh = checkpoint_store.CheckpointStore(tmp_path, _fingerprint(), keep=2)
    state = fresh.load_newest(last_resumable_step=100)
    assert state["path"] == str(good)
    assert [(Path(s["path"]).name, s["reason"].split(" (")[0]) for s in fresh.skipped] == [
        ("step-00000009.pt", "unreadable"),
        ("step-00000008.pt", "checkpoint format None, this trainer reads 2"),
        ("step-00000007.pt", "not a checkpoint"),
    ]


def test_cleanup_counts_usable_checkpoints_only(tmp_path):
    """With --keep-checkpoints 1 an unreadable higher-numbered file once held the one slot and the
    fresh (SIGTERM) checkpoint was deleted in its favour."""
    unreadable = tmp_path / "step-99999999.pt"
    unreadable.write_bytes(b"garbage")
    store = checkpoint_store.CheckpointStore(tmp_path, _fingerprint(), keep=1)
    body = {k: v for k, v in _state().items() if k not in ("format", "step", "final")}
    first = store.save(4, body)
    assert first.exists() and unreadable.exists()
    second = store.save(8, body)
    assert second.exists() and not first.exists() and unreadable.exists()
