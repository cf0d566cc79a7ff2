"""OpenAIPolicy: the agent is a model behind an OpenAI-compatible endpoint (vLLM, OpenAI, ``muarl.serve``).

Used for evaluation and as a baseline or data-synthesis agent; it returns no token ids, so it is not a
training backend. The session keeps the conversation in the endpoint's own format: the assistant turns are
stored as the endpoint returned them (malformed tool calls included), so every error message the episode
loop sends back can be attached to the call that caused it.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import TYPE_CHECKING, Any

from muarl.endpoint import ChatEndpoint
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.types import Message, ToolCall

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task


def parse_arguments(raw: str | None) -> dict[str, Any]:
    """A tool call's JSON arguments as a dict; ``ValueError`` says why they are not one."""
    if raw is None or not raw.strip():
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


class OpenAIPolicy(Policy):
    """A factory of sessions against one endpoint; the domain's agent tools are offered as function tools."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        temperature: float = 0.0,
        max_tokens: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 1.0,
        seed: int | None = None,
    ):
        self.endpoint = ChatEndpoint(base_url, model, api_key=api_key, timeout=timeout,
                                     max_retries=max_retries, backoff=backoff)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self._sessions = itertools.count()

    def provenance(self) -> dict[str, Any]:
        """The served model's name and the endpoint: what an API policy's results depend on."""
        return {"name": self.name, "model": self.endpoint.model, "base_url": self.endpoint.base_url}

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> OpenAIPolicySession:
        tools = [t.spec.openai_schema() for t in domain.tools]
        rng_seed = (self.seed or 0) * 1_000_003 + (next(self._sessions) if seed is None else seed)
        return OpenAIPolicySession(self, tools, random.Random(rng_seed))


class OpenAIPolicySession(PolicySession):
    """One episode. ``history`` is exactly what the endpoint is sent next time, minus the new messages."""

    def __init__(self, policy: OpenAIPolicy, tools: list[dict[str, Any]], rng: random.Random):
        self.policy = policy
        self.tools = tools
        self.rng = rng
        self.history: list[dict[str, Any]] = []
        self._malformed_ids: list[str] = []
        self._ids = itertools.count()

    def _to_openai(self, msg: Message) -> dict[str, Any]:
        if msg.role == "tool":
            call_id = msg.tool_call_id
            if call_id is None and self._malformed_ids:  # the loop's "malformed tool call" errors, in order
                call_id = self._malformed_ids.pop(0)
            if call_id is None:  # nothing to attach it to: the API would reject a dangling tool message
                return {"role": "user", "content": msg.content}
            return {"role": "tool", "tool_call_id": call_id, "content": msg.content}
        if msg.role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                out["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for c in msg.tool_calls]
            return out
        return {"role": msg.role, "content": msg.content}

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.history.extend(self._to_openai(m) for m in new_messages)
        self._malformed_ids = []
        params: dict[str, Any] = {"messages": self.history, "temperature": self.policy.temperature}
        if self.tools:
            params["tools"] = self.tools
        if self.policy.max_tokens is not None:
            params["max_tokens"] = self.policy.max_tokens
        if self.policy.seed is not None:
            params["seed"] = self.policy.seed
        done = await self.policy.endpoint.complete(self.rng, **params)  # EndpointError names the endpoint
        text = getattr(done.message, "content", None) or ""
        calls: list[ToolCall] = []
        errors: list[str] = []
        raw_calls: list[dict[str, Any]] = []
        for call in getattr(done.message, "tool_calls", None) or []:
            function = getattr(call, "function", None)
            name = getattr(function, "name", None) or ""
            raw = getattr(function, "arguments", None)
            call_id = getattr(call, "id", None) or f"call_{next(self._ids)}"
            raw_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": raw or ""}})
            if not name:
                errors.append(f"tool call without a function name (arguments {raw!r})")
                self._malformed_ids.append(call_id)
                continue
            try:
                calls.append(ToolCall(id=call_id, name=name, arguments=parse_arguments(raw)))
            except ValueError as err:
                errors.append(f"arguments of {name} are not valid JSON ({err}): {raw!r}"[:500])
                self._malformed_ids.append(call_id)
        entry: dict[str, Any] = {"role": "assistant", "content": text}
        if raw_calls:
            entry["tool_calls"] = raw_calls
        self.history.append(entry)
        finish = "length" if done.finish_reason == "length" else "stop"
        meta = {"retries": done.retries, "usage": done.usage, "finish_reason": done.finish_reason}
        return AgentTurn(message=Message(role="assistant", content=text, tool_calls=calls), parse_errors=errors,
                         finish=finish, metadata=meta)
