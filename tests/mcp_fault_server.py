"""A real MCP server (stdio, the SDK's low-level Server) whose tools misbehave on purpose, for the fault tests.

``echo`` answers, ``pid`` gives the process id (so a test can SIGKILL the server between calls),
``crash`` ends the process in the middle of a call, ``hang`` never answers. ``--hang-on-start`` makes the
server sleep before serving, so the handshake never completes.
"""

from __future__ import annotations

import os
import sys
import time

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": []}
TOOLS = [types.Tool(name=n, description=f"{n} (test server)", input_schema=OBJECT,
                    annotations=types.ToolAnnotations(read_only_hint=n in ("echo", "pid")))
         for n in ("echo", "pid", "crash", "hang")]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    args = params.arguments or {}
    if params.name == "crash":
        os._exit(3)
    if params.name == "hang":
        await anyio.sleep_forever()
    text = str(os.getpid()) if params.name == "pid" else f"echo: {args.get('text', '')}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def main() -> None:
    if "--hang-on-start" in sys.argv:
        time.sleep(3600)
    server = Server("muarl-fault-test", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
