"""The scripted parties: the expert policy against the scripted user, and the user's robustness.

The expert x scripted-user pairing is the reference point for every learned policy (and the source of SFT
data), so it must solve nearly every task without a single policy violation; the user is the training
partner of small models, so it must understand paraphrases and survive garbage.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from muarl.domain import Domain, get_domain
from muarl.policies.expert import CONFIRM, ExpertPolicy
from muarl.policies.script import TeacherSession
from muarl.rewards import is_confirmation
from muarl.rollout import EpisodeConfig, run_episode
from muarl.types import Task, Trajectory
from muarl.users.scripted import ScriptedSession, ScriptedUser

DOMAINS = ["retail", "airline", "telecom"]


def _episode(domain: Domain, task: Task, seed: int, skip: bool = False) -> Trajectory:
    return asyncio.run(run_episode(domain, task, ExpertPolicy(skip_confirmation=skip), ScriptedUser(), seed=seed,
                                   config=EpisodeConfig(require_outputs=True)))


def _sweep(name: str, split: str) -> None:
    domain = get_domain(name)
    tasks = domain.tasks(split)
    wins, violations, failed = 0, [], []
    for i, task in enumerate(tasks):
        traj = _episode(domain, task, seed=i)
        assert traj.reward is not None
        violations += [(task.id, v.kind) for v in traj.reward.violations]
        if traj.reward.reward == 1.0:
            wins += 1
        else:
            failed.append((task.id, task.family, traj.stop_reason))
    rate = wins / len(tasks)
    assert rate >= 0.97, f"{name}/{split}: success {rate:.3f}; failed {failed[:10]}"
    assert not violations, f"{name}/{split}: violations {violations[:10]}"


@pytest.mark.parametrize("name", DOMAINS)
def test_expert_solves_test_split(name: str) -> None:
    _sweep(name, "test")


def test_expert_solves_retail_train_split() -> None:
    _sweep("retail", "train")


@pytest.mark.parametrize("name", DOMAINS)
def test_skip_confirmation_is_flagged_and_fails_change_of_mind(name: str) -> None:
    domain = get_domain(name)
    tasks = [t for t in domain.tasks("test") if t.scenario.intents and t.scenario.intents[0].first_args is not None]
    assert tasks, f"{name} has no change-of-mind task in its test split"
    for i, task in enumerate(tasks[:4]):
        traj = _episode(domain, task, seed=i, skip=True)
        assert traj.reward is not None
        assert traj.reward.reward == 0.0, task.id
        assert any(v.kind == "unconfirmed_write" for v in traj.reward.violations), task.id


class _GuessesFinal(ExpertPolicy):
    """The expert, except that it proposes what a mind-changing user will settle on before the user said it."""

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> TeacherSession:
        session = super().session(domain, task, seed)

        def proposals(intent: Any) -> list[Any]:
            return [intent.args] if intent.first_args is None else [intent.args, intent.first_args, intent.args]

        session.proposals = proposals  # type: ignore[method-assign]
        return session


@pytest.mark.parametrize("name", DOMAINS)
def test_user_corrects_a_guess_at_what_it_will_change_its_mind_to(name: str) -> None:
    """Before it changes its mind the user wants its first request: a proposal of the final one is corrected
    (not confirmed, which would reward an agent for swapping in something the user never asked for)."""
    domain = get_domain(name)
    tasks = [t for t in domain.tasks("test") if t.scenario.intents and t.scenario.intents[0].first_args is not None]
    for i, task in enumerate(tasks[:4]):
        traj = asyncio.run(run_episode(domain, task, _GuessesFinal(), ScriptedUser(), seed=i,
                                       config=EpisodeConfig(require_outputs=True)))
        proposals = [j for j, m in enumerate(traj.messages) if m.role == "assistant" and CONFIRM in (m.content or "")]
        assert proposals, task.id
        first_reply = traj.messages[proposals[0] + 1]
        assert first_reply.role == "user" and not is_confirmation(first_reply.content), (task.id, first_reply.content)
        assert "changed my mind" not in first_reply.content, task.id  # it restates its first request
        assert traj.messages[proposals[1] + 1].content.startswith("Wait, actually I've changed my mind"), task.id
        assert traj.reward is not None and traj.reward.reward == 1.0, task.id  # and the final one goes through
        assert not traj.reward.violations, task.id


def test_expert_follows_a_user_who_changes_the_cancellation_reason() -> None:
    """The expert asks for the reason the user gives first (not the one it will settle on), proposes it, and
    cancels with the new one once the user changes its mind."""
    domain = get_domain("retail")
    task = next(t for t in domain.tasks("test") if t.family == "cancel_order")
    intent = task.scenario.intents[0]
    first = next(r for r in ("no longer needed", "ordered by mistake") if r != intent.args["reason"])
    changing = intent.model_copy(update={"first_args": {**intent.args, "reason": first}})
    known = {**task.scenario.known, "reason": first}
    task = task.model_copy(update={"scenario": task.scenario.model_copy(update={"intents": [changing], "known": known})})
    traj = _episode(domain, task, seed=0)
    assert any("changed my mind" in m.content for m in traj.messages if m.role == "user")
    assert traj.reward is not None and traj.reward.reward == 1.0 and not traj.reward.violations
    cancel = next(c for m in traj.messages for c in m.tool_calls if c.name == "cancel_pending_order")
    assert cancel.arguments["reason"] == intent.args["reason"]


def test_scripted_user_is_deterministic_per_seed() -> None:
    for name in DOMAINS:
        domain = get_domain(name)
        for task in domain.tasks("test")[:6]:
            a = _episode(domain, task, seed=7)
            b = _episode(domain, task, seed=7)
            assert [m.model_dump() for m in a.messages] == [m.model_dump() for m in b.messages]
    domain = get_domain("retail")
    task = domain.tasks("test")[0]
    openings = {_episode(domain, task, seed=s).messages[1].content for s in range(8)}
    assert len(openings) > 1, "the seed should change the user's wording"


# -- paraphrase tolerance ----------------------------------------------------------------------------------
def _session(task: Task, seed: int = 0) -> tuple[ScriptedSession, Callable[..., Awaitable[str]]]:
    env = get_domain(task.domain).env(task)

    async def act(name: str, arguments: dict[str, Any]) -> str:
        return env.call(name, arguments, actor="user").output

    session = ScriptedUser().session(task, seed)
    asyncio.run(session.start())
    return session, act


def _ask(session: ScriptedSession, act: Callable[..., Awaitable[str]], text: str) -> str:
    return asyncio.run(session.reply(text, act)).text


def _task(domain: str, family: str, pred: Callable[[Task], bool] = lambda t: True) -> Task:
    return next(t for t in get_domain(domain).tasks() if t.family == family and pred(t))


def test_user_answers_paraphrased_identity_questions() -> None:
    task = _task("retail", "cancel_order", lambda t: "email" in t.scenario.known)
    k = task.scenario.known
    for q in ["What's the email on your account?", "Could you share your e-mail address, please?",
              "To verify you I need your email.", "may i have the email associated with the account"]:
        session, act = _session(task)
        assert k["email"] in _ask(session, act, q), q
    for q in ["Please provide your first name, last name and zip code.", "What is your full name and ZIP?",
              "Can you tell me your name and postal code?"]:
        session, act = _session(task)
        reply = _ask(session, act, q)
        assert k["first_name"] in reply and k["last_name"] in reply and k["zip"] in reply, (q, reply)
    for q in ["Which order is this about?", "Could you give me the order number?", "What's the order ID?",
              "Please share the order # you would like to cancel."]:
        session, act = _session(task)
        assert k["order_id"] in _ask(session, act, q), q
    phone_task = _task("telecom", "airplane_mode")
    phone = phone_task.scenario.known["phone_number"]
    for q in ["What's your phone number?", "Could you provide the mobile number on the account?",
              "Which number are you calling about?", "Please tell me the phone number linked to your account."]:
        session, act = _session(phone_task)
        assert phone in _ask(session, act, q), q


def test_user_withholds_until_asked() -> None:
    task = _task("retail", "withheld_info", lambda t: "order_id" in t.scenario.withheld)
    oid = task.scenario.known["order_id"]
    session = ScriptedUser().session(task, 3)
    opening = asyncio.run(session.start()).text
    assert oid not in opening
    env = get_domain("retail").env(task)

    async def act(name: str, arguments: dict[str, Any]) -> str:
        return env.call(name, arguments, actor="user").output

    identity = "Could you tell me your email?" if "email" in task.scenario.known else "What is your name and zip?"
    assert oid not in asyncio.run(session.reply(identity, act)).text
    assert oid in asyncio.run(session.reply("Thanks. Which order would you like to cancel? The order id please.", act)).text


def test_user_confirms_right_proposals_and_rejects_wrong_ones() -> None:
    task = _task("retail", "cancel_order")
    oid, reason = task.scenario.known["order_id"], task.scenario.known["reason"]
    right = [
        f"I'm going to cancel order {oid} (reason: {reason}). Shall I go ahead?",
        f"Just to confirm: cancel {oid}, refund to the original payment method. Do you want me to proceed?",
        f"Can you confirm that I should cancel order {oid}?",
        f"Ready to cancel {oid} for you, is that ok?",
        f"i will now CANCEL order {oid}. would you like me to proceed (yes/no)",
    ]
    for text in right:
        session, act = _session(task)
        assert is_confirmation(_ask(session, act, text)), text
    other = "#W0000001" if oid != "#W0000001" else "#W0000002"
    for text in [f"Shall I cancel order {other}?", f"Do you want me to cancel {other} now? (yes/no)"]:
        session, act = _session(task)
        reply = _ask(session, act, text)
        assert not is_confirmation(reply) and oid in reply, (text, reply)
    swap = _task("retail", "modify_items")
    session, act = _session(swap)
    assert not is_confirmation(_ask(session, act, "Shall I cancel your whole order instead? (yes/no)"))


def _garbage(rng: random.Random, i: int) -> str:
    kinds = [
        lambda: "",
        lambda: " \n\t ",
        lambda: "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 200))),
        lambda: "x" * 10_000,
        lambda: " ".join(rng.choice(["yes", "cancel", "airplane", "mode", "?", "order", "#W123", "turn", "off",
                                     "speed test", "refund", "🙂", "proceed", "sim", "pay", "bill"])
                         for _ in range(rng.randrange(1, 60))),
        lambda: json.dumps({"tool": "cancel", "args": {"order_id": "#W1", "nested": [1, 2, {"a": None}]}}),
        lambda: "\u202e\u0000\ufeff" + "🚀" * 50,
        lambda: "Please turn off airplane mode, restart your phone, reset your APN and run a speed test." * 20,
    ]
    return kinds[i % len(kinds)]()


def test_user_never_crashes_on_garbage() -> None:
    rng = random.Random(0)
    tasks = [_task("retail", "change_of_mind"), _task("airline", "book_one_way"),
             _task("telecom", "pay_and_resume"), _task("telecom", "multi_phone_settings")]
    for i in range(200):
        if i % 10 == 0:
            session, act = _session(tasks[(i // 10) % len(tasks)], seed=i)
        reply = asyncio.run(session.reply(_garbage(rng, i), act))
        assert isinstance(reply.text, str) and reply.text.strip()
        assert reply.stop in (None, "stop", "transfer")
        assert "error" not in reply.metadata


def test_a_proposal_made_again_after_the_users_yes_is_answered_with_reconfirm() -> None:
    """The agent proposes, the user says yes, and the agent proposes the same action again (its tool call
    failed, or it lost track): the shipped user takes the action as settled and leaves; with ``reconfirm``
    (``muarl.users.scripted:reconfirming``) it answers again, yes to the right action, a correction to a
    wrong one, up to ``reconfirm`` times, then leaves as before. A report that it is done still ends it."""
    from muarl.users.scripted import reconfirming

    task = _task("retail", "cancel_order")
    oid, reason = task.scenario.known["order_id"], task.scenario.known["reason"]
    proposal = f"I'm going to cancel order {oid} (reason: {reason}). Shall I go ahead?"
    env = get_domain("retail").env(task)

    async def act(name: str, arguments: dict[str, Any]) -> str:
        return env.call(name, arguments, actor="user").output

    def replies(user: ScriptedUser, texts: list[str]) -> list[Any]:
        session = user.session(task, 0)
        asyncio.run(session.start())
        return [asyncio.run(session.reply(text, act)) for text in texts]

    shipped = replies(ScriptedUser(), [proposal, proposal])
    assert is_confirmation(shipped[0].text) and shipped[1].stop == "stop"
    again = replies(reconfirming(), [proposal, proposal, proposal, proposal])
    assert [is_confirmation(r.text) for r in again[:3]] == [True, True, True], again
    assert [r.stop for r in again] == [None, None, None, "stop"]  # twice reopened, then settled
    other = "#W0000001" if oid != "#W0000001" else "#W0000002"
    wrong = replies(reconfirming(), [proposal, f"Shall I cancel order {other}? (yes/no)"])
    assert wrong[1].stop is None and not is_confirmation(wrong[1].text) and oid in wrong[1].text, wrong
    done = replies(reconfirming(), [proposal, f"Done: order {oid} has been cancelled. Shall I help with anything else?"])
    assert done[1].stop == "stop", done
