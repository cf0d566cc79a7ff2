"""Shared-prefix scoring: the system turn every episode starts with, computed once per update, not per sequence.

Every episode of a domain opens with the same system turn (policy text and tool schemas: about half of
the demo's tokens, several thousand in tau2-bench's domains), and the members of a GRPO group often
share the first user message too. Scoring a batch sequence by sequence recomputes that prefix, forward
and backward, once per sequence. Here it runs once: one forward over the prefix records each layer's keys
and values, then every sequence's remainder runs with its positions shifted past the prefix and attends
to [prefix keys ; its own keys] (causal among its own). Gradients from every sequence flow back into the
one prefix computation, so the loss, the log-probs and every parameter's gradient equal the plain
per-sequence computation's (to float tolerance; tests/test_shared_prefix.py); it is the idea of Prefix
Grouper (arXiv 2506.05433), applied to the prefix the whole batch shares.

The prefix is the longest common token prefix of the batch, cut one token before the first scored
position of any sequence (a scored token's prediction comes from the position before it, which must be
in the remainder). Below :data:`MIN_PREFIX` tokens the plain path is as good and is used. The attention
kernel is :func:`muarl.attention.prefix_attention` (beside the rollout engine's and packing's, and why
they differ).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from muarl.attention import KV, PREFIX_SCORING, use_kernel

#: shorter common prefixes are not worth a separate forward pass
MIN_PREFIX = 16


@contextmanager
def prefix_scoring(lm: Any) -> Iterator[None]:
    """Run ``lm`` with :func:`~muarl.attention.prefix_attention` inside the block, restoring its own
    attention after."""
    before = use_kernel(lm, PREFIX_SCORING)
    try:
        yield
    finally:
        lm.set_attn_implementation(before)


def common_prefix(sequences: Sequence[Sequence[int]], masks: Sequence[Sequence[int]] | None) -> int:
    """How many leading tokens every sequence shares and none scores (cut one before the first target)."""
    first = min(len(s) for s in sequences)
    if masks is not None:
        first = min([first, *(next((p for p, m in enumerate(mask) if m and p >= 1), len(mask)) for mask in masks)])
    length = 0
    head = sequences[0]
    while length < first and all(s[length] == head[length] for s in sequences):
        length += 1
    return max(0, min(length, first - 1))


@dataclass
class Prefix:
    """A recorded shared prefix: its tokens and, per layer, keys and values of shape [1, kv_heads, n, dim]."""

    tokens: list[int]
    kv: KV

    def __len__(self) -> int:
        return len(self.tokens)


def record_prefix(lm: Any, tokens: list[int]) -> Prefix:
    """One forward over ``tokens`` that keeps every layer's keys and values (with their autograd graph,
    when gradients are enabled: the sequences' gradients flow back through them into the weights)."""
    device = next(lm.parameters()).device
    kv: KV = []
    with prefix_scoring(lm):
        lm.model(input_ids=torch.tensor([tokens], device=device), record_kv=kv)
    return Prefix(tokens, kv)


def hidden_after_prefix(lm: Any, prefix: Prefix, rows: list[list[int]]) -> torch.Tensor:
    """Last hidden states [rows, longest remainder, hidden] of each row's tokens, which follow ``prefix``."""
    device = next(lm.parameters()).device
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
    positions = torch.arange(len(prefix), len(prefix) + width).unsqueeze(0).expand(len(rows), -1)
    with prefix_scoring(lm):
        return lm.model(input_ids=ids.to(device), position_ids=positions.to(device),
                        prefix_kv=prefix.kv).last_hidden_state


class DetachedPrefix:
    """A recorded prefix whose keys and values are leaves: several micro-batches use it, each backward
    adds its share of their gradient, and :meth:`backward` sends the sum through the prefix pass once."""

    def __init__(self, prefix: Prefix):
        self.source = prefix
        self.leaves = Prefix(prefix.tokens, [(k.detach().requires_grad_(k.requires_grad),
                                              v.detach().requires_grad_(v.requires_grad)) for k, v in prefix.kv])

    def backward(self) -> None:
        """Backpropagate the gradients the micro-batches left on the leaves through the prefix pass."""
        outputs, grads = [], []
        for (k, v), (lk, lv) in zip(self.source.kv, self.leaves.kv, strict=True):
            for out, leaf in ((k, lk), (v, lv)):
                if out.requires_grad and leaf.grad is not None:
                    outputs.append(out)
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)
