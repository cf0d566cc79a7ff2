"""Pieces every policy-gradient loss here shares: masked means, the k3 KL estimator, clipped ratios."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossBatch:
    """Per-token tensors of shape [sequences, tokens] for one update.

    ``mask`` is 1 on the agent's own sampled tokens (the trajectory's loss mask, times 0 for rollouts kept
    out of the gradient such as simulator faults); ``advantages`` holds each sequence's advantage
    broadcast to its tokens.
    """

    logprobs: torch.Tensor  # under the current policy (requires grad)
    #: the PPO ratio's denominator: the sampler's log-probs, or with truncated importance sampling the
    #: trainer's own from before the update (:mod:`muarl.algorithms.mismatch`)
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None  # under the reference model, for the KL term
    #: when this batch is one micro-batch (or one process's share) of a larger update: that update's agent
    #: tokens and sequences. The loss is normalised by them instead of this batch's own counts, so the
    #: micro-batch losses (and gradients) add up exactly to the whole batch's token-mean (or Dr.GRPO) loss.
    total_tokens: float | None = None
    total_sequences: float | None = None
    #: per-token weights of the policy-gradient term (truncated importance sampling); None: all 1
    is_weights: torch.Tensor | None = None


@dataclass
class LossStats:
    """What a step logs about its loss (all detached floats).

    With ``LossBatch.total_tokens`` set, ``policy_loss``, ``kl``, ``clip_fraction`` and ``ratio_mean``
    are this part's share of the whole update's value: summing them over the parts gives the whole.
    """

    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    tokens: int


def masked_mean(values: torch.Tensor, mask: torch.Tensor, total: float | None = None) -> torch.Tensor:
    """Mean over the positions where ``mask`` is 1 (0 when there are none, not NaN).

    ``total`` replaces the count of masked positions as the denominator: the mean over a larger batch of
    which these positions are a part (micro-batching, several processes).
    """
    return (values * mask).sum() / (mask.sum().clamp(min=1) if total is None else max(total, 1.0))


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate k3 = exp(r) - r - 1 with r = ref - policy log-probs.

    Unbiased, always >= 0, and low-variance (Schulman's "approximating KL divergence"); verl calls it
    ``low_var_kl``, and MUA-RL uses it with beta 0.001.
    """
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1


def clipped_surrogate(batch: LossBatch, clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped per-token loss, whether clipping was active per token, and the ratio.

    loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A). With clip_high > clip_low
    this is DAPO's clip-higher, which leaves low-probability tokens more room to grow. With
    ``batch.is_weights`` each token's loss is multiplied by its weight (truncated importance sampling).
    """
    ratio = torch.exp(batch.logprobs - batch.old_logprobs)
    unclipped = -batch.advantages * ratio
    clipped = -batch.advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if batch.is_weights is not None:
        loss = loss * batch.is_weights
    return loss, (clipped > unclipped).float(), ratio


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: which groups (rows of [groups, members]) are not all-equal.

    An all-correct or all-wrong group has zero advantage everywhere and only dilutes the batch; the
    trainer drops such groups and samples more until its batch is full.
    """
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0
