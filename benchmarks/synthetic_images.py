#!/usr/bin/env python3
"""Cost of one synthetic image on the host: what a DataLoader worker spends per sample.

    python benchmarks/synthetic_images.py [--seconds 3] [--batch 64]

``SyntheticImages.batch`` on the CPU, one thread (one DataLoader worker), at CIFAR size (32 px,
10 classes) and ImageNet size (224 px, 1,000 classes): the median of 5 timed rounds, each
``--seconds`` long, after one warm-up batch.

    ms per image = round seconds / images in the round x 1e3
    images/s one worker can feed = 1e3 / ms per image
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from scalerepro.data.sources import SyntheticImages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each of the 5 timed rounds")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0))
    print(f"SyntheticImages.batch, 1 thread ({cores} cores here), batch {args.batch}, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    for side, classes in ((32, 10), (224, 1000)):
        source = SyntheticImages(50_000, classes, side, seed=0)
        source.batch(torch.arange(args.batch), epoch=0)
        rounds = []
        for _ in range(5):
            started, images = time.perf_counter(), 0
            while time.perf_counter() - started < args.seconds:
                source.batch(torch.arange(images, images + args.batch), epoch=0)
                images += args.batch
            rounds.append((time.perf_counter() - started) / images * 1e3)
        median = statistics.median(rounds)
        print(f"{side:>4} px: {median:.3f} ms/image (median of 5 rounds, range {min(rounds):.3f}-{max(rounds):.3f}) = {1e3 / median:,.0f} images/s per worker")


if __name__ == "__main__":
    main()
