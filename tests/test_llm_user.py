"""LLMUser, ReplayUser, OpenAIPolicy and muarl.serve against real HTTP servers in real subprocesses.

Two servers: ``python -m muarl.serve --model smollm2`` (a real model, greedy, short replies) and
``tests/fault_server.py`` (scripted replies and failures: 500s, 429, timeouts, a non-JSON body), so the
client's real timeout, retry and parsing paths run, not mocks of them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from muarl.domain import Domain, get_domain
from muarl.endpoint import EndpointError
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.policies.openai import OpenAIPolicy
from muarl.rollout import EpisodeConfig, run_episode
from muarl.serve import parse_tool_calls, stop_server, wait_ready
from muarl.types import Message, Task, ToolCall, Trajectory
from muarl.users.base import STOP, SimulatorFault
from muarl.users.llm import AGENT_GREETING, LLMUser, parse_stop
from muarl.users.replay import ReplayUser, user_turns

TESTS = Path(__file__).parent


# -- helpers ------------------------------------------------------------------------------------------
def start_process(cmd: list[str], log: Path, timeout: float) -> tuple[subprocess.Popen, str]:
    """Start a server process and wait for its ``ready URL`` line (stderr goes to ``log``)."""
    err = log.open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=TESTS.parent)
    url = wait_ready(proc, timeout)
    if url is not None:
        return proc, url
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} did not become ready:\n{log.read_text()[-2000:]}")


def stop_process(proc: subprocess.Popen) -> None:
    stop_server(proc)


class FaultServer:
    """Client side of tests/fault_server.py: set the script, read back what was sent."""

    def __init__(self, root: str):
        self.root = root
        self.url = root + "/v1"

    def script(self, *actions: dict[str, Any], default: dict[str, Any] | None = None) -> None:
        body = json.dumps({"actions": list(actions), "default": default or {"content": "OK"}}).encode()
        req = urllib.request.Request(self.root + "/_script", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def requests(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.root + "/_requests", timeout=5) as resp:
            return json.loads(resp.read())["requests"]


class StepPolicy(Policy):
    """A fixed agent: each step is a sentence for the user or a tool call; then it says goodbye forever."""

    name = "steps"

    def __init__(self, steps: list[str | ToolCall]):
        self.steps = steps

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return StepSession(list(self.steps))


class StepSession(PolicySession):
    def __init__(self, steps: list[str | ToolCall]):
        self.steps = steps

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        step = self.steps.pop(0) if self.steps else "Thank you for contacting us. Goodbye!"
        if isinstance(step, ToolCall):
            return AgentTurn(Message(role="assistant", tool_calls=[step]))
        return AgentTurn(Message(role="assistant", content=step))


def episode(domain: Domain, task: Task, policy: Policy, user: Any, seed: int = 0, max_turns: int = 10) -> Trajectory:
    return asyncio.run(run_episode(domain, task, policy, user, seed=seed, config=EpisodeConfig(max_turns=max_turns)))


def fast_user(fault: FaultServer, **kw: Any) -> LLMUser:
    opts: dict[str, Any] = {"timeout": 2.0, "max_retries": 3, "backoff": 0.01}
    opts.update(kw)
    return LLMUser(fault.url, "fault", **opts)


# -- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    log = tmp_path_factory.mktemp("fault") / "stderr.log"
    proc, root = start_process([sys.executable, str(TESTS / "fault_server.py"), "--port", "0"], log, 30)
    try:
        yield FaultServer(root)
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("serve")
    requests = tmp / "requests.jsonl"
    cmd = [sys.executable, "-m", "muarl.serve", "--model", "smollm2", "--host", "127.0.0.1", "--port", "0",
           "--device", "cpu", "--threads", "1", "--log-requests", str(requests)]
    proc, url = start_process(cmd, tmp / "stderr.log", 180)
    try:
        yield url, requests
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def telecom() -> Domain:
    return get_domain("telecom")


# -- (a) a real model behind muarl.serve ----------------------------------------------------------------
@pytest.mark.slow
def test_llm_user_episodes_against_smollm2(smol: tuple[str, Path], retail: Domain) -> None:
    url, log = smol
    task = retail.tasks("test")[1]
    secret_call = ToolCall(id="call_secret_42", name="get_user_details", arguments={"user_id": task.user_id})
    policy = StepPolicy([secret_call, "Hello! Could you tell me your email address so I can find your account?"])
    user = LLMUser(url, "smollm2", max_tokens=48, timeout=120, max_retries=1)
    log.write_text("")
    # per episode: the opening, the agent's silent lookup, one reply to the agent's question (turn limit 2)
    trajs = [episode(retail, task, policy, user, seed=seed, max_turns=2) for seed in (0, 1)]
    bodies = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(bodies) == sum(sum(m.role == "user" for m in t.messages) for t in trajs)

    for traj in trajs:
        assert not traj.sim_fault and traj.reward is not None  # scored
        assert traj.stop_reason in {"max_turns", "user_stop", "user_transfer", "user_out_of_scope"}
        users = [m.content for m in traj.messages if m.role == "user"]
        assert users and all(text.strip() for text in users)
        assert traj.tool_log[0].name == "get_user_details" and traj.tool_log[0].ok

    # what the simulator was sent: flipped roles, only the agent's words, never its tools
    for traj, seed in zip(trajs, (0, 1), strict=True):
        sent = [b for b in bodies if b["seed"] == seed]
        last = sent[-1]["messages"]
        assert last[0]["role"] == "system" and task.instruction in last[0]["content"]
        assert last[1] == {"role": "user", "content": AGENT_GREETING}
        agent_texts = [m.content for m in traj.messages if m.role == "assistant" and not m.tool_calls]
        user_texts = [m.content for m in traj.messages if m.role == "user"]
        assert [m["content"] for m in last[2:] if m["role"] == "user"] == agent_texts[: len(sent) - 1]
        assert [m["role"] for m in last[1:]] == ["user", "assistant"] * (len(sent) - 1) + ["user"]
        for said, shown in zip([m["content"] for m in last if m["role"] == "assistant"], user_texts, strict=False):
            assert parse_stop(said)[0] == shown
        for body in sent:
            dumped = json.dumps(body)
            assert "tools" not in body and all(m["role"] != "tool" for m in body["messages"])
            assert "call_secret_42" not in dumped and "get_user_details" not in dumped
            assert traj.tool_log[0].output not in dumped
            assert body["temperature"] == 0.0 and body["max_tokens"] == 48


@pytest.mark.slow
def test_openai_policy_against_smollm2(smol: tuple[str, Path], retail: Domain) -> None:
    url, log = smol
    task = retail.tasks("test")[2]
    policy = OpenAIPolicy(url, "smollm2", max_tokens=24, timeout=120, max_retries=1, seed=3)
    user = LLMUser(url, "smollm2", max_tokens=32, timeout=120, max_retries=1)
    log.write_text("")
    traj = episode(retail, task, policy, user, seed=5, max_turns=2)
    assert traj.reward is not None and not traj.sim_fault
    assert traj.messages[0].role == "system" and traj.messages[2].role == "assistant"
    agent_bodies = [b for b in map(json.loads, log.read_text().splitlines()) if "tools" in b]
    assert agent_bodies, "the policy's requests carry the domain's tools"
    first = agent_bodies[0]
    assert {t["function"]["name"] for t in first["tools"]} == {t.name for t in retail.tools}
    assert first["messages"][0] == {"role": "system", "content": retail.policy}
    assert first["messages"][1]["role"] == "user" and first["seed"] == 3


@pytest.mark.slow
def test_serve_models_and_bad_requests(smol: tuple[str, Path]) -> None:
    url, _ = smol
    with urllib.request.urlopen(url + "/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "smollm2"
    for body, field in [(b"{nope", "not valid JSON"), (b'{"messages": []}', "messages"),
                        (b'{"messages": [{"role": "user", "content": "x"}], "stream": true}', "stream"),
                        (b'{"messages": [{"role": "robot", "content": "x"}]}', "role"),
                        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
                        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature")]:
        req = urllib.request.Request(url + "/chat/completions", body, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 400 and field in json.loads(info.value.read())["error"]["message"]


def test_serve_tool_call_parsing() -> None:
    text = ('Let me look.\n<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
            '<tool_call>{"name": "think", "arguments": {"thought": "x"</tool_call>')
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_order_details", "think"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"order_id": "#W1"}
    with pytest.raises(ValueError):  # broken JSON is passed on for the client to report, as OpenAI does
        json.loads(calls[1]["function"]["arguments"])
    assert parse_tool_calls("no calls here") == ("no calls here", [])


# -- (b) retries and faults ---------------------------------------------------------------------------
def test_retries_then_success(fault: FaultServer, retail: Domain) -> None:
    task = retail.tasks("test")[0]
    fault.script({"status": 500}, {"status": 500}, {"content": "Hi, I need to cancel an order."})
    reply = asyncio.run(fast_user(fault).session(task, 7).start())
    assert reply.text == "Hi, I need to cancel an order." and reply.stop is None
    assert reply.metadata["retries"] == 2
    sent = fault.requests()
    assert len(sent) == 3 and all(b["seed"] == 7 for b in sent)


def test_an_endpoint_used_by_one_event_loop_after_another_logs_nothing(fault: FaultServer,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A GRPO run plays each step in a new event loop with the same endpoint. The last loop's pooled
    connections must not be closed on the next loop when its client is collected (openai's own HTTP client
    does: 'Task exception was never retrieved ... Event loop is closed', 57 times in a 20-step run)."""
    import gc
    import random

    from muarl.endpoint import ChatEndpoint

    fault.script(default={"content": "Hello."})
    endpoint = ChatEndpoint(fault.url, "fault", timeout=5)

    async def step() -> None:
        await asyncio.gather(*[endpoint.complete(random.Random(i), messages=[{"role": "user", "content": "hi"}])
                               for i in range(8)])
        gc.collect()  # the previous loop's client, dropped by this loop's first request, is collected here

    with caplog.at_level("ERROR", logger="asyncio"):
        for _ in range(3):
            asyncio.run(step())
        gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


def test_timeout_and_429_are_retried(fault: FaultServer, retail: Domain) -> None:
    task = retail.tasks("test")[0]
    fault.script({"sleep": 2.0, "content": "too late"}, {"status": 429, "retry_after": 0}, {"content": "on time"})
    started = time.monotonic()
    reply = asyncio.run(fast_user(fault, timeout=0.4).session(task, 0).start())
    assert reply.text == "on time" and reply.metadata["retries"] == 2
    assert time.monotonic() - started < 2.0  # the slow request was abandoned, not waited for
    assert len(fault.requests()) == 3


def test_persistent_failure_raises_simulator_fault(fault: FaultServer, retail: Domain) -> None:
    task = retail.tasks("test")[0]
    fault.script(default={"status": 500, "message": "model crashed"})
    with pytest.raises(SimulatorFault) as info:
        asyncio.run(fast_user(fault, max_retries=2).session(task, 0).start())
    message = str(info.value)
    assert fault.url in message and "HTTP 500" in message and "after 2 retries" in message
    assert len(fault.requests()) == 3


@pytest.mark.parametrize(("action", "cause"), [
    ({"status": 400, "message": "bad prompt"}, "HTTP 400"),
    ({"status": 404}, "HTTP 404"),
    ({"malformed": True}, "malformed"),
    ({"content": ""}, "empty reply"),
])
def test_unretryable_failures_fault_at_once(fault: FaultServer, retail: Domain, action: dict, cause: str) -> None:
    fault.script(action, default={"content": "should never be reached"})
    with pytest.raises(SimulatorFault, match=cause) as info:
        asyncio.run(fast_user(fault).session(retail.tasks("test")[0], 0).start())
    assert fault.url.split("/v1")[0] in str(info.value)
    assert len(fault.requests()) == 1


def test_sim_fault_marks_the_episode(fault: FaultServer, retail: Domain) -> None:
    task = retail.tasks("test")[0]
    policy = StepPolicy(["How can I help?"])
    fault.script(default={"status": 503})
    traj = episode(retail, task, policy, fast_user(fault, max_retries=1))
    assert traj.sim_fault and traj.stop_reason == "sim_fault" and traj.reward is not None
    assert "HTTP 503" in traj.metadata["sim_fault"]
    # a fault in the middle of the conversation, after the agent has spoken
    fault.script({"content": "I want to cancel my order."}, default={"sleep": 1.0})
    traj = episode(retail, task, policy, fast_user(fault, timeout=0.2, max_retries=1))
    assert traj.sim_fault and traj.stop_reason == "sim_fault"
    assert "timed out" in traj.metadata["sim_fault"] and [m.role for m in traj.messages] == ["system", "user", "assistant"]


# -- (c) stop markers and role flipping ---------------------------------------------------------------
def test_parse_stop() -> None:
    assert parse_stop(f"Thanks, bye! {STOP}") == ("Thanks, bye!", "stop")
    assert parse_stop("###TRANSFER###") == ("###TRANSFER###", "transfer")
    assert parse_stop("That is not what I asked. ###OUT-OF-SCOPE###") == ("That is not what I asked.", "out_of_scope")
    assert parse_stop("just text") == ("just text", None)
    assert parse_stop(f"{STOP} ###TRANSFER###")[1] == "stop"  # the first marker wins


@pytest.mark.parametrize(("last", "reason", "shown"), [
    (f"Perfect, thank you! {STOP}", "user_stop", "Perfect, thank you!"),
    ("###TRANSFER###", "user_transfer", "###TRANSFER###"),
    ("Okay. ###OUT-OF-SCOPE###", "user_out_of_scope", "Okay."),
])
def test_markers_end_the_episode_with_flipped_roles(fault: FaultServer, retail: Domain, last: str, reason: str,
                                                    shown: str) -> None:
    task = retail.tasks("test")[0]
    call = ToolCall(id="call_hidden_7", name="find_user_id_by_email", arguments={"email": "x@example.com"})
    policy = StepPolicy(["Can I have your email?", call, "I could not find it. Anything else?"])
    fault.script({"content": "Hello, I need help with an order."}, {"content": "Sure, it is x@example.com."},
                 {"content": last})
    traj = episode(retail, task, policy, fast_user(fault))
    assert traj.stop_reason == reason and traj.messages[-1].content == shown
    sent = fault.requests()
    assert len(sent) == 3
    assert [m["role"] for m in sent[2]["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in sent[2]["messages"][1:]] == [
        AGENT_GREETING, "Hello, I need help with an order.", "Can I have your email?", "Sure, it is x@example.com.",
        "I could not find it. Anything else?"]
    dumped = json.dumps(sent)
    assert "call_hidden_7" not in dumped and "find_user_id_by_email" not in dumped
    assert traj.tool_log[0].output not in dumped and "tools" not in sent[0]


def record_telecom(fault: FaultServer, telecom: Domain) -> tuple[Task, StepPolicy, Trajectory]:
    """A dual-control episode whose simulator uses its phone (once with broken JSON) before answering."""
    task = telecom.tasks("test")[0]
    policy = StepPolicy(["Please look at your status bar and tell me what it shows.",
                         "Please check your SIM status.", "Thanks. Anything else?"])
    fault.script(
        {"content": "My phone has no signal."},
        {"content": None, "tool_calls": [{"id": "u1", "name": "check_status_bar", "arguments": "{}"},
                                         {"id": "u2", "name": "toggle_airplane_mode", "arguments": "{oops"}]},
        {"content": "It shows no signal bars."},
        {"content": None, "tool_calls": [{"id": "u3", "name": "check_sim_status", "arguments": "{}"}]},
        {"content": "It asks me for a PUK code."},
        {"content": f"No, that's all. {STOP}"},
    )
    return task, policy, episode(telecom, task, policy, fast_user(fault))


def test_dual_control_user_tools(fault: FaultServer, telecom: Domain) -> None:
    task, policy, traj = record_telecom(fault, telecom)
    assert traj.stop_reason == "user_stop" and not traj.sim_fault
    user_records = [r for r in traj.tool_log if r.actor == "user"]
    assert [r.name for r in user_records] == ["check_status_bar", "check_sim_status"]  # the broken call never ran
    sent = fault.requests()
    assert "tools" not in sent[0]  # no device before the agent has spoken (start() has no act)
    assert {t["function"]["name"] for t in sent[1]["tools"]} == {t.name for t in telecom.user_tools}
    tool_msgs = [m for m in sent[2]["messages"] if m["role"] == "tool"]
    assert tool_msgs[0] == {"role": "tool", "tool_call_id": "u1", "content": user_records[0].output}
    assert tool_msgs[1]["tool_call_id"] == "u2" and "not valid JSON" in tool_msgs[1]["content"]
    assert traj.reward is not None


# -- (d) replay ---------------------------------------------------------------------------------------
def test_replay_user_reproduces_a_recording(fault: FaultServer, telecom: Domain) -> None:
    task, policy, recorded = record_telecom(fault, telecom)
    turns = user_turns(recorded)
    assert [[a.name for a in t.actions] for t in turns] == [[], ["check_status_bar"], ["check_sim_status"], []]
    fault.script(default={"status": 500})  # the replay must not touch the endpoint
    replayed = episode(telecom, task, policy, ReplayUser([recorded]))
    assert [m.model_dump() for m in replayed.messages] == [m.model_dump() for m in recorded.messages]
    strip = [r.model_dump(exclude={"call_id"}) for r in recorded.tool_log]
    assert [r.model_dump(exclude={"call_id"}) for r in replayed.tool_log] == strip
    assert replayed.stop_reason == recorded.stop_reason == "user_stop"
    assert replayed.reward == recorded.reward and fault.requests() == []
    # a chattier agent outlives the recording: the user stops when it runs out
    cut = recorded.model_copy(update={"stop_reason": "max_turns"})
    longer = episode(telecom, task, StepPolicy(["a", "b", "c", "d"]), ReplayUser(cut))
    assert longer.stop_reason == "user_stop" and sum(m.role == "user" for m in longer.messages) == 5
    with pytest.raises(KeyError, match="no recording"):
        ReplayUser(cut).session(telecom.tasks("test")[1], 0)


# -- (e) OpenAIPolicy ---------------------------------------------------------------------------------
def test_openai_policy_parse_errors_and_tool_results(fault: FaultServer, retail: Domain) -> None:
    task = retail.tasks("test")[0]
    policy = OpenAIPolicy(fault.url, "fault", timeout=2, max_retries=2, backoff=0.01)
    fault.script(
        {"content": "I want to cancel order #W4507103."},  # user opening
        {"status": 500},  # the policy's first try fails once
        {"content": "Let me check.", "tool_calls": [
            {"id": "bad", "name": "get_order_details", "arguments": "{\"order_id\": \"#W45"},
            {"id": "good", "name": "find_user_id_by_email", "arguments": "{\"email\": \"a@example.com\"}"}]},
        {"content": "I cannot cancel a delivered order."},  # policy
        {"content": f"Fine. {STOP}"},  # user
    )
    traj = episode(retail, task, policy, fast_user(fault))
    assert traj.stop_reason == "user_stop" and traj.malformed_calls == 1
    assert [c.name for c in traj.messages[2].tool_calls] == ["find_user_id_by_email"]
    assert [r.name for r in traj.tool_log] == ["find_user_id_by_email"]
    sent = fault.requests()
    first, second = sent[2], sent[3]
    assert {t["function"]["name"] for t in first["tools"]} == {t.name for t in retail.tools}
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    answers = {m["tool_call_id"]: m["content"] for m in second["messages"] if m["role"] == "tool"}
    assert set(answers) == {"bad", "good"} and "malformed tool call" in answers["bad"]
    assert second["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{\"order_id\": \"#W45"


def test_openai_policy_endpoint_failure_names_the_endpoint(fault: FaultServer, retail: Domain) -> None:
    policy = OpenAIPolicy(fault.url, "fault", timeout=2, max_retries=1, backoff=0.01)
    session = policy.session(retail, retail.tasks("test")[0])
    fault.script(default={"status": 502})
    with pytest.raises(EndpointError, match="failed after 1 retries: HTTP 502") as info:
        asyncio.run(session.next([Message(role="system", content="p"), Message(role="user", content="hi")]))
    assert fault.url in str(info.value) and info.value.retries == 1


# -- muarl.serve generates concurrent requests together --------------------------------------------------------
#: user turns of different lengths, the way an LLM user's requests arrive during a GRPO step
USER_TURNS = ["Hi, I need to cancel an order.", "My email is ana@example.com.", "Yes, please go ahead.",
              "Why was I charged twice for one order?", "Can you change my address to 12 Elm Street?",
              "No, that is all, thank you.", "I want to return the blue lamp I bought last week.",
              "Which payment methods do I have on file?"]


async def _complete(url: str, bodies: list[dict[str, Any]], together: bool) -> list[dict[str, Any]]:
    import httpx2 as httpx  # the MCP SDK's HTTP client, installed with muarl

    async with httpx.AsyncClient(timeout=300) as client:
        async def one(body: dict[str, Any]) -> dict[str, Any]:
            reply = await client.post(f"{url}/chat/completions", json=body)
            return {"status": reply.status_code, **reply.json()}

        if together:
            return list(await asyncio.gather(*map(one, bodies)))
        return [await one(body) for body in bodies]


@pytest.mark.slow
def test_concurrent_requests_are_generated_together_with_the_replies_they_get_alone(
        smol: tuple[str, Path]) -> None:
    """Eight greedy user turns sent at once (one decode batch of muarl's engine) get, token for token, the
    replies each gets sent alone. A seeded sampled reply is the same each time it is sent the same way (a
    batch's matmuls round differently from one row's, so a draw within rounding of a token's boundary
    can differ between batched and alone: measured, 1 of 8 such replies here)."""
    url, _ = smol
    greedy = [{"model": "smollm2", "messages": [{"role": "system", "content": "You are a customer."},
                                                {"role": "user", "content": turn}],
               "temperature": 0.0, "max_tokens": 24} for turn in USER_TURNS]
    sampled = [{**body, "temperature": 0.9, "seed": n} for n, body in enumerate(greedy)]

    def said(replies: list[dict[str, Any]]) -> list[tuple[str, int]]:
        assert all(r["status"] == 200 for r in replies)
        return [(r["choices"][0]["message"]["content"], r["usage"]["completion_tokens"]) for r in replies]

    alone = said(asyncio.run(_complete(url, greedy, together=False)))
    assert alone == said(asyncio.run(_complete(url, greedy, together=True)))
    assert len(set(alone)) > 1 and all(tokens > 0 for _, tokens in alone)
    once, twice = (said(asyncio.run(_complete(url, sampled[:4], together=False))) for _ in range(2))
    assert once == twice and once != alone[:4]


@pytest.mark.slow
def test_a_conversations_next_turn_prefills_only_what_it_adds() -> None:
    """The server keeps a finished request's KV cache (muarl.prefix_store): a conversation's second turn (its
    first request, the reply it got, and one more message, re-rendered whole by the client as an LLM user
    does) prefills only the tokens after the shared prefix, and gets the greedy reply a server without the
    store gives. A budget of 0 keeps nothing."""
    from muarl.models import load
    from muarl.serve import BatchedServing, Generator, GenRequest

    model, tokenizer = load("smollm2", device="cpu")
    generator = Generator(model, tokenizer, "smollm2")
    first = [{"role": "system", "content": "You are a customer. You want to cancel order #W123 because it is no "
                                           "longer needed; you are Ana Lee, zip 92130."},
             {"role": "user", "content": "Hi! How can I help you today?"}]

    async def conversation(server: BatchedServing) -> tuple[list[str], list[int]]:
        said, computed, history = [], [], list(first)
        for agent in ("Could you tell me your name and zip code?", "I can cancel #W123. Shall I go ahead?"):
            engine = server.engine(GenRequest(messages=history, temperature=0.0))
            before = engine.tokens_computed
            reply = await server.complete(GenRequest(messages=history, temperature=0.0, max_tokens=24))
            computed.append(engine.tokens_computed - before - reply["usage"]["completion_tokens"])
            said.append(reply["choices"][0]["message"]["content"])
            history += [{"role": "assistant", "content": said[-1]}, {"role": "user", "content": agent}]
        return said, computed

    kept, cold = BatchedServing(generator), BatchedServing(generator, prefix_cache_mib=0)
    said, computed = asyncio.run(conversation(kept))
    said_cold, computed_cold = asyncio.run(conversation(cold))
    assert said == said_cold and len(set(said)) == 2, (said, said_cold)
    assert kept.store.reused_tokens > 40 and cold.store.reused_tokens == 0 and not cold.store.items
    assert computed[0] == computed_cold[0] and computed[1] < computed_cold[1] / 2, (computed, computed_cold)


@pytest.mark.slow
def test_a_full_server_answers_503_at_once(tmp_path: Path) -> None:
    """--max-batch 1 --max-queue 1: of six requests sent at once, two are served and the rest get 503 with
    the reason, not a wait."""
    cmd = [sys.executable, "-m", "muarl.serve", "--model", "tiny", "--port", "0", "--device", "cpu",
           "--max-batch", "1", "--max-queue", "1"]
    proc, url = start_process(cmd, tmp_path / "stderr.log", 120)
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.0,
                "max_tokens": 64}
        replies = asyncio.run(_complete(url, [body] * 6, together=True))
    finally:
        stop_process(proc)
    busy = [r for r in replies if r["status"] == 503]
    assert sum(r["status"] == 200 for r in replies) >= 2 and busy, [r["status"] for r in replies]
    assert "--max-batch" in busy[0]["error"]["message"] and busy[0]["error"]["type"] == "server_busy"


@pytest.mark.slow
def test_user_llm_serves_smollm2_for_the_run_and_stops_it(tmp_path):
    """``--user llm`` with no URL (issue 42 item 3): ``muarl eval`` starts muarl's SmolLM2 server for the run
    from the working directory (relative ``--out``), plays against it, keeps its log in the run directory,
    records ``llm`` (not this run's port, so a resume starts its own) and stops the server at the end. The
    user that played is SmolLM2 (its opening is not the scripted user's for the same task and seed), each
    message within the default cap (``muarl.users.embedded.MAX_TOKENS``). A command that is not a muarl
    command's run (``make_user("llm")`` alone) is refused in one line."""
    import re
    import socket

    from transformers import AutoTokenizer

    from muarl.factory import make_user
    from muarl.models import smollm2_path
    from muarl.users.embedded import MAX_TOKENS, UserServerError

    def run(user: str, out: str) -> subprocess.CompletedProcess:
        return subprocess.run(["muarl", "eval", "--domain", "retail-lite", "--policy", "expert", "--user", user, "--k",
                               "1", "--limit", "1", "--max-turns", "2", "--out", out, "--quiet"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=900)

    def user_messages(out: str) -> list[str]:
        episode = json.loads((tmp_path / out / "trajectories.jsonl").read_text().splitlines()[0])
        return [m["content"] for m in episode["messages"] if m["role"] == "user"]

    done = run("llm", "run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert run("scripted", "scripted").returncode == 0
    said = user_messages("run")
    assert said and said[0] != user_messages("scripted")[0], said
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    assert all(len(tokenizer(text)["input_ids"]) <= MAX_TOKENS for text in said), said
    served = re.search(r"SmolLM2 served at http://127\.0\.0\.1:(\d+)/v1", done.stderr)
    assert served, done.stderr[-2000:]
    assert (tmp_path / "run" / "user-server.log").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["user"] == "llm"
    results = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]
    assert results["episodes"] == 1 and results["user_fault_rate"] == 0.0, results
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(served.group(1))), timeout=2):
        pass  # the server is gone with the run
    with pytest.raises(UserServerError, match="embedded user server"):
        make_user("llm")


def test_answering_a_question_or_proposal_made_again_the_same_way_is_not_an_ignored_reply() -> None:
    """An agent that could not find the account asks for the same facts again: the user repeating them word
    for word answers it (a user model did so in the pilot of research/llm-user-pilot.md, flagged before);
    repeating a message without the fact asked for is still an ignored reply. A wrong proposal made again and
    rejected or corrected again the same way is answered; a restatement the proposal did not touch is not."""
    from muarl.types import Message
    from muarl.users.slips import find_slips

    task = get_domain("retail-lite").tasks("test")[0]
    email = task.scenario.known["email"]
    ask, again = "Could you please tell me your email address?", "I could not find it. Could you tell me your email again?"

    def slips(first: str, second: str, asks: tuple[str, str] = (ask, again)) -> dict[str, list[int]]:
        said = [Message(role="system", content="policy"), Message(role="user", content="I need help with an order."),
                Message(role="assistant", content=asks[0]), Message(role="user", content=first),
                Message(role="assistant", content=asks[1]), Message(role="user", content=second)]
        return {k: v for k, v in find_slips(task, said, "max_turns").items() if v}

    assert slips(f"It is {email}.", f"It is {email}.") == {}
    proposals = ("I can cancel order #W1. Shall I proceed?", "Sorry, that failed. I can cancel #W1 again. Go ahead?")
    assert slips("Yes, please go ahead.", "Yes, please go ahead.", proposals) == {}
    assert slips("I want to return something.", "I want to return something.", proposals) == {"ignored_reply": [5]}
    # a wrong proposal made again, corrected again the same way (a bad agent's garbled proposals, answered by
    # the scripted user: 0.13-0.30 of its episodes were flagged): a no, or the right one of what it named
    order = task.scenario.known["order_id"]
    wrong = ("I can cancel order #W1000001. Shall I proceed?", "I can cancel order #W2000002 then. Shall I proceed?")
    assert slips(f"No, that's not right: it's about my order {order}.",
                 f"No, that's not right: it's about my order {order}.", wrong) == {}
    assert slips(f"The order id is {order}.", f"The order id is {order}.", wrong) == {}
    assert slips("No, that's not what I want.", "No, that's not what I want.", wrong) == {}
    # restating facts the proposal already had, or of a sort it did not name, answers nothing
    right = (f"I can cancel order {order}. Shall I proceed?", f"Sorry, that failed. Cancel {order} again? Go ahead?")
    assert slips(f"I want to cancel {order}.", f"I want to cancel {order}.", right) == {"ignored_reply": [5]}
    assert slips(f"My e-mail is {email}.", f"My e-mail is {email}.", wrong) == {"ignored_reply": [5]}
    assert slips("I want to return something.", "I want to return something.") == {
        "withheld_fact": [3, 5], "ignored_reply": [5]}


# -- what the LLM user got wrong, in the numbers (issue 42, item 2) ----------------------------------------------
def test_an_llm_users_slips_are_counted_in_the_summary_marked_on_the_turn_and_compared(
        fault: FaultServer, tmp_path: Path) -> None:
    """Five conversations with an LLM user whose endpoint says exactly what each slip is: an invented order
    id then a stop right after the agent's proposal; the goal in tool terms; the agent's question for the
    e-mail answered by repeating the opening (withheld and ignored at once); an opening in the agent's voice;
    and one clean conversation. Each is counted in the evaluation's metrics and per task (so ``muarl compare`` pairs it), written in
    results.md, and marked on its turn in the viewer's data; the clean one has no slip."""
    from muarl.compare import compare_runs
    from muarl.evaluate import EvalResult, summarize
    from muarl.report.data import lanes
    from muarl.users.slips import CANDIDATES, SLIPS

    domain = get_domain("retail-lite")
    task = domain.tasks("test")[0]
    email, order = task.scenario.known["email"], task.scenario.known["order_id"]
    assert "W0000001" not in task.instruction + json.dumps(task.scenario.known)  # an id the user never had
    ask = "Could you please tell me your email address?"
    cases = {
        "invents, then stops at the proposal": (
            ["Hi, I need help with my order #W0000001.", f"Never mind, bye. {STOP}"],
            ["I can look into order #W0000001. Shall I proceed?"], {"invented_fact": [1], "premature_stop": [3]}),
        "the goal in tool terms": (
            [f"Please run return_delivered_order_items on {order} for me.", f"It is {email}. {STOP}"],
            [ask], {"tool_terms": [1]}),
        "withholds, ignores": (
            ["I want to return something.", "I want to return something.", f"Bye. {STOP}"],
            [ask, "I am sorry, I need your email first. Goodbye."], {"withheld_fact": [3], "ignored_reply": [3]}),
        "speaks as the agent": (["Hello! I'm a customer service agent. How can I help you today?", f"Thanks. {STOP}"],
                                ["I am the agent here. Goodbye."], {"as_agent": [1]}),
        "clean": ([f"Hi, I want to return the keyboard from order {order}.", f"Sure, it is {email}. {STOP}"],
                  [ask], {}),
    }
    groups = []
    for name, (says, agent, want) in cases.items():
        fault.script(*({"content": text} for text in says))
        traj = episode(domain, task, StepPolicy(agent), fast_user(fault))
        traj.task_id = name  # one task per case, so that each is its own row
        assert traj.stop_reason == "user_stop", (name, traj.stop_reason)
        assert {k: v for k, v in traj.metadata["user_slips"].items() if v} == want, (name, traj.messages)
        groups.append([traj])
    metrics, rows, families = summarize(groups, {}, 1)
    # the user's slips count the kinds the labels show precise; a candidate kind counts apart (issue 57 item 2)
    slipped = sum(any(k not in CANDIDATES for k in want) for *_, want in cases.values()) / len(cases)
    candidate = sum(any(k in CANDIDATES for k in want) for *_, want in cases.values()) / len(cases)
    assert (metrics["user_slip_rate"], metrics["user_candidate_slip_rate"]) == (slipped, candidate)
    for kind in SLIPS:
        assert metrics[f"user_{kind}_rate"] == 0.2, kind
    result = EvalResult({"domain": domain.name, "split": "test", "k": 1}, metrics, rows, groups, families)
    result.write(tmp_path / "slips")
    written = json.loads((tmp_path / "slips" / "results.json").read_text())
    assert written["metrics"]["user_premature_stop_rate"] == 0.2
    assert "## The simulated user's slips" in (tmp_path / "slips" / "results.md").read_text()
    marked = [e for e in lanes(groups[2][0]) if e.get("slips")]
    assert [(e["text"], e["slips"]) for e in marked] == [("I want to return something.",
                                                         ["withheld_fact", "ignored_reply"])]
    clean_rows = [{**r, "user_slip_rate": 0.0} for r in rows]
    clean = EvalResult(result.config, {**metrics, "user_slip_rate": 0.0}, clean_rows, groups, families)
    report = compare_runs(clean, result)
    slip = next(m for m in report["metrics"] if m["metric"] == "user_slip_rate")
    assert (slip["a"], slip["b"], slip["diff"]) == (0.0, slipped, slipped)
