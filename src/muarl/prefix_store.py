"""Finished requests' KV caches, kept so a conversation's next request prefills only what it adds.

A chat client such as the LLM user sends its whole history with every turn: the system prompt with the
task, every message so far, and one new agent message. Prefilled afresh, a turn of a 600-token
conversation costs 600 tokens of forward pass to answer 30; a GRPO step's 64 conversations send hundreds of
such turns. The store keeps each finished request's sequence (its ids, the reply's included, and their KV
cache) and lends the one sharing the longest prefix with a new prompt to that request: its cache cut to the
shared part, so only the rest is prefilled. A re-tokenized reply that differs from the sampled tokens
(SmolLM2: 1 conversation in 10 drifts) just shares a shorter prefix.

A lent sequence leaves the store (the engine extends it), and the store keeps at most ``budget_bytes`` of
KV, dropping the least recently used first. Exactness: the reused KV is what a fresh prefill of the same
tokens computes, up to the rounding of a different batch shape.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from muarl.policies.batched_generator import TokenSequence

#: a shared prefix shorter than this is prefilled afresh (a fresh row batches with the other new requests)
MIN_SHARED = 32


def shared_length(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _nbytes(seq: TokenSequence) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in seq.cache or ())


class PrefixStore:
    """Finished sequences by recency, at most ``budget_bytes`` of KV (0: keep none)."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.items: OrderedDict[int, TokenSequence] = OrderedDict()
        self.bytes = 0
        self.reused_tokens = 0  # prompt tokens served from the store instead of prefilled: for tests and logs

    def lend(self, prompt: list[int], generator: Any) -> tuple[TokenSequence, list[int]]:
        """A sequence for ``prompt`` and the ids still to prefill: a stored one's cache cut to the longest
        prefix it shares with ``prompt`` (at least :data:`MIN_SHARED` ids, and one id left to compute the
        next token's logits from), else a fresh sequence and the whole prompt."""
        best, length = None, 0
        for key, seq in self.items.items():
            n = min(shared_length(seq.ids, prompt), seq.cached, len(prompt) - 1)
            if n > length:
                best, length = key, n
        if best is None or length < MIN_SHARED:
            return TokenSequence(generator=generator), list(prompt)
        seq = self.items.pop(best)
        self.bytes -= _nbytes(seq)
        assert seq.cache is not None and not seq.shared
        cache = [(k[:, :, :length], v[:, :, :length]) for k, v in seq.cache]
        self.reused_tokens += length
        return TokenSequence(generator=generator, ids=list(prompt[:length]), cache=cache, started=True), \
            list(prompt[length:])

    def keep(self, seq: TokenSequence) -> None:
        """Store a finished sequence (its own cache, not the engine's shared prefix), then drop the least
        recently used until the store fits its budget."""
        if self.budget <= 0 or seq.cache is None or seq.shared:
            return
        self.items[id(seq)] = seq
        self.bytes += _nbytes(seq)
        while self.bytes > self.budget and self.items:
            _, old = self.items.popitem(last=False)
            self.bytes -= _nbytes(old)
