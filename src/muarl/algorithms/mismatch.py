"""The rollout-training mismatch: how far the sampler's log-probs are from the trainer's, and its correction.

The engine that samples (muarl's own, or vLLM with its kernels, batch shapes and precision) and the
trainer that recomputes log-probs are two implementations of one policy; their numbers differ a little,
and the policy gradient assumes they do not. Per step the trainer logs, over the agent tokens it
recomputed before its first update:

- ``mismatch_kl``: KL(sampler || trainer) estimated with k3 (as the KL term is) on tokens the sampler drew,
  r = trainer - sampler log-prob, exp(r) - r - 1 averaged over tokens;
- ``mismatch_outside``: the share of those tokens whose probability ratio trainer / sampler leaves
  [0.5, 2], the tokens where the two engines disagree enough to bias the gradient.

The correction is truncated importance sampling (Yao et al., "Your efficient RL framework secretly brings
you off-policy RL training", 2025): the PPO ratio is taken against the *trainer's* log-probs from before
the update, and each token's policy-gradient term is weighted by min(trainer / sampler probability, C),
the truncation C bounding the variance a rare large ratio would bring.
"""

from __future__ import annotations

import torch

#: a token is "outside" when its trainer / sampler probability ratio is below LOW or above HIGH
LOW, HIGH = 0.5, 2.0

#: a share of tokens outside [LOW, HIGH] above which a run is warned: sampler and trainer are no longer
#: two implementations of one policy but two policies (an engine serving another checkpoint, a failed sync)
WARN_OUTSIDE = 0.1


def mismatch_warning(step: int, kl: float, outside: float) -> str | None:
    """The one-line warning of a step whose sampler and trainer disagree beyond numerics, or None."""
    if outside <= WARN_OUTSIDE:
        return None
    return (f"muarl: warning: grpo step {step}: the rollout engine's log-probs disagree with the trainer's "
            f"(mismatch_kl {kl:.3g}, {outside:.0%} of tokens with a probability ratio outside [{LOW:g}, {HIGH:g}]): "
            "is the engine serving --model's weights? Rollouts are off-policy; --tis-cap corrects only small gaps")


def mismatch_sums(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(summed k3 KL(sampler || trainer), tokens with ratio outside [LOW, HIGH], tokens) over ``mask``.

    Sums, not means, so micro-batches and processes add up before the one division."""
    r = (trainer.detach() - sampler).double()
    mask = mask.double()
    kl = float(((torch.exp(r) - r - 1) * mask).sum())
    ratio = torch.exp(r)
    outside = float((((ratio < LOW) | (ratio > HIGH)).double() * mask).sum())
    return kl, outside, float(mask.sum())


def truncated_is_weights(trainer_old: torch.Tensor, sampler: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token weights min(exp(trainer_old - sampler), ``cap``), without gradient."""
    if cap <= 0:
        raise ValueError(f"the truncated importance-sampling cap must be above 0 (got {cap:g})")
    return torch.exp(trainer_old.detach() - sampler).clamp(max=cap)
