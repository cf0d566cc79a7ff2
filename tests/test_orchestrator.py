"""The orchestrator's two sources of steps (muarl.train.orchestrator): the stream at staleness 0 is the
lockstep source, and the trainer's loop does not branch on which one it has."""

from __future__ import annotations

import ast
import inspect

import pytest

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


def _faulted(kind: str, reward: float = 0.0):
    """A scored episode ended by a fault of ``kind`` (recorded as the episode loop records it)."""
    traj = _episode(reward, {"user": "sim_fault", "policy": "policy_fault", "tool": "tool_fault"}[kind.split("_")[0]])
    traj.metadata["fault"] = {"kind": kind, "message": f"{kind} (made by hand)", "traceback": ""}
    traj.sim_fault = kind.startswith("user")
    return traj


def _step(groups, config):
    import torch

    from muarl.train.groups import reward_of
    from muarl.train.orchestrator import StepRollouts, masks

    rewards = torch.tensor([[reward_of(config)(t) for t in g] for g in groups])
    return StepRollouts(groups, rewards, torch.ones(len(groups), dtype=torch.bool), masks(groups, config),
                        len(groups), len(groups), 0.0)


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
@pytest.mark.parametrize("faults", [("user",), ("user_timeout", "tool", "tool_timeout"),
                                    ("user", "user_timeout", "user", "tool", "user")])
def test_a_simulator_fault_leaves_its_groups_baseline(algorithm, faults):
    """Issue 57: a group of three clean members (one success, two failures) and k members the simulated user
    or a tool server spoiled (scored 0, as such episodes usually are). The clean members get exactly the
    advantages the three alone would get: the faulted ones are out of the group's mean and standard
    deviation as well as the gradient. A fault-free group beside it is untouched."""
    import torch

    from muarl.algorithms import get_algorithm

    algo = get_algorithm(algorithm)
    config = GRPOConfig(group_size=3 + len(faults))
    clean = [_episode(1.0, "user_stop"), _episode(0.0, "user_stop"), _episode(0.0, "user_stop")]
    plain = [_episode(float(m % 2), "user_stop") for m in range(3 + len(faults))]
    groups = [clean + [_faulted(kind) for kind in faults], plain]
    step = _step(groups, config)
    advantages, batch = step.batch(algo)
    alone = algo.advantages(torch.tensor([[1.0, 0.0, 0.0]]))[0]
    assert advantages[0, :3].tolist() == alone.tolist()
    assert [(_member(groups[0], t), a) for g, t, a in batch if g == 0] == [(m, float(alone[m])) for m in range(3)]
    assert advantages[1].tolist() == algo.advantages(step.rewards[1:])[0].tolist()
    assert step.metrics["groups_too_small"] == 0


def test_a_policy_fault_is_the_agents_failure_not_masked():
    """``mask_sim_faults`` masks the simulator's faults (the user's, a tool server's) only. An episode the
    policy itself broke or ran out of time on stays in the gradient and in its group's baseline as a
    failure: reward 0 even where its database happened to be right."""
    from muarl.train.orchestrator import masks

    config = GRPOConfig(group_size=4)
    group = [_episode(1.0, "user_stop"), _faulted("policy_timeout", reward=1.0), _faulted("policy"),
             _faulted("user_timeout")]
    assert masks([group], config) == [[False, False, False, True]]
    step = _step([group], config)
    assert step.rewards.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    advantages, batch = step.batch(get_algorithm_named("grpo"))
    assert [_member(group, t) for _, t, _ in batch] == [0, 1, 2]
    assert advantages[0, 1] < 0 and advantages[0, 2] < 0  # pushed down as the failures they are
    assert masks([group], GRPOConfig(group_size=4, mask_sim_faults=False)) == [[False] * 4]


def test_a_group_left_with_one_member_that_counts_trains_nothing_and_is_counted():
    """One clean success among seven episodes the user spoiled: today it would get advantage +2.47 against a
    baseline the agent did not make. With one member left that counts there is no baseline: the group
    trains nothing (no sequence, no KL term), its advantages are 0, and the step counts it in
    ``groups_too_small``; so is a group every member of which was spoiled. Under ``mask_sim_faults=False``
    the spoiled members count as failures and the group trains as before."""
    from muarl.train.grpo import untrained

    config = GRPOConfig(group_size=8)
    lone = [_episode(1.0, "user_stop")] + [_faulted("user_timeout") for _ in range(7)]
    spoiled = [_faulted("user") for _ in range(8)]
    fine = [_episode(float(m < 3), "user_stop") for m in range(8)]
    step = _step([lone, spoiled, fine], config)
    advantages, batch = step.batch(get_algorithm_named("grpo"))
    assert {g for g, _, _ in batch} == {2} and len(batch) == 8
    assert advantages[:2].abs().sum() == 0
    assert step.trained()[0] == [False] * 8
    assert step.metrics["groups_too_small"] == 2
    alone = _step([lone], config)
    assert alone.batch(get_algorithm_named("grpo"))[1] == [] and alone.metrics["groups_too_small"] == 1
    assert untrained({}, alone.keep, alone.masked) is not None
    counted = _step([lone], GRPOConfig(group_size=8, mask_sim_faults=False))
    assert counted.metrics["groups_too_small"] == 0 and len(counted.batch(get_algorithm_named("grpo"))[1]) == 8


def _member(group, traj) -> int:
    """The member ``traj`` is (by identity: hand-made members are equal as values)."""
    return next(m for m, t in enumerate(group) if t is traj)


def get_algorithm_named(name: str):
    from muarl.algorithms import get_algorithm

    return get_algorithm(name)
