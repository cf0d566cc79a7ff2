"""Freed tensor memory returned to the system (``muarl.allocator``), and the user server that does so.

Memory is read as resident set sizes of real subprocesses (a process's heaps cannot be reset in place). Both
tests build the fragmentation the server suffered: worker threads that allocate and free tensors of every
size up to 18 MB, each burst leaving a small tensor above its freed memory. The second then has a server
(muarl's tiny model) answer a request and fall idle, as shipped and with ``--trim-every 0``. (Two real
SmolLM2 servers serving the same conversations, the benchmark's design, differed by 0.0-0.9 GiB at a test's
size: too noisy for a test.)
"""

from __future__ import annotations

import subprocess
import sys

FRAGMENT = """
import torch
from concurrent.futures import ThreadPoolExecutor
from muarl.allocator import release_freed

def rss():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024

kept = []
def burst(i):
    big = torch.ones(7_500_000)  # 30 MB, mapped alone: freeing it raises glibc's mmap threshold to 30 MB
    del big
    tmp = [torch.ones(500_000 + (i * 7919 + j * 104729) % 4_000_000) for j in range(10)]  # 2-18 MB, from heaps
    kept.append(torch.ones(50_000))  # 0.2 MB kept above them: 13 MB in all
    del tmp

base = rss()
with ThreadPoolExecutor(4) as pool:
    list(pool.map(burst, range(64)))
grown = rss() - base
"""


def test_release_freed_returns_what_fragmented_heaps_hold() -> None:
    """Of the hundreds of MiB the bursts leave resident while 13 MB is live, release_freed gives back most."""
    released = FRAGMENT + "assert release_freed()\nprint(grown, rss() - base)\n"
    done = subprocess.run([sys.executable, "-c", released], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    grown, after = map(float, done.stdout.split())
    assert grown > 200, f"the bursts left only {grown:.0f} MiB resident: the test no longer fragments the heaps"
    assert after < grown / 3, f"{grown:.0f} MiB resident, {after:.0f} MiB after release_freed"


SERVE_AFTER_FRAGMENTING = FRAGMENT + """
import asyncio, sys
from muarl.models import load
from muarl.serve import BatchedServing, Generator, GenRequest

model, tokenizer = load("tiny", device="cpu")
server = BatchedServing(Generator(model, tokenizer, "tiny"), trim_every=float(sys.argv[1]))

async def serve():
    await server.complete(GenRequest(messages=[{"role": "user", "content": "hello"}], temperature=0.0, max_tokens=4))
    if server.trimming is not None:
        await server.trimming

before = rss()
asyncio.run(serve())
print(grown, before - rss())
"""


def test_the_user_server_returns_freed_memory_when_it_falls_idle() -> None:
    """A server process whose heaps hold ~500 MiB of freed memory answers one request, then falls idle: as
    shipped (``--trim-every 5``) it gives that memory back; with ``--trim-every 0`` it keeps it."""
    grown, released = {}, {}
    for every in ("5", "0"):
        done = subprocess.run([sys.executable, "-c", SERVE_AFTER_FRAGMENTING, every], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        grown[every], released[every] = map(float, done.stdout.split()[-2:])
    assert min(grown.values()) > 200, f"the bursts left only {grown} MiB resident: the test no longer fragments"
    assert released["5"] > grown["5"] / 2, f"trimming server: {grown['5']:.0f} MiB held, {released['5']:.0f} released"
    assert released["0"] < grown["0"] / 4, f"untrimmed server: {grown['0']:.0f} MiB held, {released['0']:.0f} released"
