"""Only what changed: the changed-values form of the in-memory weight sync (``--vllm-weight-sync changed``).

Why: at RL learning rates most of a model's values are the same in the engine's dtype from one update to
the next (an AdamW step of lr 1e-6 moves a float32 master weight by about 1e-6, while a bf16 value near
0.02 changes only when that crosses its rounding step of about 1e-4), so a full broadcast resends bytes
the engine already holds. Here the trainer keeps what it last sent (:class:`SentWeights`, one copy of the
model in the engine's dtype where the link's buffers live) and sends, per tensor, its changed positions
(flat, int32) and their new values, each bucket's sizes in a small header broadcast ahead of its bytes
(so the next bucket is compared while one is on the wire and loading); a tensor with more than
``full_above`` of its values changed goes whole (a large one judged by a sample first, so it is not
compared value by value: on a CPU the comparison costs more than the bytes it saves above about 5%), an
unchanged one sends nothing, and a tied weight (Qwen3-0.6B's LM head, its embeddings' own tensor) is named
as the other's alias, compared and sent once.
The comparison is of the bits, so a value rounded back to what the engine has sends nothing and a NaN is
never "equal".

The engine's side (:class:`Mirror`, in :mod:`muarl.weight_sync.receiver`'s workers) holds the weights as
last received, in host memory, applies each change to them in place, and hands every weight to vLLM's own
reload, as a full sync does: vLLM's layerwise reload does not take a layer given only some of its weights.
Both copies live as long as the link: a new link (a restarted server, a resumed trainer) starts with a
full sync. Imports torch alone (it runs inside a vLLM server's workers).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

from muarl.weight_sync.buckets import INDEX, dtype_name, dtype_of

#: the threshold the bytes set: a change costs 6 bytes a value in bf16 against 2, so at 25% it moves 75% of
#: the whole tensor's
BY_BYTES = 0.25
#: the changed share above which a tensor goes whole, by the link's device type. On a CPU, comparing every
#: value and listing the changes costs more than sending the whole tensor above about 5% changed (Qwen3-0.6B's
#: shape, ``benchmarks/weight_sync.py --sweep``: 1.32x faster at 1%, 0.96x at 5%, 0.78x at 10%;
#: research/benchmarks.md). On a GPU the comparison is cheap: the bytes set it until measured there.
FULL_ABOVE = {"cpu": 0.05, "cuda": BY_BYTES}

#: values sampled from a large tensor to judge, before comparing every value, whether it goes whole
SAMPLE = 4096

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values as integers of the same width: compared, they are equal only where the bits are."""
    return tensor.reshape(-1).view(_BITS[tensor.dtype.itemsize])


class SentWeights:
    """The trainer's record of the values the engine holds (what it last sent, in the wire dtype, on
    ``device``), and the changes against it. ``full_above``: the changed share above which a tensor goes whole
    (default :data:`FULL_ABOVE` for the device's type)."""

    def __init__(self, device: torch.device, full_above: float | None = None):
        self.device = torch.device(device)
        self.full_above = FULL_ABOVE.get(self.device.type, BY_BYTES) if full_above is None else full_above
        self.values: dict[str, torch.Tensor] = {}
        self.changed = 0  # values that differed from the engine's at the last encode
        self.total = 0  # values compared (floating and not) at the last encode
        self.seconds = 0.0  # spent encoding (casting, comparing, gathering) in the last sync
        self.compared = 0  # values compared one by one in the last sync (a tensor judged by its sample is not)
        self._scratch: torch.Tensor | None = None  # the cast of the weight being compared (see _cast)

    @property
    def changed_share(self) -> float:
        """The share of the model's values that changed at the last encode (1.0 at a link's first sync)."""
        return self.changed / self.total if self.total else 0.0

    def plan(self, weights: Iterable[tuple[str, torch.Tensor]], wire: torch.dtype) -> list[dict[str, Any]]:
        """The plan's entries of ``weights`` (``{"name", "dtype", "shape"}``, known before any comparison, so
        the plan can go ahead of the bytes), a tied weight's marked ``send`` "alias" with ``of``, the earlier
        name of its tensor. Starts a sync's count of changed values."""
        self.changed = self.total = self.compared = 0
        self.seconds = 0.0
        seen: dict[tuple[Any, ...], str] = {}  # a tensor's storage and view -> the first name it went by
        entries = []
        for name, tensor in weights:
            dtype = wire if tensor.is_floating_point() else tensor.dtype
            entry: dict[str, Any] = {"name": name, "dtype": dtype_name(dtype), "shape": list(tensor.shape)}
            view = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            if view in seen:  # tied: the engine's copy of it is the other name's
                entry.update(send="alias", of=seen[view])
            else:
                seen[view] = name
            entries.append(entry)
        return entries

    def encode(self, entry: dict[str, Any], tensor: torch.Tensor) -> tuple[str, int, list[torch.Tensor]]:
        """(send, count, parts) of one planned weight (not an alias): "full" (parts: the tensor in the wire
        dtype), "changed" (``count`` positions; parts: flat positions, new values) or "same" (no parts). The
        record takes the new values as each is encoded: a sync that fails must end the link (and with it this
        record), as :class:`~muarl.weight_sync.link.WeightLink` does. A part may be the record itself (sent
        before the next encode changes it)."""
        began = time.perf_counter()
        try:
            return self._encode(entry["name"], tensor.detach(), dtype_of(entry["dtype"]))
        finally:
            self.seconds += time.perf_counter() - began

    def _encode(self, name: str, tensor: torch.Tensor, dtype: torch.dtype) -> tuple[str, int, list[torch.Tensor]]:
        old = self.values.get(name)
        self.total += tensor.numel()
        if old is None or old.shape != tensor.shape or old.dtype != dtype or tensor.numel() >= 2 ** 31:
            # a copy even where the dtype and device are the trainer's (a float32 engine, a bf16 rollout
            # copy): the record must keep what was sent, not follow the live tensor
            self.values[name] = new = tensor.to(device=self.device, dtype=dtype,
                                                memory_format=torch.contiguous_format, copy=True)
            self.changed += new.numel()
            return "full", new.numel(), [new]
        # cast into one reused buffer, compared with the record, and only what changed written back: no
        # model-sized allocation per sync (its page faults cost as much as the comparison on a CPU)
        new = self._cast(tensor, old)
        estimate = self._sampled_share(new, old)
        if estimate is not None and estimate > self.full_above:  # whole, without comparing every value
            old.copy_(new)
            self.changed += round(estimate * new.numel())
            return "full", old.numel(), [old]
        positions = torch.ne(_bits(new), _bits(old)).nonzero().reshape(-1)
        count = positions.numel()
        self.changed += count
        self.compared += new.numel()
        if count == 0:
            return "same", 0, []
        if count > self.full_above * new.numel():
            old.copy_(new)
            return "full", old.numel(), [old]
        values = new.reshape(-1)[positions]
        old.view(-1)[positions] = values
        return "changed", count, [positions.to(INDEX), values]

    def _sampled_share(self, new: torch.Tensor, old: torch.Tensor) -> float | None:
        """The changed share of about :data:`SAMPLE` values at an odd stride through a large tensor (None for
        a small one): comparing every value and listing the changes costs more than sending the tensor whole
        above :data:`FULL_ABOVE`, so such a tensor is sent whole on its sample's word."""
        if self.full_above >= 1.0 or new.numel() < 16 * SAMPLE:
            return None
        stride = (new.numel() // SAMPLE) | 1
        return float(torch.ne(_bits(new)[::stride], _bits(old)[::stride]).float().mean())

    def _cast(self, tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``tensor`` in ``like``'s dtype, shape and device, in a buffer reused from weight to weight."""
        if self._scratch is None or self._scratch.dtype != like.dtype or self._scratch.numel() < like.numel():
            self._scratch = None  # freed before the larger one is made
            self._scratch = torch.empty(like.numel(), dtype=like.dtype, device=self.device)
        new = self._scratch[:like.numel()].view(like.shape)
        new.copy_(tensor)
        return new


#: how a header names each entry's send (:func:`header`, :func:`read_header`)
SENDS = ("full", "changed", "same", "alias")


def header(sends: list[tuple[str, int]]) -> torch.Tensor:
    """One bucket's (send, count) per entry as the int64 tensor broadcast ahead of its bytes: the changes'
    sizes are known only once compared, so each bucket says its own, and the trainer compares the next
    bucket while this one is on the wire and loading."""
    return torch.tensor([[SENDS.index(send), count] for send, count in sends], dtype=torch.int64).reshape(-1)


def read_header(received: torch.Tensor, bucket: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bucket's entries with their ``send`` (and ``count``) from its received header."""
    pairs = received.reshape(-1, 2).tolist()
    if len(pairs) != len(bucket):
        raise ValueError(f"a header of {len(pairs)} entries for a bucket of {len(bucket)}")
    entries = []
    for entry, (code, count) in zip(bucket, pairs, strict=True):
        entries.append({**entry, "send": SENDS[code], **({"count": count} if SENDS[code] == "changed" else {})})
    return entries


class Mirror:
    """The engine's side: the weights as last received (host memory, wire dtype), each change applied in
    place, every weight handed on to the model's reload in the plan's order."""

    def __init__(self) -> None:
        self.values: dict[str, torch.Tensor] = {}

    def apply(self, entry: dict[str, Any], parts: list[torch.Tensor]) -> torch.Tensor:
        """The weight ``entry`` names after its parts are applied (a view of the mirror: the caller copies
        it into the model). A change to a weight this end never received whole is a ValueError naming it
        (the trainer then ends the link and the next one starts with a full sync)."""
        name, send = entry["name"], entry.get("send", "full")
        if send == "alias":
            if entry["of"] not in self.values:
                raise ValueError(f"weight {name}: an alias of {entry['of']}, which this worker does not hold")
            return self.values[entry["of"]]
        if send == "full":
            held = self.values.get(name)
            if held is not None and held.shape == parts[0].shape and held.dtype == parts[0].dtype:
                held.copy_(parts[0])
            else:
                self.values[name] = held = parts[0].to("cpu", copy=True)
            return held
        held = self.values.get(name)
        if held is None or list(held.shape) != entry["shape"]:
            raise ValueError(f"weight {name}: a change to a weight this worker has not received whole "
                             "(a new link starts with a full sync)")
        if send == "changed":
            positions, values = parts
            held.view(-1)[positions.to("cpu", torch.long)] = values.to("cpu")
        return held
