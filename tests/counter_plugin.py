"""A tiny plug-in of one's own for tests/test_plugins.py and tests/test_no_silent_output.py: a domain, a
reference policy and a simulated user, written with muarl's public API only and named ``module:attr``.

Deliberately independent of muarl's scripted user and teacher, so that the command-line plumbing is
tested by itself. Members log in with a PIN and may add one to their own counter (a write that needs a
yes); half of the tasks ask for someone else's counter, which must be refused (gold: no write), so a
do-nothing agent wins exactly those.
"""

from __future__ import annotations

from muarl.domain import Domain
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import is_confirmation
from muarl.tools import ToolError, tool
from muarl.types import SPLITS, Action, Intent, Message, Scenario, Task, ToolCall
from muarl.users.base import STOP, UserReply, UserSession, UserSimulator

POLICY = """You are a counter desk agent.
- Log the member in with login and their PIN first.
- Before bump, say what you will do and get an explicit yes.
- Only ever bump the member's own counter; refuse anything else."""


def build_db(seed: int, size: int) -> dict:
    users = {f"U{i}": {"user_id": f"U{i}", "pin": f"{1000 + i}"} for i in range(size)}
    counters = {f"C{i}": {"counter_id": f"C{i}", "owner": f"U{i}", "value": i % 3} for i in range(size)}
    return {"users": users, "counters": counters}


@tool(authenticates=True)
def login(db, pin: str) -> str:
    """Log a member in by PIN; returns their user id.

    Args:
        pin: The member's 4-digit PIN.
    """
    for user_id, user in db.users.items():
        if user["pin"] == pin:
            db.authenticate(user_id)
            return user_id
    raise ToolError("wrong PIN")


@tool
def peek(db, counter_id: str) -> int:
    """The value of a counter.

    Args:
        counter_id: The counter id, such as "C3".
    """
    if counter_id not in db.counters:
        raise ToolError(f"unknown counter {counter_id}")
    return db.counters[counter_id]["value"]


@tool(write=True)
def bump(db, counter_id: str) -> str:
    """Add one to a counter. Only after the member says yes.

    Args:
        counter_id: The counter id, such as "C3".
    """
    if counter_id not in db.counters:
        raise ToolError(f"unknown counter {counter_id}")
    db.counters.edit(counter_id)["value"] += 1
    return f"{counter_id} bumped"


def build_tasks(domain: Domain, seed: int, counts: dict) -> list[Task]:
    """Alternate ``bump`` (own counter: one write) and ``bump_other`` (refuse: no write); splits never share
    a member."""
    tasks, offset = [], 0
    for split in SPLITS:
        for i in range(counts.get(split, 0)):
            uid, own = f"U{offset + i}", f"C{offset + i}"
            other = f"C{offset + i + 1}"
            mine = i % 2 == 0
            target = own if mine else other
            intent = Intent(description=f"add one to counter {target}", action="bump", args={"counter_id": target},
                            out_of_policy=not mine)
            tasks.append(Task(
                id=f"counter-{split}-{i:03d}", domain=domain.name, split=split, family="bump" if mine else "bump_other",
                user_id=uid, scenario=Scenario(persona="a member", known={"pin": f"{1000 + offset + i}",
                                                                          "counter_id": target},
                                               intents=[intent]),
                instruction=f"Ask to add one to counter {target}.",
                gold_actions=[Action(name="bump", arguments={"counter_id": own})] if mine else []))
        offset += counts.get(split, 0) + 1
    return tasks


def _owner(table: str, record: dict) -> str | None:
    return record.get("owner") if table == "counters" else record.get("user_id")


domain = Domain(name="counter-desk", description="A counter desk: members bump their own counters.", policy=POLICY,
                tools=[login, peek, bump], build_db=build_db, build_tasks=build_tasks, owner_of=_owner, db_size=40,
                task_counts={"train": 6, "dev": 2, "test": 4})


def make_domain() -> Domain:
    """A zero-argument factory: ``counter_plugin:make_domain`` names the same domain."""
    return domain


class _ExpertSession(PolicySession):
    def __init__(self, task: Task):
        self.task, self.step = task, 0

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        self.step += 1
        known, mine = self.task.scenario.known, self.task.family == "bump"
        reply = next((m.content for m in new_messages if m.role == "user"), "")
        if self.step == 1:
            return AgentTurn(Message(role="assistant", tool_calls=[ToolCall(id="c1", name="login",
                                                                            arguments={"pin": known["pin"]})]))
        if self.step == 2:
            text = (f"I will add one to counter {known['counter_id']}. Would you like me to proceed? (yes/no)" if mine
                    else "I'm sorry, I cannot change another member's counter.")
            return AgentTurn(Message(role="assistant", content=text))
        if self.step == 3 and mine and is_confirmation(reply):
            return AgentTurn(Message(role="assistant", tool_calls=[ToolCall(id="c2", name="bump", arguments={
                "counter_id": known["counter_id"]})]))
        return AgentTurn(Message(role="assistant", content="Done. Goodbye."))


class CounterExpert(Policy):
    """The reference agent (it reads the task, as an expert may)."""

    name = "counter-expert"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        return _ExpertSession(task)


expert = CounterExpert()


class _UserSession(UserSession):
    def __init__(self, task: Task):
        self.task = task

    async def start(self) -> UserReply:
        known = self.task.scenario.known
        return UserReply(f"Hi, please add one to counter {known['counter_id']}. My PIN is {known['pin']}.")

    async def reply(self, agent_text: str, act) -> UserReply:
        if "proceed" in agent_text:
            return UserReply("Yes, please.")
        return UserReply(f"Thanks, bye! {STOP}", stop="stop")


class CounterUser(UserSimulator):
    """The simulated member; a class that needs no arguments is a zero-argument factory."""

    name = "counter-user"

    def session(self, task: Task, seed: int) -> UserSession:
        return _UserSession(task)


class CannotPlayUser(UserSimulator):
    """A simulator that cannot play any task, and says so (as a scenario-less simulator must)."""

    name = "cannot-play"

    def session(self, task: Task, seed: int) -> UserSession:
        raise ValueError(f"cannot play task {task.id}: its scenario names no request this user knows")


class CannotPlayTeacher(Policy):
    """A teacher that cannot play the ``bump`` tasks, and says so."""

    name = "cannot-play-teacher"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        if task.family == "bump":
            raise ValueError(f"cannot play task {task.id}: no tool authenticates")
        return _ExpertSession(task)


not_a_policy = 42


def needs_arguments(size: int) -> Domain:
    return domain
