"""Data parallelism across processes: every rank holds the whole model and does its share of the work.

Launched with ``accelerate launch --multi_gpu --num_processes N`` (on a machine without CUDA accelerate
still starts N processes and the group talks over gloo), or with ``torchrun``; a plain ``python -m
muarl ...`` is one process and none of this costs anything. Each rank plays / trains on its own share of
a step's data; gradients are summed over ranks with one all-reduce per step, and every loss is
normalised by the *global* token (or sequence) count, so the summed gradient is exactly the gradient of
the whole batch's loss, whatever share each rank had. Only rank 0 writes files.

Why not wrap the model in ``DistributedDataParallel``: DDP all-reduces at every ``backward``, so ranks
with different numbers of micro-batches (episodes differ in length and count per rank) would deadlock or
need dummy passes, and the rollout engine needs the bare model anyway. One explicit all-reduce after the
last micro-batch is simpler and exact.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Dist:
    """This process's place in the group (rank 0 of 1 when not launched for several processes)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        """Whether this process writes files and shows progress."""
        return self.rank == 0

    def share(self, items: list[Any]) -> list[Any]:
        """This rank's part of ``items`` (round-robin, so every rank gets a near-equal count)."""
        return items[self.rank::self.world]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; ``[obj]`` for one process)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (picklable; what the other ranks pass is ignored)."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def from_main(self, action: Callable[[], Any], shareable: tuple[type[BaseException], ...] = ()) -> Any:
        """``action()`` run on rank 0 alone, its result on every rank. A failure there is raised on every
        rank: rank 0's own exception on rank 0, the same on the others when its type is one of
        ``shareable`` (exceptions every rank can rebuild from their message), else a
        :class:`~muarl.faults.RunFailed` naming it; the other ranks wait until rank 0 is done."""
        from muarl.faults import RunFailed

        result: Any = None
        failure: Exception | None = None
        if self.main:
            try:
                result = action()
            except Exception as err:  # shared below, then raised as it was
                failure = err
        shared = failure if failure is None or type(failure) in (*shareable, RunFailed) else \
            RunFailed(f"rank 0 failed: {type(failure).__name__}: {failure}")
        result, outcome = self.broadcast((result, shared))
        if failure is not None:
            raise failure
        if outcome is not None:
            raise outcome
        return result

    def sum(self, value: float) -> float:
        """A number summed over ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t.item())

    def max(self, value: float) -> float:
        """The largest of every rank's ``value``."""
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over ranks (one flat buffer, one collective)."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
            offset += n

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def backend(device_type: str, offload: bool = False) -> str:
    """The process group's backend: gloo on the CPU, NCCL on GPUs; with ``offload`` (``--fsdp-offload``) on GPUs
    both, CPU tensors over gloo beside CUDA tensors over NCCL, because an offloaded run's gradient clipping and
    its gathers for the rollout copy work on CPU tensors, which an NCCL-only group refuses (pytorch#148532)."""
    if device_type != "cuda":
        return "gloo"
    return "cpu:gloo,cuda:nccl" if offload else "nccl"


def setup(device: str | None = None, group: bool = False, offload: bool = False) -> Dist:
    """Join the process group when launched for several processes; pick the device.

    ``device`` None means CUDA when there is one (the rank's own GPU), else the CPU. ``group``: a process
    group even for one process (a sharded run's collectives need one; its checkpoints then load on any
    number of ranks). ``offload``: the group also carries CPU tensors on GPUs (:func:`backend`).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if group and not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend(chosen.type, offload),
                                                 store=torch.distributed.HashStore(), rank=0, world_size=1)
        return Dist(0, 1, chosen)
    from accelerate import PartialState

    cpu = device == "cpu" or not torch.cuda.is_available()
    state = PartialState(cpu=cpu, **({} if cpu else {"backend": backend("cuda", offload)}))
    if not torch.distributed.is_initialized():
        raise RuntimeError("WORLD_SIZE > 1 but no process group could be initialised")
    dev = state.device if state.device.type != "cpu" else torch.device("cpu")
    return Dist(state.process_index, state.num_processes, dev)


def params_digest(model: torch.nn.Module) -> str:
    """A SHA-256 over every parameter's name and exact bytes: equal digests mean identical weights."""
    import hashlib

    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
