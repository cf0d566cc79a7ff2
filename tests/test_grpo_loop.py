"""The GRPO loop end to end on the embedded model: rollouts, advantages, one update per step, metrics."""

import json

import pytest
import torch

from muarl.models import load
from muarl.train.grpo import train_grpo
from muarl.train.grpo_config import preset
from muarl.train.scoring import sequence_logprobs
from train_fixtures import sample_coin_batch


def test_grpo_steps_update_the_model_and_log_the_dynamics(tmp_path):
    config = preset("tiny", out=str(tmp_path), steps=2, tasks_per_step=2, group_size=2, max_new_tokens=24,
                    max_turns=4, lr=1e-3)
    before = load("tiny")[0]
    result = train_grpo(config, progress=False)
    after = load(result["checkpoint"])[0]
    changed = [n for (n, a), (_, b) in zip(before.named_parameters(), after.named_parameters(), strict=True)
               if not torch.equal(a, b)]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    for m in metrics:
        for key in ("reward", "all_correct_groups", "all_wrong_groups", "turns", "response_tokens", "sim_fault_rate",
                    "violation_rate", "calls_think", "calls_calculate", "calls_transfer_to_human_agents",
                    "rollout_s", "reference_s", "update_s", "tokens_per_s"):
            assert key in m
        if m["trained_sequences"]:
            assert {"loss", "kl", "clip_fraction", "grad_norm", "entropy"} <= set(m)
            assert m["clip_fraction"] >= 0 and m["kl"] >= 0
    assert changed  # (AdamW's decoupled weight decay moves weights even when every group was all-equal)
    assert any((tmp_path / "tensorboard").iterdir())


def _tiny_model_and_two_episodes():
    """The embedded model, a frozen copy of it (the reference) and two short retail episodes it sampled."""
    import asyncio
    import copy

    from muarl.domain import get_domain
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    reference = copy.deepcopy(model).requires_grad_(False)
    domain = get_domain("retail")
    policy = HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=16, seed=2)
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=2), group_size=2, progress=False)
    [[first, second]] = asyncio.run(engine.run(domain.tasks("train")[:1]))
    return model, reference, first, second


def test_an_update_raises_the_likelihood_of_positive_advantage_episodes_and_lowers_negative_ones():
    from muarl.algorithms import get_algorithm
    from muarl.train.grpo_config import GRPOConfig
    from muarl.train.grpo_update import policy_update

    model, reference, good, bad = _tiny_model_and_two_episodes()

    # where the two episodes share tokens their +1 and -1 pull against each other; the claim is about
    # the sampled tokens from the first one they differ in
    split = next(i for i, (x, y) in enumerate(zip(good.token_ids, bad.token_ids, strict=False)) if x != y)

    def mean_logp(traj):
        with torch.no_grad():
            lp, _ = sequence_logprobs(model, traj.token_ids, 1.0)
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        mask[:split] = False
        assert mask.any()
        return float(lp[mask].mean())

    before = mean_logp(good), mean_logp(bad)
    config = GRPOConfig(lr=1e-2, weight_decay=0.0, kl_beta=0.0)
    # plain gradient steps: to first order each episode moves along its own gradient (Adam's first step is
    # close to a sign step, which can move an episode against its advantage through the shared parameters)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    stats, _, _ = policy_update(model, reference, optimizer, get_algorithm("grpo", kl_beta=0.0),
                                [(good, 1.0), (bad, -1.0)], config)
    after = mean_logp(good), mean_logp(bad)
    assert after[0] > before[0] and after[1] < before[1]
    assert stats["clip_fraction"] == 0  # the first step is on-policy: ratio 1, nothing to clip


def test_several_iterations_reuse_the_rollouts_and_the_clip_bounds_them():
    """num_iterations = 3 takes three optimizer steps on one batch of rollouts; from the second on, the
    ratio to the sampling policy has left 1, so some tokens are clipped (none are in a single, on-policy step)."""
    import copy

    from muarl.algorithms import get_algorithm
    from muarl.train.grpo_config import GRPOConfig
    from muarl.train.grpo_update import update_on_rollouts

    model, reference, good, bad = _tiny_model_and_two_episodes()
    algorithm = get_algorithm("grpo", kl_beta=0.0)
    clipped = {}
    for iterations in (1, 3):
        trained = copy.deepcopy(model)
        config = GRPOConfig(lr=1e-2, weight_decay=0.0, kl_beta=0.0, num_iterations=iterations)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=config.lr, weight_decay=0.0)
        stats, _, _ = update_on_rollouts(trained, reference, optimizer, algorithm, [(good, 1.0), (bad, -1.0)], config)
        assert {int(state["step"]) for state in optimizer.state.values()} == {iterations}
        clipped[iterations] = stats["clip_fraction"]
    assert clipped[1] == 0 and clipped[3] > 0


def test_first_update_is_on_policy():
    """The stored sampling log-probs equal a fresh forward pass: the first ratio is exactly 1."""
    import asyncio

    from muarl.domain import get_domain
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    policy = HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=16, seed=1)
    domain = get_domain("retail")
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=3), progress=False)
    [[traj]] = asyncio.run(engine.run(domain.tasks("train")[:1]))
    with torch.no_grad():
        current, _ = sequence_logprobs(model, traj.token_ids, 1.0)
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    assert torch.allclose(current[mask], torch.tensor(traj.logprobs)[mask], atol=2e-3)


@pytest.mark.slow
def test_one_grpo_step_with_smollm2(tmp_path):
    config = preset("tiny", model="smollm2", out=str(tmp_path), steps=1, tasks_per_step=1, group_size=2,
                    max_new_tokens=16, max_turns=2, lr=1e-5)
    result = train_grpo(config, progress=False)
    [m] = result["metrics"]
    assert m["trained_sequences"] == 2 and m["update_s"] > 0 and m["response_tokens"] > 0
    assert (tmp_path / "model" / "config.json").exists()


@pytest.fixture(scope="module")
def coin_batch():
    return sample_coin_batch()


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_micro_batches_give_the_whole_batch_gradient(coin_batch, algorithm):
    """Micro-batches of 1 and 3 sequences accumulate exactly the gradient of one pass over all 8."""
    import copy

    from muarl.algorithms import get_algorithm
    from muarl.train.grpo_config import GRPOConfig
    from muarl.train.grpo_update import policy_update

    base = load("tiny")[0]
    reference = copy.deepcopy(base).requires_grad_(False)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient too
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))
    grads, stats = {}, {}
    for size in (1, 3, len(coin_batch)):
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # keeps the weights: compare gradients only
        config = GRPOConfig(micro_batch_size=size, kl_beta=0.1)
        stats[size], _, _ = policy_update(model, reference, optimizer, get_algorithm(algorithm, kl_beta=0.1),
                                          coin_batch, config)
        grads[size] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    whole = grads[len(coin_batch)]
    assert whole.abs().max() > 0
    for size in (1, 3):
        assert torch.allclose(grads[size], whole, rtol=1e-4, atol=1e-7), (grads[size] - whole).abs().max()
        for key in ("loss", "kl", "clip_fraction", "entropy", "grad_norm"):
            assert stats[size][key] == pytest.approx(stats[len(coin_batch)][key], rel=1e-4, abs=1e-7), key


def test_penalize_violations_zeroes_the_reward_of_a_rule_breaking_win() -> None:
    """expert-noconfirm reaches the gold DB but writes unconfirmed: 1 under the paper's reward, 0 when penalized."""
    import asyncio

    from muarl.domain import get_domain
    from muarl.factory import make_policy, make_user
    from muarl.rollout import run_episode
    from muarl.train.groups import train_reward

    domain = get_domain("retail-lite")
    task = next(t for t in domain.tasks("test") if t.family == "cancel_order")
    careless = asyncio.run(run_episode(domain, task, make_policy("expert-noconfirm"), make_user("scripted"), 0))
    careful = asyncio.run(run_episode(domain, task, make_policy("expert"), make_user("scripted"), 0))
    assert careless.reward.reward == 1.0 and careless.reward.violations
    assert train_reward(careless) == 1.0 and train_reward(careless, penalize_violations=True) == 0.0
    assert train_reward(careful, penalize_violations=True) == 1.0
    # a negative violation reward ranks the rule-breaker under a plain failure; a careful win keeps its 1
    assert train_reward(careless, penalize_violations=True, violation_reward=-1.0) == -1.0
    assert train_reward(careful, penalize_violations=True, violation_reward=-1.0) == 1.0
    # the same episodes cut off at the turn limit: --truncation-reward replaces their reward (the lower of
    # the two penalties when both apply); unset, a truncated episode keeps its own
    cut_careful = careful.model_copy(update={"stop_reason": "max_turns"})
    cut_careless = careless.model_copy(update={"stop_reason": "turn_token_limit"})
    assert train_reward(cut_careful) == 1.0 and train_reward(cut_careful, truncation_reward=-0.5) == -0.5
    assert train_reward(careful, truncation_reward=-0.5) == 1.0  # ended by the user: not truncated
    assert train_reward(cut_careless, True, -1.0, truncation_reward=-0.5) == -1.0
    assert train_reward(cut_careless, True, 0.0, truncation_reward=-0.5) == -0.5


def test_violation_reward_without_penalizing_is_refused() -> None:
    from muarl.train.grpo_config import GRPOConfig

    with pytest.raises(ValueError, match="--penalize-violations"):
        GRPOConfig(violation_reward=-1.0)


def _scored(task_id: str, reward: float, violation: bool = False):
    from muarl.types import Reward, Trajectory, Violation

    violations = [Violation(kind="unconfirmed_write", call_id="c0", tool="w", detail="")] if violation else []
    return Trajectory(task_id=task_id, domain="retail", stop_reason="user_stop", turns=2,
                      reward=Reward(reward=reward, db_match=reward == 1.0, outputs_ok=True, outputs_required=False,
                                    tcr=reward, violations=violations))


def test_dynamic_sampling_plays_more_tasks_until_the_update_is_full():
    """DAPO refill: all-equal groups are dropped and the next tasks played, until tasks_per_step groups
    carry a learning signal or max_rollout_batches are spent; the cursor (data position) moves with it."""
    from muarl.domain import get_domain
    from muarl.train.groups import collect_groups
    from muarl.train.grpo_config import GRPOConfig

    order = get_domain("retail").tasks("train")[:10]
    mixed = {order[i].id for i in (3, 5, 6, 7, 9)}  # tasks whose group has one success in four
    played: list[tuple[list[str], int]] = []

    def play(chosen, batch_no):
        played.append(([t.id for t in chosen], batch_no))
        return [[_scored(t.id, 1.0 if t.id in mixed and m == 0 else 0.0) for m in range(4)] for t in chosen]

    config = GRPOConfig(tasks_per_step=3, group_size=4, dynamic_sampling=True, max_rollout_batches=4)
    groups, rewards, keep, cursor = collect_groups(play, order, 0, config)
    # batch 0 (tasks 0-2): nothing informative; batch 1 (3-5): two; batch 2 (6-8): two more -> full, stop
    assert [b for _, b in played] == [0, 1, 2] and cursor == 9 and len(groups) == 9
    assert played[2][0] == [t.id for t in order[6:9]]
    assert keep.tolist() == [False, False, False, True, False, True, True, False, False]  # the first three only
    assert rewards.shape == (9, 4)

    # the budget ends the search: two batches, whatever they found; the next step starts at the cursor
    played.clear()
    groups, _, keep, cursor = collect_groups(play, order, 8, GRPOConfig(tasks_per_step=3, group_size=4,
                                                                        dynamic_sampling=True, max_rollout_batches=2))
    assert played == [([order[8].id, order[9].id, order[0].id], 0), ([t.id for t in order[1:4]], 1)]
    assert cursor == 14 and keep.tolist() == [False, True, False, False, False, True]

    # penalized violations count as failures: a group whose one success broke a rule is all-wrong
    played.clear()
    violating = GRPOConfig(tasks_per_step=1, group_size=4, dynamic_sampling=True, penalize_violations=True,
                           max_rollout_batches=1)
    _, rewards, keep, _ = collect_groups(
        lambda chosen, b: [[_scored(t.id, 1.0 if m == 0 else 0.0, violation=True) for m in range(4)] for t in chosen],
        order, 0, violating)
    assert rewards.sum() == 0 and not keep.any()

    # without dynamic sampling: one batch, every group kept
    played.clear()
    groups, _, keep, cursor = collect_groups(play, order, 0, GRPOConfig(tasks_per_step=3, group_size=4))
    assert len(played) == 1 and cursor == 3 and keep.all()


def test_grpo_configs_that_cannot_run_fail_with_the_option_name():
    from muarl.train.grpo_config import GRPOConfig

    for bad, word in (({"tasks_per_step": 0}, "tasks_per_step"), ({"max_rollout_batches": 0}, "max_rollout_batches"),
                      ({"group_size": -1}, "group_size"), ({"temperature": 0.0}, "temperature"),
                      ({"num_iterations": 0}, "num_iterations")):
        with pytest.raises(ValueError, match=word):
            GRPOConfig(**bad)
    with pytest.raises(ValueError, match="tasks_per_step"):
        preset("tiny", tasks_per_step=0)


def test_an_update_that_trained_nothing_logs_no_loss_entropy_or_grad_norm(coin_batch):
    """Every advantage 0 and no KL term: no sequence runs, so loss, KL, entropy, clip fraction and grad norm
    are absent (not 0, which reads as a collapse), and the step's line says why; one sequence with an
    advantage brings them all back."""
    import copy

    import numpy as np

    from muarl.algorithms import get_algorithm
    from muarl.train.grpo import untrained
    from muarl.train.grpo_config import GRPOConfig
    from muarl.train.grpo_update import policy_update

    base = load("tiny")[0]
    config = GRPOConfig(kl_beta=0.0)
    absent = {"loss", "kl", "entropy", "clip_fraction", "grad_norm"}
    reasons = []
    for advantages, computed in (([0.0] * len(coin_batch), False), ([1.0] + [0.0] * (len(coin_batch) - 1), True)):
        model = copy.deepcopy(base)
        batch = [(t, a) for (t, _), a in zip(coin_batch, advantages, strict=True)]
        stats, _, _ = policy_update(model, None, torch.optim.SGD(model.parameters(), lr=0.0),
                                    get_algorithm("grpo", kl_beta=0.0), batch, config)
        assert (absent <= stats.keys()) == computed and (absent & stats.keys() == set()) != computed, stats
        reasons.append(untrained(stats, np.array([True]), [[False] * len(batch)]))
    assert "no sequence carried a gradient" in reasons[0] and reasons[1] is None
    # the viewer's curves: the untrained step has no point (a 0 would draw one at the bottom)
    from muarl.report.html import charts

    chart = next(c for c in charts([{"step": 1, "reward": 0.5, **stats}, {"step": 2, "reward": 0.5}])
                 if 'aria-label="entropy"' in c)
    assert chart.count("<circle") == 1
    assert "no informative group" in untrained({}, np.array([False, False]), [[False], [False]])
    assert "masked" in untrained({}, np.array([True, False]), [[True, True], [False, False]])
