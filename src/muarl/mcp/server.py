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
  ``{"muarl/control": TOKEN}`` (once presented, the rest of that connection is the controller's). Any other client sees them as unknown tools: an agent cannot act as its
  own user, erase a mistake or read the grader's hash. A server started without a token has no
  controller. muarl's MCP domains are controllers (``ServerSpec.control_token``).
- **HTTP beyond loopback needs a bearer token** (``Authorization: Bearer TOKEN`` on every request);
  see :func:`serve_http`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
import sys
from collections import OrderedDict
from typing import Any

from muarl.domain import Domain
from muarl.env import Env
from muarl.mcp.client import AUTH_ENV, CONTROL_META, ERROR_META

log = logging.getLogger(__name__)

STATE_TOOL = "muarl_state"
RESET_TOOL = "muarl_reset"
USER_TOOL = "muarl_user_tool"
CONTROL_PREFIX = "muarl_"
SESSION_META = "muarl/session"
#: the ``_meta["muarl/session"]`` value that asks the server to issue a new session id
NEW_SESSION = "new"
#: the owner of ids issued to requests that belong to no connection (session-less clients)
NO_CONNECTION = "no-connection"


class SessionRefused(Exception):
    """A request names a session it may not use; the message is what the client is told."""


class SessionEnvs:
    """The private env of each session, least recently used first; the oldest go beyond ``max_sessions``.

    A session is a connection (``http:<Mcp-Session-Id>``, ``stdio``) or an id this server issued,
    bound to the connection it was issued to. HTTP sessions end without telling the tool handler, so
    envs are bounded by count instead. An env holds only the records its session edited, so even the
    default 4,096 cost little memory.
    """

    def __init__(self, domain: Domain, max_sessions: int = 4096):
        self.domain, self.max_sessions = domain, max_sessions
        self._envs: OrderedDict[str, Env] = OrderedDict()
        self._owners: dict[str, str] = {}  # issued id -> the connection it was issued to
        self._controllers: set[str] = set()  # connections that have presented the control token

    def get(self, key: str) -> Env:
        env = self._envs.get(key)
        if env is None:
            env = self._envs[key] = self.domain.env()
            while len(self._envs) > self.max_sessions:
                old, _ = self._envs.popitem(last=False)
                self._owners.pop(old, None)
                self._controllers.discard(old)
        self._envs.move_to_end(key)
        return env

    def reset(self, key: str, context: dict[str, Any]) -> Env:
        env = self._envs[key] = self.domain.env(**context)
        self._envs.move_to_end(key)
        return env

    def issue(self, connection: str) -> str:
        """A new unguessable session id, bound to ``connection``, with a fresh database."""
        key = secrets.token_urlsafe(24)
        self._owners[key] = connection
        self.get(key)
        return key

    def resolve(self, connection: str | None, asked: str | None) -> tuple[str, str | None]:
        """(the env key of a request, the id to echo in the result's ``_meta`` or None)."""
        if asked is None:
            if connection is None:
                raise SessionRefused(
                    "Error: this server keeps one database per MCP session, and this request has none: "
                    f"connect with the initialize handshake, or send _meta {{'{SESSION_META}': '{NEW_SESSION}'}} "
                    "to be issued a session id, then send that id with every request")
            return connection, None
        if asked == NEW_SESSION:
            issued = self.issue(connection or NO_CONNECTION)
            return issued, issued
        owner = self._owners.get(asked) if isinstance(asked, str) else None
        if owner is None or owner != (connection or NO_CONNECTION) or asked not in self._envs:
            raise SessionRefused(f"Error: unknown session id: ids are issued by this server (send "
                                 f"'{NEW_SESSION}') and are valid only on the connection that received them")
        return asked, asked

    def controller(self, connection: str | None, presented: bool) -> bool:
        """Whether a request may use the control tools: it presents the token, or its connection did before
        (so the SDK client's own re-listing of tools, which carries no ``_meta``, sees them too)."""
        if presented and connection is not None:
            self._controllers.add(connection)
        return presented or connection in self._controllers

    def __len__(self) -> int:
        return len(self._envs)


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


def connection_key(ctx: Any, stdio: bool) -> str | None:
    """The connection a request came on: its HTTP session (issued by the server), the stdio process, or None."""
    # the SDK has no public accessor for the transport session of a request; this is the connection's
    connection = getattr(ctx.session, "_connection", None)
    session_id = getattr(connection, "session_id", None)
    if session_id:
        return f"http:{session_id}"
    return "stdio" if stdio else None


def presents_token(ctx: Any, control_token: str | None) -> bool:
    """Whether the request presents the server's control token (compared in constant time)."""
    given = _meta_value(ctx, CONTROL_META)
    return bool(control_token) and isinstance(given, str) and hmac.compare_digest(given.encode(),
                                                                                   str(control_token).encode())


def build_server(domain: Domain, *, stdio: bool, max_sessions: int = 4096, control_token: str | None = None) -> Any:
    """An MCP low-level ``Server`` for ``domain`` (run it with :func:`serve_stdio` / :func:`serve_http`).

    ``control_token``: the secret a controller presents for the control tools; None: no controller.
    """
    import mcp_types as types
    from mcp.server import Server

    envs = SessionEnvs(domain, max_sessions)
    listing = list_tools_result(domain)
    agent_listing = types.ListToolsResult(tools=[t for t in listing.tools if not t.name.startswith(CONTROL_PREFIX)])

    def text(value: str, error: str | None = None, session: str | None = None) -> Any:
        meta = {**({ERROR_META: error} if error else {}), **({SESSION_META: session} if session else {})}
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)], is_error=error is not None,
                                    meta=meta or None)

    def controller(ctx: Any) -> bool:
        return envs.controller(connection_key(ctx, stdio), presents_token(ctx, control_token))

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return listing if controller(ctx) else agent_listing

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        try:
            key, issued = envs.resolve(connection_key(ctx, stdio), _meta_value(ctx, SESSION_META))
        except SessionRefused as refused:
            return text(str(refused), "tool_fault")
        name, args = params.name, params.arguments if params.arguments is not None else {}
        control = controller(ctx)
        if control and name == STATE_TOOL:
            env = envs.get(key)
            return text(json.dumps({"hash": env.hash(), "base_hash": domain.database().view().hash(),
                                    "authenticated": env.db.authenticated, "calls": len(env.log),
                                    "domain": domain.name}), session=issued)
        if control and name == RESET_TOOL:
            context = args.get("context") or {}
            if not isinstance(context, dict):
                return text("Error: context must be a JSON object", "invalid_arguments", issued)
            envs.reset(key, context)
            return text("reset", session=issued)
        env = envs.get(key)
        if control and name == USER_TOOL and domain.user_tools:
            record = env.call(args.get("name", ""), args.get("arguments"), actor="user")
        else:  # a control tool asked for without the token is an unknown tool, like any other name
            record = env.call(name, args)
        return text(record.output, None if record.ok else record.error or "domain", issued)

    return Server(f"muarl-{domain.name}", version=_version(), instructions=domain.policy,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def _version() -> str:
    import muarl

    return getattr(muarl, "__version__", "0")


def serve_stdio(domain: Domain, control_token: str | None = None) -> None:
    """Serve over stdin/stdout until the client closes stdin (stdout carries only protocol messages)."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(domain, stdio=True, control_token=control_token)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, auth_token: str | None) -> None:
    """Refuse to listen beyond loopback without a bearer token: anyone who reaches the port could use it."""
    if not auth_token and not is_loopback(host):
        raise ValueError(f"--host {host} listens beyond loopback, so serve-mcp requires a bearer token: set "
                         f"{AUTH_ENV} or give --auth-token-file FILE (clients send 'Authorization: Bearer TOKEN')")


def require_bearer(app: Any, token: str) -> Any:
    """Wrap an ASGI app so that every HTTP request must carry ``Authorization: Bearer TOKEN``."""
    from starlette.responses import JSONResponse

    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                refusal = JSONResponse({"error": "unauthorized: send the server's token as 'Authorization: Bearer TOKEN'"},
                                       status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await refusal(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def serve_http(domain: Domain, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = 4096,
               control_token: str | None = None, auth_token: str | None = None) -> None:
    """Serve over streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted.

    With ``auth_token`` every request must carry it as a bearer token; a ``host`` beyond loopback
    requires one (anyone who can reach the port could otherwise use the server).
    """
    import uvicorn

    check_exposure(host, auth_token)
    server = build_server(domain, stdio=False, max_sessions=max_sessions, control_token=control_token)
    app = server.streamable_http_app(host=host, json_response=True)  # plain JSON replies: no SSE stream per call
    if auth_token:
        app = require_bearer(app, auth_token)
    print(f"muarl: serving {domain.name} over MCP at http://{host}:{port}/mcp (bearer token: "
          f"{'required' if auth_token else 'none'}; control tools: {'token' if control_token else 'off'})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
