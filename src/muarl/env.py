"""Env: one rollout's world. A private copy-on-write database, the tools that act on it, and a call log.

The agent's tools and the user's tools (dual-control domains) execute against the same view, so a fix
the user makes on their phone is visible to the agent's next lookup, and both end up in the final state
the reward compares. Every call, good or bad, lands in :attr:`Env.log`; nothing the agent sends can
raise out of :meth:`Env.call`.
"""

from __future__ import annotations

import itertools
import logging
import traceback
from typing import TYPE_CHECKING, Any

from muarl.db import DBView, diff
from muarl.types import Action, Actor, Task, ToolRecord

if TYPE_CHECKING:
    from muarl.domain import Domain

log = logging.getLogger(__name__)

#: how the hash of a state that could not be read begins (it then equals no other hash)
UNAVAILABLE = "unavailable: "


class Env:
    """A rollout's environment. Create one per episode with :meth:`Domain.env`."""

    def __init__(self, domain: Domain, task: Task | None = None, context: dict[str, Any] | None = None):
        self.domain = domain
        self.task = task
        ctx = dict(task.context) if task is not None else {}
        ctx.update(context or {})
        self.db: DBView = domain.database().view(ctx)
        self.log: list[ToolRecord] = []
        #: call id -> traceback of each call whose tool raised (an "internal" error): the episode loop
        #: records it with the episode's tool fault
        self.tracebacks: dict[str, str] = {}
        self._ids = itertools.count()

    def call(
        self, name: str, arguments: Any = None, *, actor: Actor = "agent", call_id: str | None = None
    ) -> ToolRecord:
        """Execute one tool call and return its log record; ``record.output`` is what the caller sees.

        A failing write leaves no partial change behind: the view is rolled back to before the call.
        """
        call_id = call_id or f"call_{next(self._ids)}"
        tools = self.domain.agent_tools if actor == "agent" else self.domain.user_tool_map
        args = arguments if arguments is not None else {}
        record = ToolRecord(
            call_id=call_id,
            name=name,
            arguments=args if isinstance(args, dict) else {"_raw": repr(args)[:500]},
            actor=actor,
            authenticated=self.db.authenticated,
        )
        tool = tools.get(name)
        if tool is None:
            other = self.domain.user_tool_map if actor == "agent" else self.domain.agent_tools
            hint = f" ({name} is a tool of the {'user' if actor == 'agent' else 'agent'})" if name in other else ""
            record.kind, record.ok, record.error = "unknown", False, "unknown_tool"
            record.output = f"Error: unknown tool '{name}'{hint}. Available tools: {', '.join(sorted(tools))}"
            self.log.append(record)
            return record
        record.kind, record.terminal = tool.spec.kind, tool.terminal
        authenticated = self.db.authenticated
        self.db.begin()
        try:
            outcome = tool.run(self.db, args)
        except Exception as err:  # a bug in a tool must not crash an episode; it is logged loudly
            self.tracebacks[call_id] = traceback.format_exc()
            log.warning("tool %s raised %s\n%s", name, err, self.tracebacks[call_id])
            self.db.rollback()
            self.db.authenticated = authenticated
            record.ok, record.error = False, "internal"
            record.output = f"Error: tool {name} failed internally: {type(err).__name__}: {err}"
            self.log.append(record)
            return record
        if not outcome.ok:  # a failed call changes nothing, not even who is authenticated
            self.db.rollback()
            self.db.authenticated = authenticated
        else:
            record.changed = self.db.commit()
            owners = {self.domain.owner_of(t, self.db[t][k]) for t, k in record.changed if k in self.db[t]}
            record.owners = sorted(o for o in owners if o)
        record.ok, record.output, record.error = outcome.ok, outcome.output, outcome.error
        self.log.append(record)
        return record

    async def acall(
        self, name: str, arguments: Any = None, *, actor: Actor = "agent", call_id: str | None = None
    ) -> ToolRecord:
        """:meth:`call` for an async caller. Local tools run inline; an env whose tools do I/O (an MCP
        server's) overrides this so that a slow or hung tool never stalls the other episodes. (The
        episode loop runs an env that does not override this in a thread, under its tool time limit: see
        :func:`muarl.rollout.call_tool`.)"""
        return self.call(name, arguments, actor=actor, call_id=call_id)

    def run(self, action: Action) -> ToolRecord:
        return self.call(action.name, action.arguments, actor=action.actor)

    #: why this env's final state could not be read because its tool server failed (it died or stopped
    #: answering after the agent's last call): the episode is then a tool fault, not the agent's failure
    #: (:func:`muarl.rollout.run_episode`). Set by an env whose state lives in a server; None here.
    state_fault: str | None = None
    #: whether the state lives outside muarl (a tool server's), so that another session could share it: the
    #: grader then checks it by behaviour (:func:`muarl.rewards.score`); a private copy here cannot be shared
    external_state: bool = False

    def hash(self) -> str:
        return self.db.hash()

    def diff(self, other: Env) -> list[str]:
        """Field-level differences from ``other`` (the expected state) to this env."""
        return diff(other.db, self.db)
