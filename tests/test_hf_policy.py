"""The HF policy: token-exact trajectories, every token computed once, dynamic batching with KV reuse."""

import asyncio

import pytest
import torch

from muarl.chat import parse_assistant
from muarl.domain import get_domain
from muarl.policies.hf import HFPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.tiny_model import bias_end_of_turn
from muarl.users.base import UserReply, UserSession, UserSimulator


class TalkativeUser(UserSimulator):
    """A plain user for token tests: answers every agent message, stops after ``turns`` replies."""

    def __init__(self, turns: int = 3):
        self.turns = turns

    def session(self, task, seed):
        return _Talk(task, seed, self.turns)


class _Talk(UserSession):
    def __init__(self, task, seed, turns):
        self.task, self.seed, self.turns, self.n = task, seed, turns, 0

    async def start(self):
        return UserReply(self.task.instruction)

    async def reply(self, agent_text, act):
        self.n += 1
        return UserReply(f"Reply {self.n} (seed {self.seed}): I see. Ünïcødé ok?",
                         stop="stop" if self.n >= self.turns else None)


def _check_token_exactness(policy: HFPolicy, trajectories, temperature: float, forward_every: int = 1) -> float:
    """Stored ids/logprobs/masks against a teacher-forced forward pass (on every ``forward_every``-th
    trajectory: the pass is the expensive part for a real model); returns the drift rate."""
    model = policy.model
    for n, traj in enumerate(trajectories):
        ids, mask, logprobs = traj.token_ids, traj.loss_mask, traj.logprobs
        assert len(ids) == len(mask) == len(logprobs) and sum(mask) > 0
        masked = [p for p, m in enumerate(mask) if m]
        assert all(logprobs[p] == 0.0 for p, m in enumerate(mask) if not m)
        if n % forward_every == 0:
            with torch.no_grad():
                hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
                logits = model.get_output_embeddings()(hidden[[p - 1 for p in masked]]).float()
            recomputed = torch.log_softmax(logits / temperature, dim=-1)[range(len(masked)), [ids[p] for p in masked]]
            stored = torch.tensor([logprobs[p] for p in masked])
            assert torch.allclose(recomputed, stored, atol=2e-3), (recomputed - stored).abs().max()
        # the sampled spans, decoded and parsed, are exactly the assistant messages of the trajectory
        spans, current = [], []
        for p, m in enumerate(mask):
            if m:
                current.append(ids[p])
            elif current:
                spans.append(current)
                current = []
        if current:
            spans.append(current)
        chat = policy.chat_format(get_domain(traj.domain))
        assistants = [m for m in traj.messages if m.role == "assistant"]
        assert len(spans) == len(assistants)
        for span, message in zip(spans, assistants, strict=True):
            parsed = parse_assistant(chat.decode(span))
            assert parsed.content == message.content
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in message.tool_calls]
    return sum(bool(t.metadata["drift"]) for t in trajectories) / len(trajectories)


def _run(policy, domain, tasks, group, user, concurrency=64, **config):
    engine = RolloutEngine(domain, policy, user, EpisodeConfig(**config), group_size=group, concurrency=concurrency,
                           progress=False)
    return [t for g in asyncio.run(engine.run(tasks)) for t in g]


def test_tiny_model_episodes_are_token_exact_and_compute_each_token_once():
    policy = HFPolicy("tiny-random", temperature=1.0, max_new_tokens=48, seed=3)
    hook = bias_end_of_turn(policy.model, policy.tokenizer, 6.0)
    try:
        trajectories = []
        for name in ("retail", "airline", "telecom"):
            domain = get_domain(name)
            trajectories += _run(policy, domain, domain.tasks("test")[:6], 3, TalkativeUser(3))
        assert len(trajectories) >= 50
        total = sum(len(t.token_ids) for t in trajectories)
        # every token goes through the model once, or comes from the shared prompt prefix; only each
        # episode's final sampled token is never fed
        engine = policy.engine
        assert engine.tokens_computed - engine.prefix_computed + engine.tokens_reused == total - len(trajectories)
        # the first domain's system turn (policy + tools) is the engine's shared prefix: its 18 episodes sit on it
        assert engine.tokens_reused == 18 * len(engine.prefix.tokens) and engine.prefix_computed == len(engine.prefix.tokens)
        assert sum(t.turns for t in trajectories) > 2 * len(trajectories)  # multi-turn, not one-shot
        # rows that finish a turn free their slot and later turns join into free slots (one row's copy);
        # the whole buffer is rebuilt only when free slots outnumber live rows or a row is wider than it
        assert engine.slot_fills > engine.rebuilds > 0
        drift = _check_token_exactness(policy, trajectories, 1.0)
        print(f"tiny model: {len(trajectories)} episodes, drift rate {drift:.2f}")
    finally:
        hook.remove()


def test_group_members_sample_differently_but_reproducibly():
    domain = get_domain("retail")
    tasks = domain.tasks("test")[:2]

    def run():
        policy = HFPolicy("tiny-random", temperature=1.0, max_new_tokens=16, seed=11)
        return _run(policy, domain, tasks, 4, TalkativeUser(1))

    a, b = run(), run()
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert len({tuple(t.token_ids) for t in a[:4]}) > 1


def _batched_and_alone(temperature: float, bias: float, replies: int, reuse_slots: bool = True):
    """Eight airline tasks x 2 played at concurrency 64 and at 1: (trajectories of each, the batched engine)."""
    domain = get_domain("airline")
    outs, engines = [], []
    for concurrency in (64, 1):
        policy = HFPolicy("tiny-random", temperature=temperature, max_new_tokens=24, seed=0)
        policy.engine.reuse_slots = reuse_slots
        hook = bias_end_of_turn(policy.model, policy.tokenizer, bias)
        outs.append(_run(policy, domain, domain.tasks("test")[:8], 2, TalkativeUser(replies), concurrency=concurrency))
        hook.remove()
        engines.append(policy.engine)
    return outs[0], outs[1], engines[0]


def test_batched_generation_equals_one_at_a_time():
    """Padding and cache merging must not change what is sampled: greedy, batch 64 vs batch 1."""
    batched, alone, _ = _batched_and_alone(0.0, 4.0, 2)
    assert [t.token_ids for t in batched] == [t.token_ids for t in alone]


def test_new_requests_without_a_shared_prefix_are_prefilled_together():
    """A server's requests (nothing cached, no shared prefix), of different lengths, are prefilled in one
    batched pass where attention gives a query that sees no key zeros (PyTorch 2.5 and later: the left
    padding of a new row sees nothing), and each still gets, greedy, exactly what it gets alone."""
    from muarl.attention import unattended_is_zero
    from muarl.policies.batched_generator import BatchedGenerator, TokenSequence

    model = HFPolicy("tiny-random", temperature=0.0, max_new_tokens=12, seed=0).model
    assert unattended_is_zero(torch.device("cpu"), next(model.parameters()).dtype)
    prompts = [[(7 * n + 3 * i) % 200 + 5 for i in range(6 + 5 * n)] for n in range(6)]  # 6 to 31 tokens

    async def generate(batch: list[list[int]]) -> tuple[list[list[int]], int]:
        engine = BatchedGenerator(model, set(), 0.0, 1.0, max_batch=8)
        replies = await asyncio.gather(*[engine.generate(TokenSequence(generator=torch.Generator().manual_seed(0)),
                                                         ids, 12) for ids in batch])
        return [tokens for tokens, _, _ in replies], engine.prefill_passes

    together, passes = asyncio.run(generate(prompts))
    alone = [asyncio.run(generate([ids]))[0][0] for ids in prompts]
    assert passes < len(prompts), passes
    assert together == alone and len({tuple(t) for t in alone}) > 1


def test_rows_joining_free_slots_sample_as_one_at_a_time():
    """Turns that end at different times free slots that later turns join into: what each episode
    samples (from its own generator) is still what it samples alone."""
    batched, alone, engine = _batched_and_alone(1.0, 5.0, 3)
    assert engine.slot_fills > 0
    assert len({sum(t.loss_mask) for t in batched}) > 3  # turns of many lengths: rows leave at different steps
    assert [t.token_ids for t in batched] == [t.token_ids for t in alone]


def test_without_slot_reuse_every_join_and_finish_rebuilds_the_batch():
    """The benchmark's baseline (engines that copy the whole batch whenever a row joins or leaves)
    samples the same tokens, and really takes that path."""
    batched, alone, engine = _batched_and_alone(1.0, 5.0, 3, reuse_slots=False)
    assert engine.slot_fills == 0 and engine.rebuilds > 15  # 21 here; 10 with slot reuse
    assert [t.token_ids for t in batched] == [t.token_ids for t in alone]


def test_context_and_turn_limits_end_the_episode():
    domain = get_domain("retail")
    task = domain.tasks("test")[0]
    policy = HFPolicy("tiny-random", temperature=1.0, max_new_tokens=8, seed=0)
    [traj] = _run(policy, domain, [task], 1, TalkativeUser(5))
    assert traj.stop_reason == "turn_token_limit" and sum(traj.loss_mask) == 8
    small = HFPolicy("tiny-random", temperature=1.0, max_new_tokens=64, max_context=100, seed=0)
    [traj] = _run(small, domain, [task], 1, TalkativeUser(5))
    assert traj.stop_reason == "context_limit"


@pytest.mark.slow
def test_smollm2_episodes_are_token_exact():
    policy = HFPolicy("smollm2", temperature=1.0, max_new_tokens=24, max_batch=16, seed=5)
    domain = get_domain("retail")
    # 16 episodes in flight: SmolLM2's KV cache is ~46 kB per token, and each episode keeps its own
    trajectories = _run(policy, domain, domain.tasks("test")[:8], 4, TalkativeUser(2), concurrency=16)
    assert len(trajectories) == 32
    engine = policy.engine
    assert (engine.tokens_computed - engine.prefix_computed + engine.tokens_reused
            == sum(len(t.token_ids) for t in trajectories) - len(trajectories))
    drift = _check_token_exactness(policy, trajectories, 1.0, forward_every=6)
    print(f"SmolLM2: {len(trajectories)} episodes, drift rate {drift:.2f}")
