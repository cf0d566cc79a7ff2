"""Where muarl keeps what it builds or converts once and reuses: ``$MUARL_CACHE``, default ``~/.cache/muarl``
(the SmolLM2 checkpoint converted from its GGUF file, the embedded ``tiny-random`` model).

Its own module because both the model loader (:mod:`muarl.models`) and the embedded model's builder
(:mod:`muarl.tiny_model`) write there, and neither should import the other for it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache directory (not created here)."""
    return Path(os.environ.get("MUARL_CACHE", Path.home() / ".cache" / "muarl"))
