"""Freed tensor memory returned to the system (``muarl.allocator``), and the user server that does so.

Memory is read as resident set sizes of real subprocesses (a process's heaps cannot be reset in place). The
first test builds the fragmentation the server suffered: worker threads that allocate and free tensors of
every size up to 18 MB, each burst leaving a small tensor above its freed memory. The second serves the same
concurrent conversations with SmolLM2 from two real ``muarl.serve`` processes, one with ``--trim-every 0``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from muarl.domain import get_domain
from muarl.users.llm import opening_messages
from test_llm_user import start_process, stop_process

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
assert release_freed()
print(grown, rss() - base)
"""


def test_release_freed_returns_what_fragmented_heaps_hold() -> None:
    """Of the hundreds of MiB the bursts leave resident while 13 MB is live, release_freed gives back most."""
    done = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    grown, after = map(float, done.stdout.split())
    assert grown > 200, f"the bursts left only {grown:.0f} MiB resident: the test no longer fragments the heaps"
    assert after < grown / 3, f"{grown:.0f} MiB resident, {after:.0f} MiB after release_freed"


async def _conversations(url: str, turns: int) -> None:
    from openai import AsyncOpenAI

    histories = [opening_messages(t) for t in get_domain("retail-lite-forgetful").tasks("dev")[:8]]
    async with AsyncOpenAI(base_url=url, api_key="none", timeout=600, max_retries=0) as client:
        for _ in range(turns):
            replies = await asyncio.gather(*[client.chat.completions.create(
                model="smollm2", messages=h, temperature=0.0, max_tokens=32) for h in histories])
            for history, reply in zip(histories, replies, strict=True):
                history += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                            {"role": "user", "content": "Could you tell me your name and zip code?"}]


def _resident_gib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 2**20


def test_the_user_server_returns_freed_memory_as_it_serves(tmp_path: Path) -> None:
    """8 concurrent SmolLM2 conversations of 2 turns: the server as shipped ends holding less than one that
    keeps glibc's defaults (measured: 1.2-1.3 GiB against 1.8-2.2; the model alone is about 0.9)."""
    resident = {}
    for name, extra in (("shipped", []), ("glibc defaults", ["--trim-every", "0"])):
        cmd = [sys.executable, "-m", "muarl.serve", "--model", "smollm2", "--port", "0", "--threads", "1", *extra]
        proc, url = start_process(cmd, tmp_path / f"{name}.log", 300)
        try:
            asyncio.run(_conversations(url, 2))
            resident[name] = _resident_gib(proc.pid)
        finally:
            stop_process(proc)
    assert resident["glibc defaults"] - resident["shipped"] > 0.2, resident
