"""Chat format, token in / token out: render conversations, parse tool calls, build tokens append-only.

The policy is trained on exactly the token ids it sampled. Everything else in the conversation (system,
user, tool messages) is appended by rendering only the new messages with the tokenizer's chat template
and tokenizing that suffix; the conversation is never re-rendered and re-tokenized, because a model's
sampled text often re-tokenizes differently (TRL and verl both document the "tokenization drift" this
causes). :meth:`ChatFormat.drifted` measures how often a full re-render would have disagreed.

New messages are rendered after a stub of the history that keeps only its last message (the assistant
turn just sampled), and the text after that turn's end-of-turn token is what gets appended. Templates that
render a turn differently once it is no longer the last (Qwen3 writes an empty think block into the last
assistant turn only) therefore never re-append a turn: the stream holds each message exactly once.

Thinking: Qwen3-style templates take ``enable_thinking``; muarl passes False unless asked (the paper trained
and evaluated non-thinking), so the generation prompt holds the empty think block. With thinking on
(``muarl --thinking ...`` or ``MUARL_THINKING=1``) the model writes ``<think>...</think>`` itself: that
reasoning is trained on as sampled but kept out of the message the user and the tools see.

Templates with tool support (Qwen, Hermes, muarl's embedded model) get the tools through the template.
For templates without (SmolLM2), the tool schemas and the ``<tool_call>`` protocol go into the system
prompt, assistant tool calls are written into the assistant text and tool results become user turns
wrapped in ``<tool_response>``, so every model speaks the same protocol.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from muarl.types import Message, ToolCall, ToolSpec

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
#: the environment variable that turns thinking mode on for every chat format of a process and its children
THINKING_ENV = "MUARL_THINKING"


def thinking_default() -> bool:
    """Whether chat formats render in thinking mode by default: ``MUARL_THINKING=1`` (set by ``muarl
    --thinking``), else off, the paper's setting."""
    value = os.environ.get(THINKING_ENV, "0").strip().lower()
    if value not in ("0", "1", "true", "false", ""):
        raise ValueError(f"{THINKING_ENV}={value!r}: expected 1 or 0")
    return value in ("1", "true")


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, rest) of model text that opens with a ``<think>...</think>`` block (Qwen3, DeepSeek-R1);
    ("", text) when there is none. A think block left open is all reasoning: nothing in it is said or
    called."""
    head = text.lstrip()
    if head.startswith("<think>"):
        body = head[len("<think>"):]
        if "</think>" not in body:
            return body.strip(), ""
        reasoning, rest = body.split("</think>", 1)
        return reasoning.strip(), rest.lstrip("\n")
    if "</think>" in text:  # the template wrote <think> into the prompt
        reasoning, rest = text.split("</think>", 1)
        return reasoning.strip(), rest.lstrip("\n")
    return "", text

TOOLS_PROMPT = """

# Tools

You may call one or more functions. Their signatures are inside <tools></tools>:
<tools>
{tools}
</tools>

To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass
class ParsedTurn:
    """An assistant message parsed from model text; ``errors`` lists each block that is not a call."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str = ""


def parse_assistant(text: str, call_prefix: str = "call") -> ParsedTurn:
    """Split model output into text and tool calls. Never raises: bad blocks become ``errors``.

    Accepted per block: a JSON object with a string ``name`` and ``arguments`` as an object (or a
    string holding a JSON object, as some models write); a missing ``arguments`` means no arguments.
    A leading ``<think>`` block is reasoning (:func:`split_reasoning`): a call written inside it is not made.
    """
    reasoning, text = split_reasoning(text)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, match in enumerate(_BLOCK.finditer(text)):
        raw = match.group(1).strip()
        call, problem = _parse_call(raw)
        if call is None:
            errors.append(problem)
        else:
            calls.append(ToolCall(id=f"{call_prefix}_{i}", name=call[0], arguments=call[1]))
    content = _BLOCK.sub("", text)
    if "<tool_call>" in content:
        tail = content[content.index("<tool_call>"):]
        errors.append(f"unterminated <tool_call> block: {_snippet(tail)}")
        content = content[: content.index("<tool_call>")]
    return ParsedTurn(content=content.strip(), tool_calls=calls, errors=errors, reasoning=reasoning)


def _parse_call(raw: str) -> tuple[tuple[str, dict[str, Any]] | None, str]:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as err:
        msg = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deeply"
        return None, f"invalid JSON ({msg}): {_snippet(raw)}"
    if not isinstance(obj, dict):
        return None, f"a tool call must be a JSON object with name and arguments, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f"a tool call needs a string 'name': {_snippet(raw)}"
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None, f"'arguments' of {name} is a string that is not JSON: {_snippet(args)}"
    if not isinstance(args, dict):
        return None, f"'arguments' of {name} must be a JSON object, got {type(args).__name__}"
    return (name, args), ""


def _snippet(text: str, limit: int = 120) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


class ChatFormat:
    """One tokenizer's view of muarl conversations: rendering, token deltas, parsing, drift."""

    def __init__(self, tokenizer: Any, tools: list[ToolSpec], thinking: bool | None = None):
        self.tokenizer = tokenizer
        #: passed to the template as ``enable_thinking`` (templates without it ignore it)
        self.thinking = thinking_default() if thinking is None else thinking
        self.tools = [t.openai_schema() for t in tools]
        vocab = tokenizer.get_vocab()
        self.end_text = "<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token
        if self.end_text is None:
            raise ValueError("the tokenizer has neither <|im_end|> nor an eos token to end a turn with")
        self.stop_ids = {tokenizer.convert_tokens_to_ids(self.end_text)}
        if tokenizer.eos_token_id is not None:
            self.stop_ids.add(tokenizer.eos_token_id)
        self.native_tools = self._template_has_tools()
        self._system_cache: dict[str, tuple[str, list[int]]] = {}

    def _template_has_tools(self) -> bool:
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        tool = {"type": "function", "function": {"name": "zz_probe_tool", "description": "d", "parameters": {}}}
        return "zz_probe_tool" in self.tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False,
                                                                     enable_thinking=self.thinking)

    # -- rendering ----------------------------------------------------------------------------------
    def template_messages(self, messages: list[Message], tools: bool = True) -> list[dict[str, Any]]:
        """Messages in the shape the tokenizer's template expects."""
        out: list[dict[str, Any]] = []
        for m in messages:
            if self.native_tools:
                entry: dict[str, Any] = {"role": m.role, "content": m.content}
                if m.tool_calls:
                    entry["tool_calls"] = [{"id": c.id, "type": "function",
                                            "function": {"name": c.name, "arguments": c.arguments}}
                                           for c in m.tool_calls]
                if m.role == "tool":
                    entry["tool_call_id"] = m.tool_call_id or ""
                out.append(entry)
            elif m.role == "system" and not out and self.tools and tools:
                tools = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools)
                out.append({"role": "system", "content": m.content + TOOLS_PROMPT.format(tools=tools)})
            elif m.role == "assistant" and m.tool_calls:
                blocks = [json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
                          for c in m.tool_calls]
                text = "\n".join([m.content] if m.content else [])
                calls = "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in blocks)
                out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
            elif m.role == "tool":
                out.append({"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"})
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    def render(self, messages: list[Message], add_generation_prompt: bool = False, tools: bool = True) -> str:
        kwargs: dict[str, Any] = {"tools": self.tools} if tools and self.native_tools and self.tools else {}
        return self.tokenizer.apply_chat_template(self.template_messages(messages, tools), tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  enable_thinking=self.thinking, **kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _system(self, messages: list[Message]) -> tuple[str, list[int]] | None:
        """The rendered system turn and its tokens (cached: every episode of a domain shares them)."""
        if not messages or messages[0].role != "system":
            return None
        key = messages[0].content
        if key not in self._system_cache:
            text = self.render(messages[:1])
            self._system_cache[key] = (text, self.encode(text))
        return self._system_cache[key]

    def _encode_after_system(self, messages: list[Message], text: str) -> list[int]:
        """Tokens of a full render ``text``, reusing the cached system-turn tokens. The system turn ends in
        an end-of-turn special token, so tokenization cannot merge across that boundary."""
        system = self._system(messages)
        if system is None or not text.startswith(system[0]):
            return self.encode(text)
        return system[1] + self.encode(text[len(system[0]):])

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Tokens of the opening prompt (system + first user message + generation prompt)."""
        return self._encode_after_system(messages, self.render(messages, add_generation_prompt=True))

    def shared_prefix_len(self, messages: list[Message], prompt: list[int]) -> int:
        """How many leading tokens of an opening ``prompt`` are the system turn alone (0 if it is not a
        clean token prefix). Every episode of a domain shares them, so a backend can compute them once."""
        system = self._system(messages)
        if system is None:
            return 0
        return len(system[1]) if prompt[: len(system[1])] == system[1] else 0

    def delta_ids(self, history: list[Message], new: list[Message]) -> tuple[list[int], bool]:
        """Tokens to append after the last sampled end-of-turn token for the ``new`` messages.

        The new messages are rendered after a stub of the history (a one-character system turn where there
        is one, a one-character user turn, then the history's last message as it is) and cut after the
        stub's own end-of-turn tokens: what is appended is the template's rendering of the new messages
        alone, whatever the template does to earlier turns once later ones exist. Returns (ids,
        append_only): ``append_only`` is False when the template re-rendered the stub's last turn
        differently once the new messages followed it (Qwen3 does, for the empty think block of the last
        assistant turn): the tokens are right either way; the flag says a full re-render would differ.
        The system turn is rendered without tools: the tool schemas are most of the rendering work.
        """
        if not history:
            raise ValueError("delta_ids needs the history the new messages follow; use prompt_ids to open")
        stub = [Message(role="system", content="-")] if history[0].role == "system" else []
        if history[-1].role != "user":
            stub.append(Message(role="user", content="-"))
        stub.append(history[-1])
        before = self.render(stub, tools=False)
        after = self.render(stub + new, add_generation_prompt=True, tools=False)
        ends = before.count(self.end_text)
        if ends == 0:
            raise ValueError(f"the chat template renders no {self.end_text} after a turn; muarl cannot append to it")
        cut = -len(self.end_text)
        for _ in range(ends):
            cut = after.find(self.end_text, cut + len(self.end_text))
            if cut < 0:
                raise ValueError(f"the chat template drops an earlier turn's {self.end_text} once new messages "
                                 "follow it; muarl cannot append to it")
        return self.encode(after[cut + len(self.end_text):]), after.startswith(before)

    def drifted(self, token_ids: list[int], messages: list[Message]) -> bool:
        """Whether a full re-render of ``messages`` tokenizes differently from the ids actually used."""
        open_turn = bool(messages) and messages[-1].role != "assistant"
        full = self._encode_after_system(messages, self.render(messages, add_generation_prompt=open_turn))
        return full[: len(token_ids)] != token_ids

    # -- parsing ------------------------------------------------------------------------------------
    def decode(self, ids: list[int]) -> str:
        """Sampled ids as text, keeping special tokens such as <tool_call> but not the end-of-turn token."""
        ids = [i for i in ids if i not in self.stop_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def parse(self, ids: list[int], call_prefix: str = "call") -> ParsedTurn:
        """The message sampled ``ids`` say (reasoning split off: :func:`parse_assistant`)."""
        return parse_assistant(self.decode(ids), call_prefix)
