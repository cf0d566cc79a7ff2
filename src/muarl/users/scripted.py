"""ScriptedUser: a deterministic, model-free simulated user that plays a task's structured :class:`Scenario`.

It is the cheap, reproducible training partner: no API, no GPU, the same seed gives the same user. It never
reads ``gold_actions``; everything it knows comes from the scenario (``known`` facts, ``withheld`` keys and
``intents``). Because it talks to small models that do not phrase things like the expert, it recognises
questions, proposals, refusals and reports by keyword/regex *families* (:mod:`muarl.users.phrases`), not
exact strings, and it checks every proposed action against what it wants before it says yes (a wrong
proposal is corrected, never confirmed). It is deliberately strict about identifiers and lenient about
wording.

This module is the conversation engine only: *when* to answer, confirm, correct, change its mind, insist,
act on the device and stop. *What* it says and checks on a domain comes from that domain's
:class:`~muarl.users.script.UserScript` (``Domain.user_script``; the generic script, driven by the
scenario alone, when the domain brings none). A domain's ``scripted_user`` stand-in, when set, plays
its tasks instead.

Randomness (the choice among paraphrases of its own sentences, the order it reveals facts in) comes only
from ``random.Random(seed)``.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from muarl.types import Task
from muarl.users.base import STOP, Act, SimulatorFault, UserReply, UserSession, UserSimulator
from muarl.users.conversation import Goal
from muarl.users.phrases import (
    ANYTHING_ELSE,
    ASK,
    DONE,
    FAILED,
    NOT_TRANSFER,
    PROPOSAL,
    REFUSAL,
    TRANSFER,
    norm,
)
from muarl.users.script import UserScript, script_of

if TYPE_CHECKING:
    from muarl.domain import Domain

MAX_AGENT_CHARS = 20_000


def registered_domain(name: str) -> Domain | None:
    """The registered domain called ``name``, or None (a domain object that was never registered)."""
    from muarl.domain import get_domain

    try:
        return get_domain(name)
    except (KeyError, ImportError, AttributeError):
        return None


class ScriptedUser(UserSimulator):
    """Deterministic rule-based user. ``max_stale`` bounds agent turns in a row that get it nowhere.

    Bound to a domain (:meth:`for_domain`, which the episode loop calls) it plays that domain's script;
    used on its own it looks the task's domain up by name, and plays the generic script when that name
    is not registered.
    """

    name = "scripted"

    def __init__(self, max_stale: int = 6, max_replies: int = 40, insist: int = 2, reconfirm: int = 0):
        self.max_stale = max_stale
        self.max_replies = max_replies
        self.insist = insist
        #: after its yes, an agent that proposes the same action again (a tool call failed, or it lost
        #: track) gets an answer again, up to this many times per goal; at 0 (the default, with which every
        #: published figure was measured) the agent's next message settles the goal and the user leaves
        self.reconfirm = reconfirm
        self.domain: Domain | None = None

    def for_domain(self, domain: Domain) -> ScriptedUser:
        bound = copy.copy(self)
        bound.domain = domain
        return bound

    def session(self, task: Task, seed: int) -> UserSession:
        domain = self.domain if self.domain is not None else registered_domain(task.domain)
        stand_in = getattr(domain, "scripted_user", None)
        if stand_in is not None and stand_in is not self:  # the domain's own user for its tasks wins
            if isinstance(stand_in, ScriptedUser):
                return stand_in.play(task, seed, domain)
            return (stand_in if domain is None else stand_in.for_domain(domain)).session(task, seed)
        return self.play(task, seed, domain)

    def play(self, task: Task, seed: int, domain: Domain | None) -> ScriptedSession:
        """A session of this user on ``task`` with ``domain``'s script (no stand-in lookup)."""
        if not task.scenario.intents:
            raise ValueError(f"the scripted user cannot play task {task.id!r} of {task.domain}: it has no "
                             "structured scenario (intents); use --user llm:URL#MODEL or replay:FILE.jsonl")
        return ScriptedSession(task, seed, self.max_stale, self.max_replies, self.insist, domain=domain,
                               reconfirm=self.reconfirm)


def reconfirming() -> ScriptedUser:
    """The scripted user that answers a proposal made again after its yes, twice per goal at most
    (``--user muarl.users.scripted:reconfirming``; research/scripted-user-reconfirm.md: it trained a
    worse agent than the shipped user on dev, so it is not the default)."""
    return ScriptedUser(reconfirm=2)


class ScriptedSession(UserSession):
    """One episode's scripted user; see the module docstring for the behaviour.

    ``script`` defaults to ``domain``'s (``domain`` defaults to the registered domain of the task); a
    task the script cannot play raises ``ValueError`` here, before the conversation.
    """

    def __init__(self, task: Task, seed: int, max_stale: int = 6, max_replies: int = 40, insist: int = 2,
                 *, script: UserScript | None = None, domain: Domain | None = None, reconfirm: int = 0):
        self.task = task
        self.scenario = task.scenario
        self.domain = domain if domain is not None or script is not None else registered_domain(task.domain)
        self.script = script if script is not None else script_of(self.domain)
        self.script.check(task)
        self.known = dict(task.scenario.known)
        self.withheld = set(task.scenario.withheld)
        self.rng = random.Random(seed)
        self.goals = [Goal(i) for i in task.scenario.intents]
        self.max_stale, self.max_replies, self.insist, self.reconfirm = max_stale, max_replies, insist, reconfirm
        self.stale = 0
        self.replies = 0
        self.told: set[int] = set()
        #: per-episode state of the script (say, whether the device passed its check)
        self.notes: dict[str, Any] = {}

    # -- public API -----------------------------------------------------------------------------------------
    async def start(self) -> UserReply:
        hello = self.rng.choice(["Hi.", "Hello.", "Hi there.", "Good morning.", "Good afternoon."])
        request = self.request(self.current) if self.current else "I have a question."
        return UserReply(text=f"{hello} {request}".replace(",.", ",").strip())

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        self.replies += 1
        text = norm(agent_text if isinstance(agent_text, str) else "")[:MAX_AGENT_CHARS]
        try:
            reply = await self._respond(text, act)
        except Exception as err:  # a bug of ours, not the agent's fault: a sim fault, kept out of training
            raise SimulatorFault(f"scripted user failed on {agent_text[:80]!r}: {type(err).__name__}: {err}") from err
        if reply.stop is None and self.replies >= self.max_replies:
            return self.stop("This is taking too long; I'll try again another time.")
        return reply

    # -- the decision -----------------------------------------------------------------------------------------
    @property
    def current(self) -> Goal | None:
        return next((g for g in self.goals if g.status != "done"), None)

    async def _respond(self, text: str, act: Act) -> UserReply:
        if not text.strip():
            return self.going_nowhere("Hello? " + self.restate())
        if TRANSFER.search(text) and not NOT_TRANSFER.search(text):
            return UserReply(text=f"Thank you. {STOP}", stop="transfer")
        self._settle_confirmed(text)
        if self._proposes_pending(text):
            reply = self._on_proposal(text)
            if reply is not None:
                return reply
        steps = await self.script.device_turn(self, text, act)
        if steps is not None:
            return steps
        if self.current is None:
            return await self._finish(act)
        handlers: list[Callable[[str], UserReply | None]] = [
            self._on_proposal, self._on_refusal, self._on_facts, self._on_answer, self._on_anything_else,
        ]
        for handler in handlers:
            reply = handler(text)
            if reply is not None:
                return reply
        return self.going_nowhere(self.restate())

    # -- replies the script may give too ----------------------------------------------------------------------
    def progress(self, text: str, stop: str | None = None) -> UserReply:
        """A reply that moves the conversation on (resets the count of turns going nowhere)."""
        self.stale = 0
        return UserReply(text=text, stop=stop)  # type: ignore[arg-type]

    def going_nowhere(self, text: str) -> UserReply:
        """A reply to a turn that got the user nowhere; too many in a row and the user gives up."""
        self.stale += 1
        if self.stale >= self.max_stale:
            return self.stop("We are going in circles; I'll try again later.")
        return UserReply(text=text)

    def stop(self, text: str) -> UserReply:
        """The user's last words (###STOP### appended)."""
        return UserReply(text=f"{text} {STOP}", stop="stop")

    def after_done(self, lead: str) -> UserReply:
        """``lead``, then the next request, or the end when nothing is left."""
        nxt = self.current
        if nxt is None:
            return self.stop(f"{lead} That's everything I needed, thank you!".strip())
        self.told.add(id(nxt))
        return self.progress(f"{lead} {self.request(nxt)}".strip())

    async def do(self, act: Act, name: str, args: dict[str, Any]) -> str:
        """Run one device (user) tool; a step of a goal's ``user_actions`` is marked performed."""
        out = str(await act(name, args))
        for goal in self.goals:
            if any(a.name == name for a in goal.intent.user_actions):
                goal.performed.append(name)
        return out

    def settle_steps(self) -> bool:
        """Mark done the goals whose device steps are all performed (and whose action, if any, was
        confirmed); whether any was."""
        settled = False
        for goal in self.goals:
            if goal.intent.user_actions and goal.status != "done" and goal.steps_done \
                    and (goal.intent.action is None or goal.status == "confirmed"):
                goal.status = "done"
                settled = True
        return settled

    async def _finish(self, act: Act) -> UserReply:
        """All goals done: the script may verify the outcome first (say, a speed test), then end."""
        verified = await self.script.verify(self, act)
        if verified is not None:
            return verified
        return self.stop(self.rng.choice(["Great, that's everything I needed. Thank you!",
                                          "Perfect, thanks a lot for your help!",
                                          "That's all, thank you. Goodbye!"]))

    def _settle_confirmed(self, text: str) -> None:
        """After a yes, the agent's next words say whether the action went through: a failure, or (with
        ``reconfirm``) the same action proposed again, puts it back to pending."""
        for goal in self.goals:
            if goal.status != "confirmed":
                continue
            if FAILED.search(text) and not DONE.search(text):
                goal.status = "pending"
            elif goal.reopened < self.reconfirm and not DONE.search(text) and PROPOSAL.search(text) and \
                    goal.intent.action and self.script.names_action(goal.intent.action, text):
                goal.reopened += 1
                goal.status = "pending"
            elif goal.steps_done:
                goal.status = "done"

    def _proposes_pending(self, text: str) -> bool:
        """A proposal naming the action of a goal still pending (handled before any device step it mentions)."""
        if not PROPOSAL.search(text):
            return False
        return any(g.status == "pending" and g.intent.action and self.script.names_action(g.intent.action, text)
                   for g in self.goals)

    # -- proposals ------------------------------------------------------------------------------------------
    def _on_proposal(self, text: str) -> UserReply | None:
        if not PROPOSAL.search(text):
            return None
        pending = [g for g in self.goals if g.status == "pending" and g.intent.action]
        about = [g for g in pending if self.script.names_action(g.intent.action or "", text)]
        if not about:
            if self._asked_facts(text):
                return None
            cur = self.current
            if cur is not None and cur.intent.action is None and not cur.intent.user_actions:
                return None
            if cur is not None and not cur.intent.action and ASK.search(text):
                return None  # a question about a device step, not a proposal for anything the user wants
            return self.going_nowhere(f"No, that's not what I want. {self.restate()}")
        goal = about[0]
        verdict, why = self.check_proposal(goal, text)
        if verdict == "ok":
            goal.status = "confirmed"
            if not goal.intent.user_actions:
                goal.performed = []
            return self.progress(self.rng.choice(["Yes, please go ahead.", "Yes, that's right. Please go ahead.",
                                                  "Yes, please proceed.", "Yes, go ahead please."]))
        if verdict == "first" and goal.intent.first_args is not None and not goal.changed_mind:
            goal.changed_mind = True
            return self.progress(f"Wait, actually I've changed my mind. {self.script.change_of_mind(self, goal)}")
        if verdict == "first":
            return self.progress(f"No, as I said, I changed my mind. {self.script.change_of_mind(self, goal)}")
        if self._asked_facts(text):
            return None  # "which order would you like me to cancel?" is a question, not a wrong proposal
        return self.going_nowhere(f"No, that's not right: {why}. {self.request(goal, again=True)}")

    def check_proposal(self, goal: Goal, text: str) -> tuple[str, str]:
        """("ok" | "first" | "wrong", why): does the proposal in ``text`` match what the user wants?

        "first" means it matches the request the user made before changing its mind. Until the user has
        changed its mind, a proposal of what it will settle on later is wrong: the user has not asked for
        it yet, so an agent that swaps in something else the user did not say (the other cancellation
        reason, one item of two) is corrected instead of being rewarded for a lucky guess.
        """
        intent = goal.intent
        final = self.script.mismatch(self, goal, intent.args, text, True)
        if intent.first_args is not None:
            first = self.script.mismatch(self, goal, intent.first_args, text, False)
            if not goal.changed_mind:
                return ("first", "") if first is None else ("wrong", first)
            return ("ok", "") if final is None else ("first", "") if first is None else ("wrong", final)
        return ("ok", "") if final is None else ("wrong", final)

    # -- refusals (out-of-policy requests) ------------------------------------------------------------------
    def _on_refusal(self, text: str) -> UserReply | None:
        goal = self.current
        if goal is None or not REFUSAL.search(text):
            return None
        if goal.intent.out_of_policy or (goal.intent.action and goal.status == "pending"):
            if goal.insisted < self.insist:
                goal.insisted += 1
                return self.progress(self.rng.choice([
                    "Please, this is really important to me. Can't you make an exception just this once?",
                    "I really need this done. Isn't there anything you can do about it?",
                    "Come on, I've been a loyal customer. Please just do it this time.",
                ]))
            goal.status = "done"
            return self.after_done("Alright, I understand.")
        return None

    # -- questions for facts --------------------------------------------------------------------------------
    def _asked_facts(self, text: str) -> list[str]:
        return self.script.asked_facts(self, text)

    def _on_facts(self, text: str) -> UserReply | None:
        asked = self._asked_facts(text)
        if not asked:
            return None
        facts = self.facts()
        answers = [self.fact_sentence(k, facts) for k in asked]
        answers = [a for a in answers if a]
        if not answers:
            return None
        self.withheld -= set(asked)
        return self.progress(" ".join(dict.fromkeys(answers)))

    def facts(self) -> dict[str, str]:
        """What the user can say right now (the script decides: identity, the current goal's facts ...)."""
        return self.script.facts(self)

    def fact_sentence(self, key: str, facts: dict[str, str]) -> str:
        """One sentence giving ``key``, or saying the user does not know it."""
        return self.script.fact_sentence(self, key, facts)

    # -- info questions -------------------------------------------------------------------------------------
    def _on_answer(self, text: str) -> UserReply | None:
        goal = self.current
        if goal is None or goal.intent.question is None or goal.intent.answer is None:
            return None
        if self.script.answered(goal, text):
            goal.status = "done"
            return self.after_done(self.rng.choice(["Thanks, that's what I wanted to know.",
                                                    "Great, thank you for checking."]))
        if _AMOUNT.search(text) and not ASK.search(text):
            return self.going_nowhere(f"Hmm, are you sure? {goal.intent.question}")
        return None

    def _on_anything_else(self, text: str) -> UserReply | None:
        goal = self.current
        if goal is None or not ANYTHING_ELSE.search(text):
            return None
        if id(goal) in self.told:
            return self.going_nowhere(self.restate())
        self.told.add(id(goal))
        return self.progress(self.request(goal))

    # -- requests in words ----------------------------------------------------------------------------------
    def request(self, goal: Goal, again: bool = False) -> str:
        """The goal as the user would put it, without withheld facts."""
        return self.script.request(self, goal)

    def restate(self) -> str:
        goal = self.current
        if goal is None:
            return "I think we're done."
        lead = self.rng.choice(["As I said,", "Just to repeat:", "Again,"])
        return f"{lead} {self.request(goal)[:1].lower()}{self.request(goal)[1:]}"


#: an amount in the agent's words ("$12", "12.50"): an answer it gives that is not the one wanted
_AMOUNT = re.compile(r"\$\s?\d|\b\d+\.\d\d\b")
