"""config/references.yaml is checked against workflow/schemas/references.schema.yaml wherever it is
loaded (scalerepro.common.references): a copy of the real file with one thing wrong stops the
workflow's plan, the aggregation and the prediction with one line naming the entry and the fix,
before any figure is divided by or compared (a 0 or a word for a number is otherwise a traceback
far from the file, and a negative figure a verdict)."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from scalerepro.analysis import predict
from scalerepro.analysis.columns import CONDITIONS, MATRIX_COLUMNS, REFERENCE_KINDS, REFERENCE_METRICS, REFERENCE_PRECISIONS
from scalerepro.analysis.tables import aggregate, network_model, published_conditions, reproduction
from scalerepro.common import model_flops, share_of_peak
from scalerepro.common.references import REFERENCES_SCHEMA, ReferencesError, load_optional_references, load_references
from scalerepro.planning import plan as planning

from conftest import REPO, clean_env

REFERENCES = REPO / "config/references.yaml"
CONFIG_SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
SCHEMA = yaml.safe_load(REFERENCES_SCHEMA.read_text())
NGC_1GPU = "references[4] (lambda-rn50-h100sxm-fp16-ngc2403-1)"
DLE_1GPU = "references[20] (dle-rn50-a100-fp16-1)"
TITAN_8 = "references[44] (torchtitan-llama31-8b-fsdp-8)"
MPT_8 = "references[50] (mosaicml-mpt-1b-fsdp-h100-8)"

# (what is wrong, the text of the real file, what it becomes, the entry named, what the line says)
BAD_COPIES = [
    ("a published value of 0", "    value: 2789\n", "    value: 0\n", NGC_1GPU, "value 0 is not above 0: published figures are positive numbers"),
    ("a negative published value", "    value: 2789\n", "    value: -2789\n", NGC_1GPU, "value -2789 is not above 0: published figures are positive"),
    ("text where a number belongs", "    value: 2789\n", "    value: about 2789\n", NGC_1GPU, "value 'about 2789' is not a number: published figures"),
    (
        "a link without its latency",
        "    hop_latency_us: 9.6\n    latency_source: &nccl_net_latency",
        "    latency_source: &nccl_net_latency",
        "links.inter_node",
        "add hop_latency_us",
    ),
    (
        "an unknown precision",
        "      precision: fp16\n      per_gpu_samples_per_step: 256\n      seq_len: null\n      memory_format: nhwc\n      data: null\n"
        '      optimizer: null\n      framework: "NGC pytorch-21.03, DLE launch.py --mode benchmark_training; the table',
        "      precision: amp\n      per_gpu_samples_per_step: 256\n      seq_len: null\n      memory_format: nhwc\n      data: null\n"
        '      optimizer: null\n      framework: "NGC pytorch-21.03, DLE launch.py --mode benchmark_training; the table',
        DLE_1GPU,
        "conditions.precision 'amp' is not one of fp32, tf32, fp16, bf16, fp8, mixed (or null: not stated)",
    ),
    (
        "a misspelt condition",
        "      seq_len: null\n      memory_format: nhwc\n      data: null\n      optimizer: null\n"
        '      framework: "NGC pytorch-21.03, DLE launch.py --mode benchmark_training; the table',
        "      seqlen: null\n      memory_format: nhwc\n      data: null\n      optimizer: null\n"
        '      framework: "NGC pytorch-21.03, DLE launch.py --mode benchmark_training; the table',
        DLE_1GPU,
        "unknown key 'seqlen' in conditions (the keys: gpu, precision, per_gpu_samples_per_step, seq_len,",
    ),
    (
        "an efficiency above 1",
        '    efficiency: 0.85\n    efficiency_source: "nccl-tests',
        '    efficiency: 1.2\n    efficiency_source: "nccl-tests',
        "links.intra_node",
        "efficiency 1.2 is above 1: an efficiency is the share of the line rate an all-reduce reaches, above 0 and at most 1",
    ),
    (
        "a power cap without whose figure it is",
        "      power_cap_w: 500\n      power_cap_basis: source\n",
        "      power_cap_w: 500\n",
        TITAN_8,
        "add power_cap_basis to conditions",
    ),
    (
        "a figure above its GPU's peak (45,000 img/s of ResNet-50 on one H100)",
        "    value: 2789\n",
        "    value: 45000\n",
        NGC_1GPU,
        "value 45000 samples_per_s at 1 GPU (lambdal/deeplearning-benchmark@aa5addb6a536 pytorch/pytorch-train-throughput-v2-fp16.csv) "
        "needs 1,093 TFLOP/s a GPU at resnet50's training FLOPs, 111 % of the H100 SXM5's dense fp16 peak of 989 TFLOP/s: "
        "no GPU runs above its peak, so the figure, its GPU count, precision or GPU is wrong",
    ),
    (
        "a stand-in without what makes it another model",
        "stands_for: &mpt_stands_for_llama {model: llama_1b, differs:",
        "stands_for: &mpt_stands_for_llama {model: llama_1b, differs_not:",
        MPT_8,
        "unknown key 'differs_not' in stands_for",
    ),
]


def _bad_copy(folder: Path, old: str, new: str) -> Path:
    """The real references file with ``old`` (once in it) made ``new``."""
    text = REFERENCES.read_text()
    assert text.count(old) == 1, old
    path = folder / "references.yaml"
    path.write_text(text.replace(old, new))
    return path


def _empty_matrix(folder: Path) -> Path:
    """A study matrix with no runs: the aggregation reads the references and nothing else."""
    path = folder / "matrix.csv"
    path.write_text(",".join(MATRIX_COLUMNS) + "\n")
    return path


def _plan(references: Path) -> planning.Plan:
    config = planning.study.merge({}, yaml.safe_load((REPO / "config/config.yaml").read_text()))
    return planning.load(copy.deepcopy(config), schema=CONFIG_SCHEMA, references=references, executor=None, in_job=False, local_gpu_names=[])


def test_the_committed_references_hold_to_the_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    document = load_references(REFERENCES)
    assert len(document["references"]) == len(yaml.safe_load(REFERENCES.read_text())["references"]) > 0
    assert set(document["clusters"]) == {"dgx_h100", "dgx_a100"} and document["prediction_error"]["rows"] > 0


def test_the_schemas_vocabularies_are_the_analysis_columns():
    """The schema enforces the vocabularies that scalerepro.analysis.columns spells (common/, where
    the loader is, may not import the analysis): held equal here."""
    definitions = SCHEMA["$defs"]
    assert tuple(definitions["reference"]["properties"]["kind"]["enum"]) == REFERENCE_KINDS
    assert tuple(definitions["reference"]["properties"]["metric"]["enum"]) == REFERENCE_METRICS
    assert tuple(definitions["conditions"]["properties"]["precision"]["enum"]) == (*REFERENCE_PRECISIONS, None)
    # the conditions compared, then the free text, then the GPU part and its power cap (read by published_conditions)
    assert tuple(definitions["conditions"]["properties"]) == (*CONDITIONS, "framework", "metric_notes", "sku", "power_cap_w", "power_cap_basis", "parallelism")
    # a run's conditions, as the comparison spells them, are values the schema allows a reference
    for channels_last, data in ((True, "synthetic"), (False, "cifar10")):
        run = {
            "device_type": "cuda",
            "device_name": "G",
            "tokens_per_sample": math.nan,
            "channels_last": channels_last,
            "data_kind": data,
            "precision_recorded": "bf16",
            "per_gpu_batch_recorded": 32,
            "grad_accum_recorded": 1,
            "optimizer_kind": "sgd",
        }
        measured = reproduction.recorded_conditions(run)
        assert measured["memory_format"] in definitions["conditions"]["properties"]["memory_format"]["enum"]
        assert measured["data"] in definitions["conditions"]["properties"]["data"]["enum"]


@pytest.mark.parametrize(("wrong", "old", "new", "entry", "said"), BAD_COPIES, ids=[case[0] for case in BAD_COPIES])
def test_a_bad_copy_stops_the_aggregation_and_the_plan_with_one_line_naming_the_entry(wrong, old, new, entry, said, tmp_path, capsys):
    references = _bad_copy(tmp_path, old, new)
    # the workflow turns a ConfigError into its one-line WorkflowError
    with pytest.raises(planning.ConfigError) as refused:
        _plan(references)
    out = tmp_path / "tables"
    assert aggregate.main(["--matrix", str(_empty_matrix(tmp_path)), "--references", str(references), "--out", str(out)]) == 2, wrong
    err = capsys.readouterr().err
    assert err == f"scalerepro.analysis.tables.aggregate: error: {refused.value}\n"  # the same line
    assert f"{entry}: {said}" in err and err.endswith(f": fix {references}\n"), err
    assert not out.exists()


def test_python_m_aggregate_exits_2_with_the_line(tmp_path):
    references = _bad_copy(tmp_path, *BAD_COPIES[0][1:3])
    done = subprocess.run(
        [sys.executable, "-m", "scalerepro.analysis.tables.aggregate", "--matrix", "matrix.csv", "--references", "references.yaml", "--out", "tables"],
        cwd=_empty_matrix(tmp_path).parent,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr == (
        f"scalerepro.analysis.tables.aggregate: error: {NGC_1GPU}: value 0 is not above 0: published figures are positive numbers: fix {references.name}\n"
    ), done.stderr[-2000:]
    assert not (tmp_path / "tables").exists()


def test_every_reader_of_the_file_refuses_it_alike(tmp_path, capsys):
    """The prediction, the presets and links of the scaling model, the report's links and the
    comparison's target GPU all read the file through the one loader."""
    references = _bad_copy(tmp_path, *BAD_COPIES[6][1:3])
    with pytest.raises(ReferencesError) as refused:
        load_references(references)
    readers = (
        network_model.read_clusters,
        network_model.read_links,
        network_model.read_prediction_error,
        reproduction.read_target_gpu,
        reproduction.read_references,
        published_conditions.read_references,  # the published comparison's
    )
    for reader in readers:
        with pytest.raises(ReferencesError) as again:
            reader(references)
        assert str(again.value) == str(refused.value), reader.__name__
    with pytest.raises(ReferencesError, match="links.intra_node: efficiency 1.2 is above 1"):
        load_optional_references(references)  # the report's links
    assert predict.main(["--list", "--references", str(references)]) == 2
    assert capsys.readouterr().err == f"scalerepro.analysis.predict: error: {refused.value}\n"


def test_every_measured_reference_is_held_to_its_gpus_peak_and_is_below_it():
    """Each published or MLPerf figure of the file names a model whose training FLOPs and a GPU whose
    peak the package knows, so none passes unchecked; and each needs less than its GPU's peak."""
    for reference in load_references(REFERENCES)["references"]:
        if reference["kind"] not in ("published", "mlperf"):
            continue
        implied = share_of_peak.implied_share(reference)
        assert implied is not None, reference["id"]
        assert 0 < implied.share < 0.7, (reference["id"], implied)


def test_the_flops_a_figure_is_held_by_are_those_the_trainers_records_carry():
    """The torch-free FLOPs (common/model_flops) are the trainer's count: an image model's are the
    train_flops_per_sample its kept H100 records carry, and a language model's floor is at most the
    records' count a token (which adds attention)."""
    records = sorted((REPO / "benchmarks/gpu/h100-2026-11-27").glob("*-optimised-frontier.json"))
    assert len(records) == 6
    for path in records:
        model = json.loads(path.read_text())["model"]
        flops = model_flops.MODEL_FLOPS[model["name"]]
        if flops.per_sample is not None:
            assert flops.per_sample == model["train_flops_per_sample"], model["name"]
        else:
            per_token = model["train_flops_per_sample"] / model["tokens_per_sample"]
            assert 0.85 * per_token < flops.per_token <= per_token, (model["name"], flops.per_token, per_token)
