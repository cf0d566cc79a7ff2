"""The optimizer a training run's ``--optimizer`` names (SFT, pretraining and GRPO build theirs here)."""

from __future__ import annotations

from typing import Any


def make_optimizer(params: list[Any], config: Any) -> Any:
    """The optimizer ``config.optimizer`` names over ``params``, at ``config.lr`` and its weight decay."""
    import torch

    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
