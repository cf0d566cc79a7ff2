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
  (:mod:`muarl.mcp.sessions`).
- **HTTP beyond loopback needs a bearer token** (``Authorization: Bearer TOKEN`` on every request), and
  the Host/Origin check against DNS rebinding is on for every host (:mod:`muarl.mcp.exposure`); tokens
  are read and checked by :mod:`muarl.mcp.tokens`.
"""

from __future__ import annotations

import contextvars
import hmac
import json
import logging
import sys
from typing import Any

from muarl.domain import Domain
from muarl.mcp.client import CONTROL_META, ERROR_META
from muarl.mcp.exposure import check_exposure, require_bearer, transport_security
from muarl.mcp.sessions import IDLE_TIMEOUT, MAX_SESSIONS, SESSION_META, SessionEnvs, SessionRefused

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
                 idle_timeout: float = IDLE_TIMEOUT, control_token: str | None = None) -> Any:
    """An MCP low-level ``Server`` for ``domain`` (run it with :func:`serve_stdio` / :func:`serve_http`).

    ``control_token``: the secret a controller presents for the control tools; None: no controller.
    ``max_sessions``, ``idle_timeout``: the bounds of the session table (:mod:`muarl.mcp.sessions`).
    """
    import mcp_types as types
    from mcp.server import Server

    envs = SessionEnvs(domain, max_sessions, idle_timeout)
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


def serve_http(domain: Domain, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = MAX_SESSIONS,
               idle_timeout: float = IDLE_TIMEOUT, control_token: str | None = None, auth_token: str | None = None,
               allowed_hosts: tuple[str, ...] = ()) -> None:
    """Serve over streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted.

    With ``auth_token`` every request must carry it as a bearer token; a ``host`` beyond loopback requires
    one, and the Host/Origin check is on for every host (:mod:`muarl.mcp.exposure`). The SDK's own table
    of HTTP sessions gets the same ``max_sessions`` and ``idle_timeout`` as muarl's databases: left at its
    defaults (10,000 sessions, 30 minutes), a client that opens sessions and never closes them would lock
    the others out long after muarl's limit.
    """
    import uvicorn

    check_exposure(host, auth_token)
    server = build_server(domain, stdio=False, max_sessions=max_sessions, idle_timeout=idle_timeout,
                          control_token=control_token)
    app = server.streamable_http_app(json_response=True,  # plain JSON replies: no SSE stream per call
                                     max_sessions=max_sessions, session_idle_timeout=idle_timeout,
                                     transport_security=transport_security(host, allowed_hosts))
    app = with_client_address(without_get_streams(app))
    if auth_token:
        app = require_bearer(app, auth_token)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"
    print(f"muarl: serving {domain.name} over MCP at {url} (bearer token: {'required' if auth_token else 'none'}; "
          f"control tools: {'token' if control_token else 'off'}; sessions: at most {max_sessions}, each closed "
          f"after {idle_timeout:g} s idle); muarl clients send the tokens only to the URL in $MUARL_MCP_URL",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
