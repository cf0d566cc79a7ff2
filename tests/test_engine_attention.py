"""The rollout engine's cascade attention (muarl.attention.shared_prefix_attention): on the CPU the rows' own
part runs in PyTorch's fused flash kernel (cheaper over the left padding of rows shorter than the batch's
widest, which an asynchronous stream's mixed conversation lengths make wide); its output must equal the
separate passes it replaced (the fallback path where the kernel is unavailable) for decode steps, batched
prefills with masked holes, grouped-query heads and rows that do not sit on the shared prefix."""

from __future__ import annotations

import pytest
import torch

import muarl.attention as attention
from muarl.attention import SharedPrefix, shared_prefix_attention


class _Layer:
    layer_idx = 0


@pytest.mark.parametrize("rows,q,size,kv_heads", [(7, 1, 50, 1), (5, 9, 40, 1), (3, 4, 4, 1), (6, 1, 33, 2),
                                                  (4, 5, 21, 2)])
@pytest.mark.parametrize("masked", [True, False])
def test_fused_own_part_equals_the_separate_passes(monkeypatch, rows, q, size, kv_heads, masked):
    torch.manual_seed(rows * 100 + q)
    heads, dim, prefix = 4, 64, 30
    query = torch.randn(rows, heads, q, dim)
    key = torch.randn(rows, kv_heads, size + 10, dim)[:, :, :size]  # a view into a buffer with room, as the engine's
    value = torch.randn(rows, kv_heads, size, dim)
    mask = None
    if masked:  # left padding and holes; every query keeps its own column
        mask = torch.rand(rows, 1, q, size) > 0.4
        mask &= torch.ones(q, size, dtype=torch.bool).tril(size - q)
        mask[:, :, torch.arange(q), size - q + torch.arange(q)] = True
    shared = SharedPrefix(list(range(prefix)), [(torch.randn(kv_heads, prefix, dim), torch.randn(kv_heads, prefix, dim))],
                          torch.tensor([i % 3 != 0 for i in range(rows)]))  # every third row not on the prefix
    kernel, ran = attention._own_part, []
    monkeypatch.setattr(attention, "_own_part", lambda *args: ran.append(kernel(*args)) or ran[-1])
    fused, _ = shared_prefix_attention(_Layer(), query, key, value, mask, scaling=dim ** -0.5, shared_prefix=shared)
    assert ran and ran[0] is not None  # the fused kernel really ran
    calls = []
    monkeypatch.setattr(attention, "_own_part", lambda *args: calls.append(1))  # the kernel unavailable
    separate, _ = shared_prefix_attention(_Layer(), query, key, value, mask, scaling=dim ** -0.5, shared_prefix=shared)
    assert calls  # the fallback really ran
    assert torch.allclose(fused, separate, atol=1e-5), (fused - separate).abs().max()
