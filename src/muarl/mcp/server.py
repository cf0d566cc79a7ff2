"""Serve a muarl domain as an MCP server (stdio or streamable HTTP), one private database per session.

Any MCP client (another agent framework, an IDE, muarl's own MCP domains) then works on muarl's worlds
through the standard protocol. Each MCP session gets its own :class:`~muarl.env.Env`, a copy-on-write
view, so sessions never see each other's writes. Tools are listed with the exact JSON schemas muarl
shows its own models, and calls run through :meth:`Env.call`, so validation and error texts are
muarl's: a client sees what an in-process agent would see, byte for byte.

Besides the domain's agent tools the server lists three control tools, prefixed ``muarl_`` (muarl's
MCP domains hide them from the agent):

- ``muarl_state``: the session's database hash (muarl's canonical hash), the base database's hash and
  who is authenticated; this is how a client grades the episode against the server's real state.
- ``muarl_reset``: start the session over on a fresh database, with a task's context (telecom's phone).
- ``muarl_user_tool``: run a user tool (dual-control domains) on the same database.

Which database belongs to a request: the MCP session of the handshake era (the HTTP session id; the
process for stdio), or a ``_meta`` entry ``muarl/session`` for clients of the session-less 2026 era.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import OrderedDict
from typing import Any

from muarl.domain import Domain
from muarl.env import Env
from muarl.mcp.client import ERROR_META

log = logging.getLogger(__name__)

STATE_TOOL = "muarl_state"
RESET_TOOL = "muarl_reset"
USER_TOOL = "muarl_user_tool"
CONTROL_PREFIX = "muarl_"
SESSION_META = "muarl/session"


class SessionEnvs:
    """The private env of each session, least recently used first; the oldest go beyond ``max_sessions``.

    HTTP sessions end without telling the tool handler, so envs are bounded by count instead. An env
    holds only the records its session edited, so even the default 4,096 cost little memory.
    """

    def __init__(self, domain: Domain, max_sessions: int = 4096):
        self.domain, self.max_sessions = domain, max_sessions
        self._envs: OrderedDict[str, Env] = OrderedDict()

    def get(self, key: str) -> Env:
        env = self._envs.get(key)
        if env is None:
            env = self._envs[key] = self.domain.env()
            while len(self._envs) > self.max_sessions:
                self._envs.popitem(last=False)
        self._envs.move_to_end(key)
        return env

    def reset(self, key: str, context: dict[str, Any]) -> Env:
        env = self._envs[key] = self.domain.env(**context)
        self._envs.move_to_end(key)
        return env

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


def session_key(ctx: Any, stdio: bool) -> str | None:
    """Which private database a request belongs to (see the module docstring); None if it cannot tell."""
    meta = ctx.meta
    explicit = meta.get(SESSION_META) if isinstance(meta, dict) else getattr(meta, SESSION_META, None)
    if explicit:
        return f"meta:{explicit}"
    # the SDK has no public accessor for the transport session of a request; this is the connection's
    connection = getattr(ctx.session, "_connection", None)
    session_id = getattr(connection, "session_id", None)
    if session_id:
        return f"http:{session_id}"
    return "stdio" if stdio else None


def build_server(domain: Domain, *, stdio: bool, max_sessions: int = 4096) -> Any:
    """An MCP low-level ``Server`` for ``domain`` (run it with :func:`serve_stdio` / :func:`serve_http`)."""
    import mcp_types as types
    from mcp.server import Server

    envs = SessionEnvs(domain, max_sessions)
    listing = list_tools_result(domain)

    def text(value: str, error: str | None = None) -> Any:
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)], is_error=error is not None,
                                    meta={ERROR_META: error} if error else None)

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return listing

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        key = session_key(ctx, stdio)
        if key is None:
            return text("Error: this server keeps one database per MCP session, and this request has none: "
                        "connect with the initialize handshake, or send _meta "
                        f"{{'{SESSION_META}': '<id>'}} with every request", "tool_fault")
        name, args = params.name, params.arguments if params.arguments is not None else {}
        if name == STATE_TOOL:
            env = envs.get(key)
            return text(json.dumps({"hash": env.hash(), "base_hash": domain.database().view().hash(),
                                    "authenticated": env.db.authenticated, "calls": len(env.log),
                                    "domain": domain.name}))
        if name == RESET_TOOL:
            context = args.get("context") or {}
            if not isinstance(context, dict):
                return text("Error: context must be a JSON object", "invalid_arguments")
            envs.reset(key, context)
            return text("reset")
        env = envs.get(key)
        if name == USER_TOOL and domain.user_tools:
            record = env.call(args.get("name", ""), args.get("arguments"), actor="user")
        else:
            record = env.call(name, args)
        return text(record.output, None if record.ok else record.error or "domain")

    return Server(f"muarl-{domain.name}", version=_version(), instructions=domain.policy,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def _version() -> str:
    import muarl

    return getattr(muarl, "__version__", "0")


def serve_stdio(domain: Domain) -> None:
    """Serve over stdin/stdout until the client closes stdin (stdout carries only protocol messages)."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(domain, stdio=True)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def serve_http(domain: Domain, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = 4096) -> None:
    """Serve over streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted."""
    import uvicorn

    server = build_server(domain, stdio=False, max_sessions=max_sessions)
    app = server.streamable_http_app(host=host, json_response=True)  # plain JSON replies: no SSE stream per call
    print(f"muarl: serving {domain.name} over MCP at http://{host}:{port}/mcp", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
