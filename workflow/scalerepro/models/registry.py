"""The registry of benchmark models: each name's architecture and standard shape, resolved from
command-line overrides into a ModelSpec.

``resolve(name, shape)`` fills the user's overrides in with the model's standard shape, checks
them, and measures the model on the ``meta`` device (shapes only, no weights allocated): its
parameter count and its training FLOPs per sample (``flops``). ``build(spec)`` makes the real
module. A ResNet's padded stem (``--stem-channels`` 4 or 8) is measured as the plain model: its
zero channels are no work of the model's (``resolve``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from scalerepro.models import cnn, flops, llama, transformer, vision

Task = Literal["image_classification", "masked_lm", "causal_lm"]
Family = Literal["cnn", "transformer"]


@dataclass(frozen=True)
class ModelShape:
    """User overrides from CLI flags; None = the model's standard value."""

    image_size: int | None = None
    num_classes: int | None = None
    seq_len: int | None = None
    vocab_size: int | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None  # Llama: key/value heads of grouped-query attention
    dropout: float = 0.0
    stem_channels: int = 3  # ResNets: input channels of the first convolution (the image padded with zero channels)


@dataclass(frozen=True)
class ModelSpec:
    """Fully resolved description of one model."""

    name: str
    task: Task
    family: Family  # the trainer picks SGD for cnn, AdamW for transformer
    image_size: int | None  # images: H = W
    num_classes: int | None  # images
    seq_len: int | None  # LMs
    vocab_size: int | None  # LMs: the number of real token ids the data may use
    num_masked: int | None  # masked_lm: masked positions per sequence, ceil(0.15 * seq_len)
    mask_token_id: int | None  # masked_lm: id of [MASK]
    num_parameters: int  # a padded ResNet stem's zero weights not counted (resolve)
    tokens_per_sample: int  # seq_len for LMs, 0 for image models
    train_flops_per_sample: float  # forward + backward FLOPs for one sample (one sequence for LMs)
    flops_source: str  # one line: how train_flops_per_sample was derived
    shape: ModelShape  # the resolved values; None only where a field does not apply


@dataclass(frozen=True)
class _Architecture:
    task: Task
    family: Family
    standard_shape: ModelShape  # fields left None do not apply to the model
    takes_dropout: bool
    make: Callable[[ModelShape], nn.Module]  # from a resolved shape
    check: Callable[[ModelShape], None]  # model-specific constraints; raises a one-line ValueError
    stem_channels: tuple[int, ...] = (vision.IMAGE_CHANNELS,)  # the --stem-channels it takes: 3 (the image's) but for the ResNets


def required(size: int | None) -> int:
    """A size of the resolved shape that the model takes: its standard shape sets every size the
    model takes, so ``resolve`` leaves None only in the others, which the model never reads."""
    assert size is not None, "a size the model takes is unset"
    return size


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _check_nothing(shape: ModelShape) -> None:
    pass


def _check_small_cnn(shape: ModelShape) -> None:
    if required(shape.image_size) < 4:
        raise ValueError(f"--image-size must be at least 4 for cnn (two 2x2 max-pools), got {shape.image_size}")


def _check_heads(shape: ModelShape) -> None:
    if required(shape.hidden_size) % required(shape.num_heads) != 0:
        raise ValueError(f"--hidden-size ({shape.hidden_size}) must be divisible by --num-heads ({shape.num_heads})")


def _check_vit(shape: ModelShape) -> None:
    if required(shape.image_size) % vision.VIT_PATCH_SIZE != 0:
        raise ValueError(f"--image-size must be a multiple of the patch size {vision.VIT_PATCH_SIZE} for vit_b_16, got {shape.image_size}")
    _check_heads(shape)


def _check_bert(shape: ModelShape) -> None:
    if required(shape.seq_len) > transformer.BERT_MAX_POSITIONS:
        raise ValueError(f"--seq-len must be at most {transformer.BERT_MAX_POSITIONS} for bert_base (its learned position table), got {shape.seq_len}")
    _check_heads(shape)


def _check_llama(shape: ModelShape) -> None:
    _check_heads(shape)
    if required(shape.num_heads) % required(shape.num_kv_heads) != 0:
        raise ValueError(f"--num-heads ({shape.num_heads}) must be a multiple of --num-kv-heads ({shape.num_kv_heads}); pass --num-kv-heads with --num-heads")
    if (required(shape.hidden_size) // required(shape.num_heads)) % 2 != 0:
        raise ValueError(f"--hidden-size / --num-heads ({shape.hidden_size} / {shape.num_heads}) must be even (rotary embeddings rotate pairs of dimensions)")


def _make_vit(shape: ModelShape) -> nn.Module:
    return vision.vit_b_16(
        image_size=required(shape.image_size),
        num_classes=required(shape.num_classes),
        num_layers=required(shape.num_layers),
        hidden_size=required(shape.hidden_size),
        num_heads=required(shape.num_heads),
        dropout=shape.dropout,
    )


def _make_bert(shape: ModelShape) -> transformer.BertForMaskedLM:
    config = transformer.bert_config(
        num_layers=required(shape.num_layers),
        hidden_size=required(shape.hidden_size),
        num_heads=required(shape.num_heads),
        vocab_size=required(shape.vocab_size),
        dropout=shape.dropout,
    )
    return transformer.BertForMaskedLM(config)


def _make_gpt2(shape: ModelShape) -> transformer.GPT:
    config = transformer.gpt2_config(
        num_layers=required(shape.num_layers),
        hidden_size=required(shape.hidden_size),
        num_heads=required(shape.num_heads),
        vocab_size=required(shape.vocab_size),
        seq_len=required(shape.seq_len),
        dropout=shape.dropout,
    )
    return transformer.GPT(config)


def _gpt2(num_layers: int, hidden_size: int, num_heads: int) -> _Architecture:
    """GPT-2 at one of its published sizes (Radford et al. 2019, Table 2): context 1024, vocab
    50257 (padded to 50304), d_head 64 throughout."""
    return _Architecture(
        task="causal_lm",
        family="transformer",
        standard_shape=ModelShape(seq_len=1024, vocab_size=50257, num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads),
        takes_dropout=True,
        make=_make_gpt2,
        check=_check_heads,
    )


def _llama(
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    ffn_dim_multiplier: float,
    multiple_of: int,
    tie_embeddings: bool,
) -> _Architecture:
    """A Llama 3 shape. Default sequence length 8192: Llama 3's pre-training context and the
    sequence length of torchtitan's Llama 3 8B reference throughput figures. The SwiGLU width
    follows the full shape's (multiplier, multiple_of) rule at any --hidden-size, as torchtitan
    computes it (so a dim-64 llama3_8b gets 1024, its multiple_of; llama_1b 256)."""

    def make(shape: ModelShape) -> llama.Llama:
        return llama.Llama(
            llama.llama_config(
                dim=required(shape.hidden_size),
                n_layers=required(shape.num_layers),
                n_heads=required(shape.num_heads),
                n_kv_heads=required(shape.num_kv_heads),
                vocab_size=required(shape.vocab_size),
                seq_len=required(shape.seq_len),
                ffn_dim_multiplier=ffn_dim_multiplier,
                multiple_of=multiple_of,
                tie_embeddings=tie_embeddings,
            )
        )

    return _Architecture(
        task="causal_lm",
        family="transformer",
        standard_shape=ModelShape(
            seq_len=8192,
            vocab_size=128256,
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
        ),
        takes_dropout=False,  # Llama 3 trains without dropout
        make=make,
        check=_check_llama,
    )


_ARCHITECTURES: dict[str, _Architecture] = {
    "cnn": _Architecture(
        task="image_classification",
        family="cnn",
        standard_shape=ModelShape(image_size=32, num_classes=10),
        takes_dropout=False,
        make=lambda shape: cnn.SmallCNN(required(shape.num_classes)),
        check=_check_small_cnn,
    ),
    "resnet18_cifar": _Architecture(
        task="image_classification",
        family="cnn",
        standard_shape=ModelShape(image_size=32, num_classes=10),
        takes_dropout=False,
        make=lambda shape: vision.resnet18_cifar(required(shape.num_classes), shape.stem_channels),
        check=_check_nothing,
        stem_channels=vision.STEM_CHANNELS,
    ),
    "resnet50": _Architecture(
        task="image_classification",
        family="cnn",
        standard_shape=ModelShape(image_size=224, num_classes=1000),
        takes_dropout=False,
        make=lambda shape: vision.resnet50(required(shape.num_classes), shape.stem_channels),
        check=_check_nothing,
        stem_channels=vision.STEM_CHANNELS,
    ),
    # A transformer on images: trained with AdamW, like the LMs.
    "vit_b_16": _Architecture(
        task="image_classification",
        family="transformer",
        standard_shape=ModelShape(image_size=224, num_classes=1000, num_layers=12, hidden_size=768, num_heads=12),
        takes_dropout=True,
        make=_make_vit,
        check=_check_vit,
    ),
    "bert_base": _Architecture(
        task="masked_lm",
        family="transformer",
        standard_shape=ModelShape(seq_len=128, vocab_size=30522, num_layers=12, hidden_size=768, num_heads=12),
        takes_dropout=True,
        make=_make_bert,
        check=_check_bert,
    ),
    # GPT-2 124M / 355M / 774M / 1558M (parameters with the tied embedding counted once).
    "gpt2_small": _gpt2(num_layers=12, hidden_size=768, num_heads=12),
    "gpt2_medium": _gpt2(num_layers=24, hidden_size=1024, num_heads=16),
    "gpt2_large": _gpt2(num_layers=36, hidden_size=1280, num_heads=20),
    "gpt2_xl": _gpt2(num_layers=48, hidden_size=1600, num_heads=25),
    # Llama 3.2 1B (1.24B; ties its output to the embedding as the release does) and Llama 3 8B
    # (8.03B, untied), shapes from Meta's params.json as torchtitan's llama3 flavors copy them.
    "llama_1b": _llama(
        num_layers=16,
        hidden_size=2048,
        num_heads=32,
        num_kv_heads=8,
        ffn_dim_multiplier=1.5,
        multiple_of=256,
        tie_embeddings=True,
    ),
    "llama3_8b": _llama(
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
        tie_embeddings=False,
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(_ARCHITECTURES)


def _architecture(name: str) -> _Architecture:
    if name not in _ARCHITECTURES:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")
    return _ARCHITECTURES[name]


# dropout and stem_channels have a value for every model (0.0, 3) and are checked on their own.
_SIZE_FIELDS = tuple(field.name for field in dataclasses.fields(ModelShape) if field.name not in ("dropout", "stem_channels"))


def _check_stem_channels(name: str, architecture: _Architecture, stem_channels: int) -> None:
    if isinstance(stem_channels, int) and stem_channels in architecture.stem_channels:
        return
    padded_models = " and ".join(n for n, a in _ARCHITECTURES.items() if len(a.stem_channels) > 1)
    if len(architecture.stem_channels) > 1:
        raise ValueError(f"--stem-channels must be 3, 4 or 8 for {name} (the image's 3 channels, or padded with zero channels), got {stem_channels!r}")
    raise ValueError(f"--stem-channels does not apply to {name} (got {stem_channels!r}): only {padded_models} take 4 or 8; leave it at 3")


def _resolve_shape(name: str, architecture: _Architecture, overrides: ModelShape) -> ModelShape:
    """Fill overrides in with the standard shape; reject flags that do not apply or are out of range."""
    standard = architecture.standard_shape
    applicable = [field for field in _SIZE_FIELDS if getattr(standard, field) is not None]
    if architecture.takes_dropout:
        applicable.append("dropout")
    if len(architecture.stem_channels) > 1:
        applicable.append("stem_channels")

    def not_applicable(field: str) -> ValueError:
        flags = ", ".join(_flag(field) for field in applicable)
        return ValueError(f"{_flag(field)} does not apply to {name} (it takes {flags})")

    sizes: dict[str, int] = {}
    for field in _SIZE_FIELDS:
        value = getattr(overrides, field)
        if value is None:
            continue
        if field not in applicable:
            raise not_applicable(field)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{_flag(field)} must be a positive integer, got {value!r}")
        sizes[field] = value
    if overrides.dropout != 0.0 and not architecture.takes_dropout:
        raise not_applicable("dropout")
    if not 0.0 <= overrides.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {overrides.dropout!r}")
    _check_stem_channels(name, architecture, overrides.stem_channels)
    return dataclasses.replace(standard, **sizes, dropout=overrides.dropout, stem_channels=overrides.stem_channels)


def resolve(name: str, shape: ModelShape = ModelShape()) -> ModelSpec:
    """The model ``name`` at ``shape``'s overrides; raises a one-line ValueError naming the bad flag."""
    architecture = _architecture(name)
    resolved = _resolve_shape(name, architecture, shape)
    architecture.check(resolved)
    # A padded stem is measured as the plain model: its zero channels multiply zeros and their
    # weights stay zero (vision._pad_stem), so they add no useful work, and MFU counts the
    # model's useful work. The FLOPs and the parameter count are then the plain model's at every
    # --stem-channels, comparable across an A/B of the stem (the built model holds
    # 64 x k x k x (stem_channels - 3) more weights, all zero: 576 in resnet18_cifar's 3x3 stem
    # at 4 channels, 3136 in resnet50's 7x7).
    measured = dataclasses.replace(resolved, stem_channels=vision.IMAGE_CHANNELS)
    with torch.device("meta"):
        meta_model = architecture.make(measured)
    num_parameters = sum(p.numel() for p in meta_model.parameters())  # tied weights count once

    num_masked = mask_token_id = None
    if architecture.task == "masked_lm":
        num_masked = transformer.bert_num_masked(required(resolved.seq_len))
        mask_token_id = transformer.bert_mask_token_id(required(resolved.vocab_size))
    train_flops, flops_source = flops.train_flops_per_sample(meta_model, resolved.image_size, resolved.seq_len, num_masked)
    if resolved.stem_channels != vision.IMAGE_CHANNELS:
        flops_source += f"; counted with the plain 3-channel stem: the {resolved.stem_channels}-channel stem's zero channels are no work"

    return ModelSpec(
        name=name,
        task=architecture.task,
        family=architecture.family,
        image_size=resolved.image_size,
        num_classes=resolved.num_classes,
        seq_len=resolved.seq_len,
        vocab_size=resolved.vocab_size,
        num_masked=num_masked,
        mask_token_id=mask_token_id,
        num_parameters=num_parameters,
        tokens_per_sample=resolved.seq_len if resolved.seq_len is not None else 0,
        train_flops_per_sample=train_flops,
        flops_source=flops_source,
        shape=resolved,
    )


def build(spec: ModelSpec) -> nn.Module:
    """The model of ``spec`` with fresh weights, on the current default device; seed torch first."""
    return _architecture(spec.name).make(spec.shape)
