"""The policy interface every agent backend implements (HF transformers, OpenAI endpoint, scripted expert).

A policy makes one :class:`PolicySession` per episode, so a backend can keep per-episode state between
turns: a KV cache and the exact token ids so far (HF), or privileged task knowledge (the expert). Each
call to :meth:`PolicySession.next` passes only the messages that are new since the previous call.
"""

from __future__ import annotations

import contextlib
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from muarl.types import Message

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task



def episode_seed(seed: int, task_id: str, which: int | str) -> int:
    """A 64-bit sampling seed for one episode, from the policy's seed, the task and the episode (its seed, or
    the policy's count of sessions): the same episode samples alike in every backend and every rerun."""
    digest = hashlib.sha256(f"{seed}:{task_id}:{which}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass
class AgentTurn:
    """One assistant turn.

    ``message`` is the parsed assistant message (text plus tool calls). Token backends also fill
    ``token_ids`` / ``logprobs`` with exactly what was sampled, ``prompt_ids`` with the tokens appended
    before it (rendered, not sampled), and ``parse_errors`` with each malformed tool call that could not
    become a call (bad JSON, a block without a name ...). ``finish`` is "stop" (end of turn),
    "length" (per-turn token limit) or "context" (context window full).
    """

    message: Message
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    finish: str = "stop"
    metadata: dict[str, Any] = field(default_factory=dict)


class PolicySession(ABC):
    """One episode's agent."""

    @abstractmethod
    async def next(self, new_messages: list[Message]) -> AgentTurn:
        """The agent's next turn, given the messages added since the last call (the first call gets the
        system prompt and the user's opening message)."""

    def close(self) -> dict[str, Any]:
        """Release per-episode resources (a KV cache). Called once when the episode ends; what it returns
        goes into the trajectory's metadata (e.g. the token backend's drift check)."""
        return {}


class Policy(ABC):
    """A factory of per-episode sessions."""

    name: str = "policy"

    @abstractmethod
    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        """A fresh session for one episode of ``task`` in ``domain``. Only the expert may read the task.

        ``seed`` fixes the session's sampling: the episode engine derives it from (run seed, task, group
        member), so a resumed run samples its remaining episodes exactly as an uninterrupted one would.
        """

    def provenance(self) -> dict[str, Any]:
        """What this policy is, for the record in every results file (:mod:`muarl.provenance`): its name,
        and in a model backend the model it runs, so that two results can be told apart by it."""
        return {"name": self.name}

    @contextlib.contextmanager
    def swapping_weights(self) -> Iterator[None]:
        """Held while the weights this policy samples from change under it (asynchronous GRPO swaps them
        while episodes are in flight): no forward pass runs meanwhile, and what was computed from the old
        weights is dropped before the next. A policy whose weights move only through its own sync calls
        (an engine or server that holds its own) has nothing to hold or drop."""
        yield
