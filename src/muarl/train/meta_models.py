"""Models of a checkpoint's architecture without their weights: parameters on the meta device (no memory)
until a sharded run allocates its shards, or allocated uninitialised for a gather to fill. Nothing here
reads a weight: :mod:`muarl.train.sharded_init` fills shards from the files, :func:`muarl.train.sharding.gather_into`
fills a whole copy from the shards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

INDEX = "model.safetensors.index.json"


def checkpoint_files(root: Path) -> dict[str, Path]:
    """Each tensor name of the checkpoint in ``root`` and the safetensors file that holds it ({} when the
    checkpoint has no safetensors files: then it takes the plain path)."""
    index = root / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: root / file for name, file in weight_map.items()}
    single = root / "model.safetensors"
    if not single.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def empty_model(root: Path, dtype: torch.dtype) -> Any:
    """The causal LM of the checkpoint in ``root``, its parameters on the meta device (no memory) and its
    buffers (rotary frequencies) computed as usual; its config and generation config the checkpoint's."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(root)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # under init_empty_weights transformers leaves a tied output head untied
    model.name_or_path = model.config._name_or_path = str(root)
    if (root / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(root)
    return model


def materialize(model: Any, device: torch.device | str) -> None:
    """Allocate ``model``'s meta parameters (its shards, when sharded) on ``device``, uninitialised, and keep
    its buffers' values (``to_empty`` would leave them uninitialised too)."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def empty_copy(config: Any, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Any:
    """An unsharded model of ``config.model``'s architecture on ``device`` in ``dtype``, its weights
    uninitialised (a gather from the shards fills them; nothing is read from the checkpoint)."""
    from muarl.models import checkpoint_root

    model = empty_model(checkpoint_root(config.model), dtype)
    materialize(model, device)
    model.tie_weights()  # to_empty gave the tied head and embeddings a parameter each
    return model.eval().requires_grad_(False)
