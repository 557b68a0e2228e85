"""A model's transformer blocks: the unit that FSDP shards, TP splits and checkpointing wraps."""

from __future__ import annotations

from torch import nn

from scalerepro.parallel.mesh import ParallelError

# ---- the model's blocks -----------------------------------------------------------------------


def transformer_blocks(model: nn.Module) -> nn.Module:
    """The container of the model's repeated blocks: ``blocks`` (GPT, BERT) or ``layers``
    (torchtitan-style decoders)."""
    for name in ("blocks", "layers"):
        container = getattr(model, name, None)
        if isinstance(container, (nn.ModuleList, nn.ModuleDict)):
            return container
    raise ParallelError(
        f"{type(model).__name__} has no transformer blocks (.blocks or .layers): --parallel fsdp/tp/pp apply to the "
        "transformer models; use --parallel ddp for the others"
    )


def _block_items(container: nn.Module) -> list[tuple[str, nn.Module]]:
    return list(container.named_children())
