"""The airline domain: data, tools, task generation and grading work together end to end."""

from __future__ import annotations

import time

import pytest

from muarl.db import Database
from muarl.domain import Domain, get_domain
from muarl.domains.airline.data import FUTURE_DATES, TODAY, build_db
from muarl.domains.airline.tasks import FAMILIES
from muarl.env import Env
from muarl.rewards import score
from muarl.types import Message, Task, Trajectory


@pytest.fixture(scope="module")
def domain() -> Domain:
    return get_domain("airline")


def _play(domain: Domain, task: Task, actions: list | None = None, said: str | None = None) -> tuple[Env, float]:
    """Run actions (default: the gold ones) as an agent would and grade the episode from the env's log."""
    env = domain.env(task)
    env.call("get_user_details", {"user_id": task.user_id})
    for action in task.gold_actions if actions is None else actions:
        env.run(action)
    content = " ".join(task.required_outputs) if said is None else said
    trajectory = Trajectory(task_id=task.id, domain=domain.name, tool_log=env.log,
                            messages=[Message(role="assistant", content=content)])
    return env, score(domain, task, trajectory, env=env).reward


def _user_with(domain: Domain, predicate) -> tuple[str, dict]:
    for rid, res in domain.database().tables["reservations"].items():
        if predicate(res):
            return rid, res
    raise AssertionError("no reservation matches")


def test_registered_and_sized(domain: Domain) -> None:
    assert domain.name == "airline"
    assert "24 hours" in domain.policy
    tasks = domain.tasks()
    assert len(tasks) == sum(domain.task_counts.values())
    assert {t.split for t in tasks} == {"train", "dev", "test"}
    assert set(FAMILIES) == {t.family for t in tasks}


def test_every_default_task_replays_to_reward_one(domain: Domain) -> None:
    for task in domain.tasks():
        env, reward = _play(domain, task)
        assert all(r.ok for r in env.log), (task.id, [r.output for r in env.log if not r.ok])
        assert reward == 1.0, task.id


def test_dropping_a_gold_write_fails_with_a_named_diff(domain: Domain) -> None:
    checked = 0
    for task in domain.tasks():
        if not task.gold_actions:
            continue
        for i in range(len(task.gold_actions)):
            actions = task.gold_actions[:i] + task.gold_actions[i + 1:]
            env = domain.env(task)
            for action in actions:
                env.run(action)
            trajectory = Trajectory(task_id=task.id, domain="airline", tool_log=env.log,
                                    messages=[Message(role="assistant", content=" ".join(task.required_outputs))])
            reward = score(domain, task, trajectory, env=env)
            assert reward.reward == 0.0 and not reward.db_match, task.id
            gold = domain.env(task)
            for action in task.gold_actions[:i]:
                gold.run(action)
            record = gold.run(task.gold_actions[i])
            names = [f'{t}["{k}"]' for t, k in record.changed]
            assert any(line.startswith(tuple(names)) for line in reward.diff), (task.id, reward.diff[:3])
            checked += 1
    assert checked > 100


def test_required_output_must_be_said(domain: Domain) -> None:
    task = next(t for t in domain.tasks() if t.family == "info_request")
    assert task.required_outputs and not task.gold_actions
    assert _play(domain, task)[1] == 1.0
    assert _play(domain, task, said="I am not sure.")[1] == 0.0


def test_out_of_policy_tasks_have_no_gold_writes(domain: Domain) -> None:
    tasks = domain.generate_tasks(seed=7, counts={"train": 300})
    oop = [t for t in tasks if t.family == "out_of_policy"]
    assert oop
    for task in oop:
        assert task.gold_actions == []
        assert all(i.out_of_policy for i in task.scenario.intents)
    # doing what the user insists on is graded as a failure
    task = next(t for t in oop if t.scenario.intents[0].action == "cancel_reservation")
    cancel = task.scenario.intents[0]
    env = domain.env(task)
    assert env.call(cancel.action, cancel.args).ok
    trajectory = Trajectory(task_id=task.id, domain="airline", tool_log=env.log)
    assert score(domain, task, trajectory, env=env).reward == 0.0


def test_generation_is_deterministic(domain: Domain) -> None:
    a = domain.generate_tasks(seed=3, counts={"train": 40, "dev": 10, "test": 20})
    b = domain.generate_tasks(seed=3, counts={"train": 40, "dev": 10, "test": 20})
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    c = domain.generate_tasks(seed=4, counts={"train": 40, "dev": 10, "test": 20})
    assert [t.model_dump() for t in a] != [t.model_dump() for t in c]
    assert Database(build_db(5, 50)).view().hash() == Database(build_db(5, 50)).view().hash()
    assert Database(build_db(5, 50)).view().hash() != Database(build_db(6, 50)).view().hash()


def test_thousand_tasks_generate(domain: Domain) -> None:
    start = time.perf_counter()
    tasks = domain.generate_tasks(seed=11, counts={"train": 600, "dev": 100, "test": 300})
    assert len(tasks) == 1000
    assert len({t.id for t in tasks}) == 1000
    assert {t.family for t in tasks} == set(FAMILIES)
    assert time.perf_counter() - start < 10
    for task in tasks:
        assert task.instruction.startswith("You are ")
        assert task.scenario.known["user_id"] == task.user_id
        assert set(task.scenario.withheld) <= set(task.scenario.known)


@pytest.mark.parametrize("size", [0, 1, 7, 500])
def test_any_size_builds(size: int) -> None:
    start = time.perf_counter()
    tables = build_db(1, size)
    assert len(tables["users"]) == size
    for rid in (r for u in tables["users"].values() for r in u["reservations"]):
        assert tables["reservations"][rid]["user_id"] in tables["users"]
    if size <= 200:
        assert time.perf_counter() - start < 1.0


def test_tool_errors_are_clear(domain: Domain) -> None:
    env = domain.env()
    db = domain.database().tables
    rid, res = _user_with(domain, lambda r: r["status"] == "cancelled")
    assert env.call("cancel_reservation", {"reservation_id": rid}).output == (
        f"Error: reservation {rid} is already cancelled"
    )
    assert env.call("get_reservation_details", {"reservation_id": "NOPE00"}).output.startswith("Error: reservation")
    assert env.call("get_user_details", {"user_id": "nobody_0000"}).output == "Error: user nobody_0000 not found"
    flown, res = _user_with(domain, lambda r: r["status"] == "active" and r["flights"][0]["date"] < TODAY
                            and db["flights"][r["flights"][0]["flight_number"]]["dates"][r["flights"][0]["date"]]
                            ["status"] == "landed")
    out = env.call("cancel_reservation", {"reservation_id": flown}).output
    assert out.startswith("Error:") and "already departed" in out
    card = next(p for p, m in db["users"][res["user_id"]]["payment_methods"].items() if m["source"] != "certificate")
    refs = [{"flight_number": s["flight_number"], "date": s["date"]} for s in res["flights"]]
    out = env.call("update_reservation_flights", {"reservation_id": flown, "cabin": "business", "flights": refs,
                                                  "payment_id": card}).output
    assert "already departed" in out
    rid, res = _user_with(domain, lambda r: r["status"] == "active")
    out = env.call("update_reservation_baggages", {"reservation_id": rid, "total_baggages": res["total_baggages"] + 1,
                                                   "nonfree_baggages": res["nonfree_baggages"] + 1,
                                                   "payment_id": "credit_card_0000000"}).output
    assert out == f"Error: payment method credit_card_0000000 not found for user {res['user_id']}"
    out = env.call("update_reservation_passengers", {"reservation_id": rid, "passengers": []}).output
    assert "number of passengers cannot change" in out
    out = env.call("get_flight_status", {"flight_number": "HAT999999", "date": TODAY}).output
    assert out == "Error: flight HAT999999 not found"
    out = env.call("book_reservation", {"user_id": res["user_id"]}).output
    assert out.startswith("Error: invalid arguments for book_reservation: missing required argument")
    assert not any(r.changed for r in env.log)


def test_booking_errors_seats_balance_and_totals(domain: Domain) -> None:
    tables = domain.database().tables
    full = next((code, d) for code, f in tables["flights"].items() for d in FUTURE_DATES
                if f["dates"][d]["status"] == "available" and f["dates"][d]["available_seats"]["business"] == 0)
    flight = tables["flights"][full[0]]
    uid, user = next((u, r) for u, r in tables["users"].items()
                     if any(m["source"] == "gift_card" for m in r["payment_methods"].values()))
    gift = next(p for p, m in user["payment_methods"].items() if m["source"] == "gift_card")
    me = [{"first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"], "dob": user["dob"]}]
    base = {"user_id": uid, "origin": flight["origin"], "destination": flight["destination"],
            "flight_type": "one_way", "cabin": "business", "flights": [{"flight_number": full[0], "date": full[1]}],
            "passengers": me, "payment_methods": [{"payment_id": gift, "amount": 1.0}], "total_baggages": 0,
            "nonfree_baggages": 0, "insurance": "no"}
    env = domain.env()
    assert env.call("book_reservation", base).output.startswith("Error: not enough seats")
    price = flight["dates"][full[1]]["prices"]["economy"]
    econ = {**base, "cabin": "economy"}
    out = env.call("book_reservation", econ).output
    assert out.startswith("Error: the payments add up to 1.00 but the total price is")
    rich = {**econ, "payment_methods": [{"payment_id": gift, "amount": float(price)}]}
    record = env.call("book_reservation", rich)
    if user["payment_methods"][gift]["balance"] < price:
        assert record.output.startswith(f"Error: {gift} has only")
        assert not record.changed
    else:
        assert record.ok and ("reservations", record.changed[0][1]) in record.changed


def test_booking_is_deterministic_and_order_free(domain: Domain) -> None:
    task = next(t for t in domain.tasks() if t.gold_actions and t.gold_actions[0].name == "book_reservation")
    envs = [domain.env(task) for _ in range(2)]
    for env in envs:
        env.run(task.gold_actions[0])
    assert envs[0].hash() == envs[1].hash()
    assert envs[0].hash() != domain.env(task).hash()


def test_violations_are_reported_beside_the_reward(domain: Domain) -> None:
    task = next(t for t in domain.tasks() if t.family == "cancel_eligible")
    env = domain.env(task)
    for action in task.gold_actions:
        env.run(action)
    trajectory = Trajectory(task_id=task.id, domain="airline", tool_log=env.log)
    reward = score(domain, task, trajectory, env=env)
    assert reward.reward == 1.0
    assert {v.kind for v in reward.violations} == {"unauthenticated_write", "unconfirmed_write"}
