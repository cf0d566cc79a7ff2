"""The do-nothing baseline: an agent that never calls a tool and says it cannot help.

Why it exists: tasks that need no write (questions, out-of-policy requests the agent must refuse) are
graded on the final database, which a do-nothing agent leaves exactly as gold does. A results table is
only honest next to this floor (``muarl eval --policy noop``): success above it is what the agent did.
It says no required output, so it wins only tasks whose whole grade is "change nothing".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.types import Message

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task

CANNOT_HELP = "I'm sorry, but I can't help with this request."
GOODBYE = "I'm unable to do anything further for you. Goodbye."


class NoopSession(PolicySession):
    """Says it cannot help, then only says goodbye, until the user ends the conversation (or the turn
    limit does): the agent has no way to end an episode but a terminal tool, which it never calls."""

    def __init__(self) -> None:
        self.turns = 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.turns += 1
        return AgentTurn(message=Message(role="assistant", content=CANNOT_HELP if self.turns == 1 else GOODBYE))


class NoopPolicy(Policy):
    """A factory of :class:`NoopSession`; reads nothing of the task."""

    name = "noop"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> NoopSession:
        return NoopSession()
