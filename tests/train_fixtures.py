"""A domain for training tests whose reward the untrained tiny model can earn about half the time.

The embedded model starts from random weights and never completes a real task, so every GRPO group is
all-wrong and every advantage 0: a resume test on it would compare updates that do nothing. This domain
is the retail world with a one-line policy and only the ``think`` tool (a short system turn: fast
steps), graded by its own scorer (the public ``Domain.scorer`` hook): reward 1 when the sum of the
agent's sampled token ids is even. A deterministic function of the sampled tokens, so groups disagree
and updates are real.
"""

from __future__ import annotations

import dataclasses

from muarl.domain import get_domain
from muarl.types import Reward


@dataclasses.dataclass
class LoraSettings:
    """The LoRA fields ``muarl.train.weights.load_trainable`` reads, for tests that build an adapted tiny
    model without a whole run config."""

    model: str = "tiny"
    lora_r: int = 4
    lora_alpha: int = 8
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"

def _coin(domain, task, trajectory, env, require_outputs) -> Reward:
    sampled = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    win = sum(sampled) % 2 == 0
    return Reward(reward=float(win), db_match=win, outputs_ok=True, outputs_required=False, tcr=float(win))


_retail = get_domain("retail")
coin = dataclasses.replace(_retail, name="coin", policy="Help the user with their order.",
                           tools=[t for t in _retail.tools if t.name == "think"], scorer=_coin)


def sample_coin_batch() -> list:
    """Eight sampled episodes of the coin domain (tests/train_fixtures.py) with their group advantages."""
    import asyncio

    import torch

    from muarl.algorithms import get_algorithm
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, RolloutEngine
    from muarl.users.scripted import ScriptedUser

    model, tokenizer = load("tiny")
    policy = HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=12, seed=3)
    engine = RolloutEngine(coin, policy, ScriptedUser(), EpisodeConfig(max_turns=3), group_size=4, progress=False)
    groups = asyncio.run(engine.run(coin.tasks("train")[:2]))
    rewards = torch.tensor([[t.reward.reward for t in g] for g in groups])
    advantages = get_algorithm("grpo").advantages(rewards)
    assert advantages.abs().sum() > 0
    return [(t, float(advantages[g, m])) for g, group in enumerate(groups) for m, t in enumerate(group)]


def write_sft_data(path):
    """Six short chat-format conversations (the resume logic, not the data, is under test: short is fast)."""
    import json

    from muarl.domain import get_domain

    think = [t.spec.openai_schema() for t in get_domain("retail").tools if t.name == "think"]
    lines = []
    for i in range(6):
        call = {"id": "c0", "type": "function",
                "function": {"name": "think", "arguments": json.dumps({"thought": f"order {i} is pending"})}}
        messages = [{"role": "system", "content": "You help users with their orders."},
                    {"role": "user", "content": f"Hi, please cancel order #W{1000 + i}."},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c0", "name": "think", "content": ""},
                    {"role": "assistant", "content": f"Order #W{1000 + i} can be cancelled. Shall I go ahead?"},
                    {"role": "user", "content": "yes" if i % 2 else "Yes, please."},
                    {"role": "assistant", "content": f"Done: order #W{1000 + i} is cancelled."}]
        lines.append(json.dumps({"messages": messages, "tools": think}))
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_same_step(start: dict, one: dict, two: dict) -> None:
    """Two runs took the same plain-SGD steps from ``start`` (weights by name), up to float32 summation order.

    The bound, per tensor: a step is ``-lr * clip * gradient``; one and two processes (or a sharded and an
    unsharded model) add the same terms in another order, which moves a float32 sum by at most a few units
    of its last place relative to the sum of the terms' sizes. 1e-3 of the tensor's largest change covers
    that with a wide margin (seen: under 1e-5) while a gradient that lost one process's share moves by
    about half its step; 4 units of float32's last place at the tensor's largest weight bound the rounding
    of storing the weights themselves."""
    moved = False
    for k in one:
        step = (one[k] - start[k]).abs().max().item()
        ulp = one[k].abs().max().item() * 2.0 ** -23
        tolerance = 1e-3 * step + 4 * ulp
        difference = (one[k] - two[k]).abs().max().item()
        assert difference <= tolerance, f"{k}: one and two processes differ by {difference:.3g} > {tolerance:.3g}"
        moved |= step > 1e-3
    assert moved  # and the step did move the weights
