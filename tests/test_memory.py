"""A sharded run's freed layer-sized tensors give their pages back (``memory.unmap_large_frees``): glibc's
adaptive threshold otherwise carves them from the heap and keeps the freed pages resident under what is still
in use (0.7 GiB per rank at a sharded update's backward, benchmarks/memory_phases.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: 40 tensors of 8 MiB freed while a 256 KiB one allocated after each stays (10 MiB): none is at the heap's top
SCRIPT = """
import os, sys
import torch
from muarl.train.memory import unmap_large_frees
if sys.argv[1] == "on":
    unmap_large_frees()
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * page / 2**20
torch.ones(2**21).sum()  # one 8 MiB tensor freed: glibc raises its threshold past that size
before = resident()
big, small = [], []
for _ in range(40):
    big.append(torch.ones(2**21))
    small.append(torch.ones(2**16))  # 256 KiB, from the heap's top, after the 8 MiB before it
del big
print(resident() - before)
"""


def retained_mib(mode: str) -> float:
    env = {**os.environ}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux) only")
def test_freed_layer_sized_tensors_leave_no_resident_pages():
    freed = 40 * 8
    assert retained_mib("off") > freed / 2, "glibc kept nothing without the setting: this test shows nothing here"
    assert retained_mib("on") < 10 + freed / 10  # what stays in use, and a little
