"""Dr. GRPO ("Understanding R1-Zero-Like Training"): GRPO without its two length and difficulty biases."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from muarl.algorithms.grpo import GRPO


@dataclass
class DrGRPO(GRPO):
    """Advantages are r - mean (no division by the group's std, which up-weights near-uniform groups), and
    each sequence's token losses are summed and divided by a constant ``max_tokens`` rather than its own
    length (which favours long wrong answers), then averaged over sequences."""

    max_tokens: int = 1024

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards - rewards.mean(dim=1, keepdim=True)

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, tokens: float | None = None,
                  sequences: float | None = None) -> torch.Tensor:
        """Sum of each sequence's token losses over ``max_tokens``, averaged over the sequences present
        (over ``sequences``, the whole update's count, when this batch is one part of it)."""
        present = mask.sum(dim=1) > 0  # sequences kept out of the gradient (sim faults) do not count
        sums = (per_token * mask).sum(dim=1) / self.max_tokens
        count = present.sum().clamp(min=1) if sequences is None else max(sequences, 1.0)
        return sums[present].sum() / count
