"""What the tests of ``muarl serve-mcp`` share: a free port, a server process on it, a plain SDK client.

Real processes over real HTTP on loopback (nothing mocked), started and stopped the same way by every test
module, so a change in how the server starts or stops is made here once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

#: how long a server may take to listen (start-up is a few seconds on 2 shared cores)
START_S = 90


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_listening(proc: subprocess.Popen[str], host: str, port: int, stderr: Callable[[], str]) -> None:
    """Return once ``proc`` accepts connections on ``port``; fail with its ``stderr()`` if it exits first."""
    deadline = time.monotonic() + START_S
    while True:
        assert proc.poll() is None, stderr()
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop a server as a user does (SIGINT), killing it if it has not exited 10 s later."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve_http(env: dict[str, str]) -> Iterator[str]:
    """``muarl serve-mcp retail --transport http`` on a free port with ``env`` added to the environment;
    yields its URL and stops it afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "muarl", "serve-mcp", "retail", "--transport", "http",
                             "--port", str(port)], stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    try:
        wait_listening(proc, "127.0.0.1", port, lambda: proc.stderr.read() if proc.stderr else "server exited")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@contextlib.asynccontextmanager
async def connect(url: str, token: str | None = None) -> AsyncIterator[Any]:
    """One connection (one MCP session) of a plain SDK client, another framework's view of the server; it
    sends DELETE when it closes."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"} if token else {})
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        yield client


def text(result: Any) -> str:
    """The text of a tool call's result."""
    return "".join(getattr(b, "text", "") for b in result.content)


def sqlite_server_path() -> str:
    """The stateful third-party MCP server (``mcp-server-sqlite``) in its own virtualenv; required (fails
    under CI, skips elsewhere) when scripts/install_mcp_sqlite.sh has not installed it."""
    from conftest import require

    root = Path(__file__).resolve().parents[1]
    venv = subprocess.run(["bash", str(root / "scripts" / "install_mcp_sqlite.sh"), "--where"], capture_output=True,
                          text=True, check=True).stdout.strip()
    server = Path(venv) / "bin" / "mcp-server-sqlite"
    require(server.exists(), f"mcp-server-sqlite is not installed in {venv}: run bash scripts/install_mcp_sqlite.sh")
    return str(server)
