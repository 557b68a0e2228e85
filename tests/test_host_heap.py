"""The rank's heap (scalerepro.common.host_heap): memory a step frees is reused by the next step,
not given back to the kernel and faulted in again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from conftest import clean_env

# A process that allocates what a step does (40 blocks of 1 MiB, each written), frees it all,
# and does so again: the page faults of the later rounds are what each step pays anew.
_ROUNDS = """
import ctypes, json, resource, sys
from scalerepro.common import host_heap
if sys.argv[1] == "steady":
    host_heap.steady_heap()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(2**20) for _ in range(40)]
    for block in blocks:
        ctypes.memset(block, 1, 2**20)
    for block in blocks:
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": faults, "setting": host_heap.SETTING}))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")


def _rounds(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _ROUNDS, mode], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@glibc_only
def test_a_steady_heap_reuses_what_a_step_freed():
    # 40 MiB is 10,240 pages. glibc's default gives the freed heap top back to the kernel (it is
    # above the trim threshold), so every round faults it in again; held, the later rounds reuse it.
    default, steady = _rounds("default"), _rounds("steady")
    assert default["setting"] is None and min(default["faults"][1:]) > 5000, default
    assert steady["setting"].startswith("glibc malloc: mmap threshold fixed at 32 MiB, trimming off"), steady
    assert max(steady["faults"][1:]) < 100, steady
