"""The precision of training forwards (``--bf16``): one rule for SFT, pretraining, scoring and the GRPO update,
so the trainer's numbers and an engine that follows them (:mod:`muarl.train.samplers`) agree."""

from __future__ import annotations

from typing import Any


def autocast(bf16: bool | None, device: Any) -> Any:
    """A bfloat16 autocast context for training forwards, or a no-op.

    ``bf16`` None means "where the hardware has it": a CUDA device that supports bfloat16. On the CPU
    autocast would only slow the small matmuls down, so it is off unless asked for.
    """
    import contextlib

    import torch

    device = torch.device(device)
    enabled = bf16 if bf16 is not None else device.type == "cuda" and torch.cuda.is_bf16_supported()
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
