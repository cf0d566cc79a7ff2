"""Weights as buckets of bytes on a process group shared by a trainer and vLLM workers: the wire format
of the in-memory weight sync, used on both ends (:mod:`muarl.weight_sync.link`, the trainer's;
:mod:`muarl.weight_sync.receiver`, the server's workers').

Why buckets: one broadcast per tensor costs a round trip each (hundreds per model); one per model needs a
second whole copy of the weights on both ends. A bucket of at most ``bucket_bytes`` (default 256 MiB)
bounds the extra memory on each end to one bucket while keeping the broadcasts few. The plan of every
bucket (names, dtypes, shapes) travels ahead as JSON in the control request; only the bytes go through
the group. Imports torch alone: it runs inside a vLLM server's workers and in a trainer without vLLM.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import math
import socket
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

BUCKET_BYTES = 256 << 20
#: the dtype of a change's positions (flat indices into its tensor; a tensor of 2**31 values or more goes whole)
INDEX = torch.int32
GROUP_PREFIX = "muarl-weights"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how a dtype travels in the JSON plan."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The inverse of :func:`dtype_name`; an unknown name is a ValueError naming it."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def plan(weights: Iterable[tuple[str, torch.Tensor]], wire: torch.dtype,
         bucket_bytes: int = BUCKET_BYTES) -> list[list[dict[str, Any]]]:
    """The buckets ``weights`` go in, each a list of ``{"name", "dtype", "shape"}`` in order, every tensor
    in ``wire`` dtype (floating ones; others keep theirs). A tensor larger than a bucket gets one of its
    own. Tied weights (embeddings and LM head) go twice, as in a checkpoint: vLLM's in-place reload of a
    tied model given the embeddings alone leaves its LM head behind (measured on the CPU build: log-probs
    off by 0.7 nats)."""
    return split([{"name": name, "dtype": dtype_name(wire if tensor.is_floating_point() else tensor.dtype),
                   "shape": list(tensor.shape)} for name, tensor in weights], bucket_bytes)


def split(entries: Iterable[dict[str, Any]], bucket_bytes: int = BUCKET_BYTES) -> list[list[dict[str, Any]]]:
    """``entries`` in order, cut into buckets of at most ``bucket_bytes`` on the wire (:func:`entry_nbytes`);
    an entry larger than a bucket gets one of its own, one that sends nothing goes with its neighbours."""
    buckets: list[list[dict[str, Any]]] = [[]]
    size = 0
    for entry in entries:
        nbytes = entry_nbytes(entry)
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(entry)
        size += nbytes
    return [bucket for bucket in buckets if bucket]


def entry_nbytes(entry: dict[str, Any]) -> int:
    """Bytes of one planned weight on the wire: the whole tensor, or for a change
    (:mod:`muarl.weight_sync.changes`) its changed positions and their values, or nothing (unchanged, or
    tied to a weight sent before it)."""
    itemsize = dtype_of(entry["dtype"]).itemsize
    send = entry.get("send", "full")
    if send == "full":
        return itemsize * math.prod(entry["shape"])
    if send == "changed":
        return entry["count"] * (INDEX.itemsize + itemsize)
    if send in ("same", "alias"):
        return 0
    raise ValueError(f"weight {entry['name']}: unknown send {send!r}")


def bucket_nbytes(bucket: list[dict[str, Any]]) -> int:
    """Bytes of one planned bucket on the wire."""
    return sum(entry_nbytes(entry) for entry in bucket)


def pack(tensors: list[torch.Tensor], bucket: list[dict[str, Any]], device: torch.device) -> torch.Tensor:
    """One bucket's tensors, cast to their planned dtypes, as one flat byte tensor on ``device``: a copy,
    except for a bucket of one tensor already in its dtype, contiguous and on ``device`` (a vocabulary
    table), whose bytes are sent as they are."""
    parts = []
    for tensor, entry in zip(tensors, bucket, strict=True):
        if list(tensor.shape) != entry["shape"]:
            raise ValueError(f"weight {entry['name']}: shape {list(tensor.shape)}, planned {entry['shape']}")
        part = tensor.detach().to(device=device, dtype=dtype_of(entry["dtype"])).contiguous()
        parts.append(part.reshape(-1).view(torch.uint8))
    return join(parts)


def join(parts: list[torch.Tensor]) -> torch.Tensor:
    """Byte tensors as one: a copy, except for one part, sent as it is (sent, not changed)."""
    if not parts:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def unpack(buffer: torch.Tensor, bucket: list[dict[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into a received bucket of whole tensors, in the planned order."""
    for entry, parts in unpack_entries(buffer, bucket):
        yield entry["name"], parts[0]


def unpack_entries(buffer: torch.Tensor, bucket: list[dict[str, Any]]
                   ) -> Iterator[tuple[dict[str, Any], list[torch.Tensor]]]:
    """(entry, its parts) views into a received bucket, in the planned order: a whole tensor ``[tensor]``,
    a change ``[positions (flat, int32), values]``, an unchanged or tied weight ``[]``."""
    offset = 0

    def take(dtype: torch.dtype, count: int) -> torch.Tensor:
        nonlocal offset
        nbytes = dtype.itemsize * count
        part = buffer[offset:offset + nbytes]
        if (part.storage_offset() % dtype.itemsize) and nbytes:  # after an odd count of 2-byte values
            part = part.clone()  # a fresh, aligned copy: a view may only reinterpret aligned bytes
        offset += nbytes
        return part.view(dtype)

    for entry in bucket:
        dtype, send = dtype_of(entry["dtype"]), entry.get("send", "full")
        if send == "full":
            yield entry, [take(dtype, math.prod(entry["shape"])).view(entry["shape"])]
        elif send == "changed":
            yield entry, [take(INDEX, entry["count"]), take(dtype, entry["count"])]
        else:
            entry_nbytes(entry)  # an unknown send is a ValueError naming the weight
            yield entry, []
    if offset != buffer.numel():
        raise ValueError(f"a weight bucket of {buffer.numel()} bytes was planned as {offset}")


def link_device(backend: str) -> torch.device:
    """Where a link's buffers live on this end: its current GPU on NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def device_identity(device: torch.device) -> dict[str, Any]:
    """What tells ``device`` apart across processes and machines, as each end of a link reports it: its
    type and, for a GPU, its UUID (one physical GPU whatever ``CUDA_VISIBLE_DEVICES`` each process sees)
    and the host and CUDA index it has here (the fallback where a build has no UUID)."""
    identity: dict[str, Any] = {"device": device.type}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        identity.update(host=socket.gethostname(), cuda_index=int(index), uuid=None if uuid is None else str(uuid))
    return identity


def open_group(store: dist.Store, rank: int, world: int, backend: str, timeout_s: float) -> Any:
    """A process group of its own over ``store`` (never the default group: a vLLM worker and a sharded
    trainer each have one already): gloo, which moves CPU tensors anywhere, or NCCL between GPUs. Every
    member calls it when the link opens, and it returns with the group in working order: one collective
    (a one-element broadcast) has run on it, so NCCL's communicator, which NCCL otherwise builds at the
    first collective, is built here, not inside the first sync (a server paused for it). A group that
    fails it is aborted (:func:`abort_group`)."""
    prefixed = dist.PrefixStore(GROUP_PREFIX, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world, timeout)
    elif backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world, options)
    else:
        raise ValueError(f"weight sync backend must be gloo or nccl, not {backend!r}")
    try:
        probe = torch.zeros(1, device=link_device(backend))
        group.broadcast(probe, 0).wait()
        probe.cpu()  # on a GPU: the broadcast has run, not only been queued
    except BaseException:
        abort_group(group)
        raise
    return group


HOLD_S = 5.0  # how long an ended group's last reference stays in its own thread, past every caller's


def abort_group(group: Any) -> None:
    """End ``group`` here and now (``abort``: local, no peer needed), before it is dropped: a failed link's
    collectives still queued would otherwise be timed out by NCCL's watchdog, which then ends the process.

    The group's last reference is dropped in a daemon thread of its own, :data:`HOLD_S` after the callers'
    are gone: gloo's abort does not end a broadcast in flight to a peer that stopped reading, and a group's
    destructor waits for it, so a caller whose reference was the last would wait out the link's timeout
    (600 s) in a plain ``self.group = None``, and a process that ends holding one is ended by the C++
    runtime (SIGABRT) instead of exiting."""
    if group is not None:
        with contextlib.suppress(Exception):  # ending it is all that is asked: a group already ended is fine
            group.abort()
        dropping = threading.Thread(target=_drop_later, args=([group],), name="muarl-ended-group", daemon=True)
        dropping.start()
        join_at_exit(dropping)


_HELD: list[threading.Thread] = []  # threads the process's exit waits for (see join_at_exit)
_EXITING = threading.Event()


def join_at_exit(thread: threading.Thread) -> None:
    """``thread``, blocked in a collective or in a group's destructor, is joined before the interpreter shuts
    down: a daemon thread that returns from C++ (a broadcast timed out) after the shutdown began is ended by
    ``pthread_exit`` inside pybind11's GIL guard, and the C++ runtime ends the process with SIGABRT
    ("terminate called without an active exception")."""
    _HELD[:] = [*(held for held in _HELD if held.is_alive()), thread]


def _drop_later(held: list[Any]) -> None:
    _EXITING.wait(HOLD_S)
    held.clear()  # the destructor runs here, and waits here for a broadcast still in flight


@atexit.register
def _join_held() -> None:
    """A group destroyed during the interpreter's shutdown with a broadcast in flight, or a sender whose
    broadcast times out then, ends the process with SIGABRT: at exit, every ended group is dropped at once
    and its destructor waited for, and every sender too (at most the link's timeout, only after a sync that
    failed with a peer that stopped reading: said on stderr)."""
    _EXITING.set()
    waiting = [thread for thread in _HELD if thread.is_alive()]
    for thread in waiting:
        thread.join(timeout=1.0)
    if any(thread.is_alive() for thread in waiting):
        print("muarl: waiting for a failed weight sync's broadcast to time out before exiting", file=sys.stderr)
    for thread in waiting:
        thread.join()
