"""What samples a GRPO step's rollouts (``--rollout-engine``): muarl's transformers engine on the trainer's
own model, or a vLLM engine whose weights follow the trainer's after every update.

Both hand the step a :class:`~muarl.policies.base.Policy` per batch of tasks, seeded by (run seed, step,
batch), and both produce the same :class:`~muarl.types.Trajectory` (token ids, loss mask, the sampler's
log-probs), so the update cannot tell them apart except through the rollout-training mismatch it logs
(:mod:`muarl.algorithms.mismatch`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from muarl.policies.base import Policy


class Sampler(Protocol):
    def policy(self, seed: int) -> Policy:
        """The policy one batch of a step samples with; its episodes' draws depend on ``seed`` and the task."""

    def sync(self, model: Any) -> float:
        """Make the next rollouts sample from ``model``'s current weights; the seconds it took."""

    def close(self) -> None:
        """Release what the sampler holds (an engine's memory)."""


class HFSampler:
    """muarl's own engine (:class:`~muarl.policies.hf.HFPolicy`) on the trainer's model object: the weights
    are shared, so there is nothing to sync."""

    def __init__(self, model: Any, tokenizer: Any, temperature: float, max_new_tokens: int):
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.max_new_tokens = temperature, max_new_tokens

    def policy(self, seed: int) -> Policy:
        from muarl.policies.hf import HFPolicy
        from muarl.train.weights import causal_lm

        # a fresh policy per batch: its sampling generators depend on (seed, task, episode order) only, so a
        # resumed run samples what an uninterrupted one would have sampled
        return HFPolicy((causal_lm(self.model), self.tokenizer), temperature=self.temperature,
                        max_new_tokens=self.max_new_tokens, seed=seed)

    def sync(self, model: Any) -> float:
        return 0.0

    def close(self) -> None:
        pass


class VLLMSampler:
    """One vLLM engine for the whole run (:class:`~muarl.policies.vllm.VLLMPolicy`), started on the run's
    base checkpoint and synced to the trainer's weights at once (a resumed run's included) and after every
    update: a LoRA run's adapter is saved and reloaded in place, a full fine-tuning run's weights are pushed
    in through the engine's weight-reload route. ``engine_options`` go to the engine (``dtype``,
    ``kv_cache_gib``, vLLM engine arguments)."""

    def __init__(self, base: str, model: Any, temperature: float, max_new_tokens: int, lora_rank: int = 0,
                 **engine_options: Any):
        from muarl.policies.vllm import VLLMPolicy

        self.lora = lora_rank > 0
        if self.lora:
            engine_options.setdefault("max_lora_rank", max(16, lora_rank))
        self.engine_policy = VLLMPolicy(base, temperature=temperature, max_new_tokens=max_new_tokens,
                                        enable_lora=self.lora, **engine_options)
        self.sync(model)

    def policy(self, seed: int) -> Policy:
        self.engine_policy.seed = seed  # the episodes' seeds derive from it (and the task), as HFPolicy's do
        return self.engine_policy

    def sync(self, model: Any) -> float:
        began = time.perf_counter()
        if self.lora:
            self.engine_policy.sync_lora(model)
        else:
            self.engine_policy.sync_weights(model)
        return time.perf_counter() - began

    def close(self) -> None:
        self.engine_policy.close()


def make_sampler(config: Any, model: Any, tokenizer: Any) -> Sampler:
    """The sampler ``config.rollout_engine`` names, for a GRPO run's ``model``."""
    if config.rollout_engine == "vllm":
        import torch

        from muarl.models import resolve

        # the engine's precision follows the trainer's forwards: bf16 where they autocast to it (a GPU)
        cuda = torch.cuda.is_available()
        bf16 = config.bf16 if config.bf16 is not None else cuda
        # colocated with the trainer: vLLM's default (90% of the GPU for weights and KV cache) would starve it
        options = {"gpu_memory_utilization": config.vllm_gpu_memory} if cuda else {}
        return VLLMSampler(str(resolve(config.model)), model, config.temperature, config.max_new_tokens,
                           lora_rank=config.lora_r, dtype="bfloat16" if bf16 else "float32", seed=config.seed,
                           **options)
    return HFSampler(model, tokenizer, config.temperature, config.max_new_tokens)
