"""An MCP server over streamable HTTP whose one notes store behaves by session in ways no argument shows: it
stands in for a misbehaving third-party server in the state-check tests (issue 60). No real server is known
to do each of these on purpose; each is a way a server's sessions can fail to have one private state each.

``python tests/mcp_session_store_server.py PORT MODE [N]``, MODE one of

- ``reset N``: one store for every session, emptied whenever the N-th, 2N-th, ... session opens (counted
  at each ``initialize``), as a server that recycles its state every few sessions would;
- ``snapshot``: one store for every session, but each session reads a snapshot of it taken at its first call
  (plus its own writes), while its writes go to the store for the sessions after it;
- ``lazy``: one store for every session, created by the first write: until then ``note_list`` fails
  ("no store yet"), as a server that makes its database on first use.

Tools: ``note_add(text)`` (a write, unannotated) and ``note_list()`` (read-only).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server import Server

TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": []}
TOOLS = [types.Tool(name="note_add", description="Add a note.", input_schema=TEXT),
         types.Tool(name="note_list", description="Every note, one a line.", input_schema=TEXT,
                    annotations=types.ToolAnnotations(read_only_hint=True))]

MODE = sys.argv[2] if len(sys.argv) > 2 else "reset"
EVERY = int(sys.argv[3]) if len(sys.argv) > 3 else 3
STORE: list[str] | None = None if MODE == "lazy" else []
OPENED = 0  # sessions opened so far (initialize requests)
VIEWS: dict[str, list[str]] = {}  # snapshot mode: each session's view, by its Mcp-Session-Id


def _reply(text: str, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    global STORE
    view = None
    if MODE == "snapshot":
        view = VIEWS.setdefault(ctx.request.headers.get("mcp-session-id"), list(STORE or []))
    if params.name == "note_add":
        text = str((params.arguments or {}).get("text", ""))
        STORE = [*(STORE or []), text]
        if view is not None:
            view.append(text)
        return _reply("noted")
    if params.name == "note_list":
        if STORE is None:
            return _reply("no store yet", error=True)
        return _reply("".join(f"{n}\n" for n in (view if view is not None else STORE)))
    return _reply(f"unknown tool {params.name}", error=True)


def counting(app: Any) -> Any:
    """The app, counting each ``initialize`` (a session opening) and, in ``reset`` mode, emptying the store
    at every EVERY-th one before the session sees anything."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> Any:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        if method == "initialize":
            global OPENED, STORE
            OPENED += 1
            if MODE == "reset" and OPENED % EVERY == 0:
                STORE = []
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


def main() -> None:
    server = Server("session-store-test-server", on_list_tools=list_tools, on_call_tool=call_tool)
    app = server.streamable_http_app(json_response=True)
    uvicorn.run(counting(app), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")


if __name__ == "__main__":
    main()
