"""What a user script sees of the scripted user's conversation: the user's goals, and the session's state
and replies that a :class:`~muarl.users.script.UserScript` reads and answers through.

The conversation engine (:class:`~muarl.users.scripted.ScriptedSession`) drives the script and hands it
itself. The contract lives here, beside :class:`Goal`, so that the script depends on the contract and not
on the engine that implements it (the engine imports the script).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from muarl.types import Intent, Scenario
from muarl.users.base import Act, UserReply

if TYPE_CHECKING:
    from muarl.domain import Domain


@dataclass
class Goal:
    """One intent and how far the conversation has got with it."""

    intent: Intent
    status: str = "pending"  # pending | confirmed | done
    changed_mind: bool = False
    insisted: int = 0
    reopened: int = 0  # times a proposal made again after the user's yes put it back to pending
    performed: list[str] = field(default_factory=list)

    @property
    def wanted(self) -> dict[str, Any]:
        """The args the user currently asks for: ``first_args`` until it has changed its mind."""
        if self.intent.first_args is not None and not self.changed_mind:
            return dict(self.intent.first_args)
        return dict(self.intent.args)

    @property
    def steps_done(self) -> bool:
        names = [a.name for a in self.intent.user_actions]
        return all(n in self.performed for n in names)


class ScriptSession(Protocol):
    """The scripted user's session as its script sees it (what :class:`~muarl.users.scripted.ScriptedSession`
    offers a script)."""

    scenario: Scenario
    #: the domain the episode runs in (None for a task whose domain is not registered)
    domain: Domain | None
    #: facts the user knows and may say, and the keys it says only when asked
    known: dict[str, Any]
    withheld: set[str]
    goals: list[Goal]
    #: the episode's random generator (paraphrases, the order facts are revealed in)
    rng: random.Random
    #: turns in a row that got the user nowhere (a reply that moves on resets it)
    stale: int
    #: free room for a script's own per-episode state (say, a device test's outcome)
    notes: dict[str, Any]

    @property
    def current(self) -> Goal | None:
        """The first goal not done yet."""

    def going_nowhere(self, text: str) -> UserReply:
        """A reply to a turn that got the user nowhere; too many in a row and the user gives up."""

    def stop(self, text: str) -> UserReply:
        """The user's last words."""

    def after_done(self, lead: str) -> UserReply:
        """``lead``, then the next request, or the end when nothing is left."""

    async def do(self, act: Act, name: str, args: dict[str, Any]) -> str:
        """Run one device (user) tool."""

    def settle_steps(self) -> bool:
        """Mark done the goals whose device steps are all performed; whether any was."""
