"""The vLLM server's side of the in-memory weight sync: a worker extension
(``--worker-extension-cls muarl.weight_sync.receiver.WeightReceiver``, which
:func:`muarl.policies.vllm_server.server_command` adds) whose methods the trainer calls through
``POST /collective_rpc`` (dev mode).

Why a worker extension, as TRL's ``vllm serve`` does it: the methods run in each worker, beside its model,
so the weights go from the trainer's process into the worker's through a process group the two share
(gloo, NCCL between GPUs) and into the model by vLLM's own in-place ``reload_weights`` (Hugging Face names
mapped onto fused layouts, repacked as at start-up), one bucket at a time: no file, no second copy of the
model on either side. vLLM's ``WeightTransferEngine`` registry would need a plugin installed in the
server's environment and its trainer half needs vLLM in the trainer's; this needs neither.

The methods' arguments come as JSON (the route's), the bucket plan as a JSON string. Imports torch and
:mod:`muarl.weight_sync.buckets` only.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import torch
import torch.distributed as dist

from muarl.weight_sync.buckets import (
    abort_group,
    bucket_nbytes,
    device_identity,
    dtype_name,
    link_device,
    open_group,
    unpack,
    unpack_entries,
)
from muarl.weight_sync.changes import Mirror, read_header

#: the ``--worker-extension-cls`` a server needs for the in-memory sync
RECEIVER = "muarl.weight_sync.receiver.WeightReceiver"
#: the store's count of the workers that reached it
JOINED = "muarl-joined"


class WeightReceiver:
    """Mixed into every vLLM worker of a server (``self`` is the worker: ``rank``, ``model_runner``,
    ``vllm_config``, ``reload_weights``)."""

    _muarl_link: tuple[Any, Any, torch.device] | None = None
    _muarl_mirror: Mirror | None = None  # the weights as last received, for a sync of changes (the link's life)

    def muarl_link_info(self) -> dict[str, Any]:
        """This worker's model dtype (the wire dtype the trainer casts to), rank and device: its type and, on a
        GPU, which one (:func:`~muarl.weight_sync.buckets.device_identity`), so the trainer can tell a
        server on its own GPU, where NCCL cannot link the two, from one on another."""
        parameter = next(self.model_runner.get_model().parameters())  # type: ignore[attr-defined]
        return {"dtype": dtype_name(self.vllm_config.model_config.dtype),  # type: ignore[attr-defined]
                **device_identity(parameter.device), "rank": int(self.rank)}  # type: ignore[attr-defined]

    def muarl_open_link(self, host: str, port: int, first_rank: int, world: int, backend: str,
                        timeout_s: float, connect_s: float = 60.0) -> dict[str, Any]:
        """Join the trainer's group (its TCPStore at ``host:port``, reached within ``connect_s``) as rank
        ``first_rank + self.rank``; returns once every member has joined. ``timeout_s`` bounds each
        broadcast. A link opened before is closed first. The group is in working order when this returns
        (NCCL's communicator built: :func:`~muarl.weight_sync.buckets.open_group`)."""
        self.muarl_close_link()
        store = dist.TCPStore(host, int(port), int(world), False, timeout=datetime.timedelta(seconds=connect_s))
        store.add(JOINED, 1)  # the trainer waits for every worker here, a bounded time, before the group forms
        rank = int(first_rank) + int(self.rank)  # type: ignore[attr-defined]
        group = open_group(store, rank, int(world), backend, timeout_s)
        self._muarl_link = (store, group, link_device(backend))
        self._muarl_mirror = None
        return {"rank": rank}

    def muarl_receive(self, plan: str, changes: bool = False) -> dict[str, Any]:
        """Receive the buckets ``plan`` (JSON: a list of buckets, each of ``{"name", "dtype", "shape"}``)
        lays out, broadcast by the trainer (rank 0) in that order, and reload them into the model as they
        arrive. ``changes``: the plan's entries may be changes or unchanged weights
        (:mod:`muarl.weight_sync.changes`), applied to this worker's mirror of the weights, which is kept
        from then on, and every weight is reloaded from it. A failure while loading still takes every
        remaining bucket off the wire (and drops it), so the trainer's broadcasts end and the error reaches
        it as the request's answer."""
        if self._muarl_link is None:
            raise RuntimeError("muarl_receive before muarl_open_link: no weight link to receive on")
        _, group, device = self._muarl_link
        buckets = json.loads(plan)
        began = time.perf_counter()
        if changes:
            if self._muarl_mirror is None:
                self._muarl_mirror = Mirror()
            answer = self._muarl_receive_changes(buckets, group, device, self._muarl_mirror)
            return {**answer, "seconds": time.perf_counter() - began}
        posted: list[tuple[torch.Tensor, Any]] = []  # (buffer, its broadcast in flight), one bucket ahead

        def post() -> None:
            buffer = torch.empty(bucket_nbytes(buckets[len(posted)]), dtype=torch.uint8, device=device)
            posted.append((buffer, group.broadcast(buffer, 0)))

        def stream():
            for index, bucket in enumerate(buckets):
                if len(posted) == index:
                    post()
                buffer, arrival = posted[index]
                arrival.wait()
                if len(posted) < len(buckets):  # the next bucket comes in while this one loads
                    post()
                yield from unpack(buffer, bucket)
                posted[index] = (buffer.new_empty(0), None)  # loaded: its memory can go

        try:
            self.reload_weights(weights_iterator=stream(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        finally:
            for _, arrival in posted:
                if arrival is not None:
                    arrival.wait()
            while len(posted) < len(buckets):
                post()
                posted[-1][1].wait()
        return {"buckets": len(buckets), "bytes": sum(bucket_nbytes(b) for b in buckets),
                "seconds": time.perf_counter() - began}

    def _muarl_receive_changes(self, buckets: list[list[dict[str, Any]]], group: Any, device: torch.device,
                         mirror: Mirror) -> dict[str, Any]:
        """The changes' form of :meth:`muarl_receive`: each bucket's header (its entries' send and count),
        then its bytes, in the trainer's order (header 0, bytes 0, header 1, ...; a bucket of no bytes has
        no second broadcast); applied to ``mirror`` and every weight reloaded from it. The next header is
        posted before a bucket loads, its bytes once it has come. A failure drops the mirror (applied in
        part: no change may build on it) and still takes every remaining broadcast off the wire."""
        heads: list[tuple[torch.Tensor, Any]] = []
        payloads: list[tuple[torch.Tensor, Any, list[dict[str, Any]]]] = []
        moved = [0]

        def post_head() -> None:
            head = torch.empty(2 * len(buckets[len(heads)]), dtype=torch.int64, device=device)
            heads.append((head, group.broadcast(head, 0)))

        def post_payload() -> None:
            head, arrival = heads[len(payloads)]
            arrival.wait()
            entries = read_header(head.cpu(), buckets[len(payloads)])
            buffer = torch.empty(bucket_nbytes(entries), dtype=torch.uint8, device=device)
            payloads.append((buffer, group.broadcast(buffer, 0) if buffer.numel() else None, entries))
            moved[0] += head.numel() * head.itemsize + buffer.numel()

        def stream():
            for index in range(len(buckets)):
                if len(heads) == index:
                    post_head()
                if len(payloads) == index:
                    post_payload()
                if index + 1 < len(buckets) and len(heads) == index + 1:
                    post_head()  # the trainer sends it once this bucket's bytes are out
                buffer, arrival, entries = payloads[index]
                if arrival is not None:
                    arrival.wait()
                for entry, parts in unpack_entries(buffer, entries):
                    yield entry["name"], mirror.apply(entry, parts)
                payloads[index] = (buffer.new_empty(0), None, entries)  # applied: its memory can go

        try:
            self.reload_weights(weights_iterator=stream(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        except BaseException:
            self._muarl_mirror = None
            raise
        finally:
            while len(payloads) < len(buckets):  # in the trainer's order: the next header, then its bytes
                if len(heads) == len(payloads):
                    post_head()
                post_payload()
            for _, arrival in heads:
                arrival.wait()
            for _, arrival, _ in payloads:
                if arrival is not None:
                    arrival.wait()
        return {"buckets": len(buckets), "bytes": moved[0]}

    def muarl_close_link(self) -> None:
        """End the link, its group aborted (the trainer opens a new one when it needs to): a group dropped
        with a broadcast still queued (a trainer gone mid-sync) would be timed out by NCCL's watchdog, which
        ends the worker."""
        if self._muarl_link is not None:
            abort_group(self._muarl_link[1])
        self._muarl_link = None
        self._muarl_mirror = None
