"""The orchestrator: what plays a GRPO run's episodes and hands the trainer one step of groups at a time.

The trainer (:mod:`muarl.train.grpo`) sees one interface, a source of steps (:class:`Rollouts`):
``next_step(step)`` returns the step's groups (:class:`StepRollouts`), ``release()`` comes before the
update (an engine may give its memory to it), ``sync(model)`` after it (the new weights to whatever
samples), ``close()`` at the end. Everything about how episodes are played lives here: the simulated
user, the engine or servers and the copy of the weights they sample from, the task order and data
position, the seeds, the refills of dynamic sampling, the staleness bound and the masks. Two sources:

- :class:`Lockstep`: a step's tasks are played, then trained on, then the weights synced (the paper's
  synchronous GRPO); under several training processes each plays its share of every step's groups;
- :class:`Streamed`: groups are played in a thread of their own while the trainer updates, up to
  ``max_staleness`` updates ahead (:mod:`muarl.train.async_rollouts`). At staleness 0 it plays the
  lockstep source's tasks, users and masks step by step (tests/test_orchestrator.py), but not its samples:
  its one engine is seeded once per run, the lockstep source's policy once per step. So N = 0 never
  streams; it runs the lockstep source, checked against the code before the stream existed
  (tests/test_async_grpo.py). Under several training processes one stream, rank 0's, plays every group
  and hands each step to every rank.

:func:`open_rollouts` picks one (the only place that reads ``max_staleness`` to choose). What it plays with is
built once, at the top of the run (:func:`muarl.train.grpo.train_grpo`), and handed to it: the user
(:func:`open_user`) and the sampler (:func:`open_sampler`), which holds the engine.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from muarl.factory import make_user
from muarl.faults import counts_against_policy
from muarl.models import ModelFiles
from muarl.rollout import RolloutEngine
from muarl.train.async_rollouts import RolloutStream, take_step
from muarl.train.distributed import Dist
from muarl.train.engine_spec import SERVER
from muarl.train.groups import collect_groups, reward_of, step_seed
from muarl.train.grpo_config import GRPOConfig
from muarl.train.samplers import (
    CopySampler,
    Sampler,
    check_in_process_engine,
    check_rollout_engine,
    make_sampler,
    rollout_copy,
    samples_here,
)
from muarl.types import Task, Trajectory
from muarl.users.base import UserSimulator


@dataclass
class StepRollouts:
    """One step's groups as the trainer takes them."""

    groups: list[list[Trajectory]]
    rewards: torch.Tensor  # [groups, group_size]: each episode's training reward (:func:`train_reward`)
    keep: torch.Tensor  # [groups] bool: the groups the update keeps (dynamic sampling drops the rest)
    masked: list[list[bool]]  # episodes left out of the gradient (simulator faults, truncation), by group
    cursor: int  # the data position after this step: tasks played (or consumed) since the run began
    tasks_played: int
    rollout_s: float  # how long the trainer waited for them
    metrics: dict[str, float] = field(default_factory=dict)  # the source's own (asynchrony), groups_too_small

    def __post_init__(self) -> None:
        counted = self.counted()
        too_small = sum(bool(self.keep[g]) and sum(counted[g]) < MIN_COUNTED for g in range(len(self.groups)))
        self.metrics = {**self.metrics, "groups_too_small": float(too_small)}

    def counted(self) -> list[list[bool]]:
        """Which episodes count in their group's baseline (mean and standard deviation): all but those
        masked for a simulator's fault (:func:`sim_masked`). A truncated episode counts, masked or not: being
        cut off is the agent's doing, a failure; so does a policy fault (never masked)."""
        return [[not (self.masked[g][m] and sim_masked(t)) for m, t in enumerate(group)]
                for g, group in enumerate(self.groups)]

    def trained(self) -> list[list[bool]]:
        """Which episodes the update trains on: a kept group's with at least :data:`MIN_COUNTED` members that
        count, unmasked, with agent tokens."""
        counted = self.counted()
        return [[bool(self.keep[g]) and sum(counted[g]) >= MIN_COUNTED and bool(sum(t.loss_mask))
                 and not self.masked[g][m] for m, t in enumerate(group)] for g, group in enumerate(self.groups)]

    def advantages(self, algorithm: Any) -> torch.Tensor:
        """Each group's advantages under ``algorithm`` ([groups, group_size]) over the members that count
        (:meth:`counted`), as if the others had not been played: a simulator-faulted member is out of its
        group's mean and standard deviation, and its own advantage is 0. A group with fewer than
        :data:`MIN_COUNTED` members that count has no baseline: 0 everywhere (it trains nothing)."""
        advantages = algorithm.advantages(self.rewards)  # a group whose members all count: as it always was
        for g, counts in enumerate(self.counted()):
            if all(counts):
                continue
            advantages[g] = 0.0
            members = [m for m, c in enumerate(counts) if c]
            if len(members) >= MIN_COUNTED:
                advantages[g, members] = algorithm.advantages(self.rewards[g, members].unsqueeze(0))[0]
        return advantages

    def batch(self, algorithm: Any) -> tuple[torch.Tensor, list[tuple[int, Trajectory, float]]]:
        """The step's advantages under ``algorithm`` ([groups, group_size], :meth:`advantages`) and the
        update's sequences: (group, episode, advantage) of every trained episode.

        Where masking meets the group advantage: a simulator's fault (the user's, a tool server's) leaves the
        group's baseline as well as the gradient, so the clean members get the advantages they alone would
        get, never a baseline the agent did not make. A truncated episode is the agent's failure: under
        ``mask_truncated`` it still counts in the baseline (scored 0, or ``truncation_reward``), and masking
        only takes its own sequence out, so a group's success keeps its positive advantage; what masking
        removes is the push down on the truncated episodes (one is never taught to stop). A group left with
        fewer than :data:`MIN_COUNTED` members that count trains nothing (metric ``groups_too_small``)."""
        advantages = self.advantages(algorithm)
        trained = self.trained()
        return advantages, [(g, t, float(advantages[g, m])) for g, group in enumerate(self.groups)
                            for m, t in enumerate(group) if trained[g][m]]

    def masked_share(self) -> float:
        """The share of the step's episodes left out of the gradient by :func:`masks`."""
        return sum(map(sum, self.masked)) / max(1, sum(map(len, self.masked)))


class Rollouts(Protocol):
    """A source of steps (see the module's docstring)."""

    #: whether the engine/trainer mismatch also measures the policy's own lag (groups played under older
    #: weights), which a mismatch warning must not blame on the engine
    lagged: bool

    def next_step(self, step: int) -> StepRollouts: ...

    def release(self) -> None: ...

    def sync(self, model: Any) -> float: ...

    def close(self) -> None: ...


def sync_figures(rollouts: Any) -> dict[str, float]:
    """What the last sync moved, for the step's metrics: ``sync_bytes`` (a server's: broadcast or written;
    absent where the engine is in this process) and ``sync_changed``, the share of the values that changed
    since the sync before (``--vllm-weight-sync changed`` only)."""
    sampler = getattr(rollouts, "sampler", None)
    figures: dict[str, float] = {}
    if sent := int(getattr(sampler, "sync_bytes", 0) or 0):
        figures["sync_bytes"] = sent
    if (share := getattr(sampler, "changed_share", None)) is not None:
        figures["sync_changed"] = float(share)
    return figures


#: the fewest members that count (:meth:`StepRollouts.counted`) a group needs for a baseline to train on
MIN_COUNTED = 2


def sim_masked(traj: Trajectory) -> bool:
    """Whether an episode is spoiled by the simulator's side: a user fault or a tool-server fault
    (:func:`~muarl.faults.counts_against_policy` false), not the agent's doing. A policy fault (the policy
    raised, returned garbage, ran past ``agent_timeout``) is the agent's own failure and is not one."""
    return traj.fault_kind is not None and not counts_against_policy(traj)


def masks(groups: list[list[Trajectory]], config: GRPOConfig) -> list[list[bool]]:
    """The episodes left out of the gradient: a simulator's fault (``mask_sim_faults``: the user's or a
    tool server's, :func:`sim_masked`; such an episode also leaves its group's baseline) and, with
    ``mask_truncated``, a turn cut at its token limit (which still counts in the baseline, as a failure).
    A policy fault is never masked: it trains as the agent's failure (reward 0, :func:`train_reward`)."""
    return [[(config.mask_sim_faults and sim_masked(t))
             or (config.mask_truncated and t.stop_reason == "turn_token_limit") for t in group] for group in groups]


class Lockstep:
    """A step's groups played with the current weights, then handed over; the next step's after the sync.
    Under several training processes every rank plays its share of each batch and all get every group."""

    lagged = False

    def __init__(self, sampler: Sampler, domain: Any, user: Any, episode: Any, order: list[Task], cursor: int,
                 config: GRPOConfig, dist: Dist, progress: bool = False):
        self.sampler, self.domain, self.user, self.episode = sampler, domain, user, episode
        self.order, self.cursor, self.config, self.dist, self.progress = order, cursor, config, dist, progress

    def _play(self, step: int, chosen: list[Task], batch_no: int) -> list[list[Trajectory]]:
        config, dist = self.config, self.dist
        policy = self.sampler.policy(step_seed(config.seed, step, batch_no))
        engine = RolloutEngine(self.domain, policy, self.user, self.episode, group_size=config.group_size,
                               common_user_seed=True, seed=config.seed, progress=self.progress)
        local = dist.share(chosen)
        gathered = dist.gather(asyncio.run(engine.run(local)) if local else [])
        return [gathered[g % dist.world][g // dist.world] for g in range(len(chosen))]

    def next_step(self, step: int) -> StepRollouts:
        began, before = time.perf_counter(), self.cursor
        groups, rewards, keep, self.cursor = collect_groups(
            lambda chosen, batch_no: self._play(step, chosen, batch_no), self.order, self.cursor, self.config)
        return StepRollouts(groups, rewards, keep, masks(groups, self.config), self.cursor, self.cursor - before,
                            time.perf_counter() - began)

    def release(self) -> None:
        self.sampler.release()

    def sync(self, model: Any) -> float:
        return self.sampler.sync(model)

    def close(self) -> None:
        self.sampler.close()


class Streamed:
    """Groups played in a thread of their own (:class:`~muarl.train.async_rollouts.RolloutStream`) on the
    sampler's weights, at most ``config.max_staleness`` updates behind the trainer's; a step takes the
    groups that finished first. Under several training processes there is one stream, rank 0's: each
    step's groups are handed from it to every rank (one broadcast), each rank trains on its share as in
    lockstep, and at each sync the other ranks send their shards to rank 0's copy and sample nothing."""

    lagged = True

    def __init__(self, sampler: Sampler, domain: Any, user: Any, episode: Any, order: list[Task], cursor: int,
                 config: GRPOConfig, start_step: int, dist: Dist | None = None):
        dist = dist or Dist()
        self.sampler, self.config, self.cursor, self.dist = sampler, config, cursor, dist
        self.stream: RolloutStream | None = None
        if dist.main:
            # a group's user seeds are the lockstep source's (the run seed, the task, the member): a task met
            # again in a later epoch meets the same user, whichever source plays it
            self.stream = RolloutStream(sampler, domain, user, episode, config.group_size, order, cursor,
                                        per_step=config.tasks_per_step, staleness=config.max_staleness,
                                        group_seed=lambda position: config.seed,
                                        policy_seed=step_seed(config.seed, start_step), first_version=start_step)
            self.stream.start()

    def _take(self) -> tuple[Any, ...]:
        assert self.stream is not None
        return take_step(self.stream, self.cursor, self.config, reward_of(self.config))

    def next_step(self, step: int) -> StepRollouts:
        began, before = time.perf_counter(), self.cursor
        # rank 0 takes the step from its stream; a failure there (the stream's error) stops every rank
        groups, rewards, keep, self.cursor, metrics = self.dist.from_main(self._take, shareable=(ValueError,))
        return StepRollouts(groups, rewards, keep, masks(groups, self.config), self.cursor, self.cursor - before,
                            time.perf_counter() - began, metrics)

    def release(self) -> None:
        self.sampler.release()

    def sync(self, model: Any) -> float:
        if self.stream is not None:
            return self.stream.sync(model)
        return self.sampler.sync(model)  # this rank's part of the gather into rank 0's copy

    def close(self) -> None:
        try:
            if self.stream is not None:
                self.stream.close()
        finally:
            self.sampler.close()


def check_rollouts(config: GRPOConfig, dist: Dist) -> None:
    """What can be refused before a run directory exists: an engine that is not installed or a server
    not given (on the ranks that sample: rank 0 alone under ``--max-staleness``), and, on every rank, an
    in-process vLLM engine in a run of several processes."""
    check_in_process_engine(config, dist.world)
    if samples_here(config, dist) or config.rollout_engine.startswith(SERVER):
        check_rollout_engine(config)


def open_user(config: GRPOConfig) -> UserSimulator:
    """The run's simulated user, ``config.user`` with its limits: built once, played in every episode."""
    return make_user(config.user, http_timeout=config.user_http_timeout, max_tokens=config.user_max_tokens)


def open_sampler(config: GRPOConfig, dist: Dist, model: Any, tokenizer: Any, files: ModelFiles | None) -> Sampler:
    """What samples the run's episodes: the engine ``config.rollout_engine`` on ``model``'s weights (``files``:
    where ``--model``'s are, as the run located them), on a copy of the weights where it cannot sample from
    the trainer's model object (a sharded run's, an asynchronous run's on muarl's engine)."""
    # a sharded run, or an asynchronous one on muarl's engine (which samples from a model object), samples
    # from a copy of the weights that follows them after every update; vLLM engines hold weights of their own
    if config.fsdp:
        return CopySampler(config, model, rollout_copy(config, dist), tokenizer, dist, files)
    if config.max_staleness and config.rollout_engine == "hf":  # rank 0's stream alone samples
        return CopySampler(config, model, copy.deepcopy(model) if dist.main else None, tokenizer, dist, files)
    return make_sampler(config, model, tokenizer, dist, files)


def open_rollouts(config: GRPOConfig, dist: Dist, domain: Any, model: Any, sampler: Sampler, user: UserSimulator,
                  start_step: int, cursor: int, progress: bool = False) -> Lockstep | Streamed:
    """The run's source of steps, playing ``user`` against ``sampler`` (which it owns from here: closed
    when this fails), the engine checked against ``model``'s weights first, the training split in the run
    seed's order from ``cursor`` on (the data position: tasks played so far)."""
    try:
        episode = config.episode_config()  # as the paper trains: required outputs not graded
        tasks = domain.tasks(config.split)
        order = random.Random(config.seed).sample(tasks, len(tasks))
        sampler.check(model, domain)  # an engine on other weights: one line before a step trains on its episodes
    except BaseException:
        sampler.close()
        raise
    if config.max_staleness:
        return Streamed(sampler, domain, user, episode, order, cursor, config, start_step, dist)
    return Lockstep(sampler, domain, user, episode, order, cursor, config, dist, progress=progress)

