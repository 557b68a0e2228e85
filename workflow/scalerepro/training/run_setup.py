"""What the entry point does before it builds the Trainer: resolve the run's config, and set the
process-global state the run depends on.

As torchtitan resolves its JobConfig before the trainer sees it, the flags a rank leaves open
(``--num-workers``, ``--eval-samples``) are decided here, once, from the rank's cores and its
data-parallel size: the Trainer's ``config`` is then the config it was given, and the record holds
what ran. What belongs to the process rather than to one object (the seed, the collective
timeout, the fp32 arithmetic, cuDNN's autotuner and torch.compile's kernel cache) is set in
``set_process_state``, the one place that touches it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import sys
import tempfile
from collections.abc import MutableMapping

import torch

from scalerepro.common.cli import describe_os_error
from scalerepro.common.files import ownership_problem
from scalerepro.data import builders
from scalerepro.models import registry
from scalerepro.parallel import mesh
from scalerepro.schedulers import cores
from scalerepro.telemetry import ranges
from scalerepro.trainer_flags import TrainConfig, TrainerConfigError
from scalerepro.training import distributed
from scalerepro.training.distributed import DistContext


@dataclasses.dataclass(frozen=True)
class DataParallelPlace:
    """Where this rank sits in the data-parallel dimension: the ranks of one TP group read the
    same batch, so the data is split over data-parallel ranks only (all ranks under ddp and fsdp)."""

    tp_size: int | None  # None where the form has no TP dimension (ddp, fsdp, pp)
    dp_rank: int
    dp_size: int


def data_parallel_place(config: TrainConfig, ctx: DistContext) -> DataParallelPlace:
    p = config.parallel
    tp_size = mesh.default_tp_size(p.parallel, ctx.world_size, ctx.env.local_world_size, p.tp_size)
    try:
        dp_rank, dp_size = mesh.data_parallel_coordinates(p.parallel, ctx.rank, ctx.world_size, tp_size)
    except mesh.ParallelError as error:
        raise TrainerConfigError(str(error)) from None
    return DataParallelPlace(tp_size, dp_rank, dp_size)


def resolve_config(config: TrainConfig, ctx: DistContext) -> TrainConfig:
    """``config`` with what the flags left open decided for this rank: the loader's workers (what
    the rank's cores leave, scalerepro.schedulers.cores) and the held-out samples (a few batches,
    scalerepro.data.builders). The record says how many of each."""
    data = config.data
    if data.num_workers is None:
        data = dataclasses.replace(data, num_workers=cores.loader_workers(len(ctx.cores) or len(os.sched_getaffinity(0))))
    if data.eval_samples is None:
        run = config.run
        dp_size = data_parallel_place(config, ctx).dp_size
        data = dataclasses.replace(data, eval_samples=builders.default_eval_samples(run.eval_batch_size or run.per_gpu_batch, dp_size))
    return dataclasses.replace(config, data=data)


def resolve_model(config: TrainConfig) -> registry.ModelSpec:
    """The model spec the flags name; CIFAR-10 data fixes 32x32 images and 10 classes."""
    m = config.model
    shape = registry.ModelShape(**{k: v for k, v in dataclasses.asdict(m).items() if k != "model"})
    try:
        if not builders.is_synthetic(config.data):
            if registry.resolve(m.model).task != "image_classification":
                raise TrainerConfigError(f"--data {config.data} is CIFAR-10 and needs an image model, not {m.model}")
            for flag, given, needed in (("--image-size", m.image_size, 32), ("--num-classes", m.num_classes, 10)):
                if given not in (None, needed):
                    raise TrainerConfigError(f"{flag} {given} does not fit CIFAR-10 ({needed})")
            shape = dataclasses.replace(shape, image_size=32, num_classes=10)
        return registry.resolve(m.model, shape)
    except TrainerConfigError:
        raise
    except ValueError as error:  # the model registry's one-line messages name the flag
        raise TrainerConfigError(str(error)) from None


def is_resolved(config: TrainConfig) -> bool:
    return config.data.num_workers is not None and config.data.eval_samples is not None


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype a step's forward autocasts to (fp16, bf16), or None (fp32 and tf32 run in fp32)."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)


def set_precision(precision: str) -> None:
    """Set the fp32 arithmetic of the matmul and cuDNN convolution paths: TF32 for tf32, IEEE fp32
    for every other precision.

    fp32 turns TF32 off for convolutions too (cuDNN allows it by default), so fp32 means fp32.
    torch 2.9 and later set this through ``fp32_precision``: the older ``allow_tf32`` switches are
    deprecated there and do not reach the new settings (after ``cudnn.allow_tf32 = False`` the
    convolutions' ``fp32_precision`` still reads "none"), so the new API is used where it exists.
    """
    tf32 = precision == "tf32"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        mode = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode  # type: ignore[attr-defined]  # cudnn's module object is a CudnnModule, which has conv
    else:  # torch before 2.9 (an older NGC container)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def private_compile_cache(environ: MutableMapping[str, str]) -> str:
    """torch.compile's kernel cache for this run (``TORCHINDUCTOR_CACHE_DIR``, set in ``environ``
    and returned): a folder only this user can write, one for each ATen CPU capability cap.

    Inductor's cache holds pickles and compiled libraries that torch loads and runs, and its
    default is ``/tmp/torchinductor_<user>``: a name any user of a shared node can make first and
    fill, and torch checks no owner. So the folder is made 0700 where it is absent, and used only
    where it is a folder of this user's that no one else can write (``ownership_problem``); else
    the run compiles cold into a new private folder of its own, and says why on stderr (its log).

    torch 2.13's inductor took a CPU kernel from its cache that it had compiled with no
    ``ATEN_CPU_CAPABILITY`` for a run with ``ATEN_CPU_CAPABILITY=avx2``, and the kernel computed
    garbage: the compiled CNN's step failed on an index of -4.8e18 (the suite under the ISA caps,
    benchmarks/README.md). So where the cache is torch's default folder, a run under a cap
    compiles into a folder of that cap's (``torchinductor_<user>-aten-avx2``); a run without one,
    and a folder the user chose, keep theirs."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    default = os.path.abspath(default_cache_dir())
    folder = os.path.abspath(environ.get("TORCHINDUCTOR_CACHE_DIR", default))
    if capability and folder == default:
        folder = f"{default}-aten-{capability}"
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        info = os.lstat(folder)
        problem = ownership_problem(folder, info, 0o022) if stat.S_ISDIR(info.st_mode) else f"{folder} is not a folder"
    except OSError as error:
        problem = f"{folder}: {describe_os_error(error)}"
    if problem is not None:
        private = tempfile.mkdtemp(prefix="scalerepro-torchinductor-")
        print(f"scalerepro: torch.compile's cache is not used ({problem}): this run compiles cold into {private}", file=sys.stderr, flush=True)
        folder = private
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def set_process_state(config: TrainConfig, ctx: DistContext) -> None:
    """The process-global state of a run, set before the Trainer is built: torch's seed (the
    model's initial weights are drawn next), the collectives' timeout, the fp32 arithmetic,
    cuDNN's autotuner, torch.compile's kernel cache (``private_compile_cache``), and the named
    ranges of --profile-mode.

    Until the warm-up steps are done, collectives may wait for a peer that is still compiling or
    autotuning: they get the long warm-up timeout here, and the steady-state one once the trainer
    is warmed up."""
    torch.manual_seed(config.run.seed)
    distributed.set_collective_timeout(ctx, config.parallel.warmup_dist_timeout_s)
    set_precision(config.perf.precision)
    torch.backends.cudnn.benchmark = config.perf.cudnn_benchmark
    if config.perf.compile != "none":
        private_compile_cache(os.environ)
    ranges.enable_ranges(config.profile.profile_mode, ctx.device)
