"""MCP faults of issue 20, against real server processes (nothing mocked).

- a server that hangs inside a tool and ignores both its stdin closing and SIGTERM (a hand-written
  JSON-RPC server, ``tests/mcp_plain_server.py``): the call returns within its limit plus a bounded
  shutdown, and the process is gone;
- a server that keeps its state in files: ``{episode_dir}`` gives every episode its own folder, and a
  server answer that differs from muarl's local replay of the base database is a tool fault, not a reward;
- the command line: a config file gives tasks, read-only tools and a call timeout; a server without tasks
  and one that cannot start are one-line errors;
- ``muarl serve-mcp`` read as an untrusted client: a client-chosen or another connection's session id is
  refused, the control tools are invisible and refused without the control token, HTTP needs the bearer
  token, and a host beyond loopback needs one at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_helpers import connect, free_port, serve_http, text
from muarl.domain import Domain, get_domain, save_tasks
from muarl.mcp import ServerSpec, mcp_domain
from muarl.mcp.client import RemoteSession
from muarl.mcp.stdio import REAP_WAIT, TERM_GRACE
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import score
from muarl.rollout import EpisodeConfig, run_episode
from muarl.types import Action, Intent, Message, Scenario, Task, ToolCall, Trajectory
from muarl.users.scripted import ScriptedUser

PY = sys.executable
PLAIN = str(Path(__file__).with_name("mcp_plain_server.py"))
CONTROL = "control-secret-for-tests-32-characters"
AUTH = "bearer-secret-for-tests-of-32-characters"
pytestmark = pytest.mark.slow  # real server processes


def _running(pid: int, settle: float = 1.0) -> bool:
    """Whether ``pid`` is still a live process (a zombie is dead), allowing ``settle`` s for its reaping."""
    deadline = time.monotonic() + settle
    while True:
        try:
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError, IndexError):
            alive = False
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _note_task(domain: str) -> Task:
    ask = "Please note that I need milk."
    return Task(id="notes-0", domain=domain, split="test", family="note", user_id="u",
                scenario=Scenario(persona="a shopper", intents=[Intent(description=ask, question=ask, answer="noted")]),
                instruction=ask, gold_actions=[Action(name="note_add", arguments={"text": "milk"})])


# -- a server that hangs inside a tool ------------------------------------------------------------------------
def test_hung_server_is_stopped_and_the_call_returns(tmp_path: Path) -> None:
    """It ignores stdin closing and SIGTERM; the call still returns (limit + bounded shutdown) and the
    process is gone (SIGTERM, then SIGKILL), not left orphaned."""
    spec = ServerSpec(command=(PY, PLAIN, "--ignore-eof", "--ignore-sigterm"), cwd=str(tmp_path))
    domain = mcp_domain(spec, name="plain", call_timeout=2.0)
    env = domain.env(_note_task(domain.name))
    pid = int(env.call("pid", {}).output)
    done: list[Any] = []
    start = time.monotonic()
    worker = threading.Thread(target=lambda: done.append(env.call("hang", {})), daemon=True)
    worker.start()
    worker.join(25)
    elapsed = time.monotonic() - start
    try:
        assert done, "the call to a hung server never returned"
        record = done[0]
        assert record.error == "tool_fault" and "did not answer hang within 2 s" in record.output
        assert elapsed < 2.0 + 4.0, elapsed
        assert not _running(pid), "the hung server was left running"
        again = env.call("echo", {"text": "still there?"})  # the episode's server is gone: fail fast
        assert again.error == "tool_fault"
    finally:
        if _running(pid, settle=0):
            os.kill(pid, signal.SIGKILL)


class _HangPolicy(Policy):
    """Calls ``hang`` once, then says goodbye."""

    name = "hang"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return _HangSession()


class _HangSession(PolicySession):
    def __init__(self) -> None:
        self.turns = 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.turns += 1
        if self.turns == 1:
            return AgentTurn(message=Message(role="assistant", tool_calls=[ToolCall(id="c0", name="hang", arguments={})]))
        return AgentTurn(message=Message(role="assistant", content="Sorry, that failed. Goodbye!"))


def test_episode_tool_limit_shorter_than_the_call_timeout_also_stops_the_server(tmp_path: Path) -> None:
    """The episode's own tool time limit cancels the MCP call first: the server is stopped all the same."""
    spec = ServerSpec(command=(PY, PLAIN, "--ignore-eof", "--ignore-sigterm", "--state-dir", "{episode_dir}"),
                      cwd=str(tmp_path))
    domain = mcp_domain(spec, name="plain", call_timeout=60.0)
    task = _note_task(domain.name)
    start = time.monotonic()
    traj = asyncio.run(run_episode(domain, task, _HangPolicy(), ScriptedUser(), config=EpisodeConfig(tool_timeout=1.5)))
    assert time.monotonic() - start < 1.5 + 10
    assert traj.metadata["fault"]["kind"] == "tool_timeout"
    deadline = time.monotonic() + TERM_GRACE + REAP_WAIT + 2
    while _server_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _server_pids(), "the hung server outlived its episode"


def _server_pids() -> list[int]:
    """Live processes of the plain test server started by this test process."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid() and PLAIN.encode() in cmdline:
            found.append(int(stat.parent.name))
    return found


# -- servers that keep state outside the session --------------------------------------------------------------
def test_each_episode_gets_its_own_state_folder(tmp_path: Path) -> None:
    """``{episode_dir}`` in the command or in ``env``: concurrent episodes never see each other's files,
    and the folder goes when the episode's server does."""
    by_arg = mcp_domain(ServerSpec(command=(PY, PLAIN, "--state-dir", "{episode_dir}"), cwd=str(tmp_path)),
                        name="notes", read_only=["note_list", "echo", "pid"])
    by_env = dataclasses.replace(by_arg, server=ServerSpec(command=(PY, PLAIN), env={"PLAIN_STATE": "{episode_dir}"},
                                                           cwd=str(tmp_path)))
    task = _note_task(by_arg.name)
    a, b, c = by_arg.env(task), by_arg.env(task), by_env.env(task)
    assert a.call("note_add", {"text": "milk"}).ok and c.call("note_add", {"text": "eggs"}).ok
    assert b.call("note_list", {}).output == ""
    assert a.call("note_list", {}).output == "milk\n" and c.call("note_list", {}).output == "eggs\n"
    folders = [e.session.episode_dir for e in (a, b, c)]
    assert len(set(folders)) == 3 and all(f and Path(f, "pids").exists() for f in folders)
    for env in (a, b, c):
        env.close()
    assert not any(Path(f).exists() for f in folders)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())  # nothing shared was written where the servers ran


def test_divergence_from_the_local_replay_is_a_tool_fault(tmp_path: Path, retail: Domain) -> None:
    """A stateful server that shares its files between episodes: episode B sees episode A's cancellation,
    which muarl's local copy of retail does not have. B's own writes match gold, so the local hash alone
    would score 1.0; the differing answer marks a tool fault and the final state unavailable instead."""
    cancel = next(t for t in retail.tasks("test") if [a.name for a in t.gold_actions] == ["cancel_pending_order"])
    other = next(t for t in retail.tasks("test") if t.gold_actions and t.user_id != cancel.user_id
                 and all(a.name == "modify_user_address" for a in t.gold_actions))
    order = cancel.gold_actions[0].arguments["order_id"]
    shared = ServerSpec(command=(PY, PLAIN, "--retail", "--state-dir", str(tmp_path / "shared")))
    domain = mcp_domain(shared, base="retail", shared_state=True)  # shared on purpose (else refused, issue 33)
    assert not domain.muarl_server  # a third-party server: muarl grades its own replay

    first = domain.env(cancel)
    assert all(first.call(a.name, a.arguments).ok for a in cancel.gold_actions)
    first.close()

    def play(env: Any) -> tuple[Any, Trajectory]:
        look = env.call("get_order_details", {"order_id": order})
        for action in other.gold_actions:
            assert env.call(action.name, action.arguments).ok
        traj = Trajectory(task_id=other.id, domain=domain.name, tool_log=env.log)
        return look, traj

    env = domain.env(other)
    look, traj = play(env)
    assert json.loads(look.output)["status"] == "cancelled"  # the server's world, not the episode's
    assert look.error == "tool_fault" and traj.tool_fault
    assert env.hash().startswith("unavailable: the tool server's answer to get_order_details")
    reward = score(domain, other, traj, env=env, require_outputs=False)
    assert not reward.db_match and reward.reward == 0.0
    env.close()

    private = dataclasses.replace(domain, server=ServerSpec(command=(PY, PLAIN, "--retail", "--state-dir",
                                                                     "{episode_dir}")))
    env = private.env(other)  # the same episode on its own state folder: no divergence, full reward
    look, traj = play(env)
    assert json.loads(look.output)["status"] == "pending" and not traj.tool_fault
    assert score(private, other, traj, env=env, require_outputs=False).reward == 1.0
    env.close()


# -- the command line ---------------------------------------------------------------------------------------
def _rollout(domain: str, out: Path) -> list[str]:
    return ["rollout", "--domain", domain, "--split", "test", "--policy", "expert", "--user", "scripted",
            "--out", str(out)]


def test_cli_config_gives_tasks_read_only_and_a_call_timeout(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from muarl.cli import main

    save_tasks([_note_task("notes")], tmp_path / "tasks.json")
    config = tmp_path / "notes.json"
    config.write_text(json.dumps({"server": f"{PY} {PLAIN} --ignore-eof", "env": {"PLAIN_STATE": "{episode_dir}"},
                                  "name": "notes", "tasks": "tasks.json", "read_only": ["note_list", "echo", "pid"],
                                  "call_timeout": 2}))
    domain = get_domain(f"mcp:{config}")
    assert [t.id for t in domain.tasks("test")] == ["notes-0"] and domain.name == "notes"
    kinds = {t.name: t.spec.kind for t in domain.tools}
    assert (kinds["note_list"], kinds["note_add"], kinds["hang"]) == ("read", "write", "write")
    env = domain.env(domain.tasks("test")[0])
    start = time.monotonic()
    assert "did not answer hang within 2 s" in env.call("hang", {}).output
    assert time.monotonic() - start < 2.0 + 4.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"server": f"{PY} {PLAIN}", "tasks": "tasks.json", "tool_timeout": 3}))
    capsys.readouterr()  # the good config's note that it grades by the call log (no "state" reader)
    assert main(_rollout(f"mcp:{bad}", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown key(s) tool_timeout" in err and len(err.splitlines()) == 1


def test_cli_server_without_tasks_or_that_cannot_start_is_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Before: 0 episodes and exit 0 for a server without tasks; a raw traceback for a dead server."""
    from muarl.cli import main

    assert main(_rollout(f"mcp:{PY} {PLAIN} --state-dir {tmp_path}", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert "no tasks" in err and "--domain mcp:" in err and len(err.splitlines()) == 1
    save_tasks([_note_task("notes")], tmp_path / "tasks.json")
    config = tmp_path / "dead.json"
    config.write_text(json.dumps({"server": str(tmp_path / "no-such-server"), "tasks": "tasks.json"}))
    assert main(_rollout(f"mcp:{config}", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert "could not start" in err and "no-such-server" in err and len(err.splitlines()) == 1
    assert main(_rollout(f"mcp:retail@http://127.0.0.1:{free_port()}/mcp", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot list the tools of MCP server" in err and len(err.splitlines()) == 1


# -- a closed serve-mcp -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def closed_url() -> Iterator[str]:
    """``muarl serve-mcp retail --transport http`` with a control token and a bearer token."""
    with serve_http({"MUARL_MCP_CONTROL_TOKEN": CONTROL, "MUARL_MCP_AUTH_TOKEN": AUTH}) as url:
        yield url


def test_session_ids_are_issued_by_the_server_and_bound_to_their_connection(closed_url: str,
                                                                            retail: Domain) -> None:
    task = next(t for t in retail.tasks("test") if [a.name for a in t.gold_actions] == ["cancel_pending_order"])
    cancel = task.gold_actions[0]
    order = {"order_id": cancel.arguments["order_id"]}

    async def scenario() -> None:
        async with connect(closed_url, AUTH) as a, connect(closed_url, AUTH) as b:
            chosen = await a.call_tool("get_order_details", order, meta={"muarl/session": "my-own-id"})
            assert chosen.is_error and "unknown session id" in text(chosen)  # ids are not the client's to pick
            opened = await a.call_tool(cancel.name, cancel.arguments, meta={"muarl/session": "new"})
            assert not opened.is_error, text(opened)
            issued = (opened.meta or {})["muarl/session"]
            assert len(issued) >= 32
            mine = await a.call_tool("get_order_details", order, meta={"muarl/session": issued})
            assert json.loads(text(mine))["status"] == "cancelled"
            stolen = await b.call_tool("get_order_details", order, meta={"muarl/session": issued})
            assert stolen.is_error and "unknown session id" in text(stolen)  # bound to a's connection
            own = await b.call_tool("get_order_details", order)
            assert json.loads(text(own))["status"] == "pending"

    asyncio.run(scenario())


def test_agent_side_clients_cannot_see_or_use_the_control_tools(closed_url: str) -> None:
    async def scenario() -> None:
        async with connect(closed_url, AUTH) as agent:
            listed = {t.name for t in (await agent.list_tools()).tools}
            assert "get_order_details" in listed and not {n for n in listed if n.startswith("muarl_")}
            for name, args in (("muarl_state", {}), ("muarl_reset", {"context": {}})):
                refused = await agent.call_tool(name, args)
                assert refused.is_error and "unknown tool" in text(refused)
                assert (refused.meta or {}).get("muarl/error") == "unknown_tool"
            forged = await agent.call_tool("muarl_state", {}, meta={"muarl/control": "a guess"})
            assert forged.is_error
        async with connect(closed_url, AUTH) as controller:
            state = await controller.call_tool("muarl_state", {}, meta={"muarl/control": CONTROL})
            assert not state.is_error and json.loads(text(state))["domain"] == "retail"

    asyncio.run(scenario())


def test_user_tools_of_a_stdio_server_need_the_control_token() -> None:
    """An agent that starts ``muarl serve-mcp telecom`` itself cannot run the user's phone tools."""
    phone = {"context": get_domain("telecom").tasks("test")[0].context}  # the user's phone, as muarl's episodes set it
    source = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}  # this muarl's server
    agent = RemoteSession(ServerSpec(command=(PY, "-m", "muarl", "serve-mcp", "telecom"), env=source))
    controller = RemoteSession(ServerSpec.muarl("telecom"))
    try:
        assert not {t.name for t in agent.list_tools() if t.name.startswith("muarl_")}
        for name, args in (("muarl_reset", phone), ("muarl_user_tool", {"name": "check_status_bar", "arguments": {}})):
            refused = agent.call(name, args)
            assert not refused.ok and refused.error == "unknown_tool", refused
        assert controller.call("muarl_reset", phone, control=True).ok
        allowed = controller.call("muarl_user_tool", {"name": "check_status_bar", "arguments": {}}, control=True)
        assert allowed.ok, allowed.text
    finally:
        agent.close()
        controller.close()


def test_http_needs_the_bearer_token_and_muarl_still_grades_through_it(closed_url: str, retail: Domain) -> None:
    stranger = RemoteSession(ServerSpec(url=closed_url), connect_timeout=20)
    with pytest.raises(ConnectionError):
        stranger.list_tools()
    stranger.close()
    domain = mcp_domain(ServerSpec(url=closed_url, control_token=CONTROL, auth_token=AUTH), base="retail")
    assert domain.muarl_server  # muarl's client is the controller: the server's own hash decides
    task = next(t for t in retail.tasks("test") if [a.name for a in t.gold_actions] == ["cancel_pending_order"])
    env = domain.env(task)
    for action in task.gold_actions:
        assert env.call(action.name, action.arguments).ok
    traj = Trajectory(task_id=task.id, domain=domain.name, tool_log=env.log)
    assert score(domain, task, traj, env=env, require_outputs=False).reward == 1.0
    env.close()


def test_a_host_beyond_loopback_requires_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MUARL_MCP_AUTH_TOKEN"}
    try:
        done = subprocess.run([PY, "-m", "muarl", "serve-mcp", "retail", "--transport", "http", "--host", "0.0.0.0",
                               "--port", str(free_port())], capture_output=True, text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("serve-mcp listened on 0.0.0.0 without a token")
    assert done.returncode == 2
    assert "--host 0.0.0.0" in done.stderr and "bearer token" in done.stderr


# -- a server that dies after the agent's last call ---------------------------------------------------------------
class _KillsItsServer(Policy):
    """The scripted expert, whose session, when the episode ends (after the agent's last call, before the
    grading reads the state), kills every ``muarl serve-mcp`` process this test process started: the server
    dying between the last call and the grading, for real."""

    def __init__(self) -> None:
        from muarl.policies.expert import ExpertPolicy

        self.inner = ExpertPolicy()
        self.name = "expert-then-kill"

    def session(self, domain: Any, task: Task, seed: int | None = None) -> PolicySession:
        return _KillingSession(self.inner.session(domain, task, seed))


class _KillingSession(PolicySession):
    def __init__(self, inner: PolicySession):
        self.inner = inner

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        return await self.inner.next(new_messages)

    def close(self) -> dict[str, Any]:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if parent == os.getpid() and b"serve-mcp" in cmdline:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        return self.inner.close()


def test_a_server_that_dies_after_the_last_call_is_a_tool_fault() -> None:
    """``mcp:retail`` (muarl's own server over stdio, graded by its state): the expert plays the task right,
    then the server is killed before the state is read. The episode is a tool fault (masked in training,
    counted in the tool fault rate), not the agent's failure; the same episode with the server alive scores 1."""
    from muarl.evaluate import summarize

    domain = get_domain("mcp:retail")
    task = next(t for t in domain.tasks("test") if t.gold_actions)
    from muarl.policies.expert import ExpertPolicy

    alive = asyncio.run(run_episode(domain, task, ExpertPolicy(), ScriptedUser(), seed=0))
    assert alive.reward is not None and alive.reward.reward == 1.0 and alive.fault_kind is None
    died = asyncio.run(run_episode(domain, task, _KillsItsServer(), ScriptedUser(), seed=0))
    assert [r.error for r in died.tool_log] == [r.error for r in alive.tool_log]  # every call went through
    assert died.fault_kind == "tool", died.metadata.get("fault")
    assert "final state could not be read" in died.metadata["fault"]["message"]
    metrics, _, _ = summarize([[alive, died]], {}, 2)
    assert metrics["tool_fault_rate"] == 0.5 and metrics["trials"] == 1  # left out of success, counted as a fault
