"""Chat format, token in / token out: render conversations, parse tool calls, build tokens append-only.

The policy is trained on exactly the token ids it sampled. Everything else in the conversation (system,
user, tool messages) is appended by rendering only the new messages with the tokenizer's chat template
and tokenizing that suffix; the conversation is never re-rendered and re-tokenized, because a model's
sampled text often re-tokenizes differently (TRL and verl both document the "tokenization drift" this
causes). :meth:`ChatFormat.drifted` measures how often a full re-render would have disagreed.

Templates with tool support (Qwen, Hermes, muarl's embedded model) get the tools through the template.
For templates without (SmolLM2), the tool schemas and the ``<tool_call>`` protocol go into the system
prompt, assistant tool calls are written into the assistant text and tool results become user turns
wrapped in ``<tool_response>``, so every model speaks the same protocol.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from muarl.types import Message, ToolCall, ToolSpec

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

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


def parse_assistant(text: str, call_prefix: str = "call") -> ParsedTurn:
    """Split model output into text and tool calls. Never raises: bad blocks become ``errors``.

    Accepted per block: a JSON object with a string ``name`` and ``arguments`` as an object (or a
    string holding a JSON object, as some models write); a missing ``arguments`` means no arguments.
    """
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
    return ParsedTurn(content=content.strip(), tool_calls=calls, errors=errors)


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

    def __init__(self, tokenizer: Any, tools: list[ToolSpec]):
        self.tokenizer = tokenizer
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
        return "zz_probe_tool" in self.tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False)

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
                                                  add_generation_prompt=add_generation_prompt, **kwargs)

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

        Returns (ids, append_only): ``append_only`` is False when the template re-rendered earlier
        turns differently once new ones were added (then only the differing suffix is appended and the
        turn counts as drift). The system turn is rendered as a stub without tools here: it is the same
        on both sides, and the tool schemas are most of the rendering work.
        """
        if history and history[0].role == "system":
            history = [Message(role="system", content="-")] + history[1:]
        before = self.render(history, tools=False)
        after = self.render(history + new, add_generation_prompt=True, tools=False)
        append_only = after.startswith(before)
        if not append_only:
            common = 0
            for a, b in zip(before, after, strict=False):
                if a != b:
                    break
                common += 1
            before = before[:common]
        cut = before.rfind(self.end_text)
        glue = before[cut + len(self.end_text):] if cut >= 0 else ""
        return self.encode(glue + after[len(before):]), append_only

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
        return parse_assistant(self.decode(ids), call_prefix)
