"""Advantage estimators and policy losses, one small file per algorithm; the trainer is blind to which.

``get_algorithm("grpo" | "dr_grpo")`` returns an object with ``advantages(rewards)`` and
``loss(batch)``. DAPO's pieces are options of these: clip-higher is ``clip_high``, dynamic sampling is
:func:`muarl.algorithms.common.informative_groups` applied by the trainer before it fills a batch.
"""

from muarl.algorithms.common import LossBatch, LossStats, informative_groups, k3_kl, masked_mean
from muarl.algorithms.dr_grpo import DrGRPO
from muarl.algorithms.grpo import GRPO

ALGORITHMS = {"grpo": GRPO, "dr_grpo": DrGRPO}


def get_algorithm(name: str, **options: float) -> GRPO:
    """An algorithm by name with its options (clip_low, clip_high, kl_beta, ...)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose from {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name](**options)


__all__ = ["ALGORITHMS", "DrGRPO", "GRPO", "LossBatch", "LossStats", "get_algorithm", "informative_groups",
           "k3_kl", "masked_mean"]
