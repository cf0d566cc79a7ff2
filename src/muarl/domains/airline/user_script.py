"""How an airline traveller words its requests and checks the agent's proposals (the scripted user's script).

The conversation itself is the generic engine's (:mod:`muarl.users.scripted`); this module only knows
the airline: reservations, flights and dates, cabins, bags, passengers and payment plans.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from muarl.domains.service_script import Check, ServiceUserScript, money, payment_mismatch
from muarl.types import Intent
from muarl.users.phrases import norm, says_date, says_number

if TYPE_CHECKING:
    from muarl.users.scripted import Goal, ScriptedSession

CABIN_WORDS = {"basic_economy": "basic economy", "economy": "economy", "business": "business"}
PREF_WORDS = {"cheapest": "the cheapest one", "earliest": "the one that leaves earliest",
              "latest": "the one that leaves latest"}


def cabin_words(text: str) -> set[str]:
    """Cabins named in ``text``; "basic economy" is not also "economy"."""
    found = set()
    if re.search(r"\bbusiness\b", text):
        found.add("business")
    if re.search(r"\bbasic[ _-]?economy\b", text):
        found.add("basic_economy")
    if re.search(r"(?<!basic )(?<!basic_)(?<!basic-)\beconomy\b", text):
        found.add("economy")
    return found


def people(passengers: list[Mapping[str, str]]) -> str:
    return "; ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})" for p in passengers)


def pay_plan(plan: list[Mapping[str, Any]]) -> str:
    if len(plan) == 1:
        return f"I'll pay with {plan[0]['payment_id']}."
    head, *rest = plan
    others = " and ".join(f"{p['payment_id']} ({money(p['amount'])})" for p in rest)
    return f"Please use {head['payment_id']} for {money(head['amount'])} and put the rest on {others}."


def bags_to_add(goal: Goal) -> int:
    prefs, intent = goal.intent.preferences, goal.intent
    k = int(prefs.get("bags_to_add", 1))
    if intent.first_args is not None and not goal.changed_mind:
        k += int(intent.first_args["total_baggages"]) - int(intent.args["total_baggages"])
    return k


def which_leg(intent: Intent) -> str:
    m = re.search(r"move the (outbound|return) flight", intent.description)
    return m.group(1) if m else "outbound"


def target_date(args: Mapping[str, Any], other: Mapping[str, Any] | None, fallback: str | None) -> str | None:
    """The new flight date in ``args``: the one the other version of the request (first or final) lacks."""
    if other is None:
        return fallback
    theirs = {f["date"] for f in other.get("flights", [])}
    return next((f["date"] for f in args["flights"] if f["date"] not in theirs), fallback)


# -- checking proposals ------------------------------------------------------------------------------------
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
        target = prefs["date"] if is_final else target_date(args, other, None)
        if target and not says_date(text, target):
            return f"I want to fly on {target}"
        said = set(re.findall(r"\bhat\d+\b", text))
        want = {f["flight_number"].lower() for f in args["flights"] if f["date"] == target}
        if said and want and not want & said:
            return "that's not the flight I'd pick"
    if "cabin" in prefs and args["cabin"] not in cabin_words(text):
        return f"I want {CABIN_WORDS[args['cabin']]}"
    return None


def _bags(args: Mapping[str, Any], intent: Intent, text: str, final: bool) -> str | None:
    k = int(intent.preferences.get("bags_to_add", 1))
    if not final and intent.first_args is not None:
        k += int(args["total_baggages"]) - int(intent.args["total_baggages"])
    add = re.findall(r"\badd(?:ing)? (\d+|one|two|three|four|five)\b", text)
    numbers = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
    if add:
        return None if any(int(numbers.get(a, a) if not a.isdigit() else a) == k for a in add) else \
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
    cabins = cabin_words(text)
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
    return payment_mismatch(args["payment_methods"][0]["payment_id"], text, Intent(description=""))


CHECKS: dict[str, Check] = {
    "cancel_reservation": lambda args, intent, text, known, final: _reservation(args, text),
    "update_reservation_flights": lambda args, intent, text, known, final: (
        _reservation(args, text) or _flights(args, intent, text)
        or payment_mismatch(args.get("payment_id"), text, intent)),
    "update_reservation_baggages": lambda args, intent, text, known, final: (
        _reservation(args, text) or _bags(args, intent, text, final)
        or payment_mismatch(args.get("payment_id"), text, intent)),
    "update_reservation_passengers": lambda args, intent, text, known, final: (
        _reservation(args, text) or _passengers(intent, text)),
    "book_reservation": lambda args, intent, text, known, final: _booking(args, text),
    "send_certificate": lambda args, intent, text, known, final: (
        None if "amount" not in args or says_number(text, args["amount"])
        else f"the amount should be {money(args['amount'])} dollars"),
}

#: per action: words that name it (a proposal with none of them is not about that action)
ACTION_VERBS: dict[str, str] = {
    "cancel_reservation": r"cancel",
    "book_reservation": r"book|reserv",
    "update_reservation_flights": r"chang|mov|switch|upgrad|rebook|updat|modif|downgrad|replac",
    "update_reservation_baggages": r"bag|luggage|suitcase",
    "update_reservation_passengers": r"passenger|name|birth|traveller|traveler|correct|updat",
    "send_certificate": r"certificate|compensat|voucher|credit",
}


class AirlineUserScript(ServiceUserScript):
    """An airline traveller: reservations by id, flights by date and choice rule, payment by method id."""

    known_facts = ("user_id", "passengers", "insurance", "cabin", "reservation_id", "payment_id", "new_date")
    action_verbs = ACTION_VERBS
    checks = CHECKS

    def goal_facts(self, goal: Goal, known: Mapping[str, str]) -> dict[str, str]:
        args, prefs = goal.wanted, goal.intent.preferences
        action = goal.intent.action
        out: dict[str, str] = {}
        if "reservation_id" in args:
            out["reservation_id"] = str(args["reservation_id"])
        if "reason" in prefs:
            out["reason"] = str(prefs["reason"])
        if "payment_id" in args:
            out["payment"] = str(args["payment_id"])
        if "payment_methods" in args:
            out["payment"] = pay_plan(args["payment_methods"]).rstrip(".")
        if "date" in prefs:
            out["new_date"] = str(prefs["date"])
        if "cabin" in args and action in ("book_reservation", "update_reservation_flights"):
            out["cabin"] = CABIN_WORDS.get(args["cabin"], str(args["cabin"]))
        if action == "update_reservation_baggages":
            out["bags"] = f"{bags_to_add(goal)} more checked bag(s)"
        if action == "book_reservation":
            out["passengers"] = people(args["passengers"])
            out["insurance"] = "yes, I want travel insurance" if args["insurance"] == "yes" else "no insurance, thanks"
            out["bags"] = f"{args['total_baggages']} checked bag(s) in total"
            out["trip"] = f"from {args['origin']} to {args['destination']} on {args['flights'][0]['date']}, one way"
            out["new_date"] = args["flights"][0]["date"]
        if "flight_number" in known:
            out["flight_number"] = known["flight_number"]
        return out

    def request(self, session: ScriptedSession, goal: Goal) -> str:
        """The goal as the user would put it, without withheld facts."""
        intent, args, prefs = goal.intent, goal.wanted, goal.intent.preferences
        hide, known = session.withheld, session.known
        if intent.question:
            return intent.question

        def opt(key: str, text: str) -> str:
            return "" if key in hide else text

        res = opt("reservation_id", f" {args.get('reservation_id', '')}")
        pay = self.goal_facts(goal, known).get("payment", "")
        action = intent.action or ""
        if intent.out_of_policy and action == "update_reservation_flights" and "new_date" in args:
            return f"I'd like to move the first flight of my reservation{res} to {args['new_date']}, keeping basic economy."
        if intent.out_of_policy and action == "cancel_reservation":
            return (f"I want to cancel my reservation{res} because {prefs.get('reason', 'my plans changed')}, with a "
                    "full refund.")
        texts: dict[str, Callable[[], str]] = {
            "cancel_reservation": lambda: f"I need to cancel my reservation{res}.",
            "update_reservation_flights": lambda: self._flights_text(goal, res, pay, hide),
            "update_reservation_baggages": lambda: (f"I'd like to add {bags_to_add(goal)} checked bag(s) to my "
                                                    f"reservation{res}."
                                                    + opt("payment_id", f" If there is a fee, please use {pay}.")),
            "update_reservation_passengers": lambda: self._passengers_text(intent, res),
            "book_reservation": lambda: self._book_text(goal),
            "send_certificate": lambda: (f"The airline cancelled flight {known.get('flight_number', '')} on "
                                         f"{known.get('date', '')} of my reservation{res}. I'm really upset and I'd "
                                         "like some compensation for it."),
        }
        if action in texts:
            return texts[action]()
        return super().request(session, goal)

    def _flights_text(self, goal: Goal, res: str, pay: str, hide: set[str]) -> str:
        prefs, args = goal.intent.preferences, goal.wanted
        pay_text = "" if "payment_id" in hide else f" Please use {pay} for any difference."
        if "date" in prefs:
            other = None
            if goal.intent.first_args is not None:
                other = goal.intent.args if not goal.changed_mind else goal.intent.first_args
            date = target_date(args, other, prefs["date"])
            choice = PREF_WORDS.get(prefs.get("flight_choice", "cheapest"), "the cheapest one")
            return (f"I'd like to move the {which_leg(goal.intent)} flight of my reservation{res} to {date}, same "
                    f"cabin. A direct flight please; if there are several, {choice}.{pay_text}")
        return (f"I'd like to upgrade my reservation{res} to {CABIN_WORDS.get(args['cabin'], args['cabin'])} on the "
                f"same flights.{pay_text}")

    def _passengers_text(self, intent: Intent, res: str) -> str:
        what = re.sub(r"^on \w+, ", "", intent.description)
        return f"On my reservation{res}, I need to {what}. The other passengers stay as they are."

    def _book_text(self, goal: Goal) -> str:
        args, prefs = goal.wanted, goal.intent.preferences
        n = len(args["passengers"])
        who = "myself" if n == 1 else f"{n} passengers"
        bags = args["total_baggages"]
        bag_text = f"{bags} checked bag{'s' if bags != 1 else ''} in total" if bags else "no checked bags"
        ins = "travel insurance" if args["insurance"] == "yes" else "no travel insurance"
        choice = PREF_WORDS.get(prefs.get("flight_choice", "cheapest"), "the cheapest one")
        return (f"I'd like to book a one-way trip from {args['origin']} to {args['destination']} on "
                f"{args['flights'][0]['date']} in {CABIN_WORDS[args['cabin']]} for {who}: {people(args['passengers'])}. "
                f"A direct flight please; if there are several, {choice}. I want {bag_text} and {ins}. "
                f"{pay_plan(args['payment_methods'])}")

    def change_of_mind(self, session: ScriptedSession, goal: Goal) -> str:
        intent, prefs = goal.intent, goal.intent.preferences
        action, args, first = intent.action, intent.args, intent.first_args or {}
        if action == "update_reservation_baggages":
            return f"I'd rather add {prefs.get('bags_to_add')} checked bag(s) instead. Same payment method."
        if action == "update_reservation_flights" and "date" in prefs:
            return f"Could you move it to {prefs['date']} instead? Same rules: direct flight, same cabin, same payment."
        if action == "book_reservation":
            return (f"I'd like {CABIN_WORDS[args['cabin']]} instead of {CABIN_WORDS[first.get('cabin', 'economy')]}. "
                    f"Everything else stays the same. {pay_plan(args['payment_methods'])}")
        return super().change_of_mind(session, goal)
