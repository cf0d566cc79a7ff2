"""Training: data preparation, packing, SFT and the GRPO loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

T = TypeVar("T")


def from_preset(presets: dict[str, T], name: str, kind: str, **overrides: Any) -> T:
    """A preset config with the overrides that were given (None means "keep the preset's value")."""
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; choose from {', '.join(presets)}")
    return replace(presets[name], **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[type-var]
