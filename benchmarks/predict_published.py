"""The scaling model against published multi-node runs: from what a user would have from one node,
predict the published figures at larger counts, and print predicted / published - 1 per row.

    .venv/bin/python benchmarks/predict_published.py

What the model is given, per series (the published figures, their conditions and sources are in
config/references.yaml and config/references.md, read here by id):

- the published one-node figure (the series' smallest count; Lambda's 1 GPU, else one 8-GPU
  node), which gives the step time there: t0 = samples per step / samples per second;
- the model's gradient bytes: parameters (the real model definition, counted on the meta device)
  x bytes of the all-reduced dtype;
- the step's phases from a CPU profile of the real model: the forward / backward split and, for
  DDP's overlap, when each 25 MiB gradient bucket is ready in the backward (post-accumulate-grad
  hooks, buckets laid out as DDP lays them, ``scalerepro.training.buckets``), scaled to the
  published step: the one factor on the compute that makes the model give t0 back at the
  one-node count (``scaling_model.fit_compute_to_step``);
- the optimizer's time: its memory traffic (bytes per parameter, below) at the GPU's HBM peak
  (``scalerepro.common.gpu_peaks``), an elementwise update being memory-bound; a CPU's ratio of
  optimizer to compute says nothing about a GPU's;
- the cluster's published link rates (``clusters`` and ``links`` of config/references.yaml).

Then ``scaling_model.simulate_step`` (DDP) or ``simulate_fsdp_step`` (FSDP) on the preset's
hierarchical network (``network_model``) at each published count. Nothing is fitted to the rows
being predicted.

Where a series changes the per-GPU batch between counts (MLPerf's ResNet-50 holds its global batch:
400 images a GPU at 8 GPUs, 50 at 64), the compute at the new batch comes from a measured step-time
curve over the batch on the series' GPU (``scaling_model.BatchCurve``; ``--batch-curve``, by default
the newest ``benchmarks/gpu/h100-*/batch_curve.json`` that ``benchmarks/gpu/batch_curve.py`` wrote on
an H100). Without one, the compute is taken as proportional to the batch and the row says that the
curve is missing: a CPU's curve says nothing of an H100's fixed per-step cost.

Beside each prediction the benchmark prints what plain ideal scaling gives from the same one-node
figure (N / N0 times it, per-GPU figures unchanged) and its error: a model is worth what it
predicts beyond that.
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

import torch  # noqa: E402
import yaml  # noqa: E402

from scalerepro.analysis.tables import network_model, scaling_model  # noqa: E402
from scalerepro.common import gpu_peaks  # noqa: E402
from scalerepro.models import ModelShape, build, resolve  # noqa: E402
from scalerepro.training import buckets  # noqa: E402

REFERENCES = REPO / "config" / "references.yaml"
DDP_BUCKET_CAP_MB = 25.0  # DDP's default bucket_cap_mb
# Optimizer memory traffic per parameter, bytes read + written at fp32 (an elementwise update is
# memory-bound): SGD with momentum reads w, g, m and writes w, m (5 x 4); LARS adds a read of w
# and g for the per-layer norms (7 x 4); AdamW reads w, g, m, v and writes w, m, v (7 x 4);
# LAMB adds a second pass over w and the update for its trust ratio (9 x 4).
OPTIMIZER_BYTES_PER_PARAMETER = {"lars": 28, "adamw": 28, "lamb": 36}
BERT_LARGE = ModelShape(num_layers=24, hidden_size=1024, num_heads=16)  # bert_base's definition, BERT-large's shape


@dataclass(frozen=True)
class Series:
    """One published scaling series and the conditions the model needs from it."""

    label: str
    model: str  # the zoo's model of the CPU probe
    shape: ModelShape
    cluster: str  # a preset of references.yaml
    reference_ids: tuple[str, ...]  # the first is the one-node figure the model is given
    micro_batch: int | None  # the per-GPU micro-batch when accumulating (None: the whole share)
    gradient_bytes_per_parameter: int  # the all-reduced (DDP) or reduce-scattered (FSDP) dtype
    overlap: bool  # DDP all-reduces buckets during the backward; False: after the last backward
    optimizer: str
    hbm_peaks: str  # gpu_peaks key: the optimizer's memory bandwidth
    parallel: Literal["ddp", "fsdp"] = "ddp"
    note: str = ""
    curve_gpu: str = "H100"  # the GPU whose batch curve a change of per-GPU batch needs


SERIES = (
    Series("Lambda RN50 fp16 NGC22.09", "resnet50", ModelShape(), "dgx_h100",
           tuple(f"lambda-rn50-h100sxm-fp16-{n}" for n in (1, 2, 4, 8)), None, 4, True, "lars", "h100_sxm",
           note="PyTorch native DDP with AMP: fp32 gradients, 25 MiB buckets; SGD (counted as LARS's traffic)"),
    Series("Lambda RN50 fp16 NGC24.03", "resnet50", ModelShape(), "dgx_h100",
           tuple(f"lambda-rn50-h100sxm-fp16-ngc2403-{n}" for n in (1, 2, 4, 8)), None, 4, True, "lars", "h100_sxm"),
    Series("MLPerf v3.0 RN50 DGX H100", "resnet50", ModelShape(), "dgx_h100",
           ("mlperf-v3.0-rn50-dgxh100-8", "mlperf-v3.0-rn50-dgxh100-64"), None, 2, True, "lars", "h100_sxm",
           note="MXNet + Horovod, fp16 gradients; global batch 3200 fixed: 400 -> 50 images per GPU"),
    Series("DLE BERT-large ph1 DGX A100", "bert_base", BERT_LARGE, "dgx_a100",
           tuple(f"dle-bert-large-p1-a100-{n}" for n in (8, 16, 32, 64, 128, 256)), 256, 2, False, "lamb", "a100_sxm_80gb",
           note="fp16 gradients all-reduced once after the accumulated micro-batches (no overlap)"),
    Series("DLE BERT-large ph2 DGX A100", "bert_base", BERT_LARGE, "dgx_a100",
           tuple(f"dle-bert-large-p2-a100-{n}" for n in (8, 16, 32, 64, 128, 256)), 32, 2, False, "lamb", "a100_sxm_80gb"),
    Series("torchtitan Llama3.1-8B FSDP", "llama3_8b", ModelShape(), "dgx_h100",
           ("torchtitan-llama31-8b-fsdp-8", "torchtitan-llama31-8b-fsdp-128"), None, 4, True, "adamw", "h100_sxm",
           parallel="fsdp", note="FSDP2: bf16 all-gathers, fp32 reduce-scatters, 32 blocks"),
)  # fmt: skip


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
        forward_s, backward_s, tuple(sum(params[i].numel() for i in bucket) for bucket in layout), fractions,
        spec.num_parameters, time.perf_counter() - start,
    )  # fmt: skip


# ---- the prediction --------------------------------------------------------------------------


def _share(reference: dict) -> int:
    """Samples per GPU per optimizer step."""
    return int(reference["conditions"]["per_gpu_samples_per_step"])


def _step_s(reference: dict) -> float:
    """The published step time: samples per step / samples per second (tokens for tokens/s/GPU)."""
    share = _share(reference)
    if reference["metric"] == "tokens_per_s_per_gpu":
        return share * reference["conditions"]["seq_len"] / reference["value"]
    return share * reference["gpus"] / reference["value"]


def _figure(reference: dict, step_s: float) -> float:
    """A step time in the reference's metric."""
    share = _share(reference)
    if reference["metric"] == "tokens_per_s_per_gpu":
        return share * reference["conditions"]["seq_len"] / step_s
    return share * reference["gpus"] / step_s


def fsdp_units(series: Series) -> int:
    """FSDP's units: one per transformer block (torchtitan wraps each), counted on the meta device."""
    with torch.device("meta"):
        model = build(resolve(series.model, series.shape))
    return len(model.layers)


def kept_batch_curve(path: Path | None, model: str, gpu: str) -> tuple[Path, dict] | None:
    """The ``batch_curve.json`` (benchmarks/gpu/batch_curve.py) of ``model`` on ``gpu``, and its
    document: ``path``, or without one the newest kept under benchmarks/gpu/; None if none is."""
    candidates = [path] if path is not None else sorted(REPO.glob("benchmarks/gpu/*/batch_curve.json"), reverse=True)
    for candidate in candidates:
        document = json.loads(candidate.read_text())
        if document.get("model") == model and gpu in str(document.get("device")):
            return candidate, document
    return None


def read_batch_curve(found: tuple[Path, dict] | None) -> scaling_model.BatchCurve | None:
    """The curve of a kept ``batch_curve.json`` (``kept_batch_curve``'s answer); None where there is none."""
    if found is None:
        return None
    candidate, document = found
    rows = document["rows"]
    where = f"{candidate.relative_to(REPO) if candidate.is_relative_to(REPO) else candidate}, {document['device']}"
    return scaling_model.BatchCurve.fit([r["batch"] for r in rows], [r["step_s_median"] for r in rows], where)


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
    record = json.loads(record_path.read_text())
    batch, trainer_s = record["batch"]["per_gpu"], record["measurements"]["step_time_s"]["median"]
    bare = [row["step_s_median"] for row in document["rows"] if row["batch"] == batch]
    if not bare:
        return f"no calibration: the curve has no point at the trainer's batch {batch}"
    return (f"calibration at batch {batch}: the curve's bare loop {bare[0] * 1e3:.2f} ms against the trainer's "
            f"{trainer_s * 1e3:.2f} ms ({record_path.name}): {bare[0] / trainer_s - 1:+.1%}; the model takes the "
            f"curve's ratios t(m) / t(m0) only")  # fmt: skip


def predict_series(
    series: Series, references: dict[str, dict], presets, probe: CpuProfile | None, curve: scaling_model.BatchCurve | None = None
) -> list[dict]:
    cluster = presets[series.cluster]
    refs = [references[i] for i in series.reference_ids]
    base = refs[0]
    parameters = resolve(series.model, series.shape).num_parameters
    hbm = gpu_peaks.PEAKS[series.hbm_peaks].hbm_tbps * 1e12
    optimizer_s = parameters * OPTIMIZER_BYTES_PER_PARAMETER[series.optimizer] / hbm

    def micro(reference: dict) -> tuple[int, int]:
        """(micro-batch, micro-batches per step) of a reference."""
        share = _share(reference)
        m = series.micro_batch or share
        return m, share // m

    m0, a0 = micro(base)
    if series.parallel == "fsdp":
        # f : b = 1 : 2 (the backward's matmuls are twice the forward's); only their sum matters
        # where the transfers hide behind them, and it is fitted to the published step
        profile = scaling_model.FsdpProfile(
            step_s=1.0, forward_s=1.0 / 3, backward_s=2.0 / 3, optimizer_s=optimizer_s, micro_batches=a0,
            units=fsdp_units(series),
            gather_bytes=parameters * 2, reduce_bytes=parameters * series.gradient_bytes_per_parameter,
        )  # fmt: skip

        def simulate(p, gpus, c, a):
            return scaling_model.simulate_fsdp_step(p, cluster.network(gpus), c, a)
    else:
        assert probe is not None
        total = probe.forward_s + probe.backward_s
        if series.overlap:
            sizes = tuple(n * series.gradient_bytes_per_parameter for n in probe.bucket_parameters)
            ready = tuple(f * probe.backward_s / total for f in probe.bucket_ready_fraction)
        else:  # one all-reduce of every gradient once the last backward is done
            sizes, ready = (parameters * series.gradient_bytes_per_parameter,), (probe.backward_s / total,)
        profile = scaling_model.StepProfile(
            step_s=1.0, forward_s=probe.forward_s / total, backward_s=probe.backward_s / total, optimizer_s=optimizer_s,
            micro_batches=a0, bucket_bytes=sizes, bucket_ready_s=ready,
        )  # fmt: skip

        def simulate(p, gpus, c, a):
            return scaling_model.simulate_step(p, cluster.network(gpus), c, a)

    fitted = scaling_model.fit_compute_to_step(profile, _step_s(base), lambda p: simulate(p, base["gpus"], 1.0, a0).step_s)
    rows = []
    for reference in refs:
        m, a = micro(reference)
        network = cluster.network(reference["gpus"])
        # c: proportional to the micro-batch, or the measured curve's ratio where the batch changes
        scale, input_note = m / m0, ""
        if m != m0:
            if curve is not None:
                scale, input_note = curve.compute_scale(m, m0, 0.0), f"batch curve {curve.describe()}"
            else:
                input_note = (f"needs the {series.curve_gpu} batch curve of {series.model} (benchmarks/gpu/batch_curve.py on an "
                              f"{series.curve_gpu}, GPU issue 38): compute taken as proportional to the batch, {m0} -> {m}")  # fmt: skip
        prediction = simulate(fitted, reference["gpus"], scale, a)
        predicted = _figure(reference, prediction.step_s)
        # plain ideal scaling from the one-node figure: per-GPU figures unchanged, totals x N / N0
        ideal = base["value"] if reference["metric"] == "tokens_per_s_per_gpu" else base["value"] * reference["gpus"] / base["gpus"]
        rows.append({
            "source": series.label, "model": series.model if series.shape == ModelShape() else "bert_large",
            "gpus": reference["gpus"], "nodes": network.nodes, "published": reference["value"], "predicted": predicted,
            "error": predicted / reference["value"] - 1, "given": reference is base,
            "ideal": ideal, "ideal_error": ideal / reference["value"] - 1, "efficiency": reference["value"] / ideal,
            "input_note": input_note,
            "exposed_ms": prediction.exposed_comm_s * 1e3, "step_ms": prediction.step_s * 1e3,
            "metric": "tok/s/GPU" if reference["metric"] == "tokens_per_s_per_gpu" else "samples/s",
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resnet-batch", type=int, default=2, help="ResNet-50 CPU probe batch (default 2)")
    parser.add_argument("--bert-batch", type=int, default=1, help="BERT-large CPU probe batch at seq 128 (default 1)")
    parser.add_argument("--batch-curve", type=Path, help="batch_curve.json of ResNet-50 on an H100 (default: the newest kept one)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    document = yaml.safe_load(REFERENCES.read_text())
    references = {entry["id"]: entry for entry in document["references"]}
    presets = network_model.read_clusters(REFERENCES)
    probes = {
        "resnet50": cpu_profile("resnet50", ModelShape(), args.resnet_batch),
        "bert_base": cpu_profile("bert_base", BERT_LARGE, args.bert_batch),
    }
    kept_curve = kept_batch_curve(args.batch_curve, "resnet50", "H100")
    curve = read_batch_curve(kept_curve)
    rows = [row for series in SERIES for row in predict_series(series, references, presets, probes.get(series.model), curve)]
    print(f"{'source':<29} {'model':<10} {'GPUs':>5} {'nodes':>5} {'published':>10} {'E pub':>6} {'predicted':>10} "
          f"{'pred/pub-1':>10} {'ideal':>10} {'ideal/pub-1':>11}  metric, exposed comm")  # fmt: skip
    print("-" * 140)
    for row in rows:
        error = "(given)" if row["given"] else f"{row['error']:+.1%}"
        ideal_error = "" if row["given"] else f"{row['ideal_error']:+.1%}"
        print(f"{row['source']:<29} {row['model']:<10} {row['gpus']:>5} {row['nodes']:>5} {row['published']:>10,.0f} "
              f"{row['efficiency']:>6.3f} {row['predicted']:>10,.0f} {error:>10} {row['ideal']:>10,.0f} {ideal_error:>11}  "
              f"{row['metric']}, {row['exposed_ms']:.2f} of {row['step_ms']:.1f} ms")  # fmt: skip
        if row["input_note"]:
            print(f"{'':<36}^ {row['input_note']}")
    scored = [row for row in rows if not row["given"]]
    predicted = [abs(row["error"]) for row in scored]
    within = sum(e <= 0.10 for e in predicted)
    print(f"\npredicted rows: {len(predicted)}; |pred/pub - 1|: median {statistics.median(predicted):.1%}, "
          f"largest {max(predicted):.1%}; within 10 %: {within} of {len(predicted)}")  # fmt: skip
    # where the published efficiency falls, the model must beat ideal scaling: under half its error
    bends = [row for row in scored if row["efficiency"] < 0.93]
    beaten = sum(abs(row["error"]) < abs(row["ideal_error"]) / 2 for row in bends)
    print(f"rows with published efficiency below 0.93: {len(bends)}; model error under half of ideal scaling's on {beaten}: "
          + "; ".join(f"{row['source']} {row['gpus']}: model {row['error']:+.1%}, ideal {row['ideal_error']:+.1%}" for row in bends))
    print("per series, median |error| of the model against ideal scaling's: " + "; ".join(
        f"{label} {statistics.median(abs(r['error']) for r in group):.1%} vs {statistics.median(abs(r['ideal_error']) for r in group):.1%}"
        for label in dict.fromkeys(r["source"] for r in scored) for group in [[r for r in scored if r["source"] == label]]))
    calibration = curve_calibration(kept_curve)
    if calibration is not None:
        print(f"batch curve: {calibration}")
    for name, probe in probes.items():
        shown = "bert_large" if name == "bert_base" else name
        print(f"CPU probe {shown}: {probe.parameters / 1e6:.1f} M parameters, forward {probe.forward_s:.2f} s, backward "
              f"{probe.backward_s:.2f} s, {len(probe.bucket_parameters)} buckets of 25 MiB (fp32) ready at "
              f"{', '.join(f'{f:.2f}' for f in probe.bucket_ready_fraction)} of the backward ({probe.seconds:.1f} s)")  # fmt: skip
    print(f"wall time {time.perf_counter() - start:.1f} s on {torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
