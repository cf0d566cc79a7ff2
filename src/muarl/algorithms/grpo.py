"""GRPO as MUA-RL trains with it: group-normalised outcome advantages, PPO-clip, token-mean, k3 KL."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from muarl.algorithms.common import LossBatch, LossStats, clipped_surrogate, k3_kl, masked_mean


@dataclass
class GRPO:
    """Defaults are the paper's released script: clip 0.2 both sides, KL beta 0.001 (k3), token-mean."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.001
    eps: float = 1e-6

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """(r - mean) / (std + eps) within each group; rewards are [groups, members].

        The std is the sample standard deviation (n - 1), as verl computes it; an all-equal group
        gets advantage 0 for every member.
        """
        mean = rewards.mean(dim=1, keepdim=True)
        std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
        return (rewards - mean) / (std + self.eps)

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, tokens: float | None = None,
                  sequences: float | None = None) -> torch.Tensor:
        """Token-mean: every agent token in the batch weighs the same, whatever its sequence's length.

        ``tokens`` is the whole update's token count when this is one part of it (see ``LossBatch``).
        """
        return masked_mean(per_token, mask, tokens)

    def loss(self, batch: LossBatch) -> tuple[torch.Tensor, LossStats]:
        per_token, clipped, ratio = clipped_surrogate(batch, self.clip_low, self.clip_high)
        tokens = batch.total_tokens
        policy_loss = self.aggregate(per_token, batch.mask, tokens, batch.total_sequences)
        kl = torch.zeros(())
        if batch.ref_logprobs is not None and self.kl_beta:
            kl = masked_mean(k3_kl(batch.logprobs, batch.ref_logprobs), batch.mask, tokens)
        total = policy_loss + self.kl_beta * kl
        stats = LossStats(
            policy_loss=float(policy_loss.detach()),
            kl=float(kl.detach()),
            clip_fraction=float(masked_mean(clipped, batch.mask, tokens)),
            ratio_mean=float(masked_mean(ratio.detach(), batch.mask, tokens)),
            tokens=int(batch.mask.sum()),
        )
        return total, stats
