"""Comparisons that do not flatter (issue 66, part 3), on the kept H100 output: like for like needs the
same compile mode and memory format, else the nearest PyTorch figure is shown as what it is; a per-GPU
figure of several GPUs is a lower bound on one GPU alone only under data parallelism; a gap-walk step
within the spread of the runs it compares is no lever's effect; and benchmarks/README.md's current H100
figures are generated from the kept records through the report's own tables."""

from __future__ import annotations

import json

import pandas as pd

from scalerepro.analysis import current_figures
from scalerepro.analysis.tables import published_comparison, published_conditions

from conftest import REPO
from h100_report import REBUILDS_A_STUDY, section, visible

REFERENCES = REPO / "config" / "references.yaml"


def _published(h100_report) -> pd.DataFrame:
    return pd.read_csv(h100_report.out / "tables" / "published_comparison.csv")


def test_resnet50_has_no_like_for_like_figure_and_lambdas_is_the_nearest_pytorch_figure_its_levers_first(h100_report):
    table = _published(h100_report).set_index(["model", "role"])
    # Lambda's rows are eager and NCHW, ours compiled and channels_last: not like for like
    assert ("resnet50", published_comparison.LIKE) not in table.index
    assert ("resnet50", published_comparison.NO_LIKE) in table.index
    nearest = table.loc[("resnet50", published_comparison.NEAREST)]
    assert nearest["reference"] == "lambda-rn50-h100sxm-fp16-ngc2403-1"
    assert nearest["why"] == "not like for like in memory format, compile only: levers the gap walk steps"
    differs = json.loads(nearest["differs"])
    assert differs[:2] == ["memory format: NCHW, ours NHWC (channels_last)", "compile: none (eager), ours reduce-overhead"]
    # the page: the ratio is labelled as the nearest figure's, the walk names where it starts
    comparison = visible(section(h100_report.html, "nearest"))
    assert "2.02× ours ÷ nearest PyTorch figure, not like for like" in comparison
    assert "Gap walk: resnet50 at 1 GPU, from the nearest PyTorch figure lambda-rn50-h100sxm-fp16-ngc2403-1" in comparison
    # the rule the page states is the conditions data's, not the template's own words
    assert "with the same framework, data, precision, sequence length, memory format, compile" in visible(h100_report.html)


def test_a_per_gpu_figure_bounds_one_gpu_alone_only_under_data_parallelism(h100_report):
    references = published_conditions.read_references(REFERENCES).set_index("id", drop=False)
    notes = {ref: published_comparison.per_gpu_note(references.loc[ref]) for ref in references.index}
    # MPT-1B under FSDP FULL_SHARD at 16 GPUs: one GPU alone need not hold the model
    assert notes["mosaicml-mpt-1b-fsdp-h100-16"] == (
        "per GPU of 16 (FSDP FULL_SHARD; one GPU alone need not hold the model): no bound on what one GPU does alone"
    )
    # Lambda's DDP at 8 GPUs: each GPU holds the whole model, so the per-GPU figure is a lower bound
    assert notes["lambda-rn50-h100sxm-fp16-ngc2403-8"] == (
        "per GPU of 8, 22,059 for the job (native DDP: each GPU holds the whole model): a lower bound on what one of its GPUs does alone"
    )
    # a source that states no parallelism (llm.c can shard its optimizer) bounds nothing
    assert "(the source states no parallelism): no bound" in notes["llmc-gpt2-124m-h100-8"]
    assert notes["lambda-rn50-h100sxm-fp16-ngc2403-1"] is None  # one GPU: the figure is that GPU's
    # no per-GPU figure of a sharded, model-parallel or unstated job is called a lower bound on the page
    llama = visible(section(h100_report.html, "nearest"))
    assert "per GPU of 16 (FSDP FULL_SHARD; one GPU alone need not hold the model)" in llama
    for ref, note in notes.items():
        if note and "lower bound" in note:
            assert references.loc[ref, "parallelism"] == "data", ref


def test_a_walk_step_within_the_day_to_day_spread_is_no_levers_effect_and_says_what_its_runs_span(h100_report):
    walk = pd.read_csv(h100_report.out / "tables" / "gap_walk.csv")
    steps = walk[walk["status"].eq("measured")].set_index("from")
    # compile default -> reduce-overhead: 1.01x between runs of two commits and days, inside the
    # day-to-day spread of the cells repeated across them (GPT-2's 478,695 and 473,326: 1.1 %)
    compile_step = steps.loc["default"]
    assert 1.0 < compile_step["ratio"] < 1.01
    assert str(compile_step["within_spread"]) == "True"
    assert "runs of 2 commits (3d850d01c7a4, f1e62729249a) and 2 days (2026-11-25, 2026-11-27)" in compile_step["sessions"]
    assert "which card each ran on is not recorded (no GPU UUID)" in compile_step["sessions"]
    assert "the day-to-day spread: 1.1 % (the widest of a cell repeated across sittings, gpt2_small:" in compile_step["sessions"]
    # the precision and memory-format steps, one sitting each, lie beyond their runs' own spreads
    assert str(steps.loc["fp16", "within_spread"]) == "False" and str(steps.loc["NCHW", "within_spread"]) == "False"
    # the rest: the compile step explains nothing (the product is of the other two steps)
    rest = walk[walk["status"].eq("rest")].iloc[0]
    assert rest["explained"] == steps.loc["fp16", "ratio"] * steps.loc["NCHW", "ratio"]
    assert "compile default → reduce-overhead (within the spread)" in json.loads(rest["what"])
    assert "within the spread, not a lever's effect" in visible(section(h100_report.html, "nearest"))


def test_a_step_between_sittings_is_set_against_the_day_to_day_spread_not_its_runs_own(h100_report):
    # the reduce-overhead cell repeated as round 3 repeated it (5,627 and 5,630 img/s: a range that misses
    # the compile-default run's own p10 - p90 steps, 5,590 - 5,599): a step across sittings is within the
    # day-to-day spread all the same, never a lever's 0.9 %
    runs = pd.read_csv(h100_report.out / "tables" / "runs.csv")
    frontier = runs[runs["run_id"].eq("h100-2026-11-26_resnet50-optimised-frontier")]
    repeat = frontier.assign(run_id="repeat", samples_per_s=5630.43, started_at="2026-11-27T11:20:09+00:00", git_commit="17b10198c2b1")
    walk = published_comparison.comparison_tables(pd.concat([runs, repeat]), published_conditions.read_references(REFERENCES), pd.DataFrame())[1]
    compile_step = walk[walk["status"].eq("measured")].set_index("from").loc["default"]
    assert compile_step["to_n"] == 2 and str(compile_step["within_spread"]) == "True"
    assert "runs of 3 commits" in compile_step["sessions"]


@REBUILDS_A_STUDY
def test_the_readmes_current_h100_figures_are_what_the_kept_records_write():
    readme = (REPO / current_figures.README).read_text(encoding="utf-8")
    assert readme == current_figures.readme_text(readme), "run: python -m scalerepro.analysis.current_figures --write"
    # the figures the issue found disagreeing: Llama's best published is the report's (MPT-1B at 16 GPUs)
    rows = readme[readme.index(current_figures.FRONTIER_ROWS_MARKERS[0]) : readme.index(current_figures.FRONTIER_ROWS_MARKERS[1])]
    assert "46,037 (`mosaicml-mpt-1b-fsdp-h100-16`, 16 GPUs, another model): 1.39×" in rows and "45,455" not in rows
