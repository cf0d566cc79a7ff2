"""The scenario-driven scripted user on a domain of one's own (issue 16).

A small bike-repair shop, written here with muarl's public API only, is played by the *generic* script:
everything the user says and checks comes from each task's Scenario. Also: a task the scripted user
cannot play is an error naming it (never another domain's script), a domain's ``scripted_user`` stand-in
wins over the script, an episode finds its domain's script without a registered name, and the simulator
modules name no built-in domain.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from muarl.domain import Domain, get_domain
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import is_confirmation
from muarl.rollout import run_episode
from muarl.tools import ToolError, tool
from muarl.types import Action, Intent, Message, Scenario, Task
from muarl.users.base import STOP, UserReply, UserSession, UserSimulator
from muarl.users.script import UserScript
from muarl.users.scripted import ScriptedSession, ScriptedUser


# -- the shop ------------------------------------------------------------------------------------------------
@tool(authenticates=True)
def find_customer(db: Any, card_number: str) -> str:
    """Find a customer by loyalty card number; this authenticates them.

    Args:
        card_number: The loyalty card number.
    """
    for cid, row in db.customers.items():
        if row["card_number"] == card_number:
            db.authenticate(cid)
            return cid
    raise ToolError("no such card")


@tool(write=True)
def book_service(db: Any, bike_id: str, date: str) -> str:
    """Book a bike in for a service on a date.

    Args:
        bike_id: The bike id.
        date: The day, YYYY-MM-DD.
    """
    db.bikes.edit(bike_id)["service"] = date
    return f"{bike_id} booked for {date}"


@tool(actor="user")
def check_tyre_pressure(db: Any) -> str:
    """Read the tyre gauge on the customer's own bike."""
    return "front 3.1 bar, rear 2.9 bar"


def _db(seed: int, size: int) -> dict:
    return {"customers": {"C1": {"customer_id": "C1", "card_number": "447120"}},
            "bikes": {"B7": {"bike_id": "B7", "owner": "C1", "service": None},
                      "B9": {"bike_id": "B9", "owner": "C1", "service": None}}}


SHOP = Domain(name="bike-shop-test", description="A bike repair shop.", policy="Authenticate, then help.",
              tools=[find_customer, book_service], user_tools=[check_tyre_pressure], build_db=_db,
              build_tasks=lambda d, seed, counts: [])


def _task(*intents: Intent, known: dict[str, str] | None = None, withheld: list[str] | None = None,
          fact_words: dict[str, list[str]] | None = None, task_id: str = "shop-1") -> Task:
    scenario = Scenario(persona="a cyclist", known=known or {"card_number": "447120", "bike_name": "red racer"},
                        withheld=withheld or [], intents=list(intents), fact_words=fact_words or {})
    return Task(id=task_id, domain=SHOP.name, split="test", family="f", user_id="C1", scenario=scenario,
                instruction="", gold_actions=[])


SERVICE = Intent(description="book a service for your bike on 2026-05-03", action="book_service",
                 args={"bike_id": "B7", "date": "2026-05-03"})


class Talk:
    """One session of the scripted user bound to the shop, with its device wired to an env."""

    def __init__(self, task: Task, seed: int = 0, domain: Domain = SHOP, user: ScriptedUser | None = None):
        self.env = domain.env(task)
        self.session = (user or ScriptedUser()).for_domain(domain).session(task, seed)
        self.opening = asyncio.run(self.session.start()).text

    def __call__(self, agent: str) -> UserReply:
        async def act(name: str, arguments: dict[str, Any]) -> str:
            return self.env.call(name, arguments, actor="user").output

        return asyncio.run(self.session.reply(agent, act))


# -- the generic user plays the shop ---------------------------------------------------------------------------
def test_generic_user_words_its_own_request_and_withholds_until_asked() -> None:
    talk = Talk(_task(SERVICE, withheld=["card_number"]))
    assert "book a service for my bike on 2026-05-03" in talk.opening
    assert "phone" not in talk.opening.lower() and "447120" not in talk.opening
    assert "447120" not in talk("Thanks! Which bike is it?").text
    assert "447120" in talk("Could you please tell me your card number?").text


def test_generic_user_confirms_a_matching_proposal_and_declines_a_mismatching_one() -> None:
    for proposal in ["I can book service with bike id B7 and date 2026-05-03. Would you like me to proceed? (yes/no)",
                     "Shall I book a service for bike B7 on May 3?"]:
        assert is_confirmation(Talk(_task(SERVICE))(proposal).text), proposal
    wrong = Talk(_task(SERVICE))("Shall I book a service for bike B9 on May 3? (yes/no)").text
    assert not is_confirmation(wrong) and "B7" in wrong
    wrong_day = Talk(_task(SERVICE))("Shall I book a service for bike B7 on May 4? (yes/no)").text
    assert not is_confirmation(wrong_day) and "2026-05-03" in wrong_day


def test_generic_user_changes_its_mind() -> None:
    intent = SERVICE.model_copy(update={"first_args": {"bike_id": "B7", "date": "2026-05-02"}})
    talk = Talk(_task(intent))
    assert "2026-05-02" in talk.opening and "2026-05-03" not in talk.opening
    changed = talk("Shall I book service for bike B7 on 2026-05-02? (yes/no)").text
    assert "changed my mind" in changed and "2026-05-03" in changed and not is_confirmation(changed)
    again = talk("Shall I book service for bike B7 on 2026-05-02? (yes/no)").text
    assert "changed my mind" in again and not is_confirmation(again)
    assert is_confirmation(talk("Shall I book service for bike B7 on 2026-05-03? (yes/no)").text)
    bye = talk("Done: B7 booked for 2026-05-03. Is there anything else I can help you with?")
    assert bye.stop == "stop" and STOP in bye.text


def test_generic_user_insists_then_accepts_a_refusal_and_moves_on() -> None:
    free = Intent(description="get the service for free", action="book_service",
                  args={"bike_id": "B7", "date": "2026-05-03"}, out_of_policy=True)
    talk = Talk(_task(free, SERVICE), user=ScriptedUser(insist=2))
    refusal = "I'm sorry, but I can't do that: our policy does not allow free services."
    for _ in range(2):
        reply = talk(refusal)
        assert reply.stop is None and not is_confirmation(reply.text) and re.search(r"please|really", reply.text, re.I)
    moved_on = talk(refusal)
    assert "Alright, I understand." in moved_on.text and "book a service" in moved_on.text and moved_on.stop is None


def test_generic_user_checks_the_answer_and_stops() -> None:
    question = Intent(description="know the price of a service", question="How much is a service?", answer="45.50")
    talk = Talk(_task(question))
    assert "How much is a service?" in talk.opening
    assert "are you sure" in talk("A service costs $39.00.").text.lower()
    done = talk("A service costs $45.50.")
    assert done.stop == "stop" and "thank" in done.text.lower()


def test_say_placeholders_fact_words_and_device_steps() -> None:
    intent = Intent(description="check my tyres", say="My {bike_name} feels slow. My card is {card_number}.",
                    user_actions=[Action(name="check_tyre_pressure", actor="user")])
    talk = Talk(_task(intent, withheld=["card_number"], fact_words={"card_number": ["loyalty card"]}))
    assert talk.opening.endswith("My red racer feels slow.")  # the withheld sentence waits
    assert "447120" in talk("What is the number of your loyalty card?").text
    assert "My card is 447120." in talk("Hmm, I did not get that.").text  # restated, now with the card
    done = talk("Please check tyre pressure on your bike and tell me what it says.")
    assert "front 3.1 bar" in done.text and done.stop == "stop"
    assert [r.name for r in talk.env.log] == ["check_tyre_pressure"]


# -- an episode finds its domain's script without a name ---------------------------------------------------------
class _Says(PolicySession):
    def __init__(self, lines: list[str]):
        self.lines = lines

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        return AgentTurn(message=Message(role="assistant", content=self.lines.pop(0) if self.lines else "Bye."))


class _Policy(Policy):
    name = "lines"

    def __init__(self, lines: list[str]):
        self.lines = lines

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return _Says(list(self.lines))


class _Loud(UserScript):
    def request(self, session: ScriptedSession, goal: Any) -> str:
        return "BIKE SHOP SCRIPT: " + super().request(session, goal)


def test_episode_plays_the_domains_own_script_without_a_registered_name() -> None:
    import dataclasses

    shop = dataclasses.replace(SHOP, name="bike-shop-unregistered", user_script=_Loud())
    task = _task(SERVICE).model_copy(update={"domain": shop.name})
    policy = _Policy(["Shall I book service for bike B7 on 2026-05-03? (yes/no)"])
    traj = asyncio.run(run_episode(shop, task, policy, ScriptedUser(), seed=0))
    users = [m.content for m in traj.messages if m.role == "user"]
    assert "BIKE SHOP SCRIPT" in users[0] and is_confirmation(users[1])


# -- no silent wrong output ---------------------------------------------------------------------------------
@pytest.mark.parametrize("task, missing", [
    (_task(task_id="shop-none"), "no structured scenario"),
    (_task(Intent(description="chat about bikes"), task_id="shop-vague"), "neither an action, a question"),
    (_task(Intent(description="", action="book_service"), task_id="shop-mute"), "no wording"),
    (_task(Intent(description="x", action="book_service", say="Book {frame_size}."), task_id="shop-hole"),
     "{frame_size}"),
    (_task(Intent(description="x", question="Open on Sunday?"), task_id="shop-noanswer"), "no answer"),
    (_task(SERVICE, withheld=["email"], task_id="shop-ghost"), "email"),
])
def test_a_task_the_user_cannot_play_is_an_error_naming_it(task: Task, missing: str) -> None:
    for user in (ScriptedUser().for_domain(SHOP), ScriptedUser()):
        with pytest.raises(ValueError, match=re.escape(task.id)) as err:
            user.session(task, 0)
        assert missing in str(err.value)


def test_an_unknown_domain_gets_the_generic_script_never_another_domains() -> None:
    task = _task(SERVICE).model_copy(update={"domain": "nobody-registered-this"})
    opening = asyncio.run(ScriptedUser().session(task, 0).start()).text
    assert "book a service for my bike" in opening and "phone" not in opening.lower()


class _StandIn(UserSimulator):
    name = "stand-in"

    def session(self, task: Task, seed: int) -> UserSession:
        class _S(UserSession):
            async def start(self) -> UserReply:
                return UserReply(text="I am the shop's own user.")

            async def reply(self, agent_text: str, act: Any) -> UserReply:
                return UserReply(text=f"Bye. {STOP}", stop="stop")

        return _S()


def test_a_domains_scripted_user_stand_in_wins_even_when_tasks_have_intents() -> None:
    import dataclasses

    shop = dataclasses.replace(SHOP, scripted_user=_StandIn())
    session = ScriptedUser().for_domain(shop).session(_task(SERVICE), 0)
    assert asyncio.run(session.start()).text == "I am the shop's own user."
    traj = asyncio.run(run_episode(shop, _task(SERVICE), _Policy(["Hi!"]), ScriptedUser(), seed=0))
    assert traj.messages[1].content == "I am the shop's own user."
    assert _StandIn().for_domain(shop) is not None  # the base class's default: the simulator itself


# -- the built-in domains bring their own scripts --------------------------------------------------------------
def test_simulator_modules_name_no_builtin_domain() -> None:
    users = Path(__file__).resolve().parents[1] / "src" / "muarl" / "users"
    named = [f"{p.name}:{n}" for p in sorted(users.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"retail|airline|telecom", line, re.I)]
    assert not named, named


def test_builtin_domains_and_their_narrowed_views_carry_their_scripts() -> None:
    retail = get_domain("retail").user_script
    assert isinstance(retail, UserScript) and type(retail) is not UserScript
    for name in ("retail-lite", "retail-lite-forgetful"):
        assert get_domain(name).user_script is retail
    for name in ("airline", "telecom"):
        assert isinstance(get_domain(name).user_script, UserScript)
