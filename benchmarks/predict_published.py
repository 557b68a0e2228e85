"""The scaling model against published multi-node runs, as a back-test: from what a user would have
before the large run, predict the published figures held back, and print predicted / published - 1
per row, beside plain ideal scaling's, by regime and term by term.

    .venv/bin/python benchmarks/predict_published.py [--regimes-yaml]

What the model is given, per series (the published figures, their conditions and sources are in
config/references.yaml and config/references.md, read here by id):

- the published figure at the series' smallest count (Lambda's 1 GPU, else one 8-GPU node, or the
  smallest count a series starts at), which gives the step time there: t0 = samples per step /
  samples per second;
- the model's gradient bytes: parameters (the real model definition, counted on the meta device,
  or the count the source states for a model the zoo does not hold) x bytes of the all-reduced
  dtype;
- the step's phases: for DDP's overlap, when each 25 MiB gradient bucket is ready in the backward,
  from a CPU profile of the real model (post-accumulate-grad hooks, buckets laid out as DDP lays
  them, ``scalerepro.training.buckets``), or for a transformer the zoo does not hold, its blocks
  ready one after another through the backward; for FSDP, its units of wrapping (one a block) and
  the root unit (the parameters no block holds); scaled to the published step: the one factor on
  the compute that makes the model give t0 back at the given count
  (``published_steps.fit_compute_to_step``);
- the optimizer's time: its memory traffic (bytes per parameter, below) at the GPU's HBM peak
  (``scalerepro.common.gpu_peaks``), an elementwise update being memory-bound;
- the cluster's published link rates and fabric (``clusters`` and ``links`` of
  config/references.yaml).

The back-test. Of a series' counts c_1 < ... < c_k the model is given c_1; on a series of three or
more counts the straggler spread (below) is fitted on c_2 .. c_j, j = ceil(k / 2), and the counts
above c_j are held back; of two counts, c_2 is held back and nothing is fitted. Nothing is fitted to
a held-back row. Each held-back row's error is e = predicted / published - 1, beside ideal scaling's
from the same given figure (N / N0 times it, per-GPU figures unchanged): a model is worth what it
predicts beyond that. The rows fall into regimes (``prediction_error``: strategy, node count, the
per-GPU batch against the batch curve's knee, where the compute came from); the table of each
regime's median and largest |e| is what ``--regimes-yaml`` prints for references.yaml's
``prediction_error_by_regime``, the error bar every prediction of that regime carries.

The terms, each added in turn (the table "series x terms"): the model without them (DDP or FSDP
on the two-level network, NCCL's collectives as ring and tree hops alone); + the straggler wait,
sigma e_N (``step_model.straggler_wait_s``; a published series has no per-rank times, so its
spread sigma / t is fitted on c_2 .. c_j as above, 0 where nothing is fitted); + the collectives of
sharded strategies at scale (FSDP's root unit apart from its blocks, and NCCL's tuner: base latency,
the ring's plateau, the tree's bandwidth factors, ``network_model``); + the fabric's tiers (leaves
and spine, ``network_model.Topology``).

Where a series changes the per-GPU batch between counts (MLPerf's ResNet-50 holds its global batch:
400 images a GPU at 8 GPUs, 50 at 64), the compute at the new batch comes from a measured step-time
curve over the batch on the series' GPU and model (``step_model.BatchCurve``; ``--batch-curve``,
by default the newest ``benchmarks/gpu/h100-*/batch_curve.json`` that ``benchmarks/gpu/batch_curve.py``
wrote on an H100), within the batches it was measured at. Without one, the compute is taken as
proportional to the batch and the row says that the curve is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # predict_parallel beside it

import torch  # noqa: E402
import yaml  # noqa: E402
from predict_parallel import _golden_minimum, _median_abs, print_parallel_backtest, roles  # noqa: E402

from scalerepro.analysis.tables import network_model, prediction_error, published_steps, step_model  # noqa: E402
from scalerepro.common import gpu_peaks  # noqa: E402
from scalerepro.models.registry import ModelShape, build, resolve  # noqa: E402
from scalerepro.record.read import read  # noqa: E402
from scalerepro.training import buckets  # noqa: E402

REFERENCES = REPO / "config" / "references.yaml"
COMMAND = "benchmarks/predict_published.py"
DDP_BUCKET_CAP_MB = 25.0  # DDP's default bucket_cap_mb
# Optimizer memory traffic per parameter, bytes read + written at fp32 (an elementwise update is
# memory-bound): SGD with momentum reads w, g, m and writes w, m (5 x 4); LARS adds a read of w
# and g for the per-layer norms (7 x 4); AdamW reads w, g, m, v and writes w, m, v (7 x 4);
# LAMB adds a second pass over w and the update for its trust ratio (9 x 4).
OPTIMIZER_BYTES_PER_PARAMETER = {"lars": 28, "adamw": 28, "lamb": 36}
BERT_LARGE = ModelShape(num_layers=24, hidden_size=1024, num_heads=16)  # bert_base's definition, BERT-large's shape
# MPT-1B (llm-foundry scripts/train/yamls/pretrain/mpt-1b.yaml): d_model 2048, 24 layers, vocabulary
# 50368 (tied embeddings: the root unit); NumParams 1,315,950,592 as the benchmark table states
MPT_1B_PARAMETERS, MPT_1B_ROOT = 1_315_950_592, 50_368 * 2_048
# ViT g/14 (NeMo's curated configuration): 40 layers, hidden 1408, FFN 6144, 1011 M parameters
VIT_G14_PARAMETERS, VIT_G14_BLOCK = 1_011_000_000, 4 * 1408**2 + 2 * 1408 * 6144


@dataclass(frozen=True)
class Series:
    """One published scaling series and the conditions the model needs from it."""

    label: str
    model: str  # the zoo's model of the CPU probe, or the series' own model where the zoo has none
    shape: ModelShape
    cluster: str  # a preset of references.yaml
    reference_ids: tuple[str, ...]  # the first is the figure the model is given
    micro_batch: int | None  # the per-GPU micro-batch when accumulating (None: the whole share)
    gradient_bytes_per_parameter: int  # the all-reduced (DDP) or reduce-scattered (FSDP) dtype
    overlap: bool  # DDP all-reduces buckets during the backward; False: after the last backward
    optimizer: str
    hbm_peaks: str  # gpu_peaks key: the optimizer's memory bandwidth
    parallel: Literal["ddp", "fsdp", "3d"] = "ddp"
    note: str = ""
    curve_gpu: str = "H100"  # the GPU whose batch curve a change of per-GPU batch needs
    # a model the zoo does not hold: its parameters as the source states them, its units (FSDP's
    # wrapped blocks, DDP's blocks), and the parameters outside them (embeddings, head)
    parameters: int | None = None
    units: int | None = None
    root_parameters: int = 0
    gather_bytes_per_parameter: int = 2  # FSDP's all-gathered dtype
    reshard_after_forward: bool = True  # FSDP FULL_SHARD (FSDP2's default); False: SHARD_GRAD_OP
    assumed_samples_per_gpu: int | None = None  # where the source states no per-GPU batch: the one assumed, said in ``note``


SERIES = (
    Series(
        "Lambda RN50 fp16 NGC22.09",
        "resnet50",
        ModelShape(),
        "dgx_h100",
        tuple(f"lambda-rn50-h100sxm-fp16-{n}" for n in (1, 2, 4, 8)),
        None,
        4,
        True,
        "lars",
        "h100_sxm",
        note="PyTorch native DDP with AMP: fp32 gradients, 25 MiB buckets; SGD (counted as LARS's traffic)",
    ),
    Series(
        "Lambda RN50 fp16 NGC24.03",
        "resnet50",
        ModelShape(),
        "dgx_h100",
        tuple(f"lambda-rn50-h100sxm-fp16-ngc2403-{n}" for n in (1, 2, 4, 8)),
        None,
        4,
        True,
        "lars",
        "h100_sxm",
    ),
    Series(
        "MLPerf v3.0 RN50 DGX H100",
        "resnet50",
        ModelShape(),
        "dgx_h100",
        ("mlperf-v3.0-rn50-dgxh100-8", "mlperf-v3.0-rn50-dgxh100-64"),
        None,
        2,
        True,
        "lars",
        "h100_sxm",
        note="MXNet + Horovod, fp16 gradients; global batch 3200 fixed: 400 -> 50 images per GPU",
    ),
    Series(
        "DLE BERT-large ph1 DGX A100",
        "bert_base",
        BERT_LARGE,
        "dgx_a100",
        tuple(f"dle-bert-large-p1-a100-{n}" for n in (8, 16, 32, 64, 128, 256)),
        256,
        2,
        False,
        "lamb",
        "a100_sxm_80gb",
        note="fp16 gradients all-reduced once after the accumulated micro-batches (no overlap)",
    ),
    Series(
        "DLE BERT-large ph2 DGX A100",
        "bert_base",
        BERT_LARGE,
        "dgx_a100",
        tuple(f"dle-bert-large-p2-a100-{n}" for n in (8, 16, 32, 64, 128, 256)),
        32,
        2,
        False,
        "lamb",
        "a100_sxm_80gb",
    ),
    Series(
        "torchtitan Llama3.1-8B FSDP",
        "llama3_8b",
        ModelShape(),
        "dgx_h100",
        ("torchtitan-llama31-8b-fsdp-8", "torchtitan-llama31-8b-fsdp-128"),
        None,
        4,
        True,
        "adamw",
        "h100_sxm",
        parallel="fsdp",
        note="FSDP2: bf16 all-gathers, fp32 reduce-scatters, 32 blocks and the root (embeddings, norm, head)",
    ),
    Series(
        "MPT-1B FSDP FULL_SHARD",
        "mpt_1b",
        ModelShape(),
        "dgx_h100",
        tuple(f"mosaicml-mpt-1b-fsdp-h100-{n}" for n in (8, 16, 32, 64)),
        None,
        4,
        True,
        "adamw",
        "h100_sxm",
        parallel="fsdp",
        parameters=MPT_1B_PARAMETERS,
        units=24,
        root_parameters=MPT_1B_ROOT,
        note="Composer FSDP1, amp_bf16 (mixed precision DEFAULT: bf16 gathers, fp32 reduce-scatters); micro-batch 14 at 8 GPUs, 20 beyond",
    ),
    Series(
        "MPT-1B FSDP SHARD_GRAD_OP",
        "mpt_1b",
        ModelShape(),
        "dgx_h100",
        tuple(f"mosaicml-mpt-1b-fsdp-h100-large-{n}" for n in (128, 256, 512)),
        None,
        4,
        True,
        "adamw",
        "h100_sxm",
        parallel="fsdp",
        parameters=MPT_1B_PARAMETERS,
        units=24,
        root_parameters=MPT_1B_ROOT,
        reshard_after_forward=False,
        note="the README's Large Scale rows: SHARD_GRAD_OP (gathered once a step), micro-batch 12 at every count",
    ),
    Series(
        "NeMo ViT g/14 DGX H100",
        "vit_g_14",
        ModelShape(),
        "dgx_h100",
        tuple(f"nemo-vit-g14-dgxh100-{n}" for n in (8, 16, 32, 64, 128)),
        None,
        4,
        True,
        "adamw",
        "h100_sxm",
        parameters=VIT_G14_PARAMETERS,
        units=40,
        root_parameters=VIT_G14_PARAMETERS - 40 * VIT_G14_BLOCK,
        assumed_samples_per_gpu=64,
        note="the performance page states no batch: 64 images a GPU assumed (NeMo's curated g/14 configuration); "
        "Megatron DDP, fp32 gradients assumed, its 40 blocks' buckets ready one after another",
    ),
    Series(
        "Megatron GPT-3 175B 3D",
        "gpt3_175b",
        ModelShape(),
        "dgx_h100",
        ("megatron-gpt3-175b-h100-96", "megatron-gpt3-175b-h100-4608"),
        None,
        4,
        True,
        "adamw",
        "h100_sxm",
        parallel="3d",
        note="global batch 1152 fixed; data, tensor and pipeline parallel with overlap",
    ),
)


@dataclass(frozen=True)
class Terms:
    """Which of the new terms a prediction takes (module docstring)."""

    straggler: bool = True
    collectives: bool = True  # FSDP's root unit and NCCL's tuner
    tiers: bool = True


ALL_TERMS = Terms()
TERM_STEPS = (
    ("model without the new terms", Terms(False, False, False)),
    ("+ straggler", Terms(True, False, False)),
    ("+ sharded collectives", Terms(True, True, False)),
    ("+ tiers", Terms(True, True, True)),
)


# ---- the CPU profile -----------------------------------------------------------------------


@dataclass(frozen=True)
class CpuProfile:
    """One eager forward + backward on the CPU: the split and when each DDP bucket is ready."""

    forward_s: float
    backward_s: float
    bucket_parameters: tuple[int, ...]  # parameters per bucket, in all-reduce order
    bucket_ready_fraction: tuple[float, ...]  # ready time / backward time
    parameters: int
    seconds: float  # the probe's own wall time


def _inputs(model: str, spec, batch: int):
    if model == "resnet50":
        return (torch.randn(batch, 3, spec.image_size, spec.image_size),)
    tokens = torch.randint(0, spec.vocab_size, (batch, spec.seq_len))
    return (tokens, torch.arange(spec.num_masked).expand(batch, -1))


def cpu_profile(model: str, shape: ModelShape, batch: int, steps: int = 2) -> CpuProfile:
    """``steps`` eager forward + backward passes of the real model at ``batch`` (the first a
    warm-up); the median of the rest."""
    start = time.perf_counter()
    torch.manual_seed(0)
    spec = resolve(model, shape)
    net = build(spec).train()
    params = [p for p in net.parameters() if p.requires_grad]
    inputs = _inputs(model, spec, batch)
    forwards, backwards, readies, order = [], [], [], []
    for _ in range(steps):
        ready = {}
        origin = [0.0]

        def hook_for(index: int):
            def hook(_: torch.Tensor) -> None:
                ready[index] = time.perf_counter() - origin[0]
                if index not in order:
                    order.append(index)

            return hook

        handles = [p.register_post_accumulate_grad_hook(hook_for(i)) for i, p in enumerate(params)]
        net.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = net(*inputs).float().square().mean()
        t1 = origin[0] = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        for handle in handles:
            handle.remove()
        forwards.append(t1 - t0)
        backwards.append(t2 - t1)
        readies.append(ready)
    forward_s, backward_s = statistics.median(forwards[1:]), statistics.median(backwards[1:])
    first_cap, cap = buckets.bucket_caps_bytes(DDP_BUCKET_CAP_MB)
    sizes = [p.numel() * 4 for p in params]
    layout = buckets.bucket_layout(sizes, order, first_cap, cap)
    measured = readies[1:]
    fractions = tuple(statistics.median(max(r[i] for i in bucket) for r in measured) / backward_s for bucket in layout)
    return CpuProfile(
        forward_s,
        backward_s,
        tuple(sum(params[i].numel() for i in bucket) for bucket in layout),
        fractions,
        spec.num_parameters,
        time.perf_counter() - start,
    )


def transformer_profile(parameters: int, units: int, root_parameters: int) -> CpuProfile:
    """A transformer of ``units`` equal blocks that the zoo does not hold, as DDP sees it: the
    backward computes the blocks in reverse at equal cost, so block i's gradients (a bucket each)
    are ready at (i + 1) / L of the backward, the embeddings' and head's (the root) at its end;
    forward : backward = 1 : 2 (the backward's matmuls are twice the forward's)."""
    block = (parameters - root_parameters) // units
    return CpuProfile(1 / 3, 2 / 3, (block,) * units + (root_parameters,), tuple((i + 1) / units for i in range(units)) + (1.0,), parameters, 0.0)


# ---- the prediction --------------------------------------------------------------------------


def _share(series: Series, reference: dict) -> int:
    """Samples per GPU per optimizer step (the series' assumption where the source states none)."""
    stated = reference["conditions"].get("per_gpu_samples_per_step")
    return int(stated if stated is not None else series.assumed_samples_per_gpu)


def _step_s(series: Series, reference: dict) -> float:
    """The published step time: samples per step / samples per second (tokens for tokens/s/GPU)."""
    share = _share(series, reference)
    if reference["metric"] == "tokens_per_s_per_gpu":
        return share * reference["conditions"]["seq_len"] / reference["value"]
    return share * reference["gpus"] / reference["value"]


def _figure(series: Series, reference: dict, step_s: float) -> float:
    """A step time in the reference's metric."""
    share = _share(series, reference)
    if reference["metric"] == "tokens_per_s_per_gpu":
        return share * reference["conditions"]["seq_len"] / step_s
    return share * reference["gpus"] / step_s


def fsdp_units(series: Series) -> tuple[int, int, int]:
    """FSDP's units: one per transformer block (torchtitan wraps each), counted on the meta device
    or as the series states them; (parameters, units, parameters outside the blocks)."""
    if series.parameters is not None:
        return series.parameters, series.units, series.root_parameters
    with torch.device("meta"):
        model = build(resolve(series.model, series.shape))
    parameters = sum(p.numel() for p in model.parameters())
    blocks = model.layers.values() if isinstance(model.layers, torch.nn.ModuleDict) else model.layers
    in_blocks = sum(p.numel() for block in blocks for p in block.parameters())
    return parameters, len(model.layers), parameters - in_blocks


def kept_batch_curve(path: Path | None, model: str, gpu: str) -> tuple[Path, dict] | None:
    """The ``batch_curve.json`` (benchmarks/gpu/batch_curve.py) of ``model`` on ``gpu``, and its
    document: ``path``, or without one the newest kept under benchmarks/gpu/; None if none is."""
    candidates = [path] if path is not None else sorted(REPO.glob("benchmarks/gpu/*/batch_curve.json"), reverse=True)
    for candidate in candidates:
        document = json.loads(candidate.read_text())
        if document.get("model") == model and gpu in str(document.get("device")):
            return candidate, document
    return None


def read_batch_curve(found: tuple[Path, dict] | None) -> step_model.BatchCurve | None:
    """The curve of a kept ``batch_curve.json`` (``kept_batch_curve``'s answer); None where there is none."""
    if found is None:
        return None
    candidate, document = found
    rows = document["rows"]
    where = f"{candidate.relative_to(REPO) if candidate.is_relative_to(REPO) else candidate}, {document['device']}"
    return step_model.BatchCurve.fit([r["batch"] for r in rows], [r["step_s_median"] for r in rows], where)


def curve_calibration(found: tuple[Path, dict] | None) -> str | None:
    """The curve's bare loop (``kept_batch_curve``'s answer) against the trainer at a batch both
    ran: the trainer's record of the same session (``<model>-optimised-frontier.json`` beside the
    curve). The model takes only the curve's ratios t(m) / t(m0), so a bias the same at every batch
    cancels; one that is not does not."""
    if found is None:
        return None
    candidate, document = found
    record_path = candidate.parent / f"{document['model']}-optimised-frontier.json"
    if not record_path.is_file():
        return f"no calibration: no trainer record ({record_path.name}) beside {candidate.name}"
    record = read(record_path).record  # a kept H100 record, of whatever schema, in today's model
    batch = record.batch.micro_batch
    trainer_s = record.measurements.step_time_s.median if record.measurements else None
    if trainer_s is None:
        return f"no calibration: {record_path.name} has no median step"
    bare = [row["step_s_median"] for row in document["rows"] if row["batch"] == batch]
    if not bare:
        return f"no calibration: the curve has no point at the trainer's batch {batch}"
    return (
        f"calibration at batch {batch}: the curve's bare loop {bare[0] * 1e3:.2f} ms against the trainer's "
        f"{trainer_s * 1e3:.2f} ms ({record_path.name}): {bare[0] / trainer_s - 1:+.1%}; the model takes the "
        f"curve's ratios t(m) / t(m0) only"
    )


def predict_series(
    series: Series,
    references: dict[str, dict],
    presets,
    probe: CpuProfile | None,
    curve: step_model.BatchCurve | None = None,
    terms: Terms = ALL_TERMS,
) -> list[dict]:
    """One row per published count of the series (its figure, the model's prediction, ideal
    scaling's, each error and the row's part in the back-test); a 3D series gets rows without a
    prediction (the model has no pipeline or tensor-parallel step)."""
    cluster = presets[series.cluster]
    refs = [references[i] for i in series.reference_ids]
    base = refs[0]
    role = roles([r["gpus"] for r in refs])

    def micro(reference: dict) -> tuple[int, int]:
        """(micro-batch, micro-batches per step) of a reference."""
        share = _share(series, reference)
        m = series.micro_batch or share
        return m, share // m

    def ideal_of(reference: dict) -> float:
        """Plain ideal scaling from the given figure: per-GPU figures unchanged, totals x N / N0."""
        return base["value"] if reference["metric"] == "tokens_per_s_per_gpu" else base["value"] * reference["gpus"] / base["gpus"]

    def row_of(reference: dict, **values) -> dict:
        ideal = ideal_of(reference)
        return {
            "source": series.label,
            "model": "bert_large" if series.shape == BERT_LARGE else series.model,
            "gpus": reference["gpus"],
            "published": reference["value"],
            "given": reference is base,
            "role": role[reference["gpus"]],
            "ideal": ideal,
            "ideal_error": ideal / reference["value"] - 1,
            "efficiency": reference["value"] / ideal,
            "parallel": series.parallel,
            "metric": "tok/s/GPU" if reference["metric"] == "tokens_per_s_per_gpu" else "samples/s",
            **values,
        }

    if series.parallel == "3d":
        why = "no prediction: the model has no 3D step (pipeline bubble, tensor-parallel communication), and the source's text states no layout at these counts"
        return [
            row_of(
                r,
                nodes=-(-r["gpus"] // cluster.gpus_per_node),
                predicted=None,
                error=None,
                input_note=why,
                regime=None,
                exposed_ms=None,
                step_ms=None,
                comm_share=None,
                micro_batches=None,
                spread=None,
            )
            for r in refs
        ]

    hbm = gpu_peaks.PEAKS[series.hbm_peaks].hbm_tbps * 1e12
    m0, a0 = micro(base)

    def network(gpus: int) -> network_model.HierarchicalNetwork:
        return cluster.network(gpus, nccl_tuner=terms.collectives, tiers=terms.tiers)

    if series.parallel == "fsdp":
        parameters, units, root = fsdp_units(series)
        # f : b = 1 : 2 (the backward's matmuls are twice the forward's); only their sum matters
        # where the transfers hide behind them, and it is fitted to the published step
        profile = published_steps.FsdpProfile(
            step_s=1.0,
            forward_s=1.0 / 3,
            backward_s=2.0 / 3,
            optimizer_s=parameters * OPTIMIZER_BYTES_PER_PARAMETER[series.optimizer] / hbm,
            micro_batches=a0,
            units=units,
            gather_bytes=parameters * series.gather_bytes_per_parameter,
            reduce_bytes=parameters * series.gradient_bytes_per_parameter,
            reshard_after_forward=series.reshard_after_forward,
            root_fraction=root / parameters if terms.collectives else 0.0,
        )

        def simulate(p, gpus, c, a):
            return published_steps.simulate_fsdp_step(p, network(gpus), c, a)
    else:
        assert probe is not None
        parameters = probe.parameters if series.parameters is None else series.parameters
        total = probe.forward_s + probe.backward_s
        if series.overlap:
            sizes = tuple(n * series.gradient_bytes_per_parameter for n in probe.bucket_parameters)
            ready = tuple(f * probe.backward_s / total for f in probe.bucket_ready_fraction)
        else:  # one all-reduce of every gradient once the last backward is done
            sizes, ready = (parameters * series.gradient_bytes_per_parameter,), (probe.backward_s / total,)
        profile = step_model.StepProfile(
            step_s=1.0,
            forward_s=probe.forward_s / total,
            backward_s=probe.backward_s / total,
            optimizer_s=parameters * OPTIMIZER_BYTES_PER_PARAMETER[series.optimizer] / hbm,
            micro_batches=a0,
            bucket_bytes=sizes,
            bucket_ready_s=ready,
        )

        def simulate(p, gpus, c, a):
            return step_model.simulate_step(p, network(gpus), c, a)

    def scale_for(reference: dict) -> tuple[float, str, float | None]:
        """c at a reference's micro-batch, what it came from, and the knee of the curve it came from."""
        m, _ = micro(reference)
        if m == m0:
            return 1.0, "", None
        if curve is not None and curve.covers(m) and curve.covers(m0):
            return curve.compute_scale(m, m0, 0.0), f"batch curve {curve.describe()}", curve.knee
        return (
            m / m0,
            (
                f"needs the {series.curve_gpu} batch curve of {series.model} (benchmarks/gpu/batch_curve.py on an "
                f"{series.curve_gpu}, GPU issue 38): compute taken as proportional to the batch, {m0} -> {m}"
            ),
            None,
        )

    def predicted_step(fitted, reference: dict, spread: float) -> tuple[step_model.StepPrediction, float]:
        """The step at a reference's count, and the wait for the slowest rank in it: sigma e_N,
        sigma = spread x the rank's compute between synchronisations, A c (f + b)."""
        m, a = micro(reference)
        scale = scale_for(reference)[0]
        prediction = simulate(fitted, reference["gpus"], scale, a)
        wait = step_model.straggler_wait_s(spread, reference["gpus"], a * scale * (fitted.forward_s + fitted.backward_s))
        return prediction, prediction.step_s + wait

    def fitted_for(spread: float):
        """The profile whose compute gives the published step back at the given count (its own wait included)."""
        return published_steps.fit_compute_to_step(profile, _step_s(series, base), lambda p: predicted_step(p, base, spread)[1])

    fit_rows = [r for r in refs if role[r["gpus"]] == "fit"]
    spread = 0.0
    if terms.straggler and fit_rows:
        # sigma / t: the spread whose wait brings the fit counts closest to their figures (least
        # squares on the relative error); nothing of a held-back row goes in
        def misfit(candidate: float) -> float:
            fitted = fitted_for(candidate)
            return sum((_figure(series, r, predicted_step(fitted, r, candidate)[1]) / r["value"] - 1) ** 2 for r in fit_rows)

        spread = _golden_minimum(misfit, 0.0, 0.5)
        spread = 0.0 if misfit(0.0) <= misfit(spread) else spread
    fitted = fitted_for(spread)
    # a spread fitted on one count has nothing to check it against (no published series states
    # its per-rank step times): the rows that carry it say so, beside its value
    one_point = (
        f"straggler spread sigma / t = {spread:.3g}: a one-point fit (on {fit_rows[0]['gpus']} GPUs), unchecked against any measured step-time spread"
        if spread and len(fit_rows) == 1
        else ""
    )
    rows = []
    for reference in refs:
        m, a = micro(reference)
        prediction, step = predicted_step(fitted, reference, spread)
        predicted = _figure(series, reference, step)
        _, input_note, knee = scale_for(reference)
        if one_point and role[reference["gpus"]] == "held back":
            input_note = "; ".join(filter(None, (input_note, one_point)))
        nodes = network(reference["gpus"]).nodes
        rows.append(
            row_of(
                reference,
                nodes=nodes,
                predicted=predicted,
                error=predicted / reference["value"] - 1,
                input_note=input_note,
                regime=prediction_error.regime_of(series.parallel, nodes, m, m0, knee),
                spread=spread,
                exposed_ms=prediction.exposed_comm_s * 1e3,
                step_ms=step * 1e3,
                # every collective's time over the step, overlapped or not: how much of the step the
                # network model carries, the axis of a regime its four keys do not bin
                comm_share=prediction.allreduce_s / step,
                micro_batches=a,
            )
        )
    return rows


# ---- the report ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resnet-batch", type=int, default=2, help="ResNet-50 CPU probe batch (default 2)")
    parser.add_argument("--bert-batch", type=int, default=1, help="BERT-large CPU probe batch at seq 128 (default 1)")
    parser.add_argument("--batch-curve", type=Path, help="batch_curve.json of ResNet-50 on an H100 (default: the newest kept one)")
    parser.add_argument("--regimes-yaml", action="store_true", help="also print prediction_error_by_regime for config/references.yaml")
    parser.add_argument("--parallel-3d", action="store_true", help="only the 3D-parallel back-test (MLPerf GPT-3 175B and Llama 3.1 405B)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    document = yaml.safe_load(REFERENCES.read_text())
    references = {entry["id"]: entry for entry in document["references"]}
    presets = network_model.read_clusters(REFERENCES)
    if args.parallel_3d:
        print_parallel_backtest(presets, references)
        return 0
    probes = {
        "resnet50": cpu_profile("resnet50", ModelShape(), args.resnet_batch),
        "bert_base": cpu_profile("bert_base", BERT_LARGE, args.bert_batch),
        "vit_g_14": transformer_profile(VIT_G14_PARAMETERS, 40, VIT_G14_PARAMETERS - 40 * VIT_G14_BLOCK),
    }
    kept_curve = kept_batch_curve(args.batch_curve, "resnet50", "H100")
    curves = {"resnet50": read_batch_curve(kept_curve)}  # a curve is of one model: no other series takes it

    def run(terms: Terms) -> list[dict]:
        return [row for s in SERIES for row in predict_series(s, references, presets, probes.get(s.model), curves.get(s.model), terms)]

    by_terms = {label: run(terms) for label, terms in TERM_STEPS}
    rows = by_terms[TERM_STEPS[-1][0]]
    print(
        f"{'source':<29} {'model':<10} {'GPUs':>5} {'nodes':>5} {'role':>9} {'published':>10} {'E pub':>6} {'predicted':>10} "
        f"{'pred/pub-1':>10} {'ideal':>10} {'ideal/pub-1':>11}  metric, exposed comm"
    )
    print("-" * 150)
    for row in rows:
        if row["predicted"] is None:
            print(
                f"{row['source']:<29} {row['model']:<10} {row['gpus']:>5} {row['nodes']:>5} {row['role']:>9} {row['published']:>10,.0f} "
                f"{row['efficiency']:>6.3f} {'-':>10} {'-':>10} {row['ideal']:>10,.0f} "
                f"{'' if row['given'] else format(row['ideal_error'], '+.1%'):>11}  {row['metric']}"
            )
            if row["given"]:
                print(f"{'':<36}^ {row['input_note']}")
            continue
        error = "(given)" if row["given"] else f"{row['error']:+.1%}"
        ideal_error = "" if row["given"] else f"{row['ideal_error']:+.1%}"
        print(
            f"{row['source']:<29} {row['model']:<10} {row['gpus']:>5} {row['nodes']:>5} {row['role']:>9} {row['published']:>10,.0f} "
            f"{row['efficiency']:>6.3f} {row['predicted']:>10,.0f} {error:>10} {row['ideal']:>10,.0f} {ideal_error:>11}  "
            f"{row['metric']}, {row['exposed_ms']:.2f} of {row['step_ms']:.1f} ms"
        )
        if row["input_note"]:
            print(f"{'':<36}^ {row['input_note']}")
    for s in SERIES:
        spread = next(r["spread"] for r in rows if r["source"] == s.label)
        if spread:
            print(
                f"straggler spread sigma / t of {s.label}: {spread:.3g}, fitted on its counts "
                f"{', '.join(str(r['gpus']) for r in rows if r['source'] == s.label and r['role'] == 'fit')}"
                + (" (one count: a one-point fit)" if sum(r["source"] == s.label and r["role"] == "fit" for r in rows) == 1 else "")
            )

    held = [row for row in rows if row["role"] == "held back"]
    modelled = [row for row in held if row["error"] is not None]
    # the back-test, series by series and term by term: median |e| over the held-back rows
    print("\nback-test: median |predicted / published - 1| over each series' held-back rows (the rows)")
    labels = ["ideal", *(label for label, _ in TERM_STEPS)]
    print(f"{'series':<29} {'held back':<16} " + " ".join(f"{label:>28}" for label in labels))
    for s in SERIES:
        mine = [r for r in held if r["source"] == s.label]
        counts = ", ".join(str(r["gpus"]) for r in mine)
        cells = [f"{_median_abs([r['ideal_error'] for r in mine]):.1%}"]
        for label, _ in TERM_STEPS:
            theirs = [r for r in by_terms[label] if r["source"] == s.label and r["role"] == "held back"]
            cells.append(
                "no prediction"
                if theirs[0]["error"] is None
                else f"{_median_abs([r['error'] for r in theirs]):.1%} ({', '.join(format(r['error'], '+.1%') for r in theirs)})"
            )
        print(f"{s.label:<29} {counts:<16} " + " ".join(f"{cell:>28}" for cell in cells))
    errors = [abs(r["error"]) for r in modelled]
    print(
        f"\nheld-back rows: {len(held)}, {len(modelled)} predicted; |pred/pub - 1|: median {statistics.median(errors):.1%}, "
        f"largest {max(errors):.1%}; within 10 %: {sum(e <= 0.10 for e in errors)} of {len(errors)}"
    )
    # where the published efficiency falls, the model must beat ideal scaling: its median |e| at most half of ideal's
    bends = [r for r in held if r["efficiency"] < 0.93]
    print(
        "held-back rows with published efficiency below 0.93: "
        + "; ".join(
            f"{r['source']} {r['gpus']} (E {r['efficiency']:.3f}): model "
            f"{'none' if r['error'] is None else format(r['error'], '+.1%')}, ideal {r['ideal_error']:+.1%}"
            for r in bends
        )
    )
    table = prediction_error.back_tested(
        prediction_error.BackTestedRow(r["regime"], f"{r['source']} {r['gpus']}", r["error"], r["comm_share"], r["micro_batches"]) for r in modelled
    )
    print("\nback-tested error by regime (median and largest |pred/pub - 1|, communication share of the step, micro-batches a step, the rows):")
    for entry in table:
        print(
            f"  {entry.regime.key:<62} median {entry.median:5.1%}  largest {entry.largest:5.1%}  "
            f"comm {entry.comm_share[0]:.2%}-{entry.comm_share[1]:.2%}  micro-batches {entry.micro_batches[0]}-{entry.micro_batches[1]}  "
            f"{', '.join(entry.rows)}"
        )
    uncovered = sorted({f"{r['source']} {r['gpus']}" for r in held if r["error"] is None})
    if uncovered:
        print(f"  no back-test (no prediction): {', '.join(uncovered)}")
    calibration = curve_calibration(kept_curve)
    if calibration is not None:
        print(f"batch curve: {calibration}")
    for name, probe in probes.items():
        if not probe.seconds:
            continue
        shown = "bert_large" if name == "bert_base" else name
        print(
            f"CPU probe {shown}: {probe.parameters / 1e6:.1f} M parameters, forward {probe.forward_s:.2f} s, backward "
            f"{probe.backward_s:.2f} s, {len(probe.bucket_parameters)} buckets of 25 MiB (fp32) ready at "
            f"{', '.join(f'{f:.2f}' for f in probe.bucket_ready_fraction)} of the backward ({probe.seconds:.1f} s)"
        )
    print(f"wall time {time.perf_counter() - start:.1f} s on {torch.get_num_threads()} threads")
    if args.regimes_yaml:
        protocol = (
            "of a series' counts c_1 < ... < c_k the model is given c_1; with three or more it fits the straggler spread on "
            "c_2 .. c_ceil(k/2) and the counts above are held back; with two, c_2 is held back"
        )
        print(
            yaml.safe_dump(
                {
                    # the rule of a comparable prediction is references.yaml's, with its reason: carried as it is
                    "prediction_error_by_regime": prediction_error.to_document(table, COMMAND, protocol, document["prediction_error_by_regime"]["comparable"]),
                    "prediction_error": {
                        "typical": round(statistics.median(errors), 3),
                        "largest": round(max(errors), 3),
                        "rows": len(errors),
                        "command": COMMAND,
                    },
                },
                sort_keys=False,
                width=160,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
