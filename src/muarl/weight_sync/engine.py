"""The weights into an in-process vLLM engine (``--rollout-engine vllm``): no file and no link, the engine
lives in the trainer's process. Full weights go in place through vLLM's ``load_weights`` (a peft model merged
first, for an engine started without LoRA support); a LoRA run's adapter is saved to a directory of this
sync's own and reloaded in place, and later turns sample with it."""

from __future__ import annotations

import tempfile
from typing import Any

from muarl.policies.vllm import LORA_ID, LORA_NAME
from muarl.weight_sync.merged import merged_weights


class EngineSync:
    """Keeps ``policy``'s engine (a :class:`~muarl.policies.vllm.VLLMPolicy`) on the trainer's weights;
    ``lora``: push the adapter (the engine needs ``enable_lora=True``), else the full (merged) weights."""

    def __init__(self, policy: Any, lora: bool):
        self.policy, self.lora = policy, lora
        self.sync_bytes = 0  # not counted: nothing leaves the process
        self._adapter_dir: tempfile.TemporaryDirectory | None = None

    def push(self, model: Any) -> None:
        engine = self.policy.engine
        if not self.lora:
            engine.load_weights(merged_weights(model))
            return
        if self._adapter_dir is None:
            self._adapter_dir = tempfile.TemporaryDirectory(prefix="muarl-vllm-lora-")
        model.save_pretrained(self._adapter_dir.name)
        request = engine.lora_request(LORA_NAME, LORA_ID, self._adapter_dir.name)
        engine.load_lora(request)
        self.policy.lora = request

    def close(self) -> None:
        if self._adapter_dir is not None:
            self._adapter_dir.cleanup()
            self._adapter_dir = None
