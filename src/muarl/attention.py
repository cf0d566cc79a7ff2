"""muarl's three attention kernels, each registered with transformers under its own name.

All three compute exact softmax attention; they differ in the layout they are given and in what they must
differentiate, and each is fast only at its own job, so none stands in for another:

- :func:`shared_prefix_attention` (``muarl_shared_prefix``, the rollout engine,
  :mod:`muarl.policies.batched_generator`): a few new tokens per row over left-padded caches with masked
  holes, plus one prefix (the system turn) that every row of the batch reads once per decode step
  (cascade attention). No gradient is needed, so the prefix part and the row's own part are combined
  by their log-sum-exps.
- :func:`prefix_attention` (``muarl_prefix_scoring``, GRPO's scoring, :mod:`muarl.train.shared_prefix`):
  whole right-padded conversations after a recorded prefix, whose keys and values must receive the
  gradient of every row. It attends to [prefix ; own] in one fused causal call (on the CPU a two-part
  flash kernel with its own backward, :class:`_TwoPartAttention`), and records a layer's keys and values
  on the prefix pass.
- :func:`segment_attention` (``muarl_segments``, SFT's packed rows, :mod:`muarl.train.packing`): several
  conversations per row, each causal on its own: one fused SDPA call per conversation, no prefix and no
  [length, length] mask.

They sit in one module so their differences read side by side; the code is what its callers ran before
(moved, not changed), so each gives the numbers it gave.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]

#: transformers' names for the three kernels (``config._attn_implementation``)
SHARED_PREFIX = "muarl_shared_prefix"
PREFIX_SCORING = "muarl_prefix_scoring"
SEGMENTS = "muarl_segments"


def use_kernel(lm: Any, name: str) -> str:
    """Register the kernel ``name`` with transformers (with SDPA's mask builder) and switch ``lm`` to it;
    returns the attention implementation ``lm`` had, so a caller can switch back."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(name, KERNELS[name])
    AttentionMaskInterface.register(name, sdpa_mask)
    before = lm.config._attn_implementation
    lm.set_attn_implementation(name)
    return before


@functools.cache
def unattended_is_zero(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether SDPA on ``device`` in ``dtype`` gives a query that may attend to no key a zero output, with a
    boolean mask and with an additive one (PyTorch 2.5 and later), rather than NaN. Where it does, a batch of
    rows padded on the left (a padding token sees nothing) computes exactly what each row computes alone;
    where not, the NaN would reach every row through the padding's keys."""
    # a decode-like shape (rows, heads, queries, head_dim 64), so the kernel SDPA picks is the one it picks there
    query, key, value = (torch.ones(2, 4, 4, 64, device=device, dtype=dtype) for _ in range(3))
    keep = torch.ones(4, 4, dtype=torch.bool, device=device).tril().expand(2, 1, 4, 4).clone()
    keep[0, :, :2] = False  # row 0's first two queries are padding: they see no key at all
    bias = torch.zeros(keep.shape, device=device, dtype=dtype).masked_fill(~keep, float("-inf"))
    for mask in (keep, bias):
        try:
            out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        except RuntimeError:
            return False
        if not bool(torch.isfinite(out).all()) or bool(out[0, :, :2].abs().sum() != 0):
            return False
    return True


# -- the rollout engine: cascade attention over a shared prefix ----------------------------------------------
@dataclass
class SharedPrefix:
    """KV of a prompt prefix that many sequences share (the system turn: policy + tool schemas).

    Rows that use it keep only their own tokens in their cache; attention reads the prefix once per step
    for the whole batch instead of once per row ("cascade" attention). ``use`` marks the rows (of the
    current forward pass) that sit on the prefix.
    """

    tokens: list[int]
    kv: KV  # per layer: keys, values of shape [kv_heads, prefix_length, head_dim]
    use: torch.Tensor | None = None


def shared_prefix_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            shared_prefix: SharedPrefix | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over [shared prefix ; each row's own cache], combined exactly with a joint softmax.

    Without a shared prefix this is plain SDPA. ``query`` is [rows, heads, q, dim]; ``key`` / ``value``
    hold each row's own tokens; ``attention_mask`` (bool, True = attend) covers those only.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kp, vp = shared_prefix.kv[module.layer_idx]
    rows, heads, q, dim = query.shape
    kv_heads, size = kp.shape[0], key.shape[2]
    group = heads // kv_heads
    # grouped-query layout: [rows, kv_heads, group*q, dim] is a view of [rows, heads, q, dim], so the
    # kv heads never need repeating
    query = (query * (scaling if scaling is not None else dim ** -0.5)).reshape(rows, kv_heads, group * q, dim)

    def kv_major(t: torch.Tensor) -> torch.Tensor:  # [rows, kv_heads, n, x] -> [kv_heads, rows*n, x]
        return t.transpose(0, 1).reshape(kv_heads, -1, t.shape[-1])

    def row_major(t: torch.Tensor) -> torch.Tensor:  # the inverse
        return t.view(kv_heads, rows, group * q, t.shape[-1]).transpose(0, 1)

    # the big part: every row and query against the prefix, one pass per kv head, so the prefix is read
    # once for the whole batch; it yields the partial output and its log-sum-exp
    out_pre, lse_pre = _prefix_part(kv_major(query), kp, vp)  # [kv_heads, n, dim], [kv_heads, n, 1]
    if shared_prefix.use is not None and not bool(shared_prefix.use.all()):
        lse_pre.view(kv_heads, rows, group * q).masked_fill_(~shared_prefix.use.view(1, rows, 1), float("-inf"))
    # the small part: each row against its own tokens; on the CPU in the fused flash kernel, combined with
    # the prefix's part by their log-sum-exps (the padding of rows shorter than the batch's widest costs
    # a fraction of the separate passes below)
    fused = _own_part(query, key, value, attention_mask, q) if query.device.type == "cpu" else None
    if fused is not None:
        out_own, lse_own = fused
        lse_pre = row_major(lse_pre)
        top = torch.maximum(lse_pre, lse_own)
        weight_pre, weight_own = (lse_pre - top).exp(), (lse_own - top).exp()
        out = (weight_pre * row_major(out_pre) + weight_own * out_own) / (weight_pre + weight_own)
        return out.reshape(rows, heads, q, dim).transpose(1, 2).contiguous(), None
    own = torch.matmul(query, key.transpose(-1, -2)).view(rows, kv_heads, group, q, size)
    if attention_mask is not None:
        own = own.masked_fill(~attention_mask.bool().view(rows, 1, 1, q, size), float("-inf"))
    elif q > 1:  # causal among the new tokens, which are the last q of this row's own tokens
        own = own.masked_fill(~torch.ones(q, size, dtype=torch.bool, device=query.device).tril(size - q),
                              float("-inf"))
    own = own.view(rows, kv_heads, group * q, size)
    # one softmax over both parts
    lse_pre = row_major(lse_pre)
    top = torch.maximum(lse_pre, own.amax(-1, keepdim=True))
    weight_pre = (lse_pre - top).exp()
    own = (own - top).exp()
    total = weight_pre + own.sum(-1, keepdim=True)
    out = (weight_pre * row_major(out_pre) + torch.matmul(own, value)) / total
    return out.reshape(rows, heads, q, dim).transpose(1, 2).contiguous(), None


def _own_part(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
              q: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's (scaled, grouped) queries [rows, kv_heads, group*q, dim] against its own keys and values
    [rows, kv_heads, size, dim] in PyTorch's fused CPU flash kernel: (output, log-sum-exp [.., 1]), or None
    where the kernel is unavailable. The boolean mask (or, without one, causal among the last q columns)
    becomes an additive one, shared by a row's query heads."""
    rows, _, n, _ = query.shape
    size, group = key.shape[2], n // q
    if attention_mask is not None:
        keep: torch.Tensor | None = attention_mask.bool().reshape(-1, 1, q, size)
    elif q > 1:
        keep = torch.ones(q, size, dtype=torch.bool, device=query.device).tril(size - q).view(1, 1, q, size)
    else:
        keep = None
    bias = None
    if keep is not None:
        bias = torch.zeros(keep.shape, dtype=query.dtype, device=query.device).masked_fill_(~keep, float("-inf"))
        b = bias.shape[0]
        bias = bias.view(b, 1, 1, q, size).expand(b, 1, group, q, size).reshape(b, 1, n, size).expand(rows, 1, n, size)
    try:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, False,
                                                                               attn_mask=bias, scale=1.0)
    except (RuntimeError, AttributeError):
        return None
    return out, lse.unsqueeze(-1)


def _prefix_part(query: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of [heads, n, dim] queries over a [heads, length, dim] prefix: (output, logsumexp).

    Uses PyTorch's fused CPU flash-attention kernel, which returns the log-sum-exp the combination needs;
    falls back to plain matmuls where that kernel is unavailable (other devices, other torch versions).
    """
    if query.device.type == "cpu":
        try:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query.unsqueeze(0), kp.unsqueeze(0), vp.unsqueeze(0), 0.0, False, scale=1.0)
            return out[0], lse[0].unsqueeze(-1)
        except (RuntimeError, AttributeError):
            pass
    scores = torch.matmul(query, kp.transpose(-1, -2))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul((scores - lse).exp(), vp), lse


# -- GRPO's scoring: [recorded prefix ; own] with gradients into the prefix ----------------------------------
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


# -- SFT's packed rows: one causal call per conversation -----------------------------------------------------
def segment_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      segments: list[list[tuple[int, int]]] | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention inside each conversation of a packed row, one fused SDPA call per conversation.

    Exact like the block-diagonal mask, but never builds the [length, length] mask: SDPA takes its fused
    causal kernel, so memory is linear in the row and the cost is the sum of squared conversation
    lengths, not the squared row length (the "varlen" idea of flash-attention, written with stock
    PyTorch so it runs on the CPU too). ``segments`` holds each row's (start, end) spans. Without it
    (generation, unpacked rows) this is the attention the model would otherwise use.
    """
    if segments is None:
        if kwargs.get("shared_prefix") is not None:  # the rollout engine's cascade attention
            return shared_prefix_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: one copy of the kv heads per query head
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    p = dropout if module.training else 0.0
    rows = []
    for b, spans in enumerate(segments):
        parts = [torch.nn.functional.scaled_dot_product_attention(
            query[b:b + 1, :, s:e], key[b:b + 1, :, s:e], value[b:b + 1, :, s:e], dropout_p=p, is_causal=True,
            scale=scaling) for s, e in spans]
        tail = query.shape[2] - (spans[-1][1] if spans else 0)
        if tail:  # padding after the row's last conversation: its output is never used
            parts.append(query.new_zeros(1, query.shape[1], tail, value.shape[-1]))
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows).transpose(1, 2).contiguous(), None


KERNELS: dict[str, Callable[..., tuple[torch.Tensor, None]]] = {
    SHARED_PREFIX: shared_prefix_attention, PREFIX_SCORING: prefix_attention, SEGMENTS: segment_attention,
}
