"""muarl's own stdio transport: the MCP server is muarl's child process, and muarl can always stop it.

The SDK's stdio client owns its process privately, and its shutdown (close stdin, wait, SIGTERM, wait,
SIGKILL) only runs to the end if nobody cancels it; a caller that gives up early leaves a hung server
running and a read waiting for an end of file that never comes. Here the process handle is muarl's:
a call that times out terminates the server's process group at once, then kills it, each step bounded,
so the episode gets its answer within the call's limit plus a few seconds and no server outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

#: seconds a closed-down server gets to exit on its own after its stdin closes (a polite shutdown)
EXIT_GRACE = 2.0
#: seconds between SIGTERM and SIGKILL
TERM_GRACE = 1.0
#: seconds to wait for the event loop to see a SIGKILLed process gone (it cannot survive SIGKILL)
REAP_WAIT = 1.0


@dataclass
class ServerProcess:
    """A handle on one stdio server process; ``grace`` is how patient its next shutdown is."""

    process: Any = None
    grace: float = EXIT_GRACE

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def signal_group(self, sig: int) -> None:
        """Signal the server and everything it started (it leads its own process group)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    async def _exited(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            while self.running():
                await anyio.sleep(0.02)
        return not self.running()

    async def stop(self) -> None:
        """Close stdin, wait ``grace`` s, SIGTERM the group, wait, SIGKILL it: bounded at every step."""
        if self.process is None:
            return
        with contextlib.suppress(Exception):
            await self.process.stdin.aclose()
        if self.grace > 0 and await self._exited(self.grace):
            self.signal_group(signal.SIGKILL)  # children the server left behind
            return
        self.signal_group(signal.SIGTERM)
        if not await self._exited(TERM_GRACE):
            self.signal_group(signal.SIGKILL)
            await self._exited(REAP_WAIT)
        self.signal_group(signal.SIGKILL)

    def kill_now(self) -> None:
        """SIGKILL the group from any thread (at exit, or when the loop itself is stuck)."""
        self.signal_group(signal.SIGKILL)


def _parse(line: bytes) -> Any:
    """One JSON-RPC message for the session; a bad line is passed on as the exception, as the SDK does."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as err:
        return err


@contextlib.asynccontextmanager
async def stdio_transport(command: Sequence[str], env: Mapping[str, str], cwd: str | None,
                          handle: ServerProcess) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``command`` and yield the (read, write) streams an MCP ``Client`` takes as its transport."""
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(list(command), env=dict(env), cwd=cwd, stderr=None, start_new_session=True)
    handle.process = process
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        pending: list[bytes] = []  # the current line's chunks (joined once: a long line stays linear)
        async with read_in:  # closing it tells the session the connection is gone
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    if b"\n" not in chunk:
                        pending.append(chunk)
                        continue
                    first, *lines = chunk.split(b"\n")
                    lines.insert(0, b"".join([*pending, first]))
                    pending = [lines.pop()]
                    for line in lines:
                        if line.strip():
                            await read_in.send(_parse(line))

    async def write_stdin() -> None:
        try:
            async with write_out:
                async for message in write_out:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_in.aclose()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_stdout)
            tasks.start_soon(write_stdin)
            try:
                yield read_out, write_in
            finally:
                with anyio.CancelScope(shield=True):
                    await handle.stop()
                tasks.cancel_scope.cancel()
    finally:
        if handle.running():  # cancelled mid-shutdown: never leave the server behind
            handle.kill_now()
        for stream in (read_in, read_out, write_in, write_out):
            stream.close()
