"""scaling_model.csv: the alpha-beta scaling model (``step_model``) beside the measurement, one
row per (study, model, GPU count), in strong|weak order: each measured cell with its prediction, and
each count of ``predict_gpus`` beyond the study's hardware predicted alone.

Per (study, model): the one-GPU run's step profile (``model_inputs``), the batch curve through the
study's one-GPU runs of one micro-batch a step (else one kept beside the study), and what each
measured multi-rank run says of running its ranks together (``step_model.Inflation``). Per row: the
micro-batch and accumulation at N (the matrix's where measured; beyond it strong scaling splits the
global batch as the planner does, ``common.batch_split``, and weak scaling keeps the one-GPU ones),
the network (the study's fit at that count; beyond it the fit on the same kind of link, else
references.yaml's links; or a cluster preset's hierarchical network, ``network_model``), and the
replayed step with its loss of efficiency split into fixed cost, exposed communication, compute
inflation and the wait for the slowest rank (they add up to 1 - efficiency).

A strong study of one GPU measured no global batch but the one its GPU trains alone; split over N
GPUs that is a sliver a GPU nobody runs, so its predicted rows hold a global batch of their own
(``held_global_batch``: the one-GPU batch on every GPU of the largest count predicted, the smaller
counts accumulating micro-batches of the one-GPU size, at most the model's cap,
``model_inputs.global_batch_caps``), each against the one-GPU step at that batch; a strong study
that measured several counts keeps its own. A study of one GPU is also predicted as weak scaling at
its one-GPU per-GPU batch held at every N: the question a user with one GPU asks. On a cluster preset (``predict_cluster``, or for a GPU study
that measured no link across nodes the preset of its own GPU, ``network_model.preset_for_gpu``) each
row carries the back-tested error of its regime (``prediction_error``); a row that replays the
study's own links is no regime of the back-test (it ran on NCCL clusters) and carries none. A
one-GPU node with no preset for its GPU predicts nothing beyond itself (a one-GPU box is not eight
one-GPU nodes over InfiniBand).

Columns: the network (where alpha and B come from, ending with the share s of B under load where
one was applied), per_gpu_batch m_N, grad_accum_steps A_N, compute_scale c, allreduce_s (the sum of
t_ring over the buckets), exposed_comm_s (max(c b, e_last) - c b), step_time_error (predicted /
measured - 1), efficiency_error (predicted - measured), typical_error (the median |error| the
back-test measured in the row's regime), fixed_step_s (other + o), compute_inflation (k + W(N) /
t_1(m_N, A_N)), the loss_* shares of t(N), the *_basis columns (where each figure comes from), and
bound (why the predicted efficiency is an upper bound, where it is one), derived_from (the study
whose one-GPU step a weak row of a one-GPU study comes from), global_batch_basis (why a predicted
strong row of a one-GPU study holds its global batch). Never imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from scalerepro.analysis.columns import SCALING_MODEL_COLUMNS
from scalerepro.analysis.tables import prediction_error
from scalerepro.analysis.tables.model_inputs import (
    BatchCap,
    global_batch_caps,
    held_global_batch,
    kept_batch_curve,
    median_profile,
    one_gpu_steps,
    rank_step,
    read_profile,
    within_step,
)
from scalerepro.analysis.tables.network_model import ClusterPreset, Link, clusters_of, links_of, preset, preset_for_gpu
from scalerepro.analysis.tables.readers import read_comm
from scalerepro.analysis.tables.step_model import (
    AllReduceNetwork,
    BatchCurve,
    Inflation,
    RingNetwork,
    Statistic,
    StepProfile,
    bandwidth_share,
    config_network,
    expected_max_normal,
    fit_comm,
    inflated,
    inflation_for,
    measured_network,
    predicted_efficiency,
    simulate_step,
    spread_for,
    statistic_of,
    straggler_spread,
    straggler_wait_s,
)
from scalerepro.common import batch_split
from scalerepro.common.references import load_optional_references

DEFAULT_PREDICT_GPUS = (8, 16, 64)
# what a predicted row takes as given rather than measured (``assumed_inputs``, "; "-joined)
ASSUMED_K_NONE = "k = 1, none measured"
ASSUMED_K_CARRIED = "k carried beyond the counts that measured it"
ASSUMED_SPREAD_NONE = "straggler spread 0, none measured"
ASSUMED_SPREAD_CARRIED = "straggler spread carried beyond the counts that measured it"
ASSUMED_LINK = "link efficiency (references.yaml's links)"
ASSUMED_EAGER_READY = "bucket ready times of an eager probe, scaled to the compiled step"
PROPORTIONAL_BOUND = "upper bound: compute taken as proportional to the micro-batch (no batch curve covers it)"
BOUND_NOTE = f"{PROPORTIONAL_BOUND}: the efficiency is at most this"


def beyond_note(measured_max: float) -> str:
    """The note of a row predicted beyond the study's hardware."""
    return f"prediction only: beyond the {measured_max:g} GPU{'' if measured_max == 1 else 's'} the study ran on"


def derived_note(micro_batch_1: int, source_study: str) -> str:
    """The note of a weak row derived from a study of one GPU (its ``derived_from``)."""
    return f"weak scaling at the one-GPU run's per-GPU batch ({micro_batch_1}) held at every count, from the {source_study} study's one-GPU step"


def _row(**values: Any) -> dict[str, Any]:
    return {column: values.get(column) for column in SCALING_MODEL_COLUMNS}


def strong_split(global_batch: int, gpus: int, micro_batch_1: int) -> tuple[int, int] | str:
    """(micro-batch per GPU, micro-batches per step) of a global batch G over N GPUs in
    micro-batches of at most the 1-GPU micro-batch m_1, as the planner schedules it
    (common.batch_split.strong_split); or why there is none."""
    try:
        return batch_split.strong_split(global_batch, gpus, micro_batch_1)
    except batch_split.BatchSplitError as error:
        return str(error)


@dataclass(frozen=True)
class _Setting:
    """What every (study, model) of one aggregation shares: the networks the study measured and
    configured, the cluster presets, and the back-test's errors, from one read of references.yaml."""

    named: ClusterPreset | None  # scaling.predict_cluster's preset
    own: ClusterPreset | None  # the preset of the study's own GPU, where it names none
    own_why: str | None
    ran_on_gpu: bool
    errors: prediction_error.ErrorTable | None
    links: Mapping[str, Link]
    fits: Mapping[int, tuple[RingNetwork, int]]  # GPU count -> (alpha and B fitted, nodes)
    fit_problems: Mapping[int, str]
    predict_gpus: Sequence[int]
    record_files: Mapping[str, str] = field(default_factory=dict)
    batch_caps: Mapping[str, BatchCap] = field(default_factory=dict)  # model -> the largest global batch it is trained at

    @property
    def measured_across(self) -> bool:
        """Whether the study measured its own link across nodes."""
        return any(nodes > 1 for _, nodes in self.fits.values())


def _setting(
    runs: pd.DataFrame,
    comm_paths: Iterable[str | os.PathLike[str]],
    references: Mapping[str, Any],
    predict_cluster: str | None,
    predict_gpus: Sequence[int],
    record_files: Mapping[str, str] | None,
) -> _Setting:
    presets = clusters_of(references)
    named = preset(presets, predict_cluster) if predict_cluster else None
    # A GPU study that names no preset predicts the counts beyond its node (where it measured no
    # link across nodes) on the preset of its own GPU, never on nodes the size of the machine it
    # ran on: a one-GPU box as eight one-GPU nodes over InfiniBand is a shape nobody has.
    counted = runs[runs["counts"].astype(bool)] if "counts" in runs.columns else runs
    gpu_runs = counted[counted["device_type"].eq("cuda")] if "device_type" in counted.columns else runs.iloc[0:0]
    own, own_why = (None, None)
    if named is None and len(gpu_runs):
        own, own_why = preset_for_gpu(presets, gpu_runs.get("device_name", pd.Series(dtype=str)).dropna())
    fits: dict[int, tuple[RingNetwork, int]] = {}
    fit_problems = {}
    for path in comm_paths:
        document = read_comm(path)
        try:
            fits[document["world_size"]] = (fit_comm(document, Path(path).name), document["nodes"])
        except ValueError as error:
            fit_problems[document["world_size"]] = str(error)
    return _Setting(
        named,
        own,
        own_why,
        bool(len(gpu_runs)),
        prediction_error.error_table_of(references),
        links_of(references),
        fits,
        fit_problems,
        predict_gpus,
        record_files or {},
        global_batch_caps(references),
    )


def _jobs(scaled: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame, bool]]:
    """(study predicted, model, the runs it comes from, whether it is weak scaling derived from a
    study of one GPU): a model whose only study ran one GPU is also predicted at its per-GPU batch
    held at N, the question a one-GPU user has, from that study's one-GPU run."""
    jobs = [(str(study), str(model), cell_runs, False) for (study, model), cell_runs in scaled.groupby(["study", "model"], sort=True)]
    for study, model, cell_runs, _ in list(jobs):
        if study == "strong" and int(cell_runs["gpus"].max()) == 1 and not (scaled["study"].eq("weak") & scaled["model"].eq(model)).any():
            jobs.append(("weak", model, cell_runs, True))
    jobs.sort(key=lambda job: (job[0], job[1]))
    return jobs


@dataclass
class _ModelFit:
    """One (study, model)'s one-GPU step and how it scales: the profile replayed, its batch curve,
    the measured one-GPU steps in the study's statistic, and what its multi-rank runs measured."""

    profile: StepProfile
    profile_run: str
    micro_1: int
    curve: BatchCurve | None
    curve_why: str
    steps_1: dict[tuple[int, int], float]
    compiled: bool  # the one-GPU run compiled: its bucket probe ran the eager model (training.buckets)
    measured_inflation: list[Inflation] = field(default_factory=list)

    @property
    def fixed_s(self) -> float:
        """other + o: the per-step cost that does not shrink with the batch."""
        return self.profile.other_s + self.profile.optimizer_s

    def on_curve(self, micro: int) -> bool:
        return micro != self.micro_1 and self.curve is not None and self.curve.covers(micro)

    def compute_scale_at(self, micro: int) -> float:
        """c: through the batch curve where it covers ``micro``, else proportional to it."""
        if micro == self.micro_1:
            return 1.0
        if self.curve is not None and self.curve.covers(micro):
            return self.curve.compute_scale(micro, self.micro_1, self.fixed_s)
        return micro / self.micro_1

    def profile_step(self, micro: int, accum: int) -> float:
        """The profile's own step without communication at (c, A)."""
        return simulate_step(self.profile, RingNetwork(1, 0.0, math.inf, "one GPU"), self.compute_scale_at(micro), accum).step_s

    def step_1_at(self, micro: int, accum: int) -> float:
        """t_1(m, A) in the statistic the study's efficiency is in: a one-GPU step measured where
        the study ran it, else the profile's own step scaled to the statistic."""
        in_statistic = self.steps_1.get((self.micro_1, self.profile.micro_batches), self.profile.step_s) / self.profile.step_s
        return self.steps_1.get((micro, accum)) or in_statistic * self.profile_step(micro, accum)

    @property
    def reference_step(self) -> float:
        """t(1): every efficiency's numerator."""
        return self.step_1_at(self.micro_1, self.profile.micro_batches)


def _model_fit(
    runs: pd.DataFrame, one: pd.DataFrame, found: list[tuple[StepProfile | None, str]], micro_1: int, study: str, model: str, setting: _Setting
) -> _ModelFit:
    """The one-GPU profile of a (study, model), the median of its one-GPU runs', and how it scales."""
    profile = within_step(median_profile([profile for profile, _ in found if profile is not None]))
    # the model's one-GPU steps under the profile's conditions, and the batch curve through them
    same = runs["model"].eq(model) & runs["study"].isin(["strong", "weak", "sensitivity"])
    if "precision_recorded" in runs.columns and one["precision_recorded"].notna().any():
        same &= runs["precision_recorded"].eq(one["precision_recorded"].dropna().iloc[0])
    single = {m: t for (m, a), t in one_gpu_steps(runs[same]).items() if a == 1}
    curve = BatchCurve.fit(list(single), list(single.values()), f"one-GPU {model} runs, one micro-batch a step")
    curve_why = "one micro-batch measured"
    if curve is None:
        files = [setting.record_files.get(run_id, path) for run_id, path in zip(one["run_id"], one["record"])]
        curve, curve_why = kept_batch_curve(files, model, one.get("device_name", pd.Series(dtype=str)).dropna())
    fit = _ModelFit(
        profile,
        ", ".join(one["run_id"][[p is not None for p, _ in found]]),
        micro_1,
        curve,
        curve_why,
        one_gpu_steps(runs[same], statistic_of(study)),
        bool(one["compile_mode"].dropna().ne("none").any()) if "compile_mode" in one.columns else False,
    )
    fit.measured_inflation = _measured_inflation(runs[runs["model"].eq(model)], fit, statistic_of(study), setting.fits)
    return fit


def _measured_inflation(model_runs: pd.DataFrame, fit: _ModelFit, statistic: Statistic, fits: Mapping[int, tuple[RingNetwork, int]]) -> list[Inflation]:
    """What each counted multi-rank run of the model measured of running its ranks together: k, s and sigma / t."""
    measured = []
    for _, run in model_runs[model_runs["study"].isin(["strong", "weak"]) & model_runs["gpus"].gt(1)].iterrows():
        step = rank_step(run, statistic)
        if step is None or not bool(run["counts"]):
            continue
        key = (int(run["per_gpu_batch"]), int(run.get("grad_accum_steps", 1) or 1))
        uninflated = fit.profile_step(*key)
        step_1 = fit.step_1_at(*key)  # t_1(m_N, A_N)
        occupancy = min(int(run["gpus"]), int(run["gpus_per_node"]))
        # s: the bandwidth at which the replay, its compute at this run's own k, exposes what
        # the run measured exposed, on the benchmark at this count
        share = None
        if step.exposed_s is not None and int(run["gpus"]) in fits:
            share = bandwidth_share(
                inflated(fit.profile, step.nosync_s / uninflated), fits[int(run["gpus"])][0], step.exposed_s, fit.compute_scale_at(key[0]), key[1]
            )
        # k: the typical rank's compute where the window splits out the wait for the slowest
        # (that wait then grows with N, the spread sigma / t), else the probe's step that holds it
        spread = straggler_spread(step.straggler_s, int(run["gpus"]), step.compute_s) if step.straggler_s is not None else None
        measured.append(Inflation(str(run["study"]), int(run["gpus"]), occupancy, step.compute_s / step_1, share, step.measured_in, spread))
    return measured


def _unpredicted_rows(study: str, model: str, cells: pd.DataFrame, batches: pd.Series, found: list[tuple[StepProfile | None, str]]) -> list[dict[str, Any]]:
    """The measured cells of a (study, model) with no one-GPU profile to replay, each saying why."""
    why = "; ".join(sorted({reason for _, reason in found})) or "no completed 1-GPU run of this study and model"
    return [
        _row(
            study=study,
            model=model,
            gpus=gpus,
            nodes=cell["nodes"],
            basis="measured",
            step_time_measured_s=cell["step_time_median_s"],
            efficiency_measured=cell["efficiency"],
            per_gpu_batch=batches.get(gpus),
            note=f"no prediction: {why}",
        )
        for gpus, cell in cells.iterrows()
    ]


def _network(gpus: int, basis: str, cluster: ClusterPreset | None, gpus_per_node: int, setting: _Setting) -> tuple[AllReduceNetwork, bool]:
    """The network a row's all-reduces run on, and whether it is a link the study's own benchmark
    measured (not references.yaml's); a ValueError says why there is none."""
    if gpus == 1:
        return RingNetwork(1, 0.0, math.inf, "one GPU: no all-reduce"), False
    if basis == "measured":
        if gpus not in setting.fits:
            raise ValueError(setting.fit_problems.get(gpus, f"no all-reduce benchmark at {gpus} GPUs (results/comm/g{gpus}.json)"))
        return setting.fits[gpus][0], True
    if cluster is not None:
        return cluster.network(gpus), False
    measured = measured_network(setting.fits, gpus, gpus_per_node)
    return (measured, True) if measured is not None else (config_network(setting.links, gpus, gpus_per_node), False)


def _curve_text(fit: _ModelFit, micro: int, row: dict[str, Any]) -> str:
    """Where c came from, setting the row's bound where the compute is taken as proportional."""
    if fit.on_curve(micro):
        assert fit.curve is not None
        return fit.curve.describe()
    if micro != fit.micro_1:
        why = f"m = {micro} outside the curve's {fit.curve.describe()}" if fit.curve is not None else fit.curve_why
        row["bound"] = PROPORTIONAL_BOUND
        return f"proportional: {why}"
    # the one-GPU run's own micro-batch: no curve is needed
    return fit.curve.describe() if fit.curve is not None else f"none needed at the one-GPU micro-batch ({fit.curve_why})"


@dataclass(frozen=True)
class _Target:
    """One row to predict: a (study, model) at a GPU count, measured or beyond the hardware."""

    study: str
    gpus: int
    basis: str  # "measured" | "predicted"
    cluster: ClusterPreset | None
    node_size: int
    gpus_per_node: int  # the study's own
    derived: bool  # weak scaling from a study of one GPU
    reference_split: tuple[int, int] | None = None  # the one-GPU step at a held global batch (``HeldBatch``)


def _predict(row: dict[str, Any], target: _Target, fit: _ModelFit, split: tuple[int, int], setting: _Setting) -> bool:
    """Fill ``row`` with the replayed step at ``split`` (m_N, A_N); False (its note saying why)
    where no network carries it."""
    study, gpus, basis, is_measured = target.study, target.gpus, target.basis, target.basis == "measured"
    micro, accum = split
    compute_scale = fit.compute_scale_at(micro)  # c = m_N / m_1, or through the batch curve
    occupancy = min(gpus, target.node_size)
    k, k_basis = inflation_for(fit.measured_inflation, study, gpus, occupancy, is_measured)
    spread, spread_basis = spread_for(fit.measured_inflation, study, gpus, is_measured)
    step_1 = fit.step_1_at(micro, accum)  # t_1(m_N, A_N)
    # t(1): the one-GPU step at the row's global batch
    reference_step = fit.step_1_at(*target.reference_split) if target.reference_split is not None else fit.reference_step
    # K: every phase scaled so that the step without communication is k t_1(m_N, A_N)
    factor = k * step_1 / fit.profile_step(micro, accum)
    straggler_s = straggler_wait_s(spread, gpus, k * step_1)  # W(N) = sigma e_N
    row.update(
        per_gpu_batch=micro,
        grad_accum_steps=accum,
        compute_scale=compute_scale,
        compute_inflation=k + straggler_s / step_1,
        inflation_basis=k_basis,
        batch_curve=_curve_text(fit, micro, row),
        straggler_basis=(
            f"{spread_basis}; sigma / t = {spread:.3g}, W({gpus}) = sigma x e_{gpus} = {expected_max_normal(gpus):.3f} "
            "sigma (a normal fitted to the mean wait: the record keeps no per-step times)"
        )
        if spread
        else spread_basis,
    )
    try:
        network, own_link = _network(gpus, basis, target.cluster, target.gpus_per_node, setting)
    except ValueError as error:
        row["note"] = f"no prediction: {error}"
        return False
    if own_link:
        assert isinstance(network, RingNetwork)
        # the all-reduce under load: the benchmark measured it alone, the step runs it
        # beside the backward (on a CPU, on the same cores)
        share, share_basis = inflation_for(fit.measured_inflation, study, gpus, occupancy, is_measured, "bandwidth_share")
        network = RingNetwork(
            gpus, network.alpha_step_s, share * network.link_bytes_per_s, f"{network.source}; B under load {share:.3g} x the benchmark's ({share_basis})"
        )
    prediction = simulate_step(inflated(fit.profile, factor), network, compute_scale, accum)
    step_n = prediction.step_s + straggler_s  # the last bucket waits for the slowest rank's backward
    if gpus > 1:
        row["assumed_inputs"] = "; ".join(_assumed(fit, gpus, occupancy, is_measured, own_link)) or None
    # What the loss of efficiency is lost to: ideal is t(1) / N (strong) or t(1) (weak);
    # t(N) - ideal = the all-reduce left exposed + what inflation adds to the compute,
    # (k - 1) t_1(m_N, A_N) + the wait for the slowest rank W(N) + the per-step cost that
    # does not shrink with the batch, (other + o)(1 - 1/N) strong, nothing weak
    ideal = reference_step / gpus if study == "strong" else reference_step
    inflation_s = (k - 1) * step_1
    row.update(
        fixed_step_s=fit.fixed_s,
        loss_exposed_comm=prediction.exposed_comm_s / step_n,
        loss_compute_inflation=inflation_s / step_n,
        loss_straggler=straggler_s / step_n,
        loss_fixed_cost=max(step_n - ideal - prediction.exposed_comm_s - inflation_s - straggler_s, 0.0) / step_n,
        network=network.source,
        # one alpha and B for a flat ring; a cluster's two levels are in ``network``
        alpha_step_us=network.alpha_step_s * 1e6 if isinstance(network, RingNetwork) else None,
        link_gbps=network.link_bytes_per_s / 1e9 if isinstance(network, RingNetwork) and math.isfinite(network.link_bytes_per_s) else None,
        allreduce_s=prediction.allreduce_s,
        comm_share=prediction.allreduce_s / step_n,
        exposed_comm_s=prediction.exposed_comm_s,
        step_time_predicted_s=step_n,
        efficiency_predicted=predicted_efficiency(study, reference_step, step_n, gpus),
    )
    return True


def _assumed(fit: _ModelFit, gpus: int, occupancy: int, is_measured: bool, own_link: bool) -> list[str]:
    """What a row of ``gpus`` (``occupancy`` a node) takes as given rather than measured: k and
    the straggler spread beyond the counts that measured them (none measured: 1 and 0), the
    link where it is references.yaml's, and the bucket ready times of an eager probe where the
    step compiled (``step_model.inflation_for``, ``spread_for`` say where each measured one comes from)."""
    assumed = []
    if occupancy > 1 and not is_measured:
        measured_k = any(m.factor is not None and m.occupancy <= occupancy for m in fit.measured_inflation)
        assumed.append(ASSUMED_K_CARRIED if measured_k else ASSUMED_K_NONE)
    if not is_measured:
        measured_spread = any(m.spread is not None for m in fit.measured_inflation)
        assumed.append(ASSUMED_SPREAD_CARRIED if measured_spread else ASSUMED_SPREAD_NONE)
    if not own_link:
        assumed.append(ASSUMED_LINK)
    if fit.compiled:
        assumed.append(ASSUMED_EAGER_READY)
    return assumed


def _compare_and_note(row: dict[str, Any], target: _Target, fit: _ModelFit, measured_max: int, source_study: str, setting: _Setting) -> None:
    """The prediction's error beside a measured cell, and the row's note and back-tested error."""
    if row["step_time_measured_s"] is not None and not pd.isna(row["step_time_measured_s"]):
        row["step_time_error"] = row["step_time_predicted_s"] / row["step_time_measured_s"] - 1  # predicted / measured - 1
    if row["efficiency_measured"] is not None and not pd.isna(row["efficiency_measured"]):
        row["efficiency_error"] = row["efficiency_predicted"] - row["efficiency_measured"]  # predicted - measured
    if target.basis == "predicted":
        row["note"] = beyond_note(measured_max)
        if target.derived:
            row["note"] += f"; {derived_note(fit.micro_1, source_study)}"
            row["derived_from"] = source_study
        if row["bound"]:
            row["note"] += f"; {BOUND_NOTE}"
    cluster = target.cluster
    if cluster is not None:
        # the back-tested error of the row's own regime, or none: an error measured on another
        # regime is no error bar of this one
        micro = int(row["per_gpu_batch"])
        regime = prediction_error.regime_of(
            "ddp", int(row["nodes"]), micro, fit.micro_1, fit.curve.knee if fit.curve is not None and fit.on_curve(micro) else None
        )
        row.update(prediction_error.error_columns(regime, setting.errors, row["comm_share"], int(row["grad_accum_steps"])))
        row["cluster"] = cluster.key
        row["cluster_basis"] = "scaling.predict_cluster" if setting.named is not None else setting.own_why
        # its own column: the report says the cluster and its regimes' errors once, above the table
        row["cluster_note"] = f"on {cluster.name}; " + (
            f"the model's typical error in its regime ({regime.key}) is ±{row['typical_error']:.1%}: {row['error_basis']}"
            if row["typical_error"] is not None
            else f"no typical error: {row['error_basis']} ({regime.key})"
        )
    elif target.basis == "predicted":
        row["error_basis"] = f"{prediction_error.NO_BACK_TEST}: the back-test ran on NCCL clusters' published series; this row replays the study's own links"


def _job_rows(runs: pd.DataFrame, scaling: pd.DataFrame, job: tuple[str, str, pd.DataFrame, bool], setting: _Setting) -> list[dict[str, Any]]:
    """The rows of one (study, model): its measured cells and the counts beyond them."""
    study, model, cell_runs, derived = job
    source_study = str(cell_runs["study"].iloc[0])
    cells = scaling[scaling["study"].eq(source_study) & scaling["model"].eq(model)].set_index("gpus")
    one = cell_runs[cell_runs["gpus"].eq(1) & cell_runs["counts"]]
    first = cell_runs.drop_duplicates("gpus").set_index("gpus")
    batches = first["per_gpu_batch"]
    accumulation = first["grad_accum_steps"] if "grad_accum_steps" in first else pd.Series(1, index=first.index)
    gpus_per_node = int(cell_runs["gpus_per_node"].iloc[0])
    found = [read_profile(setting.record_files.get(run_id, path)) for run_id, path in zip(one["run_id"], one["record"])]
    if not any(profile is not None for profile, _ in found):
        return [] if derived else _unpredicted_rows(study, model, cells, batches, found)
    fit = _model_fit(runs, one, found, int(batches[1]), study, model, setting)
    # the strong study's global batch G, the same at every N; a study of one GPU holds its own
    # beyond it (``held_global_batch``)
    global_batch = int(first.loc[1, "global_batch"]) if study == "strong" else None
    measured_max = max(cells.index)
    targets = [] if derived else [(g, "measured") for g in cells.index]
    targets += [(g, "predicted") for g in sorted(set(setting.predict_gpus)) if g > measured_max]
    beyond = [g for g, basis in targets if basis == "predicted"]
    held = None
    if global_batch is not None and measured_max == 1 and beyond:
        held = held_global_batch(global_batch, fit.micro_1, beyond, model, setting.batch_caps.get(model))
    rows = []
    for gpus, basis in targets:
        cell = cells.loc[gpus] if basis == "measured" else None
        beyond_node = basis == "predicted" and gpus > gpus_per_node and not setting.measured_across
        cluster = (setting.named or (setting.own if beyond_node else None)) if basis == "predicted" else None
        if beyond_node and setting.named is None and setting.own is None and setting.ran_on_gpu and gpus_per_node == 1:
            note = f"no prediction beyond the one-GPU node the study ran on: {setting.own_why}; name a preset as scaling.predict_cluster (clusters in config/references.yaml)"
            rows.append(_row(study=study, model=model, gpus=gpus, basis=basis, note=note))
            continue
        held_here = held if basis == "predicted" else None
        target = _Target(
            study,
            gpus,
            basis,
            cluster,
            cluster.gpus_per_node if cluster is not None else gpus_per_node,
            gpus_per_node,
            derived,
            held_here.reference_split if held_here is not None else None,
        )
        row_batch = held_here.global_batch if held_here is not None else global_batch
        row = _row(
            study=study,
            model=model,
            gpus=gpus,
            nodes=cell["nodes"] if cell is not None else -(-gpus // target.node_size),
            basis=basis,
            buckets=len(fit.profile.bucket_bytes),
            gradient_bytes=sum(fit.profile.bucket_bytes),
            profile_run=fit.profile_run,
            global_batch=row_batch,
            global_batch_basis=held_here.basis if held_here is not None else None,
            step_time_measured_s=None if cell is None else cell["step_time_median_s"],
            efficiency_measured=None if cell is None else cell["efficiency"],
            note="",
        )
        # m_N and A_N: the matrix's where measured; beyond it G / N (strong) or m_1, A_1 (weak)
        if basis == "measured":
            split: tuple[int, int] | str = (int(batches[gpus]), int(accumulation.get(gpus, 1)))
        elif row_batch is not None:
            split = strong_split(row_batch, gpus, fit.micro_1)
        else:
            split = (fit.micro_1, fit.profile.micro_batches)
        if isinstance(split, str):
            row["note"] = f"no prediction: {split}"
        elif _predict(row, target, fit, split, setting):
            _compare_and_note(row, target, fit, measured_max, source_study, setting)
        rows.append(row)
    return rows


def scaling_model_table(
    runs: pd.DataFrame,
    scaling: pd.DataFrame,
    comm_paths: Iterable[str | os.PathLike[str]],
    references_path: str | os.PathLike[str] | None,
    predict_gpus: Sequence[int] = DEFAULT_PREDICT_GPUS,
    predict_cluster: str | None = None,
    record_files: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """scaling_model.csv (module docstring). ``runs``/``scaling`` are the aggregation's tables;
    ``record_files``: each run's record file (readers.read_matrix's, inside the study folder), by
    default the runs' ``record`` as written; the study folder they lie in is where a kept batch
    curve is looked for (``model_inputs.kept_batch_curve``). ``predict_cluster``: a preset of
    ``clusters`` in references.yaml, on whose hierarchical network the counts beyond the study's
    hardware are predicted, each beside the back-tested error of its regime."""
    setting = _setting(runs, comm_paths, load_optional_references(references_path), predict_cluster, predict_gpus, record_files)
    scaled = runs[runs["study"].isin(["strong", "weak"])]
    rows = [row for job in _jobs(scaled) for row in _job_rows(runs, scaling, job, setting)]
    table = pd.DataFrame(rows, columns=SCALING_MODEL_COLUMNS)
    return table.sort_values(["study", "model", "gpus"], kind="stable", ignore_index=True)
