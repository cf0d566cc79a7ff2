"""Issue 20, per-episode isolation and time limits: a broken user, policy or tool costs one episode, never the run.

Each test drives the real episode loop (and, where it says so, ``muarl`` itself or a real OpenAI-compatible
server process, ``tests/fault_server.py``) with a party that raises, returns something malformed or never
answers, and checks that the episode is recorded as a fault of the right kind while the others play on,
are saved and are scored as if nothing had happened. Time limits are small so the suite runs in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from muarl.cli import main
from muarl.domain import Domain, get_domain
from muarl.evaluate import EvalResult, evaluate
from muarl.faults import AllEpisodesFaulted
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.policies.expert import ExpertPolicy
from muarl.rollout import EpisodeConfig, run_episode, user_seed
from muarl.types import Message, Task, ToolCall, Trajectory
from muarl.users.base import STOP, Act, UserReply, UserSession, UserSimulator
from muarl.users.llm import LLMUser
from muarl.users.scripted import ScriptedUser
from test_llm_user import FaultServer, StepPolicy, StepSession, start_process, stop_process
from test_viewer_browser import browser  # noqa: F401  (the fixture)

TESTS = Path(__file__).parent


# -- parties that misbehave -------------------------------------------------------------------------------
def fixed(*said: str | ToolCall) -> StepPolicy:
    """A fixed agent: each step is a sentence for the user or a tool call, then goodbye forever."""
    return StepPolicy(list(said))


class HalfExpert(Policy):
    """The expert on the tasks in ``solved``, a silent goodbye on the others: rewards of both kinds."""

    name = "half-expert"

    def __init__(self, solved: set[str]):
        self.solved, self.expert = solved, ExpertPolicy()

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return self.expert.session(domain, task, seed) if task.id in self.solved else StepSession([])


class Broken(Policy):
    """A policy that breaks in one of several ways (after ``good`` sound turns)."""

    name = "broken"

    def __init__(self, how: str, good: int = 1):
        self.how, self.good = how, good

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        if self.how == "session":
            raise RuntimeError("no GPU left for a new episode")
        return BrokenSession(self.how, self.good)


class BrokenSession(PolicySession):
    def __init__(self, how: str, good: int):
        self.how, self.good = how, good

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        if self.good > 0:
            self.good -= 1
            return AgentTurn(Message(role="assistant", content="Could you tell me your email address?"))
        if self.how == "raise":
            raise ConnectionError("the policy backend went away")
        if self.how == "hang":
            await asyncio.Event().wait()
        if self.how == "none":
            return None  # type: ignore[return-value]
        return AgentTurn(Message(role="assistant", content="Goodbye!"))

    def close(self) -> dict[str, Any]:
        if self.how == "close":
            raise RuntimeError("could not free the KV cache")
        return {}


class Scripted(UserSimulator):
    """ScriptedUser, except that the sessions named in ``plan`` (by (task id, seed)) misbehave at a turn."""

    name = "planned"

    def __init__(self, plan: dict[tuple[str, int], str] | None = None, every: str | None = None,
                 inner: UserSimulator | None = None):
        self.plan, self.every, self.inner = plan or {}, every, inner or ScriptedUser()

    def for_domain(self, domain: Domain) -> UserSimulator:
        return Scripted(self.plan, self.every, self.inner.for_domain(domain))

    def session(self, task: Task, seed: int) -> UserSession:
        return Misbehaving(self.inner.session(task, seed), self.plan.get((task.id, seed), self.every))


class Misbehaving(UserSession):
    def __init__(self, inner: UserSession, how: str | None):
        self.inner, self.how = inner, how

    async def start(self) -> UserReply:
        if self.how == "start_raises":
            raise KeyError("persona")
        return await self.inner.start()

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        how = self.how
        if how == "raise":
            raise ValueError("the user's own code broke")
        if how == "hang":
            await asyncio.Event().wait()
        if how == "text_none":
            return UserReply(text=None)  # type: ignore[arg-type]
        if how == "not_a_reply":
            return "fine, thanks"  # type: ignore[return-value]
        if how in ("empty", "blank"):
            return UserReply(text="" if how == "empty" else "  \n")
        if how == "bad_stop":
            return UserReply(text="bye", stop="done")  # type: ignore[arg-type]
        return await self.inner.reply(agent_text, act)


def play(domain: Domain, task: Task, policy: Policy, user: UserSimulator,
         config: EpisodeConfig | None = None) -> Trajectory:
    return asyncio.run(run_episode(domain, task, policy, user, seed=3, config=config or EpisodeConfig(max_turns=12)))


def fault(traj: Trajectory) -> dict[str, Any]:
    recorded = traj.metadata.get("fault")
    assert isinstance(recorded, dict), f"no fault recorded: {traj.stop_reason}, {traj.metadata}"
    return recorded


@pytest.fixture(scope="module")
def task(retail: Domain) -> Task:
    return retail.tasks("test")[0]


# -- user faults ------------------------------------------------------------------------------------------
def test_a_python_user_that_raises_faults_its_episode_with_the_traceback(retail: Domain, task: Task) -> None:
    traj = play(retail, task, ExpertPolicy(), Scripted(every="raise"))
    f = fault(traj)
    assert f["kind"] == "user" and "ValueError: the user's own code broke" in f["message"]
    assert "Traceback" in f["traceback"] and "ValueError" in f["traceback"]
    assert traj.sim_fault and traj.fault_kind == "user" and traj.stop_reason == "sim_fault"
    opening = play(retail, task, ExpertPolicy(), Scripted(every="start_raises"))
    assert fault(opening)["kind"] == "user" and "KeyError" in fault(opening)["message"] and not opening.messages


@pytest.mark.parametrize(("how", "says"), [
    ("text_none", "text=None, not a string"),
    ("not_a_reply", "returned str, not a UserReply"),
    ("empty", "empty text"),  # item 4: empty user text is a fault for every user, as for the LLM user
    ("blank", "empty text"),
    ("bad_stop", "stop='done'"),
])
def test_a_malformed_user_reply_is_a_user_fault(retail: Domain, task: Task, how: str, says: str) -> None:
    traj = play(retail, task, ExpertPolicy(), Scripted(every=how))
    f = fault(traj)
    assert f["kind"] == "user" and says in f["message"] and "Misbehaving.reply()" in f["message"]
    assert traj.sim_fault and all(m.content.strip() for m in traj.messages if m.role == "user")


def test_a_user_that_never_answers_is_a_user_timeout_not_a_hang(retail: Domain, task: Task) -> None:
    began = time.monotonic()
    traj = play(retail, task, ExpertPolicy(), Scripted(every="hang"), EpisodeConfig(user_timeout=0.3))
    assert time.monotonic() - began < 10
    f = fault(traj)
    assert f["kind"] == "user_timeout" and "--user-timeout limit of 0.3 s" in f["message"] and traj.sim_fault


def test_a_user_device_tool_that_fails_is_a_tool_fault_even_if_the_user_swallows_it(monkeypatch) -> None:
    telecom = get_domain("telecom")
    tool = telecom.user_tool_map["check_status_bar"]

    def broken(db: Any, **kwargs: Any) -> Any:
        raise OSError("the phone emulator crashed")

    monkeypatch.setattr(tool, "fn", broken)

    class Swallows(UserSession):
        async def start(self) -> UserReply:
            return UserReply("My phone has no service.")

        async def reply(self, agent_text: str, act: Act) -> UserReply:
            with contextlib.suppress(Exception):  # a careless user implementation
                await act("check_status_bar", {})
            return UserReply("It says no service.")

    class User(UserSimulator):
        def session(self, task: Task, seed: int) -> UserSession:
            return Swallows()

    traj = play(telecom, telecom.tasks("test")[0], fixed("Please check your status bar."), User())
    f = fault(traj)
    assert f["kind"] == "tool" and "check_status_bar" in f["message"] and "OSError" in f["traceback"]
    assert traj.stop_reason == "tool_fault" and not traj.sim_fault


# -- policy faults ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("how", "kind", "says"), [
    ("session", "policy", "creating the policy session raised RuntimeError: no GPU left"),
    ("raise", "policy", "BrokenSession.next() raised ConnectionError: the policy backend went away"),
    ("none", "policy", "returned NoneType, not an AgentTurn"),
    ("hang", "policy_timeout", "--agent-timeout limit of 0.3 s"),
    ("close", "policy", "BrokenSession.close() raised RuntimeError"),
])
def test_policy_session_faults(retail: Domain, task: Task, how: str, kind: str, says: str) -> None:
    traj = play(retail, task, Broken(how), ScriptedUser(), EpisodeConfig(agent_timeout=0.3))
    f = fault(traj)
    assert f["kind"] == kind and says in f["message"], f
    assert not traj.sim_fault and traj.fault_kind == kind
    if how != "close":
        assert traj.stop_reason == "policy_fault"


# -- tool faults ------------------------------------------------------------------------------------------
def test_a_tool_that_raises_is_a_tool_fault_with_its_traceback(retail: Domain, task: Task, monkeypatch) -> None:
    def broken(db: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("bug in the tool")

    monkeypatch.setattr(retail.agent_tools["get_user_details"], "fn", broken)
    call = ToolCall(id="c1", name="get_user_details", arguments={"user_id": task.user_id})
    traj = play(retail, task, fixed(call), ScriptedUser())
    f = fault(traj)
    assert f["kind"] == "tool" and "get_user_details" in f["message"] and "ZeroDivisionError" in f["traceback"]
    assert traj.stop_reason == "tool_fault" and traj.tool_log[-1].error == "internal"


def test_a_hung_sync_tool_times_out_and_its_thread_is_abandoned(retail: Domain, task: Task, monkeypatch) -> None:
    release = threading.Event()

    def hangs(db: Any, **kwargs: Any) -> Any:
        release.wait(60)
        return "too late"

    monkeypatch.setattr(retail.agent_tools["get_user_details"], "fn", hangs)
    call = ToolCall(id="c1", name="get_user_details", arguments={"user_id": task.user_id})
    began = time.monotonic()
    try:
        traj = play(retail, task, fixed(call), ScriptedUser(), EpisodeConfig(tool_timeout=0.5))
    finally:
        release.set()
    assert time.monotonic() - began < 10
    f = fault(traj)
    assert f["kind"] == "tool_timeout" and "--tool-timeout limit of 0.5 s" in f["message"]
    assert "abandoned" in f["message"] and traj.reward is None  # never graded while a thread may still write


def test_a_tool_exception_under_evaluate_is_not_chained_to_the_event_loop_check(
        retail: Domain, task: Task, monkeypatch, caplog) -> None:
    """Issue 20 item 9: the tool's traceback used to end in 'During handling ... no running event loop'."""
    def broken(db: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("bug in the tool")

    monkeypatch.setattr(retail.agent_tools["get_user_details"], "fn", broken)
    call = ToolCall(id="c1", name="get_user_details", arguments={"user_id": task.user_id})
    with caplog.at_level(logging.WARNING, logger="muarl.env"):
        for limit in (None, 5.0):  # no tool limit: the call runs inline, on the evaluation's own stack
            config = EpisodeConfig()
            config.tool_timeout = limit
            with contextlib.suppress(AllEpisodesFaulted):  # the only episode is a tool fault
                evaluate(retail, fixed(call), ScriptedUser(), [task], k=1, config=config, progress=False)
    assert caplog.text.count("ZeroDivisionError: bug in the tool") >= 2
    assert "no running event loop" not in caplog.text and "During handling" not in caplog.text


def test_tool_errors_are_counted_in_the_results(retail: Domain, task: Task, tmp_path: Path) -> None:
    steps = fixed(ToolCall(id="c1", name="no_such_tool"),
                  ToolCall(id="c2", name="get_order_details", arguments={"order_id": "#W0000000"}),
                  ToolCall(id="c3", name="get_user_details", arguments={"user_id": task.user_id}))
    result = evaluate(retail, steps, ScriptedUser(), [task], k=2, out_dir=tmp_path, progress=False)
    m = result.metrics
    assert m["tool_errors"] == {"domain": 2, "unknown_tool": 2} and m["tool_error_rate"] == pytest.approx(4 / 6)
    report = (tmp_path / "results.md").read_text()
    assert "tool error rate" in report and "| unknown_tool | 2 |" in report


# -- the run goes on, and says what faulted -----------------------------------------------------------------
def test_64_episodes_a_quarter_raise_a_quarter_hang_the_rest_are_unchanged(retail: Domain, tmp_path: Path) -> None:
    """Issue 20's must-show: 16 tasks x 4 trials; trial 0 of every task has a user that raises, trial 1 one
    that never answers; trials 2 and 3 must be saved exactly as a run without the faulty users plays them."""
    tasks = retail.tasks("test")[:16]
    plan = {(t.id, user_seed(0, t.id, m)): how for t in tasks for m, how in ((0, "raise"), (1, "hang"))}
    config = EpisodeConfig(user_timeout=1.0)
    policy = HalfExpert({t.id for t in tasks[::2]})
    began = time.monotonic()
    faulty = evaluate(retail, policy, Scripted(plan), tasks, k=4, out_dir=tmp_path / "faulty", config=config,
                      progress=False)
    took = time.monotonic() - began
    clean = evaluate(retail, policy, Scripted(), tasks, k=4, out_dir=tmp_path / "clean", config=config,
                     progress=False)

    m = faulty.metrics
    assert m["episodes"] == 64 and m["trials"] == 32 and m["faults"] == {"user": 16, "user_timeout": 16}
    assert m["fault_rate"] == 0.5 and m["sim_fault_rate"] == 0.5 and took < 60
    saved = EvalResult.load(tmp_path / "faulty", trajectories=True).trajectories
    assert sum(map(len, saved)) == 64  # every episode saved, the faulted ones with their fault
    for got, want in zip(saved, clean.trajectories, strict=True):
        assert [t.fault_kind for t in got] == ["user", "user_timeout", None, None]
        assert "ValueError" in got[0].metadata["fault"]["traceback"]
        for a, b in zip(got[2:], want[2:], strict=True):
            assert a.reward == b.reward and a.messages == b.messages and a.tool_log == b.tool_log
    normal = [t.reward.reward for g in clean.trajectories for t in g[2:]]
    assert 0 < sum(normal) < len(normal)  # wins and losses alike are kept as they were
    assert m["accuracy"] == pytest.approx(sum(normal) / len(normal))
    assert all(r["trials"] == 2 and r["faults"] == 2 for r in faulty.tasks)
    report = (tmp_path / "faulty" / "results.md").read_text()
    assert "## Faults (left out of the metrics)" in report and "| user_timeout | 16 |" in report

    # muarl view shows them: by kind in the overview, and each one's message and traceback
    from muarl.report import data as rd
    from muarl.report.html import payload, render

    run = rd.load_run(tmp_path / "faulty")
    blob = payload(run, None, "")
    assert blob["overview"]["faults"] == {"user": 16, "user_timeout": 16}
    shown = [t["fault"] for t in blob["trajectories"] if t["fault"]]
    assert len(shown) == 32 and {f["kind"] for f in shown} == {"user", "user_timeout"}
    assert all(f["message"] for f in shown)
    page = render(run)
    assert "faults" in page and "faultPanel" in page


def test_a_run_in_which_every_episode_faults_fails_clearly(retail: Domain, tmp_path: Path) -> None:
    tasks = retail.tasks("test")[:3]
    with pytest.raises(AllEpisodesFaulted, match=r"every one of the 6 episodes faulted \(user 6\).*ValueError"):
        evaluate(retail, ExpertPolicy(), Scripted(every="raise"), tasks, k=2, out_dir=tmp_path, progress=False)
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 6  # saved all the same
    assert json.loads((tmp_path / "results.json").read_text())["metrics"]["accuracy"] is None


def test_grpo_trains_a_policy_fault_as_the_agents_failure(tmp_path: Path, monkeypatch) -> None:
    """A policy fault (here at close, after the episode's tokens were sampled) is neither a simulator nor an
    MCP tool fault: it is the agent's own failure, so GRPO does not mask it (issue 57). It trains, scored 0
    in its group's baseline, beside the clean episodes; nothing is masked."""
    from muarl.policies.hf import HFPolicy
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset

    made = []

    class Flaky(HFPolicy):
        def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
            session = super().session(domain, task, seed)
            made.append(session)
            if len(made) % 2:
                closing = session.close

                def close() -> dict[str, Any]:
                    closing()
                    raise RuntimeError("lost the episode's cache")

                session.close = close  # type: ignore[method-assign]
            return session

    monkeypatch.setattr("muarl.policies.hf.HFPolicy", Flaky)  # what muarl.train.samplers.HFSampler builds
    config = preset("tiny", out=str(tmp_path), steps=1, tasks_per_step=2, group_size=2, max_new_tokens=16,
                    max_turns=2, save_every=0)
    train_grpo(config, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    faulted = [r for r in rows if r["metadata"].get("fault")]
    assert len(rows) == 4 and len(faulted) == 2
    assert all(r["metadata"]["fault"]["kind"] == "policy" and not r["sim_fault"] for r in faulted)
    # all four are trained: no dynamic sampling, no truncation mask and no simulator fault here, so nothing
    # leaves the update; the policy faults as failures, whatever their final database
    assert all(sum(r["loss_mask"]) > 0 and r["metadata"]["trained"] is True for r in rows)
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["fault_rate"] == 0.5 and metrics["trained_sequences"] == 4
    assert metrics["masked_share"] == 0 and metrics["groups_too_small"] == 0


# -- a real OpenAI-compatible user server that stalls, fails and sends nothing ----------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    log = tmp_path_factory.mktemp("fault") / "stderr.log"
    proc, root = start_process([sys.executable, str(TESTS / "fault_server.py"), "--port", "0"], log, 30)
    try:
        yield FaultServer(root)
    finally:
        stop_process(proc)


def test_http_user_that_stalls_fails_or_sends_nothing_faults_only_its_episode(
        server: FaultServer, retail: Domain, tmp_path: Path) -> None:
    """Four episodes one after another against one server: a 30 s stall (cut by the 1 s user limit, though
    the HTTP timeout is 20 s), HTTP 500 after every retry, an empty completion, and a normal user."""
    tasks = retail.tasks("test")[:4]
    server.script({"sleep": 30}, {"status": 500}, {"status": 500}, {"content": ""},
                  {"content": "Hi, I need help with an order."}, default={"content": f"Thanks, that is all. {STOP}"})
    user = LLMUser(server.url, "fault", timeout=20, max_retries=1, backoff=0.01)
    began = time.monotonic()
    result = evaluate(retail, fixed("How can I help?"), user, tasks, k=1, out_dir=tmp_path, concurrency=1,
                      config=EpisodeConfig(user_timeout=1.0), progress=False)
    assert time.monotonic() - began < 15
    kinds = [g[0].fault_kind for g in result.trajectories]
    assert kinds == ["user_timeout", "user", "user", None]
    messages = [g[0].metadata["fault"]["message"] for g in result.trajectories[:3]]
    assert "--user-timeout limit of 1 s" in messages[0]
    assert "500" in messages[1] and "empty reply" in messages[2]
    ok = result.trajectories[3][0]
    assert ok.stop_reason == "user_stop" and ok.messages[1].content == "Hi, I need help with an order."
    assert result.metrics["faults"] == {"user": 2, "user_timeout": 1} and result.metrics["trials"] == 1


def test_eval_cli_limits_and_an_all_faulted_run(server: FaultServer, tmp_path: Path, capsys) -> None:
    """--user-timeout and --user-http-timeout reach the user; when every episode faults, exit 1 in one line.

    Each episode's first request stalls 3 s before answering; --user-http-timeout 0.5 gives up on it, and the
    retry meets an HTTP 400 (not retried): a user fault before any opening line (with the default HTTP
    timeout the stalled answer would have arrived and opened the conversation)."""
    server.script({"sleep": 3, "content": "late"}, {"sleep": 3, "content": "late"}, default={"status": 400})
    out = tmp_path / "run"
    code = main(["eval", "--domain", "retail", "--limit", "2", "--k", "1", "--quiet", "--out", str(out),
                 "--user", f"llm:{server.url}#fault", "--user-timeout", "10", "--user-http-timeout", "0.5",
                 "--user-max-tokens", "40"])
    assert {r.get("max_tokens") for r in server.requests()} == {40}  # --user-max-tokens reached every request
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "every one of the 2 episodes faulted (user 2)" in err and "400" in err
    assert json.loads((out / "results.json").read_text())["config"]["user_timeout"] == 10
    trajs = [Trajectory.model_validate_json(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [t.fault_kind for t in trajs] == ["user", "user"] and not any(t.messages for t in trajs)


def test_cli_options_are_checked_in_one_line_naming_the_option(tmp_path: Path, capsys) -> None:
    for argv, says in ((["rollout", "--domain", "retail", "--n", "-2"], "--n must be at least 1 (got -2)"),
                       (["rollout", "--domain", "retail", "--tool-timeout", "-1"], "--tool-timeout must be at least 0"),
                       (["eval", "--domain", "retail", "--agent-timeout", "-5"], "--agent-timeout must be at least 0"),
                       (["eval", "--domain", "retail", "--user", "llm:http://x/v1#m", "--user-http-timeout", "0"],
                        "--user-http-timeout must be above 0"),
                       (["rollout", "--domain", "retail", "--user", "llm:http://x/v1#m", "--user-max-tokens", "0"],
                        "--user-max-tokens must be at least 1 (got 0)"),
                       (["grpo", "--domain", "retail", "--user-max-tokens", "-3"],
                        "--user-max-tokens must be at least 1 (got -3)")):
        assert main([*argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
    from muarl.factory import make_user

    assert make_user("llm:http://127.0.0.1:9/v1#m", http_timeout=7.5).endpoint.timeout == 7.5


@pytest.mark.parametrize(("spec", "says"), [
    ("no_such_module_xyz:DOMAIN", "cannot import module 'no_such_module_xyz'"),
    ("muarl.domains.retail:DOMIAN", "module 'muarl.domains.retail' has no attribute 'DOMIAN' (its domains: DOMAIN)"),
])
def test_a_misspelt_domain_module_or_attribute_is_one_line(spec: str, says: str, tmp_path: Path, capsys) -> None:
    assert main(["rollout", "--domain", spec, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_grpo_and_synth_take_the_limits() -> None:
    from muarl.cli import build_parser
    from muarl.cli.grpo import grpo_config

    args = build_parser().parse_args(["grpo", "--out", "x", "--user-timeout", "5", "--tool-timeout", "0",
                                      "--agent-timeout", "9", "--user-http-timeout", "3", "--user-max-tokens", "64"])
    config = grpo_config(args).config
    episode = config.episode_config()
    assert (episode.user_timeout, episode.tool_timeout, episode.agent_timeout) == (5, None, 9)
    assert config.user_http_timeout == 3 and config.user_max_tokens == 64
    plain = grpo_config(build_parser().parse_args(["grpo", "--out", "x"])).config.episode_config()
    assert (plain.user_timeout, plain.tool_timeout, plain.agent_timeout) == (120, 60, 600)
    from muarl.cli.options import limit_kwargs
    from muarl.rollout import EpisodeConfig

    synth = EpisodeConfig(**limit_kwargs(build_parser().parse_args(["synth", "--out", "x", "--user-timeout", "2"])))
    assert synth.user_timeout == 2 and synth.tool_timeout == 60  # a limit left out: the default one


def test_gold_tau2_retail_warns_on_tau2s_own_failing_calls_but_passes(capsys) -> None:
    require(importlib.util.find_spec("tau2") is not None,
            "the tau2 extra is not installed (bash scripts/install.sh --dev)")
    assert main(["gold", "tau2:retail", "--split", "test", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["failures"] == [] and report["warnings"]
    assert all(w["domain"] == "tau2:retail" and w["failed_actions"] for w in report["warnings"])


@pytest.mark.slow
def test_muarl_view_shows_faults_in_chromium(browser, retail: Domain, tmp_path: Path) -> None:  # noqa: F811
    """The report of a run with faults, in a real browser: the fault filter, the badge, the message and the
    traceback of a faulted episode."""
    from selenium.webdriver.support.ui import Select

    from muarl.report import build_report
    from test_viewer_browser import _css, _no_console_errors, _open, _wait

    tasks = retail.tasks("test")[:2]
    plan = {(t.id, user_seed(0, t.id, 0)): "raise" for t in tasks}
    evaluate(retail, ExpertPolicy(), Scripted(plan), tasks, k=2, out_dir=tmp_path / "run", progress=False)
    _open(browser, build_report(tmp_path / "run", tmp_path / "report.html"))
    browser.find_element("css selector", 'nav a[data-tab="trajectories"]').click()
    _wait(lambda: _css(browser, "#traj-table tbody tr"))
    Select(browser.find_element("id", "f-fault")).select_by_value("user")
    _wait(lambda: len(_css(browser, "#traj-table tbody tr")) == 2)
    assert all("fault: user" in row.text for row in _css(browser, "#traj-table tbody tr"))
    _css(browser, "#traj-table tbody tr a.traj-link")[0].click()
    panel = _wait(lambda: [e for e in _css(browser, "#fault") if e.is_displayed()])[0]
    assert "fault: user" in panel.text and "ValueError: the user's own code broke" in panel.text
    panel.find_element("css selector", "summary").click()
    assert "Traceback" in panel.text
    _no_console_errors(browser)
