"""GRPO mathematics against values computed by hand."""

import math

import pytest
import torch

from muarl.algorithms import GRPO, DrGRPO, LossBatch, get_algorithm, informative_groups, k3_kl, masked_mean

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])


def test_grpo_advantages_are_group_normalised_with_sample_std():
    adv = GRPO().advantages(REWARDS)
    # group 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.86603
    assert torch.allclose(adv[0], torch.tensor([0.86603, -0.86603, -0.86603, 0.86603]), atol=1e-4)
    assert torch.equal(adv[1], torch.zeros(4))  # an all-correct group teaches nothing
    # group 3: mean 0.25, sample variance (3 * 0.0625 + 0.5625) / 3 = 0.25 -> std 0.5
    assert torch.allclose(adv[2], torch.tensor([-0.5, -0.5, -0.5, 1.5]), atol=1e-4)


def test_dr_grpo_advantages_do_not_divide_by_std():
    adv = DrGRPO().advantages(REWARDS)
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert torch.allclose(adv[2], torch.tensor([-0.25, -0.25, -0.25, 0.75]))


def _batch(logp, old, adv, mask, ref=None):
    return LossBatch(logprobs=torch.tensor(logp, requires_grad=True), old_logprobs=torch.tensor(old),
                     advantages=torch.tensor(adv), mask=torch.tensor(mask),
                     ref_logprobs=None if ref is None else torch.tensor(ref))


def test_masked_token_mean_weighs_every_token_equally():
    # two sequences, 2 and 4 agent tokens (the rest masked), ratio 1, advantages +1 and -1
    batch = _batch([[0.0] * 5, [0.0] * 5], [[0.0] * 5, [0.0] * 5], [[1.0] * 5, [-1.0] * 5],
                   [[1, 1, 0, 0, 0], [0, 1, 1, 1, 1]])
    loss, stats = GRPO(kl_beta=0).loss(batch)
    assert loss.item() == pytest.approx((2 * -1 + 4 * 1) / 6)  # token-mean, not (−1 + 1) / 2 = 0
    assert stats.tokens == 6 and stats.clip_fraction == 0 and stats.ratio_mean == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -A * exp(logp - old) at ratio 1 is -A, divided by the 6 agent tokens; masked tokens get 0
    expected = torch.tensor([[-1, -1, 0, 0, 0], [0, 1, 1, 1, 1]]) / 6
    assert torch.allclose(batch.logprobs.grad, expected.float())
    # Dr.GRPO: each sequence's sum over a constant 4 tokens, then the mean over sequences
    dr, _ = DrGRPO(kl_beta=0, max_tokens=4).loss(batch)
    assert dr.item() == pytest.approx(((-2 / 4) + (4 / 4)) / 2)


def test_clipping_and_clip_fraction():
    up, down = 0.5, -0.5  # ratios e^0.5 = 1.6487 and e^-0.5 = 0.6065
    batch = _batch([[up, up, down, down]], [[0.0] * 4], [[1.0, -1.0, 1.0, -1.0]], [[1, 1, 1, 1]])
    loss, stats = GRPO(kl_beta=0).loss(batch)
    # A>0 and ratio > 1.2: clipped to -1.2; A<0 and ratio > 1: unclipped 1.6487;
    # A>0 and ratio < 0.8: unclipped -0.6065; A<0 and ratio < 0.8: clipped to 0.8
    expected = (-1.2 + math.exp(0.5) - math.exp(-0.5) + 0.8) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(0.5)
    loss.backward()
    assert batch.logprobs.grad[0, 0] == 0 and batch.logprobs.grad[0, 3] == 0  # clipped tokens: no gradient
    # clip-higher (DAPO): the upper bound moves to 1.28 for the first token only
    higher, _ = GRPO(kl_beta=0, clip_high=0.28).loss(_batch([[up, up, down, down]], [[0.0] * 4],
                                                             [[1.0, -1.0, 1.0, -1.0]], [[1, 1, 1, 1]]))
    assert higher.item() == pytest.approx(expected + (-1.28 + 1.2) / 4, abs=1e-6)


def test_k3_kl_values_and_its_place_in_the_loss():
    logp, ref = torch.tensor([math.log(0.5), math.log(0.2)]), torch.tensor([math.log(0.25), math.log(0.2)])
    kl = k3_kl(logp, ref)
    # r = log(0.25 / 0.5) = -ln 2: e^r - r - 1 = 0.5 + 0.693147 - 1
    assert kl[0].item() == pytest.approx(0.5 + math.log(2) - 1) and kl[1].item() == 0
    assert torch.all(k3_kl(torch.randn(1000), torch.randn(1000)) >= 0)
    batch = _batch([[math.log(0.5), math.log(0.2)]], [[math.log(0.5), math.log(0.2)]], [[0.0, 0.0]], [[1, 1]],
                   ref=[[math.log(0.25), math.log(0.2)]])
    loss, stats = GRPO(kl_beta=0.001).loss(batch)
    assert stats.kl == pytest.approx((0.5 + math.log(2) - 1) / 2)
    assert loss.item() == pytest.approx(0.001 * stats.kl)


def test_masked_mean_of_nothing_is_zero_and_fully_masked_sequences_do_not_count():
    assert masked_mean(torch.ones(3), torch.zeros(3)).item() == 0
    batch = _batch([[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [5.0, 5.0]], [[1, 1], [0, 0]])
    assert DrGRPO(kl_beta=0, max_tokens=2).loss(batch)[0].item() == pytest.approx(-1.0)


def test_dynamic_sampling_keeps_only_informative_groups():
    assert informative_groups(REWARDS).tolist() == [True, False, True]
    assert informative_groups(torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])).tolist() == [False, False, True]


def test_registry():
    assert isinstance(get_algorithm("dr_grpo", clip_high=0.28), DrGRPO)
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        get_algorithm("ppo")
