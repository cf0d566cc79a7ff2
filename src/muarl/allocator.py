"""Give freed tensor memory back to the system, in a process whose tensors come and go in every size.

On the CPU torch takes tensor memory from ``malloc``. glibc keeps what is freed for reuse: blocks under its mmap
threshold come from heaps that shrink only from the top, the threshold rises to the size of each larger block
freed (up to 32 MiB), and each thread that allocates may get a heap of its own (an arena). A server whose KV
caches are built, copied and dropped in every size by worker threads (:mod:`muarl.serve`) so holds far more
than it uses: replaying a GRPO step's user traffic (64 conversations, the user model), 9.6 GiB resident of
which 2.6 GiB live (what ``malloc_trim`` leaves), and the embedded user server of a 20-step ablation reached
22.7 GB and ran a 24 GiB machine out of memory. Two arenas and a ``malloc_trim`` every few seconds keep it at
2.7 GiB in the same time (research/llm-user-pilot.md; ``benchmarks/user_server_memory.py``). A fixed
1 MiB mmap threshold kept as little but cost 15% more time, each large block being mapped and zeroed afresh.

Only glibc has these calls; elsewhere they do nothing and return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: glibc's mallopt parameters (malloc.h): the most arenas, and the size from which an allocation is mapped alone
M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
#: arenas the allocating threads share (glibc's default: 8 per core)
ARENAS = 2


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Let this process's threads share at most ``arenas`` heaps. Call it before the threads that allocate
    start: an arena is made when a thread first allocates."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_ARENA_MAX, int(arenas)))


def release_freed() -> bool:
    """Return the free pages of every heap to the system (``malloc_trim(0)``: milliseconds)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def map_alone_from(size: int) -> bool:
    """Give every allocation of ``size`` bytes or more pages of its own, returned to the system when freed
    (``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc from raising the threshold after each big free)."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, int(size)))
