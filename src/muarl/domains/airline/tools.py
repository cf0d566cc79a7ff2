"""Airline agent tools. Hard rules (existence, status, seats, balances, departed flights) are enforced
here; rules that need judgement (cancellation eligibility, basic-economy changes, compensation,
confirmation, authentication) live in the policy, so an agent that breaks them is caught by the grader
rather than saved by the tool.

Every tool is a pure function of the database and its arguments: new ids are derived from the data, so
replaying a tool log on a fresh copy rebuilds the same state bit for bit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from typing_extensions import TypedDict

from muarl.db import DBView
from muarl.domains.airline.data import (
    BAG_FEE,
    INSURANCE_FEE,
    MAX_PASSENGERS,
    NOW,
)
from muarl.domains.common import COMMON_TOOLS
from muarl.tools import ToolError, tool

Cabin = Literal["basic_economy", "economy", "business"]
_DEPARTED = ("landed", "flying")
_ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"


class FlightRef(TypedDict):
    """One flight of an itinerary: a flight number on a date."""

    flight_number: str
    date: str


class Passenger(TypedDict):
    """A traveller as printed on the ticket."""

    first_name: str
    last_name: str
    dob: str


class PaymentPart(TypedDict):
    """How much of the total one payment method pays."""

    payment_id: str
    amount: float


# -- helpers --------------------------------------------------------------------------------------------
def _user(db: DBView, user_id: str) -> Mapping[str, Any]:
    if user_id not in db.users:
        raise ToolError(f"user {user_id} not found")
    return db.users[user_id]


def _reservation(db: DBView, reservation_id: str) -> Mapping[str, Any]:
    if reservation_id not in db.reservations:
        raise ToolError(f"reservation {reservation_id} not found")
    return db.reservations[reservation_id]


def _active(db: DBView, reservation_id: str) -> Mapping[str, Any]:
    res = _reservation(db, reservation_id)
    if res["status"] != "active":
        raise ToolError(f"reservation {reservation_id} is already {res['status']}")
    return res


def _flight_day(db: DBView, flight_number: str, date: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    if flight_number not in db.flights:
        raise ToolError(f"flight {flight_number} not found")
    flight = db.flights[flight_number]
    if date not in flight["dates"]:
        raise ToolError(f"flight {flight_number} does not operate on {date} (dates must be YYYY-MM-DD)")
    return flight, flight["dates"][date]


def _bookable(db: DBView, ref: Mapping[str, Any], cabin: str, seats: int) -> tuple[Mapping[str, Any], int]:
    """The flight and its current price in ``cabin``; raises unless it is open with ``seats`` free seats."""
    flight, day = _flight_day(db, ref["flight_number"], ref["date"])
    if day["status"] != "available":
        raise ToolError(f"flight {ref['flight_number']} on {ref['date']} is {day['status']} and cannot be booked")
    free = day["available_seats"][cabin]
    if free < seats:
        raise ToolError(
            f"not enough seats: flight {ref['flight_number']} on {ref['date']} has {free} {cabin} seat(s) left, "
            f"{seats} needed"
        )
    return flight, day["prices"][cabin]


def _seats(db: DBView, flight_number: str, date: str, cabin: str, delta: int) -> None:
    """Take (delta < 0) or give back (delta > 0) seats on a flight that is still open for sale."""
    day = db.flights[flight_number]["dates"][date]
    if day["status"] != "available":
        return
    record = db.flights.edit(flight_number)
    counts = record["dates"][date]["available_seats"]
    counts[cabin] += delta


def _departed(db: DBView, segment: Mapping[str, Any]) -> bool:
    return db.flights[segment["flight_number"]]["dates"][segment["date"]]["status"] in _DEPARTED


def _check_route(legs: Sequence[Mapping[str, Any]], origin: str, destination: str, flight_type: str) -> None:
    """The legs must chain origin -> destination (and back for a round trip), each on or after the last."""
    stops = [origin, destination] if flight_type == "one_way" else [origin, destination, origin]
    at, target, last_date = origin, 1, ""
    for leg in legs:
        if leg["origin"] != at:
            raise ToolError(f"flight {leg['flight_number']} leaves from {leg['origin']}, expected a flight from {at}")
        if leg["date"] < last_date:
            raise ToolError(f"flight {leg['flight_number']} on {leg['date']} is before the previous flight")
        at, last_date = leg["destination"], leg["date"]
        if target < len(stops) and at == stops[target]:
            target += 1
    if target != len(stops) or at != stops[-1]:
        kind = "a round trip" if flight_type == "round_trip" else "a one-way trip"
        raise ToolError(f"the flights do not form {kind} from {origin} to {destination}")


def _method(db: DBView, user_id: str, payment_id: str) -> Mapping[str, Any]:
    methods = _user(db, user_id)["payment_methods"]
    if payment_id not in methods:
        raise ToolError(f"payment method {payment_id} not found for user {user_id}")
    return methods[payment_id]


def _settle(db: DBView, reservation_id: str, user_id: str, payment_id: str, amount: float) -> None:
    """Charge (amount > 0) or refund (amount < 0) a payment method and log it on the reservation."""
    amount = round(float(amount), 2)
    if amount == 0:
        return
    method = _method(db, user_id, payment_id)
    field = {"gift_card": "balance", "certificate": "amount"}.get(method["source"])
    if field is not None:
        if amount > method[field] + 1e-9:
            raise ToolError(f"{payment_id} has only {method[field]:.2f} left, {amount:.2f} needed")
        card = db.users.edit(user_id)["payment_methods"][payment_id]
        card[field] = round(card[field] - amount, 2)
    db.reservations.edit(reservation_id)["payment_history"].append({
        "transaction_type": "payment" if amount > 0 else "refund",
        "payment_id": payment_id,
        "amount": abs(amount),
    })


def _no_certificate(method: Mapping[str, Any]) -> None:
    if method["source"] == "certificate":
        raise ToolError("travel certificates can only pay for new bookings; use a credit card or gift card")


def _new_reservation_id(db: DBView, user_id: str) -> str:
    """A fresh 6-character id derived from the data (the user and the size of the table), never random."""
    n = len(db.reservations)
    salt = 0
    while True:
        digest = hashlib.sha256(f"{user_id}:{n}:{salt}".encode()).digest()
        rid = "".join(_ID_ALPHABET[b % len(_ID_ALPHABET)] for b in digest[:6])
        if rid not in db.reservations:
            return rid
        salt += 1


def _check_passengers(passengers: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    out = []
    for p in passengers:
        dob = p["dob"]
        if len(dob) != 10 or dob[4] != "-" or dob[7] != "-" or not (dob[:4] + dob[5:7] + dob[8:]).isdigit():
            raise ToolError(f"date of birth {dob!r} must look like YYYY-MM-DD")
        if not p["first_name"].strip() or not p["last_name"].strip():
            raise ToolError("passenger names must not be empty")
        out.append({"first_name": p["first_name"], "last_name": p["last_name"], "dob": dob})
    return out


def _segment(flight: Mapping[str, Any], date: str, price: float) -> dict[str, Any]:
    return {"flight_number": flight["flight_number"], "date": date, "price": price,
            "origin": flight["origin"], "destination": flight["destination"]}


def _offer(flight: Mapping[str, Any], date: str) -> dict[str, Any]:
    day = flight["dates"][date]
    return {
        "flight_number": flight["flight_number"], "origin": flight["origin"],
        "destination": flight["destination"], "date": date,
        "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
        "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
        "available_seats": day["available_seats"], "prices": day["prices"],
    }


# -- read tools -----------------------------------------------------------------------------------------
@tool(authenticates=True)
def get_user_details(db: DBView, user_id: str) -> Mapping[str, Any]:
    """Get a user's profile (name, membership, payment methods, saved passengers, reservation ids).
    Looking a user up authenticates them for this conversation.

    Args:
        user_id: The user id, such as "olivia_gonzalez_2365".
    """
    user = _user(db, user_id)
    db.authenticate(user_id)
    return user


@tool
def get_reservation_details(db: DBView, reservation_id: str) -> Mapping[str, Any]:
    """Get a reservation: flights, cabin, passengers, baggage, insurance, payments and status.

    Args:
        reservation_id: The 6-character reservation id, such as "ZFA04Y".
    """
    return _reservation(db, reservation_id)


@tool
def list_all_airports(db: DBView) -> dict[str, str]:
    """List every airport the airline serves, as a map from IATA code to city."""
    return {code: a["city"] for code, a in sorted(db.airports.items())}


@tool
def search_direct_flight(db: DBView, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
    """Search direct flights between two airports on a date that are open for booking.

    Args:
        origin: The IATA code of the departure airport, such as "JFK".
        destination: The IATA code of the arrival airport, such as "LAX".
        date: The date of the flight, as YYYY-MM-DD, such as "2024-05-20".
    """
    for code in (origin, destination):
        if code not in db.airports:
            raise ToolError(f"unknown airport {code!r}; use list_all_airports for the IATA codes")
    out = []
    for flight in db.flights.values():
        if flight["origin"] == origin and flight["destination"] == destination:
            day = flight["dates"].get(date)
            if day is not None and day["status"] == "available":
                out.append(_offer(flight, date))
    return sorted(out, key=lambda f: f["scheduled_departure_time_est"])


@tool
def search_onestop_flight(db: DBView, origin: str, destination: str, date: str) -> list[list[dict[str, Any]]]:
    """Search one-stop itineraries between two airports on a date: pairs of flights open for booking,
    both on that date, with at least one hour between the first arrival and the second departure.

    Args:
        origin: The IATA code of the departure airport, such as "JFK".
        destination: The IATA code of the arrival airport, such as "LAX".
        date: The date of the first flight, as YYYY-MM-DD, such as "2024-05-20".
    """
    for code in (origin, destination):
        if code not in db.airports:
            raise ToolError(f"unknown airport {code!r}; use list_all_airports for the IATA codes")
    first_legs, second_legs = [], []
    for flight in db.flights.values():
        day = flight["dates"].get(date)
        if day is None or day["status"] != "available":
            continue
        if flight["origin"] == origin and flight["destination"] != destination:
            first_legs.append(flight)
        elif flight["destination"] == destination and flight["origin"] != origin:
            second_legs.append(flight)
    out = []
    for a in first_legs:
        arrive = int(a["scheduled_arrival_time_est"][:2]) * 60 + int(a["scheduled_arrival_time_est"][3:5])
        for b in second_legs:
            depart = int(b["scheduled_departure_time_est"][:2]) * 60 + int(b["scheduled_departure_time_est"][3:5])
            if b["origin"] == a["destination"] and depart >= arrive + 60:
                out.append([_offer(a, date), _offer(b, date)])
    return sorted(out, key=lambda p: (p[0]["scheduled_departure_time_est"], p[1]["scheduled_departure_time_est"]))


@tool
def get_flight_status(db: DBView, flight_number: str, date: str) -> str:
    """Get the status of a flight on a date: available, on time, delayed, flying, landed or cancelled.

    Args:
        flight_number: The flight number, such as "HAT123".
        date: The date of the flight, as YYYY-MM-DD, such as "2024-05-15".
    """
    return _flight_day(db, flight_number, date)[1]["status"]


# -- write tools ----------------------------------------------------------------------------------------
@tool(write=True)
def book_reservation(
    db: DBView,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: Literal["one_way", "round_trip"],
    cabin: Cabin,
    flights: list[FlightRef],
    passengers: list[Passenger],
    payment_methods: list[PaymentPart],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: Literal["yes", "no"],
) -> Mapping[str, Any]:
    """Book a new reservation. The payments must add up exactly to the total price: the sum of the flight
    prices times the number of passengers, plus travel insurance per passenger if taken, plus the fee of
    each non-free checked bag. Only after the user explicitly confirms.

    Args:
        user_id: The id of the user who books, such as "olivia_gonzalez_2365".
        origin: The IATA code of the trip's origin, such as "JFK".
        destination: The IATA code of the trip's destination, such as "LAX".
        flight_type: "one_way" or "round_trip".
        cabin: "basic_economy", "economy" or "business"; one cabin for every flight.
        flights: Every flight of the trip in order (outbound, then return for a round trip), such as
            [{"flight_number": "HAT123", "date": "2024-05-20"}].
        passengers: Every traveller, such as [{"first_name": "Olivia", "last_name": "Gonzalez",
            "dob": "1988-04-12"}]; at most 5.
        payment_methods: The payment methods and the amount each pays, such as
            [{"payment_id": "credit_card_1234567", "amount": 512.0}].
        total_baggages: The number of checked bags for the whole reservation.
        nonfree_baggages: How many of those bags are beyond the free allowance and cost a fee.
        insurance: Whether the user buys travel insurance, "yes" or "no".
    """
    _user(db, user_id)
    for code in (origin, destination):
        if code not in db.airports:
            raise ToolError(f"unknown airport {code!r}")
    if not flights:
        raise ToolError("flights must not be empty")
    if not 1 <= len(passengers) <= MAX_PASSENGERS:
        raise ToolError(f"a reservation has 1 to {MAX_PASSENGERS} passengers")
    people = _check_passengers(passengers)
    if not 0 <= nonfree_baggages <= total_baggages:
        raise ToolError("baggage counts must satisfy 0 <= nonfree_baggages <= total_baggages")
    if len({(f["flight_number"], f["date"]) for f in flights}) != len(flights):
        raise ToolError("the same flight is listed twice")
    n = len(people)
    segments = []
    for ref in flights:
        flight, price = _bookable(db, ref, cabin, n)
        segments.append(_segment(flight, ref["date"], price))
    _check_route(segments, origin, destination, flight_type)
    total = sum(s["price"] for s in segments) * n + BAG_FEE * nonfree_baggages
    total = round(total + (INSURANCE_FEE * n if insurance == "yes" else 0), 2)
    paid = round(sum(p["amount"] for p in payment_methods), 2)
    if paid != total:
        raise ToolError(f"the payments add up to {paid:.2f} but the total price is {total:.2f}")
    sources = [_method(db, user_id, p["payment_id"])["source"] for p in payment_methods]
    if len({p["payment_id"] for p in payment_methods}) != len(payment_methods):
        raise ToolError("each payment method may appear only once")
    if sources.count("credit_card") > 1 or sources.count("certificate") > 1 or sources.count("gift_card") > 3:
        raise ToolError("use at most one credit card, one travel certificate and three gift cards")
    if any(p["amount"] <= 0 for p in payment_methods):
        raise ToolError("every payment amount must be positive")
    rid = _new_reservation_id(db, user_id)
    db.reservations.insert(rid, {
        "reservation_id": rid, "user_id": user_id, "origin": origin, "destination": destination,
        "flight_type": flight_type, "cabin": cabin, "flights": segments, "passengers": people,
        "payment_history": [], "created_at": NOW, "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages, "insurance": insurance, "status": "active",
    })
    for p in sorted(payment_methods, key=lambda p: p["payment_id"]):  # listing order must not matter
        _settle(db, rid, user_id, p["payment_id"], p["amount"])
    for s in segments:
        _seats(db, s["flight_number"], s["date"], cabin, -n)
    db.users.edit(user_id)["reservations"].append(rid)
    return db.reservations[rid]


@tool(write=True)
def cancel_reservation(db: DBView, reservation_id: str) -> Mapping[str, Any]:
    """Cancel a whole reservation and refund every payment to the method it came from. Check the policy's
    cancellation rules first. Only after the user explicitly confirms.

    Args:
        reservation_id: The 6-character reservation id, such as "ZFA04Y".
    """
    res = _active(db, reservation_id)
    for seg in res["flights"]:
        if _departed(db, seg):
            raise ToolError(
                f"flight {seg['flight_number']} on {seg['date']} has already departed; the reservation cannot "
                "be cancelled"
            )
    net: dict[str, float] = {}
    for entry in res["payment_history"]:
        sign = 1 if entry["transaction_type"] == "payment" else -1
        net[entry["payment_id"]] = net.get(entry["payment_id"], 0.0) + sign * entry["amount"]
    for payment_id, amount in net.items():
        if round(amount, 2) > 0:
            _settle(db, reservation_id, res["user_id"], payment_id, -amount)
    n = len(res["passengers"])
    for seg in res["flights"]:
        _seats(db, seg["flight_number"], seg["date"], res["cabin"], n)
    db.reservations.edit(reservation_id)["status"] = "cancelled"
    return db.reservations[reservation_id]


@tool(write=True)
def update_reservation_flights(
    db: DBView, reservation_id: str, cabin: Cabin, flights: list[FlightRef], payment_id: str
) -> Mapping[str, Any]:
    """Change the flights and/or the cabin of a reservation; the origin, destination and trip type stay.
    Give every flight of the new itinerary, changed or not. Flights kept in the same cabin keep their price;
    the rest are charged at today's price. The difference for all passengers is charged to, or refunded
    to, payment_id. Check the policy first. Only after the user explicitly confirms.

    Args:
        reservation_id: The 6-character reservation id, such as "ZFA04Y".
        cabin: The cabin for the whole reservation: "basic_economy", "economy" or "business".
        flights: Every flight of the new itinerary in order, such as
            [{"flight_number": "HAT123", "date": "2024-05-20"}].
        payment_id: The user's credit card or gift card that pays or receives the difference.
    """
    res = _active(db, reservation_id)
    if not flights:
        raise ToolError("flights must not be empty")
    if len({(f["flight_number"], f["date"]) for f in flights}) != len(flights):
        raise ToolError("the same flight is listed twice")
    method = _method(db, res["user_id"], payment_id)
    _no_certificate(method)
    n = len(res["passengers"])
    old = {(s["flight_number"], s["date"]): s for s in res["flights"]}
    wanted = {(f["flight_number"], f["date"]) for f in flights}
    for key, seg in old.items():
        if _departed(db, seg) and (key not in wanted or cabin != res["cabin"]):
            raise ToolError(f"flight {key[0]} on {key[1]} has already departed and cannot be changed")
    segments = []
    for ref in flights:
        key = (ref["flight_number"], ref["date"])
        if key in old and cabin == res["cabin"]:
            segments.append(dict(old[key]))
        else:
            flight, price = _bookable(db, ref, cabin, n)
            segments.append(_segment(flight, ref["date"], price))
    _check_route(segments, res["origin"], res["destination"], res["flight_type"])
    if [(s["flight_number"], s["date"]) for s in segments] == list(old) and cabin == res["cabin"]:
        raise ToolError("nothing to change: the flights and cabin are the same as now")
    diff = (sum(s["price"] for s in segments) - sum(s["price"] for s in res["flights"])) * n
    _settle(db, reservation_id, res["user_id"], payment_id, diff)
    for key in old:
        if key not in wanted or cabin != res["cabin"]:
            _seats(db, key[0], key[1], res["cabin"], n)
    for seg in segments:
        if (seg["flight_number"], seg["date"]) not in old or cabin != res["cabin"]:
            _seats(db, seg["flight_number"], seg["date"], cabin, -n)
    record = db.reservations.edit(reservation_id)
    record["flights"], record["cabin"] = segments, cabin
    return record


@tool(write=True)
def update_reservation_baggages(
    db: DBView, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> Mapping[str, Any]:
    """Set the checked bags of a reservation. Bags can be added, never removed. Each added non-free bag is
    charged to payment_id. Only after the user explicitly confirms.

    Args:
        reservation_id: The 6-character reservation id, such as "ZFA04Y".
        total_baggages: The new total number of checked bags on the reservation.
        nonfree_baggages: The new number of those bags that are beyond the free allowance.
        payment_id: The user's credit card or gift card that pays for the added non-free bags.
    """
    res = _active(db, reservation_id)
    if total_baggages < res["total_baggages"] or nonfree_baggages < res["nonfree_baggages"]:
        raise ToolError(
            f"bags can only be added: the reservation has {res['total_baggages']} bag(s), "
            f"{res['nonfree_baggages']} non-free"
        )
    if nonfree_baggages > total_baggages:
        raise ToolError("nonfree_baggages cannot exceed total_baggages")
    if (total_baggages, nonfree_baggages) == (res["total_baggages"], res["nonfree_baggages"]):
        raise ToolError("nothing to change: the baggage counts are the same as now")
    _no_certificate(_method(db, res["user_id"], payment_id))
    _settle(db, reservation_id, res["user_id"], payment_id, BAG_FEE * (nonfree_baggages - res["nonfree_baggages"]))
    record = db.reservations.edit(reservation_id)
    record["total_baggages"], record["nonfree_baggages"] = total_baggages, nonfree_baggages
    return record


@tool(write=True)
def update_reservation_passengers(
    db: DBView, reservation_id: str, passengers: list[Passenger]
) -> Mapping[str, Any]:
    """Replace the passenger details of a reservation. The number of passengers cannot change. Only after
    the user explicitly confirms.

    Args:
        reservation_id: The 6-character reservation id, such as "ZFA04Y".
        passengers: Every passenger in the same order as now, corrected where needed, such as
            [{"first_name": "Olivia", "last_name": "Gonzalez", "dob": "1988-04-12"}].
    """
    res = _active(db, reservation_id)
    if len(passengers) != len(res["passengers"]):
        raise ToolError(
            f"the reservation has {len(res['passengers'])} passenger(s); the number of passengers cannot change"
        )
    people = _check_passengers(passengers)
    if people == [dict(p) for p in res["passengers"]]:
        raise ToolError("nothing to change: the passengers are the same as now")
    db.reservations.edit(reservation_id)["passengers"] = people
    return db.reservations[reservation_id]


@tool(write=True)
def send_certificate(db: DBView, user_id: str, amount: float) -> str:
    """Give a user a travel certificate as compensation. Only when the policy allows it, and only after the
    user explicitly confirms.

    Args:
        user_id: The user id, such as "olivia_gonzalez_2365".
        amount: The certificate value in dollars.
    """
    _user(db, user_id)
    if not 0 < amount <= 1000:
        raise ToolError("the amount must be more than 0 and at most 1000")
    user = db.users.edit(user_id)
    n = sum(1 for m in user["payment_methods"].values() if m["source"] == "certificate")
    digest = hashlib.sha256(f"{user_id}:certificate:{n}:{len(user['payment_methods'])}".encode()).hexdigest()
    pid = f"certificate_{int(digest[:12], 16) % 10**7:07d}"
    while pid in user["payment_methods"]:
        pid = f"certificate_{(int(pid[-7:]) + 1) % 10**7:07d}"
    user["payment_methods"][pid] = {"source": "certificate", "id": pid, "amount": round(float(amount), 2)}
    return f"Certificate {pid} worth {amount:.2f} added to user {user_id}"


TOOLS = [
    get_user_details,
    get_reservation_details,
    list_all_airports,
    search_direct_flight,
    search_onestop_flight,
    get_flight_status,
    book_reservation,
    cancel_reservation,
    update_reservation_flights,
    update_reservation_baggages,
    update_reservation_passengers,
    send_certificate,
    *COMMON_TOOLS,
]
