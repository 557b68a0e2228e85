"""Activation checkpointing of a model's transformer blocks: `full` recomputes every block in
backward (checkpoint_wrapper, non-reentrant); `selective` every other block (torchtitan's
layer-selective mode): about half the activation memory saved for about half the recomputation.
"""

from __future__ import annotations

from torch import nn

from scalerepro.parallel.blocks import _block_items, transformer_blocks

# torchtitan's layer-selective activation checkpointing: recompute every N-th block.
SELECTIVE_EVERY = 2


# ---- activation checkpointing -----------------------------------------------------------------


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Wrap blocks in ``checkpoint_wrapper`` (non-reentrant): all of them (``full``) or every
    ``SELECTIVE_EVERY``-th (``selective``). Returns how many blocks were wrapped. The wrapper's
    state-dict hooks strip its prefix, so checkpoints keep the model's parameter names."""
    if mode == "none":
        return 0
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    container = transformer_blocks(model)
    wrapped = 0
    for index, (name, block) in enumerate(_block_items(container)):
        if mode == "full" or index % SELECTIVE_EVERY == 0:
            container.register_module(name, checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
            wrapped += 1
    return wrapped
