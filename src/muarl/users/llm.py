"""LLMUser: a customer played by an LLM behind any OpenAI-compatible endpoint (vLLM, OpenAI, ``muarl.serve``).

The simulator is prompted the tau-bench way: it plays the task's instruction, reveals facts one at a time,
never invents any, and ends the conversation with a marker (###STOP###, ###TRANSFER###,
###OUT-OF-SCOPE###) that becomes :attr:`UserReply.stop`. Roles are flipped for it: the agent's words are
its ``user`` messages and its own lines are ``assistant`` messages. It sees the agent's text only, never
the agent's tool calls or their results, exactly as a real customer would. In dual-control domains it may
call its own device tools (offered as function tools) before it answers; those run through ``act`` in the
episode's env, so they change the state the reward is computed on.

Endpoint trouble that outlasts the retries becomes :class:`SimulatorFault`, so the episode is marked
``sim_fault`` and kept out of the gradient instead of being scored 0 for the agent.
"""

from __future__ import annotations

import json
import random
from typing import Any

from muarl.endpoint import ChatEndpoint, EndpointError
from muarl.types import Task, ToolSpec
from muarl.users.base import STOP, Act, SimulatorFault, StopSignal, UserReply, UserSession, UserSimulator

#: marker -> the stop signal it raises; checked in this order
STOP_MARKERS: dict[str, StopSignal] = {
    STOP: "stop",
    "###TRANSFER###": "transfer",
    "###OUT-OF-SCOPE###": "out_of_scope",
}

#: seconds one HTTP request to the user's endpoint may take before it is retried (``--user-http-timeout``)
HTTP_TIMEOUT_S = 60.0

#: what the simulator is told the agent said first: the episode opens with the user, as in tau-bench
AGENT_GREETING = "Hi! How can I help you today?"

SYSTEM_PROMPT = """You are a customer talking to a customer-service agent. You are the customer, not the \
agent: never offer help or act as support staff.

Your situation and goal:
{instruction}

How to behave:
- Write one short message at a time, the way a real customer types in a chat window.
- Reveal information gradually, one piece at a time, and only when it is relevant or the agent asks \
for it. Do not give everything away in your first message.
- Never make up facts that are not in your situation above (no invented ids, numbers, addresses, names or \
preferences). If the agent asks for something you were not given, say that you do not know or do not have it.
- Stay in character for the whole conversation.
- Do not copy your situation text word for word; say it in your own words.
{tools_rule}
Ending the conversation:
- When your goal is achieved, or it is clear it cannot be achieved, reply with {stop} on its own.
- If you are transferred to a human agent, reply with ###TRANSFER###.
- If the conversation moves to something your situation does not cover, reply with ###OUT-OF-SCOPE###.
"""

TOOLS_RULE = """- You can act on your own device with the tools you are given. Use them only when the \
agent asks you to do something on your device, one step at a time, then tell the agent in words what \
you saw. The agent cannot see your screen.
"""


def opening_messages(task: Task, tools: bool = False) -> list[dict[str, Any]]:
    """What an LLM user is sent before its first line: its system prompt with the task's instruction (and the
    device-tools rule when it has user tools), then the agent's greeting. Shared by the user itself, its
    training data (:mod:`muarl.users.user_side`) and the scripts that probe a user model."""
    prompt = SYSTEM_PROMPT.format(instruction=task.instruction.strip(), stop=STOP, tools_rule=TOOLS_RULE if tools else "")
    return [{"role": "system", "content": prompt}, {"role": "user", "content": AGENT_GREETING}]


def parse_stop(text: str) -> tuple[str, StopSignal | None]:
    """(text without markers, stop signal). A reply that is nothing but a marker keeps its text as is, so
    the agent's transcript never contains an empty user turn."""
    found = [(text.find(m), sig) for m, sig in STOP_MARKERS.items() if m in text]
    if not found:
        return text, None
    stop = min(found)[1]
    cleaned = text
    for marker in STOP_MARKERS:
        cleaned = cleaned.replace(marker, "")
    cleaned = cleaned.strip()
    return (cleaned or text.strip()), stop


class LLMUser(UserSimulator):
    """A factory of LLM-played customers over one OpenAI-compatible endpoint.

    ``tools`` overrides the user tools offered in dual-control domains (default: the task's domain's
    ``user_tools``; pass ``[]`` to offer none). ``max_tool_rounds`` bounds the act-then-observe loop of a
    single turn so a model that never stops calling tools cannot hang an episode.
    """

    name = "llm"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        temperature: float = 0.0,
        timeout: float = HTTP_TIMEOUT_S,
        max_retries: int = 4,
        backoff: float = 1.0,
        max_tokens: int | None = None,
        tools: list[ToolSpec] | None = None,
        max_tool_rounds: int = 8,
    ):
        self.endpoint = ChatEndpoint(base_url, model, api_key=api_key, timeout=timeout,
                                     max_retries=max_retries, backoff=backoff)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.tools = tools
        self.max_tool_rounds = max_tool_rounds

    def provenance(self) -> dict[str, Any]:
        """The model that plays the user and its endpoint: an LLM user's behaviour is that model's."""
        return {"name": self.name, "model": self.endpoint.model, "base_url": self.endpoint.base_url}

    def tool_specs(self, task: Task) -> list[ToolSpec]:
        """The user tools this task's customer may use (looked up from the task's domain)."""
        if self.tools is not None:
            return list(self.tools)
        from muarl.domain import get_domain

        return [t.spec for t in get_domain(task.domain).user_tools]

    def session(self, task: Task, seed: int) -> LLMUserSession:
        return LLMUserSession(self, task, seed)


class LLMUserSession(UserSession):
    """One customer. ``history`` is the simulator's own view: its system prompt, the agent's words as
    ``user`` messages, its own replies (and its own tool calls/results) as ``assistant``/``tool``."""

    def __init__(self, user: LLMUser, task: Task, seed: int):
        self.user = user
        self.task = task
        self.seed = seed
        self.rng = random.Random(seed)
        self.tools = user.tool_specs(task)
        self.history: list[dict[str, Any]] = opening_messages(task, bool(self.tools))

    async def start(self) -> UserReply:
        # No ``act`` exists before the agent has spoken, so the opening line is offered no tools.
        return await self._turn(act=None)

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        self.history.append({"role": "user", "content": agent_text})
        return await self._turn(act)

    async def _turn(self, act: Act | None) -> UserReply:
        params: dict[str, Any] = {"temperature": self.user.temperature, "seed": self.seed}
        if self.user.max_tokens is not None:
            params["max_tokens"] = self.user.max_tokens
        if act is not None and self.tools:
            params["tools"] = [spec.openai_schema() for spec in self.tools]
        retries, tool_calls, spoken = 0, 0, 0
        for _ in range(self.user.max_tool_rounds + 1):
            try:
                done = await self.user.endpoint.complete(self.rng, messages=self.history, **params)
            except EndpointError as err:
                raise SimulatorFault(f"LLM user: {err}") from err
            retries += done.retries
            spoken += int((done.usage or {}).get("completion_tokens", 0) or 0)  # tokens/s in muarl.time_split
            message = done.message
            calls = list(getattr(message, "tool_calls", None) or [])
            text = (getattr(message, "content", None) or "").strip()
            if calls and act is not None:
                tool_calls += len(calls)
                await self._run_tools(message, calls, act)
                continue
            if not text:
                raise SimulatorFault(f"LLM user: endpoint {self.user.endpoint.base_url} returned an empty reply "
                                     f"(finish_reason={done.finish_reason!r})")
            self.history.append({"role": "assistant", "content": text})
            shown, stop = parse_stop(text)
            meta = {"retries": retries, "tool_calls": tool_calls, "completion_tokens": spoken,
                    "finish_reason": done.finish_reason, "usage": done.usage}
            return UserReply(shown, stop=stop, metadata=meta)
        raise SimulatorFault(f"LLM user: endpoint {self.user.endpoint.base_url} kept calling tools for "
                             f"{self.user.max_tool_rounds} rounds without answering the agent")

    async def _run_tools(self, message: Any, calls: list[Any], act: Act) -> None:
        """Run the simulator's device tool calls in order and feed each result back as a tool message."""
        ids = [c.id or f"user_call_{len(self.history)}_{i}" for i, c in enumerate(calls)]
        self.history.append({
            "role": "assistant",
            "content": getattr(message, "content", None) or "",
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments or ""}}
                           for i, c in zip(ids, calls, strict=True)],
        })
        for call_id, call in zip(ids, calls, strict=True):
            raw = call.function.arguments or "{}"
            try:
                arguments = json.loads(raw)
                if not isinstance(arguments, dict):
                    raise ValueError(f"expected a JSON object, got {type(arguments).__name__}")
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                result = f"Error: the arguments of {call.function.name} are not valid JSON ({err}); nothing was done."
            else:
                result = await act(call.function.name, arguments)
            self.history.append({"role": "tool", "tool_call_id": call_id, "content": result})
