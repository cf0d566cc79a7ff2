"""``muarl mcp-tools``: the tools an MCP server offers, from a command line that starts it or an HTTP URL
(what ``--domain mcp:...`` would give the agent)."""

from __future__ import annotations

import argparse
import json

NAME = "mcp-tools"
HELP = "list the tools an MCP server offers (a command line or an http URL)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("server", help="e.g. 'mcp-server-time --local-timezone UTC' or http://127.0.0.1:8000/mcp")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from muarl.mcp.client import RemoteSession, ServerSpec

    session = RemoteSession(ServerSpec.parse(args.server), timeout=args.timeout, connect_timeout=args.timeout)
    try:
        tools = session.list_tools()
    except ConnectionError as err:
        raise ValueError(f"cannot reach MCP server {args.server}: {err}") from None
    finally:
        session.close()
    if args.json:
        print(json.dumps([{"name": t.name, "description": t.description, "input_schema": t.input_schema,
                           "read_only": t.read_only} for t in tools], indent=1))
        return 0
    table = Table(title=f"tools of {args.server}")
    for col in ("tool", "read only", "arguments", "description"):
        table.add_column(col)
    for t in tools:
        table.add_row(t.name, {True: "yes", False: "no", None: "?"}[t.read_only],
                      ", ".join(t.input_schema.get("properties", {})), t.description[:80])
    Console().print(table)
    return 0
