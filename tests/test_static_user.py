"""The static user (``--user static``, issue 32 item 1): the task stated whole in one opening, then only yes
to the wanted action. Its opening is checked against the task's Scenario on built-in and plug-in domains'
tasks (a dropped fact or intent fails here), and its replies against what a non-interactive user may say."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from muarl.domain import Domain, get_domain
from muarl.factory import make_user
from muarl.rollout import run_episode
from muarl.types import Intent, Scenario, Task
from muarl.users.phrases import norm, says_value
from muarl.users.script import script_of
from muarl.users.static import NOTHING_TO_ADD, StaticSession, StaticUser

ROOT = Path(__file__).resolve().parents[1]
#: built-in domains (each with its own user script), the demo's domain, and a plug-in on the generic script
DOMAINS = ["retail", "airline", "telecom", "retail-lite-forgetful", "library_domain:domain"]


def _domain(name: str) -> Domain:
    sys.path.insert(0, str(ROOT / "tests"))  # library_domain.py lives beside the tests
    try:
        return get_domain(name)
    finally:
        sys.path.remove(str(ROOT / "tests"))


def _session(domain: Domain, task: Task, seed: int = 0) -> StaticSession:
    session = StaticUser().for_domain(domain).session(task, seed)
    assert isinstance(session, StaticSession)
    return session


def _opening(domain: Domain, task: Task, seed: int = 0) -> str:
    return asyncio.run(_session(domain, task, seed).start()).text


def _reply(session: StaticSession, agent: str, env: Any = None) -> Any:
    async def act(name: str, arguments: dict[str, Any]) -> str:
        return env.call(name, arguments, actor="user").output

    return asyncio.run(session.reply(agent, act))


@pytest.mark.filterwarnings("ignore::muarl.taskgen.MissingFamilyWarning")
@pytest.mark.parametrize("name", DOMAINS)
def test_opening_states_every_known_fact_and_every_intent_of_the_scenario(name: str) -> None:
    """Every task of every split: each value of ``scenario.known`` (withheld ones too) verbatim, each
    intent's question verbatim, and each intent as the domain's script words it with nothing held back and
    the final wish (an intent with ``first_args`` states what the user settles on)."""
    domain = _domain(name)
    script = script_of(domain)
    tasks = [t for split in ("train", "dev", "test") for t in domain.tasks(split)]
    assert len(tasks) >= 40
    withheld = changed = 0
    for task in tasks:
        session = _session(domain, task)
        said = norm(asyncio.run(session.start()).text)
        scenario = task.scenario
        for key, value in scenario.known.items():
            assert says_value(said, value), f"{task.id}: the opening drops the fact {key}={value!r}: {said}"
        withheld += bool(scenario.withheld)
        for goal, intent in zip(session.goals, scenario.intents, strict=True):
            assert goal.intent is intent and goal.status == "pending"
            if intent.question:
                assert norm(intent.question) in said, f"{task.id}: the opening drops the question {intent.question!r}"
            assert goal.changed_mind == (intent.first_args is not None)
            changed += goal.changed_mind
            wish = norm(script.request(session, goal))
            assert wish and wish in said, f"{task.id}: the opening drops the intent {intent.description!r}"
    if name in ("library_domain:domain",):
        assert withheld and changed  # the plug-in's withheld card numbers and changes of mind were covered


def test_generic_script_states_facts_in_words_and_a_dropped_fact_is_caught() -> None:
    """A domain without a script of its own: "My <key in words> is <value>." for each fact an intent does
    not already say, then the intent from its description, in the first person."""
    shop = Domain(name="bike-shop-static", description="A bike repair shop.", policy="Help.", tools=[],
                  build_db=lambda seed, size: {}, build_tasks=lambda d, seed, counts: [])
    scenario = Scenario(persona="a cyclist", known={"card_number": "447120", "bike_name": "red racer"},
                        withheld=["card_number"],
                        intents=[Intent(description="book a service for your red racer on 2026-05-03",
                                        action="book_service", args={"bike_id": "B7", "date": "2026-05-03"})])
    task = Task(id="shop-1", domain=shop.name, split="test", family="f", user_id="C1", scenario=scenario,
                instruction="", gold_actions=[])
    opening = _opening(shop, task)
    assert "My card number is 447120." in opening and "book a service for my red racer on 2026-05-03" in opening
    assert "bike name" not in opening  # the intent already says it


def _forgetful_cancel() -> tuple[Domain, Task]:
    domain = get_domain("retail-lite-forgetful")
    task = next(t for t in domain.tasks("test") if t.scenario.intents[0].action == "cancel_pending_order")
    return domain, task


def test_questions_get_nothing_new_proposals_get_yes_or_no_and_the_agent_ending_ends_it() -> None:
    domain, task = _forgetful_cancel()
    intent = task.scenario.intents[0]
    order, reason = intent.args["order_id"], intent.args["reason"]
    session = _session(domain, task)
    asyncio.run(session.start())
    answer = _reply(session, "Could you please tell me the email address on your account?")
    assert answer.text in NOTHING_TO_ADD and answer.stop is None  # never an answer, however asked
    for value in task.scenario.known.values():
        assert not says_value(norm(answer.text), value)
    wrong = _reply(session, f"I can cancel order #W0000001 ({reason}). Shall I proceed?")
    assert wrong.text == "No." and intent.action and session.goals[0].status == "pending"
    yes = _reply(session, f"I can cancel order {order} because it is {reason}. Shall I proceed?")
    assert yes.text.startswith("Yes") and session.goals[0].status == "confirmed"
    done = _reply(session, f"Order {order} has been cancelled.")
    assert done.stop == "stop"  # every intent settled: it ends

    session = _session(domain, task)
    asyncio.run(session.start())
    assert _reply(session, "Is there anything else I can help you with?").text in NOTHING_TO_ADD
    assert _reply(session, "Thank you for contacting us, goodbye!").stop == "stop"


def test_it_gives_up_after_turns_that_get_it_nowhere_and_accepts_a_refusal_at_once() -> None:
    domain, task = _forgetful_cancel()
    session = _session(domain, task)
    asyncio.run(session.start())
    replies = [_reply(session, "What is your email?") for _ in range(session.max_stale)]
    assert [r.stop for r in replies] == [None] * (session.max_stale - 1) + ["stop"]
    session = _session(domain, task)
    asyncio.run(session.start())
    assert _reply(session, "Unfortunately I cannot cancel that order.").stop == "stop"  # no insisting


def test_a_change_of_mind_is_stated_as_the_final_wish_and_the_first_one_declined() -> None:
    domain = get_domain("retail")
    task = next(t for t in domain.tasks("test") if t.scenario.intents[0].first_args is not None
                and t.scenario.intents[0].action == "return_delivered_order_items")
    intent = task.scenario.intents[0]
    kept = [n for n in intent.preferences["first_items"] if n not in intent.preferences["items"]]
    session = _session(domain, task)
    opening = asyncio.run(session.start()).text
    assert kept and not any(n in opening for n in kept)
    assert all(n in opening for n in intent.preferences["items"])
    both = " and the ".join(intent.preferences["first_items"])
    order = intent.args["order_id"]
    assert _reply(session, f"I can return the {both} from order {order}. Shall I proceed?").text == "No."


def test_device_steps_are_done_when_the_agent_asks() -> None:
    """A dual-control domain: the device's output cannot be stated in advance, so a step the agent asks
    for is done and its output reported (the one thing besides yes this user does): the expert, which
    walks the user through them, wins those tasks, with the user's own tool calls in the log."""
    from muarl.policies.expert import ExpertPolicy
    from muarl.rollout import EpisodeConfig

    domain = get_domain("telecom")
    tasks = [t for t in domain.tasks("test") if any(i.user_actions for i in t.scenario.intents)][:4]
    for i, task in enumerate(tasks):
        traj = asyncio.run(run_episode(domain, task, ExpertPolicy(), StaticUser(), seed=i,
                                       config=EpisodeConfig(max_turns=30)))
        assert traj.reward and traj.reward.reward == 1.0, task.id
        assert any(r.actor == "user" for r in traj.tool_log), task.id


@pytest.mark.parametrize("name", ["retail-lite-forgetful", "telecom"])
def test_the_expert_wins_against_it_and_the_episode_records_the_static_user(name: str) -> None:
    """An agent that reads the opening can finish: the expert, which asks for what it needs, still wins
    most episodes (its questions get nothing, but the opening had the answers)."""
    from muarl.policies.expert import ExpertPolicy
    from muarl.rollout import EpisodeConfig

    domain = get_domain(name)
    user = make_user("static")
    assert isinstance(user.for_domain(domain), StaticUser) and user.provenance() == {"name": "static"}
    tasks = domain.tasks("test")[:8]
    rewards = [asyncio.run(run_episode(domain, task, ExpertPolicy(), user, seed=i, config=EpisodeConfig(max_turns=30)))
               .reward.reward for i, task in enumerate(tasks)]
    assert sum(rewards) >= 6


def test_user_static_on_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "muarl", "eval", "--domain", "retail-lite", "--policy", "expert",
                           "--user", "static", "--limit", "2", "--out", str(tmp_path / "ev")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["config"]["user"] == "static"
    from muarl.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["grpo", "--out", "o", "--user", "static"]).user == "static"
    assert parser.parse_args(["rollout", "--domain", "retail", "--out", "o", "--user", "static"]).user == "static"
    assert getattr(parser.parse_args(["demo", "--user", "static"]), "grpo.user") == "static"  # the GRPO stage's


#: how a retail customer names a refund method, by the prefix of its id: written here, not taken from the
#: script that words the opening, so that the check does not agree with itself
REFUND_WORDS = {"paypal_": "paypal", "gift_card_": "gift card", "credit_card_": "credit card"}


def test_retail_openings_state_what_the_gold_actions_need_in_the_customers_words() -> None:
    """Every retail-lite test task, checked against facts this test writes or looks up itself (the task's
    gold arguments, the order's items in the database), not against the script that builds the opening:
    the order id verbatim; a cancellation says "cancel" and its reason verbatim; a return says "return",
    names every returned item as the order lists it, and the refund method in the words above."""
    domain = get_domain("retail-lite")
    tasks = domain.tasks("test")
    assert {i.action for t in tasks for i in t.scenario.intents} == {"cancel_pending_order",
                                                                    "return_delivered_order_items"}
    for task in tasks:
        said = _opening(domain, task).lower()
        items = {item["item_id"]: item["name"] for intent in task.scenario.intents
                 for item in domain.env(task).db["orders"][intent.args["order_id"]]["items"]}
        for intent in task.scenario.intents:
            args = intent.args
            assert args["order_id"].lower() in said, (task.id, said)
            if intent.action == "cancel_pending_order":
                assert "cancel" in said and args["reason"].lower() in said, (task.id, said)
            else:
                assert "return" in said, (task.id, said)
                assert all(items[i].lower() in said for i in args["item_ids"]), (task.id, said)
                word = next(w for prefix, w in REFUND_WORDS.items() if args["payment_method_id"].startswith(prefix))
                assert word in said, (task.id, args["payment_method_id"], said)
