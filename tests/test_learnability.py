"""GRPO learns a one-decision task, and unlearns it when the reward is reversed.

The decision is the first one the shipped base makes in every retail-lite conversation: after "could
you please tell me", does it ask for the email (" the email address") or for the name and zip code
(" your first name ...")? A custom domain built with the public API (retail-lite with its own
``Domain.scorer``) rewards asking for the email, or, reversed, the other way. The decision's exact
probability (the base's next-token probability of the email branch at that point, averaged over the
training prompts) must move by at least :data:`MARGIN` towards the rewarded choice within
:data:`STEPS` steps of ``train_grpo``, and by as much the other way under the reversed reward. A
flipped advantage sign, log-probs scored at the wrong positions (a broken mask alignment) or wrong
log-probs turn one of the two around or flatten both.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from muarl.domain import get_domain, register
from muarl.models import load
from muarl.train.grpo import train_grpo
from muarl.train.grpo_config import preset
from muarl.types import Reward

STEPS = 4
MARGIN = 0.10
ASK = "I'd be happy to help. First I need to verify your identity: could you please tell me"
EMAIL, NAME = " the email address on your account?", " your first name, last name and zip code?"


def _asks_email(trajectory) -> bool:
    first = next((m for m in trajectory.messages if m.role == "assistant"), None)
    return first is not None and "email" in first.content


def _domain(name: str, want_email: bool):
    lite = get_domain("retail-lite")

    def score(domain, task, trajectory, env, require_outputs) -> Reward:
        win = _asks_email(trajectory) == want_email
        return Reward(reward=float(win), db_match=win, outputs_ok=True, outputs_required=False, tcr=float(win))

    domain = dataclasses.replace(lite, name=name, scorer=score)
    register(domain, name=name)
    return domain


def _branch(tokenizer) -> tuple[list[int], int]:
    """The tokens of the shared part of the two openings, and the first token of the email branch."""
    a, b = tokenizer.encode(ASK + EMAIL), tokenizer.encode(ASK + NAME)
    at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return a[:at], a[at]


def email_probability(model, tokenizer, prompts: list[list[int]]) -> float:
    """The exact probability of the email branch at the decision point, averaged over ``prompts``."""
    shared, email = _branch(tokenizer)
    with torch.no_grad():
        total = 0.0
        for prompt in prompts:
            logits = model(input_ids=torch.tensor([prompt + shared])).logits[0, -1].float()
            total += float(torch.softmax(logits, -1)[email])
    return total / len(prompts)


def _prompts(domain, tasks) -> list[list[int]]:
    """The token prompts the agent's first turn is sampled after, one per task (as the rollout builds them)."""
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.users.scripted import ScriptedUser

    policy = HFPolicy(load("tiny"), temperature=1.0, max_new_tokens=2, seed=0)
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=1), group_size=1,
                           common_user_seed=True, seed=0, progress=False)
    return [t.token_ids[:t.loss_mask.index(1)] for [t] in asyncio.run(engine.run(tasks))]


@pytest.mark.slow
@pytest.mark.parametrize("want_email,direction", [(True, +1), (False, -1)], ids=["email-rewarded", "reversed"])
def test_grpo_moves_the_rewarded_first_decision(tmp_path, want_email, direction):
    name = f"ask_email_{want_email}"
    domain = _domain(name, want_email)
    config = preset("tiny", domain=name, out=str(tmp_path), steps=STEPS, tasks_per_step=4, group_size=8, lr=1e-3,
                    kl_beta=0.0, max_new_tokens=40, max_turns=1, save_every=0, report_to="none")
    model, tokenizer = load("tiny")
    prompts = _prompts(domain, domain.tasks("train")[:16])
    before = email_probability(model, tokenizer, prompts)
    result = train_grpo(config, progress=False)
    after = email_probability(result["model"], tokenizer, prompts)
    assert 0.2 < before < 0.9, before  # the base hesitates: there is something to learn either way
    assert direction * (after - before) >= MARGIN, (before, after)
