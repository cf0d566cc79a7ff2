"""Serve a muarl domain as an MCP server (stdio or streamable HTTP), one private database per session.

Any MCP client (another agent framework, an IDE, muarl's own MCP domains) then works on muarl's worlds
through the standard protocol. Each MCP session gets its own :class:`~muarl.env.Env`, a copy-on-write
view, so sessions never see each other's writes. Tools are listed with the exact JSON schemas muarl
shows its own models, and calls run through :meth:`Env.call`, so validation and error texts are
muarl's: a client sees what an in-process agent would see, byte for byte.

The server is closed to the clients it serves, because one of them may be the agent under evaluation:

- **Sessions are the server's.** A request's database is its connection's (the HTTP session the server
  issued at the handshake; the process, over stdio). A client may ask for more databases by sending
  ``_meta: {"muarl/session": "new"}``: the server issues an unguessable id
  (``secrets.token_urlsafe``), returns it in the result's ``_meta["muarl/session"]``, and binds it to
  the connection that received it. An id the server did not issue, or one issued to another connection,
  is refused (with the same words, so a client cannot even learn that it exists).
- **Control tools need the control token.** ``muarl_state`` (the session's database hash, the base
  database's hash, who is authenticated), ``muarl_reset`` (start over on a fresh database, with a
  task's context) and ``muarl_user_tool`` (run a user tool of a dual-control domain) are listed to, and
  run for, only a controller that presents the token the server was started with, in ``_meta``:
  ``{"muarl/control": TOKEN}`` (once presented, the rest of that connection is the controller's). Any
  other client sees them as unknown tools: an agent cannot act as its own user, erase a mistake or read
  the grader's hash. A server started without a token has no
  controller. muarl's MCP domains are controllers (``ServerSpec.control_token``).
- **No client can take the server from another.** The session table is bounded by count, idle time
  and call-log size, and a full table refuses new sessions instead of evicting live ones
  (:mod:`muarl.mcp.sessions`). Over HTTP every client address is bounded too: its handshake sessions
  (:class:`ClientSessions`), its connections, and how long a connection may take to send a request
  (:class:`Connections`); the log cannot be grown by repeating a request (:class:`BoundedLog`).
- **HTTP beyond loopback needs a bearer token** (``Authorization: Bearer TOKEN`` on every request), and
  the Host/Origin check against DNS rebinding is on for every host (:mod:`muarl.mcp.exposure`); tokens
  are read and checked by :mod:`muarl.mcp.tokens`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import json
import logging
import sys
import time
from collections import Counter
from typing import Any

from muarl.domain import Domain
from muarl.mcp.client import CONTROL_META, ERROR_META
from muarl.mcp.exposure import check_exposure, require_bearer, transport_security
from muarl.mcp.sessions import (
    IDLE_TIMEOUT,
    MAX_SESSIONS,
    SESSION_META,
    SessionEnvs,
    SessionRefused,
    own_idle,
    per_client_limit,
)

log = logging.getLogger(__name__)

STATE_TOOL = "muarl_state"
RESET_TOOL = "muarl_reset"
USER_TOOL = "muarl_user_tool"
CONTROL_PREFIX = "muarl_"


def _control_tools(domain: Domain) -> list[Any]:
    import mcp_types as types

    empty = {"type": "object", "properties": {}, "required": []}
    tools = [
        types.Tool(name=STATE_TOOL, description="muarl control: this session's database hash and session facts.",
                   input_schema=empty, annotations=types.ToolAnnotations(read_only_hint=True)),
        types.Tool(name=RESET_TOOL, description="muarl control: start this session over on a fresh database.",
                   input_schema={"type": "object", "properties": {"context": {
                       "type": "object", "description": "task context, such as the phone a user holds"}},
                       "required": []},
                   annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True)),
    ]
    if domain.user_tools:
        tools.append(types.Tool(
            name=USER_TOOL, description="muarl control: run one of the user's tools (dual-control domains).",
            input_schema={"type": "object", "properties": {
                "name": {"type": "string", "enum": sorted(domain.user_tool_map)},
                "arguments": {"type": "object"}}, "required": ["name"]},
            annotations=types.ToolAnnotations(read_only_hint=False)))
    return tools


def list_tools_result(domain: Domain) -> Any:
    """The domain's agent tools with muarl's schemas, then the control tools."""
    import mcp_types as types

    tools = [types.Tool(name=t.spec.name, description=t.spec.description, input_schema=t.spec.parameters,
                        annotations=types.ToolAnnotations(read_only_hint=t.spec.kind == "read",
                                                          destructive_hint=t.spec.kind == "write"))
             for t in domain.tools]
    return types.ListToolsResult(tools=tools + _control_tools(domain))


def _meta_value(ctx: Any, key: str) -> Any:
    meta = ctx.meta
    return meta.get(key) if isinstance(meta, dict) else getattr(meta, key, None)


#: the address of the HTTP request being served (set by :func:`with_client_address`): what binds and bounds
#: the session ids of clients without a connection (:mod:`muarl.mcp.sessions`)
CLIENT_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("muarl_mcp_client", default=None)


def with_client_address(app: Any) -> Any:
    """The ASGI ``app`` with each HTTP request's client address in :data:`CLIENT_ADDRESS` while it is served
    (a session-less request is served within its own exchange, so its handler sees it)."""

    async def addressed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        client = scope.get("client") if scope["type"] == "http" else None
        token = CLIENT_ADDRESS.set(str(client[0]) if client else None)
        try:
            await app(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)

    return addressed


def _connection(ctx: Any) -> Any:
    # the SDK has no public accessor for the connection of a request; this is the request session's
    return getattr(ctx.session, "_connection", None)


def connection_key(ctx: Any, stdio: bool) -> str | None:
    """The connection a request came on: its HTTP session (issued by the server), the stdio process, or None."""
    session_id = getattr(_connection(ctx), "session_id", None)
    if session_id:
        return f"http:{session_id}"
    return "stdio" if stdio else None


def presents_token(ctx: Any, control_token: str | None) -> bool:
    """Whether the request presents the server's control token (compared in constant time)."""
    given = _meta_value(ctx, CONTROL_META)
    return bool(control_token) and isinstance(given, str) and hmac.compare_digest(given.encode(),
                                                                                   str(control_token).encode())


def build_server(domain: Domain, *, stdio: bool, max_sessions: int = MAX_SESSIONS,
                 idle_timeout: float = IDLE_TIMEOUT, control_token: str | None = None,
                 per_client: int | None = None) -> Any:
    """An MCP low-level ``Server`` for ``domain`` (run it with :func:`serve_stdio` / :func:`serve_http`).

    ``control_token``: the secret a controller presents for the control tools; None: no controller.
    ``max_sessions``, ``idle_timeout``, ``per_client``: the bounds of the session table
    (:mod:`muarl.mcp.sessions`).
    """
    import mcp_types as types
    from mcp.server import Server

    envs = SessionEnvs(domain, max_sessions, idle_timeout, per_client)
    listing = list_tools_result(domain)
    agent_listing = types.ListToolsResult(tools=[t for t in listing.tools if not t.name.startswith(CONTROL_PREFIX)])

    def text(value: str, error: str | None = None, session: str | None = None) -> Any:
        meta = {**({ERROR_META: error} if error else {}), **({SESSION_META: session} if session else {})}
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)], is_error=error is not None,
                                    meta=meta or None)

    def connection(ctx: Any) -> str | None:
        key = connection_key(ctx, stdio)
        envs.watch(key, _connection(ctx))  # its sessions are freed when it ends
        return key

    def controller(ctx: Any) -> bool:
        return envs.controller(connection(ctx), presents_token(ctx, control_token))

    def state(key: str) -> str:
        env = envs.get(key)
        return json.dumps({"hash": env.hash(), "base_hash": domain.database().view().hash(),
                           "authenticated": env.db.authenticated, "calls": envs.calls(key),
                           "log_kept": len(env.log), "sessions": len(envs), "domain": domain.name})

    def reset(key: str, args: dict[str, Any]) -> None:
        context = args.get("context")
        if context is not None and not isinstance(context, dict):
            raise ValueError(f"Error: muarl_reset: context must be a JSON object, not {type(context).__name__}")
        envs.reset(key, context or {})

    def user_call(key: str, args: dict[str, Any]) -> Any:
        name = args.get("name", "")
        if not isinstance(name, str):
            raise ValueError("Error: muarl_user_tool: name must be the name of a user tool")
        return envs.get(key).call(name, args.get("arguments"), actor="user")

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return listing if controller(ctx) else agent_listing

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        name, args = params.name, params.arguments if params.arguments is not None else {}
        try:
            key, issued = envs.resolve(connection(ctx), _meta_value(ctx, SESSION_META), CLIENT_ADDRESS.get())
            control = controller(ctx)
            if control and name == STATE_TOOL:
                return text(state(key), session=issued)
            if control and name == RESET_TOOL:
                reset(key, args)
                return text("reset", session=issued)
            if control and name == USER_TOOL and domain.user_tools:
                record = user_call(key, args)
            else:  # a control tool asked for without the token is an unknown tool, like any other name
                record = envs.get(key).call(name, args)
        except SessionRefused as refused:
            return text(str(refused), "tool_fault")
        except ValueError as bad:  # malformed control arguments: the caller's mistake, said in one line
            return text(str(bad), "invalid_arguments")
        reply = text(record.output, None if record.ok else record.error or "domain", issued)
        envs.called(key)  # counted, and the log it left bounded, once the reply is built from the record
        return reply

    return Server(f"muarl-{domain.name}", version=_version(), instructions=domain.policy,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def _version() -> str:
    import muarl

    return getattr(muarl, "__version__", "0")


def serve_stdio(domain: Domain, control_token: str | None = None, max_sessions: int = MAX_SESSIONS,
                idle_timeout: float = IDLE_TIMEOUT) -> None:
    """Serve over stdin/stdout until the client closes stdin (stdout carries only protocol messages)."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(domain, stdio=True, max_sessions=max_sessions, idle_timeout=idle_timeout,
                          control_token=control_token)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def without_get_streams(app: Any) -> Any:
    """Answer HTTP GET (the standalone SSE stream) with 405, as the protocol allows a server without one.

    This server never sends a message the client did not ask for, and replies in each POST's body, so the
    stream carries nothing; but the SDK counts an open GET stream as a request in flight, so a client that
    holds one would never be idle and its session would never expire. Without it, idle means idle: no
    request for ``idle_timeout`` seconds.
    """
    from starlette.responses import Response

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            await Response("this server offers no SSE stream", status_code=405, headers={"Allow": "POST, DELETE"})(
                scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


#: defaults of ``--header-timeout`` and ``--body-timeout`` (seconds), and the most ``--max-connections`` by default
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0
MAX_CONNECTIONS = 1024
#: files kept for the server itself beside its connections (``--max-connections`` may take the rest)
FILES_KEPT = 64
#: a repeated log message is written at most once in this many seconds; each line is cut to LOG_LINE characters
LOG_INTERVAL = 10.0
LOG_LINE = 300


class BoundedLog(logging.Filter):
    """A handler filter that keeps the log from growing with what clients send: each message is cut to
    :data:`LOG_LINE` characters (a refused 65,000-character Host header is logged as its first ones and
    a count), and a message repeated within :data:`LOG_INTERVAL` seconds (the same logger and the same
    opening words) is written once, the next one saying how many were left out."""

    KEYS = 4096  # distinct messages remembered; beyond, the table starts over (the log stays bounded)

    def __init__(self, interval: float = LOG_INTERVAL, line: int = LOG_LINE):
        super().__init__()
        self.interval, self.line = interval, line
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # a template with arguments is its own key; a message written out (the SDK's f-strings, which carry
        # what the client sent) is keyed by its opening words, so that the keys stay few
        key = (record.name, record.levelno, str(record.msg) if record.args else str(record.msg)[:20])
        now = time.monotonic()
        last, left_out = self._seen.get(key, (-float("inf"), 0))
        if now - last < self.interval:
            self._seen[key] = (last, left_out + 1)
            return False
        if len(self._seen) >= self.KEYS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        message = record.getMessage()
        if len(message) > self.line:
            message = f"{message[:self.line]}... [{len(message) - self.line} characters cut]"
        if left_out:
            message += f" (and {left_out} like it in the last {now - last:.0f} s, not logged)"
        record.msg, record.args = message, None
        return True


def bound_logs(bound: BoundedLog) -> None:
    """Send the SDK's and asyncio's records (which reach the root logger) and uvicorn's through ``bound``."""
    root = logging.getLogger()
    if not root.handlers:  # as Python's last-resort handler writes them: warnings and worse, the message alone
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        root.addHandler(handler)
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(bound)


def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler: a connection that cannot be accepted (no file left) is one line,
    not asyncio's traceback; :class:`BoundedLog` writes it once per interval (asyncio retries every
    second, and Python 3.11 logs each connection waiting in the backlog)."""
    if context.get("message") == "socket.accept() out of system resource":
        log.error("muarl serve-mcp: cannot accept connections: %s; lower --max-connections or raise ulimit -n",
                  context.get("exception"))
        return
    loop.default_exception_handler(context)


def open_files_limit() -> int:
    """How many files this process may open (``ulimit -n``, the soft limit)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_limits(max_connections: int | None, files: int | None = None) -> tuple[int, int]:
    """(``--max-connections``, the listen backlog) for a process that may open ``files`` files: by default
    :data:`MAX_CONNECTIONS`, or half the files when that is less, and a backlog (the connections asyncio
    takes in one go) within half of the rest, so that connections never take the server's own files. A
    ValueError in one line for a limit that would leave fewer than :data:`FILES_KEPT`."""
    files = files or open_files_limit()
    limit = max_connections if max_connections is not None else max(1, min(MAX_CONNECTIONS, files // 2))
    if limit < 1:
        raise ValueError(f"--max-connections {limit}: give at least 1, or the server refuses every connection")
    if files - limit < FILES_KEPT:
        raise ValueError(f"--max-connections {limit}: this process may open {files} files (ulimit -n), and the "
                         f"server needs {FILES_KEPT} of them beside its connections: give at most "
                         f"{max(1, files - FILES_KEPT)}, or raise ulimit -n")
    return limit, max(8, min(2048, (files - limit) // 2))


def check_http_limits(header_timeout: float, body_timeout: float) -> None:
    """A ValueError, in one line, for a read timeout that would serve no one."""
    for name, value in (("--header-timeout", header_timeout), ("--body-timeout", body_timeout)):
        if not (0 < value < float("inf")):
            raise ValueError(f"{name} {value:g}: give a positive, finite number of seconds")


class Connections:
    """The HTTP connections of a server, bounded: at most ``limit`` at once and a quarter of them from one
    client address, and each must send its request's head within ``header_timeout`` seconds (of
    connecting, or of the request's first byte) and then its body within ``body_timeout``.

    uvicorn has no such bound: ``limit_concurrency`` accepts every connection and, once the count is
    reached, answers 503 to *every* request, a live session's included, and its h11 protocol keeps a
    connection that sends nothing, or its head a byte at a time, for ever; so a client opening slow
    connections ran the server out of files. A connection beyond the limits is answered 503 and closed at
    once, so its file is freed; the keep-alive timeout (uvicorn's ``timeout_keep_alive``) still closes
    idle connections between requests.
    """

    def __init__(self, limit: int, header_timeout: float = HEADER_TIMEOUT, body_timeout: float = BODY_TIMEOUT):
        self.limit, self.per_client = limit, max(1, limit // 4)
        self.header_timeout, self.body_timeout = header_timeout, body_timeout
        self.total = 0
        self.by_address: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        if self.total >= self.limit or self.by_address[address] >= self.per_client:
            log.warning("muarl serve-mcp: refused a connection from %s: %d connections are open, %d from that "
                        "address (--max-connections %d, a quarter of it per address)", address, self.total,
                        self.by_address[address], self.limit)
            return False
        self.total += 1
        self.by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]

    def refusal(self) -> bytes:
        body = (f"muarl serve-mcp: too many connections (--max-connections {self.limit}, at most "
                f"{self.per_client} from one address)\n").encode()
        return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    def protocol(self) -> type:
        """uvicorn's h11 protocol with these bounds (give it as ``uvicorn.Config(http=...)``)."""
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

        limits = self

        class BoundedH11Protocol(H11Protocol):
            _address: str | None = None
            _timer: asyncio.TimerHandle | None = None
            _waiting: str | None = None  # "head" or "body": what the timer waits for

            def connection_made(self, transport: Any) -> None:  # type: ignore[override]
                super().connection_made(transport)
                address = str(self.client[0]) if self.client else "?"
                if not limits.admit(address):
                    transport.write(limits.refusal())
                    transport.close()
                    return
                self._address = address
                self._watch()

            def connection_lost(self, exc: Exception | None) -> None:
                self._disarm()
                if self._address is not None:
                    limits.release(self._address)
                    self._address = None
                super().connection_lost(exc)

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                self._watch()

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if self.conn.their_state is h11.IDLE:  # between requests: uvicorn's keep-alive timeout runs
                    self._disarm()
                else:
                    self._watch()

            def _watch(self) -> None:
                """Arm the deadline for what the connection owes now: a request's head, its body, or nothing
                (a request is being answered)."""
                if self._address is None or self.transport.is_closing():
                    return
                state = self.conn.their_state
                waiting = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
                if waiting == self._waiting:
                    return
                self._disarm()
                if waiting is not None:
                    seconds = limits.header_timeout if waiting == "head" else limits.body_timeout
                    self._waiting, self._timer = waiting, self.loop.call_later(seconds, self._expire, waiting, seconds)

            def _disarm(self) -> None:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._waiting = None

            def _expire(self, waiting: str, seconds: float) -> None:
                self._timer = self._waiting = None
                if not self.transport.is_closing():
                    log.warning("muarl serve-mcp: closed a connection from %s: no request %s within %g s "
                                "(--%s-timeout)", self._address, waiting, seconds,
                                "header" if waiting == "head" else "body")
                    self.transport.close()

        return BoundedH11Protocol


class ClientSessions:
    """The SDK's HTTP sessions (one per ``initialize`` handshake) bounded per client address, as muarl's
    issued ids are (:mod:`muarl.mcp.sessions`): an address holds at most ``per_client`` of them. At its
    bound the address's own least recently used session with no request in flight, unused for
    :func:`~muarl.mcp.sessions.own_idle` seconds, is closed to make room; otherwise the handshake is
    refused (HTTP 503, ``Too many open sessions from this address``), and no other address's session is
    ever touched. The SDK's own table (``max_sessions``) still bounds all addresses together.

    Before, four addresses opening handshakes and never closing them filled the SDK's table, and every
    new client was refused for the idle timeout. The SDK tells no one which address opened a session, so
    this ASGI wrapper notes it from the response that carries the new ``Mcp-Session-Id``; it reads the
    session manager's table to learn which sessions are still open, and closes one through the manager.
    """

    def __init__(self, app: Any, manager: Any, per_client: int, idle_timeout: float):
        self.app, self.manager, self.per_client, self.own_idle = app, manager, per_client, own_idle(idle_timeout)
        self.idle_timeout = idle_timeout
        self.opened_by: dict[str, str] = {}  # session id -> the address whose handshake opened it
        self._used: dict[str, float] = {}  # session id -> when its last request ended
        self._busy: Counter[str] = Counter()  # session id -> its requests in flight
        self._opening: Counter[str] = Counter()  # address -> its handshakes being answered

    def _open_sessions(self) -> Any:
        """Forget the sessions the SDK has closed (DELETE, idle expiry); the SDK's table, or None."""
        table = getattr(self.manager, "_server_instances", None)
        now = time.monotonic()
        for sid in list(self.opened_by):
            gone = (sid not in table) if table is not None else (
                not self._busy[sid] and now - self._used[sid] > self.idle_timeout)
            if gone:
                del self.opened_by[sid], self._used[sid]
                self._busy.pop(sid, None)
        return table

    async def _make_room(self, address: str) -> bool:
        table = self._open_sessions()
        mine = [sid for sid, a in self.opened_by.items() if a == address]
        if len(mine) + self._opening[address] < self.per_client:
            return True
        now = time.monotonic()
        idle = sorted((self._used[sid], sid) for sid in mine if not self._busy[sid])
        if not idle or now - idle[0][0] < self.own_idle:
            return False
        sid = idle[0][1]  # the address's own least recently used session: its own, never another's
        transport = table.get(sid) if table is not None else None
        del self.opened_by[sid], self._used[sid]
        if transport is not None:
            discard = getattr(self.manager, "_discard_session", None)
            await (discard(sid, transport) if discard is not None else transport.terminate())
        return True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

        headers = dict(scope.get("headers") or [])
        sid = headers.get(b"mcp-session-id")
        if sid is not None:
            key = sid.decode("latin-1")
            if key not in self.opened_by:
                await self.app(scope, receive, send)
                return
            self._busy[key] += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self._busy[key] -= 1
                if key in self._used:
                    self._used[key] = time.monotonic()
            return
        version = headers.get(b"mcp-protocol-version")
        if scope["method"] != "POST" or (version is not None and
                                         version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS):
            await self.app(scope, receive, send)  # no session to open (session-less 2026 requests, GET ...)
            return
        client = scope.get("client")
        address = str(client[0]) if client else "?"
        if not await self._make_room(address):
            await self._refuse(address, scope, receive, send)
            return
        self._opening[address] += 1
        counted = True

        async def noting(message: dict[str, Any]) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and message["status"] < 400:
                opened = dict(message.get("headers") or []).get(b"mcp-session-id")
                if opened is not None:
                    key = opened.decode("latin-1")
                    self.opened_by[key], self._used[key] = address, time.monotonic()
                    self._opening[address] -= 1
                    counted = False
            await send(message)

        try:
            await self.app(scope, receive, noting)
        finally:
            if counted:
                self._opening[address] -= 1
            if self._opening[address] <= 0:
                del self._opening[address]

    async def _refuse(self, address: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from starlette.responses import JSONResponse

        log.warning("muarl serve-mcp: refused a session to %s: it holds %d (--max-sessions-per-client)",
                    address, self.per_client)
        message = (f"Too many open sessions from this address: it holds {self.per_client} "
                   f"(--max-sessions-per-client); one unused for {self.own_idle:g} s makes room for its next, "
                   "or end one (HTTP DELETE)")
        await JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}},
                           status_code=503)(scope, receive, send)


def _run_uvicorn(config: Any) -> None:
    """``uvicorn.run`` for one process, with :func:`on_loop_error` as the event loop's exception handler."""
    import uvicorn

    class Server(uvicorn.Server):
        async def serve(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(on_loop_error)
            await super().serve(sockets)

    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: an interrupt ends the server quietly
        Server(config).run()


def serve_http(domain: Domain, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = MAX_SESSIONS,
               idle_timeout: float = IDLE_TIMEOUT, control_token: str | None = None, auth_token: str | None = None,
               allowed_hosts: tuple[str, ...] = (), max_sessions_per_client: int | None = None,
               max_connections: int | None = None, header_timeout: float = HEADER_TIMEOUT,
               body_timeout: float = BODY_TIMEOUT) -> None:
    """Serve over streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted.

    With ``auth_token`` every request must carry it as a bearer token; a ``host`` beyond loopback requires
    one, and the Host/Origin check is on for every host (:mod:`muarl.mcp.exposure`). The SDK's own table
    of HTTP sessions gets the same ``max_sessions`` and ``idle_timeout`` as muarl's databases: left at its
    defaults (10,000 sessions, 30 minutes), a client that opens sessions and never closes them would lock
    the others out long after muarl's limit. Each client address may hold ``max_sessions_per_client``
    sessions (:class:`ClientSessions`, default an eighth of ``max_sessions``); connections are bounded by
    ``max_connections`` and the read timeouts (:class:`Connections`), and the log by :class:`BoundedLog`.
    """
    import uvicorn

    check_exposure(host, auth_token)
    check_http_limits(header_timeout, body_timeout)
    limit, backlog = connection_limits(max_connections)
    per_client = max_sessions_per_client if max_sessions_per_client is not None else per_client_limit(max_sessions)
    server = build_server(domain, stdio=False, max_sessions=max_sessions, idle_timeout=idle_timeout,
                          control_token=control_token, per_client=per_client)
    app = server.streamable_http_app(json_response=True,  # plain JSON replies: no SSE stream per call
                                     max_sessions=max_sessions, session_idle_timeout=idle_timeout,
                                     transport_security=transport_security(host, allowed_hosts))
    app = with_client_address(ClientSessions(without_get_streams(app), server.session_manager, per_client,
                                             idle_timeout))
    if auth_token:
        app = require_bearer(app, auth_token)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"
    print(f"muarl: serving {domain.name} over MCP at {url} (bearer token: {'required' if auth_token else 'none'}; "
          f"control tools: {'token' if control_token else 'off'}; sessions: at most {max_sessions}, "
          f"{per_client} per client address, each closed after {idle_timeout:g} s idle; connections: at most "
          f"{limit}); muarl clients send the tokens only to the URL in $MUARL_MCP_URL",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", backlog=backlog,
                            http=Connections(limit, header_timeout, body_timeout).protocol(),
                            h11_max_incomplete_event_size=16 * 1024)  # h11's default: a request head's bytes
    bound_logs(BoundedLog())
    _run_uvicorn(config)
