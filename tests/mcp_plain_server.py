"""A hand-written stdio JSON-RPC MCP server (no MCP SDK, no tool annotations) for the MCP fault tests.

It behaves like the small third-party servers muarl meets in the wild, not like muarl's own:

- it keeps its state in files under ``--state-dir`` (default ``$PLAIN_STATE``, else ``./plain-state``,
  shared by every process started in the same folder), so episodes leak into each other unless each
  gets its own folder;
- ``hang`` blocks the whole process inside the tool (it no longer reads stdin, so closing stdin does
  not stop it); ``--ignore-eof`` keeps it alive after stdin closes anyway and ``--ignore-sigterm``
  makes it survive SIGTERM, so only SIGKILL ends it;
- ``--retail`` also serves muarl's retail agent tools on a database kept in the state folder (every
  successful write is logged there and replayed at start), as a stateful re-implementation would.

Tools: ``echo``, ``pid``, ``hang``, ``note_add``, ``note_list`` (plus retail's with ``--retail``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": []}
BASIC = {name: TEXT for name in ("echo", "pid", "hang", "note_add", "note_list")}


class RetailState:
    """muarl's retail world, with its successful writes kept in a file so they outlive the process."""

    def __init__(self, folder: Path):
        from muarl.domain import get_domain

        self.domain = get_domain("retail")
        self.env = self.domain.env()
        self.log = folder / "retail.jsonl"
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                call = json.loads(line)
                self.env.call(call["name"], call["arguments"])

    def tools(self) -> list[dict[str, Any]]:
        return [{"name": t.spec.name, "description": t.spec.description, "inputSchema": t.spec.parameters}
                for t in self.domain.tools]

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        record = self.env.call(name, arguments)
        if record.ok and record.kind == "write":
            with self.log.open("a") as fh:
                fh.write(json.dumps({"name": name, "arguments": arguments}) + "\n")
        return record.output, not record.ok


def call_basic(name: str, args: dict[str, Any], folder: Path) -> tuple[str, bool]:
    notes = folder / "notes.txt"
    if name == "echo":
        return f"echo: {args.get('text', '')}", False
    if name == "pid":
        return str(os.getpid()), False
    if name == "hang":
        while True:  # the whole process stops here: no stdin is read any more
            time.sleep(3600)
    if name == "note_add":
        with notes.open("a") as fh:
            fh.write(str(args.get("text", "")) + "\n")
        return "noted", False
    if name == "note_list":
        return notes.read_text() if notes.exists() else "", False
    return f"unknown tool {name}", True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--state-dir", default=os.environ.get("PLAIN_STATE", "plain-state"))
    p.add_argument("--ignore-eof", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--retail", action="store_true")
    args = p.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    folder = Path(args.state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pids").open("a").write(f"{os.getpid()}\n")
    retail = RetailState(folder) if args.retail else None
    tools = [{"name": n, "description": f"{n} (plain test server)", "inputSchema": s} for n, s in BASIC.items()]
    tools += retail.tools() if retail else []

    def send(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        method, rid, params = request.get("method"), request.get("id"), request.get("params") or {}
        if rid is None:  # a notification
            continue
        if method == "initialize":
            result: Any = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                           "capabilities": {"tools": {}}, "serverInfo": {"name": "plain", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if retail is not None and name not in BASIC:
                text, error = retail.call(name, arguments)
            else:
                text, error = call_basic(name, arguments, folder)
            result = {"content": [{"type": "text", "text": text}], "isError": error}
        elif method == "ping":
            result = {}
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})
    while args.ignore_eof:  # a server that does not notice its client has gone
        time.sleep(3600)


if __name__ == "__main__":
    main()
