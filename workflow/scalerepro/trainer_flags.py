"""Typed configuration of one training run, and its command line, generated from the fields.

Every flag of ``python -m scalerepro.training.train`` is a field below: its type, default and help text
live in one place, ``--help`` is generated from them, and the run record stores the resolved
dataclasses verbatim (``dataclasses.asdict``), so a record always says exactly how it was made.

``--preset`` names a whole configuration once (:data:`PRESETS`): ``optimised`` is what the
study's cells, the throughput benchmark and the README run; ``baseline`` (the defaults) is the
fp32, eager, DataLoader configuration the ablation starts from. A preset only changes defaults:
any flag given explicitly wins over it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import sys
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scalerepro.common import cpu_features
from scalerepro.common.cli import CommandError, OneLineErrorParser
from scalerepro.record.base import AttentionBackend, CompileMode, CompileScope, Loader, OptimizerImpl, Precision, Preset, Purpose, Strategy

# The convolutional networks: channels_last and cudnn.benchmark are part of the optimised preset
# for these only (tests check this set against each model's family in scalerepro.models.registry).
CONV_NETS = frozenset({"cnn", "resnet18_cifar", "resnet50"})
# Fields (dest names) each preset sets; those in CONV_NET_ONLY are set True for CONV_NETS only.
PRESETS: dict[str, dict[str, Any]] = {
    "baseline": {
        "precision": "fp32",
        "channels_last": False,
        "cudnn_benchmark": False,
        "compile": "none",
        "loader": "dataloader",
        "optimizer_impl": "foreach",
    },
    "optimised": {
        "precision": "bf16",
        "channels_last": True,
        "cudnn_benchmark": True,
        "compile": "default",
        "loader": "device",
        "optimizer_impl": "fused",
    },
}
CONV_NET_ONLY = ("channels_last", "cudnn_benchmark")
DEFAULT_PRESET = "baseline"
# The optimised preset compiles the convolutional networks with CUDA graphs (mode
# "reduce-overhead"): their steps are short and many-kernelled, so the host's kernel launches set
# the pace, and graphs replay them without the host (benchmarks/README.md has the H100 figures).
# The transformers stay on "default": their GPUs are nearly always busy, and a graph's private
# memory pool costs memory. Only where a step is one micro-batch of one DDP (or single-GPU)
# model: under gradient accumulation the next micro-batch's replay would reuse the pool memory of
# the gradients still being accumulated, and FSDP, tensor and pipeline parallelism run
# collectives inside the step that a graph must not capture.
CUDA_GRAPH_COMPILE = "reduce-overhead"  # one of scalerepro.common.cuda_graphs.CUDA_GRAPH_MODES
# Under --parallel tp alone the replicated embeddings and head stay plain tensors beside the
# blocks' DTensors, and a foreach or fused optimizer kernel cannot take both in one list (fsdp+tp
# makes every parameter a DTensor): there every preset takes the per-parameter loop, and an
# explicit foreach or fused is refused (TrainConfig.validate).
TP_OPTIMIZER_IMPL = "for-loop"


def preset_values(preset: str, model: str, grad_accum_steps: int = 1, parallel: str = "ddp", device: str = "auto") -> dict[str, Any]:
    """The field values ``preset`` gives a run of ``model`` (dest name -> value), with
    ``grad_accum_steps`` micro-batches a step under the ``parallel`` strategy, on ``device`` (the
    flag's value: on "cpu" bf16 only where the CPU has it natively, else fp32)."""
    values = dict(PRESETS[preset])
    for name in CONV_NET_ONLY:
        values[name] = values[name] and model in CONV_NETS
    if values["compile"] != "none" and model in CONV_NETS and grad_accum_steps == 1 and parallel == "ddp":
        values["compile"] = CUDA_GRAPH_COMPILE
    if device == "cpu" and values["precision"] == "bf16" and not _native_bf16_here()[0]:
        values["precision"] = "fp32"  # emulated bf16 trains 1.5-2.3x slower than fp32 (scalerepro.common.cpu_features)
    if parallel == "tp":
        values["optimizer_impl"] = TP_OPTIMIZER_IMPL
    return values


def _native_bf16_here() -> tuple[bool, str]:
    return _native_bf16_under(os.environ.get("ONEDNN_MAX_CPU_ISA", ""), os.environ.get("DNNL_MAX_CPU_ISA", ""))


@functools.cache  # /proc/cpuinfo once a process (the planner resolves hundreds of runs); keyed on the ISA caps
def _native_bf16_under(onednn_cap: str, dnnl_cap: str) -> tuple[bool, str]:
    return cpu_features.native_bf16(environ={"ONEDNN_MAX_CPU_ISA": onednn_cap, "DNNL_MAX_CPU_ISA": dnnl_cap})


def precision_reason(config: TrainConfig, device_type: str) -> str | None:
    """Why a run on ``device_type`` trains at its precision, where the device decides it (a CPU:
    bf16 is native on some, emulated on others); None on a GPU."""
    if device_type != "cpu":
        return None
    native, why = _native_bf16_here()
    precision = config.perf.precision
    chosen = "given explicitly" if "precision" in preset_overrides(config) else f"the {config.perf.preset} preset's choice on this CPU"
    if precision == "bf16":
        return f"bf16 ({chosen}): {why}" + ("" if native else ", so it runs slower than fp32 would")
    if precision == "fp32" and config.perf.preset == "optimised" and not native:
        return f"fp32 ({chosen}, bf16 where native only): {why}"
    return f"{precision} ({chosen}); {why}"


def given_values(argv: Sequence[str]) -> dict[str, Any]:
    """The fields the flags of ``argv`` give explicitly (dest name -> value, as the parser reads it);
    a flag or value the parser refuses exits 2 with one line. (``--debug`` is the command's, not the run's.)"""
    parser = build_parser()
    unset = object()
    namespace = parser.parse_args(list(argv), argparse.Namespace(**{action.dest: unset for action in parser._actions}))
    return {name: value for name, value in vars(namespace).items() if value is not unset and name in _sections()}


def given_flags(argv: list[str]) -> set[str]:
    """The dest names of the flags ``argv`` gives explicitly (whatever their values)."""
    return set(given_values(argv))


def with_device(config: TrainConfig, device_type: str, given: set[str]) -> TrainConfig:
    """``config`` with the preset applied for ``device_type`` (what --device auto resolved to): a
    field the preset set takes the preset's value for that device; a flag in ``given`` (given
    explicitly: given_flags) keeps its value."""
    # the resolved device is recorded, so that the record's preset_overrides compare with that device's preset
    return with_preset(with_values(config, {"device": device_type}), given)


def with_preset(config: TrainConfig, given: Collection[str]) -> TrainConfig:
    """``config`` with each field its preset sets, but those ``given`` names (given explicitly), at
    the preset's value for the config's model, accumulation, strategy and device."""
    return with_values(config, {name: value for name, value in _preset_of(config).items() if name not in given})


def _preset_of(config: TrainConfig) -> dict[str, Any]:
    return preset_values(config.perf.preset, config.model.model, config.optim.grad_accum_steps, config.parallel.parallel, config.parallel.device)


class TrainerConfigError(CommandError, ValueError):
    """A user-facing configuration problem; its message is one line naming the flag and the fix."""


def _opt(default: Any, help: str, **argparse_extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **argparse_extra})


@dataclass
class ModelConfig:
    model: str = _opt(
        "resnet18_cifar",
        "model to train: cnn, resnet18_cifar, resnet50, vit_b_16, bert_base, gpt2_small, gpt2_medium, gpt2_large, gpt2_xl, llama_1b, llama3_8b",
    )
    image_size: int | None = _opt(None, "image side in pixels (default: the model's, or 32 for CIFAR-10)")
    num_classes: int | None = _opt(None, "classifier outputs (default: the model's, or 10 for CIFAR-10)")
    seq_len: int | None = _opt(None, "sequence length of the language models (default 128 bert_base, 1024 gpt2_*, 8192 llama_*)")
    vocab_size: int | None = _opt(None, "vocabulary size for the language models (default 30522 bert_base, 50257 gpt2_*, 128256 llama_*)")
    num_layers: int | None = _opt(None, "transformer layers (default: the model's, 12 for the base-size models)")
    hidden_size: int | None = _opt(None, "transformer width (default: the model's, 768 for the base-size models)")
    num_heads: int | None = _opt(None, "attention (query) heads (default: the model's, 12 for the base-size models)")
    num_kv_heads: int | None = _opt(None, "key/value heads of the llama_* models' grouped-query attention (default 8; must divide --num-heads)")
    dropout: float = _opt(0.0, "dropout probability in the transformers (0 for throughput studies)")
    stem_channels: int = _opt(
        3,
        "input channels of resnet18_cifar's and resnet50's first convolution: 4 or 8 pads the RGB image with zero channels "
        "inside the model, so that the stem's NHWC convolution can take a tensor-core kernel (3: the plain stem)",
    )


@dataclass
class DataConfig:
    data: str = _opt("synthetic", "'synthetic' or a prepared CIFAR-10 directory (written by the workflow's fetch rule)")
    synthetic_samples: int = _opt(50_000, "training samples in the synthetic dataset (one epoch)")
    eval_samples: int | None = _opt(
        None,
        "held-out samples to evaluate (default: 16 eval batches per rank, at most 2048; the first of the CIFAR-10 test split, or synthetic; 10000 is the whole CIFAR-10 split)",
    )
    augment: bool = _opt(True, "random crop (4-pixel padding) and horizontal flip on CIFAR-10")
    loader: Loader = _opt("dataloader", "'dataloader': torch DataLoader + DistributedSampler; 'device': whole dataset resident on the device, augmented there")
    num_workers: int | None = _opt(None, "DataLoader worker processes per rank (default: the rank's cores less the one its own process keeps, at most 4)")
    pin_memory: bool = _opt(True, "DataLoader pin_memory (page-locked host buffers for async copies)")
    persistent_workers: bool = _opt(True, "keep DataLoader workers alive between epochs")
    prefetch_factor: int = _opt(2, "batches each DataLoader worker prepares ahead")


@dataclass
class OptimConfig:
    optimizer: Literal["auto", "sgd", "adamw"] = _opt("auto", "'auto': SGD (momentum, Nesterov) for CNNs, AdamW for transformers")
    lr: float | None = _opt(None, "learning rate at --lr-base-batch (default 0.1 SGD, 1e-3 AdamW)")
    lr_base_batch: int = _opt(256, "global batch at which --lr applies; the LR is scaled to the actual global batch")
    lr_scaling: Literal["auto", "linear", "sqrt", "none"] = _opt("auto", "LR scaling with global batch ('auto': linear for SGD, sqrt for AdamW)")
    lr_schedule: Literal["cosine", "onecycle", "constant"] = _opt("cosine", "LR decay after warm-up")
    lr_warmup_steps: int = _opt(0, "linear LR warm-up steps (cosine/constant schedules)")
    min_lr_ratio: float = _opt(0.0, "final LR of the cosine decay as a fraction of the peak")
    momentum: float = _opt(0.9, "SGD momentum")
    nesterov: bool = _opt(True, "Nesterov momentum for SGD")
    weight_decay: float | None = _opt(None, "weight decay (default 5e-4 SGD, 0.1 AdamW)")
    adam_beta1: float = _opt(0.9, "AdamW beta1")
    adam_beta2: float = _opt(0.95, "AdamW beta2")
    label_smoothing: float = _opt(0.0, "label smoothing of the cross-entropy")
    grad_accum_steps: int = _opt(1, "micro-batches per optimizer step; under DDP the all-reduce runs on the last only (no_sync)")
    clip_grad_norm: float = _opt(0.0, "clip the global gradient norm to this value (0: off)")
    optimizer_impl: OptimizerImpl = _opt("foreach", "optimizer kernel implementation (for-loop under --parallel tp, where the others cannot run)")


@dataclass
class ParallelConfig:
    device: Literal["auto", "cuda", "cpu"] = _opt("auto", "'auto': CUDA when available, else CPU")
    parallel: Strategy = _opt(
        "ddp",
        "parallel strategy (scalerepro.parallel): ddp (DistributedDataParallel), fsdp (FSDP2 per block), tp (tensor parallel), "
        "fsdp+tp (2-D mesh, TP over --tp-size ranks), pp (GPT cut into one stage per rank, --pp-schedule over --microbatches)",
    )
    reshard_after_forward: bool = _opt(
        True, "FSDP: free gathered parameters after each block's forward (ZeRO-3-like); --no-: keep them for backward (ZeRO-2-like)"
    )
    tp_size: int | None = _opt(None, "tensor-parallel ranks per group under --parallel fsdp+tp (default: the ranks of one node; under tp: all ranks)")
    pp_schedule: Literal["gpipe", "1f1b"] = _opt("gpipe", "pipeline schedule under --parallel pp")
    microbatches: int = _opt(4, "pipeline micro-batches per step under --parallel pp")
    activation_checkpointing: Literal["none", "selective", "full"] = _opt(
        "none", "recompute blocks in backward: full = every transformer block, selective = every other block (torchtitan's layer-selective)"
    )
    bucket_cap_mb: float = _opt(25.0, "DDP gradient bucket size in MiB")
    gradient_as_bucket_view: bool = _opt(False, "DDP gradients as views into the all-reduce buckets (saves a copy)")
    static_graph: bool = _opt(False, "DDP static_graph (the graph does not change between steps)")
    sync_batchnorm: bool = _opt(False, "convert BatchNorm to SyncBatchNorm (batch statistics over all ranks)")
    process_group_at_one_rank: bool = _opt(
        False,
        "at one rank too, form the process group (NCCL on a GPU) and wrap the model in DDP: a 1-GPU run that pays the DDP "
        "reducer and its all-reduces as the N-GPU runs do, and the way to run the NCCL/DDP paths on one GPU",
    )
    dist_backend: Literal["auto", "nccl", "gloo"] = _opt(
        "auto",
        "collective backend: 'auto' = NCCL on CUDA, gloo on the CPU; 'gloo' on CUDA lets several ranks share one GPU "
        "(checks the multi-rank CUDA code paths on one card; it measures neither NCCL nor NVLink)",
    )
    dist_timeout_s: float = _opt(300.0, "seconds to wait for every rank to join, and for any collective after the warm-up steps")
    warmup_dist_timeout_s: float = _opt(
        1800.0,
        "collective timeout from the process group's forming to the end of the warm-up steps (at least the first step): "
        "compilation and autotuning run there, and a cold compile cache on one rank must not trip --dist-timeout-s",
    )


@dataclass
class PerfConfig:
    preset: Preset = _opt(
        DEFAULT_PRESET,
        "a named configuration setting the flags below, --loader and --optimizer-impl: 'optimised' = bf16, channels_last and "
        "cudnn.benchmark (CNNs), torch.compile, device loader, fused optimizer; 'baseline' = fp32, eager, DataLoader, foreach. "
        "Flags given explicitly win over it",
    )
    precision: Precision = _opt("fp32", "fp32 (TF32 off), tf32 (TF32 matmuls/convs), fp16 (autocast + loss scaling), bf16 (autocast)")
    channels_last: bool = _opt(False, "NHWC memory format for image models and their inputs")
    compile: CompileMode = _opt("none", "torch.compile the model; '--compile' alone means mode 'default'", nargs="?", const="default")
    compile_scope: CompileScope = _opt(
        "model",
        "what --compile compiles: 'model' = the model with its loss as one program; 'blocks' = each repeated transformer block "
        "on its own (regional compilation: the blocks share one compiled program), embeddings, head and loss eager",
    )
    compile_cache: str | None = _opt(
        None,
        "file of torch.compile's portable cache artifacts (code: pickled programs torch runs), written by rank 0 after the "
        "warm-up and signed with this user's key; loaded before the first compile only where this user's runs signed it "
        "(anything else: compiled cold, the reason in the record); re-sign a vetted cache from elsewhere with "
        "'python -m scalerepro.training.cache_trust sign FILE'",
    )
    attention_backend: AttentionBackend = _opt(
        "auto", "the scaled_dot_product_attention kernel the transformers may use ('auto': PyTorch's choice among those that fit)"
    )
    cudnn_benchmark: bool = _opt(False, "torch.backends.cudnn.benchmark: time the convolution algorithms for each shape, keep the fastest")


@dataclass
class RunConfig:
    per_gpu_batch: int = _opt(32, "samples per GPU (rank) per micro-batch; the global batch is this x accumulation steps x data-parallel ranks")
    steps: int | None = _opt(None, "optimizer steps to run (default 100 unless --epochs is given)")
    epochs: int | None = _opt(None, "epochs to run instead of --steps")
    warmup_steps: int = _opt(10, "first steps excluded from the measured window (compilation, allocator and cuDNN warm-up)")
    warmup_max_steps: int = _opt(
        0,
        "warm up past --warmup-steps until the step time settles (two steps in a row within --warmup-settle of each other), "
        "at most this many steps in all (0: exactly --warmup-steps)",
    )
    warmup_settle: float = _opt(0.1, "with --warmup-max-steps: the relative change of the step time below which the warm-up has settled")
    min_window_s: float = _opt(
        0.0,
        "measure for at least this many seconds: when the measured steps of --steps add up to less, the run goes on "
        "(at the schedule's last learning rate) until they reach it; 0: the window is --steps less --warmup-steps",
    )
    min_window_steps: int = _opt(
        0,
        "measure at least this many steps: when a longer warm-up (--warmup-max-steps) left fewer of --steps, the run goes on "
        "(at the schedule's last learning rate) until it has them; with --min-window-s, the window meets both",
    )
    purpose: Purpose = _opt(
        "measurement",
        "what the run is for, recorded as the record's purpose: 'measurement' (its figures count), 'smoke' (a check of a code path, "
        "which the analysis must not pool with a measurement of the same configuration)",
    )
    seed: int = _opt(0, "seed of model init, data order, synthetic data and augmentation")
    log_interval: int = _opt(10, "steps between log lines (the loss is read from the device only then)")
    eval: bool = _opt(True, "evaluate on held-out data after every epoch and at the end")
    eval_batch_size: int | None = _opt(None, "evaluation batch per rank (default: --per-gpu-batch)")
    eval_budget_s: float = _opt(
        0.0, "seconds an evaluation may take: past them it stops after the batch in hand, one batch at least (0: every held-out sample)"
    )
    comm_probe_steps: int = _opt(8, "after training, steps timed with and without gradient all-reduce to measure exposed communication (0: off)")
    bucket_probe_steps: int = _opt(
        5, "after training, steps timing forward, backward with each DDP bucket's ready time, and the optimizer, for the scaling model (0: off)"
    )
    kernel_profile_steps: int = _opt(
        0,
        "after the probes, steps profiled with torch.profiler in this process: each kernel's launches and device time and "
        "the GPU's idle time into the record's step_kernels (on a CPU, the ATen operators' self time; 0: off)",
    )
    probe_budget_s: float = _opt(
        0.0,
        "seconds the probes after training may take: each runs as many of its steps as fit at the window's median step, "
        "at least what its statistics need (the communication probe 3 of each kind, the bucket probe 1), at most "
        "--comm-probe-steps / --bucket-probe-steps (0: those step counts, whatever they take)",
    )
    nvml_interval_s: float = _opt(0.1, "NVML sampling period in seconds")
    nvml_idle_s: float = _opt(2.0, "seconds of reading each GPU's idle power before the first step (energy is reported net of it too; 0: off)")
    peak_tflops: float | None = _opt(None, "peak dense TFLOP/s per device for MFU (default: from the GPU datasheet table)")
    record: str | None = _opt(None, "path of the JSON run record (written atomically by rank 0)")
    run_id: str | None = _opt(None, "identifier stored in the record (default: a random UUID)")
    checkpoint_dir: str | None = _opt(None, "directory for checkpoints (none written without it)")
    checkpoint_interval: int = _opt(0, "steps between checkpoints (0: only on SIGTERM/SIGUSR1)")
    keep_checkpoints: int = _opt(2, "newest usable checkpoints kept in --checkpoint-dir (unreadable or foreign files never count)")
    keep_final_checkpoint: bool = _opt(
        False, "write a final checkpoint (marked final: never resumed) and keep it; otherwise a finished, recorded run removes its checkpoints"
    )
    resume: bool = _opt(
        False, "continue from the newest usable checkpoint in --checkpoint-dir, naming every newer one passed over (start fresh if there is none)"
    )
    progress: Literal["auto", "on", "off"] = _opt("auto", "progress bar on rank 0 ('auto': when stderr is a terminal)")


@dataclass
class ProfileConfig:
    profile_mode: Literal["none", "cuda_api", "torch"] = _opt(
        "none",
        "'cuda_api': NVTX ranges + cudaProfilerStart/Stop around the window (for nsys/ncu); 'torch': torch.profiler over the window on rank 0 (the fallback)",
    )
    profile_window_start: int = _opt(10, "first optimizer step (0-based) inside the profiling window")
    profile_window_steps: int = _opt(5, "optimizer steps inside the profiling window")
    profile_dir: str | None = _opt(None, "directory for the torch profiler's trace.json and operators.csv (--profile-mode torch)")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    run: RunConfig = field(default_factory=RunConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def validate(self) -> None:
        """Raise TrainerConfigError for values no run could use; cross-field checks that need the
        model or the dataset happen where those are resolved."""
        r, o, d = self.run, self.optim, self.data
        # a float flag is a finite number: nan passes every comparison below (nan < 0 is false) and
        # would reach the ranks (--min-window-s nan trained 100 steps before anything noticed)
        for part in dataclasses.fields(self):
            section = getattr(self, part.name)
            if not dataclasses.is_dataclass(section):
                continue
            for item in dataclasses.fields(section):
                value = getattr(section, item.name)
                if isinstance(value, float) and not math.isfinite(value):
                    raise TrainerConfigError(f"--{item.name.replace('_', '-')} must be a finite number (got {value})")
        if r.checkpoint_dir and Path(r.checkpoint_dir).exists() and not Path(r.checkpoint_dir).is_dir():
            raise TrainerConfigError(f"--checkpoint-dir {r.checkpoint_dir} is a file, not a folder: give a folder (it is made if absent)")
        positive = {
            "--per-gpu-batch": r.per_gpu_batch,
            "--log-interval": r.log_interval,
            "--grad-accum-steps": o.grad_accum_steps,
            "--lr-base-batch": o.lr_base_batch,
            "--synthetic-samples": d.synthetic_samples,
            "--prefetch-factor": d.prefetch_factor,
            "--keep-checkpoints": r.keep_checkpoints,
            "--microbatches": self.parallel.microbatches,
        }
        for flag, value in positive.items():
            if value < 1:
                raise TrainerConfigError(f"{flag} must be at least 1 (got {value})")
        for flag, value in {"--steps": r.steps, "--epochs": r.epochs, "--eval-batch-size": r.eval_batch_size, "--eval-samples": d.eval_samples}.items():
            if value is not None and value < 1:
                raise TrainerConfigError(f"{flag} must be at least 1 (got {value})")
        if d.num_workers is not None and d.num_workers < 0:
            raise TrainerConfigError(f"--num-workers must not be negative (got {d.num_workers})")
        if r.steps is not None and r.epochs is not None:
            raise TrainerConfigError("give --steps or --epochs, not both")
        for flag, value in {
            "--warmup-steps": r.warmup_steps,
            "--lr-warmup-steps": o.lr_warmup_steps,
            "--checkpoint-interval": r.checkpoint_interval,
            "--comm-probe-steps": r.comm_probe_steps,
            "--bucket-probe-steps": r.bucket_probe_steps,
            "--kernel-profile-steps": r.kernel_profile_steps,
            "--clip-grad-norm": o.clip_grad_norm,
            "--warmup-max-steps": r.warmup_max_steps,
            "--probe-budget-s": r.probe_budget_s,
            "--eval-budget-s": r.eval_budget_s,
            "--warmup-settle": r.warmup_settle,
            "--min-window-steps": r.min_window_steps,
        }.items():
            if value < 0:
                raise TrainerConfigError(f"{flag} must not be negative (got {value})")
        if not 0.0 <= o.label_smoothing < 1.0:
            raise TrainerConfigError(f"--label-smoothing must be in [0, 1) (got {o.label_smoothing})")
        if not 0.0 <= self.model.dropout < 1.0:
            raise TrainerConfigError(f"--dropout must be in [0, 1) (got {self.model.dropout})")
        for flag, value in {"--dist-timeout-s": self.parallel.dist_timeout_s, "--warmup-dist-timeout-s": self.parallel.warmup_dist_timeout_s}.items():
            if value <= 0:
                raise TrainerConfigError(f"{flag} must be positive (got {value})")
        if r.min_window_s < 0:
            raise TrainerConfigError(f"--min-window-s must not be negative (got {r.min_window_s})")
        if r.nvml_interval_s <= 0:
            raise TrainerConfigError(f"--nvml-interval-s must be positive (got {r.nvml_interval_s})")
        if r.nvml_idle_s < 0:
            raise TrainerConfigError(f"--nvml-idle-s must not be negative (got {r.nvml_idle_s})")
        if self.parallel.parallel == "tp" and o.optimizer_impl != TP_OPTIMIZER_IMPL:
            raise TrainerConfigError(
                f"--parallel tp needs --optimizer-impl {TP_OPTIMIZER_IMPL} (the {o.optimizer_impl} kernels cannot mix the replicated "
                "plain-tensor embeddings with the sharded DTensor blocks): leave --optimizer-impl out under tp, or use fsdp+tp"
            )
        if self.parallel.tp_size is not None and self.parallel.tp_size < 2:
            raise TrainerConfigError(f"--tp-size must be at least 2 (got {self.parallel.tp_size})")
        if r.resume and not r.checkpoint_dir:
            raise TrainerConfigError("--resume needs --checkpoint-dir")
        prof = self.profile
        if prof.profile_window_start < 0 or prof.profile_window_steps < 1:
            raise TrainerConfigError("--profile-window-start must not be negative and --profile-window-steps must be at least 1")
        if prof.profile_mode == "torch" and not prof.profile_dir:
            raise TrainerConfigError("--profile-mode torch needs --profile-dir (where the trace and operator table go)")


# ---- command line ---------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _argparse_kwargs(f: dataclasses.Field, annotation: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"default": f.default, "dest": f.name}
    meta = dict(f.metadata)
    help_text = meta.pop("help")
    kwargs.update(meta)
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):  # "int | None" -> int
        annotation = args[0]
        origin, args = typing.get_origin(annotation), list(typing.get_args(annotation))
    if annotation is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif origin is Literal:
        kwargs["choices"] = list(args)
        kwargs["type"] = str
    else:
        kwargs["type"] = annotation
        kwargs["metavar"] = annotation.__name__.upper()
    kwargs["help"] = f"{help_text} (default: {f.default})"
    return kwargs


@functools.cache  # built from the dataclasses' type hints (~5 ms); parsing does not change it
def build_parser(prog: str = "python -m scalerepro.training.train") -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog=prog,
        description="Train a model (DDP, FSDP2, tensor or pipeline parallel: --parallel) for a measured window and write one JSON run record.",
    )
    for section in dataclasses.fields(TrainConfig):
        section_type = typing.get_type_hints(TrainConfig)[section.name]
        group = parser.add_argument_group(section.name)
        hints = typing.get_type_hints(section_type, include_extras=False)
        for f in dataclasses.fields(section_type):
            group.add_argument(_flag(f.name), **_argparse_kwargs(f, hints[f.name]))
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse and validate the command line; a bad flag or value exits 2 with one line.

    Each field takes the value its flag gives, else its preset's (applied to the run's model,
    accumulation, strategy and device), else its default: a flag given explicitly wins over the preset.
    """
    given = given_values(sys.argv[1:] if argv is None else argv)
    config = with_preset(with_values(TrainConfig(), given), given)
    try:
        config.validate()
    except TrainerConfigError as error:
        build_parser().error(str(error))
    return config


def render_argv(config: TrainConfig) -> list[str]:
    """The command line ``parse_args`` reads as ``config``: --model and --preset, then, in the
    dataclasses' order, each field whose value is not what the preset (for that model,
    accumulation, strategy and device) or else the default gives; booleans as --flag / --no-flag."""
    implied = {**values_of(TrainConfig()), **_preset_of(config)}
    leading = {"model": config.model.model, "preset": config.perf.preset}
    rest = {name: value for name, value in values_of(config).items() if name not in leading and value != implied[name]}
    return [word for name, value in {**leading, **rest}.items() for word in _words(name, value)]


def _words(name: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [_flag(name if value else f"no_{name}")]
    text = str(value)
    return [f"{_flag(name)}={text}"] if text.startswith("-") else [_flag(name), text]  # "--lr=-1e-05": not read as a flag


@functools.cache
def _sections() -> dict[str, str]:
    """Each field's section: dest name -> the TrainConfig field that holds it, in the dataclasses' order."""
    config = TrainConfig()
    return {f.name: section.name for section in dataclasses.fields(config) for f in dataclasses.fields(getattr(config, section.name))}


def values_of(config: TrainConfig) -> dict[str, Any]:
    """Every field of ``config`` by its dest name, in the dataclasses' order."""
    return {name: getattr(getattr(config, section), name) for name, section in _sections().items()}


def with_values(config: TrainConfig, values: Mapping[str, Any]) -> TrainConfig:
    """``config`` with the fields ``values`` names (dest names) set to its values (dataclasses.replace)."""
    changes: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        changes.setdefault(_sections()[name], {})[name] = value
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields) for section, fields in changes.items()})


def preset_overrides(config: TrainConfig) -> dict[str, Any]:
    """The fields where ``config`` departs from its preset (dest name -> the value it has)."""
    resolved = values_of(config)
    return {name: resolved[name] for name, value in _preset_of(config).items() if resolved[name] != value}
