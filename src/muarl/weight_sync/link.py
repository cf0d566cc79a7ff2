"""The trainer's side of the in-memory weight sync into vLLM servers (``--vllm-weight-sync memory``, the
default): one process group holding the trainer (rank 0) and every worker of every server, over which each
sync broadcasts the weights in buckets of the engine's dtype (bf16 on GPUs), while each server, paused,
reloads them into its model as they arrive (:mod:`muarl.weight_sync.receiver`).

Why not the file: a full-weight sync through safetensors writes and reads the whole model per step, in the
trainer's dtype (33 GB at 8B in float32), and needs a filesystem the servers share. Here one broadcast
reaches every server, the bytes are the engine's dtype, and each end holds one bucket beyond its model.
The group is NCCL when the trainer and every worker are each on a GPU of their own, else gloo (CPU tensors,
any machines), which covers a server on the trainer's own GPU (:func:`choose_backend`). It is built, NCCL's
communicator included, when the link opens, and aborted when the link ends or fails. The control (the
bucket plan, pause, reset, resume) goes over the servers' HTTP routes (dev mode).

A server started without the receiver (not by :func:`~muarl.policies.vllm_server.server_command`) answers
the first call with an error, and :meth:`WeightLink.open` returns None: the caller falls back to files.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from muarl.weight_sync.buckets import (
    BUCKET_BYTES,
    abort_group,
    device_identity,
    dtype_of,
    join,
    join_at_exit,
    link_device,
    open_group,
    pack,
    plan,
    split,
)
from muarl.weight_sync.changes import SentWeights, header
from muarl.weight_sync.receiver import JOINED, RECEIVER

LINK_TIMEOUT_S = 600.0  # one broadcast (a bucket) may take this long before the sync fails
CONNECT_TIMEOUT_S = 60.0  # every worker joins the group within this, or the link is refused


class LinkFailed(RuntimeError):
    """A sync over the link failed (a server refused or died, the group broke): the message names it."""


def local_address(url: str) -> str:
    """The address of this machine the server at ``url`` reaches it by: loopback for a server here, else
    the interface the route to the server leaves by (a UDP socket's connect sends nothing)."""
    host = urlsplit(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def trainer_identity() -> dict[str, Any]:
    """Where this process's end of a link would be (:func:`~muarl.weight_sync.buckets.device_identity`):
    its current GPU (the one an NCCL link would use), else the CPU."""
    return device_identity(link_device("nccl") if torch.cuda.is_available() else torch.device("cpu"))


def choose_backend(trainer: dict[str, Any], workers: list[dict[str, Any]]) -> str:
    """The link's transport, chosen before any group exists, from where every end runs (``trainer``:
    :func:`trainer_identity`; ``workers``: every server worker's ``muarl_link_info``): NCCL when each is on
    a GPU of its own, else gloo. Gloo where an end is on the CPU, and where two ends share a GPU: a vLLM
    server on the trainer's own GPU (docs/gpu.md's one-GPU layouts), which NCCL refuses ("Duplicate GPU
    detected"), or two servers on one. Two ends are on one GPU when their UUIDs are equal; where one lacks
    a UUID, when their (host, CUDA index) are; an end that names its GPU neither way may be on any, so gloo.
    Future work: CUDA IPC between ends on one GPU (a handle to the trainer's buckets, no copy through host
    memory)."""
    ends = [trainer, *workers]
    if any(end.get("device") != "cuda" for end in ends):
        return "gloo"
    for k, one in enumerate(ends):
        for other in ends[k + 1:]:
            if _same_gpu(one, other) is not False:
                return "gloo"
    return "nccl"


def _same_gpu(one: dict[str, Any], other: dict[str, Any]) -> bool | None:
    """Whether two ends' GPUs are one (None: they do not say enough to tell)."""
    if one.get("uuid") and other.get("uuid"):
        return one["uuid"] == other["uuid"]
    places = [(end.get("host"), end.get("cuda_index")) for end in (one, other)]
    if any(host is None or index is None for host, index in places):
        return None
    return places[0] == places[1]


class WeightLink:
    """Rank 0's process group with every worker of ``servers``
    (:class:`~muarl.policies.vllm_server.VLLMServer`); :meth:`open` makes one. ``wire``: the engines'
    dtype, which every floating weight is cast to before it leaves; ``backend``: gloo or nccl; ``changes``:
    after the first sync, send only the values that changed (:mod:`muarl.weight_sync.changes`), a tensor
    with more than ``full_above`` of its values changed whole (None: :data:`~muarl.weight_sync.changes.FULL_ABOVE`
    for the link's device)."""

    def __init__(self, servers: list[Any], group: Any, store: Any, wire: torch.dtype, backend: str,
                 bucket_bytes: int = BUCKET_BYTES, changes: bool = False, full_above: float | None = None):
        self.servers, self.group, self.store, self.wire, self.backend = servers, group, store, wire, backend
        self.bucket_bytes = bucket_bytes
        self.device = link_device(backend)
        self.broken = False
        #: the last sync's seconds: "sent" (its last byte broadcast, from the sync's start) and "loaded" (the
        #: slowest worker's receive and reload), where a sync's time goes (benchmarks/weight_sync.py)
        self.last_seconds: dict[str, float] = {}
        #: what the engines hold, for a sync of changes (None: every sync sends every weight)
        self.sent = SentWeights(self.device, full_above) if changes else None

    @classmethod
    def open(cls, servers: list[Any], *, backend: str = "auto", timeout_s: float | None = None,
             bucket_bytes: int = BUCKET_BYTES, changes: bool = False,
             full_above: float | None = None) -> WeightLink | None:
        """Join every worker of ``servers`` into one group with this process; None when a server has no
        receiver (started without muarl's worker extension), any other failure a :class:`LinkFailed`.
        ``backend``: "auto" (:func:`choose_backend`), gloo or nccl. The group is whole and in working order
        (NCCL's communicator built) when this returns: no sync builds it inside a server's pause. A link
        that fails to open has its group aborted. ``timeout_s``: how long one broadcast may take before the
        sync fails, on both ends (None: :data:`LINK_TIMEOUT_S`, read when the link opens)."""
        timeout_s = LINK_TIMEOUT_S if timeout_s is None else timeout_s
        infos: list[list[dict[str, Any]]] = []
        for server in servers:
            try:
                infos.append(server.rpc("muarl_link_info"))
            except RuntimeError as err:  # the server's ServerError (not imported: vllm_server imports this module)
                if "has no attribute 'muarl_link_info'" in str(err):  # vLLM's answer, HTTP 500
                    return None
                raise LinkFailed(str(err)) from None
        dtypes = {info["dtype"] for workers in infos for info in workers}
        if len(dtypes) != 1:
            raise LinkFailed(f"the servers {', '.join(s.url for s in servers)} run different dtypes "
                             f"({', '.join(sorted(dtypes))}): one weight sync cannot serve them all")
        if backend == "auto":
            backend = choose_backend(trainer_identity(), [info for workers in infos for info in workers])
        world = 1 + sum(len(workers) for workers in infos)
        host, first = local_address(servers[0].url), 1
        # the store listens on every interface; its own client (this process) reaches it on loopback
        store = dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=CONNECT_TIMEOUT_S))
        joins = []
        for server, workers in zip(servers, infos, strict=True):
            joins.append(_background(server.rpc, "muarl_open_link", host=host, port=store.port, first_rank=first,
                                     world=world, backend=backend, timeout_s=timeout_s, connect_s=CONNECT_TIMEOUT_S))
            first += len(workers)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while store.add(JOINED, 0) < world - 1:  # every worker reached the store, or say who did not
            failed = [f"{s.url}: {j.exception()}" for s, j in zip(servers, joins, strict=True)
                      if j.done() and j.exception() is not None]
            if failed or time.monotonic() > deadline:
                raise LinkFailed(f"the weight link could not be opened: the servers' workers did not all reach "
                                 f"{host}:{store.port} within {CONNECT_TIMEOUT_S:.0f} s "
                                 f"({'; '.join(failed) or 'no answer'}); a server that cannot reach this machine "
                                 "needs --vllm-weight-sync file")
            time.sleep(0.05)
        try:  # every worker is there: forms at once (a group that fails its first collective is aborted)
            group = open_group(store, 0, world, backend, timeout_s)
        except RuntimeError as err:
            raise LinkFailed(f"the weight link ({backend}) could not be opened: {' '.join(str(err).split())}") from None
        try:
            for server, join in zip(servers, joins, strict=True):
                if join.exception(timeout=CONNECT_TIMEOUT_S) is not None:
                    raise LinkFailed(f"{server.url} could not join the weight link ({join.exception()})")
        except BaseException:
            abort_group(group)
            raise
        return cls(servers, group, store, dtype_of(dtypes.pop()), backend, bucket_bytes, changes, full_above)

    def send(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Every server takes ``weights`` ((HF name, tensor), as :func:`muarl.weight_sync.merged.merged_weights`
        gives them) with generation paused around it; returns the bytes broadcast (with ``changes``: what
        changed since the last sync). Every server must take them: any failure is a :class:`LinkFailed`
        naming the servers, and the link is broken after it."""
        if self.broken:
            raise LinkFailed("the weight link broke in an earlier sync")
        weights = list(weights)
        changes = self.sent is not None
        tensors = dict(weights)
        moved, sent_at = [0], [0.0]
        if self.sent is None:
            buckets = plan(weights, self.wire, self.bucket_bytes)

            def broadcast() -> None:
                in_flight: tuple[Any, Any] | None = None  # (buffer, its broadcast): the buffer lives until sent
                for bucket in buckets:  # the next bucket is packed while the last one is on the wire
                    buffer = pack([tensors[entry["name"]] for entry in bucket], bucket, self.device)
                    if in_flight is not None:
                        in_flight[1].wait()
                    in_flight = (buffer, self.group.broadcast(buffer, 0))
                    moved[0] += buffer.numel()
                if in_flight is not None:
                    in_flight[1].wait()
                sent_at[0] = time.perf_counter()
        else:
            sent = self.sent
            buckets = split(sent.plan(weights, self.wire), self.bucket_bytes)

            def broadcast() -> None:
                in_flight: list[tuple[Any, Any]] = []  # the last bucket's header and bytes, with their broadcasts
                for bucket in buckets:  # the next bucket is compared while the last one is on the wire and loading
                    sends, parts = [], []
                    for entry in bucket:
                        if entry.get("send") == "alias":
                            sends.append(("alias", 0))
                            continue
                        send, count, entry_parts = sent.encode(entry, tensors[entry["name"]])
                        sends.append((send, count))
                        parts += [part.reshape(-1).view(torch.uint8) for part in entry_parts]
                    head, buffer = header(sends).to(self.device), join(parts)
                    for _, work in in_flight:
                        work.wait()
                    in_flight = [(head, self.group.broadcast(head, 0))]
                    if buffer.numel():  # unchanged weights only: no bytes (the receiver reads so in the header)
                        in_flight.append((buffer, self.group.broadcast(buffer, 0)))
                    moved[0] += head.numel() * head.itemsize + buffer.numel()
                for _, work in in_flight:
                    work.wait()
                sent_at[0] = time.perf_counter()
        payload = json.dumps(buckets)
        began = time.perf_counter()

        def receive(server: Any) -> list[dict[str, Any]]:
            with server.paused():
                if changes:
                    return server.rpc("muarl_receive", plan=payload, changes=True)
                return server.rpc("muarl_receive", plan=payload)  # as a receiver of before the changes' form

        loads = [_background(receive, server) for server in self.servers]
        sender = _background(broadcast, hold_exit=True)  # a failed sync's broadcast may time out at exit
        # the first failure ends the wait: the others may be held in a broadcast that cannot complete now
        wait([*loads, sender], return_when=FIRST_EXCEPTION)
        failed = [(server.url, load.exception()) for server, load in zip(self.servers, loads, strict=True)
                  if load.done() and load.exception() is not None]
        if not failed and sender.done() and sender.exception() is not None:
            failed = [("the broadcast", sender.exception())]
        if failed:
            self.broken = True  # a broadcast or a server may still wait on a peer that left: this group is done,
            self.sent = None  # and what the engines hold is unknown: the next link starts with a full sync
            abort_group(self.group)  # ended now, not timed out later by NCCL's watchdog (which ends the process)
            raise LinkFailed("; ".join(f"{who} could not take the weights ({err})" for who, err in failed))
        for server in self.servers:
            server.stats.weight_syncs += 1
        answers = [answer for load in loads for answer in load.result() or ()]
        self.last_seconds = {"sent": sent_at[0] - began,
                             "loaded": max((float(a.get("seconds", 0.0)) for a in answers), default=0.0)}
        return moved[0]

    @property
    def changed_share(self) -> float | None:
        """The share of the model's values the last sync found changed (None: this link sends every value)."""
        return self.sent.changed_share if self.sent is not None else None

    def close(self) -> None:
        """Ask the servers to end theirs (a server already gone is left as it is), then end this end: the
        group aborted before it is dropped."""
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.rpc("muarl_close_link")
        abort_group(self.group)
        self.group = None
        self.store = None


class LazyLink:
    """The link to ``servers``, opened at the first :meth:`get`, and again after a failure broke it (a
    restarted server gets a new one); None for good, said once on stderr, when a server has no receiver."""

    def __init__(self, servers: list[Any], bucket_bytes: int = BUCKET_BYTES, changes: bool = False):
        self.servers, self.bucket_bytes, self.changes = servers, bucket_bytes, changes
        self.link: WeightLink | None = None
        self.absent = False  # a server without the receiver: the caller's weights go through files

    def get(self) -> WeightLink | None:
        if self.link is not None and self.link.broken:
            self.close()
        if self.link is None and not self.absent:
            # a LinkFailed leaves it unopened: the next call tries again
            self.link = WeightLink.open(self.servers, bucket_bytes=self.bucket_bytes, changes=self.changes)
            if self.link is None:
                self.absent = True
                print(f"muarl: warning: the vLLM server(s) {', '.join(s.url for s in self.servers)} have no muarl "
                      f"weight receiver (start them with --worker-extension-cls {RECEIVER}, as server_command() "
                      "does): full weights go through safetensors files instead (--vllm-weight-sync file says so "
                      "without this warning)", file=sys.stderr)
        return self.link

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None


def _background(fn: Any, *args: Any, hold_exit: bool = False, **kwargs: Any) -> Future:
    """``fn`` in a daemon thread: a caller that gives up on it (a failed sync, whose broadcast may wait out
    its timeout) is not held by it, nor is the process's exit (a pool's threads are joined at exit), unless
    ``hold_exit``: a thread in a collective, joined at exit (:func:`muarl.weight_sync.buckets.join_at_exit`)."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:
                future.set_exception(err)

    thread = threading.Thread(target=run, name="muarl-link", daemon=True)
    thread.start()
    if hold_exit:
        join_at_exit(thread)
    return future
