"""Tests of the model zoo: shapes, parameter counts, FLOPs formulas, causality, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scalerepro.models.registry import MODEL_NAMES, ModelShape, ModelSpec, build, resolve

SMALL_IMAGE = ModelShape(image_size=32)
SMALL_VIT = ModelShape(image_size=32, num_classes=10, num_layers=2, hidden_size=64, num_heads=2)
SMALL_LM = ModelShape(seq_len=16, vocab_size=64, num_layers=2, hidden_size=64, num_heads=2)
SMALL_LLAMA = ModelShape(seq_len=16, vocab_size=64, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2)
SMALL_SHAPES = {
    "cnn": SMALL_IMAGE,
    "resnet18_cifar": SMALL_IMAGE,
    "resnet50": ModelShape(image_size=32, num_classes=10),
    "vit_b_16": SMALL_VIT,
    "bert_base": SMALL_LM,
    "gpt2_small": SMALL_LM,
    "gpt2_medium": SMALL_LM,
    "gpt2_large": SMALL_LM,
    "gpt2_xl": SMALL_LM,
    "llama_1b": SMALL_LLAMA,
    "llama3_8b": SMALL_LLAMA,
}
BATCH = 2


def make_inputs(spec: ModelSpec, batch: int = BATCH) -> tuple[torch.Tensor, ...]:
    """The trainer's inputs for ``spec`` on the current default device."""
    if spec.task == "image_classification":
        return (torch.randn(batch, 3, spec.image_size, spec.image_size),)
    tokens = torch.randint(spec.vocab_size, (batch, spec.seq_len))
    if spec.task == "causal_lm":
        return (tokens,)
    # Distinct random positions per sequence, as BERT's masking picks them.
    masked_positions = torch.rand(batch, spec.seq_len).argsort(dim=1)[:, : spec.num_masked]
    return tokens, masked_positions


def expected_logits_shape(spec: ModelSpec, model: torch.nn.Module, batch: int = BATCH) -> tuple[int, ...]:
    if spec.task == "image_classification":
        return (batch, spec.num_classes)
    padded_vocab = model.config.vocab_size
    assert padded_vocab % 64 == 0 and spec.vocab_size <= padded_vocab < spec.vocab_size + 64
    if spec.task == "causal_lm":
        return (batch, spec.seq_len, padded_vocab)
    return (batch, spec.num_masked, padded_vocab)


def counted_train_flops(spec: ModelSpec, batch: int = BATCH) -> float:
    """FlopCounterMode over one forward + backward on the meta device, per sample."""
    with torch.device("meta"):
        model = build(spec)
        inputs = make_inputs(spec, batch)
        with FlopCounterMode(display=False) as counter:
            model(*inputs).sum().backward()
    return counter.get_total_flops() / batch


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_backward_on_small_shapes(name: str) -> None:
    torch.manual_seed(0)
    spec = resolve(name, SMALL_SHAPES[name])
    model = build(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_parameters
    logits = model(*make_inputs(spec))
    assert logits.shape == expected_logits_shape(spec, model)
    targets = torch.randint(logits.size(-1), logits.shape[:-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), targets.flatten()).backward()
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None, parameter_name
        assert torch.isfinite(parameter.grad).all(), parameter_name


@pytest.mark.parametrize("name", ["bert_base", "gpt2_small", "gpt2_xl"])
@pytest.mark.parametrize(
    "shape",
    [
        SMALL_LM,
        ModelShape(seq_len=64, vocab_size=1000, num_layers=3, hidden_size=96, num_heads=4),
        ModelShape(),  # full size: free on the meta device
    ],
    ids=["small", "medium", "full"],
)
def test_transformer_flops_formula_matches_flop_counter(name: str, shape: ModelShape) -> None:
    spec = resolve(name, shape)
    # Exact, not merely within a few percent: the closed forms count precisely the matmuls
    # autograd runs (SDPA on meta runs its math path, whose bmms FlopCounterMode counts in full).
    assert spec.train_flops_per_sample == counted_train_flops(spec)


@pytest.mark.parametrize("name", ["bert_base", "gpt2_small"])
def test_transformer_compiles_without_graph_breaks(name: str) -> None:
    torch.manual_seed(0)
    spec = resolve(name, dataclasses.replace(SMALL_LM, dropout=0.1))
    compiled = torch.compile(build(spec), backend="eager", fullgraph=True)  # fullgraph: a break raises
    compiled(*make_inputs(spec)).sum().backward()


def test_image_flops_match_published_forward_counts() -> None:
    # torchvision publishes forward multiply-adds ("GFLOPS"): ResNet-50 4.09 G, ViT-B/16 17.56 G.
    # Training is ~3 x 2 FLOPs per multiply-add, less the first layer's input gradient.
    assert resolve("resnet50").train_flops_per_sample == pytest.approx(6 * 4.09e9, rel=0.02)
    assert resolve("vit_b_16").train_flops_per_sample == pytest.approx(6 * 17.56e9, rel=0.02)


@pytest.mark.parametrize(
    ("name", "expected", "rel"),
    [
        ("resnet50", 25.557e6, 0.001),
        ("vit_b_16", 86.568e6, 0.001),
        # Embeddings (vocab padded to 30528), 12 blocks, MLM head (decoder tied to the word
        # embedding, own bias); no pooler or next-sentence head: 109.5M vs BERT's quoted 110M.
        ("bert_base", 110e6, 0.03),
        # nanoGPT's 124M with the vocab padded 50257 -> 50304 and position embeddings counted;
        # the other sizes likewise: GPT-2's 355M / 774M / 1558M (Hugging Face's counts at vocab
        # 50257) plus 47 padded rows of the tied table.
        ("gpt2_small", 124.476e6, 0.001),
        ("gpt2_medium", 354_823_168 + 47 * 1024, 0),
        ("gpt2_large", 774_030_080 + 47 * 1280, 0),
        ("gpt2_xl", 1_557_611_200 + 47 * 1600, 0),
        # Meta's published counts: Llama 3.2 1B 1,235,814,400 (tied embedding counted once),
        # Llama 3 8B 8,030,261,248 (untied). 128256 needs no padding.
        ("llama_1b", 1_235_814_400, 0),
        ("llama3_8b", 8_030_261_248, 0),
    ],
)
def test_full_size_parameter_counts(name: str, expected: float, rel: float) -> None:
    assert resolve(name).num_parameters == pytest.approx(expected, rel=rel)


def test_resnet18_cifar_stem() -> None:
    with torch.device("meta"):
        model = build(resolve("resnet18_cifar"))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1) and model.conv1.bias is None
    assert isinstance(model.maxpool, torch.nn.Identity)


def test_resolved_specs() -> None:
    bert = resolve("bert_base")
    assert (bert.seq_len, bert.num_masked, bert.mask_token_id, bert.tokens_per_sample) == (128, 20, 103, 128)
    assert resolve("bert_base", SMALL_LM).mask_token_id == 0  # no id 103 in a 64-token vocabulary
    assert resolve("bert_base", ModelShape(seq_len=20)).num_masked == 3  # exactly 0.15 * 20
    assert [resolve(name).family for name in MODEL_NAMES] == ["cnn"] * 3 + ["transformer"] * 8
    llama_8b = resolve("llama3_8b")
    assert (llama_8b.task, llama_8b.seq_len, llama_8b.tokens_per_sample, llama_8b.shape.num_kv_heads) == ("causal_lm", 8192, 8192, 8)
    assert resolve("gpt2_xl").shape.num_kv_heads is None
    resnet = resolve("resnet50", ModelShape(image_size=32))
    assert resnet.shape.image_size == 32 and resnet.tokens_per_sample == 0 and resnet.shape.seq_len is None
    assert resolve("vit_b_16", ModelShape(dropout=0.1)).shape.dropout == 0.1


def test_gpt2_is_causal() -> None:
    torch.manual_seed(0)
    spec = resolve("gpt2_small", SMALL_LM)
    model = build(spec).eval()
    tokens = torch.randint(spec.vocab_size, (1, spec.seq_len))
    changed = tokens.clone()
    t = 7
    changed[0, t + 1] = (tokens[0, t + 1] + 1) % spec.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1])
    assert not torch.allclose(before[:, t + 1], after[:, t + 1])


def test_bert_head_runs_at_the_masked_positions() -> None:
    torch.manual_seed(0)
    spec = resolve("bert_base", SMALL_LM)
    model = build(spec).eval()
    tokens, masked_positions = make_inputs(spec)
    with torch.no_grad():
        every_position = model(tokens, torch.arange(spec.seq_len).expand(BATCH, -1))
        masked = model(tokens, masked_positions)
    expected = every_position.gather(1, masked_positions.unsqueeze(-1).expand(-1, -1, masked.size(-1)))
    torch.testing.assert_close(masked, expected)


def test_unknown_model() -> None:
    expected = r"^unknown model 'resnet9': choose one of cnn, resnet18_cifar, resnet50, vit_b_16, "
    with pytest.raises(ValueError, match=expected) as error:
        resolve("resnet9")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("name", "shape", "flag"),
    [
        ("gpt2_small", ModelShape(hidden_size=100, num_heads=3), "--hidden-size"),
        ("vit_b_16", ModelShape(image_size=30), "--image-size"),
        ("bert_base", ModelShape(seq_len=1024), "--seq-len"),
        ("resnet50", ModelShape(seq_len=128), "--seq-len"),
        ("cnn", ModelShape(dropout=0.1), "--dropout"),
        ("cnn", ModelShape(image_size=0), "--image-size"),
        ("gpt2_small", ModelShape(dropout=1.0), "--dropout"),
        ("gpt2_small", ModelShape(num_kv_heads=4), "--num-kv-heads"),
        ("llama_1b", ModelShape(num_heads=12, hidden_size=768), "--num-heads"),  # 12 heads, 8 kv heads
        ("llama_1b", ModelShape(hidden_size=96, num_heads=32), "--hidden-size"),  # head dim 3 is odd
        ("llama3_8b", ModelShape(dropout=0.1), "--dropout"),
    ],
)
def test_bad_shape(name: str, shape: ModelShape, flag: str) -> None:
    with pytest.raises(ValueError, match=f"^{flag} ") as error:
        resolve(name, shape)
    assert "\n" not in str(error.value)


def test_the_presets_conv_nets_are_the_cnn_family() -> None:
    """scalerepro.trainer_flags (torch-free) names the conv nets for the optimised preset's
    channels_last and cudnn.benchmark; they must be exactly the models of the cnn family."""
    from scalerepro.trainer_flags import CONV_NETS

    assert {name for name in MODEL_NAMES if resolve(name).family == "cnn"} == CONV_NETS
