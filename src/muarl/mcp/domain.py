"""A muarl Domain whose agent tools are an MCP server's tools, so an agent trains and evaluates against it.

Every episode env opens its own MCP session (its own server process for stdio, its own HTTP session for
a URL), lazily on the first tool call, and closes it when the env is dropped. Tool calls go to the
server with a timeout; a server that crashes, hangs or does not start gives the agent an ``Error: ...``
observation and leaves a ``tool_fault`` record in the trajectory's tool log
(``trajectory.tool_fault`` is then true), never an exception out of the episode.

Grading. The database lives in the server, so the reward needs help from one of two places:

- **With a base domain** (``base=get_domain("retail")``, as when the server is ``muarl serve-mcp
  retail``): tasks, policy and grading come from the base. Each server call is replayed on a local
  copy-on-write shadow of the base database, which supplies what the grader reads besides the hash
  (changed records, owners, authentication for violations, the field diff, TCR). The final hash is the
  server's own (its ``muarl_state`` control tool) when muarl holds its control token, so the reward
  judges the server's real state; gold actions are replayed locally on the base domain (they never
  touch a server). **Divergence check**: a server answer that differs from the shadow's (a success
  where the shadow fails or the reverse, or another successful output) means the server's world is not
  the one muarl grades: the call is marked ``tool_fault`` and the final hash is "unavailable", so the
  episode can never score on the shadow's word alone.
- **Without a base** (any third-party server): the domain's "database" is the log of successful
  write calls (a table ``calls`` of ``{tool, arguments}`` in order). The reward is then action
  matching: the agent's successful writes equal the gold actions replayed on a fresh session. Tools
  the server annotates ``readOnlyHint`` are reads; unannotated tools count as writes unless listed in
  ``read_only``. Tasks come from ``tasks=`` (muarl Task objects or a tasks JSON file).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from muarl.domain import Domain, load_tasks
from muarl.env import Env
from muarl.mcp.client import CallOutcome, RemoteSession, RemoteTool, ServerSpec, ServerUnavailable
from muarl.mcp.server import CONTROL_PREFIX, RESET_TOOL, STATE_TOOL, USER_TOOL
from muarl.tools import Tool
from muarl.types import Action, Actor, Task, ToolRecord, ToolSpec

#: The one table of a base-less MCP domain: successful write calls, in order.
CALLS = "calls"


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def _remote_only(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("an MCP tool runs on its server; call it through the env")


def proxy_tool(remote: RemoteTool, read_only: Iterable[str] = (), base: Tool | None = None) -> Tool:
    """A muarl Tool that only describes a server's tool (its execution goes through :class:`MCPEnv`)."""
    if base is not None:
        kind = base.spec.kind
    else:
        kind = "read" if remote.read_only or remote.name in set(read_only) else "write"
    spec = ToolSpec(name=remote.name, description=remote.description, parameters=remote.input_schema, kind=kind)
    return Tool(fn=_remote_only, spec=spec, args_model=_AnyArgs, terminal=base.terminal if base else False,
                authenticates=base.authenticates if base else False)


@dataclass
class MCPDomain(Domain):
    """A :class:`Domain` backed by an MCP server; build one with :func:`mcp_domain`."""

    server: ServerSpec = field(default_factory=lambda: ServerSpec(url="http://127.0.0.1:8000/mcp"))
    #: the muarl domain the server serves, when it is one: tasks, policy and grading come from it
    mirror: Domain | None = None
    #: seconds one tool call may take before the server counts as hung
    call_timeout: float = 30.0
    #: seconds a server may take to start and finish the handshake
    connect_timeout: float = 60.0
    #: whether the server offers muarl's control tools (state hash, reset, user tools)
    muarl_server: bool = False
    fixed_tasks: list[Task] | None = None

    def env(self, task: Task | None = None, **context: Any) -> MCPEnv:
        return MCPEnv(self, task, context)

    def database(self) -> Any:
        """The mirrored domain's database (shared, not regenerated), else the table of write calls."""
        return self.mirror.database() if self.mirror is not None else super().database()

    def tasks(self, split: str | None = None) -> list[Task]:
        if self.fixed_tasks is None:
            return super().tasks(split)
        return [t for t in self.fixed_tasks if split is None or t.split == split]

    def session(self) -> RemoteSession:
        return RemoteSession(self.server, timeout=self.call_timeout, connect_timeout=self.connect_timeout)


class MCPEnv(Env):
    """One episode's world on an MCP server: a private server session plus muarl's local bookkeeping."""

    domain: MCPDomain

    def __init__(self, domain: MCPDomain, task: Task | None = None, context: dict[str, Any] | None = None):
        super().__init__(domain, task, context)
        #: the local copy of the mirrored domain's world that successful server calls are replayed on
        self.shadow: Env | None = None
        if domain.mirror is not None:
            self.shadow = domain.mirror.env(task, **(context or {}))
            self.db = self.shadow.db
        self.session = domain.session()
        self._started = False
        #: the first server answer that differed from the local shadow's (the server is not the world graded)
        self.divergence: str | None = None
        self._closer = weakref.finalize(self, self.session.close_soon)

    # -- calls ----------------------------------------------------------------------------------------
    def _prepare(self, name: str, arguments: Any, actor: Actor, call_id: str | None
                 ) -> tuple[ToolRecord, tuple[str, dict[str, Any], bool] | None]:
        """The log record, and the remote call to make (name, arguments, control; None when muarl answers)."""
        call_id = call_id or f"call_{next(self._ids)}"
        args = arguments if arguments is not None else {}
        record = ToolRecord(call_id=call_id, name=name, arguments=args if isinstance(args, dict)
                            else {"_raw": repr(args)[:500]}, actor=actor, authenticated=self.db.authenticated)
        tools = self.domain.agent_tools if actor == "agent" else self.domain.user_tool_map
        if name not in tools or name.startswith(CONTROL_PREFIX):
            record.kind, record.ok, record.error = "unknown", False, "unknown_tool"
            record.output = f"Error: unknown tool '{name}'. Available tools: {', '.join(sorted(tools))}"
            return record, None
        record.kind, record.terminal = tools[name].spec.kind, tools[name].terminal
        if not isinstance(args, dict):
            record.ok, record.error = False, "invalid_arguments"
            record.output = f"Error: arguments for {name} must be a JSON object, got {type(args).__name__}"
            return record, None
        if actor == "user":
            if not self.domain.muarl_server:
                record.ok, record.error = False, "tool_fault"
                record.output = "Error: this MCP server cannot run user tools (it is not a muarl server)"
                return record, None
            return record, (USER_TOOL, {"name": name, "arguments": args}, True)
        return record, (name, args, False)

    def _start_calls(self) -> list[tuple[str, dict[str, Any], bool]]:
        """Calls that set the session up before its first real call (a muarl server gets the task context)."""
        if self._started:
            return []
        self._started = True
        if self.domain.muarl_server and self.db.context:
            return [(RESET_TOOL, {"context": self.db.context}, True)]
        return []

    def _finish(self, record: ToolRecord, outcome: CallOutcome) -> ToolRecord:
        record.ok, record.output = outcome.ok, outcome.text
        record.error = None if outcome.ok else outcome.error or "domain"
        if outcome.error != "tool_fault" and self.shadow is not None:
            self._mirror(record, outcome)
        elif outcome.ok and record.kind == "write":  # no base: the database is the log of successful writes
            self.db.begin()
            self.db[CALLS].insert(f"{len(self.db[CALLS]):05d}", {"tool": record.name, "arguments": record.arguments})
            record.changed = self.db.commit()
        self.log.append(record)
        return record

    def _mirror(self, record: ToolRecord, outcome: CallOutcome) -> None:
        """Replay the server's call on the local shadow; an answer that differs marks a tool fault."""
        assert self.shadow is not None
        local = self.shadow.call(record.name, record.arguments, actor=record.actor, call_id=record.call_id)
        record.changed, record.owners, record.authenticated = local.changed, local.owners, local.authenticated
        # two failures may word their errors differently (and neither changed anything); anything else must agree
        if outcome.ok == local.ok and (not outcome.ok or outcome.text == local.output):
            return
        record.error = "tool_fault"
        if self.divergence is None:
            self.divergence = (f"the tool server's answer to {record.name} ({record.call_id}) differs from muarl's "
                               f"replay on its own copy of the {self.domain.mirror.name if self.domain.mirror else ''} "
                               f"database: server {_brief(outcome.text)}, local {_brief(local.output)}")

    def call(self, name: str, arguments: Any = None, *, actor: Actor = "agent",
             call_id: str | None = None) -> ToolRecord:
        """Execute one call on the server (synchronously; the episode loop uses :meth:`acall`)."""
        record, remote = self._prepare(name, arguments, actor, call_id)
        if remote is None:
            self.log.append(record)
            return record
        for name_, args_, control in self._start_calls():
            outcome = self.session.call(name_, args_, control=control)
            if not outcome.ok:
                return self._finish(record, _as_fault(outcome, name_))
        return self._finish(record, self.session.call(remote[0], remote[1], control=remote[2]))

    async def acall(self, name: str, arguments: Any = None, *, actor: Actor = "agent",
                    call_id: str | None = None) -> ToolRecord:
        """Execute one call on the server without blocking the episode loop."""
        record, remote = self._prepare(name, arguments, actor, call_id)
        if remote is None:
            self.log.append(record)
            return record
        for name_, args_, control in self._start_calls():
            outcome = await self.session.acall(name_, args_, control=control)
            if not outcome.ok:
                return self._finish(record, _as_fault(outcome, name_))
        return self._finish(record, await self.session.acall(remote[0], remote[1], control=remote[2]))

    def run(self, action: Action) -> ToolRecord:
        """Run a gold action: on the local base database when there is one (no server involved)."""
        if self.shadow is not None:
            record = self.shadow.run(action)
            self.log.append(record)
            return record
        return self.call(action.name, action.arguments, actor=action.actor)

    # -- state ----------------------------------------------------------------------------------------
    def hash(self) -> str:
        """The server's own state hash when it has one and this env talked to it, else the local one."""
        if self.session.fault is not None:
            return f"unavailable: {self.session.fault}"
        if self.divergence is not None:
            return f"unavailable: {self.divergence}"
        if self.domain.muarl_server and self.session.opened:
            outcome = self.session.call(STATE_TOOL, {}, control=True)
            if not outcome.ok:
                return f"unavailable: {outcome.text}"
            return str(_json(outcome.text).get("hash"))
        return self.db.hash()

    def close(self) -> None:
        """End the server session now (it is also ended when the env is garbage-collected)."""
        self._closer.detach()
        self.session.close()


def _as_fault(outcome: CallOutcome, what: str) -> CallOutcome:
    return outcome if outcome.error == "tool_fault" else CallOutcome(
        False, f"Error: the tool server refused to set up the session ({what}): {outcome.text}", "tool_fault")


def _brief(text: str, limit: int = 160) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _json(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def mcp_domain(
    server: ServerSpec | str,
    *,
    base: Domain | str | None = None,
    name: str | None = None,
    tasks: Iterable[Task] | str | Path | None = None,
    read_only: Iterable[str] = (),
    policy: str | None = None,
    call_timeout: float = 30.0,
    connect_timeout: float = 60.0,
) -> MCPDomain:
    """Build a domain from an MCP server's tools (listed once, now, over a short-lived session).

    ``base`` (a Domain or a registered name) supplies tasks, policy and grading when the server serves
    that domain; its tools must match what the server lists. Without it, ``tasks`` supplies the tasks.
    """
    spec = ServerSpec.parse(server) if isinstance(server, str) else server
    if isinstance(base, str):
        from muarl.domain import get_domain

        base = get_domain(base)
    probe = RemoteSession(spec, timeout=call_timeout, connect_timeout=connect_timeout)
    try:
        listed = probe.list_tools()
        names = {t.name for t in listed}
        muarl_server = STATE_TOOL in names
        if base is not None and muarl_server:
            _check_same_database(probe, base)
    except ConnectionError as err:
        raise ServerUnavailable(f"cannot list the tools of MCP server {spec.describe()}: {err}") from None
    finally:
        probe.close()
    remote = [t for t in listed if not t.name.startswith(CONTROL_PREFIX)]
    fixed = _load(tasks)
    if base is not None:
        missing = sorted(set(base.agent_tools) - {t.name for t in remote})
        if missing:
            raise ValueError(f"MCP server {spec.describe()} lacks tools of domain {base.name}: {', '.join(missing)}")
        if base.user_tools and not muarl_server:
            raise ValueError(f"domain {base.name} has user tools, which only a muarl MCP server can run, for a "
                             "controller holding its control token (MUARL_MCP_CONTROL_TOKEN, sent only to the "
                             "server in MUARL_MCP_URL)")
        tools = [proxy_tool(t, base=base.agent_tools.get(t.name)) for t in remote if t.name in base.agent_tools]
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Domain)}
        values.update(tools=tools, name=name or base.name, policy=policy or base.policy)
        if "base" in values:  # the expert's script follows the world, not the name
            values["base"] = getattr(base, "base", "") or base.name
    else:
        unknown = sorted(set(read_only) - {t.name for t in remote})
        if unknown:
            raise ValueError(f"read_only: MCP server {spec.describe()} has no tool(s) {', '.join(unknown)}")
        tools = [proxy_tool(t, read_only) for t in remote]
        values = dict(name=name or f"mcp:{spec.describe()}", description=f"tools of the MCP server {spec.describe()}",
                      policy=policy or "Help the user with the tools you have.", tools=tools,
                      build_db=lambda seed, size: {CALLS: {}}, build_tasks=lambda d, seed, counts: [],
                      requires_auth=False)
    return MCPDomain(**values, server=spec, mirror=base, call_timeout=call_timeout, connect_timeout=connect_timeout,
                     muarl_server=muarl_server, fixed_tasks=fixed)


def _check_same_database(probe: RemoteSession, base: Domain) -> None:
    state = _json(probe.call(STATE_TOOL, {}, control=True).text)
    if state.get("base_hash") != base.database().view().hash():
        raise ValueError(f"the MCP server's {state.get('domain')} database differs from domain {base.name}'s "
                         "(another seed or size?): rewards would compare different worlds")


def _load(tasks: Iterable[Task] | str | Path | None) -> list[Task] | None:
    if tasks is None:
        return None
    if isinstance(tasks, str | Path):
        return load_tasks(Path(tasks))
    return list(tasks)
