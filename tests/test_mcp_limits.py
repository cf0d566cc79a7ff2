"""``muarl serve-mcp`` hardened (issue 33, item 5), against real server processes over real HTTP on loopback.

- no client can evict another's live session: at ``--max-sessions`` new sessions are refused (muarl's
  databases and the SDK's HTTP sessions alike), and idle ones expire after ``--idle-timeout``;
- the call log is bounded per session and a session's database is freed when its client disconnects;
- the tokens in ``$MUARL_MCP_*_TOKEN`` go only to the server in ``$MUARL_MCP_URL``;
- loopback is 127.0.0.1, ::1 and localhost only, and the Host check against DNS rebinding is on beyond it;
- short tokens, token files others may write, ``--max-sessions 0`` are refused at start in one line, and a
  malformed ``muarl_reset`` gets a clean error.

Each test fails on the code before the change (see docs/mcp.md, Tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcp_helpers import connect, free_port, stop, text, wait_listening
from muarl.domain import Domain, save_tasks
from muarl.mcp.sessions import LOG_CHARS, LOG_KEEP
from muarl.types import Action, Intent, Scenario, Task

PY = sys.executable
RECORDER = str(Path(__file__).with_name("mcp_recording_server.py"))
CONTROL = secrets.token_hex(20)
AUTH = secrets.token_hex(20)
pytestmark = pytest.mark.slow  # real server processes; about 3 s of start-up each on 2 cores


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[str]
    log: Path

    def stderr(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def _serve(tmp: Path, *extra: str, host: str = "127.0.0.1", env: dict[str, str] | None = None,
           command: list[str] | None = None, port: int | None = None, nofile: int | None = None) -> Iterator[Served]:
    """A server process on a free port of ``host`` (``muarl serve-mcp retail --transport http`` unless
    ``command``, listening on ``port``, says otherwise; at ``ulimit -n nofile`` if given), its stderr in a
    file; stopped with SIGINT afterwards."""
    port = port or free_port(host)
    log = tmp / f"server-{port}.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MUARL_MCP_")}

    def limit_files() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    with log.open("w") as err:
        proc = subprocess.Popen(command or [PY, "-m", "muarl", "serve-mcp", "retail", "--transport", "http",
                                            "--host", host, "--port", str(port), *extra],
                                stderr=err, text=True, env={**base, **(env or {})},
                                preexec_fn=limit_files if nofile else None)
    served = Served(f"http://{host}:{port}/mcp", proc, log)
    try:
        wait_listening(proc, host, port, served.stderr)
        yield served
    finally:
        stop(proc)


async def _state(client: Any) -> dict[str, Any]:
    result = await client.call_tool("muarl_state", {}, meta={"muarl/control": CONTROL})
    assert not result.is_error, text(result)
    return json.loads(text(result))


def _cancel_task(retail: Domain) -> tuple[Action, dict[str, str]]:
    task = next(t for t in retail.tasks("test") if [a.name for a in t.gold_actions] == ["cancel_pending_order"])
    cancel = task.gold_actions[0]
    return cancel, {"order_id": cancel.arguments["order_id"]}


async def _status(client: Any, order: dict[str, str], meta: dict[str, str] | None = None) -> str:
    result = await client.call_tool("get_order_details", order, meta=meta)
    assert not result.is_error, text(result)
    return json.loads(text(result))["status"]


@contextlib.asynccontextmanager
async def _connect_from(url: str, local: str) -> Any:
    """A plain SDK client's connection (one MCP session) from the source address ``local`` (any of 127/8
    reaches a server on 127.0.0.1)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address=local))
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        yield client


async def _refused(url: str, local: str | None = None) -> str:
    """Why a new connection (from ``local``, if given) was refused ('' if it was not)."""
    try:
        async with connect(url) if local is None else _connect_from(url, local) as client:
            await client.list_tools()
    except Exception as err:  # noqa: BLE001 - whatever the SDK raises for a refused handshake
        while isinstance(getattr(err, "exceptions", None), tuple):  # anyio's exception groups, to the cause
            err = err.exceptions[0]
        return f"{type(err).__name__}: {err}"
    return ""


# -- no eviction: a full table refuses ------------------------------------------------------------------------
def test_at_max_sessions_new_sessions_are_refused_and_live_ones_keep_their_database(tmp_path: Path,
                                                                                    retail: Domain) -> None:
    """A client opening sessions up to the limit cannot wipe another's: muarl's table refuses the next id,
    and the SDK's table (the same --max-sessions) refuses the next connection; a DELETE makes room."""
    cancel, order = _cancel_task(retail)

    async def scenario(url: str) -> None:
        async with connect(url) as victim:
            assert not (await victim.call_tool(cancel.name, cancel.arguments)).is_error
            async with connect(url) as greedy:
                answers = [await greedy.call_tool("get_order_details", order, meta={"muarl/session": "new"})
                           for _ in range(3)]  # the victim's database and these: one more than the limit
                assert await _status(victim, order) == "cancelled", "a live session's database was wiped"
                assert [a.is_error for a in answers] == [False, False, True]
                assert "--max-sessions" in text(answers[2]) and "3 sessions" in text(answers[2])
                assert (answers[2].meta or {}).get("muarl/error") == "tool_fault"
                async with connect(url) as third:
                    await third.list_tools()  # the SDK's table: victim, greedy, third = 3
                    assert "Too many open sessions" in await _refused(url)
                assert not await _refused(url)  # third's DELETE freed its place

    with _serve(tmp_path, "--max-sessions", "3", "--max-sessions-per-client", "3") as served:  # all on 127.0.0.1
        asyncio.run(scenario(served.url))


def test_idle_sessions_expire_and_free_their_place(tmp_path: Path, retail: Domain) -> None:
    """--max-sessions 1 --idle-timeout 2: a second client (from another address, so that the first's idle
    session does not make room for it) is refused while the first is active, and gets in (with a fresh
    database) once the first has been idle for longer than the timeout."""
    cancel, order = _cancel_task(retail)

    async def scenario(url: str) -> None:
        async with contextlib.AsyncExitStack() as stack:
            idle = await stack.enter_async_context(connect(url))
            assert not (await idle.call_tool(cancel.name, cancel.arguments)).is_error
            assert "Too many open sessions" in await _refused(url, "127.0.0.2")
            await asyncio.sleep(3.5)
            async with connect(url) as late:
                assert await _status(late, order) == "pending"  # its own database, the idle one's is gone
            with pytest.raises(Exception, match="(?i)session"):  # the idle session is closed: its id unknown
                await idle.call_tool("get_order_details", order)

    with _serve(tmp_path, "--max-sessions", "1", "--idle-timeout", "2") as served:
        asyncio.run(scenario(served.url))


def test_issued_session_ids_expire_when_idle(tmp_path: Path, retail: Domain) -> None:
    """An id issued on a connection that stays active expires on its own after the idle timeout."""
    cancel, order = _cancel_task(retail)

    async def scenario(url: str) -> None:
        async with connect(url) as client:
            opened = await client.call_tool(cancel.name, cancel.arguments, meta={"muarl/session": "new"})
            issued = {"muarl/session": (opened.meta or {})["muarl/session"]}
            assert await _status(client, order, issued) == "cancelled"
            for _ in range(8):  # the connection stays active (its SDK session lives); the issued id is unused
                await client.list_tools()
                await asyncio.sleep(0.5)
            gone = await client.call_tool("get_order_details", order, meta=issued)
            assert gone.is_error, "an issued id unused for longer than the idle timeout still has its database"
            assert "unknown session id" in text(gone), text(gone)
            assert await _status(client, order) == "pending"  # the connection's own database is still there

    with _serve(tmp_path, "--idle-timeout", "2") as served:
        asyncio.run(scenario(served.url))


@pytest.fixture(scope="module")
def controlled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with a control token, so that muarl_state reports the table to the tests."""
    with _serve(tmp_path_factory.mktemp("controlled"), env={"MUARL_MCP_CONTROL_TOKEN": CONTROL}) as served:
        yield served


# -- memory: the log is bounded, a disconnect frees --------------------------------------------------------
def test_a_disconnect_frees_the_session_and_its_issued_ids(controlled: Served, retail: Domain) -> None:
    cancel, _ = _cancel_task(retail)

    async def scenario() -> None:
        async with connect(controlled.url) as grader:
            before = (await _state(grader))["sessions"]
            async with connect(controlled.url) as client:
                assert not (await client.call_tool(cancel.name, cancel.arguments)).is_error
                for _ in range(2):
                    await client.call_tool(cancel.name, cancel.arguments, meta={"muarl/session": "new"})
                assert (await _state(grader))["sessions"] == before + 3
            for _ in range(50):  # the client's DELETE ends its connection; its sessions go with it
                if (await _state(grader))["sessions"] == before:
                    break
                await asyncio.sleep(0.1)
            assert (await _state(grader))["sessions"] == before, "a closed connection's sessions were kept"

    asyncio.run(scenario())


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_the_call_log_keeps_the_last_calls_cut_short(controlled: Served) -> None:
    """40 calls with a 512 KiB argument each: the session keeps the last LOG_KEEP, cut to LOG_CHARS, and
    the server's memory does not grow by what the client sent (20 MiB)."""
    big = "x" * (512 * 1024) + "@example.com"

    async def scenario() -> None:
        async with connect(controlled.url) as client:
            await _state(client)
            for _ in range(3):  # the allocator's first growth, before the measurement
                await client.call_tool("find_user_id_by_email", {"email": big})
            start = _rss_kib(controlled.proc.pid)
            for _ in range(40):
                refused = await client.call_tool("find_user_id_by_email", {"email": big})
                assert refused.is_error  # no such user; the output is muarl's error text
            grown = _rss_kib(controlled.proc.pid) - start
            assert grown < 8 * 1024, f"the server grew by {grown} KiB over 20 MiB of arguments"
            state = await _state(client)
            assert state["calls"] == 43 and state["log_kept"] == LOG_KEEP, state

    asyncio.run(scenario())
    assert LOG_CHARS <= 4096


# -- a malformed control call ---------------------------------------------------------------------------------
def test_malformed_reset_context_is_one_clean_error(controlled: Served) -> None:
    async def scenario() -> None:
        async with connect(controlled.url) as grader:
            for context, says in (({"task": 5}, "does not fit domain retail"), ({"self": 1}, "does not fit"),
                                  ([1, 2], "must be a JSON object")):
                result = await grader.call_tool("muarl_reset", {"context": context},
                                                meta={"muarl/control": CONTROL})
                assert result.is_error and (result.meta or {}).get("muarl/error") == "invalid_arguments", result
                assert text(result).startswith("Error: muarl_reset") and says in text(result)
                assert len(text(result).splitlines()) == 1
            assert not (await grader.call_tool("muarl_reset", {"context": {}},
                                               meta={"muarl/control": CONTROL})).is_error

    asyncio.run(scenario())
    assert "Traceback" not in controlled.stderr()


# -- tokens go to their own server only -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A third-party MCP server (tests/mcp_recording_server.py) that writes down every request it gets."""
    tmp = tmp_path_factory.mktemp("recorder")
    port = free_port()
    with _serve(tmp, command=[PY, RECORDER, str(port), str(tmp / "requests.jsonl")], port=port) as served:
        yield served


def _received(recorder: Served) -> str:
    requests = recorder.log.parent / "requests.jsonl"
    return requests.read_text() if requests.exists() else ""


def _note_tasks(path: Path) -> Path:
    ask = "Please echo hello."
    save_tasks([Task(id="echo-0", domain="echo", split="test", family="echo", user_id="u",
                     scenario=Scenario(persona="a tester", intents=[Intent(description=ask, question=ask)]),
                     instruction=ask, gold_actions=[])], path)
    return path


def test_tokens_go_only_to_the_url_they_are_bound_to(recorder: Served, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``muarl mcp-tools URL`` and an ``mcp:`` config naming a URL send neither token to a server other than
    $MUARL_MCP_URL (unset, or another server); named there, the server gets both."""
    from muarl.cli import main
    from muarl.mcp.config import load_config

    monkeypatch.setenv("MUARL_MCP_CONTROL_TOKEN", CONTROL)
    monkeypatch.setenv("MUARL_MCP_AUTH_TOKEN", AUTH)
    config = tmp_path / "echo.json"
    config.write_text(json.dumps({"server": recorder.url, "tasks": str(_note_tasks(tmp_path / "tasks.json"))}))
    for bound in (None, f"http://127.0.0.1:{free_port()}/mcp"):
        if bound is None:
            monkeypatch.delenv("MUARL_MCP_URL", raising=False)
        else:
            monkeypatch.setenv("MUARL_MCP_URL", bound)
        assert main(["mcp-tools", recorder.url, "--json", "--timeout", "20"]) == 0
        said = capsys.readouterr()
        assert [t["name"] for t in json.loads(said.out)] == ["echo"]
        domain = load_config(config)
        assert [t.name for t in domain.tools] == ["echo"]
        received = _received(recorder)
        assert received.count('"method": "POST"') >= 4  # both clients were heard
        assert AUTH not in received and CONTROL not in received, "a token went to a server it does not belong to"
        if bound is None:  # said once per URL
            assert f"not sending $MUARL_MCP_CONTROL_TOKEN and $MUARL_MCP_AUTH_TOKEN to {recorder.url}" in said.err
    monkeypatch.setenv("MUARL_MCP_URL", recorder.url.replace("http://", "HTTP://") + "/")  # the same endpoint
    assert main(["mcp-tools", recorder.url, "--json", "--timeout", "20"]) == 0
    received = _received(recorder)
    assert f"Bearer {AUTH}" in received and CONTROL in received  # the bound server gets both


# -- loopback, the Host check, refusals at start --------------------------------------------------------------
SHORT = "short-token"


@pytest.mark.parametrize("case", ["127.0.0.2", "0:0:0:0:0:0:0:1", "short bearer", "short control",
                                  "writable token file", "0644 token file", "0640 token file", "max-sessions 0",
                                  "max-sessions-per-client 0", "max-connections beyond ulimit", "header-timeout 0"])
def test_refused_at_start_in_one_line(case: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(AUTH)
    token_file.chmod({"0644 token file": 0o644, "0640 token file": 0o640}.get(case, 0o666))
    args, env, says = {
        "127.0.0.2": (["--host", "127.0.0.2"], {}, "--host 127.0.0.2 is not loopback"),
        "0:0:0:0:0:0:0:1": (["--host", "0:0:0:0:0:0:0:1"], {}, "is not loopback"),
        "short bearer": ([], {"MUARL_MCP_AUTH_TOKEN": SHORT}, "$MUARL_MCP_AUTH_TOKEN: the token has 11 characters"),
        "short control": ([], {"MUARL_MCP_CONTROL_TOKEN": SHORT}, "fewer than 32"),
        "writable token file": (["--auth-token-file", str(token_file)], {}, "(mode 0666)"),
        "0644 token file": (["--control-token-file", str(token_file)], {}, "group or others may read or write this "
                            "file (mode 0644)"),
        "0640 token file": (["--auth-token-file", str(token_file)], {}, f"'chmod 600 {token_file}'"),
        "max-sessions 0": (["--max-sessions", "0"], {}, "--max-sessions 0"),
        "max-sessions-per-client 0": (["--max-sessions-per-client", "0"], {}, "--max-sessions-per-client 0: give"),
        "max-connections beyond ulimit": (["--max-connections", "100000000"], {}, "(ulimit -n)"),
        "header-timeout 0": (["--header-timeout", "0"], {}, "--header-timeout 0: give a positive"),
    }[case]
    base = {k: v for k, v in os.environ.items() if not k.startswith("MUARL_MCP_")}
    try:
        done = subprocess.run([PY, "-m", "muarl", "serve-mcp", "retail", "--transport", "http", "--port",
                               str(free_port()), *args], capture_output=True, text=True, timeout=30,
                              env={**base, **env})
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve-mcp started with {case}")
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_host_check_is_on_beyond_loopback(tmp_path: Path) -> None:
    """``--host 127.0.0.2`` with a bearer token (from a private file): a request with the right bearer but a
    foreign Host (a DNS-rebinding page) or Origin is refused; the server's own name is served."""
    import httpx2

    token_file = tmp_path / "token"
    token_file.write_text(AUTH)
    token_file.chmod(0o600)
    with _serve(tmp_path, "--auth-token-file", str(token_file), host="127.0.0.2") as served:
        port = served.url.split(":")[2].split("/")[0]
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}

        def post(**headers: str) -> int:
            return httpx2.post(served.url, json=hello, timeout=30, headers={
                "Authorization": f"Bearer {AUTH}", "Accept": "application/json, text/event-stream", **headers}
            ).status_code

        assert post(Host=f"evil.example:{port}") == 421
        assert post(Origin="http://evil.example") == 403
        assert post() == 200


@contextlib.asynccontextmanager
async def _sessionless(url: str, local: str = "127.0.0.1") -> Any:
    """A client without a connection (MCP 2026-07-28: one exchange per request, no handshake session), from
    the source address ``local`` (any of 127/8 reaches a server on 127.0.0.1)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address=local))
    async with http, Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:
        yield client


def test_a_sessionless_flood_locks_no_one_out(tmp_path: Path, retail: Domain) -> None:
    """--max-sessions 16: a stranger without a connection floods 100 ``new`` requests in a burst. It is given
    2 ids (an eighth of the table) and refused the rest, in one line each; a connected client's live session
    keeps its database through the flood, a newcomer connects and gets a session of its own, and a client
    without a connection from another address still gets an id. An id works only from the address it was
    issued to. Before, the flood filled the table and every newcomer was refused."""
    cancel, order = _cancel_task(retail)

    async def scenario(url: str) -> None:
        async with connect(url) as live:
            assert not (await live.call_tool(cancel.name, cancel.arguments)).is_error
            async with _sessionless(url) as stranger:
                answers = [await stranger.call_tool("get_order_details", order, meta={"muarl/session": "new"})
                           for _ in range(100)]
                issued = [(a.meta or {}).get("muarl/session") for a in answers if not a.is_error]
                refused = [text(a) for a in answers if a.is_error]
                assert len(issued) == 2 and len(refused) == 98, refused[:1]
                assert "this address already holds 2 session ids" in refused[0]
                mine = await stranger.call_tool("get_order_details", order, meta={"muarl/session": issued[0]})
                assert not mine.is_error and json.loads(text(mine))["status"] == "pending"
                async with _sessionless(url, "127.0.0.2") as other:
                    stolen = await other.call_tool("get_order_details", order, meta={"muarl/session": issued[0]})
                    assert stolen.is_error and "unknown session id" in text(stolen)  # bound to its address
                    own = await other.call_tool("get_order_details", order, meta={"muarl/session": "new"})
                    assert not own.is_error, text(own)
            assert await _status(live, order) == "cancelled"  # the live session kept its database
            async with connect(url) as newcomer:
                assert await _status(newcomer, order) == "pending"

    with _serve(tmp_path, "--max-sessions", "16") as served:
        asyncio.run(scenario(served.url))


def test_a_sessionless_clients_own_idle_id_makes_room_and_no_one_elses() -> None:
    """The bounds themselves, on the session table (no server): at its bound an address's own oldest id idle
    long enough is dropped for its next; one in use is not, and another address's ids are never touched."""
    import time

    from muarl.domain import get_domain
    from muarl.mcp.sessions import SessionEnvs, SessionRefused, own_idle

    envs = SessionEnvs(get_domain("retail-lite"), max_sessions=16, idle_timeout=100.0)
    a = [envs.resolve(None, "new", "10.0.0.1")[0] for _ in range(2)]
    b = envs.resolve(None, "new", "10.0.0.2")[0]
    with pytest.raises(SessionRefused, match="this address already holds 2"):
        envs.resolve(None, "new", "10.0.0.1")
    envs._sessions[a[0]].used = time.monotonic() - own_idle(100.0) - 1  # a's first id, idle long enough
    fresh = envs.resolve(None, "new", "10.0.0.1")[0]
    assert a[0] not in envs._sessions and {a[1], fresh, b} <= envs._sessions.keys()
    with pytest.raises(SessionRefused):  # a's remaining ids are in use: the newcomer is refused
        envs.resolve(None, "new", "10.0.0.1")
    assert envs.resolve(None, b, "10.0.0.2") == (b, b)
    with pytest.raises(SessionRefused, match="unknown session id"):
        envs.resolve(None, b, "10.0.0.1")


# -- issue 60, item 4: bounded per client address; connections, read timeouts and the log bounded -----------
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def _handshakes(url: str, local: str, n: int) -> list[tuple[int, str | None, str]]:
    """``n`` initialize handshakes from the source address ``local``, never closed: (status, session id, body)."""
    import httpx2

    with httpx2.Client(transport=httpx2.HTTPTransport(local_address=local), timeout=30) as http:
        answers = []
        for _ in range(n):
            reply = http.post(url, json=INIT, headers=ACCEPT)
            answers.append((reply.status_code, reply.headers.get("mcp-session-id"), reply.text))
        return answers


def _ping(url: str, local: str, session: str) -> int:
    """The status of a ping in ``session``, sent from ``local`` (404 once the session is closed)."""
    import httpx2

    with httpx2.Client(transport=httpx2.HTTPTransport(local_address=local), timeout=30) as http:
        return http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers={
            **ACCEPT, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}).status_code


def _grown(served: Served, start: int) -> str:
    """What the server logged since ``start`` characters, once it is checked for what must not be there."""
    grown = served.stderr()[start:]
    assert "Traceback" not in grown and "Too many open files" not in grown.replace(
        "cannot accept connections: [Errno 24] Too many open files", ""), grown[:2000]
    return grown


def test_a_handshake_flood_from_four_addresses_locks_no_one_out(tmp_path: Path, retail: Domain) -> None:
    """--max-sessions 32 (4 per address): four addresses open 40 initialize handshakes each and never close
    them (160, five times the table). Each address gets its 4 sessions and 503 for the rest, a live
    session keeps its database, and a newcomer connects and gets one of its own; the log grows by a line
    or two. Before, the flood filled the SDK's table and every new client got 503 `Too many open sessions`
    for the idle timeout (muarl's own client, `mcp:retail@URL`, included)."""
    cancel, order = _cancel_task(retail)

    async def scenario(url: str) -> None:
        async with connect(url) as live:
            assert not (await live.call_tool(cancel.name, cancel.arguments)).is_error
            flood = await asyncio.gather(*(asyncio.to_thread(_handshakes, url, f"127.0.0.{i}", 40)
                                           for i in range(2, 6)))
            for answers in flood:
                assert [status for status, _, _ in answers].count(200) == 4, [a[:2] for a in answers]
                refused = [body for status, _, body in answers if status == 503]
                assert len(refused) == 36 and "Too many open sessions from this address" in refused[0], refused[:1]
            assert await _status(live, order) == "cancelled"  # the live session kept its database
            async with connect(url) as newcomer:
                assert await _status(newcomer, order) == "pending"

    with _serve(tmp_path, "--max-sessions", "32") as served:
        start = len(served.stderr())
        asyncio.run(scenario(served.url))
        grown = _grown(served, start)
        assert grown.count("\n") <= 4 and len(grown) < 2048, grown


def test_an_addresss_own_idle_session_makes_room_for_its_next(tmp_path: Path) -> None:
    """--max-sessions 16 --idle-timeout 10 (2 sessions per address; an own session unused for 1 s makes
    room): at its bound an address's next handshake closes its own least recently used idle session, never
    one in use and never another address's."""
    with _serve(tmp_path, "--max-sessions", "16", "--idle-timeout", "10") as served:
        url = served.url
        [(_, other, _)] = _handshakes(url, "127.0.0.3", 1)  # another address's, idle throughout
        (_, first, _), (_, second, _) = _handshakes(url, "127.0.0.2", 2)
        assert _handshakes(url, "127.0.0.2", 1)[0][0] == 503  # both were used just now
        time.sleep(1.5)
        assert _ping(url, "127.0.0.2", second) == 200  # the second in use, the first idle for 1.5 s
        status, third, _ = _handshakes(url, "127.0.0.2", 1)[0]
        assert status == 200 and third, "an address's own idle session did not make room for its next"
        assert _ping(url, "127.0.0.2", first) == 404  # the idle one was closed for it
        assert _ping(url, "127.0.0.2", second) == 200
        assert _handshakes(url, "127.0.0.2", 1)[0][0] == 503  # the two left are in use: refused
        assert _ping(url, "127.0.0.3", other) == 200  # another address's idle session untouched


def test_a_sessionless_flood_from_five_addresses_locks_no_newcomer_out(tmp_path: Path, retail: Domain) -> None:
    """--max-sessions 16 (2 ids per address, 8 for all clients without a connection): five addresses flood
    ``new``. The first four take the session-less half, the fifth still gets its first id, and so does a
    newcomer from a sixth; a connected client's live session keeps its database and a connected newcomer
    gets one. Before, the four filled the half and every session-less newcomer was refused."""
    cancel, order = _cancel_task(retail)

    async def scenario(url: str) -> None:
        async with connect(url) as live:
            assert not (await live.call_tool(cancel.name, cancel.arguments)).is_error
            held = []
            for i in range(2, 7):
                async with _sessionless(url, f"127.0.0.{i}") as stranger:
                    answers = [await stranger.call_tool("get_order_details", order, meta={"muarl/session": "new"})
                               for _ in range(6)]
                    held.append(sum(not a.is_error for a in answers))
            assert held == [2, 2, 2, 2, 1], held
            async with _sessionless(url, "127.0.0.7") as newcomer:
                opened = await newcomer.call_tool("get_order_details", order, meta={"muarl/session": "new"})
                assert not opened.is_error, text(opened)
                mine = {"muarl/session": (opened.meta or {})["muarl/session"]}
                assert await _status(newcomer, order, mine) == "pending"
            assert await _status(live, order) == "cancelled"
            async with connect(url) as late:
                assert await _status(late, order) == "pending"

    with _serve(tmp_path, "--max-sessions", "16") as served:
        asyncio.run(scenario(served.url))


def _raise_own_file_limit(need: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"this test opens {need} sockets; ulimit -Hn is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _slow_sockets(port: int, n: int, sources: tuple[str, ...], opening: bytes) -> list[Any]:
    """``n`` connections spread over ``sources`` that send ``opening`` and then nothing (refused ones too)."""
    socks = []
    for i in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(sources[i % len(sources)], 0))
            s.sendall(opening)
        except OSError:  # refused, reset: a connection the server did not keep
            continue
        socks.append(s)
    return socks


def _closed_by_server(socks: list[Any], wait: float) -> int:
    """How many of ``socks`` the server has closed (read to EOF, or reset) within ``wait`` seconds."""
    deadline, closed = time.monotonic() + wait, 0
    for s in socks:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            while s.recv(65536):
                pass
            closed += 1
        except TimeoutError:
            pass
        except OSError:
            closed += 1
        s.close()
    return closed


def test_slow_connections_at_ulimit_1024_stall_no_session(tmp_path: Path, retail: Domain) -> None:
    """At ``ulimit -n 1024`` (--max-connections then defaults to 512, 128 per address) with
    --header-timeout 3: 1,100 connections from two addresses send half a request head and nothing more.
    Those beyond the limits are answered 503 and closed at once, the rest when the head timeout runs out;
    the server's open files stay far below the limit, a live session keeps working throughout, a
    newcomer connects during the flood, and the log grows by a few lines. Before, the server ran out of
    files (uvicorn keeps such connections for ever): new clients could not connect and every connection
    waiting in the backlog logged a `Too many open files` traceback (517,421 in 30 s)."""
    _raise_own_file_limit(4096)
    cancel, order = _cancel_task(retail)
    opening = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"

    async def scenario(served: Served) -> None:
        port = int(served.url.split(":")[2].split("/")[0])
        async with connect(served.url) as live:
            assert not (await live.call_tool(cancel.name, cancel.arguments)).is_error
            flood = asyncio.create_task(asyncio.to_thread(_slow_sockets, port, 1100, ("127.0.0.2", "127.0.0.3"),
                                                          opening))
            peak = 0
            while not flood.done():  # the live session calls on while the connections pile up
                assert await _status(live, order) == "cancelled"
                peak = max(peak, _open_fds(served.proc.pid))
                await asyncio.sleep(0.2)
            socks = await flood
            peak = max(peak, _open_fds(served.proc.pid))
            async with connect(served.url) as newcomer:  # during the flood: 256 slow connections are held
                assert await _status(newcomer, order) == "pending"
            assert await _status(live, order) == "cancelled"
            assert peak < 700, f"the server held {peak} files at ulimit -n 1024"
            closed = await asyncio.to_thread(_closed_by_server, socks, 6.0)
            assert closed == len(socks), f"{len(socks) - closed} slow connections outlived --header-timeout 3"
            assert await _status(live, order) == "cancelled"

    with _serve(tmp_path, "--header-timeout", "3", nofile=1024) as served:
        start = len(served.stderr())
        asyncio.run(scenario(served))
        grown = _grown(served, start)
        assert grown.count("\n") <= 8 and len(grown) < 4096, grown


class _RawSession:
    """An MCP session over one kept-alive socket, spoken by hand: it needs no new connection to go on."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        status, headers, _ = self.post(INIT)
        assert status == 200, status
        self.headers = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}

    def post(self, message: dict[str, Any], **headers: str) -> tuple[int, dict[str, str], bytes]:
        body = json.dumps(message).encode()
        lines = [b"POST /mcp HTTP/1.1", b"Host: 127.0.0.1", b"content-type: application/json",
                 b"accept: application/json, text/event-stream", b"content-length: %d" % len(body),
                 *(f"{k}: {v}".encode() for k, v in headers.items())]
        self.sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536) or b"EOF"
            assert not data.endswith(b"EOF"), data
        head, _, rest = data.partition(b"\r\n\r\n")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        got = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        while len(rest) < int(got.get("content-length", 0)):
            rest += self.sock.recv(65536)
        return int(status_line.split()[1]), got, rest

    def ping(self) -> float:
        """Seconds a ping in the session took to be answered."""
        started = time.monotonic()
        status, _, _ = self.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, **self.headers)
        assert status == 200, status
        return time.monotonic() - started


def test_the_accept_error_is_logged_once_per_interval(tmp_path: Path, retail: Domain) -> None:
    """The server's file limit lowered under it (prlimit) to 40 files more than it holds, then 400
    connections that send nothing: the connections it cannot accept are one line per 10 s in the log
    (`cannot accept connections: [Errno 24] Too many open files`), not a traceback per connection; a live
    session on a kept-alive connection is answered throughout, and once files are free again a live SDK
    client goes on and a newcomer connects. Before, each connection waiting in the backlog logged a
    traceback (thousands a second)."""
    import resource

    _raise_own_file_limit(2048)
    cancel, order = _cancel_task(retail)

    async def scenario(served: Served) -> None:
        pid, port = served.proc.pid, int(served.url.split(":")[2].split("/")[0])
        async with connect(served.url) as live:
            assert not (await live.call_tool(cancel.name, cancel.arguments)).is_error
            kept = _RawSession(port)
            hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_fds(pid) + 40, hard))
            try:
                socks = await asyncio.to_thread(_slow_sockets, port, 400, ("127.0.0.2",), b"")
                waits = []
                for _ in range(10):  # 2 s of accept errors
                    waits.append(kept.ping())
                    await asyncio.sleep(0.2)
                assert max(waits) < 2.0, waits
            finally:
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (4096, hard))
            for s in socks:
                s.close()
            assert await _status(live, order) == "cancelled"
            async with connect(served.url) as newcomer:
                assert await _status(newcomer, order) == "pending"

    with _serve(tmp_path) as served:
        start = len(served.stderr())
        asyncio.run(scenario(served))
        grown = _grown(served, start)
        said = grown.count("cannot accept connections: [Errno 24] Too many open files")
        assert 1 <= said <= 2 and len(grown) < 4096, grown


def test_a_long_host_header_is_logged_cut_short(tmp_path: Path, retail: Domain) -> None:
    """200 requests with a 65,000-character Host header: each is refused (421), and the log grows by one
    line cut to 300 characters (and one that counts the rest), not by 13 MB; a live session works on."""
    cancel, order = _cancel_task(retail)
    body = json.dumps(INIT).encode()
    request = (b"POST /mcp HTTP/1.1\r\nHost: " + b"h" * 65000 + b"\r\ncontent-type: application/json\r\n"
               b"accept: application/json, text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    def send(port: int) -> list[bytes]:
        answers = []
        for _ in range(200):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request)
                answers.append(s.recv(64).split(b"\r\n")[0])
        return answers

    async def scenario(served: Served) -> None:
        async with connect(served.url) as live:
            assert not (await live.call_tool(cancel.name, cancel.arguments)).is_error
            answers = await asyncio.to_thread(send, int(served.url.split(":")[2].split("/")[0]))
            assert set(answers) == {b"HTTP/1.1 421 Misdirected Request"}, set(answers)
            assert await _status(live, order) == "cancelled"

    with _serve(tmp_path) as served:
        start = len(served.stderr())
        asyncio.run(scenario(served))
        grown = _grown(served, start)
        assert len(grown) < 2048 and "characters cut" in grown, grown[:500]


def test_a_slow_request_head_or_body_is_closed_after_its_timeout(tmp_path: Path) -> None:
    """--header-timeout 1 --body-timeout 1: a connection that sends nothing, one that sends half a head,
    and one that sends a head and half its body are all closed within 3 s (uvicorn kept them for ever),
    while a whole request on another connection is answered and a keep-alive connection idle for 2 s
    between two requests (uvicorn's keep-alive timeout, 5 s, not the head timeout) is served both."""
    body = json.dumps(INIT).encode()
    head = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"accept: application/json, text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body))
    with _serve(tmp_path, "--header-timeout", "1", "--body-timeout", "1") as served:
        port = int(served.url.split(":")[2].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as whole:
            for pause in (0, 2):
                time.sleep(pause)
                whole.sendall(head + body)
                assert whole.recv(64).startswith(b"HTTP/1.1 200"), "a whole request was not answered"
                whole.settimeout(0.3)
                with contextlib.suppress(TimeoutError):
                    while whole.recv(65536):  # the rest of the reply
                        pass
                whole.settimeout(10)
        started = time.monotonic()
        slow = [_slow_sockets(port, 1, ("127.0.0.1",), opening)[0]
                for opening in (b"", head[:20], head + body[:10])]
        assert _closed_by_server(slow, 3.0) == 3, "a slow connection outlived its timeout"
        assert time.monotonic() - started < 3.5
