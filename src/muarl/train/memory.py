"""The peak memory of a run's processes, logged with every step: what decides whether a size fits.

Counting tensors (parameters, gradients, optimizer state) misses what a user runs out of first: copies
made at start-up, the reference model, the rollout engine's copy, activations, the runtime itself. The
operating system's peak resident set of each process (``ru_maxrss``) counts all of it on the CPU; on a
GPU, torch's peak allocated memory on the rank's device is logged beside it.
"""

from __future__ import annotations

import os
import resource
import sys

import torch

from muarl.allocator import map_alone_from, release_freed
from muarl.train.distributed import Dist

#: ru_maxrss is in kibibytes on Linux, in bytes on macOS
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024
#: allocations from this size up get pages of their own, returned when freed (:func:`unmap_large_frees`)
OWN_PAGES_FROM = 4 * 2**20


def peak_rss_gb() -> float:
    """This process's peak resident memory since it started, in GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT / 2**30


def peak_memory(dist: Dist) -> dict[str, float]:
    """The peak memory so far over the run's ranks (a collective): ``peak_rss_gb`` the largest process's,
    ``peak_rss_gb_mean`` the mean over ranks, and on a GPU ``peak_gpu_gb`` the largest rank's allocated."""
    mine = [peak_rss_gb()]
    if dist.device.type == "cuda":
        mine.append(torch.cuda.max_memory_allocated(dist.device) / 2**30)
    ranks = dist.gather(mine)
    record = {"peak_rss_gb": max(r[0] for r in ranks), "peak_rss_gb_mean": sum(r[0] for r in ranks) / len(ranks)}
    if len(mine) > 1:
        record["peak_gpu_gb"] = max(r[1] for r in ranks)
    return record


def give_back_freed() -> None:
    """Return the C heap's freed pages to the operating system (glibc's ``malloc_trim``; nothing elsewhere).

    Tensors under glibc's adaptive mmap threshold (up to 32 MB: a decoder layer's weights) are carved from
    the heap, and freeing them leaves the pages resident: a rollout copy given back before the update
    still counted in the process's memory (0.5 GiB of an 8-layer copy on each of 4 ranks) until this is
    called. On a GPU the copy lives in torch's caching allocator, which reuses it without this."""
    release_freed()


def unmap_large_frees() -> None:
    """Give every allocation of :data:`OWN_PAGES_FROM` or more pages of its own, returned to the operating
    system when it is freed (glibc's ``mallopt(M_MMAP_THRESHOLD)``; nothing elsewhere, nor where the user set
    ``MALLOC_MMAP_THRESHOLD_``).

    glibc maps big allocations on their own, but after freeing one it raises that threshold to the freed size
    (up to 32 MB), so a decoder layer's gathered weights, their gradients and the activations of a sharded
    run, allocated and freed layer after layer, come from the heap instead, and the freed pages stay resident
    beneath what is still in use: 0.7 GiB on each of 4 ranks at the update's backward (8 layers of Qwen3-0.6B's
    widths, ``benchmarks/memory_phases.py``). A fixed threshold keeps them apart."""
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        map_alone_from(OWN_PAGES_FROM)
