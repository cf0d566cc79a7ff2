"""MCP both ways, against real server subprocesses: muarl's own server over stdio and streamable HTTP, a
third-party server from PyPI (mcp-server-time), and a test server that crashes or hangs for real."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from conftest import play_tasks
from mcp_helpers import serve_http
from muarl.domain import Domain, get_domain
from muarl.gold import gold_score
from muarl.mcp import MCPDomain, ServerSpec, mcp_domain
from muarl.mcp.client import RemoteSession
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import gold_env, score
from muarl.rollout import run_episode
from muarl.types import Intent, Message, Scenario, Task, ToolCall, Trajectory
from muarl.users.scripted import ScriptedUser

FAULT_SERVER = str(Path(__file__).with_name("mcp_fault_server.py"))
#: the HTTP server's control token: muarl's client presents it to grade with the server's own state
CONTROL_TOKEN = "test-control-token-of-32-characters"
pytestmark = pytest.mark.slow  # real server processes; about 3 s of start-up each on 2 cores


def _round_trip_tasks(retail: Domain) -> list[Task]:
    """A read-only test task and two with writes of different kinds."""
    picked: dict[str, Task] = {}
    for task in retail.tasks("test"):
        first = task.gold_actions[0].name if task.gold_actions else "read only"
        picked.setdefault(first, task)
    kinds = ["read only"] + sorted(k for k in picked if k != "read only")
    return [picked[k] for k in kinds[:3]]


def _assert_same_episodes(over_mcp: list[Trajectory], local: list[Trajectory]) -> None:
    for remote, here in zip(over_mcp, local, strict=True):
        assert remote.reward is not None and remote.reward.reward == 1.0, remote.reward
        assert not remote.tool_fault
        assert [(r.name, r.arguments, r.output, r.ok) for r in remote.tool_log] == \
               [(r.name, r.arguments, r.output, r.ok) for r in here.tool_log]
        assert [r.changed for r in remote.tool_log] == [r.changed for r in here.tool_log]
        assert remote.messages == here.messages


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """``muarl serve-mcp retail --transport http`` on a free port, for the whole module (with a control token)."""
    with serve_http({"MUARL_MCP_CONTROL_TOKEN": CONTROL_TOKEN}) as url:
        yield url


@pytest.fixture(scope="module")
def http_retail(http_url: str) -> MCPDomain:
    return mcp_domain(ServerSpec(url=http_url, control_token=CONTROL_TOKEN), base="retail")


def test_stdio_round_trip_matches_in_process(retail: Domain) -> None:
    """The expert against the scripted user, tools over MCP (one server process per episode, 3 at once),
    gives the in-process run's tool outputs, messages and reward 1.0; the schemas listed are muarl's."""
    domain = mcp_domain(ServerSpec.muarl("retail"), base="retail")
    for proxy in domain.tools:  # names, descriptions and JSON schemas all came from the server's listing
        assert proxy.spec == retail.agent_tools[proxy.name].spec
    assert [t.name for t in domain.tools] == [t.name for t in retail.tools]
    tasks = _round_trip_tasks(retail)
    assert sum(bool(t.gold_actions) for t in tasks) == 2
    _assert_same_episodes(play_tasks(domain, tasks, concurrency=len(tasks)),
                          play_tasks(retail, tasks, concurrency=len(tasks)))


def test_http_lists_schemas_and_annotations(http_url: str, retail: Domain) -> None:
    session = RemoteSession(ServerSpec(url=http_url, control_token=CONTROL_TOKEN))  # a controller sees them all
    try:
        listed = {t.name: t for t in session.list_tools()}
    finally:
        session.close()
    for tool in retail.tools:
        remote = listed[tool.name]
        assert (remote.description, remote.input_schema) == (tool.spec.description, tool.spec.parameters)
        assert remote.read_only == (tool.spec.kind == "read")
    assert {n for n in listed if n.startswith("muarl_")} == {"muarl_state", "muarl_reset"}


def test_http_round_trip_matches_in_process(http_retail: MCPDomain, retail: Domain) -> None:
    tasks = _round_trip_tasks(retail)
    _assert_same_episodes(play_tasks(http_retail, tasks, concurrency=len(tasks)),
                          play_tasks(retail, tasks, concurrency=len(tasks)))


def test_http_sessions_are_isolated(http_retail: MCPDomain, retail: Domain) -> None:
    task = next(t for t in retail.tasks("test") if t.gold_actions
                and t.gold_actions[0].name == "cancel_pending_order")
    order = task.gold_actions[0].arguments["order_id"]
    writer, reader = http_retail.env(task), http_retail.env(task)
    before = json.loads(reader.call("get_order_details", {"order_id": order}).output)["status"]
    for action in task.gold_actions:
        assert writer.call(action.name, action.arguments).ok
    assert json.loads(writer.call("get_order_details", {"order_id": order}).output)["status"] == "cancelled"
    assert json.loads(reader.call("get_order_details", {"order_id": order}).output)["status"] == before == "pending"
    assert writer.hash() == gold_env(retail, task)[0].hash() != reader.hash() == retail.env(task).hash()
    writer.close()
    reader.close()


def test_reward_judges_the_servers_state(http_retail: MCPDomain, retail: Domain) -> None:
    """The final hash is the server's: a write the local shadow never saw makes the reward 0."""
    task = next(t for t in retail.tasks("test") if len(t.gold_actions) == 1
                and t.gold_actions[0].name == "cancel_pending_order")
    env = http_retail.env(task)
    for action in task.gold_actions:
        env.call(action.name, action.arguments)
    traj = Trajectory(task_id=task.id, domain=http_retail.name, tool_log=env.log)
    assert score(http_retail, task, traj, env=env, require_outputs=False).db_match
    user = task.user_id
    address = {"address1": "1 Elsewhere St", "address2": "", "city": "Nowhere", "state": "CA", "country": "USA",
               "zip": "00000"}
    assert env.session.call("modify_user_address", {"user_id": user, **address}).ok  # behind muarl's back
    assert env.hash() != env.shadow.db.hash()
    assert not score(http_retail, task, traj, env=env, require_outputs=False).db_match
    env.close()


def test_gold_over_mcp_needs_no_server(http_retail: MCPDomain, retail: Domain) -> None:
    """Gold actions replay on the local base database, so grading never opens a server session."""
    task = retail.tasks("test")[0]
    env = http_retail.env(task)
    for action in task.gold_actions:
        env.run(action)
    assert not env.session.opened
    assert gold_score(http_retail, task).reward.reward == 1.0


# -- a third-party server from PyPI -------------------------------------------------------------------------
class ConvertTimePolicy(Policy):
    """A scripted agent for the time server: convert, then tell the user the converted time."""

    name = "convert-time"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return _ConvertSession(task)


class _ConvertSession(PolicySession):
    def __init__(self, task: Task):
        self.task, self.step = task, 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.step += 1
        if self.step == 1:  # a lookup, a call the server rejects, then the conversion itself
            args = self.task.context["convert"]
            return AgentTurn(message=Message(role="assistant", tool_calls=[
                ToolCall(id="c0", name="get_current_time", arguments={"timezone": "Asia/Tokyo"}),
                ToolCall(id="c1", name="convert_time", arguments={**args, "source_timezone": "Mars/Olympus"}),
                ToolCall(id="c2", name="convert_time", arguments=args)]))
        if self.step == 2:
            result = json.loads([m.content for m in new_messages if m.role == "tool"][-1])
            when = datetime.fromisoformat(result["target"]["datetime"]).strftime("%H:%M")
            return AgentTurn(message=Message(role="assistant", content=f"It will be {when} in Tokyo."))
        return AgentTurn(message=Message(role="assistant", content="Glad to help. Goodbye!"))


def _time_task(domain: str) -> Task:
    ny = datetime.now(ZoneInfo("America/New_York")).replace(hour=14, minute=0, second=0, microsecond=0)
    expected = ny.astimezone(ZoneInfo("Asia/Tokyo")).strftime("%H:%M")
    question = "What time is it in Tokyo when it is 14:00 in New York?"
    return Task(id="time-0", domain=domain, split="test", family="convert", user_id="traveller",
                scenario=Scenario(persona="a traveller", intents=[Intent(description=question, question=question,
                                                                         answer=expected)]),
                instruction=question, required_outputs=[expected],
                context={"convert": {"source_timezone": "America/New_York", "time": "14:00",
                                     "target_timezone": "Asia/Tokyo"}})


def test_third_party_time_server_as_a_domain() -> None:
    """mcp-server-time (the reference server, from PyPI): list, call, bad call, one scored episode."""
    domain = mcp_domain("mcp-server-time --local-timezone UTC", name="time")
    tools = {t.name: t.spec for t in domain.tools}
    assert set(tools) == {"get_current_time", "convert_time"}
    assert {s.kind for s in tools.values()} == {"read"}  # the server annotates both readOnlyHint
    assert tools["convert_time"].parameters["required"] == ["source_timezone", "time", "target_timezone"]
    task = _time_task(domain.name)
    domain.fixed_tasks = [task]
    unknown = domain.env(task).call("launch_rocket", {})  # answered by muarl: the name is not listed
    assert unknown.error == "unknown_tool" and "convert_time, get_current_time" in unknown.output
    traj = asyncio.run(run_episode(domain, task, ConvertTimePolicy(), ScriptedUser(), seed=0))
    now, bad, good = traj.tool_log
    assert now.ok and json.loads(now.output)["timezone"] == "Asia/Tokyo"
    assert not bad.ok and bad.error == "domain" and bad.output.startswith("Error") and "Mars/Olympus" in bad.output
    assert good.ok and json.loads(good.output)["source"]["timezone"] == "America/New_York"
    assert traj.stop_reason == "user_stop", traj.messages
    assert traj.reward is not None and traj.reward.reward == 1.0 and traj.reward.outputs_ok
    assert not traj.tool_fault


# -- faults: a server that dies or hangs mid-episode ----------------------------------------------------------
class CallsPolicy(Policy):
    """Calls the given tools one per turn, then talks to the user (whatever the results were)."""

    name = "calls"

    def __init__(self, calls: list[str]):
        self.calls = calls

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return _CallsSession(list(self.calls))


class _CallsSession(PolicySession):
    def __init__(self, calls: list[str]):
        self.calls = calls

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        if self.calls:
            name = self.calls.pop(0)
            return AgentTurn(message=Message(role="assistant", tool_calls=[
                ToolCall(id=f"c{len(self.calls)}", name=name, arguments={"text": name})]))
        return AgentTurn(message=Message(role="assistant", content="Sorry, our systems are down. Goodbye!"))


def _fault_task(domain: str) -> Task:
    ask = "Please echo hello."
    return Task(id="fault-0", domain=domain, split="test", family="echo", user_id="u",
                scenario=Scenario(persona="a tester", intents=[Intent(description=ask, question=ask, answer="hello")]),
                instruction=ask)


@pytest.fixture(scope="module")
def faulty() -> MCPDomain:
    """A domain over the misbehaving test server (its tools listed once; each env starts its own process)."""
    return mcp_domain(ServerSpec(command=(sys.executable, FAULT_SERVER)), name="faulty")


def test_server_killed_between_calls_gives_a_tool_fault(faulty: MCPDomain) -> None:
    domain = faulty
    task = _fault_task(domain.name)
    env = domain.env(task)
    pid = int(env.call("pid", {}).output)
    os.kill(pid, signal.SIGKILL)  # a real crash of the server process, between two calls
    record = env.call("echo", {"text": "still there?"})
    assert not record.ok and record.error == "tool_fault" and record.output.startswith("Error: ")
    again = env.call("echo", {"text": "and now?"})  # the session's state is gone: fail fast, same mark
    assert again.error == "tool_fault"
    assert env.hash().startswith("unavailable")  # the final state is unknown, so it can match no gold
    env.close()


def test_server_crashing_mid_episode_ends_with_a_tool_fault_mark(faulty: MCPDomain) -> None:
    """The server exits inside a call; the episode goes on (error observations) and is scored."""
    domain = faulty
    task = _fault_task(domain.name)
    traj = asyncio.run(run_episode(domain, task, CallsPolicy(["echo", "crash", "echo"]), ScriptedUser(), seed=0))
    outputs = [(r.name, r.error) for r in traj.tool_log]
    assert outputs == [("echo", None), ("crash", "tool_fault"), ("echo", "tool_fault")]
    assert traj.tool_fault and traj.reward is not None and traj.reward.reward == 0.0
    crash_obs = [m.content for m in traj.messages if m.role == "tool"][1]
    assert crash_obs.startswith("Error: the tool server") and "crash" in crash_obs
    assert traj.stop_reason.startswith("user_")  # the conversation ended normally, after the fault
    assert Trajectory.model_validate_json(traj.model_dump_json()).tool_fault


def test_hanging_server_times_out_and_other_episodes_keep_going(faulty: MCPDomain) -> None:
    """A call that never returns becomes a timeout observation; episodes on healthy servers are not
    held up meanwhile, because the call is awaited, not blocked on."""
    domain = dataclasses.replace(faulty, call_timeout=4.0)
    task = _fault_task(domain.name)
    finished: dict[str, float] = {}

    async def one(label: str, calls: list[str]) -> Trajectory:
        traj = await run_episode(domain, task, CallsPolicy(calls), ScriptedUser(), seed=0)
        finished[label] = time.monotonic()
        return traj

    async def both() -> list[Trajectory]:
        return await asyncio.gather(one("hang", ["echo", "hang", "echo"]), one("fine", ["echo", "echo"]))

    start = time.monotonic()
    hung, fine = asyncio.run(both())
    assert [(r.name, r.error) for r in hung.tool_log] == [("echo", None), ("hang", "tool_fault"), ("echo", "tool_fault")]
    assert "did not answer hang within 4 s" in hung.tool_log[1].output
    assert hung.tool_fault and not fine.tool_fault and all(r.ok for r in fine.tool_log)
    assert finished["fine"] < finished["hang"] - 2.0  # the healthy episode did not wait for the timeout
    assert time.monotonic() - start < 4.0 + 40  # bounded by the timeout (plus server start-ups), not forever


def test_server_that_never_starts_is_a_tool_fault_too(faulty: MCPDomain) -> None:
    domain = dataclasses.replace(faulty, server=ServerSpec(command=(sys.executable, FAULT_SERVER, "--hang-on-start")),
                                 connect_timeout=3.0)
    env = domain.env(_fault_task(domain.name))
    record = env.call("echo", {"text": "hi"})
    assert record.error == "tool_fault" and "did not start within 3 s" in record.output
    env.close()


def test_cli_errors_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    from muarl.cli import main

    assert main(["serve-mcp", "no-such-domain"]) == 2
    assert "unknown domain 'no-such-domain'" in capsys.readouterr().err
    assert main(["mcp-tools", sys.executable + " -c 'import sys; sys.exit(1)'", "--timeout", "20"]) == 2
    assert "cannot reach MCP server" in capsys.readouterr().err



def test_mcp_domain_spec_runs_the_rollout_cli(http_url: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``--domain mcp:retail@URL`` is a domain like any other for every command (the control token from
    the environment, as a user of the command line gives it, bound to the server's URL)."""
    from muarl.cli import main

    monkeypatch.setenv("MUARL_MCP_CONTROL_TOKEN", CONTROL_TOKEN)
    monkeypatch.setenv("MUARL_MCP_URL", http_url)
    domain = get_domain(f"mcp:retail@{http_url}")
    assert isinstance(domain, MCPDomain) and domain.mirror is get_domain("retail") and len(domain.tools) == 16
    assert domain.muarl_server  # it graded with the server's own state
    out = tmp_path / "run"
    assert main(["rollout", "--domain", f"mcp:retail@{http_url}", "--split", "test", "--policy", "expert",
                 "--user", "scripted", "--limit", "3", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 3 and summary["success"] == 1.0
