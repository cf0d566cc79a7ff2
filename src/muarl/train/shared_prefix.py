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
in the remainder). Below :data:`MIN_PREFIX` tokens the plain path is as good and is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

#: the attention implementation that attends to a recorded prefix (plain SDPA when none is given)
ATTENTION = "muarl_prefix_scoring"
#: shorter common prefixes are not worth a separate forward pass
MIN_PREFIX = 16

KV = list[tuple[torch.Tensor, torch.Tensor]]


def prefix_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     prefix_kv: KV | None = None, record_kv: KV | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention that can record this layer's keys and values, or prepend a recorded prefix's.

    ``record_kv``: a list this layer appends its (keys, values) to (the prefix pass). ``prefix_kv``: per
    layer, [1, kv_heads, prefix, dim] keys and values every row attends to in full before its own
    tokens, which follow the prefix (causal attention aligned to the bottom right). Rows are
    right-padded, so no padding mask is needed: a real token never sees the padding after it. Each row
    attends to [prefix ; own] in one fused call (the rollout engine's cascade attention, which reads the
    prefix once for all rows, is faster for a few new tokens per row but slower for whole conversations,
    and its log-sum-exp has no gradient); the prefix's gradient is the sum over rows.
    """
    if record_kv is not None:
        record_kv.append((key, value))
    if prefix_kv is not None:
        kp, vp = prefix_kv[module.layer_idx]
        if query.device.type == "cpu" and dropout == 0.0:
            out = _TwoPartAttention.apply(query, kp, vp, key, value,
                                          scaling if scaling is not None else query.shape[-1] ** -0.5)
            return out.transpose(1, 2).contiguous(), None
        rows = query.shape[0]
        key = torch.cat([kp.expand(rows, -1, -1, -1), key], dim=2)
        value = torch.cat([vp.expand(rows, -1, -1, -1), value], dim=2)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: one copy of the kv heads per query head
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    q, k = query.shape[2], key.shape[2]
    p = dropout if module.training else 0.0
    if k == q:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=p, is_causal=True,
                                                               scale=scaling)
    else:  # [prefix ; own] with causal attention aligned to the bottom right, which fused kernels take
        from torch.nn.attention.bias import causal_lower_right

        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=causal_lower_right(q, k),
                                                               dropout_p=p, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


_FLASH = "_scaled_dot_product_flash_attention_for_cpu"


class _TwoPartAttention(torch.autograd.Function):
    """Attention of each row's queries over [shared prefix ; the row's own keys] as two fused CPU calls.

    Part one: every row's queries against the prefix, no mask, with the rows folded into the query length
    so the prefix is read once for the whole batch. Part two: each row causally against its own keys.
    The two outputs are combined with their log-sum-exps into the joint softmax. The backward is flash
    attention's backward run on each part with the *joint* output and log-sum-exp, which is exactly the
    gradient of the joint softmax restricted to that part (the same identity ring attention uses); the
    query's gradient is the sum of the two. Shapes: query [rows, heads, q, dim]; prefix keys and values
    [1, kv_heads, n, dim]; own keys and values [rows, kv_heads, q, dim].
    """

    @staticmethod
    def _fold(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
        """[rows, heads, q, dim] -> [1, kv_heads, rows * group * q, dim]: rows and query heads as length."""
        rows, heads, q, dim = query.shape
        group = heads // kv_heads
        return query.reshape(rows, kv_heads, group * q, dim).transpose(0, 1).reshape(1, kv_heads, -1, dim)

    @staticmethod
    def _unfold(t: torch.Tensor, rows: int, heads: int, q: int) -> torch.Tensor:
        kv_heads = t.shape[1]
        return t.reshape(kv_heads, rows, (heads // kv_heads) * q, -1).transpose(0, 1).reshape(rows, heads, q, -1)

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, scale: float) -> torch.Tensor:
        rows, heads, q, _ = query.shape
        kv_heads = kp.shape[1]
        flash = getattr(torch.ops.aten, _FLASH)
        folded = _TwoPartAttention._fold(query, kv_heads).contiguous()
        out_pre, lse_pre = flash(folded, kp, vp, 0.0, False, scale=scale)
        out_pre = _TwoPartAttention._unfold(out_pre, rows, heads, q)
        lse_pre = _TwoPartAttention._unfold(lse_pre.unsqueeze(-1), rows, heads, q)
        groups = heads // kv_heads
        own_k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
        own_v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
        out_own, lse_own = flash(query, own_k, own_v, 0.0, True, scale=scale)
        lse = torch.logaddexp(lse_pre, lse_own.unsqueeze(-1))
        out = (lse_pre - lse).exp() * out_pre + (lse_own.unsqueeze(-1) - lse).exp() * out_own
        ctx.save_for_backward(query, kp, vp, own_k, own_v, out, lse)
        ctx.scale, ctx.groups = scale, groups
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        query, kp, vp, own_k, own_v, out, lse = ctx.saved_tensors
        rows, heads, q, _ = query.shape
        kv_heads = kp.shape[1]
        backward = getattr(torch.ops.aten, _FLASH + "_backward")
        fold = _TwoPartAttention._fold
        grad = grad.contiguous()
        gq_pre, gkp, gvp = backward(fold(grad, kv_heads).contiguous(), fold(query, kv_heads).contiguous(), kp, vp,
                                    fold(out, kv_heads).contiguous(), fold(lse, kv_heads).squeeze(-1).contiguous(),
                                    0.0, False, scale=ctx.scale)
        gq_own, gk, gv = backward(grad, query, own_k, own_v, out, lse.squeeze(-1).contiguous(), 0.0, True,
                                  scale=ctx.scale)
        gq = _TwoPartAttention._unfold(gq_pre, rows, heads, q) + gq_own
        if ctx.groups > 1:  # the repeated kv heads' gradients add up
            gk = gk.view(rows, kv_heads, ctx.groups, q, -1).sum(2)
            gv = gv.view(rows, kv_heads, ctx.groups, q, -1).sum(2)
        return gq, gkp, gvp, gk, gv, None


@contextmanager
def prefix_scoring(lm: Any) -> Iterator[None]:
    """Run ``lm`` with :func:`prefix_attention` inside the block, restoring its own attention after."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, prefix_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    before = lm.config._attn_implementation
    lm.set_attn_implementation(ATTENTION)
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
