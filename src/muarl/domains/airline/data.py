"""Seeded generator of the airline database: an airport network, dated flights, users and reservations.

Every value comes from one ``random.Random(seed)``, so a (seed, size) pair names one database exactly.
The clock is frozen at :data:`NOW` (the policy states it), flights run over a three-week window around
it, and some structure is planted on purpose so that every task family finds hosts at any size:
reservations booked within the last 24 hours, insured and business ones, flights the airline cancelled,
gift cards and certificates with balances.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Any

#: The frozen "current time" of the world (Eastern time); the policy quotes it.
NOW = "2024-05-15T15:00:00"
TODAY = NOW[:10]
FIRST_DATE = dt.date(2024, 5, 8)
N_DAYS = 22
DATES: list[str] = [(FIRST_DATE + dt.timedelta(days=i)).isoformat() for i in range(N_DAYS)]
FUTURE_DATES: list[str] = [d for d in DATES if d > TODAY]

CABINS = ("basic_economy", "economy", "business")
MEMBERSHIPS = ("regular", "silver", "gold")
#: free checked bags per passenger, by membership then cabin (the policy quotes this table)
FREE_BAGS: dict[str, dict[str, int]] = {
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 3},
}
BAG_FEE = 50
INSURANCE_FEE = 30
MAX_PASSENGERS = 5

#: IATA code -> (city, approximate latitude, longitude); used for the network and flight durations
AIRPORTS: dict[str, tuple[str, float, float]] = {
    "ATL": ("Atlanta", 33.6, -84.4), "ORD": ("Chicago", 41.9, -87.9), "DFW": ("Dallas-Fort Worth", 32.9, -97.0),
    "DEN": ("Denver", 39.9, -104.7), "JFK": ("New York", 40.6, -73.8), "LAX": ("Los Angeles", 33.9, -118.4),
    "SFO": ("San Francisco", 37.6, -122.4), "SEA": ("Seattle", 47.4, -122.3), "MIA": ("Miami", 25.8, -80.3),
    "BOS": ("Boston", 42.4, -71.0), "PHX": ("Phoenix", 33.4, -112.0), "LAS": ("Las Vegas", 36.1, -115.2),
    "MSP": ("Minneapolis", 44.9, -93.2), "DTW": ("Detroit", 42.2, -83.4), "IAH": ("Houston", 29.98, -95.3),
    "CLT": ("Charlotte", 35.2, -80.9), "PHL": ("Philadelphia", 39.9, -75.2), "MCO": ("Orlando", 28.4, -81.3),
}
HUBS = ("ATL", "ORD", "DFW", "DEN")

FIRST = ["Olivia", "Liam", "Emma", "Noah", "Amelia", "James", "Sophia", "Lucas", "Mia", "Ethan", "Isabella",
         "Yusuf", "Amara", "Chen", "Priya", "Mateo", "Fatima", "Omar", "Aisha", "Daniel", "Sofia", "Raj",
         "Lena", "Ivan", "Yuki", "Harper", "Leo", "Zoe", "Kai", "Nora", "Elijah", "Chloe", "Anya", "Mohamed"]
LAST = ["Gonzalez", "Kim", "Garcia", "Smith", "Nguyen", "Patel", "Johnson", "Silva", "Muller", "Rossi",
        "Lopez", "Khan", "Brown", "Wilson", "Tanaka", "Ahmed", "Novak", "Moreau", "Santos", "Cohen", "Ito",
        "Davis", "Ali", "Hansen", "Martin", "Jensen", "Costa", "Sato", "Lee", "Walker", "Young", "Thomas"]
STREETS = ["Maple Ave", "Oak St", "Cedar Ln", "Pine Rd", "Elm St", "Lakeview Dr", "Hillcrest Rd", "River Rd",
           "Sunset Blvd", "Park Pl", "Main St", "Willow Way", "Birch Ct", "Highland Ave"]
CARD_BRANDS = ["visa", "mastercard", "amex", "discover"]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(str(rng.randrange(10)) for _ in range(n))


def _minutes(hhmm: str) -> int:
    return int(hhmm[:2]) * 60 + int(hhmm[3:5])


def _clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _distance(a: str, b: str) -> float:
    _, la1, lo1 = AIRPORTS[a]
    _, la2, lo2 = AIRPORTS[b]
    return math.hypot(la1 - la2, (lo1 - lo2) * math.cos(math.radians((la1 + la2) / 2)))


def _routes(rng: random.Random) -> list[tuple[str, str]]:
    """Directed routes: every hub to every airport and back, plus a few spoke-to-spoke links."""
    pairs: set[tuple[str, str]] = set()
    codes = sorted(AIRPORTS)
    for hub in HUBS:
        for other in codes:
            if other != hub:
                pairs.update({(hub, other), (other, hub)})
    spokes = [c for c in codes if c not in HUBS]
    for a in spokes:
        for b in rng.sample([s for s in spokes if s != a], 2):
            pairs.update({(a, b), (b, a)})
    return sorted(pairs)


def _flight_dates(rng: random.Random, dep: int, arr: int, base: int) -> dict[str, Any]:
    """Per-date state of one flight: landed in the past, live statuses today, bookable in the future."""
    now = _minutes(NOW[11:16])
    out: dict[str, Any] = {}
    for date in DATES:
        if date < TODAY or (date == TODAY and arr <= now):
            if rng.random() < 0.03:
                out[date] = {"status": "cancelled"}
            else:
                d_late, a_late = rng.choice([0, 0, 0, 5, 12, 25, 60]), rng.choice([-10, 0, 5, 20, 45])
                out[date] = {
                    "status": "landed",
                    "actual_departure_time_est": f"{date}T{_clock(dep + d_late)}",
                    "actual_arrival_time_est": f"{date}T{_clock(min(arr + a_late, 1439))}",
                }
        elif date == TODAY and dep <= now:
            out[date] = {"status": "flying", "actual_departure_time_est": f"{date}T{_clock(dep)}",
                         "estimated_arrival_time_est": f"{date}T{_clock(arr)}"}
        elif date == TODAY:
            status = rng.choices(["on time", "delayed", "cancelled"], [0.7, 0.22, 0.08])[0]
            entry: dict[str, Any] = {"status": status}
            if status == "delayed":
                late = rng.choice([30, 45, 60, 90, 120])
                entry["estimated_departure_time_est"] = f"{date}T{_clock(min(dep + late, 1439))}"
                entry["estimated_arrival_time_est"] = f"{date}T{_clock(min(arr + late, 1439))}"
            out[date] = entry
        elif rng.random() < 0.03:
            out[date] = {"status": "cancelled"}
        else:
            swing = rng.uniform(0.8, 1.35)
            basic = int(base * swing)
            out[date] = {
                "status": "available",
                "available_seats": {"basic_economy": rng.randrange(0, 16), "economy": rng.randrange(0, 21),
                                    "business": rng.randrange(0, 9)},
                "prices": {"basic_economy": basic, "economy": int(basic * rng.uniform(1.4, 1.9)),
                           "business": int(basic * rng.uniform(3.0, 4.6))},
            }
    return out


def _flights(rng: random.Random) -> dict[str, Any]:
    flights: dict[str, Any] = {}
    number = 100
    for origin, dest in _routes(rng):
        dist = _distance(origin, dest)
        duration = int(50 + dist * 9) // 5 * 5
        base = int(45 + dist * 4.5)
        for _ in range(rng.choice([1, 2, 2, 3])):
            number += rng.randrange(1, 4)
            dep = rng.randrange(5 * 12, (23 * 60 - duration) // 5) * 5
            code = f"HAT{number:03d}"
            flights[code] = {
                "flight_number": code,
                "origin": origin,
                "destination": dest,
                "scheduled_departure_time_est": _clock(dep),
                "scheduled_arrival_time_est": _clock(dep + duration),
                "dates": _flight_dates(rng, dep, dep + duration, base),
            }
    return flights


def _dob(rng: random.Random, young: int = 1950, old: int = 2005) -> str:
    return f"{rng.randrange(young, old)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


def _person(rng: random.Random) -> dict[str, str]:
    return {"first_name": rng.choice(FIRST), "last_name": rng.choice(LAST), "dob": _dob(rng)}


def _payment_methods(rng: random.Random) -> dict[str, Any]:
    methods: dict[str, Any] = {}
    kinds = ["credit_card"] * rng.choice([0, 1, 1, 1, 2]) + ["gift_card"] * rng.choice([0, 1, 1, 2])
    if not kinds:
        kinds = ["credit_card"]
    kinds += ["certificate"] * rng.choice([0, 0, 1, 2])
    for kind in kinds:
        pid = f"{kind}_{_digits(rng, 7)}"
        if kind == "credit_card":
            methods[pid] = {"source": kind, "id": pid, "brand": rng.choice(CARD_BRANDS), "last_four": _digits(rng, 4)}
        elif kind == "gift_card":
            methods[pid] = {"source": kind, "id": pid, "balance": float(rng.randrange(20, 400))}
        else:
            methods[pid] = {"source": kind, "id": pid, "amount": float(rng.choice([100, 150, 200, 250, 500]))}
    return methods


class _Network:
    """Route lookups over the generated flights, used to place reservations on real itineraries."""

    def __init__(self, flights: dict[str, Any]):
        self.flights = flights
        self.by_route: dict[tuple[str, str], list[str]] = {}
        self.by_origin: dict[str, list[str]] = {}
        for code, f in flights.items():
            self.by_route.setdefault((f["origin"], f["destination"]), []).append(code)
            self.by_origin.setdefault(f["origin"], []).append(code)

    def itinerary(self, rng: random.Random, origin: str, dest: str) -> list[str] | None:
        """A direct flight, or a same-day connection with at least an hour between legs."""
        direct = self.by_route.get((origin, dest), [])
        if direct and rng.random() < 0.7:
            return [rng.choice(direct)]
        options = []
        for first in self.by_origin[origin]:
            mid = self.flights[first]["destination"]
            if mid not in HUBS:
                continue
            for second in self.by_route.get((mid, dest), []):
                arrive = _minutes(self.flights[first]["scheduled_arrival_time_est"])
                if _minutes(self.flights[second]["scheduled_departure_time_est"]) >= arrive + 60:
                    options.append([first, second])
        if options:
            return rng.choice(options)
        return [rng.choice(direct)] if direct else None


def _created_at(rng: random.Random, first_date: str) -> str:
    """Booking time: before ``NOW`` and before the first flight; about 12% inside the last 24 hours."""
    now = dt.datetime.fromisoformat(NOW)
    latest = min(now, dt.datetime.fromisoformat(first_date + "T00:00:00"))
    if latest == now and rng.random() < 0.12:
        moment = now - dt.timedelta(minutes=rng.randrange(30, 23 * 60))
    else:
        moment = latest - dt.timedelta(minutes=rng.randrange(25 * 60, 40 * 24 * 60))
    return moment.replace(second=0).isoformat()


def _reservation(rng: random.Random, net: _Network, user: dict[str, Any], rid: str) -> dict[str, Any] | None:
    codes = sorted(AIRPORTS)
    origin, dest = rng.sample(codes, 2)
    out_legs = net.itinerary(rng, origin, dest)
    back_legs = net.itinerary(rng, dest, origin) if rng.random() < 0.55 else None
    if not out_legs:
        return None
    day = rng.randrange(0, N_DAYS - (3 if back_legs else 0))
    dates = [DATES[day]] * len(out_legs)
    if back_legs:
        back_day = min(N_DAYS - 1, day + rng.randrange(1, 7))
        dates += [DATES[back_day]] * len(back_legs)
    cabin = rng.choices(CABINS, [0.3, 0.5, 0.2])[0]
    segments = []
    for code, date in zip(out_legs + (back_legs or []), dates, strict=True):
        f = net.flights[code]
        entry = f["dates"][date]
        if entry["status"] == "available":
            price = entry["prices"][cabin]
        else:
            price = int(_distance(f["origin"], f["destination"]) * 4.5 * (1, 1.6, 3.6)[CABINS.index(cabin)]) + 60
        segments.append({"flight_number": code, "date": date, "price": price,
                         "origin": f["origin"], "destination": f["destination"]})
    if rng.random() < 0.06:  # plant airline cancellations on future segments
        future = [s for s in segments if s["date"] > TODAY]
        if future:
            net.flights[future[0]["flight_number"]]["dates"][future[0]["date"]] = {"status": "cancelled"}
    n = rng.choices([1, 2, 3, 4], [0.5, 0.3, 0.15, 0.05])[0]
    me = {k: v for k, v in user["name"].items()} | {"dob": user["dob"]}
    pool = [me] + list(user["saved_passengers"])
    passengers = pool[:n] + [_person(rng) for _ in range(n - len(pool))]
    insurance = "yes" if rng.random() < 0.35 else "no"
    free = FREE_BAGS[user["membership"]][cabin] * n
    total_bags = rng.randrange(0, free + 2)
    nonfree = max(0, total_bags - free)
    total = sum(s["price"] for s in segments) * n + (INSURANCE_FEE * n if insurance == "yes" else 0) + BAG_FEE * nonfree
    methods = [m for m in user["payment_methods"].values() if m["source"] != "certificate"]
    pay = rng.choice(methods)
    history = [{"transaction_type": "payment", "payment_id": pay["id"], "amount": float(total)}]
    status = "active"
    if rng.random() < 0.05:  # a few reservations the user already cancelled, refund included
        status = "cancelled"
        history.append({"transaction_type": "refund", "payment_id": pay["id"], "amount": float(total)})
    return {
        "reservation_id": rid,
        "user_id": user["user_id"],
        "origin": origin,
        "destination": dest,
        "flight_type": "round_trip" if back_legs else "one_way",
        "cabin": cabin,
        "flights": segments,
        "passengers": passengers,
        "payment_history": history,
        "created_at": _created_at(rng, dates[0]),
        "total_baggages": total_bags,
        "nonfree_baggages": nonfree,
        "insurance": insurance,
        "status": status,
    }


def build_db(seed: int, size: int) -> dict[str, dict[str, dict]]:
    """The airline tables for ``size`` users: ``users``, ``flights``, ``reservations`` and ``airports``."""
    rng = random.Random(seed)
    flights = _flights(rng)
    net = _Network(flights)
    users: dict[str, Any] = {}
    reservations: dict[str, Any] = {}
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    while len(users) < size:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        uid = f"{first.lower()}_{last.lower()}_{_digits(rng, 4)}"
        if uid in users:
            continue
        methods = _payment_methods(rng)
        user: dict[str, Any] = {
            "user_id": uid,
            "name": {"first_name": first, "last_name": last},
            "address": {"address1": f"{rng.randrange(1, 9999)} {rng.choice(STREETS)}", "address2": "",
                        "city": AIRPORTS[rng.choice(sorted(AIRPORTS))][0], "country": "USA",
                        "zip": _digits(rng, 5)},
            "email": f"{first.lower()}.{last.lower()}{rng.randrange(1, 99)}@example.com",
            "dob": _dob(rng, 1950, 2003),
            "membership": rng.choices(MEMBERSHIPS, [0.5, 0.3, 0.2])[0],
            "payment_methods": methods,
            "saved_passengers": [_person(rng) for _ in range(rng.choice([0, 1, 1, 2, 3]))],
            "reservations": [],
        }
        users[uid] = user
        for _ in range(rng.choice([1, 2, 3, 3, 4, 5])):
            rid = "".join(rng.choice(alphabet) for _ in range(6))
            if rid in reservations:
                continue
            res = _reservation(rng, net, user, rid)
            if res is not None:
                reservations[rid] = res
                user["reservations"].append(rid)
    airports = {code: {"iata": code, "city": city} for code, (city, _, _) in AIRPORTS.items()}
    return {"users": users, "flights": flights, "reservations": reservations, "airports": airports}
