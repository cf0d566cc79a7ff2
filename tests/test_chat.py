"""Chat format: tool-call parsing, rendering with and without native tool support, append-only tokens."""

import json
import random

import pytest

from muarl.chat import ChatFormat, parse_assistant
from muarl.domain import get_domain
from muarl.gold import gold_trajectory
from muarl.models import load


def test_parse_text_and_several_calls():
    text = ('Let me check.\n<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
            '<tool_call>{"name": "think", "arguments": "{\\"thought\\": \\"x\\"}"}</tool_call>'
            '<tool_call>{"name": "list_all_product_types"}</tool_call>')
    parsed = parse_assistant(text, "call_3")
    assert parsed.content == "Let me check."
    assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [
        ("call_3_0", "get_order_details", {"order_id": "#W1"}), ("call_3_1", "think", {"thought": "x"}),
        ("call_3_2", "list_all_product_types", {})]
    assert parsed.errors == []


@pytest.mark.parametrize(("text", "error"), [
    ('<tool_call>{"name": "x", "arguments": {</tool_call>', "invalid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "needs a string 'name'"),
    ('<tool_call>{"name": 5}</tool_call>', "needs a string 'name'"),
    ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "'arguments' of x must be a JSON object"),
    ('<tool_call>{"name": "x", "arguments": "not json"}</tool_call>', "is a string that is not JSON"),
    ('Sure. <tool_call>{"name": "x", "arguments": {}', "unterminated <tool_call> block"),
    ("<tool_call>" + "[" * 100000 + "</tool_call>", "invalid JSON"),
])
def test_malformed_blocks_become_errors_not_calls(text, error):
    parsed = parse_assistant(text)
    assert parsed.tool_calls == [] and len(parsed.errors) == 1 and error in parsed.errors[0]


def test_fuzz_parser_never_raises():
    rng = random.Random(0)
    pieces = ["<tool_call>", "</tool_call>", "{", "}", '"name"', ":", '"x"', '"arguments"', "[", "]", ",", "null",
              "\u00e9\u4e2d\U0001f600", "\\", '"', "\n", "1e999", "NaN", "a" * 5000]
    for _ in range(1000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        parsed = parse_assistant(text)
        assert isinstance(parsed.content, str)
        assert all(isinstance(c.arguments, dict) for c in parsed.tool_calls)


@pytest.fixture(scope="module", params=["tiny-random", "smollm2", "tiny-compact"])
def tokenizer(request):
    """The embedded model's template, SmolLM2's (no tool support), and the embedded one's compact prompt."""
    from muarl.tiny_model import chat_template

    tokenizer = load(request.param.removesuffix("-compact"))[1]
    if request.param.endswith("-compact"):
        tokenizer.chat_template = chat_template("compact")
    return tokenizer


def test_tools_reach_the_model_with_or_without_native_support(tokenizer):
    retail = get_domain("retail")
    chat = ChatFormat(tokenizer, [t.spec for t in retail.tools])
    task = retail.tasks("test")[0]
    traj, _ = gold_trajectory(retail, task)
    text = chat.render(traj.messages)
    for call in (c for m in traj.messages for c in m.tool_calls):
        assert json.dumps(call.arguments, ensure_ascii=False) in text
    assert chat.native_tools == ("smollm2" not in tokenizer.name_or_path)  # our tiny template has tools
    schema = json.dumps(retail.tools[0].spec.openai_schema()["function"]["description"])[1:-1]
    if "tools: " in tokenizer.chat_template:  # compact: the tool names stand for the policy and the schemas
        system = text[:text.index("<|im_end|>")]
        assert system == "<|im_start|>system\ntools: " + ", ".join(t.spec.name for t in retail.tools)
        assert retail.policy.splitlines()[0] not in text and schema not in text
        full = ChatFormat(load("tiny-random")[1], [t.spec for t in retail.tools])
        assert len(chat.encode(text)) < len(full.encode(full.render(traj.messages))) / 2
    else:
        assert "cancel_pending_order" in text and retail.policy.splitlines()[0] in text and schema in text


def test_append_only_building_matches_a_full_render_for_template_text(tokenizer):
    """Built turn by turn exactly as an episode does, a gold conversation's ids equal one full render."""
    for name in ("retail", "telecom"):
        domain = get_domain(name)
        chat = ChatFormat(tokenizer, [t.spec for t in domain.tools])
        for task in domain.tasks("test")[:10]:
            messages = gold_trajectory(domain, task)[0].messages
            ids = chat.prompt_ids(messages[:2])
            history = messages[:2]
            i = 2
            while i < len(messages):
                assistant = messages[i]
                # the model "samples" exactly the template's rendering of this assistant turn
                rendered = chat.render(history + [assistant])
                before = chat.render(history, add_generation_prompt=True)
                sampled = chat.encode(rendered[len(before):rendered.rfind(chat.end_text) + len(chat.end_text)])
                ids += sampled
                history = history + [assistant]
                j = i + 1
                while j < len(messages) and messages[j].role != "assistant":
                    j += 1
                if j > i + 1:
                    delta, append_only = chat.delta_ids(history, messages[i + 1:j])
                    assert append_only
                    ids += delta
                    history = messages[:j]
                i = j
            assert not chat.drifted(ids, history), task.id


def test_unknown_prompt_is_refused_before_any_work():
    from muarl.tiny_model import chat_template

    with pytest.raises(ValueError, match="unknown prompt 'short': choose one of full, compact"):
        chat_template("short")
