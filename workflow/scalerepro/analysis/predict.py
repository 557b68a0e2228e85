"""Predict what a cluster would give before asking for it: throughput and scaling efficiency at
each GPU count of a target cluster shape, from one GPU's run.

    python -m scalerepro.analysis.predict --record results/runs/strong_resnet50_g1_r1.json \\
        --cluster dgx_h100 --nodes 1 2 8 [--gpus-per-node 8] [--nvlink-gbps 450] [--nic-gbps 50]
    python -m scalerepro.analysis.predict --study results/tables --cluster dgx_a100 --gpus 8 64 256

Input: a one-GPU run record (its ``measurements.backward_buckets``: DDP's gradient buckets and
when each is ready, the step's phases; and its median step time), or a finished study's tables
folder (its runs.csv names the records, read inside the study folder that holds the tables,
wherever the command runs, each the very record the tables counted; every strong and weak
study's counted one-GPU runs, repeats by their element-wise median, as the aggregation does). The cluster: a preset of
``clusters`` in config/references.yaml (``--list`` shows them) with its GPUs per node and link
rates, each overridable.

Model (``scalerepro.analysis.tables.step_model``, ``network_model``): the one-GPU step
replayed with each bucket's all-reduce on the cluster's hierarchical network (NCCL's flat ring
through all N GPUs over NVLink and one NIC per GPU, or its tree across nodes, whichever NCCL's
tuner would take per bucket), t(N) = other + A_N c f + (A_N - 1) c b + max(c b, e_last) + o. Weak scaling (the
default for a record) keeps the micro-batch; strong scaling (``--global-batch G``) splits G over
N GPUs in whole samples. Throughput = N x samples per GPU per step / t(N); efficiency as the
study defines it: strong t(1) / (N t(N)), weak t(1) / t(N). Each row states its network and the
model's typical error in its own regime (``tables.prediction_error``: ``prediction_error_by_regime``
of references.yaml, back-tested by benchmarks/predict_published.py), or that no back-test covered
its regime; a strong row whose micro-batch shrinks is an upper bound on the efficiency (no batch
curve here: compute proportional to the micro-batch).

A record is a claim: ``--record`` replays only a completed one-GPU step that is evidence (its
status ok, its figures inside their bounds and agreeing as the aggregation asks:
``scalerepro.record.read``; its window on a machine of its own: ``scalerepro.record.evidence.QUIET``), measured on a GPU (not a CPU), one rank (``parallel.world_size``
and ``parallel.gpus`` 1: more ranks' step holds their all-reduce already). The output names the
GPU the step was measured on; one other than the preset's (``gpu_peaks.peaks_key`` of each name)
is refused unless ``--other-gpu`` says to replay it as if its compute were unchanged (the model
does not scale compute between GPU models).

Bad input is one line on stderr naming the problem and the fix, exit status 2.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.tables import model_inputs, network_model, prediction_error, scaling_model, step_model
from scalerepro.common import study_layout
from scalerepro.common.cli import COUNT, CommandError, OneLineErrorParser, bounded_float, bounded_int, error_boundary, output_path
from scalerepro.common.files import write_text_atomically
from scalerepro.common.gpu_peaks import peaks_key
from scalerepro.common.references import load_optional_references
from scalerepro.record import evidence
from scalerepro.record.read import Reading, read

DEFAULT_REFERENCES = Path("config/references.yaml")
PREDICT_COLUMNS = (
    "study",
    "model",
    "gpus",
    "global_batch",
    "global_batch_basis",
    "nodes",
    "per_gpu_batch",
    "grad_accum_steps",
    "step_time_s",
    "samples_per_s",
    "efficiency",
    "exposed_comm_s",
    "algorithm",
    "assumptions",
    "regime",
    "typical_error",
    "error_basis",
    "bound",
)


_PROG = "scalerepro.analysis.predict"
RATE_GBPS = bounded_float(1e-3, 1e6)  # a link's line rate, GB/s per GPU each way


class PredictError(CommandError):
    """Bad input: the message names it and the fix (one line, exit 2: ``error_boundary``)."""


@dataclass(frozen=True)
class OneGpuInput:
    """What the prediction starts from: one study's (or one record's) one-GPU step."""

    study: str  # strong | weak
    model: str
    profile: step_model.StepProfile
    micro_batch: int  # m_1
    global_batch: int | None  # G (strong)
    device: str | None = None  # the GPU a record's step was measured on (hardware.gpu.name)
    # a strong study that measured one GPU alone: its predicted rows hold a global batch one would
    # run (``model_inputs.held_global_batch``), not its one-GPU batch split
    strong_of_one_gpu: bool = False


_GIVE = "give the record of a completed one-GPU run"


def one_gpu_record(path: Path) -> Reading:
    """The record at ``path``, once it says it is a completed run of one rank on one GPU, named;
    a PredictError naming what it is instead. Its figures are checked after its profile is read."""
    reading = read(path)
    record = reading.record
    if record.status != "ok":
        raise PredictError(f"{path}: the record's status is {record.status!r}, not 'ok': a run that did not complete is no step to replay; {_GIVE}")
    parallel = record.parallel
    if parallel.world_size is None:
        raise PredictError(f"{path}: the record does not say how many ranks ran (parallel.world_size); {_GIVE}")
    for where, count in (("parallel.world_size", parallel.world_size), ("parallel.gpus", parallel.gpus)):
        if count is not None and count != 1:
            raise PredictError(
                f"{path}: the record is of {count!r} ranks ({where} {count!r}), not one GPU's step: its step holds their all-reduce already; {_GIVE}"
            )
    if parallel.device_type != "cuda":
        raise PredictError(
            f"{path}: the step was measured on {parallel.device_type!r} (parallel.device_type), not a GPU: its step says nothing of a GPU cluster's; {_GIVE}"
        )
    gpu = record.hardware.gpu.name
    if not gpu or not gpu.strip():
        raise PredictError(f"{path}: the record names no GPU (hardware.gpu.name): which GPU's step it is is unknown; {_GIVE}")
    return reading


def from_record(path: Path, global_batch: int | None) -> OneGpuInput:
    reading = one_gpu_record(path)
    # the record as the aggregation reads it: its figures inside their bounds and agreeing with each other
    problems = reading.problems
    if problems:
        raise PredictError(f"{path}: the record is no evidence: the record's figures are no measurement ({'; '.join(problems)})")
    disturbed = evidence.disturbances(reading.record)
    if disturbed:
        raise PredictError(f"{path}: the record is no evidence: {'; '.join(disturbed)}")
    profile, why = model_inputs.read_profile(path)
    if profile is None:
        raise PredictError(f"{path}: {why}; give the record of a one-GPU run made with the scaling model's bucket probe")
    record = reading.record
    study = "strong" if global_batch is not None else "weak"
    return OneGpuInput(study, record.model.name, model_inputs.within_step(profile), record.batch.micro_batch, global_batch, record.hardware.gpu.name)


def same_gpu(device: str | None, cluster: network_model.ClusterPreset) -> bool:
    """Whether ``device`` is the preset's GPU model (by the peak table's key; by name where the table knows neither;
    an unnamed device is not)."""
    key = peaks_key(device)
    return key == peaks_key(cluster.gpu) if key is not None else device == cluster.gpu


def record_notes(path: Path, one: OneGpuInput, cluster: network_model.ClusterPreset, other_gpu: bool) -> list[str]:
    """The lines that say where a record's step was measured (and, with --other-gpu, what replaying
    it on another GPU's cluster assumes); a PredictError where the GPUs differ without the flag."""
    notes = [f"profile: {path}, one GPU's step measured on {one.device}"]
    if same_gpu(one.device, cluster):
        return notes
    if not other_gpu:
        raise PredictError(
            f"{path}: the step was measured on {one.device}, and {cluster.name} ({cluster.key}) has {cluster.gpu}: the model does not "
            f"scale compute between GPU models; give a record measured on {cluster.gpu}, or --other-gpu to replay this step on that "
            "network as if its compute were unchanged"
        )
    return notes + [
        f"the step was measured on {one.device} and is replayed on {cluster.name}'s network as if its compute were unchanged "
        f"(no scaling of compute between GPU models: {cluster.gpu} would compute at its own speed)"
    ]


def counted_record(run: Mapping[str, Any], runs_path: Path, study: Path) -> Path:
    """The record of a counted run of runs.csv (``run``: its row), inside ``study`` (the folder
    that holds the tables), once it is the record the tables counted: the same run (its id, or
    the run it reads, ``record_of``) started at the same time. A PredictError naming the run and
    the fix where the file lies outside the study, is not there, or is another record."""
    give = "give the tables folder inside the study folder that holds its runs/"
    try:
        path = study_layout.record_file(str(run["record"]), study)
    except study_layout.OutsideStudy as error:
        raise PredictError(f"{runs_path}: the record of run {run['run_id']}, {error}: {give}") from None
    try:
        record = read(path).record
    except FileNotFoundError:
        raise PredictError(f"{runs_path}: run {run['run_id']} counted a record that is not at {path}: {give}") from None
    except (OSError, ValueError) as error:
        raise PredictError(f"{runs_path}: run {run['run_id']}: {error}: {give}") from None
    owner = run.get("record_of") if isinstance(run.get("record_of"), str) and run.get("record_of") else run["run_id"]
    if (record.run_id, record.started_at) != (owner, run["started_at"]):
        raise PredictError(
            f"{runs_path}: the record at {path} is not the one run {run['run_id']} counted (it is of run {record.run_id} started "
            f"{record.started_at}; the tables counted run {owner} started {run['started_at']}): {give}, or make its tables again"
        )
    return path


def from_study(tables: Path) -> list[OneGpuInput]:
    """The one-GPU inputs of a finished study's tables folder: each counted one-GPU strong or weak
    cell's records, read inside the folder that holds the tables (``tables/..``, from the tables'
    absolute path: ``--study .`` inside tables/ is that study's), never at the matrix's paths from
    where the command runs."""
    runs_path = tables / "runs.csv"
    if not runs_path.is_file():
        raise PredictError(f"{tables}: no runs.csv; give a finished study's tables folder (results/tables) or --record")
    study = Path(os.path.abspath(tables)).parent
    runs = pd.read_csv(runs_path, dtype={"record": str, "record_of": str, "started_at": str})
    if "cell" not in runs.columns:
        raise PredictError(
            f"{runs_path} names no cell of its runs (tables from before cells): make them again with `python -m scalerepro.analysis.rebuild --results {study}`"
        )
    one = runs[runs["study"].isin(["strong", "weak"]) & runs["gpus"].eq(1) & runs["counts"].astype(bool)]
    inputs = []
    for _, group in one.groupby("cell", sort=True):  # a study's one-GPU cell of each model
        study_name, model = group["study"].iloc[0], group["model"].iloc[0]
        found = [model_inputs.read_profile(counted_record(run, runs_path, study)) for run in group.to_dict("records")]
        profiles = [profile for profile, _ in found if profile is not None]
        if not profiles:
            continue
        global_batch = int(group["global_batch"].iloc[0]) if study_name == "strong" and "global_batch" in group else None
        profile = model_inputs.within_step(model_inputs.median_profile(profiles))
        wider = runs[runs["study"].eq("strong") & runs["model"].eq(model) & runs["gpus"].gt(1) & runs["counts"].astype(bool)]
        inputs.append(OneGpuInput(study_name, model, profile, int(group["per_gpu_batch"].iloc[0]), global_batch, strong_of_one_gpu=wider.empty))
    if not inputs:
        raise PredictError(f"{runs_path}: no counted one-GPU strong or weak run with a bucket record; run the study's 1-GPU cells first")
    return inputs


def predict(
    one: OneGpuInput,
    cluster: network_model.ClusterPreset,
    gpu_counts: Sequence[int],
    algorithm: network_model.Algorithm = "auto",
    errors: prediction_error.ErrorTable | None = None,
    batch_caps: Mapping[str, model_inputs.BatchCap] | None = None,
) -> pd.DataFrame:
    """One row per GPU count (PREDICT_COLUMNS); a count the model cannot take has a row that says
    why. ``errors``: the back-tested error by regime each row carries its own regime's of;
    ``batch_caps``: the largest global batch of each model (``model_inputs.global_batch_caps``),
    which a strong study of one GPU holds its rows within."""
    profile = one.profile
    global_batch, basis, step_1 = one.global_batch, "the study's own" if one.global_batch is not None else None, profile.step_s
    wider = [g for g in gpu_counts if g > 1]
    if one.study == "strong" and one.strong_of_one_gpu and global_batch is not None and wider:
        held = model_inputs.held_global_batch(global_batch, one.micro_batch, wider, one.model, (batch_caps or {}).get(one.model))
        global_batch, basis = held.global_batch, held.basis
        micro_1, accum_1 = held.reference_split  # E against one GPU's step at the held batch
        step_1 = step_model.simulate_step(profile, cluster.network(1, algorithm), micro_1 / one.micro_batch, accum_1).step_s
    rows = []
    for gpus in gpu_counts:
        row = {"study": one.study, "model": one.model, "gpus": gpus, "global_batch": global_batch, "global_batch_basis": basis}
        split: tuple[int, int] | str  # (micro-batch, micro-batches per step), or why there is none
        if one.study == "strong":
            if global_batch is None:
                split = "the strong study's global batch is not known"
            else:
                split = scaling_model.strong_split(global_batch, gpus, one.micro_batch)
        else:
            split = (one.micro_batch, profile.micro_batches)
        try:
            if isinstance(split, str):
                raise ValueError(split)
            network = cluster.network(gpus, algorithm)
        except ValueError as error:
            rows.append({**row, "assumptions": f"no prediction: {error}"})
            continue
        micro, accum = split
        prediction = step_model.simulate_step(profile, network, micro / one.micro_batch, accum)
        algorithms = sorted({network.algorithm_for(size) for size in profile.bucket_bytes}) if gpus > 1 else ["none"]
        # no batch curve here: a smaller micro-batch's compute is taken as proportional to it
        regime = prediction_error.regime_of("ddp", network.nodes, micro, one.micro_batch, None)
        rows.append(
            {
                **row,
                "nodes": network.nodes,
                "per_gpu_batch": micro,
                "grad_accum_steps": accum,
                "step_time_s": prediction.step_s,
                "samples_per_s": gpus * micro * accum / prediction.step_s,
                "efficiency": step_model.predicted_efficiency(one.study, step_1, prediction.step_s, gpus),
                "exposed_comm_s": prediction.exposed_comm_s,
                "algorithm": "+".join(algorithms),
                "assumptions": network.source if gpus > 1 else "one GPU: no all-reduce",
                **(prediction_error.error_columns(regime, errors, prediction.allreduce_s / prediction.step_s, accum) if gpus > 1 else {}),
                "bound": scaling_model.PROPORTIONAL_BOUND if micro != one.micro_batch else None,
            }
        )
    return pd.DataFrame(rows, columns=PREDICT_COLUMNS)


def render(table: pd.DataFrame, cluster: network_model.ClusterPreset, errors: prediction_error.ErrorTable | None) -> str:
    lines = [f"cluster: {cluster.describe()}", f"  source: {cluster.source}"]
    if errors is not None:
        lines.append(
            f"typical error (±, the column): the median |predicted / published - 1| back-tested in each row's regime by "
            f'{errors.command}; "{prediction_error.NO_BACK_TEST}" where none covered it'
        )
    strong = table[table["study"].eq("strong") & table["global_batch"].notna()].drop_duplicates("model")
    lines += [f"strong {row.model}: global batch {int(row.global_batch)} at every count ({row.global_batch_basis})" for row in strong.itertuples()]
    header = (
        f"{'study':<7}{'model':<16}{'GPUs':>6}{'nodes':>6}{'batch':>7}{'accum':>6}{'step ms':>10}{'samples/s':>12}{'eff':>7}"
        f"{'exposed ms':>11}{'±':>8}  algorithm"
    )
    lines += [header, "-" * len(header)]
    for row in table.itertuples():
        if pd.isna(row.step_time_s):
            lines.append(f"{row.study:<7}{row.model:<16}{row.gpus:>6}  {row.assumptions}")
            continue
        typical = "" if pd.isna(row.regime) else "none" if pd.isna(row.typical_error) else f"{row.typical_error:.1%}"
        bound = "  (upper bound)" if isinstance(row.bound, str) else ""
        lines.append(
            f"{row.study:<7}{row.model:<16}{row.gpus:>6}{row.nodes:>6}{row.per_gpu_batch:>7}{row.grad_accum_steps:>6}"
            f"{row.step_time_s * 1e3:>10.2f}{row.samples_per_s:>12,.1f}{row.efficiency:>7.1%}{row.exposed_comm_s * 1e3:>11.3f}"
            f"{typical:>8}  {row.algorithm}{bound}"
        )
    uncovered = sorted({row.regime for row in table.itertuples() if isinstance(row.regime, str) and pd.isna(row.typical_error)})
    if uncovered:
        lines.append(f"{prediction_error.NO_BACK_TEST} (no ± printed): {'; '.join(uncovered)}")
    lines.append(
        "assumptions per row: the network above (B = line rate x efficiency, alpha per hop, NCCL's tuner); compute time "
        "proportional to the micro-batch (a strong row whose micro-batch shrinks is an upper bound on the efficiency); "
        "optimizer and data wait as measured at one GPU; no contention, stragglers or loader effects at N ranks"
    )
    return "\n".join(lines)


@error_boundary(_PROG)
def main(argv: list[str]) -> int:
    parser = OneLineErrorParser(
        prog=_PROG,
        description="Predict throughput and scaling efficiency on a target cluster from one GPU's run.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--record", type=Path, help="a one-GPU run record (JSON) with backward_buckets")
    source.add_argument("--study", type=Path, help="a finished study's tables folder (results/tables)")
    source.add_argument("--list", action="store_true", help="list the cluster presets and exit")
    parser.add_argument("--cluster", default="dgx_h100", help="a preset of clusters in --references (default: %(default)s)")
    parser.add_argument("--references", type=Path, default=DEFAULT_REFERENCES, help="default: %(default)s")
    counts = parser.add_mutually_exclusive_group()
    counts.add_argument("--nodes", type=COUNT, nargs="+", help="node counts (each a whole node of GPUs)")
    counts.add_argument("--gpus", type=COUNT, nargs="+", help="GPU counts (default: 1, 2, 4, ... up to 8 nodes)")
    parser.add_argument("--gpus-per-node", type=bounded_int(1, 1024), help="override the preset's GPUs per node")
    parser.add_argument("--nvlink-gbps", type=RATE_GBPS, help="override the preset's NVLink line rate, GB/s per GPU each way")
    parser.add_argument("--nic-gbps", type=RATE_GBPS, help="override the preset's NIC line rate, GB/s per GPU each way")
    parser.add_argument("--algorithm", choices=network_model.ALGORITHMS, default="auto", help="inter-node all-reduce (default: NCCL-like auto)")
    parser.add_argument("--global-batch", type=bounded_int(1, 1 << 40), help="strong scaling of a --record: the global batch G (default: weak scaling)")
    parser.add_argument(
        "--other-gpu",
        action="store_true",
        help="with --record: replay a step measured on another GPU than the preset's as if its compute were unchanged",
    )
    parser.add_argument("--csv", type=output_path, help="also write the table here")
    args = parser.parse_args(argv)
    if args.other_gpu and args.record is None:
        raise PredictError("--other-gpu applies to --record only: give it with --record RECORD, or leave it out")
    if not args.references.is_file():
        raise PredictError(f"{args.references}: no such file; give --references config/references.yaml (its clusters and links)")
    try:
        presets = network_model.read_clusters(args.references)
        if args.list:
            for key, entry in presets.items():
                print(f"{key}: {entry.describe()}\n  source: {entry.source}")
            return 0
        cluster = network_model.preset(presets, args.cluster).with_overrides(args.gpus_per_node, args.nvlink_gbps, args.nic_gbps)
        if args.record is not None:
            if not args.record.is_file():
                raise PredictError(f"{args.record}: no such record; give the path of a one-GPU run's JSON record")
            inputs = [from_record(args.record, args.global_batch)]
            notes = record_notes(args.record, inputs[0], cluster, args.other_gpu)
        else:
            inputs = from_study(args.study)
            notes = []
    except ValueError as error:  # a preset that references.yaml lacks or gets wrong
        raise PredictError(str(error)) from None
    if args.nodes:
        gpu_counts = [n * cluster.gpus_per_node for n in args.nodes]
    elif args.gpus:
        gpu_counts = list(args.gpus)
    else:
        gpu_counts = [2**k for k in range(int(math.log2(8 * cluster.gpus_per_node)) + 1)]
    references = load_optional_references(args.references)
    errors, caps = prediction_error.error_table_of(references), model_inputs.global_batch_caps(references)
    table = pd.concat([predict(one, cluster, sorted(set([1, *gpu_counts])), args.algorithm, errors, caps) for one in inputs], ignore_index=True)
    print("\n".join([*notes, render(table, cluster, errors)]))
    if args.csv:
        write_text_atomically(args.csv, table.to_csv(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
