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
- **Without a base, with a state reader** (``state=``, :mod:`muarl.mcp.state`): the reward compares the
  server's state after the agent's episode with its state after the gold actions replayed on a fresh
  instance (a new session: for stdio a new process on a new episode folder, seeded afresh from
  ``ServerSpec.files``). The state is what the reader returns: a read tool's result (a dump query), a
  resource, or files of the episode folder hashed canonically. It is read as the episode's session opens
  (before the agent's first call) too, so that the grader (:mod:`muarl.mcp.grading`, every MCPDomain's
  ``scorer``) can check that every fresh session starts from one state.
- **Without a base or a state reader** (any third-party server): the domain's "database" is the log of
  successful write calls (a table ``calls`` of ``{tool, arguments}`` in order), and the reward is action
  matching: the agent's successful writes equal the gold actions replayed on a fresh session. The command
  says so once on stderr. Tools the server annotates ``readOnlyHint`` are reads; unannotated tools count
  as writes unless listed in ``read_only``. Tasks come from ``tasks=`` (muarl Task objects or a tasks JSON
  file).

In-band errors. Many servers answer a failed call with ordinary text (``Database error: ...``) rather
than the protocol's ``isError``. ``error_pattern`` (a regular expression, searched in each successful
result's text) turns such an answer into a failed call: no write is logged, and a gold action that fails
this way (or any other) makes the gold state "unavailable", so no episode can score on a task whose gold
the server rejected. Without a base the write log keeps successful writes either way, for the per-action
checks (TCR).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import re
import secrets
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from muarl.domain import Domain, load_tasks
from muarl.env import UNAVAILABLE, Env
from muarl.mcp.client import CallOutcome, RemoteSession, RemoteTool, ServerSpec, ServerUnavailable
from muarl.mcp.grading import Reading, score_episode
from muarl.mcp.server import CONTROL_PREFIX, RESET_TOOL, STATE_TOOL, USER_TOOL
from muarl.mcp.state import StateReader, canonical_files, shared_state_paths, state_digest
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
    #: how the server's state is read (without a base): rewards compare it with gold's; None: the write log
    state: StateReader | None = None
    #: a successful result whose text matches this is a failed call (a server's in-band errors)
    error_pattern: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scorer is None:  # graded by the server's state read as outcomes (muarl.mcp.grading)
            self.scorer = score_episode

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
        # graded by what the server reports (its state tool, a state reader): another session could share it
        self.external_state = domain.muarl_server or domain.state is not None
        self._started = False
        #: the first server answer that differed from the local shadow's (the server is not the world graded)
        self.divergence: str | None = None
        #: the first gold action (run through :meth:`run`) that the server did not accept
        self.rejected: str | None = None
        #: the state reader's last results, (probe, text) in order
        self.state_parts: list[tuple[str, str]] | None = None
        #: the state as the session found it when it opened (a state reader's domain without a base), read
        #: before the agent's first call: every fresh session must start from it (:mod:`muarl.mcp.grading`)
        self.start: Reading | None = None
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
        outcome = self._in_band(outcome)
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

    def _in_band(self, outcome: CallOutcome) -> CallOutcome:
        """A successful answer that says it failed (``error_pattern``) is a failed call."""
        pattern = self.domain.error_pattern
        if outcome.ok and pattern is not None and pattern.search(outcome.text):
            text = outcome.text if outcome.text.startswith("Error") else f"Error: {outcome.text}"
            return CallOutcome(False, text, "domain", outcome.structured)
        return outcome

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
        if self._reads_start():
            self.reading()
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
        if self._reads_start():  # blocking reads, in a worker thread: the episode loop goes on meanwhile
            await asyncio.to_thread(self.reading)
        return self._finish(record, await self.session.acall(remote[0], remote[1], control=remote[2]))

    def _reads_start(self) -> bool:
        """Whether the state must be read now, before the session's first call: it has not opened yet, and a
        state reader grades it (gold then runs on a fresh session, which must start from the same state)."""
        return self.domain.state is not None and self.domain.mirror is None and not self.session.opened

    def run(self, action: Action) -> ToolRecord:
        """Run a gold action: on the local base database when there is one (no server involved)."""
        if self.shadow is not None:
            record = self.shadow.run(action)
            self.log.append(record)
            return record
        record = self.call(action.name, action.arguments, actor=action.actor)
        if not record.ok and self.rejected is None:  # the gold state is then no state to compare with
            self.rejected = f"the tool server did not accept gold action {record.name}: {_brief(record.output)}"
        return record

    # -- state ----------------------------------------------------------------------------------------
    def hash(self) -> str:
        """The server's own state hash when it has one and this env talked to it; the hash of what the state
        reader returns when the domain has one; else the local one. An unknown state ("unavailable: ...")
        equals no other hash, another unavailable one included."""
        reading = self.reading()
        return reading.value if reading.ok else _unavailable(reading.value)

    def reading(self) -> Reading:
        """The state as an outcome (:class:`~muarl.mcp.grading.Reading`): :meth:`hash`'s value, or why the state
        cannot be read, in the same words each time, so that two readings compare as outcomes. The first
        reading of a state reader's session that had not opened is its :attr:`start`."""
        if self.session.fault is not None:
            self.state_fault = self.session.fault  # the server died (during a call, or after the last one)
            return Reading(False, self.session.fault)
        if self.divergence is not None:
            return Reading(False, self.divergence)
        if self.rejected is not None:
            return Reading(False, self.rejected)
        if self.domain.muarl_server and self.session.opened:
            outcome = self.session.call(STATE_TOOL, {}, control=True)
            if not outcome.ok:
                if outcome.error == "tool_fault":  # no answer: the server's failure, not a state to grade
                    self.state_fault = f"reading the state: {outcome.text}"
                return Reading(False, outcome.text)
            return Reading(True, str(_json(outcome.text).get("hash")))
        if self.domain.state is not None:
            fresh = not self.session.opened
            parts = self.read_state()
            reading = Reading(False, parts) if isinstance(parts, str) else Reading(True, state_digest(parts))
            if fresh and self.start is None and self.domain.mirror is None:
                self.start = reading
            return reading
        return Reading(True, self.db.hash())

    def read_state(self) -> list[tuple[str, str]] | str:
        """The state reader's results, (probe, text) in order, or why the state cannot be read."""
        assert self.domain.state is not None
        parts: list[tuple[str, str]] = []
        for probe in self.domain.state.probes:
            if probe.tool is not None:
                outcome = self._in_band(self.session.call(probe.tool, probe.arguments))
            elif probe.resource is not None:
                outcome = self.session.read_resource(probe.resource)
            else:
                fault = self.session.open()
                folder = self.session.episode_dir
                if fault is not None or folder is None:
                    if fault is not None:
                        self.state_fault = f"the state files cannot be read: {fault}"
                    return f"the state files cannot be read: {fault or 'the server has no episode folder'}"
                outcome = CallOutcome(True, canonical_files(folder, probe.files))
            if not outcome.ok:
                if outcome.error == "tool_fault":  # the server died or hung: not a state the agent left
                    self.state_fault = f"the state reader's {probe.describe()} failed: {_brief(outcome.text)}"
                return f"the state reader's {probe.describe()} failed: {_brief(outcome.text)}"
            parts.append((probe.describe(), outcome.text))
        self.state_parts = parts
        return parts

    def diff(self, other: Env) -> list[str]:
        """With a state reader: the lines of state that differ from ``other``'s (the expected state)."""
        if self.domain.state is None or not isinstance(other, MCPEnv):
            return super().diff(other)
        mine, theirs = self.state_parts, other.state_parts
        if mine is None or theirs is None:
            return ["state: " + (self.rejected or other.rejected or self.session.fault or other.session.fault
                                 or "not read")]
        lines = []
        for (probe, a), (_, b) in zip(mine, theirs, strict=True):
            changed = [f"{probe}: {line}" for line in difflib.unified_diff(b.splitlines(), a.splitlines(), "gold",
                                                                          "episode", n=0, lineterm="")
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
            lines += changed
        return lines[:40]

    def close(self) -> None:
        """End the server session now (it is also ended when the env is garbage-collected)."""
        self._closer.detach()
        self.session.close()


def _unavailable(reason: str) -> str:
    """An unknown state's hash: a random tag makes it equal no other, so two failures never match."""
    return f"{UNAVAILABLE}{reason} [{secrets.token_hex(6)}]"


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
    state: StateReader | dict[str, Any] | list[dict[str, Any]] | None = None,
    error_pattern: str | None = None,
    shared_state: bool = False,
) -> MCPDomain:
    """Build a domain from an MCP server's tools (listed once, now, over a short-lived session).

    ``base`` (a Domain or a registered name) supplies tasks, policy and grading when the server serves
    that domain; its tools must match what the server lists. Without it, ``tasks`` supplies the tasks, and
    ``state`` (a :class:`~muarl.mcp.state.StateReader` or its config form) how the server's state is read
    for the reward; without ``state`` the reward compares write logs, and this says so once on stderr.
    ``error_pattern``: a regular expression that marks a successful result's text as a failed call.
    A stdio command that names a state path outside ``{episode_dir}`` (shared by every episode) is refused
    before anything starts, unless ``shared_state`` (the server only reads it, or sharing is the point).
    """
    spec = ServerSpec.parse(server) if isinstance(server, str) else server
    reader = StateReader.parse(state) if state is not None else None
    pattern = _compile(error_pattern)
    if spec.command and not shared_state:
        shared = shared_state_paths(spec.command, spec.env, spec.cwd)
        if shared:
            raise ValueError(f"MCP server {spec.describe()}: {', '.join(repr(s) for s in shared)} would be one state "
                             "for every episode and gold replay (each would see and change the others' writes): put it "
                             "in {episode_dir} (copy a seed there with files=, \"episode_files\" in a config), or "
                             "declare shared_state (\"shared_state\": true) if the server only reads it")
    if reader is not None and base is not None:
        raise ValueError("state: a server with a base domain is graded by the base's database (and its own "
                         "muarl_state); a state reader is for servers without one")
    if reader is not None and reader.needs_files and not spec.command:
        raise ValueError(f"state: files are read from a stdio server's episode folder; {spec.describe()} is a URL")
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
        if reader is not None:
            kinds = {t.spec.name: t.spec.kind for t in tools}
            bad = [n for n in reader.tools if kinds.get(n) != "read"]
            if bad:
                raise ValueError(f"state: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not read tool(s) of MCP "
                                 f"server {spec.describe()} (reading the state must not change it; list a read tool "
                                 "in read_only)")
        elif not muarl_server:  # muarl's own server is graded by its muarl_state hash
            _say_once(spec.describe(), f"muarl: MCP server {spec.describe()} declares no state reader (\"state\", "
                      "docs/mcp.md#grading-by-state): rewards compare its log of successful write calls with gold's, "
                      "not its state")
        values = dict(name=name or f"mcp:{spec.describe()}", description=f"tools of the MCP server {spec.describe()}",
                      policy=policy or "Help the user with the tools you have.", tools=tools,
                      build_db=lambda seed, size: {CALLS: {}}, build_tasks=lambda d, seed, counts: [],
                      requires_auth=False)
    return MCPDomain(**values, server=spec, mirror=base, call_timeout=call_timeout, connect_timeout=connect_timeout,
                     muarl_server=muarl_server, fixed_tasks=fixed, state=reader, error_pattern=pattern)


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ValueError(f"error_pattern {pattern!r} is not a regular expression: {err}") from None


_told: set[str] = set()


def _say_once(key: str, line: str) -> None:
    if key not in _told:
        _told.add(key)
        print(line, file=sys.stderr, flush=True)


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
