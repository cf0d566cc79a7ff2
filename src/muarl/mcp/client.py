"""Talk to any MCP server (a stdio command or a streamable-HTTP URL) from synchronous and async code.

muarl's tools are synchronous functions called by :meth:`Env.call`, while MCP clients are async and
bound to the event loop that opened them. All MCP sessions of a process therefore live on one
background event loop in a daemon thread. The episode loop awaits a call through
:meth:`RemoteSession.acall` without blocking (so many episodes, each with its own session, stay
concurrent), and synchronous code (gold replays, scripts) uses :meth:`RemoteSession.call`. Every call
has a timeout. A server that crashes, hangs or cannot start is reported as a
:class:`CallOutcome` with ``error="tool_fault"``, never raised: one broken tool server must not end a
training run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shlex
import sys
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: The ``_meta`` key a muarl server sets on failed calls to say why (muarl's ToolRecord.error values).
ERROR_META = "muarl/error"


@dataclass(frozen=True)
class ServerSpec:
    """Where an MCP server is: a command to launch (stdio) or a streamable-HTTP URL."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError("an MCP server is either a command (stdio) or a URL (streamable HTTP), not both")

    @classmethod
    def parse(cls, text: str) -> ServerSpec:
        """``http(s)://host:port/mcp`` is a URL; anything else is a command line (split like a shell)."""
        text = text.strip()
        if not text:
            raise ValueError("empty MCP server spec: give a command line or an http(s):// URL")
        if text.startswith(("http://", "https://")):
            return cls(url=text)
        return cls(command=tuple(shlex.split(text)))

    @classmethod
    def muarl(cls, domain: str, *extra: str) -> ServerSpec:
        """``muarl serve-mcp DOMAIN`` over stdio, with this interpreter."""
        return cls(command=(sys.executable, "-m", "muarl", "serve-mcp", domain, *extra))

    def describe(self) -> str:
        return self.url or shlex.join(self.command)


@dataclass
class CallOutcome:
    """One tool call's result as the agent will see it.

    ``error`` is None on success, ``"domain"`` / ``"invalid_arguments"`` / ``"unknown_tool"`` when the
    server answered with an error, and ``"tool_fault"`` when the server itself failed (crashed, hung,
    could not start) and the call may or may not have run.
    """

    ok: bool
    text: str
    error: str | None = None
    structured: Any = None


@dataclass(frozen=True)
class RemoteTool:
    """A tool as an MCP server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool | None


class _LoopThread:
    """One asyncio loop in a daemon thread that owns every MCP session of the process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="muarl-mcp", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_LOOP: _LoopThread | None = None
_LOOP_LOCK = threading.Lock()
_OPEN: set[RemoteSession] = set()


def background_loop() -> _LoopThread:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = _LoopThread()
            atexit.register(_close_all)
        return _LOOP


def _close_all() -> None:
    """At exit, stop every server we started (a stdio server would exit on EOF anyway)."""
    for session in list(_OPEN):
        session.close(wait=2.0)


def render_result(result: Any) -> tuple[str, Any]:
    """The text an agent sees for a CallToolResult: its text blocks, else its structured content."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource: {resource.uri}]")
        else:
            parts.append(f"[{kind or type(block).__name__}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts), structured


class RemoteSession:
    """One MCP client session (one server process for stdio, one HTTP session for a URL).

    Opened lazily on the first call, on the background loop. After a fault (crash, timeout, refused
    start) the session is closed and ``fault`` says why; later calls return the same fault at once
    instead of waiting again, because the server-side state of the episode is gone or unknown.
    """

    def __init__(self, spec: ServerSpec, *, timeout: float = 30.0, connect_timeout: float = 60.0):
        self.spec, self.timeout, self.connect_timeout = spec, timeout, connect_timeout
        self.fault: str | None = None
        self.opened = False
        self._client: Any = None
        self._closing: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._lock: asyncio.Lock | None = None

    # -- lifecycle (runs on the background loop) ------------------------------------------------------
    def _target(self) -> Any:
        from mcp import StdioServerParameters

        if self.spec.url:
            return self.spec.url
        env = {**os.environ, **self.spec.env} if self.spec.env else None
        return StdioServerParameters(command=self.spec.command[0], args=list(self.spec.command[1:]), env=env,
                                     cwd=self.spec.cwd)

    async def _run(self) -> None:
        """Own the client context for the session's whole life (anyio scopes must exit in their task)."""
        from mcp import Client

        assert self._ready is not None and self._closing is not None
        try:
            # the handshake era: it gives every connection a session, hence one private state per episode
            async with Client(self._target(), mode="legacy") as client:
                self._client = client
                self._ready.set_result(None)
                await self._closing.wait()
        except BaseException as err:  # noqa: BLE001 - any transport failure is a fault of this session
            if not self._ready.done():
                self._ready.set_exception(err)
            elif self.fault is None and not self._closing.is_set():
                self.fault = f"the tool server connection failed: {_describe(err)}"
            if isinstance(err, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            self._client = None
            _OPEN.discard(self)

    async def _ensure_open(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.opened:
                return
            self.opened = True
            self._closing = asyncio.Event()
            self._ready = asyncio.get_running_loop().create_future()
            _OPEN.add(self)
            self._runner = asyncio.get_running_loop().create_task(self._run())
            try:
                await asyncio.wait_for(asyncio.shield(self._ready), self.connect_timeout)
            except asyncio.TimeoutError:
                self.fault = f"the tool server did not start within {self.connect_timeout:g} s ({self.spec.describe()})"
                await self._aclose(wait=0)  # still in the handshake: nothing to close politely
            except Exception as err:  # noqa: BLE001
                self.fault = f"could not start the tool server {self.spec.describe()}: {_describe(err)}"
                await self._aclose(wait=0)

    async def _aclose(self, wait: float = 10.0) -> None:
        """Leave the client context (ending a stdio server); cancel it if that takes over ``wait`` s."""
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None and not self._runner.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._runner), wait)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self._runner.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(self._runner, 10)

    # -- calls ----------------------------------------------------------------------------------------
    async def _call(self, name: str, arguments: Mapping[str, Any]) -> CallOutcome:
        await self._ensure_open()
        if self.fault is not None or self._client is None:
            return CallOutcome(False, f"Error: {self.fault or 'the tool server is closed'}", "tool_fault")
        try:
            result = await asyncio.wait_for(self._client.call_tool(name, dict(arguments)), self.timeout)
        except asyncio.TimeoutError:
            self.fault = f"the tool server did not answer {name} within {self.timeout:g} s"
        except Exception as err:  # noqa: BLE001 - a dead or broken server
            from mcp import MCPError
            from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

            if isinstance(err, MCPError) and err.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                # a JSON-RPC error for this request only (bad arguments, unknown tool): the agent's problem
                kind = "invalid_arguments" if err.code == INVALID_PARAMS else "domain"
                return CallOutcome(False, f"Error: {err.message}", kind)
            self.fault = self.fault or f"the tool server failed during {name}: {_describe(err)}"
        else:
            text, structured = render_result(result)
            if not result.is_error:
                return CallOutcome(True, text, None, structured)
            kind = (result.meta or {}).get(ERROR_META) or "domain"
            text = text if text.startswith("Error") else f"Error: {text}"
            return CallOutcome(False, text, kind, structured)
        await self._aclose(wait=2.0)  # a hung server gets little patience
        return CallOutcome(False, f"Error: {self.fault}", "tool_fault")

    async def _list_tools(self) -> list[RemoteTool]:
        await self._ensure_open()
        if self.fault is not None or self._client is None:
            raise ConnectionError(self.fault or "the tool server is closed")
        tools: list[RemoteTool] = []
        cursor = None
        while True:
            page = await asyncio.wait_for(self._client.list_tools(cursor=cursor) if cursor else
                                          self._client.list_tools(), self.timeout)
            for t in page.tools:
                hint = t.annotations.read_only_hint if t.annotations is not None else None
                tools.append(RemoteTool(t.name, t.description or t.title or t.name, dict(t.input_schema), hint))
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                return tools

    # -- public API -----------------------------------------------------------------------------------
    def call(self, name: str, arguments: Mapping[str, Any]) -> CallOutcome:
        """Call a tool from synchronous code (never from the background loop's own thread)."""
        return _wait(background_loop().submit(self._call(name, arguments)), self.timeout + self.connect_timeout + 15)

    async def acall(self, name: str, arguments: Mapping[str, Any]) -> CallOutcome:
        """Call a tool from any event loop without blocking it."""
        return await asyncio.wrap_future(background_loop().submit(self._call(name, arguments)))

    def list_tools(self) -> list[RemoteTool]:
        return background_loop().submit(self._list_tools()).result(self.timeout + self.connect_timeout + 15)

    def close(self, wait: float = 10.0) -> None:
        """Close the session (terminating a stdio server) and wait up to ``wait`` seconds for it."""
        if not self.opened or _LOOP is None or _LOOP.loop.is_closed():
            return
        future = _LOOP.submit(self._aclose(wait))
        with contextlib.suppress(Exception):  # best effort: a stdio server also exits on stdin EOF
            future.result(wait + 5)

    def close_soon(self) -> None:
        """Close without waiting (safe from finalizers and from any thread)."""
        if self.opened and _LOOP is not None and not _LOOP.loop.is_closed():
            _LOOP.submit(self._aclose())


def _wait(future: Future[CallOutcome], limit: float) -> CallOutcome:
    try:
        return future.result(limit)
    except Exception as err:  # noqa: BLE001 - the background loop itself failed: still an observation
        future.cancel()
        return CallOutcome(False, f"Error: the tool call failed: {_describe(err)}", "tool_fault")


def _describe(err: BaseException) -> str:
    """A one-line reason, digging through anyio's exception groups to the first real cause."""
    while isinstance(getattr(err, "exceptions", None), tuple) and err.exceptions:  # (Base)ExceptionGroup
        err = err.exceptions[0]
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
