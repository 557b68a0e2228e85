"""How the rank compiles: the whole model or each repeated block, the attention kernel it is held
to, and the portable compile cache carried from one process (one machine) to the next."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from scalerepro.models import registry
from scalerepro.parallel.blocks import repeated_blocks
from scalerepro.trainer_flags import PerfConfig, TrainerConfigError
from scalerepro.training import compilation

from conftest import clean_env, load_record, python_train

TINY = {"num_layers": 3, "hidden_size": 32, "num_heads": 2, "seq_len": 16, "vocab_size": 64}
TINY_SHAPES = {
    "gpt2_small": registry.ModelShape(**TINY),
    "bert_base": registry.ModelShape(**TINY),
    "llama_1b": registry.ModelShape(**TINY, num_kv_heads=1),
    "vit_b_16": registry.ModelShape(image_size=32, num_classes=10, num_layers=3, hidden_size=32, num_heads=2),
}


def _tiny(name: str) -> torch.nn.Module:
    return registry.build(registry.resolve(name, TINY_SHAPES.get(name, registry.ModelShape())))


@pytest.mark.parametrize("name", list(TINY_SHAPES))
def test_each_transformer_gives_its_repeated_blocks_and_a_cnn_none(name):
    blocks = repeated_blocks(_tiny(name))
    assert blocks is not None and len(blocks) == 3 and len({type(block) for block in blocks}) == 1
    assert repeated_blocks(_tiny("resnet18_cifar")) is None


@pytest.mark.parametrize(
    ("model", "perf", "device", "message"),
    [
        ("resnet18_cifar", {"compile": "default", "compile_scope": "blocks"}, "cpu", "resnet18_cifar has none: use --compile-scope model"),
        ("resnet18_cifar", {"attention_backend": "flash"}, "cpu", "resnet18_cifar has no attention"),
        ("gpt2_small", {"attention_backend": "cudnn"}, "cpu", "--attention-backend cudnn is a CUDA kernel: on the CPU use flash or math"),
        ("gpt2_small", {"attention_backend": "efficient"}, "cpu", "is a CUDA kernel"),
    ],
)
def test_a_scope_or_kernel_the_model_or_device_cannot_take_is_one_line(model, perf, device, message):
    with pytest.raises(TrainerConfigError, match=message) as refused:
        compilation.check(dataclasses.replace(PerfConfig(), **perf), _tiny(model), model, device)
    assert "\n" not in str(refused.value)
    for fine in ({"compile": "default", "compile_scope": "blocks"}, {"attention_backend": "math"}, {"compile": "none", "compile_scope": "blocks"}):
        compilation.check(dataclasses.replace(PerfConfig(), **fine), _tiny("gpt2_small"), "gpt2_small", "cpu")


def _attention_ops(backend: str) -> set[str]:
    model = _tiny("gpt2_small")
    tokens = torch.randint(0, 64, (2, 16))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile, compilation.attention_kernels(backend):
        model(tokens)
    return {event.key for event in profile.key_averages() if "scaled_dot_product" in event.key}


def test_the_attention_backend_holds_the_forward_to_its_kernel():
    """What the flag sets, read from the operators the forward ran (the CPU has flash and math)."""
    flash, math = _attention_ops("flash"), _attention_ops("math")
    assert any("flash_attention" in op for op in flash) and not any("math" in op for op in flash), flash
    assert any("math" in op for op in math) and not any("flash" in op for op in math), math


def test_blocks_scope_compiles_each_block_in_place_and_leaves_the_rest_eager():
    module = _tiny("gpt2_small")
    wrapper = torch.nn.Sequential(module)  # stands where ModelWithLoss (and DDP) wrap the network
    returned = compilation.compile_model(wrapper, module, dataclasses.replace(PerfConfig(), compile="default", compile_scope="blocks"))
    assert returned is wrapper  # not an OptimizedModule: the embeddings, head and loss stay eager
    assert all(block._compiled_call_impl is not None for block in repeated_blocks(module))
    assert module._compiled_call_impl is None
    whole = compilation.compile_model(wrapper, module, dataclasses.replace(PerfConfig(), compile="default"))
    assert isinstance(whole, torch._dynamo.eval_frame.OptimizedModule)


GPT = ["--model", "gpt2_small", "--num-layers", "4", "--hidden-size", "64", "--num-heads", "4", "--seq-len", "32", "--vocab-size", "128"]


def _compiled_run(tmp_path: Path, name: str, cache: Path) -> dict:
    """A 4-block GPT compiled per block, in a process with a compile cache folder of its own (as a
    fresh machine has): what it loads comes from ``cache`` alone."""
    args = [*GPT, "--device", "cpu", "--per-gpu-batch", "4", "--steps", "3", "--warmup-steps", "1", "--synthetic-samples", "64", "--no-eval"]
    args += ["--comm-probe-steps", "0", "--bucket-probe-steps", "2", "--compile", "default", "--compile-scope", "blocks", "--compile-cache", str(cache)]
    done = python_train(
        [*args, "--record", str(tmp_path / f"{name}.json")],
        env=clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{name}"), XDG_CONFIG_HOME=str(tmp_path / "config")),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return load_record(tmp_path / f"{name}.json")


@pytest.mark.slow
def test_one_block_program_serves_every_block_and_the_cache_carries_it_to_a_fresh_process(tmp_path):
    """Regional compilation compiles one block (a forward and a backward program for four blocks),
    and a second process with an empty compile folder loads them from the cache file."""
    cache = tmp_path / "carried" / "compile-cache.bin"
    cold = _compiled_run(tmp_path, "cold", cache)["measurements"]["compile"]
    assert cold["scope"] == "blocks" and cold["cache_loaded"] is None and cold["cache_reason"] == "no cache file yet: compiled cold"
    assert cold["first_step_s"] > 0 and cold["cache_saved_bytes"] == cache.stat().st_size > 0
    warm = _compiled_run(tmp_path, "warm", cache)["measurements"]["compile"]
    # one block's forward and backward graphs (torch 2.13 on a CPU): per-block compiles would be eight
    assert warm["cache_loaded"] is not None and warm["cache_loaded"].get("inductor") == 2, warm
    assert warm["cache_reason"] is None


def test_a_cache_file_no_run_of_this_user_signed_is_named_in_one_line_and_the_run_compiles_cold(tmp_path, monkeypatch):
    """A truncated or foreign file (tests/test_compile_cache_trust.py has the planted ones)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cache = tmp_path / "compile-cache.bin"
    cache.write_bytes(b"not a cache")
    cache.chmod(0o644)  # its owner's alone, whatever the umask: what refuses it is its missing signature
    facts = compilation.CompileFacts(scope="blocks", cache_file=str(cache))
    compilation.load_cache(facts)
    assert facts.cache_loaded is None and facts.cache_reason is not None and "\n" not in facts.cache_reason
    assert facts.cache_reason.startswith(f"{cache} could not be loaded (it is not signed by a scalerepro run: ") and facts.cache_reason.endswith(
        "): compiled cold"
    )
    absent = compilation.CompileFacts(scope="model", cache_file=str(tmp_path / "none-yet.bin"))
    compilation.load_cache(absent)
    assert absent.cache_loaded is None and absent.cache_reason == "no cache file yet: compiled cold"
