"""A GRPO step's groups of episodes: which tasks are played and with which sampling seed, the reward each
episode trains on, the step's rollout metrics and the file its episodes are written to.

The synchronous collection is :func:`collect_groups`; an asynchronous run takes its groups from a
:class:`~muarl.train.async_rollouts.RolloutStream` instead (:func:`~muarl.train.async_rollouts.take_step`),
shaped alike, with the same :func:`train_reward`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from muarl.algorithms import informative_groups
from muarl.faults import credited_reward, side_of
from muarl.files import atomic_open
from muarl.train.grpo_config import GRPOConfig
from muarl.types import Task, Trajectory
from muarl.users.slips import slip_rates


def train_reward(traj: Trajectory, penalize_violations: bool = False, violation_reward: float = 0.0,
                 truncation_reward: float | None = None) -> float:
    """The reward GRPO trains on: the episode's binary reward, or ``violation_reward`` if it broke a rule and
    that is penalized (whether or not its database was right), or ``truncation_reward`` (when set) if it was
    cut off at a token, context or turn limit (:attr:`~muarl.types.Trajectory.truncated`); both: the lower.
    A policy fault (the agent's own, never masked) is a failure, 0, whatever its final database, as
    evaluation counts it (:func:`~muarl.faults.credited_reward`)."""
    if traj.reward is None:
        return 0.0
    own = 0.0 if traj.fault_kind and side_of(traj.fault_kind) == "policy" else traj.reward.reward
    value = violation_reward if penalize_violations and traj.reward.violations else own
    if truncation_reward is not None and traj.truncated:
        value = min(truncation_reward, value) if penalize_violations and traj.reward.violations else truncation_reward
    return value


def reward_of(config: GRPOConfig) -> Callable[[Trajectory], float]:
    """:func:`train_reward` under ``config``'s penalties."""
    return lambda t: train_reward(t, config.penalize_violations, config.violation_reward, config.truncation_reward)


def collect_groups(play: Callable[[list[Task], int], list[list[Trajectory]]], order: list[Task], cursor: int,
                   config: GRPOConfig) -> tuple[list[list[Trajectory]], torch.Tensor, torch.Tensor, int]:
    """One step's groups: ``play`` the ``tasks_per_step`` tasks of ``order`` from ``cursor`` on (wrapping).

    With dynamic sampling (DAPO), groups whose members all scored alike carry no advantage, so further
    batches are played until ``tasks_per_step`` groups are informative or ``max_rollout_batches`` were
    played, and the update keeps the first ``tasks_per_step`` informative ones. Returns (groups, their
    training rewards, which groups the update keeps, the new cursor).
    """
    groups: list[list[Trajectory]] = []
    for batch_no in range(config.max_rollout_batches if config.dynamic_sampling else 1):
        chosen = [order[(cursor + k) % len(order)] for k in range(config.tasks_per_step)]
        cursor += len(chosen)
        groups += play(chosen, batch_no)
        rewards = torch.tensor([[reward_of(config)(t) for t in g] for g in groups])
        if int(informative_groups(rewards).sum()) >= config.tasks_per_step:
            break
    if not config.dynamic_sampling:
        return groups, rewards, torch.ones(len(groups), dtype=torch.bool), cursor
    informative = informative_groups(rewards)
    return groups, rewards, informative & (informative.cumsum(0) <= config.tasks_per_step), cursor


def step_seed(seed: int, step: int, batch: int = 0) -> int:
    """The policy's sampling seed for one batch of tasks of one step (batches after the first: refills)."""
    key = f"{seed}:step:{step}" + (f":batch:{batch}" if batch else "")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


def write_rollouts(out: Path, step: int, groups: list[list[Trajectory]], advantages: torch.Tensor,
                    trained: list[list[bool]]) -> Path:
    """``out/rollouts/step_{step:06d}.jsonl``: every episode of the step with its group, member and advantage.

    Written whole and renamed into place, so a reader (the viewer) never sees half a step.
    """
    folder = out / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.jsonl"
    with atomic_open(path) as f:
        for g, group in enumerate(groups):
            for m, traj in enumerate(group):
                traj.metadata.update(step=step, group=g, member=m, advantage=float(advantages[g, m]),
                                     trained=trained[g][m])
                f.write(traj.model_dump_json() + "\n")
    return path


def rollout_metrics(groups: list[list[Trajectory]], general_tools: Sequence[str] = ()) -> dict[str, float]:
    """The paper's training dynamics from one step's episodes; ``calls_<name>``, the agent's calls per episode,
    for each of the domain's ``general_tools`` (:attr:`muarl.domain.Domain.general_tools`)."""
    trajs = [t for g in groups for t in g]
    n = len(trajs)
    # as evaluation counts them (muarl.faults.credited_reward): a policy fault fails, a user or tool fault is out
    rewards = [[r for t in g if (r := credited_reward(t)) is not None] for g in groups]
    calls = Counter(r.name for t in trajs for r in t.tool_log if r.actor == "agent")
    return {
        "reward": sum(map(sum, rewards)) / max(1, sum(map(len, rewards))),
        "all_correct_groups": sum(bool(g) and all(r == 1.0 for r in g) for g in rewards) / len(groups),
        "all_wrong_groups": sum(bool(g) and all(r == 0.0 for r in g) for g in rewards) / len(groups),
        "turns": sum(t.turns for t in trajs) / n,
        "response_tokens": sum(sum(t.loss_mask) for t in trajs) / n,
        "sim_fault_rate": sum(t.sim_fault for t in trajs) / n,
        "fault_rate": sum(bool(t.fault_kind) for t in trajs) / n,
        "violation_rate": sum(bool(t.reward and t.reward.violations) for t in trajs) / n,
        "truncation_rate": sum(t.truncated for t in trajs) / n,
        **{k: v for k, v in slip_rates([t.metadata.get("user_slips") for t in trajs]).items() if v is not None},
        "malformed_calls": sum(t.malformed_calls for t in trajs) / n,
        **{f"calls_{name}": calls[name] / n for name in general_tools},
    }
