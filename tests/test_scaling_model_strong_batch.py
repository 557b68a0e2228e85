"""The global batch a strong-scaling prediction of a one-GPU study holds (issue 67), on the kept
one-H100 study of 2026-11-27 (benchmarks/gpu/h100-2026-11-27/study-results: every model on one
H100, strong study).

Split over N GPUs, the one-GPU batch is a sliver a GPU nobody runs (Llama-1B's 8 sequences were one
a GPU at 8 GPUs and no prediction at 16 and 64). The predicted rows hold the one-GPU batch on every
GPU of the largest count predicted (the smaller counts accumulate), at most the largest global batch
a published run of the model uses or its data set holds (``model_inputs.global_batch_caps``), each
against the one-GPU step at that batch; a strong study that measured several counts keeps its own.
"""

from __future__ import annotations

import pandas as pd
import pytest

from scalerepro.analysis.tables.model_inputs import BatchCap, global_batch_caps, held_global_batch
from scalerepro.common.references import load_references

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, RebuiltStudy, kept_study_rebuilt_once, kept_study_tables, section, table_rows

STUDY = REPO / "benchmarks" / "gpu" / "h100-2026-11-27" / "study-results"
CPU_STUDY = REPO / "tests" / "fixtures" / "studies" / "cpu-readme-a0f872f"
COUNTS = (8, 16, 64)  # scaling_model.DEFAULT_PREDICT_GPUS, the counts the kept study predicts


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> RebuiltStudy:
    return kept_study_rebuilt_once(tmp_path_factory, STUDY)


def _strong(study: RebuiltStudy) -> pd.DataFrame:
    model = pd.read_csv(study.results / "tables" / "scaling_model.csv")
    return model[model["study"].eq("strong")].set_index(["model", "gpus"])


@REBUILDS_A_STUDY
def test_llama_1b_holds_its_one_gpu_batch_on_each_of_64_gpus_not_one_sequence_a_gpu(study):
    """Llama-1B ran 8 sequences on one H100. Its predicted strong rows hold 8 x 64 = 512 (under
    MPT-1B's largest published global batch, 6144 at 512 GPUs): 8 micro-batches of 8 a GPU at 8
    GPUs, 4 at 16, one at 64, each row predicted; with the one-GPU batch split, 8 GPUs ran one
    sequence each and 16 and 64 had no prediction."""
    strong = _strong(study)
    assert strong.loc[("llama_1b", 1), "global_batch"] == 8  # the measured one-GPU cell keeps its own
    for gpus, accumulated in ((8, 8), (16, 4), (64, 1)):
        row = strong.loc[("llama_1b", gpus)]
        assert row["basis"] == "predicted" and row["global_batch"] == 512
        assert (row["per_gpu_batch"], row["grad_accum_steps"]) == (8, accumulated)
        assert pd.notna(row["efficiency_predicted"]) and pd.isna(row["bound"])  # the one-GPU micro-batch: no bound
        assert "mosaicml-mpt-1b-fsdp-h100-large-512" in row["global_batch_basis"]
        assert row["global_batch_basis"].startswith("global batch 512 = the one-GPU batch 8 x 64 (at 64 GPUs each runs the one-GPU batch 8")


@REBUILDS_A_STUDY
def test_every_held_global_batch_splits_over_every_count_within_its_models_cap(study):
    """Each model's predicted strong rows hold one global batch G = the one-GPU batch x n, n at most
    64, that splits evenly over 8, 16 and 64 GPUs and is within the model's cap from
    references.yaml: GPT-2 small at 512 (modded-nanogpt's 8 x 64), ResNet-50 at 10240 (Lambda's
    8 x 1280), ResNet-18 at 49152 (CIFAR-10's 50,000 images); a model nothing caps holds the
    one-GPU batch on each of 64 GPUs."""
    strong = _strong(study)
    caps = global_batch_caps(load_references(REPO / "config" / "references.yaml"))
    held = {}
    for name in strong.index.get_level_values("model").unique():
        batch_1 = int(strong.loc[(name, 1), "global_batch"])
        rows = strong.loc[name].loc[list(COUNTS)]
        assert rows["global_batch"].nunique() == 1 and rows["efficiency_predicted"].notna().all()
        global_batch = int(rows["global_batch"].iloc[0])
        held[name] = global_batch
        assert global_batch % batch_1 == 0 and global_batch // batch_1 <= max(COUNTS)
        assert all(global_batch % gpus == 0 for gpus in COUNTS)
        for gpus, row in rows.iterrows():
            assert row["per_gpu_batch"] * row["grad_accum_steps"] * gpus == global_batch
        if name in caps:
            assert global_batch <= caps[name].global_batch and caps[name].source in rows["global_batch_basis"].iloc[0]
        if name not in caps or batch_1 * max(COUNTS) <= caps[name].global_batch:
            assert global_batch == batch_1 * max(COUNTS)  # the one-GPU batch on each GPU of the largest count
    assert {name: held[name] for name in ("gpt2_small", "resnet50", "resnet18_cifar")} == {"gpt2_small": 512, "resnet50": 10240, "resnet18_cifar": 49152}


@REBUILDS_A_STUDY
def test_a_held_global_batch_is_against_the_one_gpu_step_at_that_batch(study):
    """Efficiency at N is t_1(G) / (N t(N)), t_1(G) the one-GPU step at the held batch: its
    accumulated micro-batches, the per-step cost (other + o) once. At 64 GPUs Llama-1B runs the
    one-GPU micro-batch once a step, so t_1(G) is close to 64 one-GPU steps less 63 fixed costs;
    against the one-GPU step at 8 sequences the efficiency would be about 1/64."""
    strong = _strong(study)
    for name in ("llama_1b", "vit_b_16", "bert_base"):
        row = strong.loc[(name, 64)]
        one_gpu_step_at_held = row["efficiency_predicted"] * 64 * row["step_time_predicted_s"]
        expected = 64 * strong.loc[(name, 1), "step_time_predicted_s"] - 63 * row["fixed_step_s"]
        assert one_gpu_step_at_held == pytest.approx(expected, rel=0.02)
        assert row["efficiency_predicted"] > 0.5


@REBUILDS_A_STUDY
def test_the_report_says_each_strong_rows_global_batch(study):
    rows = table_rows(section(study.html, "scaling-model"))
    predicted = {cells[2] for cells in rows if cells[:2] == ["strong", "llama_1b"] and "predicted" in cells}
    assert predicted == {"8", "16", "64"}
    # the batch (the model's inputs) and why (each row's error bar and batch), folded beneath the short table
    for column, says in (("Global batch", "512"), ("Global batch from", "global batch 512 = the one-GPU batch 8 x 64")):
        header = next(r for r in rows if column in r)
        folded: dict[str, list[str]] = {}
        for cells in rows[rows.index(header) :]:  # the first table after the header's own rows
            if cells[:2] == ["llama_1b", "strong"]:
                folded.setdefault(cells[2], cells)
        assert all(folded[gpus][header.index(column)].startswith(says) for gpus in predicted), column


def test_a_strong_study_that_measured_several_counts_keeps_its_own_global_batch(tmp_path, monkeypatch):
    """The README's CPU study measured strong scaling at 1, 2 and 4 ranks: every row, beyond them
    too, holds the study's global batch."""
    results, _ = kept_study_tables(CPU_STUDY, tmp_path, monkeypatch)
    model = pd.read_csv(results / "tables" / "scaling_model.csv")
    strong = model[model["study"].eq("strong")]
    assert strong["gpus"].max() > 1 and strong["global_batch"].nunique() == 1
    assert strong["global_batch_basis"].isna().all()


def test_the_held_batch_by_hand():
    # uncapped: the one-GPU batch on each GPU of the largest count, the one-GPU step at it 64 x 8
    held = held_global_batch(8, 8, COUNTS, "llama_1b", None)
    assert (held.global_batch, held.reference_split) == (512, (8, 64))
    # capped at 500: 32 x 15 = 480 does not split over 64 GPUs, 32 x 14 = 448 does (7 a GPU)
    held = held_global_batch(32, 32, COUNTS, "gpt2_small", BatchCap(500, "a run", "a run's 500"))
    assert (held.global_batch, held.reference_split) == (448, (32, 14)) and "capped at 500 by a run" in held.basis
    # no multiple splits within the cap: the one-GPU batch, as measured (the rows then say it does not split)
    held = held_global_batch(24, 8, COUNTS, "m", BatchCap(30, "a run", "a run's 30"))
    assert (held.global_batch, held.reference_split) == (24, (8, 3)) and "no multiple of 24 up to 64x splits evenly" in held.basis
