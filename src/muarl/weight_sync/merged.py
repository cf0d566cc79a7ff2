"""The weights an engine loads: a causal LM's, a LoRA model's merged into its base, in the names vLLM's
``load_weights`` expects. Every full-weight sync (in-process engine, files, the broadcast link) sends these."""

from __future__ import annotations

from typing import Any

import torch

from muarl.models import is_lora


def merged_weights(model: Any) -> list[tuple[str, Any]]:
    """(HF name, tensor) of a causal LM's weights, a peft (LoRA) model's merged into its base, in the
    names vLLM's ``load_weights`` expects (no peft prefixes). The trainer's model is left as it is."""
    if not is_lora(model):
        return [(name, p.detach()) for name, p in model.state_dict().items()]
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for module_name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                prefix = f"{module_name}." if module_name else ""
                weight = module.get_base_layer().weight.detach().clone()
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        weight += module.get_delta_weight(adapter).to(weight.dtype)
                merged[f"{prefix}weight"] = weight
                bias = module.get_base_layer().bias
                if bias is not None:
                    merged[f"{prefix}bias"] = bias.detach()
        for name, tensor in base.state_dict().items():
            if "lora_" in name:
                continue
            clean = name.replace(".base_layer.", ".")
            merged.setdefault(clean, tensor.detach())
    return list(merged.items())
