"""vLLM policy backend (``--policy vllm:PATH``): token in, token out, through vLLM's engine.

The episode's token state is built exactly as in the transformers backend (:mod:`muarl.policies.hf`):
the opening prompt is rendered once, each later turn appends only the tokens of the new messages
(:meth:`ChatFormat.delta_ids`), and the agent's sampled ids are kept as sampled. Each agent turn sends
the whole id sequence so far to vLLM (never text), and vLLM's prefix caching finds the part an earlier
turn (or another episode, for the shared system turn) already computed, so a multi-turn episode is not
re-prefilled. Trajectories come out of the rollout engine with the same type and loss masks as the HF
backend's, because the :class:`AgentTurn` fields are filled the same way.

Sampling means what it means in the HF backend: ``temperature`` (0 = greedy), ``top_p``,
``max_new_tokens`` per turn, the chat format's stop tokens (kept as the turn's last sampled token),
and a seed per episode from (policy seed, task, episode), so an episode samples the same tokens
whatever else shares the batch. The log-probs are vLLM's "processed" ones: the log-probability of the
sampled token under the distribution it was sampled from (after temperature), which with ``top_p`` = 1
is exactly what the trainer recomputes; with ``top_p`` < 1 vLLM renormalizes over the nucleus, where the
HF backend reports the untruncated probability.

vLLM itself is imported only by :mod:`muarl.policies.vllm_engine`, the one module that knows vLLM's
version-specific API.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from muarl.chat import ChatFormat
from muarl.models import ADAPTER_CONFIG
from muarl.policies.base import AgentTurn, Policy, PolicySession, episode_seed
from muarl.policies.vllm_engine import VLLMEngine
from muarl.types import Message

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task

#: the adapter name and id the engine serves a trained LoRA under (one adapter: the policy's)
LORA_NAME, LORA_ID = "muarl-policy", 1


class VLLMPolicy(Policy):
    """A causal LM served by vLLM as an agent.

    ``model``: a checkpoint directory or an alias of :func:`muarl.models.resolve` (``tiny``,
    ``tiny-random``, ``smollm2``), or a LoRA adapter directory (a run's ``OUT/adapter``), served as an
    adapter on the checkpoint its config names. ``max_context`` caps an episode's tokens (default: the model's
    context). ``enable_lora`` lets the engine serve a trained adapter (synced by
    :class:`~muarl.weight_sync.engine.EngineSync`); ``engine_options`` go to
    :class:`VLLMEngine` (dtype, kv_cache_gib, vLLM engine arguments).
    """

    def __init__(self, model: str | Path, *, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 1024, max_context: int | None = None, max_batch: int = 64, seed: int = 0,
                 enable_lora: bool = False, **engine_options: Any):
        from transformers import AutoTokenizer

        from muarl.models import resolve, tokenizer_dir

        adapter, base = served_adapter(model)
        if adapter is not None:  # a trained adapter, served on its base
            rank = int(json.loads((adapter / ADAPTER_CONFIG).read_text()).get("r") or 0)
            enable_lora = True
            engine_options["max_lora_rank"] = max(rank, int(engine_options.get("max_lora_rank", 0)))
        self.path = path = base if base is not None else resolve(model)
        self.adapter = adapter
        self.name = f"vllm:{model}"
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(model))
        self.engine = VLLMEngine(str(path), max_model_len=max_context, max_num_seqs=max_batch, seed=seed,
                                 enable_lora=enable_lora, **engine_options)
        self.max_context = self.engine.max_model_len
        self.stop_ids = ChatFormat(self.tokenizer, []).stop_ids
        self.lora: Any = None  # the LoRA request every turn samples with: a served or synced adapter
        if adapter is not None:
            self.lora = self.engine.lora_request(LORA_NAME, LORA_ID, str(adapter))
            self.engine.load_lora(self.lora)
        self._formats: dict[str, ChatFormat] = {}
        self._sessions = 0

    def provenance(self) -> dict[str, Any]:
        """The name and the checkpoint directory vLLM serves (after weight syncs: the one it started from),
        and the adapter directory it serves on it, if any."""
        return {"name": self.name, "model": str(self.path),
                **({"adapter": str(self.adapter)} if self.adapter is not None else {})}

    def chat_format(self, domain: Domain) -> ChatFormat:
        if domain.name not in self._formats:
            self._formats[domain.name] = ChatFormat(self.tokenizer, [t.spec for t in domain.tools])
        return self._formats[domain.name]

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> VLLMSession:
        self._sessions += 1
        which = self._sessions if seed is None else f"episode {seed}"
        return VLLMSession(self, self.chat_format(domain), episode_seed(self.seed, task.id, which) >> 2)

    def close(self) -> None:
        """Shut the engine down (frees its KV cache)."""
        self.engine.close()


def served_adapter(model: str | Path) -> tuple[Path | None, Path | None]:
    """(adapter directory, its base checkpoint) when ``model`` is a LoRA adapter directory, else (None,
    None). vLLM serves one adapter on a whole checkpoint: an adapter trained on top of another adapter
    is refused in one line (``hf:`` merges such chains)."""
    from muarl.models import adapter_chain

    adapters, root = adapter_chain(model)
    if len(adapters) > 1:
        raise ValueError(f"{model} is a LoRA adapter trained on another adapter ({adapters[1]}); vLLM serves one "
                         "adapter on a whole checkpoint: evaluate it with hf:, or train from a merged model")
    return (adapters[0], root) if adapters else (None, None)


class VLLMSession(PolicySession):
    """One episode: every token id so far (prompts and sampled turns) and its parsed messages."""

    def __init__(self, policy: VLLMPolicy, chat: ChatFormat, seed: int):
        self.policy = policy
        self.chat = chat
        self.seed = seed
        self.ids: list[int] = []
        self.messages: list[Message] = []
        self.turn = 0
        self.append_only = True
        self.cached_tokens = 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        if not self.messages:
            prompt = self.chat.prompt_ids(new_messages)
        else:
            prompt, append_only = self.chat.delta_ids(self.messages, new_messages)
            self.append_only &= append_only
        self.messages.extend(new_messages)
        room = self.policy.max_context - len(self.ids) - len(prompt)
        if room <= 0:
            return AgentTurn(message=Message(role="assistant", content=""), finish="context")
        max_new = min(self.policy.max_new_tokens, room)
        self.ids.extend(prompt)
        # one seed per turn, derived from the episode's: a turn's draw does not depend on the batch
        params = self.policy.engine.sampling_params(
            temperature=self.policy.temperature, top_p=self.policy.top_p, max_tokens=max_new,
            stop_ids=self.policy.stop_ids, seed=(self.seed + 7919 * self.turn) % 2**62)
        out = await self.policy.engine.generate(self.ids, params, self.policy.lora)
        self.ids.extend(out.token_ids)
        self.cached_tokens += out.cached_tokens
        finish = out.finish
        if finish == "length" and max_new < self.policy.max_new_tokens:
            finish = "context"
        parsed = self.chat.parse(out.token_ids, call_prefix=f"call_{self.turn}")
        self.turn += 1
        message = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls)
        self.messages.append(message)
        return AgentTurn(message=message, token_ids=out.token_ids, logprobs=out.logprobs, prompt_ids=prompt,
                         parse_errors=parsed.errors, finish=finish, metadata={"cached_tokens": out.cached_tokens})

    def close(self) -> dict[str, Any]:
        """Report, as the HF backend does, whether a full re-render would have tokenized differently, and
        how many prompt tokens vLLM's prefix cache served over the episode."""
        return {"drift": self.chat.drifted(self.ids, self.messages) if self.messages else False,
                "append_only": self.append_only, "cached_tokens": self.cached_tokens}
