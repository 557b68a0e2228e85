"""The torchvision image models: ResNet-18 (CIFAR stem), ResNet-50 and ViT-B/16.

Each returns a module with ``forward(images (B, 3, H, W)) -> logits (B, num_classes)`` and
torchvision's own weight initialization. The ResNets take ``stem_channels`` 4 or 8 as well
(``--stem-channels``): their first convolution then pads the image with zero channels itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scalerepro.models._torchvision import import_torchvision as torchvision

# torchvision is imported by the first model built here, not with this module: its import pulls in
# torch._dynamo (about 1 s a process on the development VM), which a run of the small CNN or of a
# transformer never uses, and every rank of every job of a CPU study would pay it.

VIT_PATCH_SIZE = 16
IMAGE_CHANNELS = 3
# The ResNets' stem widths: 3 is the plain RGB stem. A 3-channel NHWC convolution runs on CUDA
# cores (cuDNN's convolve_common_engine_float_NHWC was ResNet-18's longest kernel on an H100, and
# ResNet-50's stem added an nhwcAddPaddingKernel); 4 or 8 channels let cuDNN's NHWC tensor-core
# kernels take it, as NVIDIA's MLPerf ResNet-50 pads its input to 4 channels.
STEM_CHANNELS = (3, 4, 8)


def pad_image_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """``images`` (B, 3, H, W) with zero channels appended up to ``channels``, in their memory format.

    F.pad keeps a channels_last input channels_last on torch 2.13; the ``contiguous`` is a no-op
    there, and says what the stem needs on a torch whose pad would not: an NCHW copy in front of
    an NHWC convolution would bring back the layout transform the padding is there to avoid.
    """
    channels_last = images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
    padded = F.pad(images, (0, 0, 0, 0, 0, channels - images.size(1)))
    return padded.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


class ZeroPaddedStemConv2d(nn.Conv2d):
    """A ResNet's first convolution with more input channels than the image has: its forward
    pads the image with zero channels, then convolves. A subclass of Conv2d rather than a module
    around one, so that the model's parameter is still ``conv1.weight`` (state dicts and parameter
    names stay torchvision's) and code that looks for convolutions finds it."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(pad_image_channels(images, self.in_channels))


def _pad_stem(model: nn.Module, stem_channels: int) -> nn.Module:
    """``model`` with its conv1 taking ``stem_channels`` inputs: the image's 3 channels and zeros.

    The padded conv holds the plain conv's weights in its first 3 input channels and zeros in
    the rest, and is made without drawing from the RNG (``skip_init``): a padded model built
    from a seed is the plain model of that seed, and the run's later random draws are the plain
    run's too, so an A/B of the stem changes the kernels and nothing else. The zero channels'
    inputs are zeros, so their weights get zero gradients; at zero, weight decay and momentum
    leave them at zero as well (a nonzero start would decay towards zero, a change in weights
    that do nothing), and every DDP rank holds the same zeros.
    """
    if stem_channels == IMAGE_CHANNELS:
        return model  # the plain stem, an nn.Conv2d exactly as torchvision's
    plain = model.conv1
    assert isinstance(plain, nn.Conv2d)  # torchvision's ResNet stem, or resnet18_cifar's
    padded = nn.utils.skip_init(
        ZeroPaddedStemConv2d,
        stem_channels,
        plain.out_channels,
        kernel_size=plain.kernel_size,
        stride=plain.stride,
        padding=plain.padding,
        bias=False,
        device=plain.weight.device,
        dtype=plain.weight.dtype,
    )
    with torch.no_grad():
        padded.weight.zero_()
        padded.weight[:, :IMAGE_CHANNELS].copy_(plain.weight)
    model.conv1 = padded
    return model


def resnet18_cifar(num_classes: int, stem_channels: int = IMAGE_CHANNELS) -> nn.Module:
    """ResNet-18 with the CIFAR stem: a 3x3 stride-1 first conv and no max-pool.

    The ImageNet stem (7x7 stride-2 conv, stride-2 max-pool) would shrink a 32x32 image to 8x8
    before the first residual stage; the CIFAR stem keeps it at 32x32 (He et al. 2016, sec. 4.2;
    the common ``kuangliu/pytorch-cifar`` variant).
    """
    model = torchvision().models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    # The init torchvision gives every other conv of the ResNet.
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return _pad_stem(model, stem_channels)


def resnet50(num_classes: int, stem_channels: int = IMAGE_CHANNELS) -> nn.Module:
    return _pad_stem(torchvision().models.resnet50(num_classes=num_classes), stem_channels)


def vit_b_16(*, image_size: int, num_classes: int, num_layers: int, hidden_size: int, num_heads: int, dropout: float) -> nn.Module:
    """ViT-B/16 (Dosovitskiy et al. 2020) at the given shape; MLP width 4 x hidden as in ViT-B.

    torchvision's encoder attends through ``nn.MultiheadAttention(need_weights=False)``, which
    runs ``F.scaled_dot_product_attention``. ``dropout`` drops both hidden states and attention
    probabilities, as BERT's and GPT-2's ``dropout`` does here.
    """
    return torchvision().models.VisionTransformer(
        image_size=image_size,
        patch_size=VIT_PATCH_SIZE,
        num_layers=num_layers,
        num_heads=num_heads,
        hidden_dim=hidden_size,
        mlp_dim=4 * hidden_size,
        dropout=dropout,
        attention_dropout=dropout,
        num_classes=num_classes,
    )
