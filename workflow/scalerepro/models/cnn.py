"""A small CNN for quick tests of the trainer."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Three 3x3 convs with ReLU (two followed by 2x2 max-pools), global average pool, linear.

    ``forward(images (B, 3, H, W)) -> logits (B, num_classes)``; about 95k parameters at 10 classes.

    No BatchNorm, on purpose: BatchNorm normalizes with each rank's local batch statistics, so
    1 rank x batch 2B and 2 ranks x batch B would compute different gradients. Without it, DDP's
    averaged gradient equals the single-process one (up to summation order), which tests assert.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),  # any image size >= 4 (two 2x2 pools) ends as 128 features
            nn.Flatten(),
        )
        self.classifier = nn.Linear(128, num_classes)
        # He initialisation: without normalisation layers, PyTorch's default conv init shrinks the
        # activations layer by layer and the first hundred steps barely move the loss.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                assert module.bias is not None  # every conv above has one (bias=True)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))
