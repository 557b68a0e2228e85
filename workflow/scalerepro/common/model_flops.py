"""The training FLOPs of each model a published figure or this project's trainer names, without
torch: what holds a published figure to its GPU's peak (``scalerepro.common.share_of_peak``), as
a record's MFU holds a run to it. Standard library only: the references loader imports it.

Training FLOPs count forward and backward matmuls and convolutions, 2 FLOPs a multiply-add, as
the trainer counts them (``scalerepro.models.flops``). An image model's are a sample's, at the
image size its figures are quoted at (the trainer's own count, which a record carries as
``model.train_flops_per_sample``; tests/test_references_schema.py holds each equal to a kept
H100 record's). A language model's are a token's, and a floor: 6 x the parameters of the matmuls
every token runs through (the blocks, and the output head where every position is predicted),
with attention's 12 x layers x width x sequence length left out, so a figure is held to a share
of peak it cannot be below. None of these is an estimate that could refuse a real figure: a
figure refused here needs more FLOP/s than the GPU has.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFlops:
    model: str  # the name a reference (and the trainer) gives the model
    per_sample: float | None  # an image model: training FLOPs of one image at its size
    per_token: float | None  # a language model: the floor of its training FLOPs a token
    basis: str  # how the figure was derived


def _blocks(layers: int, width: int, ffn: int, kv_width: int | None = None, gated: bool = False) -> int:
    """Matmul parameters of a transformer's blocks: Q, K, V, O and the MLP (three matrices where gated)."""
    kv = width if kv_width is None else kv_width
    return layers * (2 * width * width + 2 * width * kv + (3 if gated else 2) * width * ffn)


_RECORD_COUNT = "the trainer's count (FlopCounterMode on the meta device), as its H100 records carry it"
_FLOOR = "6 x the matmul parameters every token runs through; attention's 12 x layers x width x sequence left out"

_TABLE = (
    ModelFlops("resnet18_cifar", 3_328_997_376.0, None, f"32 px: {_RECORD_COUNT}"),
    ModelFlops("resnet50", 24_299_077_632.0, None, f"224 px: {_RECORD_COUNT}"),
    ModelFlops("vit_b_16", 105_151_758_336.0, None, f"224 px: {_RECORD_COUNT}"),
    # NeMo's ViT g/14 (40 layers, width 1408, MLP 6144) at 224 px, 256 patches and the class token;
    # the patch embedding, the head and attention left out: a floor
    ModelFlops("vit_g_14", 6.0 * _blocks(40, 1408, 6144) * 257, None, f"224 px (NeMo's curated configuration), 257 tokens: {_FLOOR}"),
    # BERT predicts the masked positions only: the blocks alone
    ModelFlops("bert_base", None, 6.0 * _blocks(12, 768, 3072), f"12 layers, width 768, MLP 3072, the blocks alone: {_FLOOR}"),
    ModelFlops("bert_large", None, 6.0 * _blocks(24, 1024, 4096), f"24 layers, width 1024, MLP 4096, the blocks alone: {_FLOOR}"),
    ModelFlops("gpt2_small", None, 6.0 * (_blocks(12, 768, 3072) + 50257 * 768), f"12 layers, width 768, the tied head of 50,257: {_FLOOR}"),
    ModelFlops(
        "llama_1b",
        None,
        6.0 * (_blocks(16, 2048, 8192, kv_width=512, gated=True) + 128256 * 2048),
        f"Llama 3.2 1B: 16 layers, width 2048, 8 KV heads of 64, SwiGLU 8192, the tied head of 128,256: {_FLOOR}",
    ),
    ModelFlops(
        "llama3_8b",
        None,
        6.0 * (_blocks(32, 4096, 14336, kv_width=1024, gated=True) + 128256 * 4096),
        f"32 layers, width 4096, 8 KV heads of 128, SwiGLU 14336, the head of 128,256: {_FLOOR}",
    ),
    ModelFlops(
        "mpt_1b", None, 6.0 * (_blocks(24, 2048, 8192) + 50368 * 2048), f"llm-foundry's mpt-1b: 24 layers, width 2048, the tied head of 50,368: {_FLOOR}"
    ),
    ModelFlops("gpt3_175b", None, 6.0 * _blocks(96, 12288, 4 * 12288), f"96 layers, width 12288, the blocks alone: {_FLOOR}"),
)
MODEL_FLOPS: dict[str, ModelFlops] = {entry.model: entry for entry in _TABLE}


def flops_per_gpu_second(model: str, metric: str, value: float, gpus: int, seq_len: int | None) -> float | None:
    """The training FLOP/s a GPU must run for a published figure (``metric``: samples_per_s of the
    whole job, or tokens_per_s_per_gpu); None where the table has no figure of the model, or a
    sequence length the conversion needs is not stated."""
    entry = MODEL_FLOPS.get(model)
    if entry is None:
        return None
    per_sample, per_token = entry.per_sample, entry.per_token
    if per_sample is None and per_token is not None and seq_len:
        per_sample = per_token * seq_len
    elif per_token is None and per_sample is not None and seq_len:
        per_token = per_sample / seq_len
    if metric == "samples_per_s":
        return None if per_sample is None else value / gpus * per_sample
    return None if per_token is None else value * per_token
