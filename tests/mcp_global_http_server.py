"""An MCP server over streamable HTTP that keeps one notes list in the process for every session: the
"process-global state" no spelling can see (the URL names no path). For the shared-state tests.

Usage: ``python mcp_global_http_server.py PORT``; tools ``note_add(text)`` and ``note_list()``.
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

NOTES: list[str] = []  # one list for every client and session: the point of this server
server = MCPServer("global-notes")


@server.tool()
def note_add(text: str) -> str:
    """Add a note."""
    NOTES.append(text)
    return "ok"


@server.tool()
def note_list() -> str:
    """Every note, one a line."""
    return "".join(f"{note}\n" for note in NOTES)


if __name__ == "__main__":
    uvicorn.run(server.streamable_http_app(json_response=True), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning")
