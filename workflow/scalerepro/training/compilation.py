"""How the rank compiles its model, which attention kernel it may use, and the compile cache it carries.

A cold ``torch.compile`` is most of a short GPU run's wall time (the one-H100 frontier: 430 of its
835 device seconds went to compiling six models). Two levers cut it:

- **Regional compilation** (``--compile-scope blocks``, as torchtitan compiles per block): each
  repeated transformer block is compiled on its own, in place (``nn.Module.compile``). The blocks
  share one class and one ``forward``, and Dynamo treats a module's parameters as inputs, so the
  first block's program serves the others: one block is compiled, not twelve or sixteen. The
  embeddings, the head and the loss run eagerly, which is what the A/B against ``model`` measures.
- **The portable compile cache** (``--compile-cache FILE``): PyTorch's cache artifacts
  (``torch.compiler.save_cache_artifacts``: the compiled graphs, their kernels and autotuning
  results), loaded before the first compile and written after the run. They are valid for the same
  torch, device and code; anything else is a cache miss. The artifacts are code (pickled programs
  torch runs), so only a file this user's runs signed is loaded (``cache_trust``).

``--attention-backend`` holds ``scaled_dot_product_attention`` to one kernel family
(``torch.nn.attention.sdpa_kernel``) for the forward; its backward follows the forward's kernel.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalerepro.common.cli import describe_os_error
from scalerepro.parallel.blocks import repeated_blocks
from scalerepro.trainer_flags import PerfConfig, TrainerConfigError
from scalerepro.training import cache_trust

ATTENTION_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
# scaled_dot_product_attention's kernels on a CPU (the others are CUDA's)
CPU_ATTENTION_BACKENDS = ("flash", "math")


def check(perf: PerfConfig, model: nn.Module, model_name: str, device_type: str) -> None:
    """Refuse, in one line, a compile scope or attention kernel this model or device cannot take."""
    has_blocks = repeated_blocks(model) is not None
    if perf.compile_scope == "blocks" and perf.compile != "none" and not has_blocks:
        raise TrainerConfigError(f"--compile-scope blocks compiles each transformer block, and {model_name} has none: use --compile-scope model")
    if perf.attention_backend == "auto":
        return
    if not has_blocks:
        raise TrainerConfigError(f"--attention-backend {perf.attention_backend}: {model_name} has no attention; leave it at auto")
    if device_type == "cpu" and perf.attention_backend not in CPU_ATTENTION_BACKENDS:
        raise TrainerConfigError(
            f"--attention-backend {perf.attention_backend} is a CUDA kernel: on the CPU use {' or '.join(CPU_ATTENTION_BACKENDS)} (or auto)"
        )


def compile_model(model: nn.Module, module: nn.Module, perf: PerfConfig) -> nn.Module:
    """The model to train, compiled as ``--compile`` and ``--compile-scope`` say. ``model`` is the
    module with its loss (and DDP) around ``module``, the network itself.

    ``model`` scope: one program of the model and its loss (under DDP, Dynamo's DDPOptimizer splits
    it at the bucket boundaries so the all-reduce still overlaps the backward). ``blocks`` scope:
    each of ``module``'s repeated blocks compiled in place, ``model`` returned as it is."""
    if perf.compile == "none":
        return model
    if perf.compile_scope == "model":
        return cast(nn.Module, torch.compile(model, mode=perf.compile))  # an OptimizedModule: compiling a Module gives a Module
    for block in repeated_blocks(module) or ():
        block.compile(mode=perf.compile)
    return model


def run_eagerly(model: nn.Module) -> Callable[..., Any]:
    """``model``'s forward with everything compiled inside it run eagerly (``force_eager``): the
    bucket probe's model, whose gradient hooks a compiled backward would fire all at its end.
    Under ``blocks`` the compiled blocks are inside ``model``; a forward run eagerly records an
    eager backward too."""

    def forward(*args: Any) -> Any:
        with torch.compiler.set_stance("force_eager"):
            return model(*args)

    return forward


def attention_kernels(backend: str) -> contextlib.AbstractContextManager:
    """``scaled_dot_product_attention`` held to ``backend``'s kernel (``auto``: PyTorch's choice)."""
    if backend == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel(ATTENTION_BACKENDS[backend])


@dataclass
class CompileFacts:
    """What the record says of the run's compilation: its scope, the first step's wall time (the
    cold compile, where the run compiles), and the cache artifacts loaded and saved."""

    scope: str | None  # None when nothing is compiled
    first_step_s: float | None = None
    cache_file: str | None = None
    cache_loaded: dict[str, int] | None = None  # artifact kind -> how many, from --compile-cache
    cache_saved_bytes: int | None = None
    cache_reason: str | None = None  # why nothing was loaded or saved, where a cache was asked for


def _artifact_counts(info: Any) -> dict[str, int]:
    """CacheInfo's artifacts by kind (``inductor``, ``autotune``, ``aot_autograd``, ...) -> count."""
    return {str(kind): len(keys) for kind, keys in sorted(info.artifacts.items(), key=lambda item: str(item[0])) if keys}


def set_up(perf: PerfConfig, model: nn.Module, model_name: str, device_type: str, log: Any) -> CompileFacts:
    """Check the compile scope and attention kernel against the model and device, and load the
    compile cache (before anything compiles: the first compile is what it spares). The facts
    returned are the record's ``measurements.compile``."""
    check(perf, model, model_name, device_type)
    facts = CompileFacts(scope=perf.compile_scope if perf.compile != "none" else None, cache_file=perf.compile_cache)
    if perf.compile_cache and facts.scope is None:
        facts.cache_reason = "nothing to cache: --compile none"
    elif perf.compile_cache:
        load_cache(facts)
        if facts.cache_reason is not None:
            log(f"compile cache: {facts.cache_reason}")
    return facts


def forward_context(device: torch.device, autocast_dtype: torch.dtype | None, attention_backend: str) -> contextlib.AbstractContextManager:
    """A forward's precision (autocast to ``autocast_dtype``, none where it is None) and its
    attention kernel (--attention-backend)."""
    stack = contextlib.ExitStack()
    if autocast_dtype is not None:
        stack.enter_context(torch.autocast(device.type, dtype=autocast_dtype))
    stack.enter_context(attention_kernels(attention_backend))
    return stack


def load_cache(facts: CompileFacts) -> None:
    """Load ``facts.cache_file``'s artifacts into this process's compile caches, before anything
    compiles. An absent file is a cold start (the run writes it); a file this user's runs did not
    sign (``cache_trust.verified_payload``) or torch cannot read is named in the record and the
    log, and the run compiles cold: a cache never decides a figure, only its cost."""
    path = Path(facts.cache_file or "")
    if not path.is_file():
        facts.cache_reason = "no cache file yet: compiled cold"
        return
    try:
        payload = cache_trust.verified_payload(path)
    except cache_trust.CacheRefused as refusal:
        facts.cache_reason = f"{path} could not be loaded ({refusal}): compiled cold"
        return
    # torch logs a file it cannot unpickle as a warning with its traceback, and loads nothing: the
    # record and the run's log say it in one line instead
    torch_cache_log = logging.getLogger("torch.compiler._cache")
    level = torch_cache_log.level
    torch_cache_log.setLevel(logging.ERROR)
    try:
        info = torch.compiler.load_cache_artifacts(payload)
    except Exception as error:  # torch's own kinds, for a file it reads but cannot use
        info, why = None, f"{type(error).__name__}: {error}"
    else:
        why = "not a cache file of this torch"
    finally:
        torch_cache_log.setLevel(level)
    if info is None:
        facts.cache_reason = f"{path} could not be loaded ({why}): compiled cold"
        return
    facts.cache_loaded = _artifact_counts(info)


def save_cache(facts: CompileFacts) -> None:
    """Write every artifact this process compiled or loaded to ``facts.cache_file``, signed with
    this user's key, whole or not at all, where a cache was asked for and the run compiled. Rank 0
    alone calls it."""
    if facts.cache_file is None or facts.scope is None:
        return
    path = Path(facts.cache_file)
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        facts.cache_reason = "nothing compiled to save"
        return
    try:
        facts.cache_saved_bytes = cache_trust.write_signed(path, saved[0])
    except cache_trust.CacheRefused as refusal:
        facts.cache_reason = f"the cache was not written to {path}: this user's compile-cache key cannot be used ({refusal})"
    except OSError as error:
        facts.cache_reason = f"the cache could not be written to {path} ({describe_os_error(error)})"


def seconds_to_device_end(started: float, device: torch.device) -> float:
    """Wall seconds from ``started`` (``time.perf_counter``) to the device's end of the work issued
    since: the first step's, with its compile (a warm-up step: the synchronisation costs no
    measured time)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
