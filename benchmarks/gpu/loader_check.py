"""The device-resident loader's batches (augmentation on the GPU) against the CPU's: the project
promises bit-identical batches. Prints each source's cost per batch of 512 on the device. Also
writes a random CIFAR-format directory (argv[1]) for the trainer's --data path. On a machine
without CUDA it compares CPU with CPU (a rehearsal of the code path, not of the promise)."""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
import torch

from scalerepro.data import cifar10
from scalerepro.data.sources import CifarImages, SyntheticCausalLM, SyntheticImages, SyntheticMaskedLM

path = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
rng = np.random.default_rng(0)
splits = {
    split: cifar10.Split(rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, count).astype(np.int64))
    for split, count in (("train", n), ("test", max(n // 8, 512)))
}
with contextlib.suppress(cifar10.DatasetError):  # written by an earlier stage
    cifar10.write(path, splits, source="random bytes (scalerepro GPU smoke test)")
train = splits["train"]
sources = {
    "cifar10+augment": CifarImages(torch.from_numpy(train.images), torch.from_numpy(train.labels), True, 0),
    "synthetic images 224": SyntheticImages(n, 1000, 224, 0),
    "synthetic causal LM": SyntheticCausalLM(n, 50304, 1024, 0),
    "synthetic masked LM": SyntheticMaskedLM(n, 30528, 128, 20, 103, 0),
}
indices = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:512]
differ = 0
for label, source in sources.items():
    cpu_inputs, cpu_targets = source.batch(indices, 3)
    on_device, device_indices = source.to(device), indices.to(device)
    on_device.batch(device_indices, 3)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(20):
        inputs, targets = on_device.batch(device_indices, 3)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - began) / 20 * 1e3
    same = all(torch.equal(a, b.cpu()) for a, b in zip((*cpu_inputs, cpu_targets), (*inputs, targets)))
    differ += not same
    print(f"loader {label:22s} batch of 512 on {device.type}: {ms:7.3f} ms  bit-identical to CPU: {same}")
print("LOADER CHECK", "OK" if not differ else f"FAILED ({differ} sources differ)")
raise SystemExit(1 if differ else 0)
