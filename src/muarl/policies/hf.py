"""Hugging Face transformers policy: dynamic batching across episodes, KV cache kept between turns.

Every episode waiting for the agent joins one running decode batch at the next token step (it does not
wait for the batch to drain), and leaves it when it stops. Each episode keeps its own KV cache between
turns, so a new turn prefills only the tokens appended since the last one: every token of a
conversation goes through the model at most once. The opening prompt's shared prefix (the system turn
with policy and tool schemas, identical for every episode of a domain) is computed once and shared. The model runs in a worker thread so the event loop keeps
serving users and tools (an LLM user's HTTP call overlaps with other episodes' decoding).

Caches of different lengths are batched by left-padding them to a common length, with a 2-D attention
mask hiding the padding and explicit per-row position ids for the rotary embeddings.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from muarl.chat import ChatFormat
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.types import Message

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task

KV = list[tuple[torch.Tensor, torch.Tensor]]


def _buffered_cache(model: Any, kv: KV | None, room: int) -> Any:
    """A transformers cache whose layers append into preallocated buffers.

    The stock ``DynamicCache`` concatenates the whole cache with every new token (and copies it once
    more when built from tensors): O(length) memory traffic per token per layer, which dominates decode
    time and doubles peak memory for a 64-row batch. Writing in place into a buffer with ``room`` spare
    positions (grown by doubling when full) makes an append O(1).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            b, h, n, d = keys.shape
            self._k = keys.new_empty(b, h, n + room, d)
            self._v = values.new_empty(b, h, n + room, values.shape[3])
            self._k[:, :, :n], self._v[:, :, :n] = keys, values
            self.length, self.dtype, self.device, self.is_initialized = n, keys.dtype, keys.device, True
            self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            end = self.length + key_states.shape[-2]
            if end > self._k.shape[2]:
                grow = max(2 * self._k.shape[2], end)
                self._k = torch.cat([self.keys, self._k.new_empty(*self._k.shape[:2], grow - self.length,
                                                                  self._k.shape[3])], dim=2)
                self._v = torch.cat([self.values, self._v.new_empty(*self._v.shape[:2], grow - self.length,
                                                                    self._v.shape[3])], dim=2)
            self._k[:, :, self.length:end], self._v[:, :, self.length:end] = key_states, value_states
            self.length = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

    cache = DynamicCache(config=model.config)
    if kv:
        cache.layers = [BufferLayer(k, v) for k, v in kv]
    return cache


@dataclass
class _Sequence:
    """One episode's token state: every id so far, and the KV cache of all but the last sampled one."""

    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    cache: KV | None = None

    @property
    def cached(self) -> int:
        return 0 if self.cache is None else int(self.cache[0][0].shape[2])


@dataclass
class _Row:
    """A sequence inside the running decode batch."""

    seq: _Sequence
    future: asyncio.Future
    max_new: int
    pending: int  # the sampled token not yet fed to the model
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


@dataclass
class _Request:
    seq: _Sequence
    new_ids: list[int]
    max_new: int
    future: asyncio.Future


class BatchedGenerator:
    """The shared engine: a queue of requests and one decode batch that requests join and leave."""

    def __init__(self, model: Any, stop_ids: set[int], temperature: float, top_p: float, max_batch: int):
        self.model = model
        self.stop_ids = stop_ids
        self.temperature = temperature
        self.top_p = top_p
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self.queue: list[_Request] = []
        self.rows: list[_Row] = []
        self.batch: KV | None = None  # per layer (K, V): [rows, heads, length, dim], left-padded
        self.cache: Any = None  # the batch's live cache (buffered layers over ``batch``)
        self.lengths: list[int] = []  # real cache length of each row
        self.wakeup: asyncio.Event | None = None
        self.runner: asyncio.Task | None = None
        self.tokens_computed = 0  # positions run through the model (prefill + decode)
        self.tokens_reused = 0  # positions whose KV came from a shared prompt prefix instead
        self.decode_steps = 0
        #: KV of recent opening prompts, most recent first: every episode of a domain opens with the same
        #: system turn (policy + tool schemas), often most of its prompt, so it is computed once
        self.prefixes: list[tuple[list[int], KV]] = []

    async def generate(self, seq: _Sequence, new_ids: list[int], max_new: int) -> tuple[list[int], list[float], str]:
        """Append ``new_ids`` to the sequence and sample up to ``max_new`` tokens (stops at end of turn)."""
        loop = asyncio.get_running_loop()
        if self.wakeup is None or self.runner is None or self.runner.done():
            if self.runner is not None and self.runner.done() and not self.runner.cancelled():
                self.runner.result()  # surface a crash of the previous runner
            self.wakeup = asyncio.Event()
            self.runner = loop.create_task(self._run())
        future = loop.create_future()
        self.queue.append(_Request(seq, new_ids, max_new, future))
        self.wakeup.set()
        return await future

    async def _run(self) -> None:
        assert self.wakeup is not None
        try:
            while True:
                if not self.rows and not self.queue:
                    self.wakeup.clear()
                    await self.wakeup.wait()
                await asyncio.sleep(0)  # let every episode that is ready queue its request first
                if self.queue and len(self.rows) < self.max_batch:
                    take = self.queue[: self.max_batch - len(self.rows)]
                    del self.queue[: len(take)]
                    await asyncio.to_thread(self._admit, take)
                    self._release_finished()  # a turn can end on its first token
                if self.rows:
                    await asyncio.to_thread(self._decode_step)
                    self._release_finished()
        except Exception as err:  # fail every waiting episode loudly rather than hang them
            for item in self.rows + self.queue:
                if not item.future.done():
                    item.future.set_exception(err)
            self.rows, self.queue, self.batch, self.lengths, self.cache = [], [], None, [], None
            raise

    # -- model work (worker thread) -----------------------------------------------------------------
    @torch.no_grad()
    def _admit(self, requests: list[_Request]) -> None:
        """Prefill each request's new tokens on its own cache, sample its first token, join the batch."""
        joining: list[tuple[_Row, KV]] = []
        for req in requests:
            seq = req.seq
            opening = seq.cache is None
            seq.ids.extend(req.new_ids)
            if opening:
                self._reuse_prefix(seq)
            start = seq.cached
            inputs = torch.tensor([seq.ids[start:]], device=self.device)
            cache = _buffered_cache(self.model, seq.cache, room=len(seq.ids) - start)
            positions = torch.arange(start, len(seq.ids), device=self.device).unsqueeze(0)
            out = self.model(input_ids=inputs, past_key_values=cache, position_ids=positions, use_cache=True,
                             logits_to_keep=1)
            self.tokens_computed += inputs.shape[1]
            kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            if opening:
                self._remember_prefix(list(seq.ids), kv)
            seq.cache = None
            row = _Row(seq=seq, future=req.future, max_new=req.max_new, pending=-1)
            token, logprob = self._sample(out.logits[:, -1, :], [seq.generator])
            self._accept(row, token[0], logprob[0])
            joining.append((row, kv))
        self._join(joining)

    def _reuse_prefix(self, seq: _Sequence, minimum: int = 32) -> None:
        """Start a new sequence's cache from the longest stored prompt prefix it shares (if long enough).

        Cache tensors are never written in place (a cache update concatenates into new tensors), so
        sequences can share one prefix's tensors safely.
        """
        best, best_kv = 0, None
        for tokens, kv in self.prefixes:
            n = _common_prefix(tokens, seq.ids)
            if n > best:
                best, best_kv = n, kv
        best = min(best, len(seq.ids) - 1)  # at least one token must be computed to get logits
        if best >= minimum and best_kv is not None:
            seq.cache = [(k[:, :, :best], v[:, :, :best]) for k, v in best_kv]
            self.tokens_reused += best

    def _remember_prefix(self, tokens: list[int], kv: KV, keep: int = 4) -> None:
        self.prefixes = [(tokens, kv)] + [(t, c) for t, c in self.prefixes if t[: len(tokens)] != tokens][: keep - 1]

    def _join(self, joining: list[tuple[_Row, KV]]) -> None:
        """Add rows to the batch with one concatenation per layer (not one per row)."""
        parts = ([] if self.batch is None else [self.batch]) + [kv for _, kv in joining]
        width = max(int(kv[0][0].shape[2]) for kv in parts)
        self.batch = [(torch.cat([_pad(kv[layer][0], width) for kv in parts]),
                       torch.cat([_pad(kv[layer][1], width) for kv in parts]))
                      for layer in range(len(parts[0]))]
        self.cache = None
        self.rows += [row for row, _ in joining]
        self.lengths += [int(kv[0][0].shape[2]) for _, kv in joining]

    @torch.no_grad()
    def _decode_step(self) -> None:
        live = [i for i, r in enumerate(self.rows) if r.finish is None]
        if not live:
            return
        assert self.batch is not None
        width = int(self.batch[0][0].shape[2])
        mask = torch.zeros(len(self.rows), width + 1, dtype=torch.long, device=self.device)
        for i, length in enumerate(self.lengths):
            mask[i, width - length:] = 1
        inputs = torch.tensor([[max(r.pending, 0)] for r in self.rows], device=self.device)
        positions = torch.tensor([[length] for length in self.lengths], device=self.device)
        if self.cache is None:  # built once per batch composition, then appended to in place
            self.cache = _buffered_cache(self.model, self.batch, room=256)
        out = self.model(input_ids=inputs, attention_mask=mask, past_key_values=self.cache, position_ids=positions,
                         use_cache=True)
        self.batch = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.lengths = [n + 1 for n in self.lengths]
        self.tokens_computed += len(live)
        self.decode_steps += 1
        tokens, logprobs = self._sample(out.logits[:, -1, :], [r.seq.generator for r in self.rows])
        for i in live:
            self._accept(self.rows[i], tokens[i], logprobs[i])

    def _accept(self, row: _Row, token: int, logprob: float) -> None:
        if row.pending >= 0:
            row.seq.ids.append(row.pending)  # the fed token is now part of the cache
        row.sampled.append(token)
        row.logprobs.append(logprob)
        row.pending = token
        if token in self.stop_ids:
            row.finish = "stop"
        elif len(row.sampled) >= row.max_new:
            row.finish = "length"

    def _sample(self, logits: torch.Tensor, generators: list[torch.Generator]) -> tuple[list[int], list[float]]:
        logits = logits.float()
        temperature = self.temperature if self.temperature > 0 else 1.0
        logp = torch.log_softmax(logits / temperature, dim=-1)
        if self.temperature <= 0:
            tokens = logits.argmax(dim=-1)
        else:
            probs = logp.exp()
            if self.top_p < 1.0:
                sorted_p, order = probs.sort(dim=-1, descending=True)
                drop = sorted_p.cumsum(dim=-1) - sorted_p > self.top_p
                sorted_p[drop] = 0.0
                probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
            tokens = torch.stack([torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(generators)])
        chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens.tolist(), chosen.tolist()

    def _release_finished(self) -> None:
        """Hand finished rows their results and cache, and drop them (and shared padding) from the batch."""
        done = [i for i, r in enumerate(self.rows) if r.finish is not None]
        if not done:
            return
        assert self.batch is not None
        width = int(self.batch[0][0].shape[2])
        for i in done:
            row, length = self.rows[i], self.lengths[i]
            row.seq.cache = [(k[i:i + 1, :, width - length:].clone(), v[i:i + 1, :, width - length:].clone())
                             for k, v in self.batch]
            row.seq.ids.append(row.pending)  # the stop token: in the ids, not yet in the cache
            if not row.future.done():
                row.future.set_result((row.sampled, row.logprobs, row.finish or "stop"))
        keep = [i for i in range(len(self.rows)) if i not in set(done)]
        self.cache = None
        if not keep:
            self.batch, self.rows, self.lengths = None, [], []
            return
        index = torch.tensor(keep, device=self.device)
        lengths = [self.lengths[i] for i in keep]
        trim = width - max(lengths)
        self.batch = [(k.index_select(0, index)[:, :, trim:], v.index_select(0, index)[:, :, trim:])
                      for k, v in self.batch]
        self.rows = [self.rows[i] for i in keep]
        self.lengths = lengths


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad a [rows, heads, length, dim] cache tensor with zeros to ``width`` positions."""
    missing = width - t.shape[2]
    if missing == 0:
        return t
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], missing, t.shape[3]), t], dim=2)


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
        self.engine = BatchedGenerator(self.model, stop, temperature, top_p, max_batch)

    def chat_format(self, domain: Domain) -> ChatFormat:
        if domain.name not in self._formats:
            self._formats[domain.name] = ChatFormat(self.tokenizer, [t.spec for t in domain.tools])
        return self._formats[domain.name]

    def session(self, domain: Domain, task: Task) -> HFSession:
        self._sessions += 1
        digest = hashlib.sha256(f"{self.seed}:{task.id}:{self._sessions}".encode()).digest()
        generator = torch.Generator(device=self.engine.device).manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        return HFSession(self, self.chat_format(domain), _Sequence(generator=generator))


class HFSession(PolicySession):
    """One episode: the append-only token sequence and its parsed messages."""

    def __init__(self, policy: HFPolicy, chat: ChatFormat, seq: _Sequence):
        self.policy = policy
        self.chat = chat
        self.seq = seq
        self.messages: list[Message] = []
        self.turn = 0
        self.append_only = True

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        if not self.messages:
            prompt = self.chat.prompt_ids(new_messages)
        else:
            prompt, append_only = self.chat.delta_ids(self.messages, new_messages)
            self.append_only &= append_only
        self.messages.extend(new_messages)
        room = self.policy.max_context - len(self.seq.ids) - len(prompt)
        if room <= 0:
            return AgentTurn(message=Message(role="assistant", content=""), finish="context")
        max_new = min(self.policy.max_new_tokens, room)
        sampled, logprobs, finish = await self.policy.engine.generate(self.seq, prompt, max_new)
        if finish == "length" and max_new < self.policy.max_new_tokens:
            finish = "context"
        parsed = self.chat.parse(sampled, call_prefix=f"call_{self.turn}")
        self.turn += 1
        message = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls)
        self.messages.append(message)
        return AgentTurn(message=message, token_ids=sampled, logprobs=logprobs, prompt_ids=prompt,
                         parse_errors=parsed.errors, finish=finish)

    def close(self) -> dict[str, Any]:
        """Free the KV cache; report whether a full re-render would have tokenized differently."""
        self.seq.cache = None
        ids = self.seq.ids
        return {"drift": self.chat.drifted(ids, self.messages) if self.messages else False,
                "append_only": self.append_only}
