"""The orchestrator's two sources of steps (muarl.train.orchestrator): the stream at staleness 0 is the
lockstep source, and the trainer's loop does not branch on which one it has."""

from __future__ import annotations

import ast
import inspect

from muarl.domain import get_domain
from muarl.policies.expert import ExpertPolicy
from muarl.train.distributed import Dist
from muarl.train.grpo_config import GRPOConfig
from muarl.train.orchestrator import Lockstep, Streamed
from muarl.users.scripted import ScriptedUser


class ExpertSampler:
    """A sampler whose policy is muarl's scripted expert, slipping now and then (seeded per episode, so
    members of a group differ): episodes are a function of the task, the user seed and the episode seed
    alone, which is what both sources must agree on. The weights it would sync are the expert's (none)."""

    def __init__(self) -> None:
        self.syncs = 0

    def policy(self, seed: int) -> ExpertPolicy:
        return ExpertPolicy(slip_rate=0.5)

    def check(self, model, domain) -> None:
        pass

    def release(self) -> None:
        pass

    def sync(self, model) -> float:
        self.syncs += 1
        return 0.0

    def close(self) -> None:
        pass


def _steps(source, sampler: ExpertSampler, steps: int) -> list[tuple]:
    seen = []
    try:
        for step in range(steps):
            got = source.next_step(step)
            seen.append(([[(t.task_id, t.user_seed, [(m.role, m.content) for m in t.messages], t.reward.reward)
                           for t in group] for group in got.groups],
                         got.rewards.tolist(), got.keep.tolist(), got.masked, got.cursor, got.tasks_played))
            source.release()
            source.sync(None)
    finally:
        source.close()
    assert sampler.syncs == steps
    return seen


def test_the_stream_at_staleness_0_yields_the_lockstep_groups():
    """Three steps of three groups of two, from data position 5 (a resumed run's): the same tasks in the
    same order, every member meeting the same user and playing the same conversation to the same reward,
    the same masks and data positions, whether played in lockstep or by the stream with no lead."""
    domain = get_domain("retail-lite")
    order = domain.tasks("train")[:7]
    config = GRPOConfig(domain="retail-lite", tasks_per_step=3, group_size=2, steps=3, seed=11, max_turns=12,
                        max_staleness=0)
    episode = config.episode_config()
    lockstep, streamed = ExpertSampler(), ExpertSampler()
    want = _steps(Lockstep(lockstep, domain, ScriptedUser(), episode, order, 5, config, Dist()), lockstep, 3)
    got = _steps(Streamed(streamed, domain, ScriptedUser(), episode, order, 5, config, start_step=0), streamed, 3)
    assert [[g[0][0] for g in step[0]] for step in want] == \
        [[order[(5 + k) % 7].id for k in range(3 * s, 3 * s + 3)] for s in range(3)]  # the order wraps
    assert len({t[1] for step in want for g in step[0] for t in g}) > 1  # users differ across tasks
    assert any(g[0][2] != g[1][2] for step in want for g in step[0])  # and members' conversations somewhere
    assert got == want


def test_the_trainer_loop_has_no_branch_on_asynchrony():
    """``train_grpo`` reads no staleness setting and names no stream: which source plays the episodes is
    the orchestrator's choice alone."""
    from muarl.train import grpo

    tree = ast.parse(inspect.getsource(grpo.train_grpo))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not {"max_staleness", "RolloutStream", "take_step", "stream", "Streamed", "Lockstep"} & names
