"""FSDP2's all-gather and reduce-scatter on gloo, point to point: no whole-size buffer of gloo's own.

gloo's collectives receive into a whole buffer of their own and copy out after: its ``reduce_scatter_tensor``
of a 152k x 1,024 embedding's gradient (0.58 GiB) raised every one of 4 ranks' peak by 0.72 GiB, measured
alone, and its ``all_gather_into_tensor`` by the whole tensor. FSDP2 already holds the whole buffer it
gathers into (and the whole gradient it scatters from), so on the CPU every rank paid for each
vocabulary-sized unit twice at the moment memory peaks: an untied model's head and embeddings in backward.
Exchanging the chunks point to point receives each rank's chunk straight into its place (the gather) or
through one chunk-sized buffer summed into the output (the scatter). NCCL has no such buffer and keeps
torch's own collectives (:func:`install`).

Both classes follow FSDP2's custom-collective protocol (``FSDPModule.set_custom_all_gather`` /
``set_custom_reduce_scatter``): ``allocate`` the buffers, ``__call__`` the collective; they are
synchronous (they return no work to wait on), as FSDP2's own are on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


class _Plain:
    """Buffers as FSDP2 makes them by default: ordinary tensors."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class PointToPointAllGather(_Plain):
    """Every rank's equal chunk of a flat tensor into ``output_tensor`` on every rank, each received in place
    (:func:`exchange_rows` with one chunk per rank; FSDP2 has already put this rank's own in its slot)."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> None:
        size = input_tensor.numel()
        spans = [(peer * size, (peer + 1) * size) for peer in range(group.size())]
        exchange_rows(input_tensor, output_tensor, spans, group.rank(), group)


class PointToPointReduceScatter(_Plain):
    """The sum (or mean) over ranks of each rank's chunk of a flat tensor, into that rank's ``output_tensor``:
    every chunk sent to its owner, the peers' chunks received one at a time into one chunk-sized buffer."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ValueError(f"the point-to-point reduce-scatter sums or averages, not {op}")
        me, world, size = group.rank(), group.size(), output_tensor.numel()
        sends = [dist.isend(input_tensor[peer * size:(peer + 1) * size], group=group, group_dst=peer)
                 for peer in range(world) if peer != me]
        output_tensor.copy_(input_tensor[me * size:(me + 1) * size])
        received = torch.empty_like(output_tensor)
        for peer in range(world):
            if peer != me:
                dist.recv(received, group=group, group_src=peer)
                output_tensor.add_(received)
        for work in sends:
            work.wait()
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(world)


def exchange_rows(local: torch.Tensor, target: torch.Tensor, spans: list[tuple[int, int]], me: int,
                  group: Any) -> None:
    """An all-gather of dim-0 rows (rank r holds rows ``spans[r]``, uneven or empty) into ``target`` on every
    rank, point to point, each rank's rows received straight into their place: gloo's
    ``all_gather_into_tensor`` (like its list all-gather) receives into a whole temporary of its own first,
    on every rank at once (0.6 GB more per rank for a 152k x 1,024 embedding). A target on another device
    than ``local`` receives through a shard-sized buffer per rank."""
    s, e = spans[me]
    mine = local[:e - s].contiguous()
    target[s:e].copy_(mine)
    direct = target.device == local.device
    ops, received = [], []
    for r, (s, e) in enumerate(spans):
        if r == me:
            continue
        if mine.shape[0]:
            ops.append(dist.P2POp(dist.isend, mine, group=group, group_peer=r))
        if e > s:
            piece = target[s:e] if direct else local.new_empty((e - s, *local.shape[1:]))
            ops.append(dist.P2POp(dist.irecv, piece, group=group, group_peer=r))
            received.append((s, e, piece))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    if not direct:
        for s, e, piece in received:
            target[s:e].copy_(piece)


def copy_in(grads: list[torch.Tensor], flat: torch.Tensor, world: int) -> None:
    """FSDP2's reduce-scatter copy-in (``torch._chunk_cat``: each gradient's dim-0 chunk ``r``, zero-padded to
    equal rows, in rank ``r``'s part of ``flat``) without a whole temporary. The CPU build of ``_chunk_cat``
    pads every gradient into a zeroed buffer of ``flat``'s size and then copies it in: a third
    vocabulary-sized tensor beside the gradient and ``flat`` when a tied weight's gradient is scattered.
    Here each chunk is copied into its place. A unit whose one gradient already has ``flat``'s layout (one
    contiguous tensor, its rows divided evenly, the reduce dtype) lends ``flat`` its storage instead: FSDP2
    frees the gradient after the copy-in anyway, and ``flat``, just allocated and never written, holds no
    resident page."""
    if len(grads) == 1 and grads[0].is_contiguous() and grads[0].dtype == flat.dtype \
            and grads[0].numel() == flat.numel() and grads[0].device == flat.device:
        flat.set_(grads[0].reshape(-1))
        return
    rows, column = flat.view(world, -1), 0
    for grad in grads:
        per = -(-grad.shape[0] // world)  # each rank's rows, the last ranks' padded with zeros
        width = per * torch.Size(grad.shape[1:]).numel()
        for rank in range(world):
            piece = grad[rank * per:(rank + 1) * per].reshape(-1)
            rows[rank, column:column + piece.numel()].copy_(piece)
            rows[rank, column + piece.numel():column + width].zero_()
        column += width


def install(lm: Any, group: Any) -> bool:
    """Give every FSDP unit of ``lm`` the point-to-point collectives when ``group`` is gloo's, and FSDP2 the
    reduce-scatter copy-in without a whole temporary (:func:`copy_in`; FSDP2 has no public hook for it, so it
    replaces the module function FSDP2 calls, where that exists); whether it did."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    if dist.get_backend(group) != "gloo":
        return False
    if hasattr(_fsdp_collectives, "foreach_reduce_scatter_copy_in"):
        _fsdp_collectives.foreach_reduce_scatter_copy_in = copy_in
    gather, scatter = PointToPointAllGather(), PointToPointReduceScatter()
    for module in lm.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(gather)
            module.set_custom_reduce_scatter(scatter)
    return True
