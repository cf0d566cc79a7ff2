"""Talk to any MCP server (a stdio command or a streamable-HTTP URL) from synchronous and async code.

muarl's tools are synchronous functions called by :meth:`Env.call`, while MCP clients are async and
bound to the event loop that opened them. All MCP sessions of a process therefore live on one
background event loop in a daemon thread. The episode loop awaits a call through
:meth:`RemoteSession.acall` without blocking (so many episodes, each with its own session, stay
concurrent), and synchronous code (gold replays, scripts) uses :meth:`RemoteSession.call`. Every call
has a timeout. A server that crashes, hangs or cannot start is reported as a
:class:`CallOutcome` with ``error="tool_fault"``, never raised: one broken tool server must not end a
training run. A stdio server is muarl's own child process (:mod:`muarl.mcp.stdio`), so a call that
times out stops it (SIGTERM, then SIGKILL) and returns within its limit plus a bounded shutdown.

Per-episode state. Every stdio session gets a fresh private folder, removed when the session closes:
``{episode_dir}`` in the command, in ``env`` values or in ``cwd`` is replaced by its path, and the
server's environment has it as ``MUARL_EPISODE_DIR``. A server that keeps state in files (or in
anything it can be pointed at) is then one instance per episode, never shared between episodes.
``ServerSpec.files`` seeds the folder before the server starts: each named file or folder is a fresh
copy of its source (a seed database, say), which is only ever read.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from muarl.mcp.stdio import REAP_WAIT, TERM_GRACE, ServerProcess, stdio_transport
from muarl.mcp.tokens import AUTH_ENV as AUTH_ENV  # re-exported: where the client's callers look for them
from muarl.mcp.tokens import CONTROL_ENV, tokens_for

T = TypeVar("T")

#: The ``_meta`` key a muarl server sets on failed calls to say why (muarl's ToolRecord.error values).
ERROR_META = "muarl/error"
#: The ``_meta`` key a controller presents its control token in (see :mod:`muarl.mcp.server`).
CONTROL_META = "muarl/control"
#: The per-session folder: a placeholder in a stdio server's command, env values and cwd, and an env var.
EPISODE_DIR = "{episode_dir}"
EPISODE_ENV = "MUARL_EPISODE_DIR"


class ServerUnavailable(ConnectionError, ValueError):
    """An MCP server could not be started or reached (a ValueError too, so command lines print one line)."""


@dataclass(frozen=True)
class ServerSpec:
    """Where an MCP server is: a command to launch (stdio) or a streamable-HTTP URL.

    ``control_token`` is presented (in ``_meta``) to list and call a muarl server's control tools;
    ``auth_token`` is sent to an HTTP server as ``Authorization: Bearer``. A stdio server gets the safe
    default environment (PATH, HOME, ...) plus ``env``, never the whole environment of muarl's process.
    ``files`` (stdio only) maps a name inside the episode folder to a source file or folder, copied there
    for every session before the server starts (the source is only read).
    """

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    control_token: str | None = field(default=None, repr=False)
    auth_token: str | None = field(default=None, repr=False)
    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError("an MCP server is either a command (stdio) or a URL (streamable HTTP), not both")
        if self.files and self.url:
            raise ValueError("files are copied into a stdio server's episode folder; a URL's server has none")
        for name in self.files:
            if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/") or not name.strip("/."):
                raise ValueError(f"files: {name!r} is not a name inside the episode folder")

    @classmethod
    def parse(cls, text: str) -> ServerSpec:
        """``http(s)://host:port/mcp`` is a URL; anything else is a command line (split like a shell).

        A URL takes its tokens from this process's environment (``MUARL_MCP_CONTROL_TOKEN``,
        ``MUARL_MCP_AUTH_TOKEN``) only when it is the URL in ``MUARL_MCP_URL``, the server they belong to
        (:func:`muarl.mcp.tokens.tokens_for`): any other server gets neither.
        """
        text = text.strip()
        if not text:
            raise ValueError("empty MCP server spec: give a command line or an http(s):// URL")
        if text.startswith(("http://", "https://")):
            control, auth = tokens_for(text)
            return cls(url=text, control_token=control, auth_token=auth)
        return cls(command=tuple(shlex.split(text)))

    @classmethod
    def muarl(cls, domain: str, *extra: str) -> ServerSpec:
        """``muarl serve-mcp DOMAIN`` over stdio, with this interpreter, and a fresh control token for it."""
        token = secrets.token_urlsafe(32)
        env = {CONTROL_ENV: token, **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}
        return cls(command=(sys.executable, "-m", "muarl", "serve-mcp", domain, *extra), env=env, control_token=token)

    def describe(self) -> str:
        return self.url or shlex.join(self.command)

    def launch(self, episode_dir: str) -> tuple[list[str], dict[str, str], str | None]:
        """The command, environment and working folder of one session, with ``{episode_dir}`` filled in."""
        from mcp.client.stdio import get_default_environment

        def fill(text: str) -> str:
            return text.replace(EPISODE_DIR, episode_dir)

        env = {**get_default_environment(), **{k: fill(v) for k, v in self.env.items()}, EPISODE_ENV: episode_dir}
        return [fill(a) for a in self.command], env, fill(self.cwd) if self.cwd else None

    def seed(self, episode_dir: str) -> None:
        """Copy ``files`` into a new session's folder (fresh copies: the sources are only read)."""
        for name, source in self.files.items():
            target = os.path.join(episode_dir, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.isdir(source):
                shutil.copytree(source, target)
            else:
                shutil.copyfile(source, target)


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
    """At exit, stop every server we started; one that is somehow still running then is killed outright."""
    sessions = list(_OPEN)
    for session in sessions:
        session.close(wait=2.0)
    for session in sessions:
        if session.process.running():
            session.process.kill_now()


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
        #: the stdio server's process (muarl's child: it can always be stopped)
        self.process = ServerProcess()
        #: this session's private folder (stdio only), removed when the session closes
        self.episode_dir: str | None = None
        self._client: Any = None
        self._closing: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._stopping: asyncio.Future[None] | None = None

    # -- lifecycle (runs on the background loop) ------------------------------------------------------
    def _target(self) -> Any:
        if self.spec.url:
            return _http_transport(self.spec.url, self.spec.auth_token) if self.spec.auth_token else self.spec.url
        self.episode_dir = tempfile.mkdtemp(prefix="muarl-mcp-")
        self.spec.seed(self.episode_dir)
        command, env, cwd = self.spec.launch(self.episode_dir)
        return stdio_transport(command, env, cwd, self.process)

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
                await _bounded(asyncio.shield(self._ready), self.connect_timeout)
            except asyncio.TimeoutError:
                self.fault = f"the tool server did not start within {self.connect_timeout:g} s ({self.spec.describe()})"
                await self._aclose(wait=0)  # still in the handshake: nothing to close politely
            except Exception as err:  # noqa: BLE001
                self.fault = f"could not start the tool server {self.spec.describe()}: {_describe(err)}"
                await self._aclose(wait=0)

    async def _aclose(self, wait: float = 10.0) -> None:
        """Leave the client context (stopping a stdio server). Bounded: after ``wait`` s the server is
        killed and the session's task cancelled, and nothing here waits on a stuck task beyond that."""
        if self._closing is not None:
            self._closing.set()
        runner = self._runner
        if runner is not None and not runner.done():
            await asyncio.wait({runner}, timeout=wait)
            if not runner.done():
                self.process.kill_now()
                runner.cancel()
                await asyncio.wait({runner}, timeout=REAP_WAIT + 1.0)
        if self.episode_dir is not None and not self.process.running():
            shutil.rmtree(self.episode_dir, ignore_errors=True)
            self.episode_dir = None

    async def _give_up(self) -> None:
        """After a timeout: stop the server now (SIGTERM, SIGKILL after a second), no polite grace."""
        self.process.grace = 0.0
        await self._aclose(wait=TERM_GRACE + REAP_WAIT + 1.0)

    def _meta(self, control: bool) -> dict[str, Any] | None:
        return {CONTROL_META: self.spec.control_token} if control and self.spec.control_token else None

    # -- calls ----------------------------------------------------------------------------------------
    async def _call(self, name: str, arguments: Mapping[str, Any], control: bool = False) -> CallOutcome:
        await self._ensure_open()
        if self.fault is not None or self._client is None:
            return CallOutcome(False, f"Error: {self.fault or 'the tool server is closed'}", "tool_fault")
        try:
            result = await _bounded(self._client.call_tool(name, dict(arguments), meta=self._meta(control)),
                                    self.timeout)
        except asyncio.TimeoutError:
            self.fault = f"the tool server did not answer {name} within {self.timeout:g} s"
            await self._give_up()
            return CallOutcome(False, f"Error: {self.fault}", "tool_fault")
        except asyncio.CancelledError:  # a shorter limit outside this client (the episode's tool time limit)
            self.fault = self.fault or f"the call to {name} was abandoned before the tool server answered"
            self._stopping = asyncio.ensure_future(self._give_up())  # its state is unknown now: stop it anyway
            raise
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
        await self._aclose(wait=2.0)  # a crashed server: its process is gone or going
        return CallOutcome(False, f"Error: {self.fault}", "tool_fault")

    async def _list_tools(self) -> list[RemoteTool]:
        await self._ensure_open()
        if self.fault is not None or self._client is None:
            raise ServerUnavailable(self.fault or "the tool server is closed")
        tools: list[RemoteTool] = []
        cursor = None
        while True:
            try:
                page = await _bounded(self._client.list_tools(cursor=cursor, meta=self._meta(True)), self.timeout)
            except asyncio.TimeoutError:
                self.fault = f"the tool server did not list its tools within {self.timeout:g} s"
                await self._give_up()
                raise ServerUnavailable(self.fault) from None
            for t in page.tools:
                hint = t.annotations.read_only_hint if t.annotations is not None else None
                tools.append(RemoteTool(t.name, t.description or t.title or t.name, dict(t.input_schema), hint))
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                return tools

    async def _read_resource(self, uri: str) -> CallOutcome:
        await self._ensure_open()
        if self.fault is not None or self._client is None:
            return CallOutcome(False, f"Error: {self.fault or 'the tool server is closed'}", "tool_fault")
        try:
            result = await _bounded(self._client.read_resource(uri), self.timeout)
        except asyncio.TimeoutError:
            return CallOutcome(False, f"Error: the tool server did not read {uri} within {self.timeout:g} s", "tool_fault")
        except Exception as err:  # noqa: BLE001 - an unknown resource, or a broken server
            return CallOutcome(False, f"Error: reading {uri}: {_describe(err)}", "domain")
        parts = [getattr(c, "text", None) or f"[blob {getattr(c, 'blob', '')}]" for c in result.contents]
        return CallOutcome(True, "\n".join(parts))

    async def _open(self) -> str | None:
        await self._ensure_open()
        return self.fault

    # -- public API -----------------------------------------------------------------------------------
    def open(self) -> str | None:
        """Start the session now (it otherwise starts on its first call); the fault, if it could not."""
        return background_loop().submit(self._open()).result(self.connect_timeout + 15)

    def read_resource(self, uri: str) -> CallOutcome:
        """An MCP resource's text (its blobs as base64), from synchronous code."""
        return _wait(background_loop().submit(self._read_resource(uri)), self.timeout + self.connect_timeout + 15)

    def call(self, name: str, arguments: Mapping[str, Any], *, control: bool = False) -> CallOutcome:
        """Call a tool from synchronous code (never from the background loop's own thread).

        ``control``: present the spec's control token (for a muarl server's ``muarl_*`` tools).
        """
        return _wait(background_loop().submit(self._call(name, arguments, control)),
                     self.timeout + self.connect_timeout + 15)

    async def acall(self, name: str, arguments: Mapping[str, Any], *, control: bool = False) -> CallOutcome:
        """Call a tool from any event loop without blocking it."""
        return await asyncio.wrap_future(background_loop().submit(self._call(name, arguments, control)))

    def list_tools(self) -> list[RemoteTool]:
        """The server's tools (a muarl server lists its control tools only to a spec with the control token)."""
        return background_loop().submit(self._list_tools()).result(self.timeout + self.connect_timeout + 15)

    def close(self, wait: float = 10.0) -> None:
        """Close the session (stopping a stdio server) and wait up to ``wait`` seconds for it."""
        if not self.opened or _LOOP is None or _LOOP.loop.is_closed():
            return
        future = _LOOP.submit(self._aclose(wait))
        with contextlib.suppress(Exception):  # bounded inside; this is only a backstop
            future.result(wait + REAP_WAIT + 5)

    def close_soon(self) -> None:
        """Close without waiting (safe from finalizers and from any thread)."""
        if self.opened and _LOOP is not None and not _LOOP.loop.is_closed():
            _LOOP.submit(self._aclose())


async def _bounded(awaitable: Any, seconds: float) -> Any:
    """The awaitable's result, or TimeoutError after ``seconds`` without waiting for it to wind down
    (``asyncio.wait_for`` waits for the cancelled call to finish, which a hung transport never does)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        raise asyncio.TimeoutError
    return task.result()


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


@contextlib.asynccontextmanager
async def _http_transport(url: str, token: str) -> Any:
    """Streamable HTTP with ``Authorization: Bearer TOKEN`` on every request."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0, read=300.0))
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


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
