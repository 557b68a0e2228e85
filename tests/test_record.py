"""The run record's one model (scalerepro.record): the files generated from it, every kept record
read into it through the upgrade chain, the peak as facts, and what the chain cannot give said
field by field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from scalerepro.record import cell, columns, schema
from scalerepro.record.model import RECORD_SCHEMA_VERSION, RunRecord
from scalerepro.record.peak import peak_for
from scalerepro.record.read import RecordUnreadable, from_document
from scalerepro.record.upgrade import OLDEST_RECORD_SCHEMA

from conftest import REPO

# Every record the repository keeps: the H100 sessions' (schemas 2 and 3), the CPU studies' and
# records' (2, 3, 4), the benchmarks' template (1).
KEPT = sorted(
    path
    for folder in ("benchmarks", "tests/fixtures")
    for path in (REPO / folder).rglob("*.json")
    if (document := json.loads(path.read_text())) and isinstance(document, dict) and {"run_id", "schema_version"} <= document.keys()
)


def test_the_schema_file_and_the_doc_are_generated_from_the_model():
    """workflow/schemas/run_record.schema.json and docs/run-record.md's field table are what the model
    writes today (python -m scalerepro.record.schema --write): neither is edited by hand."""
    assert (REPO / schema.SCHEMA_FILE).read_text() == schema.schema_text(), "run: python -m scalerepro.record.schema --write"
    doc = (REPO / schema.DOC_FILE).read_text()
    assert schema.doc_text(doc) == doc, "run: python -m scalerepro.record.schema --write"


def test_the_kept_records_span_every_schema_the_chain_reads():
    versions = {json.loads(path.read_text())["schema_version"] for path in KEPT}
    assert versions == set(range(OLDEST_RECORD_SCHEMA, RECORD_SCHEMA_VERSION)), versions


@pytest.mark.parametrize("path", KEPT, ids=[str(path.relative_to(REPO)) for path in KEPT])
def test_every_kept_record_reads_into_todays_model(path: Path):
    document = json.loads(path.read_text())
    reading = from_document(document)
    assert reading.written_as == document["schema_version"] and reading.record.schema_version == RECORD_SCHEMA_VERSION
    # a real record's figures are measurements that agree with each other, as the trainer wrote them
    assert reading.nonsense == () and reading.problems == [], (reading.nonsense, reading.problems)
    # what the chain could not fill is said field by field, never guessed
    for field, why in reading.absent.items():
        assert why, field
    # today's model writes what it read, and reads it back the same
    assert RunRecord.model_validate(reading.record.model_dump(mode="json")) == reading.record


GPU_KEPT = [path for path in KEPT if (json.loads(path.read_text()).get("measurements") or {}).get("peak_flops_per_device")]


@pytest.mark.parametrize("path", GPU_KEPT, ids=[str(path.relative_to(REPO)) for path in GPU_KEPT])
def test_an_older_records_peak_is_the_tables_facts_and_its_own_words(path: Path):
    """A record of schemas 1 to 4 stated its MFU peak as a number and prose; read today, its peak
    is the peak table's facts of its device at its precision (the rate, units, the clock the rate is
    quoted at, the part), where the table's rate is the number it stated, and its prose verbatim."""
    document = json.loads(path.read_text())
    stated = document["measurements"]
    record = from_document(document).record
    assert record.measurements is not None and record.measurements.peak is not None
    peak, _ = peak_for(record.hardware.gpu.name, record.precision.name)
    assert peak is not None and record.measurements.peak.flops_per_s == stated["peak_flops_per_device"] == peak.flops_per_s
    assert record.measurements.peak.model_copy(update={"source": peak.source}) == peak
    assert record.measurements.peak.source == stated["peak_flops_source"]


def test_a_schema_3_gpu_record_says_what_it_cannot_hold_and_withholds_its_host_clock_data_wait():
    path = REPO / "benchmarks/gpu/h100-2026-11-27/study-results/runs/strong_gpt2_small_g1_r1/record.json"
    reading = from_document(json.loads(path.read_text()))
    assert reading.written_as == 3
    nvml = reading.record.measurements.nvml if reading.record.measurements else None
    assert nvml is not None and nvml.sm_clock_min_mhz is None and nvml.clock_event_reasons is None
    assert "after schema 3" in reading.absent["measurements.nvml.sm_clock_min_mhz"]
    assert "after schema 3" in reading.absent["hardware.gpu.uuid"]
    assert reading.purpose_basis.startswith("from its command line")
    assert [defect.columns for defect in reading.withheld] == [("data_stall_fraction", "data_wait_s", "window_data_wait_rank_mean_s")]


def test_a_schema_2_record_withholds_its_peak_memory():
    path = REPO / "benchmarks/gpu/h100-2026-11-25/llama_1b-optimised-frontier.json"
    reading = from_document(json.loads(path.read_text()))
    assert reading.written_as == 2 and reading.record.batch.micro_batch == json.loads(path.read_text())["batch"]["per_rank"]
    assert ("peak_memory_bytes", "activations_bytes_per_rank") in [defect.columns for defect in reading.withheld]


def _today() -> dict:
    return from_document(
        json.loads((REPO / "benchmarks/gpu/h100-2026-11-27/study-results/runs/strong_gpt2_small_g1_r1/record.json").read_text())
    ).record.model_dump(mode="json")


@pytest.mark.parametrize(
    ("figure", "value", "said"),
    [
        ("samples_per_s", -5.0, "samples_per_s is -5.0, where a measured one is above 0 samples/s"),
        ("samples_per_s", "fast", "samples_per_s is 'fast', not a number"),
        ("measured_steps", 4.5, "measured_steps is 4.5, not a whole number"),
        ("mfu", 1.5, "mfu is 1.5, where a measured one is at most 1"),
    ],
)
def test_a_figure_outside_its_bound_is_emptied_and_named(figure, value, said):
    document = _today()
    document["measurements"][figure] = value
    reading = from_document(document)
    assert getattr(reading.record.measurements, figure) is None and reading.nonsense == (said,)
    assert reading.problems == [said]


def test_a_record_of_a_newer_schema_or_of_no_schema_is_refused():
    document = _today()
    with pytest.raises(RecordUnreadable, match=f"newer than this scalerepro reads \\({RECORD_SCHEMA_VERSION}\\)"):
        from_document({**document, "schema_version": RECORD_SCHEMA_VERSION + 1})
    with pytest.raises(RecordUnreadable, match="no record schema version"):
        from_document({**document, "schema_version": "5"})
    broken = copy.deepcopy(document)
    del broken["knobs"]["compile"]
    with pytest.raises(RecordUnreadable, match="knobs.compile: Field required"):
        from_document(broken)


def test_every_figure_of_the_runs_table_is_a_field_with_its_bound():
    """The runs table's figures come from the model: each is a field under measurements with a
    bound, and a value outside it is named the way the store and the reader name it."""
    assert {"samples_per_s", "step_time_median_s", "mfu", "energy_per_sample_j", "window_s"} <= set(columns.FIGURES)
    assert columns.FIGURES["samples_per_s"].problem(0.0) == "0.0, where a measured one is above 0 samples/s"
    assert columns.FIGURES["gpu_util_mean_pct"].problem(101.0) == "101.0, where a measured one is at most 100 %"


def test_a_cell_names_its_departures_from_the_plan_and_its_repeats_differences():
    record = from_document(_today())
    planned = cell.Cell.planned({"gpus": 2, "per_gpu_batch": 32.0, "precision": "bf16", "parallel": "ddp", "data": "", "bucket_cap_mb": float("nan")})
    assert cell.departures(record.cell, planned) == ["world size 1, where the plan's is 2"]
    other = record.cell.model_copy(update={"device_name": "NVIDIA A100-SXM4-80GB", "compile_scope": None})
    assert cell.differences([record.cell, other]) == [
        "device (NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3)",
        "compile scope (model, not stated)",
    ]
