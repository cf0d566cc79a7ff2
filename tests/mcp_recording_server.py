"""A third-party MCP server over streamable HTTP (the SDK's low-level Server) that writes down what it is sent.

``python tests/mcp_recording_server.py PORT LOG``: every HTTP request appends one JSON line to LOG with its
``Authorization`` header and its body, so a test can check which secrets a client handed to a server that
is not the one they belong to. It offers one read-only tool, ``echo``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mcp_types as types
import uvicorn
from mcp.server import Server

TOOLS = [types.Tool(name="echo", description="echo (recording test server)",
                    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": []},
                    annotations=types.ToolAnnotations(read_only_hint=True))]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"echo: {params.arguments}")])


def recording(app, log: Path):
    """The app, with each request's Authorization header and body appended to ``log`` first."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = dict(scope.get("headers") or [])
        with log.open("a") as f:
            f.write(json.dumps({"method": scope["method"], "authorization": headers.get(b"authorization", b"").decode(),
                                "body": body.decode(errors="replace")}) + "\n")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


def main() -> None:
    port, log = int(sys.argv[1]), Path(sys.argv[2])
    server = Server("recording-test-server", on_list_tools=list_tools, on_call_tool=call_tool)
    app = server.streamable_http_app(json_response=True)
    uvicorn.run(recording(app, log), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
