"""The PPO ratio's old log-probs (issue 56, item 1): the trainer's own wherever engine and trainer differ in
numerics, the engine's kept for the importance weights only.

The mismatch is injected: episodes sampled by the shipped model (muarl's engine, float32: mismatch 1e-12),
then their stored engine log-probs moved by +-0.4 nats per agent token, as a bf16 or vLLM engine's may be.
With the engine's log-probs as the ratio's denominator every such token's ratio (e^0.4 = 1.49, e^-0.4 = 0.67)
leaves the clip [0.8, 1.2] before the policy has moved; with the trainer's it is 1.
"""

from __future__ import annotations

import copy

import pytest
import torch

from muarl.algorithms import get_algorithm
from muarl.models import load
from muarl.train.grpo_config import GRPOConfig
from muarl.train.grpo_update import recomputes_old_logprobs, update_on_rollouts
from train_fixtures import sample_coin_batch


def test_the_old_log_probs_are_recomputed_wherever_engine_and_trainer_differ():
    """One place decides: only the trainer's own float32 engine keeps the engine's log-probs as the old ones."""
    assert not recomputes_old_logprobs(GRPOConfig(), trainer_bf16=False)  # muarl's engine on the trainer's model
    assert recomputes_old_logprobs(GRPOConfig(), trainer_bf16=True)  # bf16 forwards: the trainer's numbers differ
    assert recomputes_old_logprobs(GRPOConfig(rollout_engine="vllm"), trainer_bf16=False)
    assert recomputes_old_logprobs(GRPOConfig(rollout_engine="vllm-server:http://127.0.0.1:8000/v1#tiny"), False)
    assert recomputes_old_logprobs(GRPOConfig(tis_cap=2.0), False)  # TIS weighs trainer over engine: needs them
    # forced either way
    assert recomputes_old_logprobs(GRPOConfig(recompute_old_logprobs=True), False)
    assert not recomputes_old_logprobs(GRPOConfig(rollout_engine="vllm", recompute_old_logprobs=False), True)
    with pytest.raises(ValueError, match="--no-recompute-old-logprobs"):
        GRPOConfig(recompute_old_logprobs=False, tis_cap=2.0)
    with pytest.raises(ValueError, match="--no-recompute-old-logprobs"):
        GRPOConfig(recompute_old_logprobs=False, max_staleness=1)  # its derived --tis-cap 2


@pytest.fixture(scope="module")
def mismatched():
    """(the sampled batch with its engine log-probs moved by +-0.4 nats per agent token, the sampling model)."""
    batch = sample_coin_batch()
    moved = []
    for k, (traj, advantage) in enumerate(batch):
        shift = [(0.4 if (k + p) % 2 else -0.4) * m for p, m in enumerate(traj.loss_mask)]
        logprobs = [lp + s for lp, s in zip(traj.logprobs, shift, strict=True)]
        moved.append((traj.model_copy(update={"logprobs": logprobs}), advantage))
    model, _ = load("tiny")
    return moved, model


def _first_update(model, batch, **options):
    config = GRPOConfig(kl_beta=0.0, num_iterations=1, micro_batch_size=3, skip_zero_advantage=False, **options)
    model = copy.deepcopy(model)
    stats, _, _ = update_on_rollouts(model, None, torch.optim.SGD(model.parameters(), lr=0.0),
                                     get_algorithm("grpo", kl_beta=0.0), batch, config)
    return stats


def test_an_engines_mismatch_alone_clips_no_token_at_the_first_iteration(mismatched):
    batch, model = mismatched
    tokens = sum(sum(t.loss_mask) for t, _ in batch)
    # the group advantages cancel in a token-mean; with their sizes alone the loss at ratio 1 is -mean |A|
    positive = [(t, abs(a)) for t, a in batch]
    on_policy = -sum(a * sum(t.loss_mask) for t, a in positive) / tokens
    for engine in ("vllm", "vllm-server:http://127.0.0.1:8000/v1#tiny"):  # the default for such an engine
        stats = _first_update(model, batch, rollout_engine=engine)
        assert stats["mismatch_kl"] > 0.05  # the injected mismatch is there, and logged (k3 of +-0.4: 0.07, 0.09)
        assert stats["clip_fraction"] == 0.0, (engine, stats["clip_fraction"])
        # the ratio is 1 on every token, as at the policy's own samples
        assert _first_update(model, positive, rollout_engine=engine)["loss"] == pytest.approx(on_policy, abs=1e-6)
    # with TIS the engine's log-probs weigh the tokens (min(q, 2), not 1), still without a clip
    stats = _first_update(model, positive, rollout_engine="vllm", tis_cap=2.0)
    assert stats["clip_fraction"] == 0.0 and abs(stats["loss"] - on_policy) > 0.01, stats
    # the engine's log-probs as the old ones (forced off): the same mismatch clips tokens at once
    stats = _first_update(model, batch, rollout_engine="vllm", recompute_old_logprobs=False)
    assert stats["clip_fraction"] > 0.2, stats["clip_fraction"]
