"""Import torchvision even where its compiled operator library cannot load.

Why this exists: the only torchvision wheel that pairs with the CPU build of torch on PyPI
(e.g. torchvision 0.28.0 for torch 2.13.0) is a CUDA build. Its ``_C`` extension fails to load
against a CPU-only torch, and ``import torchvision`` then dies in ``_meta_registrations`` with
``operator torchvision::nms does not exist``, because that module registers fake kernels for
``nms``/``qnms`` unconditionally while every other registration is guarded by ``_has_ops()``.

scalerepro uses torchvision only for model definitions (ResNet, ViT), never for its detection
operators. So when, and only when, the extension cannot be loaded, we define the two operator
*schemas* (no kernels) that torchvision's import needs. Calling ``torchvision.ops.nms`` would still
fail with "no kernel", which is the honest outcome. Where the extension loads (every CUDA system,
the NGC container), this module does nothing.

Everything in scalerepro imports torchvision through :func:`import_torchvision`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

# The schemas as torchvision's csrc/ops/nms.cpp declares them.
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_fallback_library: torch.library.Library | None = None


def _extension_loads() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed: pip install torchvision (or the 'cpu' extra)")
    package_dir = Path(spec.origin).parent
    for candidate in sorted(package_dir.glob("_C*.so")) + sorted(package_dir.glob("_C*.pyd")):
        try:
            torch.ops.load_library(str(candidate))
            return True
        except (OSError, RuntimeError):
            return False
    return False


def import_torchvision() -> ModuleType:
    """Return the ``torchvision`` module, defining missing operator schemas first if needed."""
    global _fallback_library
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    if not _extension_loads() and _fallback_library is None:
        _fallback_library = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            _fallback_library.define(schema)
    import torchvision

    return torchvision
