"""The telecom domain: gold replays score 1, broken replays score 0, and phone and account interact."""

from __future__ import annotations

import pytest

from muarl.domain import get_domain
from muarl.env import Env
from muarl.gold import gold_score
from muarl.rewards import score
from muarl.types import Action, Message, Task, Trajectory


@pytest.fixture(scope="module")
def domain():
    return get_domain("telecom")


@pytest.fixture(scope="module")
def tasks(domain) -> list[Task]:
    return domain.tasks()


def _play(domain, task: Task, actions: list[Action]) -> tuple[Env, Trajectory]:
    """Run actions on a fresh env and wrap the log in a trajectory that also says the required outputs."""
    env = domain.env(task)
    for action in actions:
        env.run(action)
    said = " ".join(task.required_outputs) or "Done."
    messages = [Message(role="user", content="Hi"), Message(role="assistant", content=f"The answer: {said}")]
    return env, Trajectory(task_id=task.id, domain=domain.name, messages=messages, tool_log=env.log)


def _is_write(domain, action: Action) -> bool:
    tools = domain.agent_tools if action.actor == "agent" else domain.user_tool_map
    return tools[action.name].is_write


def test_every_default_task_replays_to_reward_one(domain, tasks):
    assert len(tasks) == sum(domain.task_counts.values())
    for task in tasks:
        env, trajectory = _play(domain, task, task.gold_actions)
        assert all(r.ok for r in env.log), (task.id, [r.output for r in env.log])
        reward = score(domain, task, trajectory, env=env)
        assert reward.reward == 1.0, (task.id, reward.diff, reward.checks)


def test_gold_conversation_has_no_violations(domain, tasks):
    for task in tasks:
        reward = gold_score(domain, task).reward
        assert reward.reward == 1.0 and reward.tcr == 1.0 and not reward.violations, (task.id, reward)


def test_dropping_any_gold_write_scores_zero_with_a_diff(domain, tasks):
    dropped = 0
    for task in tasks:
        gold_env = domain.env(task)
        effects = [gold_env.run(a).changed for a in task.gold_actions]
        for i, action in enumerate(task.gold_actions):
            if not _is_write(domain, action):
                continue
            env, trajectory = _play(domain, task, task.gold_actions[:i] + task.gold_actions[i + 1:])
            reward = score(domain, task, trajectory, env=env)
            assert reward.reward == 0.0, (task.id, action)
            table, key = effects[i][0]
            assert any(line.startswith(f'{table}["{key}"]') for line in reward.diff), (task.id, reward.diff)
            dropped += 1
    assert dropped > 0


def test_user_and_agent_writes_both_appear_in_gold(tasks):
    actors = {a.actor for t in tasks for a in t.gold_actions}
    assert actors == {"agent", "user"}
    for task in tasks:
        user_steps = [a for intent in task.scenario.intents for a in intent.user_actions]
        assert user_steps == [a for a in task.gold_actions if a.actor == "user"], task.id
        assert task.context["phone_number"] in task.instruction or "phone_number" in task.scenario.withheld


def test_speed_test_reflects_account_and_phone(domain, tasks):
    families = {"airplane_mode", "apn_reset", "sim_reseat", "mobile_data_off", "data_refuel", "roaming_abroad",
                "roaming_plan_upgrade", "multi_refuel_data_toggle", "pay_and_resume", "multi_phone_settings"}
    seen = set()
    for task in tasks:
        if task.family not in families:
            continue
        env = domain.env(task)
        before = env.call("run_speed_test", {}, actor="user").output
        assert "no internet connection" in before, (task.id, before)
        for action in task.gold_actions:
            env.run(action)
        after = env.call("run_speed_test", {}, actor="user").output
        assert "Mbps" in after and ("(excellent)" in after or "(good)" in after), (task.id, after)
        seen.add(task.family)
    assert {"data_refuel", "roaming_abroad", "airplane_mode"} <= seen


def test_account_side_alone_does_not_fix_roaming(domain, tasks):
    task = next(t for t in tasks if t.family == "roaming_abroad"
                and {a.actor for a in t.gold_actions} == {"agent", "user"})
    env = domain.env(task)
    for action in task.gold_actions:
        if action.actor == "agent":
            env.run(action)
    assert "no internet connection" in env.call("run_speed_test", {}, actor="user").output
    env.call("toggle_data_roaming", {}, actor="user")
    assert "Mbps" in env.call("run_speed_test", {}, actor="user").output


def test_slow_network_mode_is_slow_then_fast(domain, tasks):
    task = next(t for t in tasks if t.family == "network_mode")
    env = domain.env(task)
    assert "(slow)" in env.call("run_speed_test", {}, actor="user").output or \
        "(very slow)" in env.call("run_speed_test", {}, actor="user").output
    for action in task.gold_actions:
        env.run(action)
    assert "(excellent)" in env.call("run_speed_test", {}, actor="user").output or \
        "(good)" in env.call("run_speed_test", {}, actor="user").output


def test_user_tools_are_not_agent_tools(domain, tasks):
    env = domain.env(tasks[0])
    record = env.call("toggle_airplane_mode", {})
    assert not record.ok and record.kind == "unknown"
    assert "unknown tool" in record.output and "tool of the user" in record.output
    record = env.call("refuel_data", {"customer_id": "C1001", "line_id": "x", "gb_amount": 1.0}, actor="user")
    assert not record.ok and "tool of the agent" in record.output
    assert all(t.spec.actor == "user" for t in domain.user_tools)
    assert not set(domain.agent_tools) & set(domain.user_tool_map)


def test_resume_refused_while_bill_overdue(domain, tasks):
    task = next(t for t in tasks if t.family == "pay_and_resume")
    request, pay, resume = task.gold_actions
    env = domain.env(task)
    record = env.run(resume)
    assert not record.ok and "overdue" in record.output
    assert not env.call("make_payment", pay.arguments, actor="user").ok  # no request sent yet
    assert env.run(request).ok and env.run(pay).ok and env.run(resume).ok


def test_authentication_tools(domain, tasks):
    task = tasks[0]
    customer = domain.database().tables["customers"][task.user_id]
    env = domain.env(task)
    assert env.db.authenticated is None
    env.call("get_customer_by_name", {"full_name": customer["full_name"], "dob": "1900-01-01"})
    assert env.db.authenticated is None
    env.call("get_customer_by_name", {"full_name": customer["full_name"], "dob": customer["dob"]})
    assert env.db.authenticated == task.user_id
    env = domain.env(task)
    env.call("get_customer_by_phone", {"phone_number": customer["phone_numbers"][0]})
    assert env.db.authenticated == task.user_id


def test_refuel_charges_bill_deterministically(domain, tasks):
    task = next(t for t in tasks if t.family == "data_refuel")
    a, b = domain.env(task), domain.env(task)
    for env in (a, b):
        for action in task.gold_actions:
            env.run(action)
    assert a.hash() == b.hash()
    changed = {t for t, _ in a.log[-1].changed}
    assert {"lines", "bills"} <= changed
    assert a.log[-1].owners == [task.user_id]


def test_out_of_policy_tasks_have_no_agent_writes(domain, tasks):
    oop = [t for t in tasks if any(i.out_of_policy for i in t.scenario.intents)]
    assert oop
    for task in oop:
        assert not [a for a in task.gold_actions if a.actor == "agent" and _is_write(domain, a)], task.id
    assert {t.family for t in oop} == {"out_of_policy_refuel", "out_of_policy_resume"}


def test_information_tasks_need_the_answer(domain, tasks):
    task = next(t for t in tasks if t.family == "info_bill_amount")
    assert task.required_outputs and task.required_outputs[0] == task.scenario.intents[0].answer
    env = domain.env(task)
    trajectory = Trajectory(task_id=task.id, domain=domain.name,
                            messages=[Message(role="assistant", content="I cannot tell.")])
    reward = score(domain, task, trajectory, env=env)
    assert reward.db_match and reward.reward == 0.0


def test_generation_is_deterministic(domain):
    counts = {"train": 30, "dev": 10, "test": 20}
    one = domain.generate_tasks(seed=3, counts=counts)
    two = domain.generate_tasks(seed=3, counts=counts)
    assert [t.model_dump() for t in one] == [t.model_dump() for t in two]
    other = domain.generate_tasks(seed=4, counts=counts)
    assert [t.model_dump() for t in one] != [t.model_dump() for t in other]
    data = domain.build_db(5, 20)
    assert data == domain.build_db(5, 20)
    assert set(data) == {"customers", "plans", "lines", "bills", "devices"}


def test_thousand_tasks_generate(domain):
    tasks = domain.generate_tasks(seed=11, counts={"train": 700, "dev": 100, "test": 200})
    assert len(tasks) == 1000 and len({t.id for t in tasks}) == 1000
    assert len({t.family for t in tasks}) >= 15
    for task in tasks:
        assert task.scenario.intents and task.instruction and task.context.get("phone_number")


def test_owner_of(domain):
    tables = domain.database().tables
    line = next(iter(tables["lines"].values()))
    assert domain.owner_of("lines", line) == line["customer_id"]
    assert domain.owner_of("devices", tables["devices"][line["phone_number"]]) == line["customer_id"]
    assert domain.owner_of("plans", next(iter(tables["plans"].values()))) is None


def test_shipped_tasks_match_the_generator(domain):
    # telecom ships its tasks (package data): a missing file is a packaging fault, not a reason to skip
    assert domain.tasks_file is not None and domain.tasks_file.exists(), domain.tasks_file
    shipped = [t.model_dump() for t in domain.tasks()]
    assert shipped == [t.model_dump() for t in domain.generate_tasks()]
