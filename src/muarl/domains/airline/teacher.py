"""The airline domain's teacher: the generic teacher's moves with the airline policy's own rules.

It finds the user's profile, looks reservations and fares up, works out fare differences, free bag
allowances and refunds from its own tool results, refuses what the policy forbids (basic economy
changes, cancellations outside the allowed cases, compensation nobody qualifies for), proposes the exact
write and waits for an explicit yes (:class:`~muarl.policies.script.TeacherSession`). With a
``slip_rate`` its profile lookup may first be mistyped, then asked again (``TeacherSession.identify``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from muarl.policies.script import ANYTHING_ELSE, Script, TeacherSession, money
from muarl.types import Intent

CABIN_WORDS = {"basic_economy": "basic economy", "economy": "economy", "business": "business"}
#: free checked bags per passenger, by membership and cabin (the policy's table)
FREE_BAGS = {"regular": {"basic_economy": 0, "economy": 1, "business": 2},
             "silver": {"basic_economy": 1, "economy": 2, "business": 3},
             "gold": {"basic_economy": 2, "economy": 3, "business": 3}}


class AirlineTeacher(TeacherSession):
    """One airline episode of the reference agent."""

    user: Mapping[str, Any]

    def script(self) -> Script:
        uid = self.known.get("user_id", "")
        ok = yield from self.need([uid], "I'd be glad to help. Could you please give me your user id?")
        again = "I could not find a profile with that user id. Could you please give me your user id again?"
        user = (yield from self.identify("get_user_details", {"user_id": uid}, again)) if ok else None
        if user is None:
            yield from self.say("I'm sorry, I could not find your profile, so I can't help with this request.")
            return
        self.user = user
        intents = self.task.scenario.intents
        for intent in intents:
            report = yield from self._intent(intent)
            yield from self.say(f"{report} {ANYTHING_ELSE}".strip())

    def _reservation(self, rid: str) -> Script:
        ok = yield from self.need([rid], "Could you please give me the reservation id?")
        if not ok:
            return None
        return (yield from self.lookup("get_reservation_details", {"reservation_id": rid}))

    def _intent(self, intent: Intent) -> Script:
        if intent.question is not None:
            return (yield from self._info(intent))
        if intent.action == "book_reservation":
            return (yield from self._book(intent))
        if intent.out_of_policy:
            return (yield from self._refuse(intent))
        rid = intent.args.get("reservation_id") or self.known.get("reservation_id", "")
        res = yield from self._reservation(rid)
        if res is None:
            return "I'm sorry, I couldn't find that reservation."
        handlers = {
            "cancel_reservation": self._cancel,
            "update_reservation_flights": self._flights,
            "update_reservation_baggages": self._bags,
            "update_reservation_passengers": self._passengers,
            "send_certificate": self._certificate,
        }
        return (yield from handlers[intent.action or ""](intent, res))

    @staticmethod
    def _net_paid(res: Mapping[str, Any]) -> dict[str, float]:
        net: dict[str, float] = {}
        for e in res["payment_history"]:
            sign = 1 if e["transaction_type"] == "payment" else -1
            net[e["payment_id"]] = round(net.get(e["payment_id"], 0.0) + sign * e["amount"], 2)
        return {k: v for k, v in net.items() if v > 0}

    @staticmethod
    def _trip(res: Mapping[str, Any]) -> str:
        legs = ", ".join(f"{s['flight_number']} {s['origin']}-{s['destination']} on {s['date']}" for s in res["flights"])
        kind = "round trip" if res["flight_type"] == "round_trip" else "one way"
        return f"{res['origin']} to {res['destination']}, {kind}, {CABIN_WORDS[res['cabin']]}: {legs}"

    def _cancel(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        reason = intent.preferences.get("reason", "")
        ok = yield from self.need([reason], "May I ask the reason for the cancellation?")
        if not ok:
            return "I need the reason for the cancellation first."
        net = self._net_paid(res)
        refund = " and ".join(f"{money(v)} to {k}" for k, v in net.items()) or "nothing"

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"Your reservation qualifies for cancellation. I will cancel reservation {args['reservation_id']} "
                    f"({self._trip(res)}). The refund goes to the original payment methods: {refund}.")
            yield

        done = yield from self.settle(intent, "cancel_reservation", propose)
        return f"Reservation {res['reservation_id']} is cancelled; refunds: {refund}." if done else \
            "The reservation was not cancelled."

    def _fares(self, origin: str, destination: str, date: str) -> Script:
        offers = yield from self.lookup("search_direct_flight", {"origin": origin, "destination": destination,
                                                                 "date": date})
        return {o["flight_number"]: o for o in (offers or [])}

    def _flights(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        n = len(res["passengers"])
        if "date" not in intent.preferences:
            return (yield from self._upgrade(intent, res, n))
        old = {(s["flight_number"], s["date"]): s for s in res["flights"]}

        def propose(args: Mapping[str, Any]) -> Script:
            idx = next(i for i, f in enumerate(args["flights"]) if (f["flight_number"], f["date"]) not in old)
            new_ref, seg = args["flights"][idx], res["flights"][idx]
            ok = yield from self.need([new_ref["date"]], "Which date would you like to fly on instead?")
            if not ok:
                return None
            fares = yield from self._fares(seg["origin"], seg["destination"], new_ref["date"])
            offer = fares.get(new_ref["flight_number"])
            if offer is None:
                return None
            price = offer["prices"][args["cabin"]]
            diff = (price - seg["price"]) * n
            way = "charged to" if diff > 0 else "refunded to"
            pay = args["payment_id"]
            difference = (f"The fare difference for {n} passenger(s) is {money(abs(diff))}, {way} {pay}." if diff
                          else f"There is no fare difference ({pay} stays on file).")
            return (f"For reservation {args['reservation_id']}, I will replace flight {seg['flight_number']} on "
                    f"{seg['date']} with the direct flight {new_ref['flight_number']} on {new_ref['date']} (departs "
                    f"{offer['scheduled_departure_time_est']}), {CABIN_WORDS[args['cabin']]} at {money(price)} per "
                    f"passenger. {difference}")

        done = yield from self.settle(intent, "update_reservation_flights", propose)
        return f"Reservation {res['reservation_id']} has been updated with the new flight." if done else \
            "The reservation was not changed."

    def _upgrade(self, intent: Intent, res: Mapping[str, Any], n: int) -> Script:
        cabin = intent.args["cabin"]
        ok = yield from self.need([CABIN_WORDS[cabin]], "Which cabin would you like to move to?")
        if not ok:
            return "I need to know the cabin first."
        new_total = 0.0
        for seg in res["flights"]:
            fares = yield from self._fares(seg["origin"], seg["destination"], seg["date"])
            offer = fares.get(seg["flight_number"])
            new_total += offer["prices"][cabin] if offer else 0.0
        diff = (new_total - sum(s["price"] for s in res["flights"])) * n

        def propose(args: Mapping[str, Any]) -> Script:
            way = "charged to" if diff > 0 else "refunded to"
            return (f"I will change the cabin of reservation {args['reservation_id']} from "
                    f"{CABIN_WORDS[res['cabin']]} to {CABIN_WORDS[args['cabin']]} on the same flights. The fare "
                    f"difference for {n} passenger(s) is {money(abs(diff))}, {way} {args['payment_id']}.")
            yield

        done = yield from self.settle(intent, "update_reservation_flights", propose)
        return f"Reservation {res['reservation_id']} is now in {CABIN_WORDS[cabin]}." if done else \
            "The reservation was not changed."

    def _bags(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        n = len(res["passengers"])
        allowance = FREE_BAGS[self.user["membership"]][res["cabin"]] * n

        def propose(args: Mapping[str, Any]) -> Script:
            add = args["total_baggages"] - res["total_baggages"]
            fee = 50 * (args["nonfree_baggages"] - res["nonfree_baggages"])
            fee_text = f"the fee is {money(fee)}, charged to {args['payment_id']}" if fee else \
                f"there is no fee ({args['payment_id']} is not charged)"
            return (f"I will add {add} checked bag(s) to reservation {args['reservation_id']}, for a total of "
                    f"{args['total_baggages']} checked bag(s). As a {self.user['membership']} member in "
                    f"{CABIN_WORDS[res['cabin']]}, your free allowance is {allowance} bag(s) for {n} passenger(s), so "
                    f"{args['nonfree_baggages']} bag(s) are non-free at $50 each: {fee_text}.")
            yield

        done = yield from self.settle(intent, "update_reservation_baggages", propose)
        return "Your bags have been added to the reservation." if done else "No bags were added."

    def _passengers(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        changed = [p for p in intent.args["passengers"] if p not in res["passengers"]]
        ok = yield from self.need([p["dob"] for p in changed], "What are the correct passenger details?")
        if not ok:
            return "I need the correct passenger details first."

        def propose(args: Mapping[str, Any]) -> Script:
            people = "; ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})" for p in args["passengers"])
            return f"I will update the passengers of reservation {args['reservation_id']} to: {people}."
            yield

        done = yield from self.settle(intent, "update_reservation_passengers", propose)
        return "The passenger details have been updated." if done else "The passengers were not changed."

    def _certificate(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        hit = next((s for s in res["flights"] if s["flight_number"] == self.known.get("flight_number")),
                   res["flights"][0])
        yield from self.call("get_flight_status", {"flight_number": hit["flight_number"], "date": hit["date"]})
        n = len(res["passengers"])

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"I'm sorry that flight {hit['flight_number']} on {hit['date']} was cancelled. Your reservation "
                    f"{res['reservation_id']} qualifies for compensation: I can send you a travel certificate of "
                    f"{money(args['amount'])} ($100 for each of the {n} passenger(s)).")
            yield

        done = yield from self.settle(intent, "send_certificate", propose)
        return "The certificate has been added to your profile." if done else "No certificate was issued."

    def _refuse(self, intent: Intent) -> Script:
        rid = intent.args.get("reservation_id") or self.known.get("reservation_id", "")
        res = yield from self._reservation(rid)
        if res is None:
            return "I'm sorry, I couldn't find that reservation."
        if intent.action == "cancel_reservation":
            rule = ("a reservation can only be cancelled within 24 hours of booking, if the airline cancelled a "
                    "flight, for business class, or with travel insurance for health or weather reasons")
            first = f"I'm sorry, but reservation {rid} cannot be cancelled under our policy: {rule}, and none applies."
        elif intent.action == "update_reservation_flights":
            rule = "the flights of a basic economy reservation cannot be changed"
            first = f"I'm sorry, but I can't change this: {rule}. Reservation {rid} is in basic economy."
        else:
            rule = ("compensation is only possible for silver or gold members, travel insurance on the reservation, "
                    "or business class")
            first = f"I'm sorry about the cancelled flight, but I'm unable to offer compensation: {rule}."
        yield from self.refuse(first, f"I understand your frustration, but I can't make an exception: {rule}.")
        return ""

    def _book(self, intent: Intent) -> Script:
        first = intent.first_args or intent.args
        ok = yield from self.need([first["origin"], first["destination"], first["flights"][0]["date"]],
                                  "Where are you flying from and to, and on which date?")
        if not ok:
            return "I need the trip details to book."
        ref = first["flights"][0]
        fares = yield from self._fares(first["origin"], first["destination"], ref["date"])
        membership = self.user["membership"]

        def propose(args: Mapping[str, Any]) -> Script:
            offer = fares.get(args["flights"][0]["flight_number"])
            if offer is None:
                return None
            n = len(args["passengers"])
            price = offer["prices"][args["cabin"]]
            people = "; ".join(f"{p['first_name']} {p['last_name']} (born {p['dob']})" for p in args["passengers"])
            free = FREE_BAGS[membership][args["cabin"]] * n
            ins = f"travel insurance at $30 per passenger ({money(30 * n)})" if args["insurance"] == "yes" \
                else "no travel insurance"
            total = sum(p["amount"] for p in args["payment_methods"])
            pay = " and ".join(f"{money(p['amount'])} on {p['payment_id']}" for p in args["payment_methods"])
            return (f"I can book the direct flight {offer['flight_number']} from {args['origin']} to "
                    f"{args['destination']} on {offer['date']} (departs {offer['scheduled_departure_time_est']}), one "
                    f"way, in {CABIN_WORDS[args['cabin']]}, for {n} passenger(s): {people}. Fare: {money(price)} per "
                    f"passenger. Checked bags: {args['total_baggages']} in total, {free} free, "
                    f"{args['nonfree_baggages']} at $50 each. With {ins}. Total: {money(total)}, paid with {pay}.")
            yield

        done = yield from self.settle(intent, "book_reservation", propose)
        return "Your reservation is booked." if done else "Nothing was booked."

    def _info(self, intent: Intent) -> Script:
        q = intent.question or ""
        k = self.known
        if "status" in q:
            ok = yield from self.need([k["flight_number"]], "Which flight and date would you like me to check?")
            status = (yield from self.call("get_flight_status", {"flight_number": k["flight_number"],
                                                                "date": k["date"]})) if ok else "unknown"
            return f"Flight {k['flight_number']} on {k['date']} is {status.strip(chr(34))}."
        if "paid" in q:
            res = yield from self._reservation(k["reservation_id"])
            if res is None:
                return "I'm sorry, I couldn't find that reservation."
            total = sum(self._net_paid(res).values())
            return f"You have paid {money(total)} in total for reservation {res['reservation_id']}."
        ok = yield from self.need([k["origin"], k["destination"]], "Which route and date are you interested in?")
        fares = (yield from self._fares(k["origin"], k["destination"], k["date"])) if ok else {}
        cabin = k["cabin"]
        open_ = [o for o in fares.values() if o["available_seats"][cabin] >= 1]
        if not open_:
            return "I'm sorry, there is no direct flight with a free seat in that cabin."
        best = min(open_, key=lambda o: o["prices"][cabin])
        return (f"The cheapest direct {CABIN_WORDS[cabin]} fare from {k['origin']} to {k['destination']} on "
                f"{k['date']} is {money(best['prices'][cabin])} (flight {best['flight_number']}).")
