"""Hand-made, schema-valid inputs for the analysis tests: run records, a study matrix, all-reduce
benchmark files and references, with numbers chosen so that every table can be checked by hand.

The GPU study (``write_gpu_study``), resnet50 on "H100" GPUs, 2 GPUs per node:

    strong  g1 samples/s 90, 100, 110        -> median 100 (min 90, max 110)
            g2 180, 170, 190                 -> median 180: speedup 1.8, efficiency 0.9
            g4 340, failed, missing          -> 340 from 1 of 3 repeats: efficiency 0.85 (2 nodes)
    weak    g1 epoch time 10, 10 s           -> T(1) = 10
            g2 11, 12 s and one run whose record says world size 1 (inconsistent: not counted)
                                             -> T(2) = 11.5: efficiency 10 / 11.5, variation 0.15
    sensitivity at 2 GPUs, bf16: (bucket 5, batch 32) 200, (25, 32) 220, (5, 64) 240, (25, 64) 260
    ablation at 2 GPUs: baseline 100, bf16 150, channels_last preempted, all 130 -> gains 0.5, 0.3
    exposed communication 0.1 on multi-GPU runs (0.15 on strong g4 r1), 0 on one GPU
    data stall 0.01 (0.03 on strong g1 r2); GPU utilisation 90 %; every record lasts 360 s
"""

from __future__ import annotations

import copy
import csv
import datetime
import json
from pathlib import Path
from typing import Any

import jsonschema

from scalerepro.analysis.tables.step_model import StepProfile
from scalerepro.record.model import RECORD_SCHEMA_VERSION
from scalerepro.record.peak import peak_for

REPO = Path(__file__).resolve().parents[1]
REFERENCES = REPO / "config" / "references.yaml"
SCHEMA = json.loads((REPO / "workflow/schemas/run_record.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())

H100 = "NVIDIA H100 80GB HBM3"
CPU = "AMD EPYC"
DURATION_S = 360.0
RUNTIME_MIN = 30
GPUS_PER_NODE = 2
CPU_NVML_REASON = "CPU run: NVML measures NVIDIA GPUs only"
FAILED_MESSAGE = "rank 0 at step 10: the loss became non-finite at step 1: lower --lr"

REFERENCES_YAML = """\
target_gpu: NVIDIA H100 80GB HBM3
references:
  - id: ref-r50-2
    model: resnet50
    gpus: 2
    metric: samples_per_s
    value: 200
    kind: published
    source: {page: a paper, table: table 3}
    conditions: {gpu: NVIDIA H100 80GB HBM3, precision: bf16, per_gpu_samples_per_step: 32, seq_len: null, memory_format: nchw,
                 data: synthetic, optimizer: null, framework: PyTorch DDP, metric_notes: img/s}
    trainer: {model: resnet50, per_gpu_batch: 32, flags: [--precision, bf16]}
  - id: ref-r50-4-tokens
    model: resnet50
    gpus: 4
    metric: tokens_per_s_per_gpu
    value: 1000
    kind: published
    source: {page: a blog, table: the only one}
    conditions: {gpu: NVIDIA H100 80GB HBM3, precision: bf16, per_gpu_samples_per_step: null, seq_len: null, memory_format: null,
                 data: null, optimizer: null, framework: unknown, metric_notes: not an LM}
    trainer: null
    unmatched: "data: not stated"
  - id: ref-gpt2-8
    model: gpt2_small
    gpus: 8
    metric: tokens_per_s_per_gpu
    value: 462000
    kind: published
    source: {repository: KellerJordan/modded-nanogpt, commit: f411b3d346aa52d3504324ca93c230fd84c6c07f, path: records/x.txt}
    conditions: {gpu: NVIDIA H100 80GB HBM3, precision: bf16, per_gpu_samples_per_step: 64, seq_len: 1024, memory_format: null,
                 data: real, optimizer: Muon, framework: tuned, metric_notes: tokens/s per GPU}
    trainer: {model: gpt2_small, per_gpu_batch: 64, flags: [--seq-len, "1024", --precision, bf16]}
    unmatched: "optimizer: Muon"
  - id: ref-r50-a100-2
    model: resnet50
    gpus: 2
    metric: samples_per_s
    value: 150
    kind: published
    source: {page: another paper, table: table 1}
    conditions: {gpu: NVIDIA A100-SXM4-80GB, precision: bf16, per_gpu_samples_per_step: 32, seq_len: null, memory_format: nchw,
                 data: synthetic, optimizer: null, framework: PyTorch DDP, metric_notes: img/s}
    trainer: {model: resnet50, per_gpu_batch: 32, flags: [--precision, bf16]}
"""


def validate(record: dict[str, Any]) -> dict[str, Any]:
    errors = sorted(VALIDATOR.iter_errors(record), key=lambda e: list(e.path))
    assert not errors, "record does not match the schema:\n" + "\n".join(f"{'/'.join(map(str, e.path))}: {e.message[:300]}" for e in errors)
    return record


STEPS_PER_EPOCH = 64


def make_record(
    run_id: str,
    *,
    status: str = "ok",
    model: str = "resnet50",
    world_size: int = 1,
    nodes: int = 1,
    device_type: str = "cuda",
    precision: str = "bf16",
    per_gpu_batch: int = 32,
    samples_per_s: float = 100.0,
    epoch_time_s: float | None = None,
    exposed_comm: float = 0.0,
    data_stall: float = 0.01,
    gpu_util_pct: float = 90.0,
    power_w: float = 500.0,
    channels_last: bool = False,
    data_kind: str = "synthetic",
    optimizer: str = "sgd",
    device_name: str = H100,
    error: str | None = None,
    stop_signal: str | None = None,
    tokens_per_sample: int = 0,
    sharding: dict[str, Any] | None = None,
    global_batch: int | None = None,
    grad_accum_steps: int = 1,
    bucket_cap_mb: float = 25.0,
    started_at: datetime.datetime = datetime.datetime(2026, 11, 20, 8, 0, tzinfo=datetime.timezone.utc),
) -> dict[str, Any]:
    """A complete run record (every required field) that validates against the schema, whose
    figures agree with each other as the trainer's do (scalerepro.analysis.evidence.RELATIONS):
    the window is the measured steps' samples over the throughput; the median step is the mean
    (global batch / throughput), or the epoch time over the steps of an epoch where one is given."""
    cuda = device_type == "cuda"
    # the strategy is the record's parallel.strategy; measurements.sharding holds the rest (null under ddp)
    shards = None if sharding is None else {key: value for key, value in sharding.items() if key != "strategy"}
    strategy = "ddp" if sharding is None else sharding.get("strategy", "ddp")
    global_batch = global_batch or per_gpu_batch * world_size * grad_accum_steps  # per replica x replicas x accumulation
    # 20 measured steps, fewer where 20 would outlast the record's DURATION_S at this throughput
    steps = max(1, min(20, int((DURATION_S - 2) * samples_per_s / global_batch))) if samples_per_s > 0 else 20
    window_s = steps * global_batch / samples_per_s if samples_per_s > 0 else 2.0
    step_s = global_batch / samples_per_s if samples_per_s > 0 else 1.0  # the mean step
    # epoch_time_s = steps per epoch x median step
    median_s = step_s if epoch_time_s is None else epoch_time_s / STEPS_PER_EPOCH
    epoch_time_s = STEPS_PER_EPOCH * median_s
    energy_j = power_w * window_s if cuda else None
    # the dense bf16 peak of the device (the table's: 989.4 TFLOP/s for an H100 SXM5), as the trainer states it
    peak_facts = peak_for(device_name, "bf16")[0] if cuda else None
    peak = peak_facts.flops_per_s if peak_facts is not None else None
    # the model's FLOPs per sample set so that a GPU record's MFU is 0.4 at its throughput
    flops_per_sample = 0.4 * world_size * peak / samples_per_s if cuda and samples_per_s > 0 else 2.45e10
    measurements = {
        "measured_steps": steps,
        "measured_samples": steps * global_batch,
        "window_s": window_s,
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * tokens_per_sample if tokens_per_sample else None,
        "step_time_s": {"median": median_s, "p10": 0.9 * min(median_s, step_s), "p90": 1.2 * max(median_s, step_s), "mean": step_s},
        "epoch_time_s": epoch_time_s,
        "epoch_wall_times_s": [{"epoch": 0, "seconds": 3.0, "complete": False}],
        "train_time_s": 3.0,
        "data_stall_fraction": data_stall,
        "data_wait_s": data_stall * window_s,  # data_stall_fraction = data_wait_s / window_s
        "data_wait_clock": "device" if cuda else "host",
        # MFU = FLOPs per sample x samples/s / (world size x peak)
        "mfu": flops_per_sample * samples_per_s / (world_size * peak) if cuda else None,
        # the peak an H100 SXM5's MFU is against at bf16 (scalerepro.record.peak, as the trainer states it)
        "peak": peak_facts.model_dump() if peak_facts is not None else None,
        "peak_reason": None if cuda else "no GPU: peak throughput is tabulated for NVIDIA GPUs only",
        "achieved_flops": flops_per_sample * samples_per_s,
        "memory": {
            "allocated_bytes_max": 4_000_000_000 if cuda else None,
            "reserved_bytes_max": 5_000_000_000 if cuda else None,
            "rss_bytes_max": 300_000_000,
        },
        "exposed_communication": {
            "fraction": exposed_comm,
            "sync_step_s": step_s if world_size > 1 else None,
            "nosync_step_s": step_s * (1 - exposed_comm) if world_size > 1 else None,
            # the slowest rank's no-sync step = the typical rank's + the wait for the slowest
            "nosync_rank_mean_s": 0.98 * step_s * (1 - exposed_comm) if world_size > 1 else None,
            "straggler_wait_s": 0.02 * step_s * (1 - exposed_comm) if world_size > 1 else None,
            "steps": 8 if world_size > 1 else 0,
            "reason": None if world_size > 1 else "single process: no gradient communication",
        },
        "nvml": {
            "available": cuda,
            "reason": None if cuda else CPU_NVML_REASON,
            "gpus": world_size if cuda else 0,
            "device_name": device_name if cuda else None,
            "samples": 20 if cuda else 0,
            "interval_s": 0.1,
            "window_s": window_s if cuda else None,
            "gpu_util_mean_pct": gpu_util_pct if cuda else None,
            "gpu_util_max_pct": 100.0 if cuda else None,
            "memory_used_max_bytes": 6_000_000_000 if cuda else None,
            "power_mean_w": power_w if cuda else None,
            "power_mean_per_gpu_w": power_w / world_size if cuda else None,
            "power_max_per_gpu_w": power_w / world_size if cuda else None,
            "energy_j": energy_j,
            "energy_method": "total_energy_counter" if cuda else None,
            "sm_clock_mean_mhz": 1980.0 if cuda else None,
            "sm_clock_max_mhz": 1980.0 if cuda else None,
            "temperature_max_c": 60.0 if cuda else None,
        },
        "energy_per_sample_j": energy_j / (steps * global_batch) if cuda else None,
        "sharding": shards,  # null under --parallel ddp, as the trainer writes it
        # the scaling model's input: forward 30 %, backward 60 %, optimizer 5 % of the step; four
        # 25 MiB-capped buckets of resnet50's fp32 gradients, ready at 25, 50, 75 and 100 % of the backward
        "backward_buckets": {
            "steps": 5,
            "reason": None,
            "gradient_bytes": 102_228_128,
            "micro_batches_per_step": 1,
            "forward_s": 0.3 * step_s,
            "backward_s": 0.6 * step_s,
            "optimizer_s": 0.05 * step_s,
            "buckets": [
                {"bytes": size, "parameters": 40, "ready_s": 0.6 * step_s * (k + 1) / 4}
                for k, size in enumerate((26_214_400, 26_214_400, 26_214_400, 23_584_928))
            ],
        },
    }
    stamp = started_at.isoformat(timespec="milliseconds")
    record = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "purpose": "measurement",
        "run_id": run_id,
        "status": status,
        "error": (None if error is None else {"type": "NonFiniteLossError", "message": error, "traceback": "Traceback ..."}),
        "stop_signal": stop_signal,
        "started_at": stamp,
        "ended_at": (started_at + datetime.timedelta(seconds=DURATION_S)).isoformat(timespec="milliseconds"),
        "command_line": ["python", "-m", "scalerepro.training.train"],
        "seed": 1,
        "precision": {
            "name": precision,
            "param_dtype": "fp32",
            "compute_dtype": precision,
            "optimizer_state_dtype": "fp32",
            "loss_scaling": precision == "fp16",
            "reason": None,
        },
        "knobs": {
            "preset": "baseline",
            "preset_overrides": {},
            "channels_last": channels_last,
            "cudnn_benchmark": False,
            "compile": "none",
            "compile_scope": "model",
            "attention_backend": "auto",
            "stem_channels": 3,
            "loader": "dataloader",
            "optimizer_impl": "foreach",
            "bucket_cap_mb": bucket_cap_mb,
            "gradient_as_bucket_view": False,
            "static_graph": False,
            "sync_batchnorm": False,
        },
        "config": {"model": {}, "data": {}, "optim": {}, "parallel": {}, "perf": {}, "run": {}},
        "git": {"commit": "7333a9c6cdfbdc5a5b41d26536c88629aaf3162c", "dirty": False, "reason": None},
        "versions": {
            "python": "3.11.7",
            "torch": "2.6.0",
            "cuda": "12.4" if cuda else None,
            "cudnn": None,
            "nccl": None,
            "torchvision": "0.21.0",
            "scalerepro": "0.1.0",
        },
        "hardware": {
            "hostname": "node1",
            "cpu_model": CPU,
            "logical_cpus": 64,
            "memory_total_bytes": 2**40,
            "gpu": {"name": device_name if cuda else None, "count": GPUS_PER_NODE if cuda else 0},
        },
        "scheduler": {"name": "slurm", "job_id": 4182000, "cluster_name": None, "partition": "h100"}
        if cuda
        else {"name": "local", "job_id": None, "cluster_name": None, "partition": None},
        "model": {
            "name": model,
            "task": "image_classification",
            "family": "cnn",
            "num_parameters": 25_557_032,
            "tokens_per_sample": tokens_per_sample,
            "train_flops_per_sample": flops_per_sample,
            "flops_source": "analytic",
            "shape": {},
        },
        "optimizer": {
            "kind": optimizer,
            "base_lr": 0.1,
            "lr": 0.1,
            "weight_decay": 5e-5,
            "lr_scaling": "linear",
            "schedule": "cosine",
        },
        "parallel": {
            "strategy": strategy,
            "launcher": "torchrun" if world_size > 1 else "single",
            "backend": ("nccl" if cuda else "gloo") if world_size > 1 else None,
            "device_type": device_type,
            "world_size": world_size,
            "nodes": nodes,
            "ranks_per_node": world_size // nodes,
            "gpus_per_node": world_size // nodes if cuda else 0,
            "gpus": world_size if cuda else 0,
            "hostnames": [f"node{i + 1}" for i in range(nodes)],
        },
        "batch": {
            "micro_batch": per_gpu_batch,
            "grad_accum_steps": grad_accum_steps,
            "samples_per_gpu_step": global_batch / world_size,  # global batch / world size
            "global_batch": global_batch,
        },
        "data": {"kind": data_kind, "path": None, "train_samples": 4096, "eval_samples": 512},
        "steps": {
            "total": 24,
            "completed": 24 if status == "ok" else 10,
            "warmup": 4,
            "per_epoch": STEPS_PER_EPOCH,
            "resumed_from": None,
        },
        "epochs": {"planned": 0.375, "completed": 0},
        "measurements": measurements,
        "measurements_scope": "all ranks",
        "history": [
            {"epoch": 0, "step": 12, "complete": False, "train_loss": 2.0, "eval_loss": 2.1, "eval_accuracy": 0.2},
            {"epoch": 0, "step": 24, "complete": False, "train_loss": 1.5, "eval_loss": 1.6, "eval_accuracy": 0.4},
        ],
        "loss_log": [{"step": step, "loss": 2.5 - 0.04 * step, "samples_per_s": samples_per_s} for step in range(4, 25, 4)],
        "checkpoint": None,
    }
    return validate(record)


def _nodes(gpus: int) -> int:
    return -(-gpus // GPUS_PER_NODE)  # ceil(gpus / gpus_per_node)


class Study:
    """Matrix rows and their records, written under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self.rows: list[dict[str, Any]] = []
        (root / "runs").mkdir(parents=True, exist_ok=True)

    def add(
        self,
        study: str,
        gpus: int,
        repeat: int,
        *,
        variant: str = "",
        per_gpu_batch: int = 32,
        precision: str = "bf16",
        bucket_cap_mb: float | None = None,
        model: str = "resnet50",
        record: dict[str, Any] | None = None,
        reference: str = "",
        grad_accum_steps: int = 1,
        parallel: str = "ddp",
        data_parallel: int | None = None,
        **figures: Any,
    ) -> str:
        """One matrix row; its record is made from ``figures`` unless ``status="missing"``.
        ``reference``: the reference a ``reproduce`` run is for (the matrix's column)."""
        run_id = "_".join(part for part in (study, model, f"g{gpus}", variant or reference, f"r{repeat}") if part)
        path = self.root / "runs" / f"{run_id}.json"
        if bucket_cap_mb is None:  # the plan of a given record is the cap it ran; 25 MiB (DDP's default) else
            bucket_cap_mb = ((record or {}).get("knobs") or {}).get("bucket_cap_mb") or 25.0
        self.rows.append(
            {
                "run_id": run_id,
                "study": study,
                "model": model,
                "gpus": gpus,
                "nodes": _nodes(gpus),
                "gpus_per_node": GPUS_PER_NODE,
                "repeat": repeat,
                "variant": variant,
                "precision": precision,
                "per_gpu_batch": per_gpu_batch,
                "global_batch": per_gpu_batch * (data_parallel or gpus),  # per replica x replicas
                "bucket_cap_mb": bucket_cap_mb,
                "runtime_min": RUNTIME_MIN,
                "record": str(path),
                "rerun": f"snakemake --cores all --forcerun {path}",
                "reference": reference,
                "grad_accum_steps": grad_accum_steps,
                "parallel": parallel,
                "data_parallel": data_parallel or gpus,
            }
        )
        if figures.get("status") != "missing":
            figures.setdefault("world_size", gpus)
            figures.setdefault("nodes", _nodes(figures["world_size"]))
            figures.setdefault("global_batch", per_gpu_batch * (data_parallel or figures["world_size"]) * grad_accum_steps)
            figures.setdefault("grad_accum_steps", grad_accum_steps)
            figures.setdefault("bucket_cap_mb", bucket_cap_mb)
            document = record or make_record(run_id, model=model, precision=precision, per_gpu_batch=per_gpu_batch, **figures)
            path.write_text(json.dumps(document))
        return run_id

    def write_matrix(self) -> Path:
        path = self.root / "matrix.csv"
        with path.open("w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(self.rows[0]))
            writer.writeheader()
            writer.writerows(self.rows)
        return path


def write_comm(path: Path, world_size: int, nodes: int, times_us: dict[int, float], backend: str = "nccl") -> Path:
    """A commbench file; algbw = size / t, busbw = algbw * 2 (N - 1) / N."""
    results = []
    for size, t in times_us.items():
        algbw = size / (t * 1e-6) / 1e9
        results.append(
            {
                "size_bytes": size,
                "dtype": "float32",
                "iterations": 20,
                "time_us_median": t,
                "time_us_min": 0.9 * t,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (world_size - 1) / world_size,
            }
        )
    document = {"world_size": world_size, "nodes": nodes, "backend": backend, "device_type": "cuda", "results": results}
    path.write_text(json.dumps(document))
    return path


COMM_TIMES_US = {2: {1024: 20.0, 1048576: 50.0, 67108864: 400.0}, 4: {1024: 30.0, 1048576: 80.0, 67108864: 700.0}}


def write_gpu_study(root: Path) -> dict[str, Any]:
    """The GPU study of the module docstring; returns the aggregate() arguments."""
    s = Study(root)
    for repeat, thr in enumerate((90, 100, 110), 1):
        s.add("strong", 1, repeat, samples_per_s=thr, data_stall=0.03 if repeat == 2 else 0.01)
    for repeat, thr in enumerate((180, 170, 190), 1):
        s.add("strong", 2, repeat, per_gpu_batch=16, samples_per_s=thr, exposed_comm=0.1)
    s.add("strong", 4, 1, per_gpu_batch=8, samples_per_s=340, exposed_comm=0.15)
    s.add("strong", 4, 2, per_gpu_batch=8, samples_per_s=300, exposed_comm=0.1, status="failed", error=FAILED_MESSAGE)
    s.add("strong", 4, 3, per_gpu_batch=8, status="missing")
    for repeat in (1, 2):
        s.add("weak", 1, repeat, epoch_time_s=10.0)
    s.add("weak", 2, 1, samples_per_s=150, epoch_time_s=11.0, exposed_comm=0.1)
    s.add("weak", 2, 2, samples_per_s=160, epoch_time_s=12.0, exposed_comm=0.1)
    s.add("weak", 2, 3, samples_per_s=999, epoch_time_s=100.0, world_size=1)  # record disagrees with the plan
    for (bucket, batch), thr in {(5, 32): 200, (25, 32): 220, (5, 64): 240, (25, 64): 260}.items():
        variant = f"bucket{bucket}-batch{batch}-bf16"
        s.add(
            "sensitivity",
            2,
            1,
            variant=variant,
            per_gpu_batch=batch,
            bucket_cap_mb=bucket,
            samples_per_s=thr,
            exposed_comm=0.1,
        )
    s.add("ablation", 2, 1, variant="baseline", precision="fp32", samples_per_s=100, exposed_comm=0.1)
    s.add("ablation", 2, 1, variant="bf16", samples_per_s=150, exposed_comm=0.1)
    s.add(
        "ablation",
        2,
        1,
        variant="channels_last",
        precision="fp32",
        samples_per_s=120,
        status="preempted",
        stop_signal="SIGTERM",
    )
    s.add("ablation", 2, 1, variant="all", samples_per_s=130, exposed_comm=0.1)
    comm = [write_comm(root / f"g{n}.json", n, _nodes(n), times) for n, times in COMM_TIMES_US.items()]
    references = root / "references.yaml"
    references.write_text(REFERENCES_YAML)
    return {"matrix_path": s.write_matrix(), "comm_paths": comm, "references_path": references}


def sharding(strategy: str, mesh: tuple[list[int], list[str]], state_max: int, state_min: int, comm: dict[str, float] | None) -> dict[str, Any]:
    """measurements.sharding as the trainer writes it (scalerepro.training.measurements.sharding_figures)."""
    return {
        "strategy": strategy,
        "mesh": {"shape": mesh[0], "dims": mesh[1]},
        "reshard_after_forward": True,
        "state_bytes_per_rank_max": state_max,
        "state_bytes_per_rank_min": state_min,
        "comm_bytes_per_step_analytic": comm,
        "comm_reason": None
        if comm is not None
        else (
            f"not counted under --parallel {strategy}: the analytic volume is written for fsdp only (TP's activation "
            "all-gathers and reduce-scatters per block are not counted yet)"
        ),
    }


TP_COMM_REASON = sharding("tp", ([2], ["tp"]), 1, 1, None)["comm_reason"]
TOKENS = 1024  # gpt2_small's tokens per sample in the parallelism study


def write_parallelism_study(root: Path, device_type: str = "cuda") -> dict[str, Any]:
    """The parallelism study: gpt2_small at 2 GPUs, the same global batch (16) under each strategy.

    ddp      samples/s 40, 44 -> median 42, tokens/s 43,008, per GPU 21,504; no sharding entry
    fsdp     38, 40 -> 39; state 700 / 690 MB per rank; all-gather 500 MB + reduce-scatter 300 MB
             = 800 MB per step; a third repeat whose record says ddp (not the plan: not counted)
    tp       30 (one replica of 16); state 800 MB; communication not counted (comm_reason)
    fsdp-tp  at 4 GPUs (2x2): failed -> not measured
    """
    s = Study(root)
    gpt = {"model": "gpt2_small", "tokens_per_sample": TOKENS, "device_type": device_type, "per_gpu_batch": 8}
    for repeat, thr in enumerate((40, 44), 1):
        s.add("parallelism", 2, repeat, variant="ddp", samples_per_s=thr, **gpt)
    fsdp = sharding("fsdp", ([2], ["dp_shard"]), 700_000_000, 690_000_000, {"all_gather": 5e8, "reduce_scatter": 3e8})
    for repeat, thr in enumerate((38, 40), 1):
        s.add("parallelism", 2, repeat, variant="fsdp", parallel="fsdp", samples_per_s=thr, sharding=fsdp, **gpt)
    s.add("parallelism", 2, 3, variant="fsdp", parallel="fsdp", samples_per_s=999, **gpt)  # the record ran ddp
    s.add(
        "parallelism",
        2,
        1,
        variant="tp",
        parallel="tp",
        data_parallel=1,
        samples_per_s=30,
        sharding=sharding("tp", ([2], ["tp"]), 800_000_000, 800_000_000, None),
        **{**gpt, "per_gpu_batch": 16},
    )
    s.add("parallelism", 4, 1, variant="fsdp-tp", parallel="fsdp+tp", data_parallel=2, status="failed", error=FAILED_MESSAGE, **gpt)
    references = root / "references.yaml"
    references.write_text(REFERENCES_YAML)
    return {"matrix_path": s.write_matrix(), "comm_paths": [], "references_path": references}


def write_cpu_study(root: Path) -> dict[str, Any]:
    """Two CPU runs (1 and 2 ranks): no NVML, no sensitivity, ablation or all-reduce files."""
    s = Study(root)
    s.add("strong", 1, 1, device_type="cpu", samples_per_s=600)
    s.add("strong", 2, 1, per_gpu_batch=16, device_type="cpu", samples_per_s=780, exposed_comm=0.4)
    references = root / "references.yaml"
    references.write_text(REFERENCES_YAML)
    return {"matrix_path": s.write_matrix(), "comm_paths": [], "references_path": references}


def write_many_records(root: Path, count: int) -> Path:
    """``count`` strong-scaling records of one template (ids differ), for timing the reader."""
    s = Study(root)
    templates = {gpus: make_record("template", world_size=gpus, nodes=_nodes(gpus)) for gpus in (1, 2, 4, 8)}
    for index in range(count):
        gpus = 2 ** (index % 4)
        record = copy.deepcopy(templates[gpus])
        record["run_id"] = f"strong_resnet50_g{gpus}_r{index}"
        s.add("strong", gpus, index, record=record)
    return s.write_matrix()


def predict_published_benchmark():
    """benchmarks/predict_published.py as a module (it is a script, not part of the package)."""
    return benchmark_module("predict_published")


def benchmark_module(name: str):
    """benchmarks/<name>.py as a module (a script, not part of the package)."""
    import importlib.util
    import sys

    path = REPO / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The scaling model's overlap fixture: three buckets ready at 2, 5 and 9 ms of a 10 ms backward;
# forward 6 ms, optimizer 1 ms, the measured step 18 ms (other = 18 - (6 + 10 + 1) = 1 ms).
PROFILE = StepProfile(
    step_s=18e-3,
    forward_s=6e-3,
    backward_s=10e-3,
    optimizer_s=1e-3,
    micro_batches=1,
    bucket_bytes=(4_000_000, 1_000_000, 3_000_000),
    bucket_ready_s=(2e-3, 5e-3, 9e-3),
)
