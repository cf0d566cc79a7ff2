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
    """Every rank's equal chunk of a flat tensor into ``output_tensor`` on every rank, each received in place."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> None:
        me, world, size = group.rank(), group.size(), input_tensor.numel()
        mine = output_tensor[me * size:(me + 1) * size]
        if mine.data_ptr() != input_tensor.data_ptr():  # FSDP2 copies its shard into its own slot already
            mine.copy_(input_tensor)
        ops = []
        for peer in range(world):
            if peer != me:
                ops.append(dist.P2POp(dist.isend, input_tensor, group=group, group_peer=peer))
                ops.append(dist.P2POp(dist.irecv, output_tensor[peer * size:(peer + 1) * size], group=group,
                                      group_peer=peer))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()


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


def install(lm: Any, group: Any) -> bool:
    """Give every FSDP unit of ``lm`` the point-to-point collectives when ``group`` is gloo's; whether it did."""
    from torch.distributed.fsdp import FSDPModule

    if dist.get_backend(group) != "gloo":
        return False
    gather, scatter = PointToPointAllGather(), PointToPointReduceScatter()
    for module in lm.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(gather)
            module.set_custom_reduce_scatter(scatter)
    return True
