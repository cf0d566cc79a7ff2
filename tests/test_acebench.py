"""The ACEBench agent bridge: ACEBench's data, evalscope's scenario classes and ACEBench's own checker.

Real components only: ACEBench's English agent data, the copy in ``tests/data/acebench/data_en`` (MIT, its
README says from where; ``$MUARL_ACEBENCH_DATA`` names another), which no test may write to, and the
``evalscope`` package. The full agreement study is ``scripts/acebench_agreement.py``; these tests run it on
samples.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import require, run_muarl

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("MUARL_ACEBENCH_DATA") or ROOT / "tests" / "data" / "acebench" / "data_en")
require((DATA / "data_agent_multi_turn.json").is_file(),
        f"ACEBench's data is not at {DATA} (set MUARL_ACEBENCH_DATA)")
require(importlib.util.find_spec("evalscope") is not None,
        "the acebench extra (evalscope) is not installed (bash scripts/install.sh --dev)")
os.environ["MUARL_ACEBENCH_DATA"] = str(DATA)

from muarl.bridges.acebench import (  # noqa: E402
    ACEBenchUser,
    DataError,
    acebench_judge,
    first_person,
    item_of,
)
from muarl.cli import build_parser  # noqa: E402
from muarl.domain import get_domain  # noqa: E402
from muarl.gold import gold_score  # noqa: E402
from muarl.policies.base import AgentTurn, Policy, PolicySession  # noqa: E402
from muarl.rollout import EpisodeConfig, RolloutEngine  # noqa: E402
from muarl.types import Message, ToolCall  # noqa: E402
from muarl.users.base import STOP  # noqa: E402
from muarl.users.llm import LLMUser  # noqa: E402
from muarl.users.replay import ReplayUser  # noqa: E402
from muarl.users.scripted import ScriptedUser  # noqa: E402

#: the items whose milestones do not reach their own ground truth (docs/bridges.md explains each)
REPAIRED = {"agent_multi_turn_6", "agent_multi_step_0", "agent_multi_step_1", "agent_multi_step_12",
            "agent_multi_step_13", "agent_multi_step_14", "agent_multi_step_15", "agent_multi_step_16",
            "agent_multi_step_17"}


def _digests(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True, scope="module")
def _data_left_as_it_was():
    """The data directory is only read: after the module's tests its files are the ones before them."""
    before = _digests(DATA)
    yield
    assert _digests(DATA) == before, f"a test changed ACEBench's data in {DATA}"


def _script():
    spec = importlib.util.spec_from_file_location("acebench_agreement", ROOT / "scripts" / "acebench_agreement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Caller(Policy):
    """An agent that calls the task's gold actions one message at a time, then says it is done."""

    name = "gold-caller"

    def session(self, domain, task, seed=None):
        return _CallerSession(list(task.gold_actions))


class _CallerSession(PolicySession):
    def __init__(self, actions):
        self.actions, self.i = actions, 0

    async def next(self, new_messages):
        if self.i < len(self.actions):
            a = self.actions[self.i]
            self.i += 1
            return AgentTurn(Message(role="assistant", tool_calls=[ToolCall(id=f"c{self.i}", name=a.name,
                                                                             arguments=a.arguments)]))
        return AgentTurn(Message(role="assistant", content="All done."))


def test_domains_carry_the_items_tools_policies_and_users():
    turn, step = get_domain("acebench:multi_turn"), get_domain("acebench:multi_step")
    assert len(turn.tasks("test")) == 30 and len(step.tasks("test")) == 20
    task = turn.task("agent_multi_turn_0")
    item = item_of(task)
    view = turn.for_task(task)
    assert [t.name for t in view.tools] == [f["name"] for f in item.functions]
    assert "Sending Text Messages" in view.policy and "[ApiName" not in view.policy
    assert "Booking Flights" in turn.for_task(turn.task("agent_multi_turn_20")).policy
    assert item.question in task.instruction and STOP in task.instruction  # ACEBench's user prompt
    assert "finish conversation" not in task.instruction
    assert step.task("agent_multi_step_3").instruction == item_of(step.task("agent_multi_step_3")).question
    kinds = {t.name: t.spec.kind for t in turn.tools}
    assert kinds["send_message"] == "write" and kinds["view_messages_between_users"] == "read"


def test_gold_reaches_the_ground_truth_on_every_item_for_both_judges():
    for category in ("multi_turn", "multi_step"):
        domain = get_domain(f"acebench:{category}")
        for task in domain.tasks():
            traj = gold_score(domain, task)
            assert traj.reward.reward == 1.0 and traj.reward.tcr == 1.0, (task.id, traj.reward.diff)
            assert all(r.ok for r in traj.tool_log), (task.id, [r.output for r in traj.tool_log if not r.ok])
            assert acebench_judge(task, traj)["acc"] == 1.0, task.id
    repaired = {t.id for c in ("multi_turn", "multi_step") for t in get_domain(f"acebench:{c}").tasks()
                if t.context["acebench"]["gold"] != "milestones"}
    assert repaired == REPAIRED


def test_raw_milestones_fail_the_same_items_for_both_judges():
    report, ok = _script().gold(["multi_turn", "multi_step"])
    assert ok
    turn, step = report["categories"]
    assert turn["raw_milestones"]["muarl_1"] == 29 and step["raw_milestones"]["muarl_1"] == 12
    for row in (turn, step):
        assert row["raw_milestones"]["reward_agree"] == row["raw_milestones"]["trajectories"]
        assert row["oracle"]["process_agree"] == row["oracle"]["trajectories"]


def test_perturbed_trajectories_agree_with_acebenchs_checker():
    report, ok = _script().perturb(["multi_turn", "multi_step"], 120, seed=5)
    assert ok, [r["reward_disagreements"] for r in report["categories"]]
    for row in report["categories"]:
        assert row["reward_agree"] == row["trajectories"] == 60
        assert 0 < row["muarl_1"] < 60  # the sample holds both passing and failing trajectories
        assert set(row["kinds"]) == {"drop", "repeat", "swap", "change_arg"}
        # where they differ, ACEBench compared milestone texts and muarl the calls: muarl is never lower
        assert row["process_muarl_higher"] == row["trajectories"] - row["process_agree"]


def test_perturbations_are_deterministic():
    script = _script()
    domain = get_domain("acebench:multi_step")
    pool = script._pools([domain])
    draws = [script.perturb_actions(random.Random(3), t, pool) for t in domain.tasks()[:8]]
    assert draws == [script.perturb_actions(random.Random(3), t, pool) for t in domain.tasks()[:8]]


def test_a_dropped_call_fails_and_lowers_the_process_score():
    domain = get_domain("acebench:multi_turn")
    task = domain.task("agent_multi_turn_12")
    traj = gold_score(domain, task, [a for a in task.gold_actions if a.name != "send_message"])
    assert traj.reward.reward == 0.0 and 0 < traj.reward.tcr < 1 and traj.reward.diff
    assert acebench_judge(task, traj)["acc"] == 0.0


def test_concurrent_episodes_do_not_share_state(tmp_path):
    domain = get_domain("acebench:multi_turn")
    tasks = [domain.task(i) for i in ("agent_multi_turn_0", "agent_multi_turn_12", "agent_multi_turn_22")]
    engine = RolloutEngine(domain, _Caller(), ScriptedUser(), EpisodeConfig(max_turns=40), group_size=6,
                           concurrency=18, progress=False)
    groups = asyncio.run(engine.run(tasks))
    for task, group in zip(tasks, groups, strict=True):
        assert len(group) == 6
        for traj in group:  # a shared inbox or booking table would be full or doubled by the second episode
            assert traj.reward.reward == 1.0, (task.id, traj.stop_reason, traj.reward.diff)
            assert traj.stop_reason == "user_stop"
    # threads: many episodes of one task at once, each on its own instances
    task = domain.task("agent_multi_turn_0")
    with ThreadPoolExecutor(8) as pool:
        trajs = list(pool.map(lambda _: gold_score(domain, task), range(16)))
    assert all(t.reward.reward == 1.0 for t in trajs)
    one, two = domain.env(task), domain.env(task)
    assert one.call("turn_on_wifi", {}).ok and one.call("delete_message", {"message_id": 3}).ok
    assert one.call("send_message", {"sender_name": "Grace", "receiver_name": "Frank", "message": "hi"}).ok
    sent = two.call("view_messages_between_users", {"sender_name": "Grace", "receiver_name": "Frank"})
    assert not sent.ok and "No related message" in sent.output  # two never saw one's message
    assert "3" in two.world.state()[1]["MessageApi"]["inbox"]


def test_multi_step_items_run_through_the_engine_with_the_data_user():
    domain = get_domain("acebench:multi_step")
    tasks = domain.tasks()[10:13]
    groups = asyncio.run(RolloutEngine(domain, _Caller(), ScriptedUser(), EpisodeConfig(40), progress=False).run(tasks))
    for task, (traj,) in zip(tasks, groups, strict=True):
        said = [m.content for m in traj.messages if m.role == "user"]
        assert said[0] == item_of(task).question and said[1:] == [STOP]
        assert traj.reward.reward == 1.0, (task.id, traj.reward.diff)


def test_tool_results_and_refusals_come_from_acebenchs_classes():
    domain = get_domain("acebench:multi_turn")
    env = domain.env(domain.task("agent_multi_turn_0"))  # Wi-Fi off at the start
    refused = env.call("send_message", {"sender_name": "Grace", "receiver_name": "Frank", "message": "x"})
    assert refused.error == "domain" and "Wi-Fi is turned off" in refused.output
    assert env.call("turn_on_wifi", {}).ok
    assert all(s[next(iter(s))]["wifi"] for s in env.world.state() if "wifi" in s[next(iter(s))])
    assert env.call("reserve_flight", {"user_id": "u", "password": "p", "flight_no": "x", "cabin": "c",
                                       "payment_method": "bank", "baggage_count": 1}).error == "domain"
    view = domain.for_task(domain.task("agent_multi_turn_0")).env(domain.task("agent_multi_turn_0"))
    assert view.call("reserve_flight", {}).error == "unknown_tool"
    assert env.call("send_message", {"sender_name": "Grace"}).error == "invalid_arguments"


def test_stand_in_user_is_derived_from_the_item():
    assert first_person("You are Grace. Your account is Grace. You will respond to the agent but will not "
                        "proactively provide any unsolicited information. You want to send 'Are you free?'.") \
        == "I am Grace. My account is Grace. I want to send 'Are you free?'."
    domain = get_domain("acebench:multi_turn")
    task = domain.task("agent_multi_turn_0")
    session = ACEBenchUser().session(task, 0)
    opening = asyncio.run(session.start()).text
    assert opening.startswith("My name is Grace.") and "'Are you free tomorrow to have lunch with me?'" in opening
    assert "oldest" in asyncio.run(session.reply("Memory is full, which message would you like to delete?", None)).text
    assert asyncio.run(session.reply("Shall I send it now?", None)).text.startswith("Yes")
    assert asyncio.run(session.reply("The message was sent.", None)).stop == "stop"
    step = get_domain("acebench:multi_step").task("agent_multi_step_4")
    plain = ACEBenchUser().session(step, 0)
    assert asyncio.run(plain.start()).text == item_of(step).question
    assert asyncio.run(plain.reply("Anything else?", None)).stop == "stop"


def test_llm_user_is_given_acebenchs_persona_prompt():
    task = get_domain("acebench:multi_turn").task("agent_multi_turn_20")
    session = LLMUser("http://127.0.0.1:9/v1", "user-model").session(task, 0)
    system = session.history[0]["content"]
    assert item_of(task).question in system and "Book a round-trip flight" in system and STOP in system


def test_replayed_users_play_acebench_tasks(tmp_path):
    domain = get_domain("acebench:multi_turn")
    tasks = [domain.task("agent_multi_turn_8"), domain.task("agent_multi_turn_26")]
    recorded = [g[0] for g in asyncio.run(RolloutEngine(domain, _Caller(), ScriptedUser(), EpisodeConfig(40),
                                                        progress=False).run(tasks))]
    engine = RolloutEngine(domain, _Caller(), ReplayUser(recorded), EpisodeConfig(max_turns=40), group_size=2,
                           progress=False, out=tmp_path / "trajectories.jsonl")
    for group in asyncio.run(engine.run(tasks)):
        assert all(t.reward.reward == 1.0 for t in group)
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 4


def test_missing_or_malformed_data_directory_is_one_clear_line(tmp_path):
    broken = tmp_path / "broken"
    (broken / "possible_answer").mkdir(parents=True)
    (broken / "data_agent_multi_turn.json").write_text('{"id": "agent_multi_turn_0", "question": \n')
    no_answers = tmp_path / "no_answers"
    no_answers.mkdir()
    (no_answers / "data_agent_multi_turn.json").write_text((DATA / "data_agent_multi_turn.json").read_text())
    cases = [(None, "MUARL_ACEBENCH_DATA"), (str(tmp_path / "nowhere"), "does not exist"),
             (str(broken), "line 1 is not valid JSON"), (str(no_answers), "is missing")]
    for data, what in cases:
        done = _muarl(tmp_path, "gold", "acebench:multi_turn", env_data=data, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("muarl: error: ") and what in lines[0], lines[0]
        if data is not None:
            assert Path(data).name in lines[0]


def _muarl(tmp_path: Path, *args: str, env_data: str | None = None,
           timeout: int = 300) -> subprocess.CompletedProcess:
    """``muarl ARGS`` in a fresh process, with ``$MUARL_ACEBENCH_DATA`` set to ``env_data`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "MUARL_ACEBENCH_DATA"}
    if env_data is not None:
        env["MUARL_ACEBENCH_DATA"] = env_data
    return run_muarl(*args, cwd=tmp_path, env=env, timeout=timeout)


def test_data_option_names_the_directory_over_the_variable(tmp_path):
    # --data alone is enough, and wins over a variable that names nothing usable
    for variable in (None, str(tmp_path / "nowhere")):
        done = _muarl(tmp_path, "gold", "acebench:multi_step", "--data", str(DATA), env_data=variable)
        assert done.returncode == 0 and "all gold trajectories score 1.0" in done.stdout, done.stderr
    # every command that takes a domain takes it: eval end to end, and its record names the data read
    out = tmp_path / "eval"
    done = _muarl(tmp_path, "eval", "--domain", "acebench:multi_step", "--data", str(DATA), "--limit", "2", "--k", "1",
                  "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "results.json").read_text())["provenance"]["domains"]["acebench:multi_step"]
    digest = hashlib.sha256()
    for name in ("data_agent_multi_step.json", "possible_answer/data_agent_multi_step.json"):
        digest.update(name.encode() + b"\0" + (DATA / name).read_bytes())
    assert record["data_sha256"] == digest.hexdigest()
    assert (record["package"], record["version"]) == ("evalscope", importlib.metadata.version("evalscope"))
    # one definition serves every command that takes a domain (sft's --data is its own: data files)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    takes = {name for name, p in sub.choices.items() if any(a.dest == "data_dir" for a in p._actions)}
    assert takes == {"gold", "rollout", "synth", "grpo", "eval", "chat", "demo", "ablate", "serve-mcp"}


def test_data_errors_say_where_the_directory_came_from(tmp_path):
    broken = tmp_path / "broken"
    (broken / "possible_answer").mkdir(parents=True)
    (broken / "data_agent_multi_step.json").write_text("not json\n")
    cases = [  # (--data, $MUARL_ACEBENCH_DATA, what the one line says)
        (str(tmp_path / "nowhere"), str(DATA), f"{tmp_path / 'nowhere'} (from --data) does not exist"),
        (None, str(tmp_path / "nowhere"), f"{tmp_path / 'nowhere'} (from MUARL_ACEBENCH_DATA) does not exist"),
        (str(broken), str(DATA), f"line 1 is not valid JSON (Expecting value) (the data directory {broken} is from "
                                 "--data)"),
        (None, str(broken), f"(the data directory {broken} is from MUARL_ACEBENCH_DATA)"),
    ]
    for option, variable, what in cases:
        done = _muarl(tmp_path, "gold", "acebench:multi_step", *(["--data", option] if option else []),
                      env_data=variable)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("muarl: error: ") and what in lines[0], lines[0]


def test_data_option_on_a_domain_that_reads_none_is_one_clear_line(tmp_path):
    for name, args in (("retail", ["gold", "retail"]), ("mcp:retail", ["rollout", "--domain", "mcp:retail", "--out", "x"])):
        done = _muarl(tmp_path, *args, "--data", str(DATA))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0] == (f"muarl: error: domain {name} reads no data directory, but --data {DATA} was given; "
                            "--data names the data of the bridges that read a benchmark's data from a directory "
                            "(docs/bridges.md)"), lines[0]
    assert not (tmp_path / "x").exists()


def test_get_domain_takes_the_data_directory_and_the_option_is_scoped(tmp_path):
    from muarl.domain import data_option

    named = get_domain("acebench:multi_step", data=DATA)
    assert len(named.tasks()) == 20 and named is get_domain("acebench:multi_step", data=str(DATA))
    with data_option(str(tmp_path / "nowhere")):
        with pytest.raises(DataError, match="from --data"):
            get_domain("acebench:multi_turn")
        with pytest.raises(ValueError, match="domain airline reads no data directory"):
            get_domain("airline")
    assert get_domain("airline").name == "airline"  # the option ends with its command


def test_unknown_category_is_a_clear_error():
    with pytest.raises(KeyError, match="acebench:multi_turn, acebench:multi_step"):
        get_domain("acebench:normal")
