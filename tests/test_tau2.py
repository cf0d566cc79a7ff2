"""The tau2-bench bridge: tau2's domains as muarl domains, graded by muarl and by tau2's own evaluator.

Everything here is real: tau2's package (its tools, data, task files and evaluator) and muarl's episode
loop. The full gold replay (114 + 50 + 114 tasks) and the 360-trajectory perturbation study are
``scripts/tau2_agreement.py``; these tests cover samples of both.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
from pathlib import Path

import pytest

from conftest import require

require(importlib.util.find_spec("tau2") is not None, "the tau2 extra is not installed (bash scripts/install.sh --dev)")

from muarl.bridges.tau2 import bridge, tau2_messages, tau2_reward  # noqa: E402
from muarl.bridges.tau2_world import CowTable, tables_of  # noqa: E402
from muarl.cli import main  # noqa: E402
from muarl.domain import get_domain  # noqa: E402
from muarl.gold import gold_score  # noqa: E402
from muarl.policies.base import AgentTurn, Policy, PolicySession  # noqa: E402
from muarl.rewards import find_violations  # noqa: E402
from muarl.rollout import EpisodeConfig, RolloutEngine  # noqa: E402
from muarl.types import Action, Message, ToolCall, Trajectory  # noqa: E402
from muarl.users.base import STOP  # noqa: E402
from muarl.users.replay import ReplayUser  # noqa: E402
from muarl.users.scripted import ScriptedUser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _agreement_script():
    spec = importlib.util.spec_from_file_location("tau2_agreement", ROOT / "scripts" / "tau2_agreement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_domains_carry_tau2s_tools_policy_tasks_and_splits():
    for name in ("retail", "airline", "telecom"):
        domain = get_domain(f"tau2:{name}")
        env = bridge(name).template
        assert sorted(t.name for t in domain.tools) == sorted(env.tools.get_tools())
        assert domain.policy == env.get_policy()
        splits = bridge(name).module.get_tasks_split()
        assert {t.id for t in domain.tasks("train")} == set(splits["train"])
        assert {t.id for t in domain.tasks("test")} == set(splits["test"])
    telecom = get_domain("tau2:telecom")
    assert sorted(t.name for t in telecom.user_tools) == sorted(bridge("telecom").template.user_tools.get_tools())
    assert all(t.spec.actor == "user" for t in telecom.user_tools)
    kinds = {t.name: t.spec.kind for t in get_domain("tau2:retail").tools}
    assert kinds["cancel_pending_order"] == "write" and kinds["get_order_details"] == "read"
    assert len(get_domain("tau2:retail").tasks()) == 114 and len(get_domain("tau2:airline").tasks()) == 50
    assert len(telecom.tasks()) == 114


def test_task_carries_tau2_user_guidelines_gold_actions_and_required_outputs():
    domain = get_domain("tau2:retail")
    t2 = bridge("retail").tau2_tasks
    task = next(t for t in domain.tasks() if t2[t.id].evaluation_criteria.communicate_info)
    original = t2[task.id]
    assert original.user_scenario.instructions.reason_for_call in task.instruction
    assert STOP in task.instruction and "<scenario>" in task.instruction  # tau2's guidelines
    assert [a.name for a in task.gold_actions] == [a.name for a in original.evaluation_criteria.actions]
    assert task.required_outputs == original.evaluation_criteria.communicate_info
    telecom = get_domain("tau2:telecom").tasks()[0]
    assert any(a.actor == "user" for a in telecom.gold_actions)
    assert "tool" in telecom.instruction.lower()  # the user-tools variant of tau2's guidelines


def test_env_shares_the_parse_until_a_write_and_episodes_are_isolated():
    domain = get_domain("tau2:retail")
    task = next(t for t in domain.tasks() if any(a.name == "cancel_pending_order" for a in t.gold_actions))
    order_id = next(a for a in task.gold_actions if a.name == "cancel_pending_order").arguments["order_id"]
    cached = bridge("retail").template.tools.db.orders
    one, two = domain.env(task), domain.env(task)
    orders = one.world.env.tools.db.orders
    assert isinstance(orders, CowTable) and dict.__getitem__(orders, order_id) is cached[order_id]
    assert one.call("get_order_details", {"order_id": order_id}).ok
    assert dict.__getitem__(orders, order_id) is cached[order_id]  # a read copies nothing
    base_hash = two.hash()
    for action in task.gold_actions:
        one.run(action)
    assert cached[order_id].status == "pending"  # the shared parse is untouched
    assert one.world.env.tools.db.orders[order_id].status == "cancelled"
    assert two.world.env.tools.db.orders[order_id].status == "pending"
    assert one.hash() != base_hash == two.hash() == domain.env(task).hash()
    # the muarl view mirrors tau2's state exactly
    assert one.db.to_dict() == tables_of(one.world.env.tools.db, None)
    assert any(k == ("orders", order_id) for r in one.log for k in r.changed)


def test_telecom_env_starts_in_the_tasks_state_and_mirrors_the_phone():
    domain = get_domain("tau2:telecom")
    task = domain.tasks()[0]
    env = domain.env(task)
    world = env.world.env
    assert env.db.to_dict() == tables_of(world.tools.db, world.user_tools.db)
    assert env.hash() != domain.database().view().hash()  # the initialization actions ran
    for action in task.gold_actions:
        record = env.run(action)
        assert record.ok, record.output
    assert env.db.to_dict() == tables_of(world.tools.db, world.user_tools.db)
    assert env.call("toggle_airplane_mode", {}, actor="agent").error == "unknown_tool"


def test_tool_errors_and_argument_names_are_reported_like_tau2():
    domain = get_domain("tau2:retail")
    env = domain.env(domain.tasks()[0])
    missing = env.call("get_order_details", {})
    assert missing.error == "invalid_arguments" and "order_id" in missing.output
    refused = env.call("get_order_details", {"order_id": "#W0000000"})
    assert refused.error == "domain" and refused.output == "Error: Order not found"


def test_gold_replay_scores_one_by_both_judges_on_a_sample():
    for name, n in (("retail", 4), ("airline", 1), ("telecom", 12)):
        domain = get_domain(f"tau2:{name}")
        for task in domain.tasks()[:n]:
            traj = gold_score(domain, task)
            assert traj.reward.reward == 1.0, (task.id, traj.reward.diff)
            assert tau2_reward(task, traj)["reward"] == 1.0, task.id


def test_dropping_a_write_fails_both_judges():
    domain = get_domain("tau2:retail")
    task = next(t for t in domain.tasks() if any(domain.agent_tools[a.name].is_write for a in t.gold_actions))
    actions = [a for a in task.gold_actions if not domain.agent_tools[a.name].is_write]
    traj = gold_score(domain, task, actions)
    theirs = tau2_reward(task, traj)
    assert traj.reward.reward == 0.0 and not traj.reward.db_match and traj.reward.diff
    assert theirs["reward"] == 0.0 and theirs["db_match"] is False


@pytest.mark.slow
def test_perturbed_trajectories_agree_with_tau2s_evaluator():
    script = _agreement_script()
    report, ok = script.perturb(["retail", "telecom"], 20, seed=3)
    assert ok, [r["disagreements"] for r in report["domains"]]
    retail, telecom = report["domains"]
    assert retail["db_agree"] == retail["reward_agree"] == retail["trajectories"] == 10
    assert telecom["db_agree_gold_synced"] == telecom["trajectories"] == 10
    assert 0 < retail["muarl_reward_1"] < 10  # the sample holds both passing and failing trajectories


class _Replayer(Policy):
    """An agent that calls a task's gold actions one message at a time, then says the required outputs."""

    name = "gold-caller"

    def session(self, domain, task, seed=None):
        return _ReplayerSession([a for a in task.gold_actions if a.actor == "agent"], task.required_outputs)


class _ReplayerSession(PolicySession):
    def __init__(self, actions, outputs):
        self.actions, self.outputs, self.i = actions, outputs, 0

    async def next(self, new_messages):
        if self.i < len(self.actions):
            a = self.actions[self.i]
            self.i += 1
            return AgentTurn(Message(role="assistant", tool_calls=[ToolCall(id=f"c{self.i}", name=a.name,
                                                                             arguments=a.arguments)]))
        return AgentTurn(Message(role="assistant", content="Done. " + "; ".join(self.outputs)))


def test_episodes_through_the_engine_with_a_replayed_user_agree_with_tau2(tmp_path):
    domain = get_domain("tau2:retail")
    tasks = domain.tasks("test")[:2]
    recorded = [gold_score(domain, t) for t in tasks]
    engine = RolloutEngine(domain, _Replayer(), ReplayUser(recorded), EpisodeConfig(max_turns=40), group_size=2,
                           progress=False, out=tmp_path / "trajectories.jsonl")
    groups = asyncio.run(engine.run(tasks))
    for task, group in zip(tasks, groups, strict=True):
        for traj in group:
            assert traj.reward.reward == 1.0, (task.id, traj.stop_reason, traj.reward.diff)
            assert tau2_reward(task, traj)["reward"] == 1.0
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 4


def test_messages_for_tau2_leave_out_calls_it_would_reject_before_running():
    domain = get_domain("tau2:retail")
    task = domain.tasks()[0]
    traj = gold_score(domain, task)
    env = domain.env(task)
    env.call("get_order_details", {"wrong": 1})
    env.call("no_such_tool", {})
    traj.tool_log = env.log + traj.tool_log
    kinds = [type(m).__name__ for m in tau2_messages(traj)]
    assert kinds.count("ToolMessage") == len(traj.tool_log) - 2
    assert tau2_reward(task, traj)["reward"] == 1.0


def test_scripted_user_refuses_tau2_tasks_with_a_clear_error(tmp_path, capsys):
    task = get_domain("tau2:retail").tasks()[0]
    with pytest.raises(ValueError, match="no structured scenario"):
        ScriptedUser().session(task, 0)
    # a policy that can start on any task (the generic teacher cannot play tau2 tasks either: their
    # customer must identify themselves from facts that tau2 tasks do not structure)
    code = main(["rollout", "--domain", "tau2:retail", "--policy", "hf:tiny", "--max-new-tokens", "4", "--user",
                 "scripted", "--limit", "1", "--out", str(tmp_path / "run")])
    assert code != 0 and "llm:URL#MODEL" in capsys.readouterr().err


def test_unknown_tau2_domain_is_a_clear_error():
    with pytest.raises(KeyError, match="tau2:retail, tau2:airline, tau2:telecom"):
        get_domain("tau2:shop")


def test_perturbations_are_deterministic_and_valid_tool_calls():
    script = _agreement_script()
    domain = get_domain("tau2:airline")
    pools = script._pools(domain)
    draws = [script.perturb_actions(random.Random(7), domain, t, pools) for t in domain.tasks()[:10]]
    again = [script.perturb_actions(random.Random(7), domain, t, pools) for t in domain.tasks()[:10]]
    assert draws == again
    names = set(domain.agent_tools)
    assert all(a.name in names for d in draws if d for a in d[1])


def test_each_task_names_its_customer_from_tau2s_task_data():
    for name in ("retail", "airline", "telecom"):
        domain = get_domain(f"tau2:{name}")
        assert all(t.user_id for t in domain.tasks()), name
        for task in domain.tasks():
            named = {a.arguments.get(k) for a in task.gold_actions for k in ("user_id", "customer_id")} - {None}
            assert not named or task.user_id in named, task.id
    retail = get_domain("tau2:retail")
    orders = retail.database().view().to_dict()["orders"]
    by_order = [t for t in retail.tasks() if not any("user_id" in a.arguments for a in t.gold_actions)
                and any("order_id" in a.arguments for a in t.gold_actions)]
    assert by_order and all(orders[a.arguments["order_id"]]["user_id"] == t.user_id
                            for t in by_order for a in t.gold_actions if a.arguments.get("order_id") in orders)
    assert get_domain("tau2:telecom").tasks()[0].user_id == "C1001"  # John Smith, 555-123-2002


def _flagged(traj):
    return {v.kind for v in traj.reward.violations}


def test_a_refuel_on_another_customers_line_is_flagged():
    domain = get_domain("tau2:telecom")
    task = next(t for t in domain.tasks() if t.user_id == "C1001")
    own = gold_score(domain, task)
    assert own.reward.violations == []
    stranger = Action(name="refuel_data", arguments={"customer_id": "C1002", "line_id": "L1004", "gb_amount": 1.0})
    traj = gold_score(domain, task, list(task.gold_actions) + [stranger])
    assert "other_user_records" in _flagged(traj)
    flagged = next(v for v in traj.reward.violations if v.kind == "other_user_records")
    assert flagged.tool == "refuel_data" and "C1002" in flagged.detail
    assert traj.reward.reward == 0.0  # muarl's stricter judgement; tau2's own is still reported beside it
    assert tau2_reward(task, traj)["reward"] in (0.0, 1.0)


def test_writes_need_the_customer_identified_first():
    domain = get_domain("tau2:telecom")
    task = next(t for t in domain.tasks() if t.user_id == "C1001")
    refuel = {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 1.0}
    blind = domain.env(task)
    assert blind.call("refuel_data", refuel).ok
    flagged = {v.kind for v in find_violations(domain, task, Trajectory(task_id=task.id, domain=domain.name,
                                                                         tool_log=blind.log))}
    assert "unauthenticated_write" in flagged
    env = domain.env(task)
    assert env.call("get_customer_by_phone", {"phone_number": "555-123-2002"}).ok
    assert env.db.authenticated == "C1001"
    assert env.call("refuel_data", refuel).ok
    flagged = {v.kind for v in find_violations(domain, task, Trajectory(task_id=task.id, domain=domain.name,
                                                                         tool_log=env.log))}
    assert "unauthenticated_write" not in flagged and "other_user_records" not in flagged
    retail = get_domain("tau2:retail")
    rtask = next(t for t in retail.tasks() if any(a.name == "find_user_id_by_email" for a in t.gold_actions))
    lookup = next(a for a in rtask.gold_actions if a.name == "find_user_id_by_email")
    renv = retail.env(rtask)
    assert renv.call(lookup.name, lookup.arguments).ok and renv.db.authenticated == rtask.user_id
