"""The torchvision image models: ResNet-18 (CIFAR stem), ResNet-50 and ViT-B/16.

Each returns a module with ``forward(images (B, 3, H, W)) -> logits (B, num_classes)`` and
torchvision's own weight initialization.
"""

from __future__ import annotations

from torch import nn

from scalerepro.models._torchvision import import_torchvision as torchvision

# torchvision is imported by the first model built here, not with this module: its import pulls in
# torch._dynamo (about 1 s a process on the development VM), which a run of the small CNN or of a
# transformer never uses, and every rank of every job of a CPU study would pay it.

VIT_PATCH_SIZE = 16


def resnet18_cifar(num_classes: int) -> nn.Module:
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
    return model


def resnet50(num_classes: int) -> nn.Module:
    return torchvision().models.resnet50(num_classes=num_classes)


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
