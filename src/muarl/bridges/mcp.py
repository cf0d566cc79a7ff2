"""``get_domain("mcp:...")``: a domain whose agent tools are an MCP server's (see :mod:`muarl.mcp.domain`).

- ``mcp:retail``: start ``muarl serve-mcp retail`` over stdio for each episode; tasks and grading from retail.
- ``mcp:retail@http://127.0.0.1:8000/mcp``: a running muarl server over streamable HTTP.
- ``mcp:FILE.json``: any MCP server, with the tasks, read-only tools and timeouts of a config file
  (:mod:`muarl.mcp.config`); a bare ``mcp:URL`` or ``mcp:COMMAND LINE`` has no tasks and is refused.
"""

from __future__ import annotations

from muarl.mcp.domain import MCPDomain, parse_spec


def load(spec: str) -> MCPDomain:
    return parse_spec(spec)
