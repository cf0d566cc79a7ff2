"""Hugging Face transformers policy: a local checkpoint as the agent, its episodes' turns sampled by one
shared :class:`~muarl.policies.batched_generator.BatchedGenerator` (dynamic batching across episodes, KV
cache kept between turns, the shared opening attended to once).

Each session keeps its episode's append-only token sequence: a turn renders only the messages added since
the last one (:meth:`~muarl.chat.ChatFormat.delta_ids`) and parses the sampled tokens into a message with
tool calls.

``deterministic`` (the default: synchronous GRPO's sampler and ``muarl eval`` get it) makes the engine's
batches, and so every sampled token and log-prob, independent of timing: a pass waits until every open
session has asked for its turn or ended, and rows are ordered by the session's seed
(:class:`~muarl.policies.batched_generator.BatchedGenerator`). Weights swapped in while episodes are in
flight (asynchronous GRPO, :meth:`HFPolicy.swapping_weights`) make the run depend on timing anyway: from
the first swap the engine admits requests as they arrive again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from muarl.chat import ChatFormat
from muarl.policies.base import AgentTurn, Policy, PolicySession, episode_seed
from muarl.policies.batched_generator import BatchedGenerator, TokenSequence
from muarl.types import Message

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task


class HFPolicy(Policy):
    """A transformers causal LM as an agent. Pass a checkpoint path, an alias (``tiny``, ``smollm2``) or
    a loaded ``(model, tokenizer)`` pair (the trainer shares its live model this way)."""

    def __init__(
        self,
        model: str | Path | tuple[Any, Any],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 1024,
        max_context: int = 32768,
        max_batch: int = 64,
        seed: int = 0,
        deterministic: bool = True,
    ):
        if isinstance(model, tuple):
            self.model, self.tokenizer = model
        else:
            from muarl.models import load

            self.model, self.tokenizer = load(model)
        self.name = f"hf:{model if not isinstance(model, tuple) else type(self.model).__name__}"
        self.max_new_tokens = max_new_tokens
        self.max_context = max_context
        self.seed = seed
        self._formats: dict[str, ChatFormat] = {}
        self._sessions = 0
        stop = ChatFormat(self.tokenizer, []).stop_ids
        self.engine = BatchedGenerator(self.model, stop, temperature, top_p, max_batch, deterministic=deterministic)

    @contextlib.contextmanager
    def swapping_weights(self) -> Iterator[None]:
        """The model's weights change while episodes are in flight: between two passes of the engine (its
        lock), and the shared opening's cached KV recomputed with the new weights before the next. Which
        tokens meet which weights then depends on timing, so the engine stops waiting for every open session
        (deterministic admission would only slow such a run down)."""
        self.engine.deterministic = False
        with self.engine.lock:
            yield
            self.weights_updated()

    def weights_updated(self) -> None:
        """Call after changing the model's weights (a training step): the shared opening's cached KV is
        recomputed (episodes in flight, as in asynchronous GRPO, keep attending to it)."""
        self.engine.refresh_prefix()

    def provenance(self) -> dict[str, Any]:
        """The name and the checkpoint the weights were loaded from (Hugging Face's ``_name_or_path``: the
        directory even when the model was handed over loaded, as the demo and the trainer do)."""
        return {"name": self.name, "model": getattr(getattr(self.model, "config", None), "_name_or_path", None)}

    def chat_format(self, domain: Domain) -> ChatFormat:
        if domain.name not in self._formats:
            self._formats[domain.name] = ChatFormat(self.tokenizer, [t.spec for t in domain.tools])
        return self._formats[domain.name]

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> HFSession:
        self._sessions += 1
        which = self._sessions if seed is None else f"episode {seed}"
        seed_bits = episode_seed(self.seed, task.id, which) >> 1
        generator = torch.Generator(device=self.engine.device).manual_seed(seed_bits)
        # a deterministic engine orders its rows by this key: the episode's seed, not when it asked
        session = self.engine.open_session((seed_bits, self._sessions))
        return HFSession(self, self.chat_format(domain), TokenSequence(generator=generator, session=session))


class HFSession(PolicySession):
    """One episode: the append-only token sequence and its parsed messages."""

    def __init__(self, policy: HFPolicy, chat: ChatFormat, seq: TokenSequence):
        self.policy = policy
        self.chat = chat
        self.seq = seq
        self.messages: list[Message] = []
        self.turn = 0
        self.append_only = True

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        prefix_len = 0
        if not self.messages:
            prompt = self.chat.prompt_ids(new_messages)
            prefix_len = self.chat.shared_prefix_len(new_messages, prompt)
        else:
            prompt, append_only = self.chat.delta_ids(self.messages, new_messages)
            self.append_only &= append_only
        self.messages.extend(new_messages)
        room = self.policy.max_context - len(self.seq.ids) - len(prompt)
        if room <= 0:
            return AgentTurn(message=Message(role="assistant", content=""), finish="context")
        max_new = min(self.policy.max_new_tokens, room)
        sampled, logprobs, finish = await self.policy.engine.generate(self.seq, prompt, max_new, prefix_len)
        if finish == "length" and max_new < self.policy.max_new_tokens:
            finish = "context"
        parsed = self.chat.parse(sampled, call_prefix=f"call_{self.turn}")
        self.turn += 1
        message = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls)
        self.messages.append(message)
        return AgentTurn(message=message, token_ids=sampled, logprobs=logprobs, prompt_ids=prompt,
                         parse_errors=parsed.errors, finish=finish)

    def close(self) -> dict[str, Any]:
        """Free the KV cache; report whether a full re-render would have tokenized differently, and the
        engine's split of the episode's policy time (queue, prefill, decode: :mod:`muarl.time_split`)."""
        self.seq.cache = None
        self.policy.engine.close_session(self.seq.session)
        ids = self.seq.ids
        return {"drift": self.chat.drifted(ids, self.messages) if self.messages else False,
                "append_only": self.append_only, "engine_time": dict(self.seq.timing)}
