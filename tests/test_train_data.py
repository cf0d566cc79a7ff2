"""SFT data: conversations tokenized like episodes, packed rows equal to unpacked ones."""

import pytest
import torch

from muarl.chat import ChatFormat, parse_assistant
from muarl.domain import get_domain
from muarl.gold import gold_trajectory
from muarl.models import load
from muarl.train.data import tokenize_conversation
from muarl.train.packing import collate, plan_rows, token_loss


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-random")


def _examples(tokenizer, n=4):
    out = []
    for name in ("retail", "telecom"):
        domain = get_domain(name)
        chat = ChatFormat(tokenizer, [t.spec for t in domain.tools])
        for task in [t for t in domain.tasks("train") if any(a.actor == "agent" for a in t.gold_actions)][:n // 2]:
            messages = gold_trajectory(domain, task)[0].messages
            out.append((chat, messages, tokenize_conversation(chat, messages)))
    return out


def test_tokens_match_a_full_render_and_the_mask_covers_exactly_the_assistant_turns(tiny):
    for chat, messages, ex in _examples(tiny[1], 6):
        assert ex.ids == chat.encode(chat.render(messages))[: len(ex.ids)]
        spans, current = [], []
        for token, m in zip(ex.ids, ex.mask, strict=True):
            if m:
                current.append(token)
            elif current:
                spans.append(current)
                current = []
        if current:
            spans.append(current)
        assistants = [m for m in messages if m.role == "assistant"]
        assert len(spans) == len(assistants)
        for span, message in zip(spans, assistants, strict=True):
            assert span[-1] in chat.stop_ids  # the end-of-turn token is learned too
            parsed = parse_assistant(chat.decode(span))
            assert parsed.content == message.content
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in message.tool_calls]


def test_a_conversation_without_assistant_turns_is_refused(tiny):
    from muarl.types import Message

    chat = ChatFormat(tiny[1], [])
    with pytest.raises(ValueError, match="nothing to learn"):
        tokenize_conversation(chat, [Message(role="system", content="s"), Message(role="user", content="u")])


def test_plan_rows_first_fit_decreasing():
    assert plan_rows([5, 3, 3, 2], 6) == [[0], [1, 2], [3]]
    assert plan_rows([2, 2, 2], 6) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="longer than max_len=4"):
        plan_rows([5, 1], 4)


def test_packed_loss_equals_each_conversation_alone(tiny):
    model, tokenizer = tiny
    examples = [ex for _, _, ex in _examples(tokenizer, 4)]
    expected_sum, expected_count = 0.0, 0
    with torch.no_grad():
        for ex in examples:  # reference: a plain forward of each conversation by itself
            logits = model(input_ids=torch.tensor([ex.ids])).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(ex.ids[1:])
            weights = torch.tensor(ex.mask[1:], dtype=torch.float)
            expected_sum += float(-(logp[torch.arange(len(targets)), targets] * weights).sum())
            expected_count += int(weights.sum())
        lengths = [len(ex) for ex in examples]
        padded = collate(examples, [[i] for i in range(len(examples))], tokenizer.pad_token_id)
        packed = collate(examples, plan_rows(lengths, 2 * max(lengths)), tokenizer.pad_token_id)
        for batch in (padded, packed):
            total, count = token_loss(model, batch)
            assert count == expected_count
            assert total.item() == pytest.approx(expected_sum, rel=1e-4)
    assert packed.input_ids.shape[0] < padded.input_ids.shape[0]
    assert packed.padding_fraction < padded.padding_fraction


def test_segment_attention_gives_the_block_diagonal_masks_loss_and_gradient():
    """Packed rows through per-conversation SDPA calls equal the dense block-diagonal mask, gradients too."""
    import random

    from muarl.train.data import Example

    model = load("tiny-random")[0]
    rng = random.Random(0)
    examples = [Example(ids=[rng.randrange(4096) for _ in range(n)], mask=[0] * (n // 2) + [1] * (n - n // 2))
                for n in (300, 500, 200, 650)]
    batch = collate(examples, plan_rows([len(e) for e in examples], 700), 0)
    assert batch.input_ids.shape[0] < len(examples)  # some row holds two conversations
    results = []
    for varlen in (False, True):
        model.zero_grad()
        total, count = token_loss(model, batch, varlen=varlen)
        total.backward()
        results.append((total.item(), count, torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    (dense, n_dense, g_dense), (seg, n_seg, g_seg) = results
    assert n_dense == n_seg and seg == pytest.approx(dense, rel=1e-5)
    assert torch.allclose(g_seg, g_dense, atol=1e-5) and g_dense.abs().max() > 0
