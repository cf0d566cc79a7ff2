"""Training: data preparation, packing, SFT and the GRPO loop."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def from_preset(presets: dict[str, T], name: str, kind: str, **overrides: Any) -> T:
    """A preset config with the overrides that were given (None means "keep the preset's value")."""
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; choose from {', '.join(presets)}")
    return replace(presets[name], **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[type-var]


def start_run(config: Any) -> tuple[Path, Any, Any]:
    """Create the run directory, record the resolved config, seed torch, load (model, tokenizer)."""
    import torch

    from muarl.models import load

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(config), indent=1) + "\n")
    torch.manual_seed(config.seed)
    model, tokenizer = load(config.model)
    return out, model, tokenizer


def save_model(out: Path, model: Any, tokenizer: Any) -> Path:
    """Save the trained model as an ordinary HF checkpoint at ``out/model``."""
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out / "model"


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
