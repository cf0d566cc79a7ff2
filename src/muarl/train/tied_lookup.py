"""The embedding lookup of a sharded model's tied weight, whose gradient rows are added into the head's gradient
in place: one vocabulary-sized gradient at the backward's peak, not three.

A tied weight (Qwen3-0.6B's 151,936 x 1,024 embeddings, also its output head) gets its gradient in two parts:
the head's, dense and vocabulary-sized, which arrives first in backward, and the lookup's, which arrives
last and touches only the rows of the looked-up tokens. Left to autograd, the two parts meet in the
parameter's input buffer: a dense lookup gradient is a second table, and their sum a third (autograd adds
out of place when the dense part came first, which it always does here), all while the gathered weight is
still held. Here the lookup is not an edge into the weight at all: its backward adds its rows into the
weight's ``.grad`` in place, which autograd has by then filled with the head's gradient (an
``AccumulateGrad`` node runs as soon as it is ready, and the head's backward is the weight's only edge). The
weight's gradient is the same sum; FSDP2 reads it after the whole backward (the root's post-backward), as
before. Measured by ``benchmarks/fsdp_startup_memory.py`` (research/benchmarks.md).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F


class _RowsIntoGrad(torch.autograd.Function):
    """``F.embedding(ids, weight)`` whose backward adds the rows of ``grad`` into ``weight.grad``. ``anchor``
    is the one input that requires a gradient (a 0-d leaf that never receives one), so that the backward
    runs; ``embeddings`` is passed as a module, not a tensor, so autograd draws no edge into its weight."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, ids: torch.Tensor, embeddings: torch.nn.Embedding) -> torch.Tensor:
        ctx.weight, ctx.padding_idx = embeddings.weight, embeddings.padding_idx
        ctx.save_for_backward(ids)
        return F.embedding(ids, embeddings.weight.detach(), embeddings.padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        rows = grad.reshape(-1, grad.shape[-1]).to(weight.dtype)
        flat = ids.reshape(-1)
        if ctx.padding_idx is not None:  # nn.Embedding's padding row never receives a gradient
            rows = rows * (flat != ctx.padding_idx).unsqueeze(-1).to(rows.dtype)
        if weight.grad is None:  # a backward that did not go through the head: the lookup's part alone
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, flat, rows)
        return None, None, None


def _forward(self: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled() or not self.weight.requires_grad:
        return F.embedding(ids, self.weight, self.padding_idx)
    return _RowsIntoGrad.apply(self.muarl_anchor, ids, self)


def lookup_into_head_grad(embeddings: torch.nn.Module) -> None:
    """Make a tied ``nn.Embedding``'s lookup add its gradient into the weight's (the head's) in place. Only a
    plain lookup (no ``max_norm``, no ``scale_grad_by_freq``, dense) is changed; any other is left as it is."""
    plain = (isinstance(embeddings, torch.nn.Embedding) and embeddings.max_norm is None
             and not embeddings.scale_grad_by_freq and not embeddings.sparse)
    if not plain or not embeddings.weight.requires_grad:
        return
    embeddings.muarl_anchor = torch.zeros((), requires_grad=True)
    embeddings.forward = types.MethodType(_forward, embeddings)
