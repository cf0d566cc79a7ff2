"""ScriptedUser: a deterministic, model-free simulated user that plays a task's structured :class:`Scenario`.

It is the cheap, reproducible training partner: no API, no GPU, the same seed gives the same user. It never
reads ``gold_actions``; everything it knows comes from the scenario (``known`` facts, ``withheld`` keys and
``intents``). Because it talks to small models that do not phrase things like the expert, it recognises
questions, proposals, refusals and phone instructions by keyword/regex *families*, not exact strings, and
it checks every proposed action against what it wants before it says yes (a wrong proposal is corrected,
never confirmed). It is deliberately strict about identifiers and lenient about wording.

Randomness (the choice among paraphrases of its own sentences, the order it reveals facts in) comes only
from ``random.Random(seed)``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from muarl.types import Intent, Task
from muarl.users.base import Act, SimulatorFault, UserReply, UserSession, UserSimulator

STOP = "###STOP###"
MAX_AGENT_CHARS = 20_000


# -- text helpers -------------------------------------------------------------------------------------------
def norm(text: str) -> str:
    """Lower-case, straight quotes, collapsed whitespace: the form every pattern below is matched on."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return " ".join(text.lower().split())


_NUM = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """Every number written in ``text`` ($1,234.50 -> 1234.5)."""
    plain = text.replace(",", "").replace("$", " ")
    return [float(n) for n in _NUM.findall(plain)]


def says_number(text: str, value: float) -> bool:
    return any(abs(n - value) < 0.005 for n in numbers(text))


def says(text: str, value: str) -> bool:
    """Whether ``text`` (normalised) mentions ``value`` as a whole word or phrase (numbers by value)."""
    target = norm(str(value)).strip()
    if not target:
        return False
    if re.fullmatch(r"-?\d+(?:\.\d+)?", target.replace(",", "").replace("$", "")):
        return says_number(text, float(target.replace(",", "").replace("$", "")))
    return re.search(rf"(?<![\w]){re.escape(target)}(?![\w])", text) is not None


_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]


def says_date(text: str, iso: str) -> bool:
    """An ISO date written as 2024-05-29, May 29 or 29 May (the year optional in words)."""
    if iso in text:
        return True
    try:
        _, month, day = (int(p) for p in iso.split("-"))
    except ValueError:
        return False
    name = _MONTHS[month - 1]
    return re.search(rf"\b({name}|{name[:3]})\.? {day}(st|nd|rd|th)?\b|\b{day}(st|nd|rd|th)? (of )?({name}|{name[:3]})\b",
                     text) is not None


def first_person(text: str) -> str:
    """Turn a scenario's second-person symptom ("your phone ...") into the user's own words."""
    swaps = [(r"\byou are\b", "I am"), (r"\byou're\b", "I'm"), (r"\byou have\b", "I have"),
             (r"\byou've\b", "I've"), (r"\byour\b", "my"), (r"\byourself\b", "myself"), (r"\byou\b", "I")]
    for pattern, repl in swaps:
        text = re.sub(pattern, repl, text)
    return text[:1].upper() + text[1:]


def sentences(text: str) -> list[str]:
    """Split agent text into sentences (keeping '?') so an instruction and a question are told apart."""
    parts = re.split(r"(?<=[.!?])\s+|\n+|;\s+", text)
    return [p.strip() for p in parts if p.strip()]


def _cabin_words(text: str) -> set[str]:
    """Cabins named in ``text``; "basic economy" is not also "economy"."""
    found = set()
    if re.search(r"\bbusiness\b", text):
        found.add("business")
    if re.search(r"\bbasic[ _-]?economy\b", text):
        found.add("basic_economy")
    if re.search(r"(?<!basic )(?<!basic_)(?<!basic-)\beconomy\b", text):
        found.add("economy")
    return found


CABIN_WORDS = {"basic_economy": "basic economy", "economy": "economy", "business": "business"}
PREF_WORDS = {"cheapest": "the cheapest one", "earliest": "the one that leaves earliest",
              "latest": "the one that leaves latest"}

# -- what the agent may be doing ---------------------------------------------------------------------------
_ASK = re.compile(
    r"\?|\b(please|kindly)\b.*\b(provide|share|give|tell|confirm|send|let me know|state|enter|type)\b|"
    r"\b(could|can|would|will) you\b|\bmay i (have|get|know|ask)\b|\bi('ll| will)? need\b|\bneed (your|the)\b|"
    r"\blet me know\b|\bwhat('s| is| are)\b|\bwhich\b|\bprovide\b|\btell me\b"
)
_PROPOSAL = re.compile(
    r"\b(shall|should) i\b|\b(can|may) i (go ahead|proceed|now|cancel|process|submit|make|change|update|book|add|"
    r"send|apply|place|request|enable|suspend|resume|refuel|switch|upgrade|issue|return|exchange|modify|move)\b|"
    r"\bwould you like (me|us) to\b|\bdo you want (me|us) to\b|\bwant me to\b|"
    r"\b(like|want|ok|okay|happy) (for me )?to proceed\b|\bproceed\b|\bgo ahead\b|\(yes/no\)|\byes or no\b|"
    r"\bconfirm (that|this|the (above|following|change|details|action|cancellation|return|exchange|"
    r"modification|booking|request|update|refuel|upgrade))\b|\bplease confirm\b|\bdo you confirm\b|"
    r"\b(is|does) (that|this) (ok|okay|correct|right|fine|sound good|look good|work)\b|\bare you sure\b|"
    r"\bcan you confirm\b|\bcould you confirm\b|\bi('ll| will) (now )?(go ahead|proceed)\b"
)
_REFUSAL = re.compile(
    r"\b(can ?not|can't|cant|unable|not able|won't be able|not allowed|not permitted|not possible|"
    r"not eligible|isn't eligible|is not eligible|ineligible|don't allow|does not allow|doesn't allow|"
    r"against (our|the) policy|policy (does not|doesn't|won't)|i'm afraid|unfortunately|must decline|"
    r"have to decline|not something i can)\b"
)
_DONE = re.compile(
    r"\b(done|completed?|successful(ly)?|has been|have been|is now|are now|was (cancel|process|updat|"
    r"submit|sent|chang|modif|return|exchang|book|add|suspend|resum|enabl)\w*|i('ve| have) "
    r"(cancel|process|updat|submit|sent|chang|modif|return|exchang|book|add|suspend|resum|enabl|refuel|"
    r"request|issu|credit)\w*|all set|went through|confirmed)\b"
)
_FAILED = re.compile(r"\b(error|failed|fail|could not|couldn't|was not able|wasn't able|did not go through|"
                     r"didn't go through|went wrong|problem (with|processing))\b")
_ANYTHING_ELSE = re.compile(r"\banything else\b|\bsomething else\b|\bother (request|question)s?\b|"
                            r"\bhow (can|may) i help\b|\bwhat can i do for you\b|\bhow can i assist\b|"
                            r"\bwhat (do|would) you (need|like)\b|\bhelp you (with )?today\b")
_TRANSFER = re.compile(r"\btransfer(ring|red)? (you|your call|the call|this)\b|\b(connect|hand) you (over )?"
                       r"(to|with) (a |an )?(human|live|specialist|colleague|agent|representative)|"
                       r"\bhuman (agent|representative)\b.*\b(now|shortly|will)\b")
_NOT_TRANSFER = re.compile(r"\b(can ?not|can't|won't|will not|don't|do not|unable to) (transfer|connect)")

#: per action: words that name it (a proposal with none of them is not about that action)
ACTION_VERBS: dict[str, str] = {
    "cancel_pending_order": r"cancel",
    "cancel_reservation": r"cancel",
    "return_delivered_order_items": r"return|refund",
    "exchange_delivered_order_items": r"exchang|swap|replac|switch|chang",
    "modify_pending_order_items": r"modif|exchang|swap|replac|switch|chang|updat",
    "modify_pending_order_address": r"address|ship",
    "modify_user_address": r"address",
    "modify_pending_order_payment": r"payment",
    "book_reservation": r"book|reserv",
    "update_reservation_flights": r"chang|mov|switch|upgrad|rebook|updat|modif|downgrad|replac",
    "update_reservation_baggages": r"bag|luggage|suitcase",
    "update_reservation_passengers": r"passenger|name|birth|traveller|traveler|correct|updat",
    "send_certificate": r"certificate|compensat|voucher|credit",
    "refuel_data": r"refuel|top.?up|extra data|add|data",
    "enable_roaming": r"roaming",
    "disable_roaming": r"roaming",
    "change_plan": r"plan",
    "suspend_line": r"suspend|block|deactivat|disabl|freez",
    "resume_line": r"resum|reactivat|restor|unsuspend|reconnect|turn .{0,20}back on",
    "send_payment_request": r"payment request|request (for )?(a )?payment|send .{0,30}request|request .{0,30}bill",
}


# -- facts the user can give -------------------------------------------------------------------------------
#: fact key -> what an agent says when it asks for it
FACT_PATTERNS: dict[str, str] = {
    "email": r"e-?mail",
    "name": r"\b(your|full|first|last|sur)\s*name\b|\bname (on|for) (the|your) account\b|\bwho (am i|is this)\b|"
            r"\bname and\b|\band name\b",
    "zip": r"\bzip\b|\bpostal\b|\bpost ?code\b",
    "order_id": r"\border (id|number|#|no\b|code|reference)|\bwhich order\b|\bwhat order\b|\border you\b|"
                r"\border (is|are) (this|it|you)\b|\border in question\b",
    "reason": r"\breason\b|\bwhy\b",
    "items": r"\bwhich (item|product)s?\b|\bwhat (item|product)s?\b|\b(item|product)s? (would|do) you\b|"
             r"\b(item|product)s? you (want|would like|wish)\b|\bwhich ones?\b",
    "new_address": r"\b(new|shipping|delivery|mailing|street|home|default) address\b|\baddress (should|would|do you|"
                   r"to use|you want)\b|\bwhere (should|would|do) .{0,30}(ship|send|deliver|move)\b|\bmoving to\b",
    "payment": r"\bpayment( method)?\b|\bpay (with|for|by)\b|\bcard\b|\brefund (go|be sent|to)\b|\bhow would you like "
               r"to pay\b|\bwhich method\b|\bcharge\b",
    "user_id": r"\buser ?(id|name)\b|\baccount (id|number)\b|\bmember(ship)? (id|number)\b",
    "reservation_id": r"\breservation (id|number|code|#|no\b|reference)|\bbooking (reference|code|id|number)|"
                      r"\bconfirmation (code|number)\b|\bwhich (reservation|booking)\b|\brecord locator\b|\bpnr\b",
    "new_date": r"\b(which|what|new) (date|day)\b|\bwhen would you\b|\bwhat date\b|\bdate (would|do) you\b",
    "cabin": r"\bcabin\b|\bclass\b",
    "bags": r"\bhow many (checked )?(bag|suitcase|piece)s?\b|\bnumber of (checked )?bags\b",
    "passengers": r"\bpassengers?\b|\btravell?ers?\b|\bwho (is|will be) (travell?ing|flying)\b",
    "insurance": r"\binsurance\b",
    "trip": r"\b(origin|destination)\b|\bwhere (are you|would you like to) (fly|go|travel)|\bflying (to|from)\b",
    "flight_number": r"\bflight (number|no\b)|\bwhich flight\b",
    "dob": r"\bdate of birth\b|\bbirth ?date\b|\bdob\b|\bborn\b|\bbirthday\b",
    "phone_number": r"\b(phone|mobile|cell|cellphone|telephone|line|contact) (number|no\b)|\bwhich (number|line)\b|"
                    r"\bnumber (on|associated|linked|registered|tied)\b|\byour number\b|\bnumber you(\'re| are) "
                    r"calling\b|\bphone number\b",
    "customer_id": r"\bcustomer (id|number)\b|\baccount (id|number)\b",
    "symptom": r"\bwhat('s| is| seems to be)? ?(happening|going on|wrong|the (problem|issue|trouble))\b|\bdescribe\b|"
               r"\bwhat (problem|issue|trouble)\b|\bsymptoms?\b|\btell me more\b|\bwhat exactly\b|"
               r"\bwhat (kind of|sort of) (problem|issue)\b|\bexperiencing\b",
    "location": r"\bwhere are you\b|\bwhich country\b|\bare you (abroad|travell?ing|overseas)\b|\bcurrent location\b",
    "lost_phone_number": r"\b(lost|stolen|missing) (phone|device|line)\b.*\b(number|line)\b|\bnumber of the "
                         r"(lost|stolen|other)\b|\bwhich (line|number|phone) (should|would|do|was)\b",
    "gb_amount": r"\bhow (much|many) (data|gb|gigabytes?)\b|\bhow much (extra )?data\b",
    "data_need": r"\bhow much data (do you|would you) need\b|\bdata (do you need|requirements?|needs?)\b",
}


@dataclass
class Goal:
    """One intent and how far the conversation has got with it."""

    intent: Intent
    status: str = "pending"  # pending | confirmed | done
    changed_mind: bool = False
    insisted: int = 0
    performed: list[str] = field(default_factory=list)

    @property
    def wanted(self) -> dict[str, Any]:
        """The args the user currently asks for: ``first_args`` until it has changed its mind."""
        if self.intent.first_args is not None and not self.changed_mind:
            return dict(self.intent.first_args)
        return dict(self.intent.args)

    @property
    def steps_done(self) -> bool:
        names = [a.name for a in self.intent.user_actions]
        return all(n in self.performed for n in names)


class ScriptedUser(UserSimulator):
    """Deterministic rule-based user. ``max_stale`` bounds agent turns in a row that get it nowhere."""

    name = "scripted"

    def __init__(self, max_stale: int = 6, max_replies: int = 40, insist: int = 2):
        self.max_stale = max_stale
        self.max_replies = max_replies
        self.insist = insist

    def session(self, task: Task, seed: int) -> UserSession:
        if not task.scenario.intents:  # no structured scenario: the domain may bring its own data-driven user
            from muarl.domain import get_domain

            try:
                stand_in = get_domain(task.domain).scripted_user
            except KeyError:  # a domain object that was never registered
                stand_in = None
            if stand_in is None:
                raise ValueError(f"the scripted user cannot play task {task.id!r} of {task.domain}: it has no "
                                 "structured scenario (intents); use --user llm:URL#MODEL or replay:FILE.jsonl")
            return stand_in.session(task, seed)
        return ScriptedSession(task, seed, self.max_stale, self.max_replies, self.insist)


class ScriptedSession(UserSession):
    """One episode's scripted user; see the module docstring for the behaviour."""

    def __init__(self, task: Task, seed: int, max_stale: int = 6, max_replies: int = 40, insist: int = 2):
        self.task = task
        self.scenario = task.scenario
        self.known = dict(task.scenario.known)
        self.withheld = set(task.scenario.withheld)
        self.rng = random.Random(seed)
        self.goals = [Goal(i) for i in task.scenario.intents]
        self.max_stale, self.max_replies, self.insist = max_stale, max_replies, insist
        self.stale = 0
        self.replies = 0
        self.speed_ok: bool | None = None
        self.told: set[str] = set()

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
            return self._stop("This is taking too long; I'll try again another time.")
        return reply

    # -- the decision -----------------------------------------------------------------------------------------
    @property
    def current(self) -> Goal | None:
        return next((g for g in self.goals if g.status != "done"), None)

    async def _respond(self, text: str, act: Act) -> UserReply:
        if not text.strip():
            return self._stale("Hello? " + self.restate())
        if _TRANSFER.search(text) and not _NOT_TRANSFER.search(text):
            return UserReply(text=f"Thank you. {STOP}", stop="transfer")
        self._settle_confirmed(text)
        if self._proposes_pending(text):
            reply = self._on_proposal(text)
            if reply is not None:
                return reply
        steps = await self._phone_steps(text, act)
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
        return self._stale(self.restate())

    def _progress(self, text: str, stop: str | None = None) -> UserReply:
        self.stale = 0
        return UserReply(text=text, stop=stop)  # type: ignore[arg-type]

    def _stale(self, text: str) -> UserReply:
        self.stale += 1
        if self.stale >= self.max_stale:
            return self._stop("We are going in circles; I'll try again later.")
        return UserReply(text=text)

    def _stop(self, text: str) -> UserReply:
        return UserReply(text=f"{text} {STOP}", stop="stop")

    async def _finish(self, act: Act) -> UserReply:
        """All goals done: verify a phone fix with a speed test first (telecom), then end."""
        if self._needs_speed_test() and not self.speed_ok:
            result = await self._do(act, "run_speed_test", {})
            if not self.speed_ok:
                return self._stale(f"I ran a speed test myself: {result} It still doesn't work.")
            return self._stop(f"I just ran a speed test: {result} It works now, thank you!")
        return self._stop(self.rng.choice(["Great, that's everything I needed. Thank you!",
                                           "Perfect, thanks a lot for your help!",
                                           "That's all, thank you. Goodbye!"]))

    def _needs_speed_test(self) -> bool:
        connectivity = "symptom" in self.known and any(
            g.intent.user_actions or not (g.intent.action or g.intent.question) for g in self.goals)
        return connectivity and not any(g.intent.out_of_policy for g in self.goals)

    def _settle_confirmed(self, text: str) -> None:
        """After a yes, the agent's next words say whether the action went through."""
        for goal in self.goals:
            if goal.status != "confirmed":
                continue
            if _FAILED.search(text) and not _DONE.search(text):
                goal.status = "pending"
            elif goal.steps_done:
                goal.status = "done"

    def _after_done(self, lead: str) -> UserReply:
        nxt = self.current
        if nxt is None:
            return self._stop(f"{lead} That's everything I needed, thank you!".strip())
        self.told.add(id(nxt))
        return self._progress(f"{lead} {self.request(nxt)}".strip())

    def _proposes_pending(self, text: str) -> bool:
        """A proposal naming the action of a goal still pending (handled before any phone step it mentions)."""
        if not _PROPOSAL.search(text):
            return False
        return any(g.status == "pending" and g.intent.action
                   and re.search(ACTION_VERBS.get(g.intent.action, r"$^"), text) for g in self.goals)

    # -- proposals ------------------------------------------------------------------------------------------
    def _on_proposal(self, text: str) -> UserReply | None:
        if not _PROPOSAL.search(text):
            return None
        pending = [g for g in self.goals if g.status == "pending" and g.intent.action]
        about = [g for g in pending if re.search(ACTION_VERBS.get(g.intent.action or "", r"$^"), text)]
        if not about:
            if self._asked_facts(text):
                return None
            cur = self.current
            if cur is not None and cur.intent.action is None and not cur.intent.user_actions:
                return None
            if cur is not None and not cur.intent.action and _ASK.search(text):
                return None  # a question about a phone step, not a proposal for anything the user wants
            return self._stale(f"No, that's not what I want. {self.restate()}")
        goal = about[0]
        verdict, why = check_proposal(goal, text, self.known)
        if verdict == "ok":
            goal.status = "confirmed"
            if not goal.intent.user_actions:
                goal.performed = []
            return self._progress(self.rng.choice(["Yes, please go ahead.", "Yes, that's right. Please go ahead.",
                                                   "Yes, please proceed.", "Yes, go ahead please."]))
        if verdict == "first" and goal.intent.first_args is not None and not goal.changed_mind:
            goal.changed_mind = True
            return self._progress(f"Wait, actually I've changed my mind. {change_of_mind_text(goal, self.known)}")
        if verdict == "first":
            return self._progress(f"No, as I said, I changed my mind. {change_of_mind_text(goal, self.known)}")
        if self._asked_facts(text):
            return None  # "which order would you like me to cancel?" is a question, not a wrong proposal
        return self._stale(f"No, that's not right: {why}. {self.request(goal, again=True)}")

    # -- refusals (out-of-policy requests) ------------------------------------------------------------------
    def _on_refusal(self, text: str) -> UserReply | None:
        goal = self.current
        if goal is None or not _REFUSAL.search(text):
            return None
        if goal.intent.out_of_policy or (goal.intent.action and goal.status == "pending"):
            if goal.insisted < self.insist:
                goal.insisted += 1
                return self._progress(self.rng.choice([
                    "Please, this is really important to me. Can't you make an exception just this once?",
                    "I really need this done. Isn't there anything you can do about it?",
                    "Come on, I've been a loyal customer. Please just do it this time.",
                ]))
            goal.status = "done"
            return self._after_done("Alright, I understand.")
        return None

    # -- questions for facts --------------------------------------------------------------------------------
    def _asked_facts(self, text: str) -> list[str]:
        if not _ASK.search(text):
            return []
        facts = self.facts()
        asked = []
        for key, pattern in FACT_PATTERNS.items():
            if re.search(pattern, text) is None:
                continue
            if key == "name" and re.search(r"\b(plan|product|item|file|user ?name)\b", text) and "your name" not in text:
                continue
            if key == "email" and "email" not in facts and not re.search(r"\b(email|e-mail)\b.*\?", text):
                continue
            value = facts.get(key)
            if value is not None and key not in ("name", "zip", "dob") and says(text, value):
                continue  # the agent is stating it, not asking for it
            asked.append(key)
        if "payment" in asked and len(asked) > 1 and not re.search(r"\bpay(ment)? (with|method)\b|\bwhich card\b", text):
            asked.remove("payment")
        return asked

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
        return self._progress(" ".join(dict.fromkeys(answers)))

    def facts(self) -> dict[str, str]:
        """What the user can say right now: identity from ``known``, the rest from the current goal."""
        k = self.known
        facts: dict[str, str] = {key: k[key] for key in ("email", "zip", "user_id", "dob", "phone_number",
                                                         "customer_id", "location", "lost_phone_number",
                                                         "symptom", "passengers", "insurance", "cabin",
                                                         "reservation_id", "order_id", "payment_id",
                                                         "new_address", "new_date") if key in k}
        if "first_name" in k:
            facts["name"] = f"{k['first_name']} {k.get('last_name', '')}".strip()
        elif "full_name" in k:
            facts["name"] = k["full_name"]
        goal = self.current
        if goal is not None:
            facts.update(goal_facts(goal, k))
        return facts

    def fact_sentence(self, key: str, facts: Mapping[str, str]) -> str:
        """One sentence giving ``key``, or saying the user does not know it."""
        value = facts.get(key)
        if key == "email" and value is None and "zip" in facts:
            return (f"I don't remember which email I used, but my name is {facts['name']} and my zip code is "
                    f"{facts['zip']}.")
        if key == "customer_id" and value is None:
            phone = facts.get("phone_number")
            return f"I don't know my customer id, but my phone number is {phone}." if phone else ""
        if value is None:
            return ""
        templates = {
            "email": ["My email is {v}.", "It's {v}.", "The email on the account is {v}."],
            "name": ["My name is {v}.", "I'm {v}.", "It's {v}."],
            "zip": ["My zip code is {v}.", "The zip is {v}."],
            "order_id": ["The order id is {v}.", "It's order {v}."],
            "reason": ["The reason is: {v}.", "It's because it was {v}."],
            "items": ["It's the {v}.", "The {v}."],
            "new_address": ["The new address is {v}.", "It's {v}."],
            "payment": ["Please use {v}.", "{V}, please."],
            "user_id": ["My user id is {v}.", "It's {v}."],
            "reservation_id": ["The reservation id is {v}.", "It's {v}."],
            "new_date": ["I'd like to fly on {v}.", "The new date is {v}."],
            "cabin": ["{V}, please.", "I'd like {v}."],
            "bags": ["{v}.", "I need {v}."],
            "passengers": ["The passengers are: {v}.", "{v}."],
            "insurance": ["{v}.", "{V}, please."],
            "trip": ["{v}.", "{V}."],
            "flight_number": ["It's flight {v}.", "Flight {v}."],
            "dob": ["My date of birth is {v}.", "I was born on {v}."],
            "phone_number": ["My phone number is {v}.", "It's {v}.", "The number is {v}."],
            "customer_id": ["My customer id is {v}.", "It's {v}."],
            "symptom": ["{V}.", "Well, {v}."],
            "location": ["I'm in {v} right now.", "I'm currently in {v}."],
            "lost_phone_number": ["The lost phone's number is {v}.", "It's {v}."],
            "gb_amount": ["{v} GB, please.", "I'd like {v} GB."],
            "data_need": ["{V}.", "I need {v}."],
        }
        pattern = self.rng.choice(templates.get(key, ["{v}."]))
        return pattern.format(v=value, V=value[:1].upper() + value[1:])

    # -- info questions -------------------------------------------------------------------------------------
    def _on_answer(self, text: str) -> UserReply | None:
        goal = self.current
        if goal is None or goal.intent.question is None or goal.intent.answer is None:
            return None
        answer = goal.intent.answer
        if says(text, answer):
            goal.status = "done"
            return self._after_done(self.rng.choice(["Thanks, that's what I wanted to know.",
                                                     "Great, thank you for checking."]))
        if re.search(r"\$\s?\d|\b\d+\.\d\d\b", text) and not _ASK.search(text):
            return self._stale(f"Hmm, are you sure? {goal.intent.question}")
        return None

    def _on_anything_else(self, text: str) -> UserReply | None:
        goal = self.current
        if goal is None or not _ANYTHING_ELSE.search(text):
            return None
        if id(goal) in self.told:
            return self._stale(self.restate())
        self.told.add(id(goal))
        return self._progress(self.request(goal))

    # -- phone steps (dual control) -------------------------------------------------------------------------
    async def _phone_steps(self, text: str, act: Act) -> UserReply | None:
        """Perform the phone steps the agent instructs, in order, and say what the phone showed."""
        if "symptom" not in self.known and "lost_phone_number" not in self.known and "phone_number" not in self.known:
            return None
        plan = phone_plan(text)
        if not plan:
            return None
        cur = self.current
        if any(name == "make_payment" for name, _ in plan) and cur is not None and cur.intent.out_of_policy:
            return self._stale("No, I can't pay anything before next week. I just want my line working.")
        reports = []
        for name, args in plan[:4]:
            reports.append(await self._perform(name, args, text, act))
        reply = " ".join(r for r in reports if r)
        self.stale = 0
        for goal in self.goals:
            if goal.intent.user_actions and goal.status != "done" and goal.steps_done \
                    and (goal.intent.action is None or goal.status == "confirmed"):
                goal.status = "done"
        if self.speed_ok:
            for goal in self.goals:
                if goal.status == "pending" and not (goal.intent.action or goal.intent.question
                                                     or goal.intent.user_actions):
                    goal.status = "done"
        if self.current is None and self.speed_ok:
            return self._stop(f"{reply} It works now, thank you so much!")
        if self.current is None and not self._needs_speed_test():
            return self._stop(f"{reply} That's everything, thank you!")
        return UserReply(text=reply or "Hmm, I am not sure what to do.")

    async def _do(self, act: Act, name: str, args: dict[str, Any]) -> str:
        out = str(await act(name, args))
        for goal in self.goals:
            if any(a.name == name for a in goal.intent.user_actions):
                goal.performed.append(name)
        if name == "run_speed_test":
            self.speed_ok = bool(re.search(r"\((excellent|good)\)", out))
        elif name not in READ_STEPS:
            self.speed_ok = None if not self.speed_ok else self.speed_ok
        return out

    async def _perform(self, name: str, args: dict[str, Any], text: str, act: Act) -> str:
        if name in TOGGLES:
            return await self._toggle(name, args.get("want"), act)
        if name == "make_payment":
            return await self._pay(text, act)
        out = await self._do(act, name, args)
        return describe_output(name, out)

    async def _toggle(self, name: str, want: bool | None, act: Act) -> str:
        """Check the current state first, so "turn off X" never turns an already-off X on."""
        label, reader, field_name = TOGGLES[name]
        state = await self._read_toggle(act, reader, field_name)
        if want is not None and state is not None and state == want:
            return f"{label} is already {'on' if want else 'off'} on my phone."
        out = await self._do(act, name, {})
        return f"I did that. My phone says: \"{out}\""

    async def _read_toggle(self, act: Act, reader: str, field_name: str) -> bool | None:
        out = str(await act(reader, {}))
        if reader == "check_status_bar":
            m = re.search(r"airplane mode: (on|off)", out.lower())
            return None if m is None else m.group(1) == "on"
        try:
            data = json.loads(out)
        except ValueError:
            return None
        value = data.get(field_name) if isinstance(data, dict) else None
        return None if value is None else value == "on"

    async def _pay(self, text: str, act: Act) -> str:
        listing = str(await act("check_payment_requests", {}))
        pending = re.findall(r"B\d{4,}", listing)
        if not pending:
            return "I checked my carrier app but I don't see any payment request."
        named = [b for b in re.findall(r"\bb\d{4,}\b", text)]
        bill = next((b for b in pending if b.lower() in named), pending[0])
        out = await self._do(act, "make_payment", {"bill_id": bill})
        return f"I found the payment request in my app and paid it: \"{out}\""

    # -- requests in words ----------------------------------------------------------------------------------
    def request(self, goal: Goal, again: bool = False) -> str:
        """The goal as the user would put it, without withheld facts."""
        text = request_text(goal, self.known, self.withheld, self.task.domain)
        if again:
            return text
        return text

    def restate(self) -> str:
        goal = self.current
        if goal is None:
            return "I think we're done."
        lead = self.rng.choice(["As I said,", "Just to repeat:", "Again,"])
        return f"{lead} {self.request(goal)[:1].lower()}{self.request(goal)[1:]}"


# -- phone instructions ------------------------------------------------------------------------------------
#: toggle tool -> (label, the read tool showing its state, the field in that tool's output)
TOGGLES: dict[str, tuple[str, str, str]] = {
    "toggle_airplane_mode": ("Airplane mode", "check_status_bar", "airplane_mode"),
    "toggle_mobile_data": ("Mobile data", "check_network_settings", "mobile_data"),
    "toggle_data_roaming": ("Data roaming", "check_network_settings", "data_roaming"),
}
READ_STEPS = {"check_status_bar", "check_network_settings", "check_sim_status", "run_speed_test",
              "check_payment_requests"}
_IMPERATIVE = re.compile(
    r"\b(turn|switch|toggle|disable|enable|deactivate|activate|reset|restart|reboot|power|reseat|remove|"
    r"reinsert|re-insert|insert|take|put|pop|set|change|select|choose|run|perform|do|try|make|pay|open|go to|"
    r"navigate|tap|complete|settle)\b")
_AGENT_SELF = re.compile(r"^(i|i'll|i've|i'm|i will|i have|i can|i could|let me|we|we'll|we've|shall i|should i|"
                         r"may i|can i)\b|\b(shall|should|can|may) i\b|\bwould you like me\b|\bwant me to\b|"
                         r"\bi('ll| will| can|'ve| have) (now )?(enable|turn|send|change|switch|refuel|add|set)\w*")
_STEP_KEYS: list[tuple[str, str]] = [
    ("toggle_airplane_mode", r"\b(airplane|aeroplane|flight|plane) mode\b"),
    ("toggle_data_roaming", r"\bdata roaming\b|\broaming\b.{0,40}\b(phone|settings?|device)\b|"
                            r"\b(phone|settings?|device)\b.{0,40}\broaming\b"),
    ("toggle_mobile_data", r"\b(mobile|cellular) data\b|\bdata connection\b|\bmobile internet\b"),
    ("reset_apn_settings", r"\bapns?\b|\baccess point\b"),
    ("reboot_device", r"\b(restart|reboot)\b|\bpower (it |your phone |the phone )?(off|cycle)\b|"
                      r"\bturn (it|your phone|the phone|your device) off and (back )?on\b"),
    ("reseat_sim_card", r"\bsim\b.{0,40}(\bout\b|reseat|remov|reinsert|re-insert|back in|\btake\b|insert)|"
                        r"\b(reseat|remov|reinsert|re-insert|take out|pop out|take)\w*.{0,30}\bsim\b"),
    ("set_network_mode_preference", r"\bnetwork mode\b|\bpreferred network\b|\bnetwork type\b|\b4g|\b5g\b|\blte\b"),
    ("run_speed_test", r"\bspeed ?test\b|\btest (your|the) (speed|connection|data|internet)\b"),
    ("make_payment", r"\bpayment requests?\b.{0,80}\bpay\b|\bpay\b.{0,60}\b(bill|request|app)\b|"
                     r"\bcarrier app\b|\bmake (the|a) payment\b"),
]
_CHECK_KEYS: list[tuple[str, str]] = [
    ("check_sim_status", r"\bsim\b"),
    ("check_status_bar", r"\bstatus bar\b|\bsignal (bars|icon|strength|indicator)\b|\btop of (your|the) screen\b|"
                         r"\b(airplane|aeroplane|flight) mode\b"),
    ("check_network_settings", r"\b(network|mobile|cellular|data) settings\b|\bapn\b|\bnetwork mode\b|"
                               r"\b(mobile|cellular) data\b|\bdata roaming\b"),
    ("run_speed_test", r"\bspeed ?test\b"),
    ("check_payment_requests", r"\bpayment requests?\b"),
]


def _want(sentence: str, name: str) -> bool:
    """The state a toggle instruction asks for; without a clear word, the state that fixes data."""
    off = re.search(r"\b(turn|switch|toggle|set|put|make sure|ensure|is)\b.{0,40}\boff\b|\b(disable|deactivate)\b",
                    sentence) and not re.search(r"\boff and (back )?on\b", sentence)
    on = re.search(r"\b(turn|switch|toggle|set|put|make sure|ensure|is)\b.{0,40}\bon\b|\b(enable|activate)\b", sentence)
    if off and not on:
        return False
    if on and not off:
        return True
    return name != "toggle_airplane_mode"


def _network_mode(sentence: str) -> str:
    if re.search(r"\b4g[ _-]?only\b|\blte[ _-]?only\b", sentence):
        return "4g_only"
    return "4g_5g_preferred"


def phone_plan(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The phone steps instructed in ``text``, in order; a check when the agent only asks to look."""
    actions: list[tuple[str, dict[str, Any]]] = []
    checks: list[tuple[str, dict[str, Any]]] = []
    for sentence in sentences(text):
        imperative = _IMPERATIVE.search(sentence) is not None
        self_talk = _AGENT_SELF.search(sentence) is not None and not re.search(r"\byou\b", sentence)
        if re.search(r"\b(shall|should|can|may) i\b|\bwould you like me\b|\bwant me to\b", sentence):
            self_talk = True
        found = False
        if imperative and not self_talk:
            for name, pattern in _STEP_KEYS:
                if not re.search(pattern, sentence):
                    continue
                if name == "set_network_mode_preference" and not re.search(r"\b(set|change|switch|select|choose)\b",
                                                                           sentence):
                    continue
                if name in TOGGLES and re.search(r"\b(check|look|see|whether|tell me|is it|is your)\b", sentence) \
                        and not re.search(r"\b(turn|switch|toggle|disable|enable|deactivate|activate)\b", sentence):
                    continue
                args: dict[str, Any] = {}
                if name in TOGGLES:
                    args = {"want": _want(sentence, name)}
                elif name == "set_network_mode_preference":
                    args = {"mode": _network_mode(sentence)}
                if (name, args) not in actions:
                    actions.append((name, args))
                found = True
                if name == "toggle_data_roaming":
                    break
        if not found and not self_talk and re.search(r"\b(check|look|see|tell me|what does|what do|is there|is your|"
                                                     r"are you seeing|open|read|whether)\b|^(is|are|does|do)\b",
                                                     sentence):
            for name, pattern in _CHECK_KEYS:
                if re.search(pattern, sentence) and (name, {}) not in checks:
                    checks.append((name, {}))
                    break
    return actions or checks


def describe_output(name: str, out: str) -> str:
    """What the user tells the agent after a step: the phone's own words, made conversational."""
    if name == "check_network_settings":
        try:
            data = json.loads(out)
            shown = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in data.items())
            return f"My network settings show: {shown}."
        except ValueError:
            return f"My network settings show: {out}"
    if name == "check_status_bar":
        return f"My status bar shows: {out}."
    if name == "check_sim_status":
        return f"It says: {out}"
    if name == "run_speed_test":
        ok = re.search(r"\((excellent|good)\)", out)
        return f"I ran the speed test: {out}" + ("" if ok else " It's still not working properly.")
    if name == "check_payment_requests":
        return f"My carrier app shows these payment requests: {out}"
    if out.startswith("Error"):
        return f"That didn't work, my phone says: {out}"
    return f"Done. My phone says: \"{out}\""


# -- goals in words ----------------------------------------------------------------------------------------
def _addr(args: Mapping[str, Any]) -> str:
    second = f", {args['address2']}" if args.get("address2") else ""
    return f"{args['address1']}{second}, {args['city']}, {args['state']} {args['zip']}, {args['country']}"


def _money(x: float) -> str:
    return str(int(x)) if float(x) == int(x) else f"{x:.2f}"


def _people(passengers: list[Mapping[str, str]]) -> str:
    return "; ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})" for p in passengers)


def _pay_plan(plan: list[Mapping[str, Any]]) -> str:
    if len(plan) == 1:
        return f"I'll pay with {plan[0]['payment_id']}."
    head, *rest = plan
    others = " and ".join(f"{p['payment_id']} ({_money(p['amount'])})" for p in rest)
    return f"Please use {head['payment_id']} for {_money(head['amount'])} and put the rest on {others}."


def goal_facts(goal: Goal, known: Mapping[str, str]) -> dict[str, str]:
    """Facts that depend on the goal in progress (its order, reservation, items, amounts ...)."""
    args, prefs = goal.wanted, goal.intent.preferences
    out: dict[str, str] = {}
    for key in ("order_id", "reservation_id", "reason"):
        if key in args:
            out[key] = str(args[key])
    if "reason" in prefs:
        out["reason"] = str(prefs["reason"])
    if goal.intent.action == "cancel_reservation" and "reason" in prefs:
        out["reason"] = str(prefs["reason"])
    names = prefs.get("first_items") if goal.intent.first_args is not None and not goal.changed_mind else None
    names = names or prefs.get("items")
    if names:
        out["items"] = " and the ".join(names) if isinstance(names, list) else str(names)
    elif "item" in prefs:
        out["items"] = str(prefs["item"])
    pay = prefs.get("refund_to") or prefs.get("pay_with")
    if pay:
        out["payment"] = str(pay)
    if "payment_id" in args:
        out["payment"] = str(args["payment_id"])
    if "payment_methods" in args:
        out["payment"] = _pay_plan(args["payment_methods"]).rstrip(".")
    if {"address1", "city", "zip"} <= set(args):
        out["new_address"] = _addr(args)
    if "date" in prefs:
        out["new_date"] = str(prefs["date"])
    if "cabin" in args and goal.intent.action in ("book_reservation", "update_reservation_flights"):
        out["cabin"] = CABIN_WORDS.get(args["cabin"], str(args["cabin"]))
    if goal.intent.action == "update_reservation_baggages":
        out["bags"] = f"{_bags_to_add(goal)} more checked bag(s)"
    if goal.intent.action == "book_reservation":
        out["passengers"] = _people(args["passengers"])
        out["insurance"] = "yes, I want travel insurance" if args["insurance"] == "yes" else "no insurance, thanks"
        out["bags"] = f"{args['total_baggages']} checked bag(s) in total"
        out["trip"] = f"from {args['origin']} to {args['destination']} on {args['flights'][0]['date']}, one way"
        out["new_date"] = args["flights"][0]["date"]
    if "gb_amount" in args:
        out["gb_amount"] = f"{args['gb_amount']:g}"
    if "min_data_gb" in prefs:
        roam = " with roaming" if prefs.get("roaming") else ""
        out["data_need"] = f"at least {prefs['min_data_gb']:g} GB of data per month{roam}, the cheapest plan that does that"
    if "flight_number" in known:
        out["flight_number"] = known["flight_number"]
    return out


def _bags_to_add(goal: Goal) -> int:
    prefs, intent = goal.intent.preferences, goal.intent
    k = int(prefs.get("bags_to_add", 1))
    if intent.first_args is not None and not goal.changed_mind:
        k += int(intent.first_args["total_baggages"]) - int(intent.args["total_baggages"])
    return k


def _which_leg(intent: Intent) -> str:
    m = re.search(r"move the (outbound|return) flight", intent.description)
    return m.group(1) if m else "outbound"


def request_text(goal: Goal, known: Mapping[str, str], withheld: set[str], domain: str) -> str:
    """The user's request for ``goal`` in natural words, leaving out what it keeps back."""
    intent, args, prefs = goal.intent, goal.wanted, goal.intent.preferences
    hide = withheld

    def opt(key: str, text: str) -> str:
        return "" if key in hide else text

    if intent.question:
        return intent.question
    action = intent.action or ""
    oid = args.get("order_id", "")
    order = opt("order_id", f" {oid}")
    rid = args.get("reservation_id", "")
    res = opt("reservation_id", f" {rid}")
    pay = goal_facts(goal, known).get("payment", "")
    symptom = first_person(known["symptom"]) + "." if "symptom" in known and "symptom" not in hide else \
        "Something is wrong with my phone."
    texts: dict[str, Callable[[], str]] = {
        "cancel_pending_order": lambda: (f"I'd like to cancel my order{order}." +
                                         opt("reason", f" The reason: it's {args.get('reason')}.")),
        "modify_pending_order_address": lambda: f"I need to change the shipping address of my order{order} to {_addr(args)}.",
        "modify_user_address": lambda: f"I moved and would like to update the default address of my account to {_addr(args)}.",
        "return_delivered_order_items": lambda: _return_text(goal, known, order, pay, hide),
        "exchange_delivered_order_items": lambda: _swap_text(goal, order, pay, "exchange"),
        "modify_pending_order_items": lambda: _swap_text(goal, order, pay, "change"),
        "cancel_reservation": lambda: f"I need to cancel my reservation{res}.",
        "update_reservation_flights": lambda: _flights_text(goal, res, pay, hide),
        "update_reservation_baggages": lambda: (f"I'd like to add {_bags_to_add(goal)} checked bag(s) to my reservation{res}."
                                                + opt("payment_id", f" If there is a fee, please use {pay}.")),
        "update_reservation_passengers": lambda: _passengers_text(intent, res),
        "book_reservation": lambda: _book_text(goal),
        "send_certificate": lambda: (f"The airline cancelled flight {known.get('flight_number', '')} on "
                                     f"{known.get('date', '')} of my reservation{res}. I'm really upset and I'd like "
                                     "some compensation for it."),
        "refuel_data": lambda: f"{symptom} Could I get {args['gb_amount']:g} GB of extra data on my line?",
        "enable_roaming": lambda: f"{symptom} I need mobile data to work while I'm abroad.",
        "change_plan": lambda: _plan_text(goal, known, symptom),
        "suspend_line": lambda: (f"The phone with number {known.get('lost_phone_number')} on my account was lost this "
                                 "afternoon. Please suspend that line so nobody can use it."),
        "resume_line": lambda: (f"{symptom} I want my line resumed right now, but I can't pay the overdue bill until "
                                "next week." if intent.out_of_policy else "Can you get my line working again now?"),
        "send_payment_request": lambda: (f"{symptom} I think I forgot to pay a bill. I can pay it now through a payment "
                                         "request in my app."),
    }
    if intent.out_of_policy and action == "update_reservation_flights" and "new_date" in args:
        return f"I'd like to move the first flight of my reservation{res} to {args['new_date']}, keeping basic economy."
    if intent.out_of_policy and action == "cancel_reservation":
        return f"I want to cancel my reservation{res} because {prefs.get('reason', 'my plans changed')}, with a full refund."
    if intent.out_of_policy and action == "return_delivered_order_items":
        return f"I want to return the {known.get('items', 'item')} from my order{order} for a refund right now."
    if action in texts:
        return texts[action]()
    return symptom


def _swap_text(goal: Goal, order: str, pay: str, verb: str) -> str:
    prefs = goal.intent.preferences
    change = ", ".join(f"{k} {v}" for k, v in prefs.get("change", {}).items())
    if "max_price" in prefs:
        return (f"I'd like the {prefs['item']} in my order{order} in blue instead, at the same or a lower price "
                f"(at most ${prefs['max_price']:.2f}). Which blue options are there? I prefer the longest battery "
                f"life, then the lowest price. Any difference can go through {pay}.")
    keep = ", ".join(f"{k} {v}" for k, v in prefs.get("keep", {}).items())
    keep_text = f" (keeping {keep})" if keep else ""
    return (f"I'd like to {verb} the {prefs.get('item', 'item')} in my order{order} for the same one with {change}"
            f"{keep_text}. Any price difference can go through {pay}.")


def _target_date(args: Mapping[str, Any], other: Mapping[str, Any] | None, fallback: str | None) -> str | None:
    """The new flight date in ``args``: the one the other version of the request (first or final) lacks."""
    if other is None:
        return fallback
    theirs = {f["date"] for f in other.get("flights", [])}
    return next((f["date"] for f in args["flights"] if f["date"] not in theirs), fallback)


def _flights_text(goal: Goal, res: str, pay: str, hide: set[str]) -> str:
    prefs, args = goal.intent.preferences, goal.wanted
    pay_text = "" if "payment_id" in hide else f" Please use {pay} for any difference."
    if "date" in prefs:
        other = None
        if goal.intent.first_args is not None:
            other = goal.intent.args if not goal.changed_mind else goal.intent.first_args
        date = _target_date(args, other, prefs["date"])
        choice = PREF_WORDS.get(prefs.get("flight_choice", "cheapest"), "the cheapest one")
        return (f"I'd like to move the {_which_leg(goal.intent)} flight of my reservation{res} to {date}, same "
                f"cabin. A direct flight please; if there are several, {choice}.{pay_text}")
    return (f"I'd like to upgrade my reservation{res} to {CABIN_WORDS.get(args['cabin'], args['cabin'])} on the "
            f"same flights.{pay_text}")


def _return_text(goal: Goal, known: Mapping[str, str], order: str, pay: str, hide: set[str]) -> str:
    items = "some items" if "items" in hide else "the " + goal_facts(goal, known).get("items", "items")
    refund = "" if "payment" in hide else f" Please refund {pay}."
    return f"I'd like to return {items} from my order{order}.{refund}"


def _passengers_text(intent: Intent, res: str) -> str:
    what = re.sub(r"^on \w+, ", "", intent.description)
    return f"On my reservation{res}, I need to {what}. The other passengers stay as they are."


def _book_text(goal: Goal) -> str:
    args, prefs = goal.wanted, goal.intent.preferences
    n = len(args["passengers"])
    who = "myself" if n == 1 else f"{n} passengers"
    bags = args["total_baggages"]
    bag_text = f"{bags} checked bag{'s' if bags != 1 else ''} in total" if bags else "no checked bags"
    ins = "travel insurance" if args["insurance"] == "yes" else "no travel insurance"
    choice = PREF_WORDS.get(prefs.get("flight_choice", "cheapest"), "the cheapest one")
    return (f"I'd like to book a one-way trip from {args['origin']} to {args['destination']} on "
            f"{args['flights'][0]['date']} in {CABIN_WORDS[args['cabin']]} for {who}: {_people(args['passengers'])}. "
            f"A direct flight please; if there are several, {choice}. I want {bag_text} and {ins}. "
            f"{_pay_plan(args['payment_methods'])}")


def _plan_text(goal: Goal, known: Mapping[str, str], symptom: str) -> str:
    prefs = goal.intent.preferences
    need = f"at least {prefs.get('min_data_gb', 0):g} GB of data per month"
    if prefs.get("roaming") and "location" in known:
        return (f"{symptom} If my plan doesn't include roaming, I'm happy to switch to the cheapest plan that "
                f"includes roaming and has {need}.")
    roam = " and roaming for travel abroad" if prefs.get("roaming") else ""
    return f"I'd like to change the plan of my line: I need {need}{roam}, and the cheapest plan that does that."


def change_of_mind_text(goal: Goal, known: Mapping[str, str]) -> str:
    """What the user says when it switches from ``first_args`` to the final ``args``."""
    intent, prefs = goal.intent, goal.intent.preferences
    action, args, first = intent.action, intent.args, intent.first_args or {}
    if action == "return_delivered_order_items":
        kept = [n for n in prefs.get("first_items", []) if n not in prefs.get("items", [])]
        return (f"I'd like to keep the {' and the '.join(kept)} and only return the "
                f"{' and the '.join(prefs.get('items', []))}.")
    if action == "update_reservation_baggages":
        return f"I'd rather add {prefs.get('bags_to_add')} checked bag(s) instead. Same payment method."
    if action == "update_reservation_flights" and "date" in prefs:
        return f"Could you move it to {prefs['date']} instead? Same rules: direct flight, same cabin, same payment."
    if action == "book_reservation":
        return (f"I'd like {CABIN_WORDS[args['cabin']]} instead of {CABIN_WORDS[first.get('cabin', 'economy')]}. "
                f"Everything else stays the same. {_pay_plan(args['payment_methods'])}")
    if action == "refuel_data":
        return f"I'd rather get {args['gb_amount']:g} GB instead of {first.get('gb_amount', 0):g} GB."
    return f"What I want instead: {intent.description}."


# -- checking proposals ------------------------------------------------------------------------------------
_PAY_ID = re.compile(r"\b(credit_card|paypal|gift_card|certificate)_\d+\b")


def check_proposal(goal: Goal, text: str, known: Mapping[str, str]) -> tuple[str, str]:
    """("ok" | "first" | "wrong", why): does the proposal in ``text`` match what the user wants?

    Identifiers are strict (the wrong order or line is always corrected), wording is lenient. "first" means
    it matches the request the user made before changing its mind. Until the user has changed its mind, a
    proposal of what it will settle on later is wrong: the user has not asked for it yet, so an agent that
    swaps in something else the user did not say (the other cancellation reason, one item of two) is
    corrected instead of being rewarded for a lucky guess.
    """
    intent = goal.intent
    final = _mismatch(intent.action or "", intent.args, intent, text, known, final=True)
    if intent.first_args is not None:
        first = _mismatch(intent.action or "", intent.first_args, intent, text, known, final=False)
        if not goal.changed_mind:
            return ("first", "") if first is None else ("wrong", first)
        return ("ok", "") if final is None else ("first", "") if first is None else ("wrong", final)
    return ("ok", "") if final is None else ("wrong", final)


def _mismatch(action: str, args: Mapping[str, Any], intent: Intent, text: str, known: Mapping[str, str],
              final: bool) -> str | None:
    """Why ``text`` does not propose ``action(args)``, or None when it does."""
    checks: dict[str, Callable[[], str | None]] = {
        "cancel_pending_order": lambda: _retail_order(args, text) or _reason(args, text),
        "modify_pending_order_address": lambda: _retail_order(args, text) or _address(args, text),
        "modify_user_address": lambda: _address(args, text),
        "return_delivered_order_items": lambda: (_retail_order(args, text) or _items(args, intent, text, final)
                                                 or _payment(args.get("payment_method_id"), text, intent)),
        "exchange_delivered_order_items": lambda: (_retail_order(args, text) or _swap(args, intent, text)
                                                   or _payment(args.get("payment_method_id"), text, intent)),
        "modify_pending_order_items": lambda: (_retail_order(args, text) or _swap(args, intent, text)
                                               or _payment(args.get("payment_method_id"), text, intent)),
        "cancel_reservation": lambda: _reservation(args, text),
        "update_reservation_flights": lambda: (_reservation(args, text) or _flights(args, intent, text)
                                               or _payment(args.get("payment_id"), text, intent)),
        "update_reservation_baggages": lambda: (_reservation(args, text) or _bags(args, intent, text, final)
                                                or _payment(args.get("payment_id"), text, intent)),
        "update_reservation_passengers": lambda: _reservation(args, text) or _passengers(intent, text),
        "book_reservation": lambda: _booking(args, text),
        "send_certificate": lambda: None if "amount" not in args or says_number(text, args["amount"])
        else f"the amount should be {_money(args['amount'])} dollars",
        "refuel_data": lambda: _gb(args, text),
        "change_plan": lambda: None if str(args.get("plan_id", "")).lower() in text else
        f"I want the plan {args.get('plan_id')}",
        "suspend_line": lambda: _lost_line(args, text, known),
        "send_payment_request": lambda: _bill(args, text),
    }
    check = checks.get(action)
    return None if check is None else check()


def _retail_order(args: Mapping[str, Any], text: str) -> str | None:
    oid = str(args.get("order_id", "")).lower()
    mentioned = set(re.findall(r"#w\d+", text))
    if oid and oid not in mentioned:
        return f"it's about my order {args['order_id']}"
    return None


def _reason(args: Mapping[str, Any], text: str) -> str | None:
    reasons = ["no longer needed", "ordered by mistake"]
    other = [r for r in reasons if r != args.get("reason")]
    if any(r in text for r in other) and args.get("reason", "") not in text:
        return f"the reason is that it was {args.get('reason')}"
    return None


def _address(args: Mapping[str, Any], text: str) -> str | None:
    if norm(str(args["address1"])) not in text or str(args["zip"]) not in text:
        return f"the address should be {_addr(args)}"
    return None


def _items(args: Mapping[str, Any], intent: Intent, text: str, final: bool) -> str | None:
    prefs = intent.preferences
    names = prefs.get("items", []) if final else prefs.get("first_items", prefs.get("items", []))
    names = names if isinstance(names, list) else [names]
    every = set(prefs.get("first_items", [])) | set(names)
    others = [n for n in every if n not in names]
    ids = set(re.findall(r"\b\d{10}\b", text))
    if ids:
        if ids & set(args["item_ids"]) != set(args["item_ids"]):
            return f"I want to return the {' and the '.join(names)}"
        wrong = ids & (set((intent.first_args or {}).get("item_ids", [])) - set(args["item_ids"]))
        if wrong:
            return f"I want to return only the {' and the '.join(names)}"
        return None
    if not all(norm(n) in text for n in names) or any(norm(n) in text for n in others):
        return f"I want to return the {' and the '.join(names)}"
    return None


def _swap(args: Mapping[str, Any], intent: Intent, text: str) -> str | None:
    prefs = intent.preferences
    ids = set(re.findall(r"\b\d{10}\b", text))
    if ids and not set(args["new_item_ids"]) <= ids:
        return "that's not the variant I want"
    if ids:
        return None
    if norm(str(prefs.get("item", ""))) not in text:
        return f"it's the {prefs.get('item')} I want to change"
    for value in prefs.get("change", {}).values():
        if norm(str(value)) not in text:
            return f"I want it with {value}"
    return None


def _payment(pid: Any, text: str, intent: Intent) -> str | None:
    """A payment method named in the proposal must be the one the user chose."""
    if not pid:
        return None
    mentioned = set(_PAY_ID.findall(text)) and {m.group(0) for m in _PAY_ID.finditer(text)}
    if mentioned and str(pid).lower() not in mentioned:
        return f"please use {pid} for the payment"
    words = str(intent.preferences.get("refund_to") or intent.preferences.get("pay_with") or "")
    want = re.search(r"ending in (\d{4})", words)
    said = re.findall(r"ending (?:in |with )?(\d{4})", text)
    if want and said and want.group(1) not in said:
        return f"please use {words}"
    return None


def _reservation(args: Mapping[str, Any], text: str) -> str | None:
    rid = str(args.get("reservation_id", "")).lower()
    if rid and not re.search(rf"\b{re.escape(rid)}\b", text):
        return f"it's about my reservation {args['reservation_id']}"
    return None


def _flights(args: Mapping[str, Any], intent: Intent, text: str) -> str | None:
    prefs = intent.preferences
    if "date" in prefs:
        is_final = args == intent.args
        other = intent.first_args if is_final else intent.args
        target = prefs["date"] if is_final else _target_date(args, other, None)
        if target and not says_date(text, target):
            return f"I want to fly on {target}"
        said = set(re.findall(r"\bhat\d+\b", text))
        want = {f["flight_number"].lower() for f in args["flights"] if f["date"] == target}
        if said and want and not want & said:
            return "that's not the flight I'd pick"
    if "cabin" in prefs and args["cabin"] not in _cabin_words(text):
        return f"I want {CABIN_WORDS[args['cabin']]}"
    return None


def _bags(args: Mapping[str, Any], intent: Intent, text: str, final: bool) -> str | None:
    k = int(intent.preferences.get("bags_to_add", 1))
    if not final and intent.first_args is not None:
        k += int(args["total_baggages"]) - int(intent.args["total_baggages"])
    add = re.findall(r"\badd(?:ing)? (\d+|one|two|three|four|five)\b", text)
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
    if add:
        return None if any(int(words.get(a, a) if not a.isdigit() else a) == k for a in add) else \
            f"I want to add {k} bag(s)"
    near = [float(n) for n in re.findall(r"\b(\d+) (?:\w+ ){0,2}bags?\b", text)]
    if k in near or float(args["total_baggages"]) in near:
        return None
    return f"I want to add {k} bag(s)"


def _passengers(intent: Intent, text: str) -> str | None:
    for p in intent.args.get("passengers", []):
        if p["dob"] in intent.description and not says_date(text, p["dob"]):
            return f"the date of birth should be {p['dob']}"
        name = f"{p['first_name']} {p['last_name']}"
        if name in intent.description.split("with ")[-1] and norm(name) not in text:
            return f"the passenger should be {name}"
    return None


def _booking(args: Mapping[str, Any], text: str) -> str | None:
    cabins = _cabin_words(text)
    if args["cabin"] not in cabins:
        return f"I want {CABIN_WORDS[args['cabin']]}"
    if len(cabins) > 1 and not re.search(rf"\b(in|book|for)\s+{CABIN_WORDS[args['cabin']]}", text):
        return f"I want {CABIN_WORDS[args['cabin']]}"
    flight = args["flights"][0]
    if not says_date(text, flight["date"]):
        return f"I want to fly on {flight['date']}"
    said = set(re.findall(r"\bhat\d+\b", text))
    if said and flight["flight_number"].lower() not in said:
        return "that's not the flight I'd pick"
    return _payment(args["payment_methods"][0]["payment_id"], text, Intent(description=""))


def _gb(args: Mapping[str, Any], text: str) -> str | None:
    amounts = [float(n) for n in re.findall(r"(\d+(?:\.\d+)?)\s*(?:gb|gigabytes?)\b", text)]
    if float(args["gb_amount"]) not in amounts:
        return f"I'd like {args['gb_amount']:g} GB"
    return None


def _lost_line(args: Mapping[str, Any], text: str, known: Mapping[str, str]) -> str | None:
    lost = known.get("lost_phone_number", "")
    if lost not in text and str(args.get("line_id", "")).lower() not in text:
        return f"it's the line {lost} that was lost"
    return None


def _bill(args: Mapping[str, Any], text: str) -> str | None:
    bills = set(re.findall(r"\bb\d{4,}\b", text))
    if bills and str(args.get("bill_id", "")).lower() not in bills:
        return "that's not the overdue bill"
    return None
