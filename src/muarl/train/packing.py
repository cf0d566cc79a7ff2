"""Sequence packing: several conversations per row, each attending only to itself.

Padding every conversation to the longest in a batch wastes compute on pad tokens; packing fills rows
with whole conversations (first-fit decreasing), resets position ids at each conversation's start and
builds a block-diagonal causal mask, so each token sees exactly what it would see alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from muarl.attention import SEGMENTS, use_kernel
from muarl.train.data import Example


@dataclass
class Batch:
    """Model inputs for one forward pass, and the mask of tokens whose prediction has loss."""

    input_ids: torch.Tensor  # [rows, length]
    position_ids: torch.Tensor  # [rows, length]
    segment: torch.Tensor  # [rows, length] long: which conversation of the row a token is in, -1 on padding
    loss_mask: torch.Tensor  # [rows, length] float, 1 where the token is a target

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device``."""
        return Batch(*(t.to(device) for t in (self.input_ids, self.position_ids, self.segment, self.loss_mask)))

    @property
    def real(self) -> torch.Tensor:
        """[rows, length] bool, False on padding."""
        return self.segment >= 0

    @property
    def attention_mask(self) -> torch.Tensor:
        """[rows, 1, length, length] bool block-diagonal causal mask, True = may attend.

        Built only when asked for (the dense-mask path, kept for comparison): segment attention and
        unpacked rows never need it, and it is quadratic in the row length.
        """
        width = self.segment.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=self.segment.device).tril()
        same = (self.segment.unsqueeze(2) == self.segment.unsqueeze(1)) & (self.segment.unsqueeze(2) >= 0)
        # a padding position attends to itself only, so no softmax row is empty
        eye = torch.eye(width, dtype=torch.bool, device=self.segment.device)
        return ((same & causal) | eye).unsqueeze(1)

    @property
    def real_tokens(self) -> int:
        return int(self.real.sum())

    @property
    def padding_fraction(self) -> float:
        return 1 - self.real_tokens / self.input_ids.numel()


def plan_rows(lengths: list[int], max_len: int) -> list[list[int]]:
    """Group example indices into rows of at most ``max_len`` tokens (first-fit decreasing)."""
    too_long = [n for n in lengths if n > max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} example(s) longer than max_len={max_len} (longest {max(too_long)}); "
                         "raise max_len or drop them")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            rows.append([i])
            room.append(max_len - lengths[i])
        else:
            rows[slot].append(i)
            room[slot] -= lengths[i]
    return rows


def collate(examples: list[Example], rows: list[list[int]], pad_id: int) -> Batch:
    """Build the tensors for ``rows`` of examples (one example per row gives plain padding)."""
    width = max(sum(len(examples[i]) for i in row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    segment = torch.full((len(rows), width), -1, dtype=torch.long)
    loss = torch.zeros((len(rows), width))
    for r, row in enumerate(rows):
        start = 0
        for k, i in enumerate(row):
            ex = examples[i]
            end = start + len(ex)
            ids[r, start:end] = torch.tensor(ex.ids)
            positions[r, start:end] = torch.arange(len(ex))
            segment[r, start:end] = k
            loss[r, start:end] = torch.tensor(ex.mask, dtype=torch.float)
            start = end
    return Batch(ids, positions, segment, loss)


def _use_segment_attention(lm: Any) -> None:
    if lm.config._attn_implementation != SEGMENTS:
        use_kernel(lm, SEGMENTS)


def spans(batch: Batch) -> list[list[tuple[int, int]]]:
    """Each row's conversations as (start, end) spans, from the restarts of the position ids."""
    out = []
    for positions, real in zip(batch.position_ids.tolist(), batch.real.tolist(), strict=True):
        end = sum(real)
        starts = [i for i in range(end) if positions[i] == 0]
        out.append(list(zip(starts, starts[1:] + [end], strict=True)))
    return out


def token_loss(model: torch.nn.Module, batch: Batch, varlen: bool = True) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross-entropies over target tokens, and how many there were.

    A target is a token with loss mask 1; its prediction comes from the previous position, which always
    belongs to the same conversation (a conversation's first token is never a target). Packed rows use
    :func:`~muarl.attention.segment_attention` (``varlen=False``: the dense block-diagonal mask instead,
    for comparison).
    """
    from muarl.models import causal_lm
    from muarl.train.sharding import decoder

    lm = causal_lm(model)
    # One conversation per row (right-padded) needs no mask at all: causal attention never lets a real
    # token see the padding after it, and without an explicit mask SDPA takes its fused kernel.
    packed = bool((batch.position_ids[:, 1:] == 0).logical_and(batch.real[:, 1:]).any())
    extra: dict[str, Any] = {}
    mask = batch.attention_mask if packed else None
    if packed and varlen:
        _use_segment_attention(lm)
        # a 4-D mask is passed through untouched (no [length, length] mask is built); segment_attention
        # ignores it and uses the spans
        mask = torch.ones(batch.input_ids.shape[0], 1, 1, 1, dtype=torch.bool, device=batch.input_ids.device)
        extra["segments"] = spans(batch)
    hidden = decoder(lm)(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask,
                      **extra).last_hidden_state
    # The output head runs only where a target is predicted (agent tokens, a small share of a row).
    rows, cols = torch.nonzero(batch.loss_mask[:, 1:], as_tuple=True)
    logits = lm.get_output_embeddings()(hidden[rows, cols]).float()
    ce = torch.nn.functional.cross_entropy(logits, batch.input_ids[rows, cols + 1], reduction="none")
    return (ce * batch.loss_mask[rows, cols + 1]).sum(), int(rows.numel())
