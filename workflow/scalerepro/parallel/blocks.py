"""A model's transformer blocks: the unit that FSDP shards, TP splits and checkpointing wraps."""

from __future__ import annotations

from typing import TypeAlias

from torch import nn

from scalerepro.parallel.mesh import ParallelError

BlockContainer: TypeAlias = "nn.ModuleList | nn.ModuleDict | nn.Sequential"

# ---- the model's blocks -----------------------------------------------------------------------


def _block_container(model: nn.Module, paths: tuple[str, ...]) -> BlockContainer | None:
    """The first of ``paths`` (attribute paths, dotted) that holds a container of modules."""
    for path in paths:
        container: object = model
        for name in path.split("."):
            container = getattr(container, name, None)
        if isinstance(container, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            return container
    return None


def repeated_blocks(model: nn.Module) -> list[nn.Module] | None:
    """The model's repeated blocks in order, for compiling them one at a time: those of
    ``transformer_blocks``, and torchvision's ViT ``encoder.layers``, which the parallel forms do
    not take (their plans are written for GPT, BERT and Llama); None for a model without them."""
    container = _block_container(model, ("blocks", "layers", "encoder.layers"))
    return list(container.children()) if container is not None and len(container) > 0 else None


def transformer_blocks(model: nn.Module) -> BlockContainer:
    """The container of the model's repeated blocks: ``blocks`` (GPT, BERT) or ``layers``
    (torchtitan-style decoders)."""
    container = _block_container(model, ("blocks", "layers"))
    if container is not None:
        return container
    raise ParallelError(
        f"{type(model).__name__} has no transformer blocks (.blocks or .layers): --parallel fsdp/tp/pp apply to the "
        "transformer models; use --parallel ddp for the others"
    )


def _block_items(container: nn.Module) -> list[tuple[str, nn.Module]]:
    return list(container.named_children())
