"""The customer of the built-in customer-service domains, as a :class:`~muarl.users.script.UserScript`.

Retail, airline and telecom users share one way of being asked for things: the same fact words (an agent
may ask for "the e-mail on the account", "your ZIP", "the booking reference" ...), the same sentences
giving a fact, and the same leniency rules (a "name" in "the plan name" is not the user's name). Those
live here, next to the domains, beside :mod:`muarl.domains.common` (their shared tools); each domain's
``user_script`` module adds how its requests are worded and how its proposals are checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from muarl.users.phrases import ASK, says, words
from muarl.users.script import UserScript

if TYPE_CHECKING:
    from muarl.types import Intent
    from muarl.users.scripted import Goal, ScriptedSession

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

#: fact key -> the sentences that give it ({v}: the value, {V}: capitalised)
FACT_SENTENCES: dict[str, list[str]] = {
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

#: fact key -> how a customer states it unasked (the static user's opening); other keys: "My <key> is <v>."
FACT_STATEMENTS: dict[str, str] = {
    "zip": "My zip code is {v}.",
    "dob": "My date of birth is {v}.",
    "reason": "The reason is: {v}.",
    "cancel_reason": "The reason is: {v}.",
    "symptom": "The problem: {v}.",
    "location": "I'm in {v} right now.",
    "origin": "I'm flying from {v}.",
    "destination": "I'm flying to {v}.",
    "lost_phone_number": "The lost phone's number is {v}.",
    "items": "The items: {v}.",
    "passengers": "The passengers: {v}.",
    "total_baggages": "Checked bags in total: {v}.",
    "insurance": "Travel insurance: {v}.",
}

_PAY_ID = re.compile(r"\b(credit_card|paypal|gift_card|certificate)_\d+\b")


def money(x: float) -> str:
    """An amount as the user says it: 12 or 12.50."""
    return str(int(x)) if float(x) == int(x) else f"{x:.2f}"


def payment_mismatch(pid: Any, text: str, intent: Intent) -> str | None:
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


#: (action args, intent, proposal text, known facts, final) -> why it is not what the user wants, or None
Check = Callable[[Mapping[str, Any], "Intent", str, Mapping[str, str], bool], "str | None"]


class ServiceUserScript(UserScript):
    """What the built-in domains' users share; a domain sets the class attributes and words its requests."""

    #: keys of ``scenario.known`` the user gives when asked (besides "name", built from its parts)
    known_facts: tuple[str, ...] = ()
    #: action -> a regex of words that name it (a proposal with none of them is not about that action)
    action_verbs: Mapping[str, str] = {}
    #: action -> the check of a proposal of it; an action without one accepts any proposal naming it
    checks: Mapping[str, Check] = {}

    # -- facts -----------------------------------------------------------------------------------------
    def facts(self, session: ScriptedSession) -> dict[str, str]:
        """What the user can say right now: identity from ``known``, the rest from the current goal."""
        k = session.known
        facts: dict[str, str] = {key: k[key] for key in self.known_facts if key in k}
        if "first_name" in k:
            facts["name"] = f"{k['first_name']} {k.get('last_name', '')}".strip()
        elif "full_name" in k:
            facts["name"] = k["full_name"]
        goal = session.current
        if goal is not None:
            facts.update(self.goal_facts(goal, k))
        return facts

    def statements(self, session: ScriptedSession, facts: Mapping[str, str]) -> list[str]:
        """The customer's name first, in one sentence from its parts (always: it is who the agent looks up,
        even when another fact's wording happens to contain it), then the other facts by
        :data:`FACT_STATEMENTS`, else the generic sentence."""
        names = ("first_name", "last_name", "full_name")
        parts = [session.known[key] for key in names if key in session.known]
        said = [f"My name is {' '.join(parts)}."] if parts else []
        for key, value in facts.items():
            if key not in names:
                said.append(FACT_STATEMENTS.get(key, f"My {words(key)} is {{v}}.").format(v=value))
        return said

    def goal_facts(self, goal: Goal, known: Mapping[str, str]) -> dict[str, str]:
        """Facts that depend on the goal in progress (its order, reservation, items, amounts ...)."""
        return {}

    def asked_facts(self, session: ScriptedSession, text: str) -> list[str]:
        if not ASK.search(text):
            return []
        facts = self.facts(session)
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

    def fact_sentence(self, session: ScriptedSession, key: str, facts: Mapping[str, str]) -> str:
        value = facts.get(key)
        if key == "email" and value is None and "zip" in facts:
            return (f"I don't remember which email I used, but my name is {facts['name']} and my zip code is "
                    f"{facts['zip']}.")
        if key == "customer_id" and value is None:
            phone = facts.get("phone_number")
            return f"I don't know my customer id, but my phone number is {phone}." if phone else ""
        if value is None:
            return ""
        pattern = session.rng.choice(FACT_SENTENCES.get(key, ["{v}."]))
        return pattern.format(v=value, V=value[:1].upper() + value[1:])

    # -- proposals and answers -------------------------------------------------------------------------
    def names_action(self, action: str, text: str) -> bool:
        return re.search(self.action_verbs.get(action, r"$^"), text) is not None

    def mismatch(self, session: ScriptedSession, goal: Goal, args: Mapping[str, Any], text: str,
                 final: bool) -> str | None:
        check = self.checks.get(goal.intent.action or "")
        return None if check is None else check(args, goal.intent, text, session.known, final)

    def answered(self, goal: Goal, text: str) -> bool:
        return goal.intent.answer is not None and says(text, goal.intent.answer)

    def change_of_mind(self, session: ScriptedSession, goal: Goal) -> str:
        return f"What I want instead: {goal.intent.description}."
