"""The shared-prefix scoring of GRPO (muarl.train.shared_prefix) equals the plain per-sequence computation.

Log-probs, the loss, the logged KL and every parameter's gradient, on the embedded model and on
SmolLM2-135M (its packaged weights), with and without LoRA, one sequence per forward pass and several.
The sequences share a 60-token opening (as every episode of a domain shares its system turn) and differ
after it; their log-probs at sampling time are the model's own, as in a real on-policy step.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import pytest
import torch

from muarl.algorithms import get_algorithm
from muarl.models import load
from muarl.train.grpo_config import GRPOConfig
from muarl.train.grpo_update import checkpointing, policy_update, set_checkpointing
from muarl.train.scoring import batch_logprobs
from muarl.train.shared_prefix import common_prefix, record_prefix


@dataclass
class Seq:
    """What the update reads of a trajectory: its tokens, its loss mask and its sampling log-probs."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


def _batch(model, vocab: int, advantages=(1.0, -0.5, 0.0, 0.5, 1.5), opening: int = 60):
    rng = random.Random(0)
    shared = [rng.randrange(vocab) for _ in range(opening)]
    seqs = []
    for n in (25, 40, 31, 52, 18)[:len(advantages)]:
        tail = [rng.randrange(vocab) for _ in range(n)]
        mask = [0] * opening + [int(5 <= k < 12 or k >= n - 6) for k in range(n)]
        seqs.append(Seq(shared + tail, mask, []))
    with torch.no_grad():
        own, _ = batch_logprobs(model, [s.token_ids for s in seqs], 1.0, [s.loss_mask for s in seqs])
    for row, s in enumerate(seqs):
        s.logprobs = own[row, :len(s.token_ids)].tolist()
    return list(zip(seqs, advantages, strict=True))


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))


def _update(model, reference, batch, **options):
    """One update with lr 0 (the weights stay put); returns its stats and every trainable parameter's grad."""
    config = GRPOConfig(lr=1e-3, grad_clip=1e9, **{"kl_beta": 0.1, **options})
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    stats, _, _ = policy_update(model, reference, optimizer, get_algorithm("grpo", kl_beta=config.kl_beta), batch,
                                config)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return stats, grads


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


MODELS = ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)]

#: How far the policy is from its reference in the update tests, so that the KL term and its gradient are
#: not 0 (k3's gradient vanishes where the two agree): full fine-tuning scores against a copy with
#: N(0, 0.01) added to every weight, LoRA's B matrices (0 at init, the adapter then a no-op) get N(0, 0.05).
#: Measured on the embedded model: mean KL per agent token 0.54 and 0.32, and the KL term moves every
#: parameter's gradient by at least 14% of its norm, against the 1e-4 the two paths are compared at.
REFERENCE_NOISE, LORA_NOISE = 0.01, 0.05


def _policy_and_reference(name: str, lora: bool):
    """(policy, reference, tokenizer) that differ by a fixed draw; the reference is None with LoRA (the
    policy with its adapter disabled), as in training."""
    model, tokenizer = load(name)
    torch.manual_seed(0)
    with torch.no_grad():
        if lora:
            model, reference = _lora(model), None
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, LORA_NOISE)
        else:
            reference = copy.deepcopy(model).requires_grad_(False)
            for p in reference.parameters():
                p.add_(REFERENCE_NOISE * torch.randn_like(p))
    return model, reference, tokenizer


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_shared_prefix_update_equals_the_plain_one(name, lora):
    """The shared-prefix update equals the plain one, the KL term's gradient through the prefix included:
    the reference differs from the policy (the KL term is not 0), and with every advantage 0 the policy
    term has no gradient, so the gradient compared is the KL term's alone."""
    model, reference, tokenizer = _policy_and_reference(name, lora)
    batch = _batch(model, len(tokenizer))  # sampling log-probs: the policy's own, as on-policy
    kl_only = [(seq, 0.0) for seq, _ in batch]
    # micro-batches of 1 and 3 on the embedded model; SmolLM2 (minutes per pass on two cores) checks the
    # real architecture's layers at micro-batches of 3 only, which still splits the batch in two
    micros = (1, 3) if name == "tiny" else (3,)
    for pairs in (batch, kl_only):
        for micro in micros:
            options = {"micro_batch_size": micro, "skip_zero_advantage": False}
            plain, plain_grads = _update(model, reference, pairs, shared_prefix=False, **options)
            shared, shared_grads = _update(model, reference, pairs, shared_prefix=True, **options)
            assert plain["shared_prefix_tokens"] == 0 and shared["shared_prefix_tokens"] == 60
            assert plain["kl"] > 0.01  # the reference differs from the policy: there is a KL term to compare
            for key in ("loss", "kl", "entropy"):
                assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-7), key
            assert plain_grads.keys() == shared_grads.keys() and plain_grads
            for n, g in plain_grads.items():  # float noise only (measured up to 1e-5 of the norm): 1e-4 of it
                assert _relative_error(shared_grads[n], g) < 1e-4, n
            if pairs is kl_only:  # all of it the KL term's, and none of it 0 (0 against 0 would agree)
                assert all(g.norm() > 0 for g in plain_grads.values())
            # the embedding receives gradient through the opening only via the shared pass: it must be there
            assert any(g.abs().sum() > 0 for n, g in shared_grads.items() if "embed" in n or "lora" in n)


@pytest.mark.parametrize("name", MODELS)
def test_shared_prefix_logprobs_equal_the_plain_ones(name):
    model, tokenizer = load(name)
    batch = _batch(model, len(tokenizer))
    seqs, masks = [s.token_ids for s, _ in batch], [s.loss_mask for s, _ in batch]
    n = common_prefix(seqs, masks)
    assert n == 60  # the whole opening: the first scored token (the 66th) is predicted after it
    with torch.no_grad():
        plain, plain_ent = batch_logprobs(model, seqs, 0.7, masks)
        shared, shared_ent = batch_logprobs(model, seqs, 0.7, masks, record_prefix(model, seqs[0][:n]))
    torch.testing.assert_close(shared, plain, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(shared_ent, plain_ent, rtol=1e-4, atol=1e-5)
    assert (plain != 0).sum() == sum(sum(m[1:]) for m in masks)


def test_scoring_against_a_prefix_the_sequence_does_not_start_with_is_an_error():
    model, tokenizer = load("tiny")
    with torch.no_grad():
        prefix = record_prefix(model, list(range(20)))
        with pytest.raises(ValueError, match="shared prefix"):
            batch_logprobs(model, [list(range(1, 40))], 1.0, None, prefix)


def test_the_prefix_stops_before_the_first_scored_token_even_when_the_sequences_agree_on_it():
    same = list(range(50))
    assert common_prefix([same, same + [7]], [[0] * 30 + [1] * 20, [0] * 51]) == 29
    assert common_prefix([[1, 2, 3, 4], [1, 2, 9, 4]], None) == 2


def test_zero_advantage_sequences_are_skipped_without_kl_and_the_update_is_unchanged():
    """With the KL term off, a zero-advantage sequence adds nothing to the gradient: skipping its forward
    and backward gives the same gradient and the same logged loss; with KL on it is not skipped."""
    model, tokenizer = load("tiny")
    batch = _batch(model, len(tokenizer), advantages=(1.0, 0.0, -0.5, 0.0, 0.0))
    reference = copy.deepcopy(model).requires_grad_(False)
    torch.manual_seed(0)
    for p in reference.parameters():  # the policy has moved away from its reference: the KL term is not 0
        p.add_(0.05 * torch.randn_like(p))
    ran, ran_grads = _update(model, reference, batch, kl_beta=0.0, skip_zero_advantage=False)
    skipped, skipped_grads = _update(model, reference, batch, kl_beta=0.0)
    assert ran["skipped_sequences"] == 0 and skipped["skipped_sequences"] == 3
    assert skipped["loss"] == pytest.approx(ran["loss"], rel=1e-5, abs=1e-8)
    for n, g in ran_grads.items():
        assert _relative_error(skipped_grads[n], g) < 1e-4, n
    with_kl, _ = _update(model, reference, batch)
    assert with_kl["skipped_sequences"] == 0
    # a threshold above every sequence's KL skips them, and the KL they add is still logged
    loose, _ = _update(model, reference, batch, zero_advantage_kl=1e6)
    assert loose["skipped_sequences"] == 3 and loose["kl"] == pytest.approx(with_kl["kl"], rel=1e-4, abs=1e-8)


def test_activation_checkpointing_is_off_on_the_cpu_unless_asked_for():
    model, _ = load("tiny")
    assert not set_checkpointing(model, GRPOConfig(), 100_000)
    assert set_checkpointing(model, GRPOConfig(gradient_checkpointing=True), 10)
    assert checkpointing(model)
    assert not set_checkpointing(model, GRPOConfig(gradient_checkpointing=False), 10)
    assert not checkpointing(model)
