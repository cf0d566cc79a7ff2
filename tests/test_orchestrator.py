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
    alone, which is what both sources must agree on. The policy seed is ignored on purpose: the stream seeds
    its engine once per run, the lockstep source once per step, so a model's samples would differ (why
    N = 0 runs the lockstep source). The weights it would sync are the expert's (none)."""

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


def _episode(reward: float, stop: str):
    from muarl.types import Reward, Trajectory

    return Trajectory(task_id="t", domain="d", stop_reason=stop, reward=Reward(reward=reward, db_match=bool(reward), outputs_ok=True,
                                                                   outputs_required=False, tcr=reward),
                      token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0])


def test_masking_truncated_members_keeps_the_groups_success():
    """A hand-made step under --mask-truncated: a group with one success, one clean failure and two episodes
    cut at the token limit. Its success keeps the positive advantage the whole group gives it (the
    truncated members count as the failures they are), its clean failure is pushed down, and only the
    truncated ones leave the gradient. A group whose every failure was truncated still trains its success;
    a group with nothing but masked failures and no success trains nothing, and the step says why."""
    import torch

    from muarl.algorithms import get_algorithm
    from muarl.train.grpo import untrained
    from muarl.train.orchestrator import StepRollouts, masks

    config = GRPOConfig(mask_truncated=True, group_size=4)
    groups = [[_episode(1.0, "user_stop"), _episode(0.0, "user_stop"), _episode(0.0, "turn_token_limit"),
               _episode(0.0, "turn_token_limit")],
              [_episode(1.0, "user_stop")] + [_episode(0.0, "turn_token_limit") for _ in range(3)]]
    rewards = torch.tensor([[t.reward.reward for t in g] for g in groups])
    step = StepRollouts(groups, rewards, torch.ones(2, dtype=torch.bool), masks(groups, config), 2, 2, 0.0)
    advantages, batch = step.batch(get_algorithm("grpo"))
    trained = {(g, groups[g].index(t)): a for g, t, a in batch}
    assert set(trained) == {(0, 0), (0, 1), (1, 0)}
    assert trained[(0, 0)] > 0 > trained[(0, 1)] and trained[(1, 0)] > 0
    assert trained[(0, 0)] == float(get_algorithm("grpo").advantages(rewards)[0, 0])  # masked members included
    assert step.masked_share() == 5 / 8

    lost = [[_episode(0.0, "user_stop")] + [_episode(0.0, "turn_token_limit") for _ in range(3)]]
    both = [[_episode(0.0, "turn_token_limit")] * 2 + [_episode(1.0, "turn_token_limit")] * 2]
    for made in (lost, both):
        r = torch.tensor([[t.reward.reward for t in g] for g in made])
        keep = torch.ones(1, dtype=torch.bool)
        step = StepRollouts(made, r, keep, masks(made, config), 1, 1, 0.0)
        got = step.batch(get_algorithm("grpo"))[1]
        if made is lost:  # all failures: no signal at all, masked or not
            assert all(a == 0 for _, _, a in got)
        else:  # every member masked: nothing trains, and the step's line says masking did it
            assert got == [] and "masked" in untrained({}, keep, step.masked)
