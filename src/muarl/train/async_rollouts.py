"""Asynchronous GRPO (``--max-staleness N``): episodes keep being played while the trainer updates.

In the method's own setting the simulated user is an API model and an episode mostly waits for its
replies; a synchronous step (sample, then update) leaves the trainer idle while users think and the
sampler idle while the trainer updates, and waits for the step's slowest episode. Here a
:class:`RolloutStream` plays groups in a thread of its own, on the sampler's own weights, and
hands them to the trainer as they finish (muarl's engine samples from a
:class:`~muarl.train.samplers.CopySampler`'s copy of the model; a vLLM engine or server holds its own):

- every group records the weights version it started under (``policy_version`` in each episode's
  metadata; a version is one update), and every agent turn its own (``turn_versions``; a turn a sync
  overlapped is counted in ``turns_across_sync``: its tokens keep the log-probs they were drawn with, which
  the importance weights below correct); the trainer takes finished groups in the order they finished and
  drops (and counts) any whose version is more than N updates behind its own;
- the stream starts a group only while fewer than (updates so far + N + 1) steps' worth were started
  (AReaL's bound), so groups that finish in order are never too stale to use; a group the trainer drops
  or discards (dynamic sampling) is replaced; nor does it start groups that no remaining step will take;
  with N = 0 a run plays in lockstep instead (:mod:`muarl.train.orchestrator`), and the stream at 0
  would yield the same groups;
- with muarl's engine, up to twice its batch of episodes in flight (N = 1), the batch's places go to the
  oldest group's turns first (:class:`OldestFirst`): the groups the trainer needs next finish as soon as
  in a synchronous step, and the next step's use the places those leave while they wait for users;
- after each update the trainer pushes its weights into the sampler (:meth:`RolloutStream.sync`),
  between two forward passes of muarl's engine (its ``swapping_weights``: a lock it takes per pass) or
  two requests of a vLLM engine (in process: it drains its batch first; a server: paused, reloaded,
  resumed): episodes in
  flight go on with the new weights (with muarl's engine, attending to the cache their earlier tokens
  left under the old ones; only the shared opening is recomputed), and every token keeps the log-prob it
  was drawn with;
- the update weighs each token by the truncated importance ratio of the trainer's pre-update log-probs
  to those behaviour log-probs (``--tis-cap``, 2 unless set), so stale tokens are corrected as the
  engine/trainer mismatch is; the KL term is unchanged.

A killed asynchronous run resumes from its last checkpoint when rerun; the episodes that were in flight
are lost and played again (the data position is the count of groups the trainer consumed, trained or
dropped). Unlike a synchronous run, an asynchronous one is not reproducible bit for bit: which weights an
episode meets depends on timing.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rollout import RolloutEngine
from muarl.types import Message, Task, Trajectory


@dataclass
class Finished:
    """A group the stream played: its task's position in the run's task order, the weights version it
    started under, and its episodes."""

    position: int
    version: int
    group: list[Trajectory]


@dataclass
class Taken:
    """What :meth:`RolloutStream.take` handed the trainer for one step."""

    groups: list[Finished]
    dropped: int  # groups too stale to use (more than N updates old), counted and discarded
    uninformative: int  # with dynamic sampling: groups whose members all scored alike, discarded
    waited_s: float  # how long the trainer waited for them (trainer idle)
    staleness: list[int] = field(default_factory=list)  # per kept group: trainer version - group version


class OldestFirst:
    """At most ``width`` agent turns generating at once (muarl's engine: its decode batch), the next free
    place going to the waiting turn of the oldest group (lowest position; first come among equals).

    The stream has up to (N + 1) steps' worth of episodes in flight, more than the engine's batch; without
    this, the engine admits its queue first come first served, so every episode in flight advances at the
    same slow pace and the step's groups finish no sooner than the next step's. Oldest first, the groups the
    trainer needs next play as in a synchronous step, and younger ones use the batch's places that older
    episodes leave while they wait for their user or a tool."""

    def __init__(self, width: int):
        self.width, self.busy = width, 0
        self.waiting: list[tuple[int, int, asyncio.Future]] = []  # a heap of (priority, arrival, future)
        self.arrivals = itertools.count()

    async def acquire(self, priority: int) -> None:
        if self.busy < self.width and not self.waiting:
            self.busy += 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiting, (priority, next(self.arrivals), future))
        try:
            await future  # the place is handed over by release(): ``busy`` already counts it
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a place, then cancelled: give it on
            else:
                self.waiting = [w for w in self.waiting if w[2] is not future]
                heapq.heapify(self.waiting)
            raise

    def release(self) -> None:
        while self.waiting:
            future = heapq.heappop(self.waiting)[2]
            if not future.done():
                future.set_result(None)
                return
        self.busy -= 1


class _Prioritized(Policy):
    """``policy`` with each agent turn of its sessions taking a place of ``gate`` at ``priority``."""

    def __init__(self, policy: Policy, gate: OldestFirst, priority: int):
        self.policy, self.gate, self.priority = policy, gate, priority
        self.name = policy.name

    def session(self, domain: Any, task: Task, seed: int | None = None) -> PolicySession:
        return _PrioritizedSession(self.policy.session(domain, task, seed), self.gate, self.priority)

    def provenance(self) -> dict[str, Any]:
        return self.policy.provenance()


class _PrioritizedSession(PolicySession):
    def __init__(self, inner: PolicySession, gate: OldestFirst, priority: int):
        self.inner, self.gate, self.priority = inner, gate, priority

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        await self.gate.acquire(self.priority)
        try:
            return await self.inner.next(new_messages)
        finally:
            self.gate.release()

    def close(self) -> dict[str, Any]:
        return self.inner.close()


class _Versioned(Policy):
    """``policy`` whose sessions record, per agent turn, the weights version it was sampled under."""

    def __init__(self, policy: Policy, stream: RolloutStream):
        self.policy, self.stream = policy, stream
        self.name = policy.name

    def session(self, domain: Any, task: Task, seed: int | None = None) -> PolicySession:
        return _VersionedSession(self.policy.session(domain, task, seed), self.stream)

    def provenance(self) -> dict[str, Any]:
        return self.policy.provenance()


class _VersionedSession(PolicySession):
    """Each agent turn's weights version (the newest fully synced when the turn began) and whether a sync
    overlapped it: one that had begun by the turn's end but was not done at its start, so that some of its
    tokens may have been drawn from the next weights (muarl's engine swaps them between two forward passes,
    a server between two requests' steps). Such a turn keeps every token's log-prob as drawn, which the
    update's importance weights correct; it is marked (``turns_across_sync``), not dropped. A conservative
    mark: a turn that merely waited on a sync for its first pass counts too."""

    def __init__(self, inner: PolicySession, stream: RolloutStream):
        self.inner, self.stream = inner, stream
        self.versions: list[int] = []
        self.across = 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        version = self.stream.version
        turn = await self.inner.next(new_messages)
        self.versions.append(version)
        self.across += self.stream.sync_begun > version
        return turn

    def close(self) -> dict[str, Any]:
        return {**(self.inner.close() or {}), "turn_versions": self.versions, "turns_across_sync": self.across}


class RolloutStream:
    """Groups played in a background thread against ``sampler``'s weights, ``order[cursor:]`` in order.

    ``group_seed(position)`` seeds a group's episodes; ``per_step`` groups make a step, ``staleness`` is
    N: at most (syncs so far + N + 1) * ``per_step`` groups are started (plus one for each group the
    trainer dropped or discarded). ``first_version``: the updates the weights have had (a resumed run's
    steps), so that ``policy_version`` counts a run's updates across resumes. With muarl's engine the
    groups' agent turns take its batch oldest group first (:class:`OldestFirst`). ``end`` (set by
    :func:`take_step`): no group is started past it, the groups the run will still take (plus one for each
    the trainer drops or discards), so the last steps start no group that no step would use."""

    #: False: the engine serves the episodes in flight first come first served (kept for benchmarks)
    oldest_first = True

    def __init__(self, sampler: Any, domain: Any, user: Any, episode: Any, group_size: int, order: list[Task],
                 cursor: int, per_step: int, staleness: int, group_seed: Any, policy_seed: int,
                 first_version: int = 0):
        self.sampler, self.domain, self.user, self.episode = sampler, domain, user, episode
        self.group_size, self.order, self.next_position = group_size, order, cursor
        self.per_step = per_step
        self.budget = (staleness + 1) * per_step  # groups the stream may have started so far
        self.group_seed = group_seed
        self.policy = sampler.policy(policy_seed)  # one engine for the run: its batches mix groups
        engine = getattr(self.policy, "engine", None)
        self.cond = threading.Condition()
        self.finished: list[Finished] = []
        self.version = first_version  # updates the weights have had: a resumed run goes on counting
        self.sync_begun = first_version  # the version of the newest sync begun (one past ``version`` during it)
        self.started = 0  # groups started since the stream began
        self.sampler_idle_s = 0.0  # time with no episode in flight because the stream was at its lead
        self.error: BaseException | None = None
        self.stopping = False
        self.consumed = 0  # groups the trainer took, dropped or discarded
        self.end: int | None = None  # no group is started at this count or after (None: no end)
        self.gate: OldestFirst | None = None
        from muarl.policies.batched_generator import BatchedGenerator

        if isinstance(engine, BatchedGenerator):  # a vLLM engine schedules on its own
            engine.deterministic = False  # the stream is timing-dependent by design: admission by arrival
            if self.oldest_first:
                self.gate = OldestFirst(engine.max_batch)
        self.thread = threading.Thread(target=self._thread, name="muarl-rollouts", daemon=True)

    # -- the stream's thread ---------------------------------------------------------------------------------
    def start(self) -> RolloutStream:
        self.thread.start()
        return self

    def _thread(self) -> None:
        try:
            asyncio.run(self._play())
        except BaseException as err:  # handed to the trainer, which raises it
            with self.cond:
                self.error = err
                self.cond.notify_all()

    async def _play(self) -> None:
        in_flight: set[asyncio.Task] = set()
        idle_since: float | None = None
        while not self.stopping:
            with self.cond:
                room = self.room()
            if not room:
                if not in_flight and idle_since is None:
                    idle_since = time.perf_counter()
                await asyncio.sleep(0.005)
                continue
            if idle_since is not None:
                self.sampler_idle_s += time.perf_counter() - idle_since
                idle_since = None
            position = self.next_position
            self.next_position += 1
            with self.cond:
                self.started += 1
            job = asyncio.create_task(self._group(position, self.version))
            in_flight.add(job)
            job.add_done_callback(in_flight.discard)
            await asyncio.sleep(0)
        for job in in_flight:
            job.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)

    def room(self) -> bool:
        """Whether another group may start: fewer than the bound's and the run's groups were started."""
        return self.started < self.budget and (self.end is None or self.started < self.end)

    async def _group(self, position: int, version: int) -> None:
        task = self.order[position % len(self.order)]
        policy = _Versioned(self.policy if self.gate is None else _Prioritized(self.policy, self.gate, position),
                            self)
        engine = RolloutEngine(self.domain, policy, self.user, self.episode, group_size=self.group_size,
                               common_user_seed=True, seed=self.group_seed(position), progress=False)
        try:
            group = (await engine.run([task]))[0]
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            with self.cond:
                self.error = err
                self.cond.notify_all()
            return
        for traj in group:
            traj.metadata["policy_version"] = version
        with self.cond:
            self.finished.append(Finished(position, version, group))
            self.cond.notify_all()

    # -- the trainer's side ------------------------------------------------------------------------------------
    def take(self, count: int, min_version: int, informative: Any = None, most: int | None = None) -> Taken:
        """Block until ``count`` finished groups of version ``min_version`` or newer are there; take them in
        the order they finished, dropping older ones. ``informative(group)`` (dynamic sampling) also
        discards groups without a learning signal, until ``most`` groups were consumed in all (then what
        was kept is returned, possibly fewer than ``count``)."""
        began = time.perf_counter()
        kept: list[Finished] = []
        dropped = uninformative = seen = 0
        with self.cond:
            while len(kept) < count and (most is None or seen < most):
                if self.error is not None:
                    raise self.error
                if not self.finished:
                    self.cond.wait(timeout=0.5)
                    continue
                item = self.finished.pop(0)
                seen += 1
                self.consumed += 1
                if item.version < min_version or (informative is not None and not informative(item.group)):
                    if item.version < min_version:
                        dropped += 1
                    else:
                        uninformative += 1
                    self.budget += 1  # played again by a fresher group
                    if self.end is not None:
                        self.end += 1
                else:
                    kept.append(item)
        return Taken(kept, dropped, uninformative, time.perf_counter() - began,
                     [self.version - item.version for item in kept])

    def sync(self, model: Any) -> float:
        """The trainer's updated weights into the sampler, between two of its forward passes; the new
        version applies to groups started from now on. Returns the seconds it took (waiting included)."""
        began = time.perf_counter()
        self.sync_begun = self.version + 1  # a turn in flight from here on may meet the new weights
        with self.policy.swapping_weights():  # between two forward passes; caches of the old weights dropped
            self.sampler.sync(model)
            with self.cond:  # inside: no pass runs on the new weights before the version says so
                self.version += 1
                self.budget += self.per_step
        return time.perf_counter() - began

    def close(self) -> None:
        """Stop playing and wait for the thread (episodes in flight are abandoned)."""
        self.stopping = True
        self.thread.join(timeout=60)


def take_step(stream: RolloutStream, cursor: int, config: Any, reward_of: Any) -> tuple[
        list[list[Trajectory]], Any, Any, int, dict[str, float]]:
    """One step's groups from ``stream``, shaped as ``collect_groups`` returns them (groups, their training
    rewards, which the update keeps, the new cursor) plus the step's asynchrony metrics. ``reward_of``
    gives an episode's training reward. Groups more than ``config.max_staleness`` updates old are dropped;
    with dynamic sampling, all-alike groups too, consuming at most ``max_rollout_batches`` steps' worth."""
    import torch

    from muarl.algorithms import informative_groups

    def informative(group: list[Trajectory]) -> bool:
        return bool(informative_groups(torch.tensor([[reward_of(t) for t in group]]))[0])

    with stream.cond:  # this step and the ones after it take these many groups more, and no others
        stream.end = stream.consumed + max(config.steps - stream.version, 1) * config.tasks_per_step

    taken = stream.take(config.tasks_per_step, stream.version - config.max_staleness,
                        informative if config.dynamic_sampling else None,
                        config.max_rollout_batches * config.tasks_per_step if config.dynamic_sampling else None)
    groups = [item.group for item in taken.groups]
    rewards = torch.tensor([[reward_of(t) for t in g] for g in groups]).reshape(len(groups), config.group_size)
    consumed = len(groups) + taken.dropped + taken.uninformative
    versions = [v for g in groups for t in g for v in t.metadata.get("turn_versions", [])]
    metrics = {"staleness_mean": sum(taken.staleness) / max(len(taken.staleness), 1),
               # the agent turns' own lag behind the trainer (a turn is younger than its group when syncs
               # came while the episode played) and the share of turns a sync overlapped
               "turn_staleness_max": float(max((stream.version - v for v in versions), default=0)),
               "turns_across_sync": sum(t.metadata.get("turns_across_sync", 0) for g in groups for t in g)
               / max(len(versions), 1),
               "staleness_max": float(max(taken.staleness, default=0)), "dropped_groups": float(taken.dropped),
               "trainer_idle_s": taken.waited_s, "sampler_idle_s": stream.sampler_idle_s,
               "uninformative_groups": float(taken.uninformative)}
    stream.sampler_idle_s = 0.0
    return groups, rewards, torch.ones(len(groups), dtype=torch.bool), cursor + consumed, metrics
