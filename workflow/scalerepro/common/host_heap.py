"""A rank's host heap: glibc's malloc told to keep what a step frees, so that every step's
allocations cost the same. No torch here.

glibc serves an allocation above its mmap threshold with fresh pages from the kernel and gives
them back when it is freed; the threshold starts at 128 KiB and moves up as the process frees
mmapped blocks (up to 32 MiB), and freed memory at the heap's top above the trim threshold goes
back to the kernel too. A training step on the CPU allocates and frees the same activations and
gradients every step, and whether they come back as reused heap or as fresh pages, a page fault
for every 4 KiB touched, depends on what the process allocated and freed before. On the
development VM (2-core AMD EPYC, ResNet-18 at CIFAR shapes, 8 samples a rank, 2 ranks on gloo) one
run's window took about 4,600 page faults a step and another's none, 10 % of the step apart; the
communication probe after the window, whose saved copy of the run's state moved the threshold,
took 8,000 a step and timed the step 7 % slower than the window it stood for
(``benchmarks/README.md``). With both thresholds fixed, every step of both took none.

``steady_heap`` fixes them, once per process, before the model is built: the mmap threshold at
glibc's largest (32 MiB on 64-bit: larger blocks still come from mmap, as they must) and trimming
off. This is what PyTorch's own CPU launcher (``torch.backends.xeon.run_cpu``) gets by preloading
jemalloc or tcmalloc, with glibc's own knobs (``mallopt``), so no library is added. The price is a
resident size that stays at its peak, which a training process reaches in its first step anyway.
The record says what was set (``knobs.host_heap``); on a C library other than glibc nothing is set
and the record says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt(3) parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; setting it turns the moving threshold off
NO_TRIM = -1  # mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"

# What this process set (steady_heap); None until it is called (the launcher, a failed start).
SETTING: str | None = None


def steady_heap() -> str:
    """Fix glibc malloc's mmap threshold and turn its trimming off in this process (module
    docstring); return what was done, one line, which the record keeps."""
    global SETTING
    if SETTING is None:
        SETTING = _set()
    return SETTING


def _set() -> str:
    library, _ = platform.libc_ver()
    if library != "glibc":
        return f"left as it is: the C library is {library or 'not glibc'}, whose malloc has no mallopt thresholds"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    done = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM) == 1
    if not done:
        return "left as it is: glibc refused mallopt (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD -1)"
    return "glibc malloc: mmap threshold fixed at 32 MiB, trimming off (freed memory is reused, not faulted in again)"
