"""Airline task families. Each family drafts one task for one user, and its reference solver computes the
exact gold writes from the database (cheapest flight, fees, allowance, refunds) by the policy's rules.

Families build on *pieces*: one user goal with its gold actions, the facts the user can state and a
sentence of instruction. Straightforward tasks are one piece; the harder families wrap pieces (withheld
facts, a change of mind, two goals in one conversation) or state a goal the policy forbids.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from muarl.db import MISSING, Database, DBView, changes
from muarl.domains.airline.data import (
    BAG_FEE,
    CABINS,
    FIRST,
    FREE_BAGS,
    FUTURE_DATES,
    INSURANCE_FEE,
    LAST,
    NOW,
    TODAY,
)
from muarl.domains.airline.tools import TOOLS
from muarl.taskgen import Draft, Family, generate
from muarl.types import Action, Intent, Scenario, Task

if TYPE_CHECKING:
    from muarl.domain import Domain

TOOL_MAP = {t.name: t for t in TOOLS}
WITHIN_24H = "2024-05-14T15:00:00"
assert NOW == "2024-05-15T15:00:00", "WITHIN_24H and the policy assume this clock"

PERSONAS = [
    "a frequent business traveller who wants things done quickly",
    "a parent organising a family trip",
    "a retired teacher who is not comfortable with technology",
    "a graduate student on a tight budget",
    "a consultant who flies most weeks",
    "a nurse working irregular shifts",
    "a musician touring with a small band",
    "a small-business owner planning a trade fair visit",
]
TRAITS = ["polite", "terse", "impatient", "chatty", "detail-oriented", "anxious", "friendly", "skeptical"]
CABIN_WORDS = {"basic_economy": "basic economy", "economy": "economy", "business": "business"}


@dataclass
class Piece:
    """One user goal: the intent, its gold writes, the facts needed, and how to say it to an LLM user."""

    intent: Intent
    gold: list[Action]
    text: str
    known: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    reservation_id: str | None = None
    #: a booking's fixed choices (route, date, passengers ...), reused when the user changes their mind
    spec: dict[str, Any] | None = None


# -- lookups ------------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _routes(base: Database) -> dict[tuple[str, str], list[str]]:
    """Flight numbers by (origin, destination), built once per database."""
    out: dict[tuple[str, str], list[str]] = {}
    for code, f in sorted(base.tables["flights"].items()):
        out.setdefault((f["origin"], f["destination"]), []).append(code)
    return out


def _money(x: float) -> str:
    """How an amount is written in instructions and required outputs: 512 or 512.50."""
    x = round(x, 2)
    return str(int(x)) if x == int(x) else f"{x:.2f}"


def _status(db: DBView, seg: Mapping[str, Any]) -> str:
    return db.flights[seg["flight_number"]]["dates"][seg["date"]]["status"]


def _reservations(db: DBView, user: Mapping[str, Any], exclude: set[str]) -> list[Mapping[str, Any]]:
    return [db.reservations[r] for r in user["reservations"]
            if r not in exclude and db.reservations[r]["status"] == "active"]


def _not_departed(db: DBView, res: Mapping[str, Any]) -> bool:
    return all(_status(db, s) not in ("landed", "flying") for s in res["flights"])


def _all_open(db: DBView, res: Mapping[str, Any]) -> bool:
    return all(_status(db, s) == "available" for s in res["flights"])


def _direct_legs(res: Mapping[str, Any]) -> bool:
    """One flight per direction, so a date change is a single replacement."""
    return len(res["flights"]) == (1 if res["flight_type"] == "one_way" else 2)


def _describe(res: Mapping[str, Any]) -> str:
    kind = "round trip" if res["flight_type"] == "round_trip" else "one way"
    return (f"{res['reservation_id']} ({res['origin']} to {res['destination']}, {kind}, "
            f"{CABIN_WORDS[res['cabin']]}, first flight on {res['flights'][0]['date']})")


def _pay(rng: random.Random, user: Mapping[str, Any], amount: float, prefer: str | None = None) -> str | None:
    """A credit card, or a gift card that covers ``amount``; what the user will name to pay a change.
    ``prefer`` keeps the method of an earlier request when it still works (a change of mind)."""
    options = [pid for pid, m in sorted(user["payment_methods"].items())
               if m["source"] == "credit_card" or (m["source"] == "gift_card" and m["balance"] >= amount)]
    if prefer in options:
        return prefer
    return rng.choice(options) if options else None


def _pay_words(user: Mapping[str, Any], pid: str) -> str:
    m = user["payment_methods"][pid]
    if m["source"] == "credit_card":
        return f"your {m['brand']} credit card ending in {m['last_four']} ({pid})"
    return f"your {m['source'].replace('_', ' ')} {pid}"


def _refs(segments: Any) -> list[dict[str, str]]:
    return [{"flight_number": s["flight_number"], "date": s["date"]} for s in segments]


def _pick(rng: random.Random, options: list[tuple[Any, ...]], pref: str) -> tuple[Any, ...]:
    """Options are (price, departure, ...); the user's rule decides, ties broken by the other key."""
    if pref == "cheapest":
        return min(options, key=lambda o: (o[0], o[1]))
    if pref == "earliest":
        return min(options, key=lambda o: (o[1], o[0]))
    return max(options, key=lambda o: (o[1], -o[0]))


PREF_WORDS = {"cheapest": "the cheapest one", "earliest": "the one that leaves earliest",
              "latest": "the one that leaves latest"}


def _direct_options(db: DBView, origin: str, dest: str, date: str, cabin: str, n: int) -> list[tuple[Any, ...]]:
    out = []
    for code in _routes(db.base).get((origin, dest), []):
        f = db.flights[code]
        day = f["dates"][date]
        if day["status"] == "available" and day["available_seats"][cabin] >= n:
            out.append((day["prices"][cabin], f["scheduled_departure_time_est"], code))
    return out


def _new_person(rng: random.Random) -> dict[str, str]:
    return {"first_name": rng.choice(FIRST), "last_name": rng.choice(LAST),
            "dob": f"{rng.randrange(1950, 2015)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"}


def _people(passengers: Any) -> str:
    return "; ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})" for p in passengers)


# -- pieces -------------------------------------------------------------------------------------------
def cancel_grounds(db: DBView, res: Mapping[str, Any]) -> list[str]:
    """Why the policy lets this reservation be cancelled, whatever the user's reason (may be empty)."""
    grounds = []
    if res["created_at"] >= WITHIN_24H:
        grounds.append("24h")
    if any(_status(db, s) == "cancelled" for s in res["flights"]):
        grounds.append("airline")
    if res["cabin"] == "business":
        grounds.append("business")
    return grounds


COVERED = ["I have come down with the flu", "a doctor told me not to fly", "a hurricane is forecast there"]
NOT_COVERED = ["my plans changed", "I found a cheaper fare elsewhere", "the meeting I was flying to moved"]


def piece_cancel(rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str]) -> Piece | None:
    options = []
    for res in _reservations(db, user, exclude):
        if not _not_departed(db, res):
            continue
        grounds = cancel_grounds(db, res)
        if grounds:
            options.append((res, rng.choice(NOT_COVERED + COVERED)))
        elif res["insurance"] == "yes":
            options.append((res, rng.choice(COVERED)))
    if not options:
        return None
    res, reason = rng.choice(options)
    rid = res["reservation_id"]
    return Piece(
        intent=Intent(description=f"cancel reservation {rid} because {reason}", action="cancel_reservation",
                      args={"reservation_id": rid}, preferences={"reason": reason}),
        gold=[Action(name="cancel_reservation", arguments={"reservation_id": rid})],
        text=f"You want to cancel your reservation {_describe(res)}. If asked why: {reason}.",
        known={"reservation_id": rid, "cancel_reason": reason},
        reservation_id=rid,
    )


def piece_change_date(
    rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str],
    res: Mapping[str, Any] | None = None, idx: int | None = None, avoid: str | None = None,
    pref: str | None = None, prefer_pay: str | None = None,
) -> Piece | None:
    if res is None:
        cands = [r for r in _reservations(db, user, exclude)
                 if r["cabin"] != "basic_economy" and _direct_legs(r) and _all_open(db, r)]
        if not cands:
            return None
        res = rng.choice(cands)
    legs, n, cabin = res["flights"], len(res["passengers"]), res["cabin"]
    if idx is None:
        idx = 0 if len(legs) == 1 else rng.randrange(2)
    seg = legs[idx]
    dates = [d for d in FUTURE_DATES if d not in (seg["date"], avoid)
             and (idx == 0 or d > legs[0]["date"]) and (idx == 1 or len(legs) == 1 or d < legs[1]["date"])]
    rng.shuffle(dates)
    pref = pref or rng.choice(["cheapest", "earliest", "latest"])
    for date in dates[:4]:
        options = _direct_options(db, seg["origin"], seg["destination"], date, cabin, n)
        if options:
            break
    else:
        return None
    price, _, code = _pick(rng, options, pref)
    diff = (price - seg["price"]) * n
    pid = _pay(rng, user, diff, prefer_pay)
    if pid is None:
        return None
    flights = _refs(legs)
    flights[idx] = {"flight_number": code, "date": date}
    rid = res["reservation_id"]
    args = {"reservation_id": rid, "cabin": cabin, "flights": flights, "payment_id": pid}
    which = "outbound" if idx == 0 else "return"
    return Piece(
        intent=Intent(description=f"move the {which} flight of {rid} to {date}", action="update_reservation_flights",
                      args=args, preferences={"date": date, "flight_choice": pref, "payment_id": pid}),
        gold=[Action(name="update_reservation_flights", arguments=args)],
        text=(f"You want to move the {which} flight ({seg['origin']} to {seg['destination']}, now on {seg['date']}) "
              f"of your reservation {_describe(res)} to {date}, same cabin. You want a direct flight; if there are "
              f"several, take {PREF_WORDS[pref]}. Pay any difference with {_pay_words(user, pid)}."),
        known={"reservation_id": rid, "new_date": date, "payment_id": pid},
        reservation_id=rid,
    )


def piece_upgrade(rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str]) -> Piece | None:
    options = []
    for res in _reservations(db, user, exclude):
        if res["cabin"] == "business" or not _all_open(db, res):
            continue
        n = len(res["passengers"])
        for cabin in CABINS[CABINS.index(res["cabin"]) + 1:]:
            days = [db.flights[s["flight_number"]]["dates"][s["date"]] for s in res["flights"]]
            if all(d["available_seats"][cabin] >= n for d in days):
                new = sum(d["prices"][cabin] for d in days)
                options.append((res, cabin, (new - sum(s["price"] for s in res["flights"])) * n))
    if not options:
        return None
    res, cabin, diff = rng.choice(options)
    pid = _pay(rng, user, diff)
    if pid is None:
        return None
    rid = res["reservation_id"]
    args = {"reservation_id": rid, "cabin": cabin, "flights": _refs(res["flights"]), "payment_id": pid}
    return Piece(
        intent=Intent(description=f"move reservation {rid} to {cabin}", action="update_reservation_flights",
                      args=args, preferences={"cabin": cabin, "payment_id": pid}),
        gold=[Action(name="update_reservation_flights", arguments=args)],
        text=(f"You want to upgrade your reservation {_describe(res)} to {CABIN_WORDS[cabin]} on the same flights. "
              f"Pay with {_pay_words(user, pid)}; the price difference is fine whatever it is."),
        known={"reservation_id": rid, "cabin": cabin, "payment_id": pid},
        reservation_id=rid,
    )


def baggage_args(user: Mapping[str, Any], res: Mapping[str, Any], add: int) -> tuple[int, int, int]:
    """New total, new non-free count and fee when ``add`` bags are added (allowance from the policy)."""
    allowance = FREE_BAGS[user["membership"]][res["cabin"]] * len(res["passengers"])
    total = res["total_baggages"] + add
    nonfree = max(res["nonfree_baggages"], total - allowance)
    return total, nonfree, BAG_FEE * (nonfree - res["nonfree_baggages"])


def piece_baggage(
    rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str],
    res: Mapping[str, Any] | None = None, add: int | None = None, prefer_pay: str | None = None,
) -> Piece | None:
    if res is None:
        cands = [r for r in _reservations(db, user, exclude) if _not_departed(db, r)]
        if not cands:
            return None
        res = rng.choice(cands)
    add = add or rng.randrange(1, 4)
    total, nonfree, fee = baggage_args(user, res, add)
    pid = _pay(rng, user, fee, prefer_pay)
    if pid is None:
        return None
    rid = res["reservation_id"]
    args = {"reservation_id": rid, "total_baggages": total, "nonfree_baggages": nonfree, "payment_id": pid}
    return Piece(
        intent=Intent(description=f"add {add} checked bag(s) to {rid}", action="update_reservation_baggages",
                      args=args, preferences={"bags_to_add": add, "payment_id": pid}),
        gold=[Action(name="update_reservation_baggages", arguments=args)],
        text=(f"You want to add {add} checked bag{'s' if add > 1 else ''} to your reservation {_describe(res)}. "
              f"If there is a fee, pay with {_pay_words(user, pid)}."),
        known={"reservation_id": rid, "bags_to_add": str(add), "payment_id": pid},
        reservation_id=rid,
    )


def piece_passengers(rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str]) -> Piece | None:
    cands = [r for r in _reservations(db, user, exclude) if _not_departed(db, r)]
    if not cands:
        return None
    res = rng.choice(cands)
    people = [dict(p) for p in res["passengers"]]
    i = rng.randrange(len(people))
    old = dict(people[i])
    if i > 0 and rng.random() < 0.6:
        new = _new_person(rng)
        if (new["first_name"], new["last_name"]) == (old["first_name"], old["last_name"]):
            return None
        people[i] = new
        what = (f"replace the passenger {old['first_name']} {old['last_name']} with {new['first_name']} "
                f"{new['last_name']}, born {new['dob']}")
    else:
        year, month, day = old["dob"].split("-")
        new_day = f"{(int(day) % 28) + 1:02d}"
        people[i]["dob"] = f"{year}-{month}-{new_day}"
        what = (f"correct the date of birth of the passenger {old['first_name']} {old['last_name']}: it is "
                f"{people[i]['dob']}, not {old['dob']}")
    rid = res["reservation_id"]
    args = {"reservation_id": rid, "passengers": people}
    return Piece(
        intent=Intent(description=f"on {rid}, {what}", action="update_reservation_passengers", args=args),
        gold=[Action(name="update_reservation_passengers", arguments=args)],
        text=f"On your reservation {_describe(res)} you want to {what}. The other passengers stay as they are.",
        known={"reservation_id": rid, "passengers": _people(people)},
        reservation_id=rid,
    )


def piece_book(
    rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str],
    spec: dict[str, Any] | None = None, cabin: str | None = None,
) -> Piece | None:
    """A one-way booking; ``spec`` fixes everything but the cabin (for a change of mind)."""
    if spec is None:
        routes = sorted(_routes(db.base))
        n = rng.choice([1, 1, 1, 2, 2, 3])
        me = {**user["name"], "dob": user["dob"]}
        travellers = ([me] + [dict(p) for p in user["saved_passengers"]])[:n]
        travellers += [_new_person(rng) for _ in range(n - len(travellers))]
        spec = {"route": rng.choice(routes), "date": rng.choice(FUTURE_DATES), "passengers": travellers,
                "pref": rng.choice(["cheapest", "earliest", "latest"]), "bags": rng.randrange(0, n + 2),
                "insurance": rng.choice(["yes", "no"])}
    cabin = cabin or rng.choices(CABINS, [0.25, 0.5, 0.25])[0]
    (origin, dest), date, people = spec["route"], spec["date"], spec["passengers"]
    n = len(people)
    options = _direct_options(db, origin, dest, date, cabin, n)
    if not options:
        return None
    price, _, code = _pick(rng, options, spec["pref"])
    bags = spec["bags"]
    nonfree = max(0, bags - FREE_BAGS[user["membership"]][cabin] * n)
    total = round(price * n + BAG_FEE * nonfree + (INSURANCE_FEE * n if spec["insurance"] == "yes" else 0), 2)
    methods = user["payment_methods"]
    cards = sorted(p for p, m in methods.items() if m["source"] == "credit_card")
    gifts = sorted(p for p, m in methods.items() if m["source"] == "gift_card" and m["balance"] >= total)
    certs = sorted(p for p, m in methods.items() if m["source"] == "certificate" and m["amount"] > 0)
    plans: list[list[dict[str, Any]]] = [[{"payment_id": c, "amount": float(total)}] for c in cards + gifts]
    if certs and cards:
        cert = rng.choice(certs)
        part = min(methods[cert]["amount"], total)
        plan = [{"payment_id": cert, "amount": float(part)}]
        if total - part > 0:
            plan.append({"payment_id": rng.choice(cards), "amount": round(total - part, 2)})
        plans.append(plan)
    if not plans:
        return None
    plan = rng.choice(plans)
    args = {
        "user_id": user["user_id"], "origin": origin, "destination": dest, "flight_type": "one_way",
        "cabin": cabin, "flights": [{"flight_number": code, "date": date}], "passengers": [dict(p) for p in people],
        "payment_methods": plan, "total_baggages": bags, "nonfree_baggages": nonfree,
        "insurance": spec["insurance"],
    }
    if len(plan) == 1:
        pay_text = f"Pay with {_pay_words(user, plan[0]['payment_id'])}."
    else:
        pay_text = (f"Use your whole travel certificate {plan[0]['payment_id']} ({_money(plan[0]['amount'])} dollars) "
                    f"and pay the rest with {_pay_words(user, plan[1]['payment_id'])}.")
    bag_text = f"{bags} checked bag{'s' if bags != 1 else ''} in total" if bags else "no checked bags"
    return Piece(
        intent=Intent(description=f"book a one-way {cabin} flight {origin}->{dest} on {date}",
                      action="book_reservation", args=args,
                      preferences={"cabin": cabin, "flight_choice": spec["pref"], "insurance": spec["insurance"],
                                   "total_baggages": bags, "payment": plan}),
        gold=[Action(name="book_reservation", arguments=args)],
        text=(f"You want to book a one-way trip from {origin} to {dest} on {date} in {CABIN_WORDS[cabin]} for "
              f"{'yourself' if n == 1 else f'{n} people'}: {_people(people)}. You want a direct flight; if "
              f"there are several, take {PREF_WORDS[spec['pref']]}. You want {bag_text} and "
              f"{'travel insurance' if spec['insurance'] == 'yes' else 'no travel insurance'}. {pay_text}"),
        known={"origin": origin, "destination": dest, "date": date, "cabin": cabin, "passengers": _people(people),
               "total_baggages": str(bags), "insurance": spec["insurance"],
               "payment_id": ", ".join(p["payment_id"] for p in plan)},
        spec=spec,
    )


def piece_compensation(rng: random.Random, db: DBView, user: Mapping[str, Any], exclude: set[str]) -> Piece | None:
    options = []
    for res in _reservations(db, user, exclude):
        hit = [s for s in res["flights"] if _status(db, s) == "cancelled"]
        eligible = user["membership"] != "regular" or res["insurance"] == "yes" or res["cabin"] == "business"
        if hit and eligible:
            options.append((res, hit[0]))
    if not options:
        return None
    res, seg = rng.choice(options)
    amount = float(100 * len(res["passengers"]))
    args = {"user_id": user["user_id"], "amount": amount}
    rid = res["reservation_id"]
    return Piece(
        intent=Intent(description=f"compensation for the cancelled flight {seg['flight_number']} of {rid}",
                      action="send_certificate", args=args),
        gold=[Action(name="send_certificate", arguments=args)],
        text=(f"The airline cancelled flight {seg['flight_number']} on {seg['date']} of your reservation "
              f"{_describe(res)}. You are upset about it and ask for compensation. You do not want to cancel or "
              "change the reservation; you just want the compensation."),
        known={"reservation_id": rid, "flight_number": seg["flight_number"], "date": seg["date"]},
        reservation_id=rid,
    )


PIECES: dict[str, Callable[..., Piece | None]] = {
    "cancel": piece_cancel,
    "change_date": piece_change_date,
    "upgrade": piece_upgrade,
    "baggage": piece_baggage,
    "passengers": piece_passengers,
    "book": piece_book,
    "compensation": piece_compensation,
}


# -- drafting -------------------------------------------------------------------------------------------
def _draft(
    rng: random.Random,
    user: Mapping[str, Any],
    pieces: list[Piece],
    withheld: list[str] | None = None,
    extra: str = "",
    traits: list[str] | None = None,
) -> Draft:
    """Assemble scenario and instruction from pieces: persona, facts, goals in order, then how to behave."""
    name = f"{user['name']['first_name']} {user['name']['last_name']}"
    persona = rng.choice(PERSONAS)
    traits = traits or rng.sample(TRAITS, 2)
    known = {"user_id": user["user_id"], "first_name": user["name"]["first_name"],
             "last_name": user["name"]["last_name"]}
    for i, p in enumerate(pieces):
        for k, v in p.known.items():
            known[k if k not in known or known[k] == v else f"{k}_{i + 1}"] = v
    withheld = withheld or []
    goals = " ".join(p.text for p in pieces)
    if len(pieces) > 1:
        goals = " ".join(f"({i + 1}) {p.text}" for i, p in enumerate(pieces)) + " Bring up one goal at a time."
    hide = ""
    if withheld:
        hide = f" Do not reveal your {', '.join(k.replace('_', ' ') for k in withheld)} unless the agent asks for it."
    instruction = (
        f"You are {name} (user id {user['user_id']}), {persona}. You are contacting the airline's customer "
        f"service. {goals}{extra}{hide} Give your user id when asked. When the agent lists the details of an "
        "action and asks you to confirm, say yes only if they match what you want. You are "
        f"{' and '.join(traits)}. End the conversation once you have what you wanted."
    )
    return Draft(
        scenario=Scenario(persona=persona, known=known, withheld=withheld, intents=[p.intent for p in pieces],
                          traits=traits),
        instruction=instruction,
        gold_actions=[a for p in pieces for a in p.gold],
        required_outputs=[o for p in pieces for o in p.outputs],
    )


def _user(db: DBView, user_id: str) -> Mapping[str, Any]:
    return db.users[user_id]


def _single(kind: str) -> Family:
    def family(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
        user = _user(db, user_id)
        piece = PIECES[kind](rng, db, user, set())
        return None if piece is None else _draft(rng, user, [piece])

    family.__name__ = f"family_{kind}"
    family.__doc__ = f"A straightforward {kind} task: one goal, stated up front."
    return family


def family_withheld(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """A goal whose reservation id (and sometimes payment choice) the user only gives when asked."""
    user = _user(db, user_id)
    kind = rng.choice(["cancel", "change_date", "upgrade", "baggage", "passengers"])
    piece = PIECES[kind](rng, db, user, set())
    if piece is None or piece.reservation_id is None:
        return None
    withheld = ["reservation_id"] + (["payment_id"] if "payment_id" in piece.known and rng.random() < 0.5 else [])
    piece.text = piece.text.replace(f"reservation {piece.reservation_id} (", "reservation (")
    return _draft(rng, user, [piece], withheld=withheld)


def family_change_of_mind(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The user asks for one thing, then switches before confirming; only the final request is gold."""
    user = _user(db, user_id)
    kind = rng.choice(["baggage", "change_date", "book"])
    if kind == "baggage":
        first = piece_baggage(rng, db, user, set())
        if first is None:
            return None
        res = db.reservations[first.reservation_id]
        k1 = first.intent.preferences["bags_to_add"]
        final = piece_baggage(rng, db, user, set(), res=res, add=rng.choice([k for k in (1, 2, 3, 4) if k != k1]),
                              prefer_pay=first.intent.args["payment_id"])
        if final is None:
            return None
        k2 = final.intent.preferences["bags_to_add"]
        switch = (f" At first ask for {k1} bag{'s' if k1 > 1 else ''}; when the agent tells you the details, "
                  f"change your mind and say you want {k2} bag{'s' if k2 > 1 else ''} instead.")
    elif kind == "change_date":
        first = piece_change_date(rng, db, user, set())
        if first is None:
            return None
        res = db.reservations[first.reservation_id]
        idx = next(i for i, f in enumerate(first.intent.args["flights"]) if f not in _refs(res["flights"]))
        pref = first.intent.preferences["flight_choice"]
        final = piece_change_date(rng, db, user, set(), res=res, idx=idx, avoid=first.intent.preferences["date"],
                                  pref=pref, prefer_pay=first.intent.args["payment_id"])
        if final is None:
            return None
        switch = (f" At first ask to move it to {first.intent.preferences['date']}; when the agent proposes a flight, "
                  f"change your mind and ask for {final.intent.preferences['date']} instead.")
    else:
        first = piece_book(rng, db, user, set())
        if first is None:
            return None
        c1 = first.intent.args["cabin"]
        c2 = rng.choice([c for c in CABINS if c != c1])
        final = piece_book(rng, db, user, set(), spec=first.spec, cabin=c2)
        if final is None:
            return None
        switch = (f" At first ask for {CABIN_WORDS[c1]}; when the agent quotes the price, change your mind and "
                  f"ask for {CABIN_WORDS[c2]} instead.")
    final.intent.first_args = first.intent.args
    final.intent.description += " (after first asking for something else)"
    return _draft(rng, user, [final], extra=switch)


def family_out_of_policy(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """A request the policy forbids; the user insists. The agent must refuse: no write is gold."""
    user = _user(db, user_id)
    kind = rng.choice(["cancel", "basic_change", "compensation"])
    active = [r for r in _reservations(db, user, set()) if _not_departed(db, r)]
    insist = (" If the agent refuses, insist once, saying it is really important to you. You do not want "
              "any other option instead, and if the agent still refuses, accept it and end the conversation.")
    if kind == "cancel":
        cands = [r for r in active if not cancel_grounds(db, r)]
        if not cands:
            return None
        res = rng.choice(cands)
        reason = rng.choice(NOT_COVERED)
        intent = Intent(description=f"cancel {res['reservation_id']} ({reason}); not allowed by policy",
                        action="cancel_reservation", args={"reservation_id": res["reservation_id"]},
                        preferences={"reason": reason}, out_of_policy=True)
        text = f"You want to cancel your reservation {_describe(res)} because {reason}, and get a full refund."
        known = {"reservation_id": res["reservation_id"], "cancel_reason": reason}
    elif kind == "basic_change":
        cands = [r for r in active if r["cabin"] == "basic_economy"]
        if not cands:
            return None
        res = rng.choice(cands)
        date = rng.choice([d for d in FUTURE_DATES if d != res["flights"][0]["date"]])
        intent = Intent(description=f"move basic economy reservation {res['reservation_id']} to {date}; not allowed",
                        action="update_reservation_flights",
                        args={"reservation_id": res["reservation_id"], "new_date": date}, out_of_policy=True)
        text = (f"You want to move the first flight of your reservation {_describe(res)} to {date}, keeping the "
                "basic economy cabin.")
        known = {"reservation_id": res["reservation_id"], "new_date": date}
    else:
        cands = []
        for r in _reservations(db, user, set()):
            hit = [s for s in r["flights"] if _status(db, s) == "cancelled"]
            if hit and user["membership"] == "regular" and r["insurance"] == "no" and r["cabin"] != "business":
                cands.append((r, hit[0]))
        if not cands:
            return None
        res, seg = rng.choice(cands)
        intent = Intent(description=f"compensation for cancelled {seg['flight_number']}; user not eligible",
                        action="send_certificate", args={"user_id": user_id}, out_of_policy=True)
        text = (f"The airline cancelled flight {seg['flight_number']} on {seg['date']} of your reservation "
                f"{_describe(res)}. You want a travel certificate as compensation. You do not want to cancel or "
                "change the reservation.")
        known = {"reservation_id": res["reservation_id"], "flight_number": seg["flight_number"], "date": seg["date"]}
    piece = Piece(intent=intent, gold=[], text=text, known=known, reservation_id=res["reservation_id"])
    return _draft(rng, user, [piece], extra=insist, traits=["insistent", rng.choice(TRAITS)])


def family_multi(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Two goals on two reservations (or a booking) in one conversation: two confirmed writes, in order."""
    user = _user(db, user_id)
    kinds = rng.sample(["cancel", "change_date", "upgrade", "baggage", "passengers", "book"], 2)
    first = PIECES[kinds[0]](rng, db, user, set())
    if first is None:
        return None
    scratch = db.base.view()  # the second goal is solved on the state the first one leaves behind
    first_fields = _effects(db, scratch, first.gold)
    if first_fields is None:
        return None
    done = {first.reservation_id} if first.reservation_id else set()
    second = PIECES[kinds[1]](rng, scratch, scratch.users[user_id], done)
    if second is None:
        return None
    second_fields = _effects(scratch, db.base.view(), first.gold + second.gold)
    # two goals writing one field (the same gift card balance, the same seat count) could not be graded
    # apart, so such pairs are skipped
    if second_fields is None or first_fields & second_fields:
        return None
    return _draft(rng, user, [first, second])


def _effects(before: DBView, after: DBView, actions: list[Action]) -> set[tuple[Any, ...]] | None:
    """Run ``actions`` on ``after`` and return the fields they leave different from ``before``."""
    for action in actions:
        if not TOOL_MAP[action.name].run(after, action.arguments).ok:
            return None
    touched = [(t, k) for t, keys in after.changed_keys().items() for k in sorted(keys)]
    out = set()
    for table, key in touched:
        old = before[table].get(key, MISSING)
        new = after[table].get(key, MISSING)
        out.update((table, key, path) for path, _, _ in changes(old, new))
    return out


def family_info(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """A question whose exact answer the agent must say; nothing may change."""
    user = _user(db, user_id)
    kind = rng.choice(["status", "paid", "fare"])
    reservations = [db.reservations[r] for r in user["reservations"]]
    if kind == "status":
        segs = [(r, s) for r in reservations for s in r["flights"]
                if s["date"] == TODAY or (s["date"] < TODAY and _status(db, s) == "cancelled")]
        if not segs:
            return None
        res, seg = rng.choice(segs)
        answer = _status(db, seg)
        question = f"What is the status of flight {seg['flight_number']} on {seg['date']}?"
        text = (f"Your reservation {res['reservation_id']} includes flight {seg['flight_number']} on {seg['date']}. "
                f"You want to know its current status. {question}")
        known = {"reservation_id": res["reservation_id"], "flight_number": seg["flight_number"], "date": seg["date"]}
    elif kind == "paid":
        if not reservations:
            return None
        res = rng.choice(reservations)
        net = sum(p["amount"] if p["transaction_type"] == "payment" else -p["amount"] for p in res["payment_history"])
        answer = _money(net)
        question = f"How much have I paid in total for reservation {res['reservation_id']}?"
        text = f"You want to know how much you paid in total for your reservation {_describe(res)}."
        known = {"reservation_id": res["reservation_id"]}
    else:
        origin, dest = rng.choice(sorted(_routes(db.base)))
        date = rng.choice(FUTURE_DATES)
        cabin = rng.choice(["economy", "business"])
        options = _direct_options(db, origin, dest, date, cabin, 1)
        if not options:
            return None
        answer = _money(min(options)[0])
        question = (f"What is the cheapest direct {CABIN_WORDS[cabin]} fare from {origin} to {dest} on {date}, "
                    "among flights that still have a seat?")
        text = f"You are planning a trip and want to know the price of a seat. {question} You do not want to book yet."
        known = {"origin": origin, "destination": dest, "date": date, "cabin": cabin}
    piece = Piece(intent=Intent(description=question, question=question, answer=answer), gold=[], text=text,
                  known=known, outputs=[answer])
    return _draft(rng, user, [piece], extra=" Make sure the agent tells you the exact answer.")


FAMILIES: dict[str, tuple[float, Family]] = {
    "cancel_eligible": (1.0, _single("cancel")),
    "change_flight_date": (1.0, _single("change_date")),
    "upgrade_cabin": (0.8, _single("upgrade")),
    "add_baggage": (0.8, _single("baggage")),
    "update_passengers": (0.8, _single("passengers")),
    "book_one_way": (1.0, _single("book")),
    "compensation": (0.5, _single("compensation")),
    "withheld_info": (1.0, family_withheld),
    "change_of_mind": (1.0, family_change_of_mind),
    "out_of_policy": (1.2, family_out_of_policy),
    "multi_action": (1.0, family_multi),
    "info_request": (1.0, family_info),
}


def build_tasks(domain: Domain, seed: int, counts: Mapping[str, int]) -> list[Task]:
    """Deterministic airline tasks for ``counts`` per split, over every user of the default database."""
    users = sorted(domain.database().tables["users"])
    return generate(domain, seed, counts, FAMILIES, users=users)
