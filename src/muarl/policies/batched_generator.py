"""The transformers generation engine under :class:`~muarl.policies.hf.HFPolicy`: dynamic batching across
episodes, KV cache kept between turns, the shared opening attended to once.

Every episode waiting for the agent joins one running decode batch at the next token step (it does not
wait for the batch to drain), and leaves it when it stops. Each episode keeps its own KV cache between
turns, so a new turn prefills only the tokens appended since the last one: every token of a
conversation goes through the model at most once. The opening prompt's shared prefix (the system turn
with policy and tool schemas, identical for every episode of a domain, most of a short conversation)
is computed once, kept once, and attended to once per step for the whole batch (cascade attention). The
model runs in a worker thread so the event loop keeps serving users and tools (an LLM user's HTTP call
overlaps with other episodes' decoding).

Rows are batched by left-padding their caches to a common width; a boolean column mask per row marks
real tokens (admission prefills several requests in one pass, leaving masked holes where a row adds
fewer tokens than its bucket's longest), and positions are passed explicitly for the rotary embeddings.
Kept apart from the policy (chat rendering, parsing, sessions) because it knows nothing of chats: it
turns token ids into sampled token ids and their log-probs.

Which rows share a pass changes the numbers (a CPU matmul's rounding depends on the batch's shape, the
attention's on the padded width), so an engine that admits requests as they arrive samples log-probs, and
so tokens, that depend on timing. With ``deterministic`` (:class:`~muarl.policies.hf.HFPolicy`'s
default) the engine knows its open sessions and runs a pass only when every one of them has either
submitted its next request or ended, then admits the requests ordered by session key, never by arrival:
every pass is then made the same way whatever the timing, and so is everything the engine decides from
its batch (free slots, compaction, the shared prefix). The price is that the batch waits for the slowest
episode's tool call or user reply (``benchmarks/rollout_throughput.py`` measures it).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from muarl.attention import KV, SHARED_PREFIX, SharedPrefix, unattended_is_zero, use_kernel


def _buffered_cache(model: Any, kv: KV | None, room: int, length: int | None = None) -> Any:
    """A transformers cache whose layers append into preallocated buffers.

    The stock ``DynamicCache`` concatenates the whole cache with every new token (and copies it once
    more when built from tensors): O(length) memory traffic per token per layer, which dominates decode
    time and doubles peak memory for a 64-row batch. Writing in place into a buffer with ``room`` spare
    positions (grown by doubling when full) makes an append O(1). With ``length`` the tensors in ``kv``
    already are such buffers (their first ``length`` positions filled) and are used as they are, not
    copied: the decode batch builds them directly when rows join or leave (:meth:`BatchedGenerator._join`).
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            if length is None:
                b, h, n, d = keys.shape
                self._k = keys.new_empty(b, h, n + room, d)
                self._v = values.new_empty(b, h, n + room, values.shape[3])
                self._k[:, :, :n], self._v[:, :, :n] = keys, values
            else:
                n, self._k, self._v = length, keys, values
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


@dataclass(eq=False)
class Session:
    """An episode open on a deterministic engine (:meth:`BatchedGenerator.open_session`): the engine's
    passes wait for it until it has a request in, has ended (:meth:`BatchedGenerator.close_session`), or
    its ``owner`` (the asyncio task that plays it) is done or waiting on the engine for another session.
    ``key`` orders the rows of a pass: it must not depend on timing (the episode's seed does not)."""

    key: tuple
    owner: asyncio.Task | None = None
    closed: bool = False


@dataclass
class TokenSequence:
    """One episode's token state: every id so far, and the KV cache of all but the last sampled one.

    When ``shared`` the first ``offset`` ids live in the engine's shared prefix and ``cache`` holds only
    the KV of the ids after it. ``session``: its place among a deterministic engine's open sessions.
    """

    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    cache: KV | None = None
    started: bool = False
    shared: bool = False
    offset: int = 0
    session: Session | None = None
    #: seconds this episode's turns spent queued, in their prefill pass and decoding (muarl.time_split)
    timing: dict[str, float] = field(default_factory=lambda: {"queue_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0})

    @property
    def cached(self) -> int:
        return self.offset + (0 if self.cache is None else int(self.cache[0][0].shape[2]))


@dataclass
class _Row:
    """A sequence inside the running decode batch."""

    seq: TokenSequence
    future: asyncio.Future
    max_new: int
    pending: int  # the sampled token not yet fed to the model
    prefilled: float = 0.0  # when its prefill pass ended: decoding from there
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


@dataclass
class _Request:
    seq: TokenSequence
    new_ids: list[int]
    max_new: int
    future: asyncio.Future
    prefix_len: int = 0
    queued: float = field(default_factory=time.perf_counter)



def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` in the transformers that renamed it
    (5.2x; ``past_key_values`` is deprecated there and goes in 5.40), ``past_key_values`` before. Both
    ends of the supported range are tested: the main environment and the vLLM one pin different ones."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned, under either name (see :func:`cache_keyword`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values

class BatchedGenerator:
    """The shared engine: a queue of requests and one decode batch that requests join and leave."""

    def __init__(self, model: Any, stop_ids: set[int], temperature: float, top_p: float, max_batch: int,
                 deterministic: bool = False):
        self.model = model
        self.stop_ids = stop_ids
        self.temperature = temperature
        self.top_p = top_p
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self.queue: list[_Request] = []
        #: the decode batch's rows; None is a free slot (a row that finished), which the next row to join
        #: takes over, so that rows leaving and joining copy one row's cache, not the whole batch's
        self.rows: list[_Row | None] = []
        self.cache: Any = None  # the decode batch's cache: buffered layers, rows left-padded (see ``batch``)
        self.mask: torch.Tensor | None = None  # [rows, length] bool: which cache columns hold a real token
        self.wakeup: asyncio.Event | None = None
        self.runner: asyncio.Task | None = None
        self.tokens_computed = 0  # positions run through the model (prefill + decode)
        self.tokens_reused = 0  # positions served from the shared prefix instead of being recomputed
        self.prefix_computed = 0  # of tokens_computed, those spent computing the shared prefix itself
        self.decode_steps = 0
        self.prefill_passes = 0
        self.slot_fills = 0  # rows that joined into a free slot (one row's copy)
        self.rebuilds = 0  # times the whole decode buffer was rebuilt (every live row's copy)
        #: False: every join and every finished row rebuilds the batch (copies every row's cache), as
        #: engines without slot reuse do; kept so the rollout benchmark can measure what reuse saves
        self.reuse_slots = True
        #: event-loop rounds to wait before admitting, so the episodes released by the last step (tool
        #: calls, user replies, rendering: a few awaits each) join in one batched prefill, not one by one
        self.settle = 8
        #: True: a pass runs only when every open session (:meth:`open_session`) has its request in or has
        #: ended, and requests are admitted in session-key order: the batches, and so the samples, do not
        #: depend on timing. False: requests join the running batch in arrival order (what a server does)
        self.deterministic = deterministic
        self.sessions: list[Session] = []  # open sessions (only a deterministic engine waits for them)
        self.holds = 0  # times a deterministic engine held a pass back for an open session
        #: the system turn every episode of a domain opens with (policy + tool schemas: most of a prompt),
        #: computed once and attended to by all rows at once; the first opening request sets it
        self.prefix: SharedPrefix | None = None
        #: held around each pass of the model (admission prefill, decode step), and by whoever changes the
        #: model's weights while it samples (:meth:`muarl.policies.hf.HFPolicy.swapping_weights`)
        self.lock = threading.Lock()
        self.cache_keyword = cache_keyword(model)
        use_kernel(model, SHARED_PREFIX)
        #: whether requests with nothing cached (a server's, without a shared prefix) are prefilled together:
        #: their left padding attends to no key, which must give zeros, not NaN (:func:`unattended_is_zero`);
        #: else each is prefilled alone (32 passes instead of 1 for 32 new requests)
        self.fresh_rows_together = unattended_is_zero(self.device, next(model.parameters()).dtype)

    @property
    def batch(self) -> KV | None:
        """Per layer (K, V) of the decode batch, [rows, heads, length, dim]: views of ``cache``'s buffers."""
        return None if self.cache is None else [(layer.keys, layer.values) for layer in self.cache.layers]

    async def generate(self, seq: TokenSequence, new_ids: list[int], max_new: int,
                       prefix_len: int = 0) -> tuple[list[int], list[float], str]:
        """Append ``new_ids`` to the sequence and sample up to ``max_new`` tokens (stops at end of turn).

        ``prefix_len`` (opening turns only) says how many leading tokens are a prefix other episodes
        share, typically the system turn.
        """
        loop = asyncio.get_running_loop()
        if self.wakeup is None or self.runner is None or self.runner.done():
            if self.runner is not None and self.runner.done() and not self.runner.cancelled():
                self.runner.result()  # surface a crash of the previous runner
            self.wakeup = asyncio.Event()
            self.runner = loop.create_task(self._run())
        future = loop.create_future()
        if seq.session is not None and seq.session.owner is None:  # opened outside the event loop
            self._own(seq.session)
        self.queue.append(_Request(seq, new_ids, max_new, future, prefix_len))
        self.wakeup.set()
        return await future

    # -- open sessions (deterministic admission) ----------------------------------------------------------
    def open_session(self, key: tuple) -> Session:
        """Register an episode the engine's passes wait for when ``deterministic`` (call it where the episode
        is played, from its task: it becomes the session's owner). ``key`` orders its rows in a pass."""
        session = Session(key)
        self.sessions = [s for s in self.sessions if s.owner is None or not s.owner.done()] + [session]
        self._own(session)
        return session

    def close_session(self, session: Session | None) -> None:
        """The episode ended: the engine's passes stop waiting for it."""
        if session is None or session.closed:
            return
        session.closed = True
        self.sessions = [s for s in self.sessions if s is not session]
        self._poke()

    def _own(self, session: Session) -> None:
        try:
            session.owner = asyncio.current_task()
        except RuntimeError:  # no running event loop: bound when it first generates
            return
        if session.owner is not None:
            session.owner.add_done_callback(lambda _task: self._poke())

    def _poke(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()

    def _held_back(self) -> bool:
        """Whether a deterministic engine must wait before its next pass: some open session may still
        submit a request this pass would include. It does not wait for a session whose owner is done (an
        episode that ended without closing it) or is waiting on the engine for another of its sessions, nor
        once the queue and the batch hold ``max_batch`` requests (no more rows could join: an asynchronous
        stream's gate lets no more in, :class:`~muarl.train.async_rollouts.OldestFirst`)."""
        if not self.deterministic or not self.sessions:
            return False
        rows = [r for r in self.rows if r is not None and r.finish is None]
        if len(self.queue) + len(rows) >= self.max_batch:
            return False
        self.sessions = [s for s in self.sessions if s.owner is None or not s.owner.done()]
        waiting = [item.seq.session for item in [*self.queue, *rows]
                   if item.seq.session is not None and not item.future.done()]
        served, busy = {id(s) for s in waiting}, {id(s.owner) for s in waiting if s.owner is not None}
        return any(id(s) not in served and s.owner is not None and id(s.owner) not in busy for s in self.sessions)

    async def _run(self) -> None:
        assert self.wakeup is not None
        try:
            while True:
                if not self.rows and not self.queue:
                    self.wakeup.clear()
                    await self.wakeup.wait()
                for _ in range(self.settle):  # let episodes whose turn just ended queue their next request
                    await asyncio.sleep(0)
                if self._held_back():  # an open session has not asked yet: the pass must include it
                    self.holds += 1
                    self.wakeup.clear()  # set again by a request, a session's end or its task's
                    await self.wakeup.wait()
                    continue
                if self.deterministic:  # rows in session order, never arrival order (a stable sort)
                    self.queue.sort(key=lambda req: (0, req.seq.session.key) if req.seq.session else (1,))
                if self.queue and self._live() < self.max_batch:
                    take = self.queue[: self.max_batch - self._live()]
                    del self.queue[: len(take)]
                    await asyncio.to_thread(self._locked, self._admit, take)
                    self._release_finished()  # a turn can end on its first token
                if self.rows:
                    await asyncio.to_thread(self._locked, self._decode_step)
                    self._release_finished()
        except Exception as err:  # fail every waiting episode loudly rather than hang them
            for item in [r for r in self.rows if r is not None] + self.queue:
                if not item.future.done():
                    item.future.set_exception(err)
            self.rows, self.queue, self.mask, self.cache = [], [], None, None
            raise

    def _locked(self, work: Any, *args: Any) -> None:
        with self.lock:
            work(*args)

    # -- model work (worker thread) -----------------------------------------------------------------
    @torch.no_grad()
    def _admit(self, requests: list[_Request]) -> None:
        """Prefill the new tokens of many requests in a few batched forward passes, sample each one's first
        token, and add them to the decode batch.

        Requests are bucketed by how many tokens they add; inside a bucket each row's new tokens are
        right-aligned, and the columns a shorter row does not fill are masked holes in its cache.
        """
        pending: list[tuple[_Request, list[int]]] = []
        for req in requests:
            seq = req.seq
            seq.ids.extend(req.new_ids)
            if not seq.started:
                seq.started = True
                self._attach_prefix(seq, req.prefix_len)
            pending.append((req, seq.ids[seq.cached:]))
        pending.sort(key=lambda item: len(item[1]))
        bucket: list[tuple[_Request, list[int]]] = []
        for item in pending:
            # a fresh row's left padding sees no key at all: batched only where attention gives such a query zeros
            alone = item[0].seq.cache is None and not item[0].seq.shared and not self.fresh_rows_together
            if bucket and (alone or len(item[1]) > 1.5 * len(bucket[0][1]) + 16):
                self._prefill(bucket)
                bucket = []
            bucket.append(item)
            if alone:
                self._prefill(bucket)
                bucket = []
        if bucket:
            self._prefill(bucket)

    def _prefill(self, bucket: list[tuple[_Request, list[int]]]) -> None:
        began = time.perf_counter()
        seqs = [req.seq for req, _ in bucket]
        width = max(len(new) for _, new in bucket)
        own = [0 if s.cache is None else int(s.cache[0][0].shape[2]) for s in seqs]
        longest = max(own)
        pad = self.model.config.pad_token_id or 0
        inputs = torch.tensor([[pad] * (width - len(new)) + new for _, new in bucket], device=self.device)
        mask = torch.zeros(len(bucket), longest + width, dtype=torch.bool, device=self.device)
        positions = torch.empty(len(bucket), width, dtype=torch.long, device=self.device)
        for i, ((_, new), seq, n) in enumerate(zip(bucket, seqs, own, strict=True)):
            mask[i, longest - n:longest] = True
            mask[i, longest + width - len(new):] = True
            start = seq.offset + n
            positions[i] = torch.arange(start - (width - len(new)), start + len(new)).clamp_(min=start)
        kv = None
        if longest:
            layers = len(next(s.cache for s in seqs if s.cache is not None))
            kv = []
            for layer in range(layers):
                parts = [_pad_or_empty(s.cache, layer, longest, _template(seqs)) for s in seqs]
                kv.append((torch.cat([k for k, _ in parts]), torch.cat([v for _, v in parts])))
        cache = _buffered_cache(self.model, kv, room=width)
        out = self.model(input_ids=inputs, attention_mask=mask.long(), **{self.cache_keyword: cache},
                         position_ids=positions, use_cache=True, logits_to_keep=1,
                         shared_prefix=self._prefix_for(seqs))
        self.tokens_computed += sum(len(new) for _, new in bucket)
        self.prefill_passes += 1
        rows = []
        tokens, logprobs = self._sample(out.logits[:, -1, :], [s.generator for s in seqs])
        ended = time.perf_counter()
        for (req, _), token, logprob in zip(bucket, tokens, logprobs, strict=True):
            req.seq.cache = None
            req.seq.timing["queue_s"] += began - req.queued
            req.seq.timing["prefill_s"] += ended - began
            row = _Row(seq=req.seq, future=req.future, max_new=req.max_new, pending=-1, prefilled=ended)
            self._accept(row, token, logprob)
            rows.append(row)
        self._join(rows, [(layer.keys, layer.values) for layer in returned_cache(out).layers], mask)

    def _attach_prefix(self, seq: TokenSequence, prefix_len: int, minimum: int = 16) -> None:
        """Put a new sequence on the shared prefix if it starts with it (the first one creates it)."""
        if prefix_len < minimum or prefix_len >= len(seq.ids):
            return
        if self.prefix is None:
            self._compute_prefix(seq.ids[:prefix_len])
        plen = len(self.prefix.tokens)
        if seq.ids[:plen] == self.prefix.tokens and len(seq.ids) > plen:
            seq.shared, seq.offset = True, plen
            self.tokens_reused += plen

    def _compute_prefix(self, tokens: list[int]) -> None:
        out = self.model(input_ids=torch.tensor([tokens], device=self.device), use_cache=True, logits_to_keep=1)
        self.prefix = SharedPrefix(tokens, [(layer.keys[0], layer.values[0]) for layer in returned_cache(out).layers])
        self.tokens_computed += len(tokens)
        self.prefix_computed += len(tokens)

    @torch.no_grad()
    def refresh_prefix(self) -> None:
        """The shared opening's KV again, from the model's current weights (after an update). Rows in flight
        that sit on it attend to the new one from their next pass, as their own next tokens come from the new
        weights (asynchronous GRPO syncs between two passes); dropping it instead would leave them attending
        to no system turn at all until a new episode computed it again."""
        if self.prefix is not None:
            self._compute_prefix(self.prefix.tokens)

    def _prefix_for(self, seqs: list[TokenSequence | None]) -> SharedPrefix | None:
        """The shared prefix with this forward pass's row mask (free slots: off), or None when no row uses it."""
        shared = [s is not None and s.shared for s in seqs]
        if self.prefix is None or not any(shared):
            return None
        use = torch.tensor(shared, dtype=torch.bool, device=self.device)
        return SharedPrefix(self.prefix.tokens, self.prefix.kv, use)

    def _live(self) -> int:
        return sum(r is not None for r in self.rows)

    def _join(self, rows: list[_Row], kv: KV, mask: torch.Tensor) -> None:
        """Add rows (their cache and column mask) to the batch.

        When the batch has enough free slots and the new rows are no wider than it, each new row's cache
        is written into a free slot, right-aligned (one row's copy). Otherwise the batch is rebuilt with
        them (:meth:`_rebuild`).
        """
        free = [i for i, r in enumerate(self.rows) if r is None]
        if (self.reuse_slots and self.mask is not None and len(free) >= len(rows)
                and mask.shape[1] <= self.mask.shape[1]):
            self._fill(free[: len(rows)], rows, kv, mask)
            self.slot_fills += len(rows)
            return
        self._rebuild(rows, kv, mask)

    def _rebuild(self, rows: Sequence[_Row] = (), kv: KV | None = None, mask: torch.Tensor | None = None) -> None:
        """A new decode buffer holding the live rows and then ``rows`` (whose cache is ``kv``, columns
        ``mask``), each copied once, right-aligned, with room to grow: free slots are dropped, and so are
        leading columns no live row uses. (Not concatenated, then copied again into a buffer: with wide
        KV caches these copies are most of a rollout's time.)"""
        self.rebuilds += 1
        live = [i for i, r in enumerate(self.rows) if r is not None]
        parts: list[list[tuple[list[torch.Tensor], list[torch.Tensor]]]] = []  # per source, per layer: K and V
        masks: list[torch.Tensor] = []
        if live:
            assert self.batch is not None and self.mask is not None
            trim = int(self.mask[live].any(dim=0).nonzero()[0])
            parts.append([(_row_runs(k[:, :, trim:], live), _row_runs(v[:, :, trim:], live)) for k, v in self.batch])
            masks.append(self.mask[live, trim:])
        if kv is not None and mask is not None:
            parts.append([([k], [v]) for k, v in kv])
            masks.append(mask)
        width = max(m.shape[1] for m in masks)
        buffers = [(_stack_left_padded([t for source in parts for t in source[layer][0]], width, DECODE_ROOM),
                    _stack_left_padded([t for source in parts for t in source[layer][1]], width, DECODE_ROOM))
                   for layer in range(len(parts[0]))]
        self.cache = _buffered_cache(self.model, buffers, room=0, length=width)
        self.mask = torch.cat([_pad_mask(m, width) for m in masks])
        self.rows = [self.rows[i] for i in live] + list(rows)

    def _fill(self, slots: list[int], rows: list[_Row], kv: KV, mask: torch.Tensor) -> None:
        """Write new rows into free slots of the decode buffer, right-aligned at its current length."""
        assert self.cache is not None and self.mask is not None
        width, n = self.mask.shape[1], mask.shape[1]
        index = torch.tensor(slots, device=self.device)
        for layer, (k, v) in zip(self.cache.layers, kv, strict=True):
            for buffer, new in ((layer._k, k), (layer._v, v)):
                buffer[index, :, : width - n] = 0  # masked, but never garbage (0 * inf would be NaN)
                buffer[index, :, width - n: width] = new
        self.mask[index] = _pad_mask(mask, width)
        for slot, row in zip(slots, rows, strict=True):
            self.rows[slot] = row

    @torch.no_grad()
    def _decode_step(self) -> None:
        self._compact()
        live = [i for i, r in enumerate(self.rows) if r is not None and r.finish is None]
        if not live:
            return
        assert self.cache is not None and self.mask is not None
        rows = [r for r in self.rows if r is not None]
        # a free slot decodes a pad token over its stale columns (its own new column keeps the softmax
        # finite); nothing of it is sampled or kept
        mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        inputs = torch.tensor([[max(r.pending, 0) if r else 0] for r in self.rows], device=self.device)
        offsets = torch.tensor([r.seq.offset if r else 0 for r in self.rows], device=self.device)
        positions = (offsets + self.mask.sum(dim=1)).unsqueeze(1)
        # the cache is built when rows join or leave, then appended to in place
        out = self.model(input_ids=inputs, attention_mask=mask.long(), **{self.cache_keyword: self.cache},
                         position_ids=positions, use_cache=True,
                         shared_prefix=self._prefix_for([r.seq if r else None for r in self.rows]))
        self.mask = mask
        self.tokens_computed += len(live)
        self.decode_steps += 1
        logits = out.logits[:, -1, :]
        if len(rows) < len(self.rows):
            logits = logits[[i for i, r in enumerate(self.rows) if r is not None]]
        tokens, logprobs = self._sample(logits, [r.seq.generator for r in rows])
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            if row.finish is None:
                self._accept(row, token, logprob)

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
            # inverse-CDF sampling: one uniform draw from each episode's own generator (so an episode's
            # samples do not depend on who shares its batch), then one batched search
            u = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in generators])
            cdf = probs.cumsum(dim=-1)
            u = u * cdf[:, -1]
            tokens = torch.searchsorted(cdf, u.unsqueeze(-1)).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
        chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens.tolist(), chosen.tolist()

    def _release_finished(self) -> None:
        """Hand finished rows their results and (hole-free) cache, and free their slots in the batch.

        A freed slot stays in the buffer for the next row to join (their episodes usually come back for
        their next turn before the next decode step); :meth:`_compact` drops the slots nobody took.
        """
        done = [i for i, r in enumerate(self.rows) if r is not None and r.finish is not None]
        if not done:
            return
        batch = self.batch
        assert batch is not None and self.mask is not None
        now = time.perf_counter()
        for i in done:
            row, cols = self.rows[i], self.mask[i].nonzero().squeeze(1)
            assert row is not None
            row.seq.cache = [(k[i:i + 1, :, cols], v[i:i + 1, :, cols]) for k, v in batch]  # gathers copy
            row.seq.ids.append(row.pending)  # the stop token: in the ids, not yet in the cache
            row.seq.timing["decode_s"] += now - row.prefilled
            if not row.future.done():
                row.future.set_result((row.sampled, row.logprobs, row.finish or "stop"))
            self.rows[i] = None
        if all(r is None for r in self.rows):
            self.rows, self.mask, self.cache = [], None, None

    def _compact(self) -> None:
        """Before a decode step: when more than a quarter of the batch's slots are free (their episodes
        ended, or wait on a slow user or tool), rebuild the batch from its live rows. A few free slots
        cost less decode work than copying every row. Without slot reuse, any free slot is dropped."""
        free = sum(r is None for r in self.rows)
        if free > (0.25 if self.reuse_slots else 0.0) * len(self.rows):
            self._rebuild()


def _template(seqs: list[TokenSequence]) -> KV:
    """A cache of some sequence in ``seqs``: the shapes and dtypes for rows that have none yet."""
    return next(s.cache for s in seqs if s.cache is not None)


def _pad_or_empty(cache: KV | None, layer: int, width: int, like: KV) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's cache for one layer, left-padded to ``width`` (all padding when it has none)."""
    if cache is None:
        k, v = like[layer]
        return (k.new_zeros(1, k.shape[1], width, k.shape[3]), v.new_zeros(1, v.shape[1], width, v.shape[3]))
    return _pad(cache[layer][0], width), _pad(cache[layer][1], width)


def _row_runs(t: torch.Tensor, rows: list[int]) -> list[torch.Tensor]:
    """Views of ``t`` holding ``rows`` (sorted), one per run of consecutive rows: selected without a copy."""
    runs: list[torch.Tensor] = []
    start = prev = rows[0]
    for r in rows[1:] + [-1]:
        if r != prev + 1:
            runs.append(t[start:prev + 1])
            start = r
        prev = r
    return runs


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)


#: spare positions a decode buffer is built with (it doubles when full)
DECODE_ROOM = 256


def _stack_left_padded(parts: list[torch.Tensor], width: int, room: int) -> torch.Tensor:
    """[rows, heads, length, dim] tensors stacked by rows, each right-aligned at ``width`` (zeros to its
    left, like :func:`_pad`), into a new buffer with ``room`` unset positions after ``width``."""
    rows = sum(t.shape[0] for t in parts)
    first = parts[0]
    out = first.new_empty(rows, first.shape[1], width + room, first.shape[3])
    row = 0
    for t in parts:
        n = t.shape[2]
        out[row:row + t.shape[0], :, :width - n].zero_()
        out[row:row + t.shape[0], :, width - n:width] = t
        row += t.shape[0]
    return out


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad a [rows, heads, length, dim] cache tensor with zeros to ``width`` positions."""
    missing = width - t.shape[2]
    if missing == 0:
        return t
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], missing, t.shape[3]), t], dim=2)
