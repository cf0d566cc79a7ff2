"""The user-simulator interface every user (scripted, LLM, replay, a person) implements.

A simulator makes one :class:`UserSession` per episode. The session sees only what a real customer
would: the agent's words, never its tool calls or their results. In dual-control domains it acts on its
own device through ``act``, a callable that runs one *user* tool in the episode's env and returns what
the user sees; those calls land in the env's log next to the agent's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from muarl.types import Task

if TYPE_CHECKING:
    from muarl.domain import Domain

#: Runs one user tool: (tool name, arguments) -> the text the user sees.
Act = Callable[[str, dict[str, Any]], Awaitable[str]]

StopSignal = Literal["stop", "transfer", "out_of_scope"]

#: The marker a user writes to end the conversation (tau-bench's): scripted, replayed and human users end
#: with it, an LLM user is told to write it, and :func:`muarl.users.llm.parse_stop` reads it back. One
#: constant, so every user and bridge ends a conversation the same way.
STOP = "###STOP###"


class SimulatorFault(RuntimeError):
    """The simulator could not produce a turn (API down, timeouts after retries, a malformed reply).

    The episode ends with ``sim_fault=True`` so the trajectory can be kept out of the gradient instead
    of being rewarded 0 for something the agent did not do.
    """


@dataclass
class UserReply:
    """One user turn. ``stop`` is set when the user ends the conversation (###STOP### and friends)."""

    text: str
    stop: StopSignal | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class UserSession(ABC):
    """One episode's user."""

    @abstractmethod
    async def start(self) -> UserReply:
        """The user's opening message."""

    @abstractmethod
    async def reply(self, agent_text: str, act: Act) -> UserReply:
        """Answer what the agent just said to the user, acting on the device first if asked to."""


class UserSimulator(ABC):
    """A factory of user sessions; ``seed`` makes a session reproducible (the same seed, the same user)."""

    name: str = "user"

    @abstractmethod
    def session(self, task: Task, seed: int) -> UserSession:
        """A fresh session playing ``task``."""

    def provenance(self) -> dict[str, Any]:
        """What this simulator is, for the record in every results file (:mod:`muarl.provenance`): its name,
        and for an LLM-played user the model that plays it (a result depends on who the user was)."""
        return {"name": self.name}

    def for_domain(self, domain: Domain) -> UserSimulator:
        """This simulator bound to the domain an episode runs in (the episode loop calls it before
        :meth:`session`), so that it can play that domain's way (its ``user_script``, its stand-in user)
        without looking the domain up by name. The default ignores the domain and returns ``self``."""
        return self
