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

The process group waits :func:`group_timeout` for a collective (:data:`GROUP_TIMEOUT_S`, two hours, unless
``MUARL_DIST_TIMEOUT`` gives seconds), not torch's default (NCCL's 10 minutes): ranks wait in a collective
for rank 0's rollouts under ``--max-staleness`` and for the slowest rank's episodes every step, longer than
10 minutes on a real task, and NCCL's watchdog would kill the run for it.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: how long a rank waits in a collective before the group gives up: longer than any step's rollouts or
#: update (NCCL's own default, 10 minutes, is shorter than a step's episodes on a real task)
GROUP_TIMEOUT_S = 2 * 3600.0
#: the environment variable that sets it, in seconds
GROUP_TIMEOUT_ENV = "MUARL_DIST_TIMEOUT"


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


def group_timeout() -> datetime.timedelta:
    """How long the process group waits for a collective: ``MUARL_DIST_TIMEOUT`` seconds, else
    :data:`GROUP_TIMEOUT_S` (two hours). A wrong value is refused in one line naming the variable."""
    value = os.environ.get(GROUP_TIMEOUT_ENV, "").strip()
    if not value:
        return datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{GROUP_TIMEOUT_ENV} must be a number of seconds above 0, not {value!r}")
    return datetime.timedelta(seconds=seconds)


def compute_device(model: Any, dist: Dist | None = None) -> torch.device:
    """The device ``model``'s forwards compute on, where their inputs and autocast go: the run's, ``dist.device``
    (what :func:`setup` chose), when ``dist`` is given; else its first parameter's (a model used outside a run
    computes where it sits). In a run never the parameters': under ``--fsdp-offload`` they stay in CPU memory
    while FSDP gathers them onto the GPU for every forward."""
    if dist is not None:
        return dist.device
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def setup(device: str | None = None, group: bool = False, offload: bool = False) -> Dist:
    """Join the process group when launched for several processes; pick the device.

    ``device`` None means CUDA when there is one (the rank's own GPU), else the CPU. ``group``: a process
    group even for one process (a sharded run's collectives need one; its checkpoints then load on any
    number of ranks). ``offload``: the group also carries CPU tensors on GPUs (:func:`backend`). The group
    waits :func:`group_timeout` for a collective.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    timeout = group_timeout()
    if world <= 1:
        chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if group and not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend(chosen.type, offload), store=torch.distributed.HashStore(),
                                                 rank=0, world_size=1, timeout=timeout)
        return Dist(0, 1, chosen)
    from accelerate import PartialState

    cpu = device == "cpu" or not torch.cuda.is_available()
    state = PartialState(cpu=cpu, timeout=timeout, **({} if cpu else {"backend": backend("cuda", offload)}))
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
