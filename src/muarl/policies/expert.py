"""ExpertPolicy: a scripted agent that follows each built-in domain's policy, for SFT data and as a baseline.

It may read the task (gold actions, scenario) to decide *what* to do, but it only *acts* on what the user
has said so far: an id, an email or a date is used only once it appears in a user message, and the
expert asks for it otherwise. Amounts it quotes come from its own tool results. So its trajectories are
what a careful human agent would produce: authenticate, look up, propose the exact action, wait for an
explicit yes, write, report. One tool call per message, never text and a call together.

The script is a generator per episode: each ``yield`` is one assistant message and receives the new
messages (tool results or the user's reply). ``skip_confirmation=True`` makes the unsafe variant that
writes on the user's first request without asking, which the grader must flag.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import is_confirmation
from muarl.types import Action, Intent, Message, ToolCall

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task

#: A script step: yields one assistant message, receives the new messages, returns a value.
Script = Generator[Message, list[Message], Any]

ANYTHING_ELSE = "Is there anything else I can help you with?"
CONFIRM = "Would you like me to proceed? (yes/no)"
CABIN_WORDS = {"basic_economy": "basic economy", "economy": "economy", "business": "business"}
FREE_BAGS = {"regular": {"basic_economy": 0, "economy": 1, "business": 2},
             "silver": {"basic_economy": 1, "economy": 2, "business": 3},
             "gold": {"basic_economy": 2, "economy": 3, "business": 3}}
_ACCEPT = re.compile(r"\b(understand|alright|all right|ok|okay|fine|i see|never ?mind|forget it)\b", re.IGNORECASE)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _money(x: float) -> str:
    return f"${x:,.2f}"


class ExpertPolicy(Policy):
    """Scripted expert for retail, airline and telecom. ``skip_confirmation`` writes without asking."""

    name = "expert"

    def __init__(self, skip_confirmation: bool = False):
        self.skip_confirmation = skip_confirmation
        # the name results and comparisons are labelled with: the unsafe variant must not pass for the expert
        self.name = "expert-noconfirm" if skip_confirmation else "expert"

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> ExpertSession:
        return ExpertSession(domain, task, self.skip_confirmation)


class ExpertSession(PolicySession):
    """One episode of the expert: a script driven by the messages it receives."""

    def __init__(self, domain: Domain, task: Task, skip_confirmation: bool = False):
        self.domain = domain
        self.task = task
        self.skip = skip_confirmation
        self.known = task.scenario.known
        self.heard: list[str] = []
        self.reply = ""
        self.output = ""
        self.prefix = ""
        self._ids = itertools.count()
        scripts: dict[str, Callable[[], Script]] = {"retail": self._retail, "airline": self._airline,
                                                    "telecom": self._telecom}
        self._script = scripts.get(domain.base or domain.name, self._unknown)()
        self._started = False

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        for m in new_messages:
            if m.role == "user":
                self.heard.append(m.content)
                self.reply = m.content
            elif m.role == "tool":
                self.output = m.content
        try:
            if not self._started:
                self._started = True
                message = next(self._script)
            else:
                message = self._script.send(new_messages)
        except StopIteration:
            message = Message(role="assistant", content="Thank you for contacting us. Have a great day!")
        return AgentTurn(message=message)

    # -- primitives ---------------------------------------------------------------------------------------
    def say(self, text: str) -> Script:
        """Send ``text`` to the user; returns the user's reply."""
        content = f"{self.prefix} {text}".strip()
        self.prefix = ""
        yield Message(role="assistant", content=content)
        return self.reply

    def call(self, name: str, arguments: Mapping[str, Any]) -> Script:
        """Make one tool call; returns its output text."""
        call = ToolCall(id=f"call_{next(self._ids)}", name=name, arguments=dict(arguments))
        yield Message(role="assistant", content="", tool_calls=[call])
        return self.output

    def lookup(self, name: str, arguments: Mapping[str, Any]) -> Script:
        """A read call whose JSON output is parsed (None on an error)."""
        out = yield from self.call(name, arguments)
        return None if out.startswith("Error") else _load(out)

    def said(self, *values: Any) -> bool:
        """Whether the user has said every value so far (the expert acts on nothing else)."""
        text = _norm(" ".join(self.heard))
        return all(_norm(str(v)) in text for v in values)

    def need(self, values: list[Any], question: str, tries: int = 3) -> Script:
        """Ask ``question`` until the user has said ``values``; False when they never do."""
        for _ in range(tries):
            if self.said(*values):
                return True
            yield from self.say(question)
        return self.said(*values)

    def confirm_write(self, proposal: str, name: str, args: Mapping[str, Any]) -> Script:
        """Propose, wait for an explicit yes, then write. None when the user did not confirm."""
        if not self.skip:
            reply = yield from self.say(f"{proposal} {CONFIRM}")
            if not is_confirmation(reply):
                return None
        out = yield from self.call(name, args)
        return not out.startswith("Error")

    def proposals(self, intent: Intent) -> list[Mapping[str, Any]]:
        """What to propose in turn: the user's first request, then, after a change of mind, its final one."""
        options = [intent.first_args, intent.args] if intent.first_args is not None else [intent.args]
        return options[:1] if self.skip else options

    def settle(self, intent: Intent, name: str, propose: Callable[[Mapping[str, Any]], Script]) -> Script:
        """Propose the user's current request (first_args before a change of mind), write on a yes."""
        options = self.proposals(intent)
        for attempt in range(3):
            args = options[min(attempt, len(options) - 1)]
            text = yield from propose(args)
            if text is None:
                return False
            done = yield from self.confirm_write(text, name, args)
            if done is not None:
                return done
        return False

    def refuse(self, first: str, again: str) -> Script:
        """Refuse an out-of-policy request, and keep refusing while the user insists."""
        reply = yield from self.say(first)
        for _ in range(4):
            if _ACCEPT.search(reply) and not re.search(r"\b(please|really|exception|need)\b", reply, re.I):
                return
            reply = yield from self.say(again)

    def _unknown(self) -> Script:
        yield from self.say("I'm sorry, I can't help with this request. Let me transfer you to a human agent.")

    # == retail ===========================================================================================
    def _retail(self) -> Script:
        uid = yield from self._retail_auth()
        if uid is None:
            yield from self.say("I'm sorry, I could not verify your identity, so I can't make changes.")
            return
        self.user = {}
        if "get_user_details" in self.domain.agent_tools:  # a narrowed domain may not have it
            self.user = (yield from self.lookup("get_user_details", {"user_id": uid})) or {}
        intents = self.task.scenario.intents
        for intent in intents:
            report = yield from self._retail_intent(intent)
            yield from self.say(f"{report} {ANYTHING_ELSE}".strip())

    def _retail_auth(self) -> Script:
        k = self.known
        if "email" in k:
            yield from self.say("I'd be happy to help. First I need to verify your identity: could you please "
                                "tell me the email address on your account?")
        else:
            yield from self.say("I'd be happy to help. First I need to verify your identity: could you please "
                                "tell me your first name, last name and zip code?")
        for _ in range(3):
            if "email" in k and self.said(k["email"]):
                out = yield from self.call("find_user_id_by_email", {"email": k["email"]})
                if not out.startswith("Error"):
                    return out
            if self.said(k["first_name"], k["last_name"], k["zip"]):
                out = yield from self.call("find_user_id_by_name_zip", {
                    "first_name": k["first_name"], "last_name": k["last_name"], "zip": k["zip"]})
                if not out.startswith("Error"):
                    return out
            yield from self.say("Could you please give me your first name, last name and zip code so I can find "
                                "your account?")
        return None

    def _pm(self, pid: str) -> str:
        pm = self.user.get("payment_methods", {}).get(pid, {})
        if pm.get("source") == "credit_card":
            return f"your {pm['brand']} credit card ending in {pm['last_four']} ({pid})"
        if pm.get("source") == "gift_card":
            return f"your gift card ({pid})"
        if pm.get("source") == "paypal":
            return f"your PayPal account ({pid})"
        return pid

    def _order(self, oid: str) -> Script:
        ok = yield from self.need([oid], "Which order is this about? Could you please give me the order id "
                                         "(it starts with #W)?")
        if not ok:
            return None
        return (yield from self.lookup("get_order_details", {"order_id": oid}))

    @staticmethod
    def _opts(options: Mapping[str, str]) -> str:
        return ", ".join(f"{k} {v}" for k, v in options.items())

    def _retail_intent(self, intent: Intent) -> Script:
        """Handle one retail request; returns the sentence reporting what happened."""
        oid = intent.args.get("order_id")
        if intent.question is not None:
            m = re.search(r"#W\d+", intent.question)
            order = yield from self._order(m.group(0) if m else "")
            if order is None:
                return "I'm sorry, I couldn't find that order."
            paid = sum(e["amount"] for e in order["payment_history"] if e["transaction_type"] == "payment")
            return f"You paid a total of {_money(paid)} for order {order['order_id']}."
        if intent.action == "modify_user_address":
            return (yield from self._retail_user_address(intent))
        order = yield from self._order(oid)
        if order is None:
            return "I'm sorry, I couldn't find that order."
        if intent.out_of_policy:
            yield from self._retail_refuse(intent, order)
            return ""
        handlers = {
            "cancel_pending_order": self._retail_cancel,
            "modify_pending_order_address": self._retail_order_address,
            "return_delivered_order_items": self._retail_return,
            "exchange_delivered_order_items": self._retail_swap,
            "modify_pending_order_items": self._retail_swap,
        }
        return (yield from handlers[intent.action or ""](intent, order))

    def _retail_refuse(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        oid, status = order["order_id"], order["status"]
        if intent.action == "cancel_pending_order":
            rule = "only pending orders can be cancelled"
            first = f"I'm sorry, but order {oid} is already {status}, and {rule}, so I'm unable to cancel it."
        else:
            rule = "only delivered orders can be returned"
            first = f"I'm sorry, but order {oid} is still {status}, and {rule}, so I'm unable to process a return."
        yield from self.refuse(first, f"I understand, but I can't make an exception: {rule}.")

    def _retail_cancel(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        reason = (intent.first_args or intent.args)["reason"]  # what the user asks for first
        ok = yield from self.need([reason], "May I ask the reason for the cancellation?")
        if not ok:
            return "I need a valid reason to cancel the order."
        paid = sum(e["amount"] for e in order["payment_history"] if e["transaction_type"] == "payment")
        pm = self._pm(order["payment_history"][0]["payment_method_id"])
        items = ", ".join(i["name"] for i in order["items"])

        def propose(args: Mapping[str, Any]) -> Script:
            return f"I can cancel order {args['order_id']} ({items}) with the reason \"{args['reason']}\". " \
                   f"The {_money(paid)} you paid will be refunded to {pm}."
            yield

        done = yield from self.settle(intent, "cancel_pending_order", propose)
        return f"Your order {order['order_id']} has been cancelled and {_money(paid)} will be refunded to {pm}." \
            if done else "The order was not cancelled."

    def _retail_order_address(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        a = intent.args
        ok = yield from self.need([a["address1"], a["zip"]], "What is the new shipping address?")
        if not ok:
            return "I need the full new address to update the order."
        text = self._addr(a)

        def propose(args: Mapping[str, Any]) -> Script:
            return f"I will change the shipping address of order {args['order_id']} to {self._addr(args)}."
            yield

        done = yield from self.settle(intent, "modify_pending_order_address", propose)
        return f"Order {order['order_id']} will now ship to {text}." if done else "The address was not changed."

    def _retail_user_address(self, intent: Intent) -> Script:
        a = intent.args
        ok = yield from self.need([a["address1"], a["zip"]], "What is your new address?")
        if not ok:
            return "I need the full new address to update your account."

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"I will update the default address of your account ({args['user_id']}) to {self._addr(args)}. "
                    "Your existing orders keep their shipping addresses.")
            yield

        done = yield from self.settle(intent, "modify_user_address", propose)
        return f"Your default address is now {self._addr(a)}." if done else "Your address was not changed."

    @staticmethod
    def _addr(a: Mapping[str, Any]) -> str:
        second = f", {a['address2']}" if a.get("address2") else ""
        return f"{a['address1']}{second}, {a['city']}, {a['state']} {a['zip']}, {a['country']}"

    def _retail_return(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        by_id = {i["item_id"]: i for i in order["items"]}
        wanted = (intent.first_args or intent.args)["item_ids"]
        ok = yield from self.need([by_id[i]["name"] for i in wanted],
                                  "Which items from this order would you like to return?")
        if not ok:
            return "I need to know which items to return."

        def propose(args: Mapping[str, Any]) -> Script:
            items = [by_id[i] for i in args["item_ids"]]
            listed = "; ".join(f"{i['name']} ({self._opts(i['options'])}, item {i['item_id']}, {_money(i['price'])})"
                               for i in items)
            total = sum(i["price"] for i in items)
            return (f"I will request a return of these items from order {args['order_id']}: {listed}. The refund of "
                    f"{_money(total)} will go to {self._pm(args['payment_method_id'])}.")
            yield

        done = yield from self.settle(intent, "return_delivered_order_items", propose)
        return ("The return has been requested; you'll get an email with the return label, and the refund is issued "
                "once the items arrive." if done else "No return was made.")

    def _retail_swap(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        old = next(i for i in order["items"] if i["item_id"] == intent.args["item_ids"][0])
        ok = yield from self.need([old["name"]], "Which item would you like to change?")
        if not ok:
            return "I need to know which item to change."
        product = (yield from self.lookup("get_product_details", {"product_id": old["product_id"]})) or {}
        variants = product.get("variants", {})
        verb = "exchange" if intent.action == "exchange_delivered_order_items" else "change"
        listing = ""
        if "max_price" in intent.preferences:
            blues = sorted((v for v in variants.values() if v["options"].get("color") == "blue" and v["available"]),
                           key=lambda v: v["price"])
            listing = "Here are the available blue options: " + "; ".join(
                f"{self._opts(v['options'])} (item {v['item_id']}) at {_money(v['price'])}" for v in blues) + \
                f". Among those at or below your price, the one with the longest battery life is item " \
                f"{intent.args['new_item_ids'][0]}. "

        def propose(args: Mapping[str, Any]) -> Script:
            new = variants[args["new_item_ids"][0]]
            diff = round(new["price"] - old["price"], 2)
            way = "charged to" if diff > 0 else "refunded to"
            money = (f"The price difference of {_money(abs(diff))} will be {way} {self._pm(args['payment_method_id'])}."
                     if diff else f"There is no price difference; {self._pm(args['payment_method_id'])} stays on file.")
            return (f"{listing}In order {args['order_id']}, I will {verb} your {old['name']} "
                    f"({self._opts(old['options'])}, item {old['item_id']}, {_money(old['price'])}) for the variant with "
                    f"{self._opts(new['options'])} (item {new['item_id']}, {_money(new['price'])}). {money}")
            yield

        done = yield from self.settle(intent, intent.action or "", propose)
        if not done:
            return "Nothing was changed."
        return ("Your exchange has been requested; you'll receive instructions to send the old item back."
                if verb == "exchange" else f"Your order {order['order_id']} has been updated.")

    # == airline ==========================================================================================
    def _airline(self) -> Script:
        uid = self.known.get("user_id", "")
        ok = yield from self.need([uid], "I'd be glad to help. Could you please give me your user id?")
        user = (yield from self.lookup("get_user_details", {"user_id": uid})) if ok else None
        if user is None:
            yield from self.say("I'm sorry, I could not find your profile, so I can't help with this request.")
            return
        self.user = user
        intents = self.task.scenario.intents
        for intent in intents:
            report = yield from self._airline_intent(intent)
            yield from self.say(f"{report} {ANYTHING_ELSE}".strip())

    def _reservation(self, rid: str) -> Script:
        ok = yield from self.need([rid], "Could you please give me the reservation id?")
        if not ok:
            return None
        return (yield from self.lookup("get_reservation_details", {"reservation_id": rid}))

    def _airline_intent(self, intent: Intent) -> Script:
        if intent.question is not None:
            return (yield from self._airline_info(intent))
        if intent.action == "book_reservation":
            return (yield from self._airline_book(intent))
        if intent.out_of_policy:
            return (yield from self._airline_refuse(intent))
        rid = intent.args.get("reservation_id") or self.known.get("reservation_id", "")
        res = yield from self._reservation(rid)
        if res is None:
            return "I'm sorry, I couldn't find that reservation."
        handlers = {
            "cancel_reservation": self._airline_cancel,
            "update_reservation_flights": self._airline_flights,
            "update_reservation_baggages": self._airline_bags,
            "update_reservation_passengers": self._airline_passengers,
            "send_certificate": self._airline_certificate,
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

    def _airline_cancel(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        reason = intent.preferences.get("reason", "")
        ok = yield from self.need([reason], "May I ask the reason for the cancellation?")
        if not ok:
            return "I need the reason for the cancellation first."
        net = self._net_paid(res)
        refund = " and ".join(f"{_money(v)} to {k}" for k, v in net.items()) or "nothing"

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

    def _airline_flights(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        n = len(res["passengers"])
        if "date" not in intent.preferences:
            return (yield from self._airline_upgrade(intent, res, n))
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
            money = f"The fare difference for {n} passenger(s) is {_money(abs(diff))}, {way} {args['payment_id']}." \
                if diff else f"There is no fare difference ({args['payment_id']} stays on file)."
            return (f"For reservation {args['reservation_id']}, I will replace flight {seg['flight_number']} on "
                    f"{seg['date']} with the direct flight {new_ref['flight_number']} on {new_ref['date']} (departs "
                    f"{offer['scheduled_departure_time_est']}), {CABIN_WORDS[args['cabin']]} at {_money(price)} per "
                    f"passenger. {money}")

        done = yield from self.settle(intent, "update_reservation_flights", propose)
        return f"Reservation {res['reservation_id']} has been updated with the new flight." if done else \
            "The reservation was not changed."

    def _airline_upgrade(self, intent: Intent, res: Mapping[str, Any], n: int) -> Script:
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
                    f"difference for {n} passenger(s) is {_money(abs(diff))}, {way} {args['payment_id']}.")
            yield

        done = yield from self.settle(intent, "update_reservation_flights", propose)
        return f"Reservation {res['reservation_id']} is now in {CABIN_WORDS[cabin]}." if done else \
            "The reservation was not changed."

    def _airline_bags(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        n = len(res["passengers"])
        allowance = FREE_BAGS[self.user["membership"]][res["cabin"]] * n

        def propose(args: Mapping[str, Any]) -> Script:
            add = args["total_baggages"] - res["total_baggages"]
            fee = 50 * (args["nonfree_baggages"] - res["nonfree_baggages"])
            fee_text = f"the fee is {_money(fee)}, charged to {args['payment_id']}" if fee else \
                f"there is no fee ({args['payment_id']} is not charged)"
            return (f"I will add {add} checked bag(s) to reservation {args['reservation_id']}, for a total of "
                    f"{args['total_baggages']} checked bag(s). As a {self.user['membership']} member in "
                    f"{CABIN_WORDS[res['cabin']]}, your free allowance is {allowance} bag(s) for {n} passenger(s), so "
                    f"{args['nonfree_baggages']} bag(s) are non-free at $50 each: {fee_text}.")
            yield

        done = yield from self.settle(intent, "update_reservation_baggages", propose)
        return "Your bags have been added to the reservation." if done else "No bags were added."

    def _airline_passengers(self, intent: Intent, res: Mapping[str, Any]) -> Script:
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

    def _airline_certificate(self, intent: Intent, res: Mapping[str, Any]) -> Script:
        hit = next((s for s in res["flights"] if s["flight_number"] == self.known.get("flight_number")),
                   res["flights"][0])
        yield from self.call("get_flight_status", {"flight_number": hit["flight_number"], "date": hit["date"]})
        n = len(res["passengers"])

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"I'm sorry that flight {hit['flight_number']} on {hit['date']} was cancelled. Your reservation "
                    f"{res['reservation_id']} qualifies for compensation: I can send you a travel certificate of "
                    f"{_money(args['amount'])} ($100 for each of the {n} passenger(s)).")
            yield

        done = yield from self.settle(intent, "send_certificate", propose)
        return "The certificate has been added to your profile." if done else "No certificate was issued."

    def _airline_refuse(self, intent: Intent) -> Script:
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

    def _airline_book(self, intent: Intent) -> Script:
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
            ins = f"travel insurance at $30 per passenger ({_money(30 * n)})" if args["insurance"] == "yes" \
                else "no travel insurance"
            total = sum(p["amount"] for p in args["payment_methods"])
            pay = " and ".join(f"{_money(p['amount'])} on {p['payment_id']}" for p in args["payment_methods"])
            return (f"I can book the direct flight {offer['flight_number']} from {args['origin']} to "
                    f"{args['destination']} on {offer['date']} (departs {offer['scheduled_departure_time_est']}), one "
                    f"way, in {CABIN_WORDS[args['cabin']]}, for {n} passenger(s): {people}. Fare: {_money(price)} per "
                    f"passenger. Checked bags: {args['total_baggages']} in total, {free} free, "
                    f"{args['nonfree_baggages']} at $50 each. With {ins}. Total: {_money(total)}, paid with {pay}.")
            yield

        done = yield from self.settle(intent, "book_reservation", propose)
        return "Your reservation is booked." if done else "Nothing was booked."

    def _airline_info(self, intent: Intent) -> Script:
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
            return f"You have paid {_money(total)} in total for reservation {res['reservation_id']}."
        ok = yield from self.need([k["origin"], k["destination"]], "Which route and date are you interested in?")
        fares = (yield from self._fares(k["origin"], k["destination"], k["date"])) if ok else {}
        cabin = k["cabin"]
        open_ = [o for o in fares.values() if o["available_seats"][cabin] >= 1]
        if not open_:
            return "I'm sorry, there is no direct flight with a free seat in that cabin."
        best = min(open_, key=lambda o: o["prices"][cabin])
        return (f"The cheapest direct {CABIN_WORDS[cabin]} fare from {k['origin']} to {k['destination']} on "
                f"{k['date']} is {_money(best['prices'][cabin])} (flight {best['flight_number']}).")

    # == telecom ==========================================================================================
    def _telecom(self) -> Script:
        k = self.known
        phone = k["phone_number"]
        ok = yield from self.need([phone], "I'm happy to help. To find your account, could you please give me the "
                                           "phone number of your line?")
        self.customer = (yield from self.lookup("get_customer_by_phone", {"phone_number": phone})) if ok else None
        if self.customer is None:
            yield from self.say("I'm sorry, I could not find your account, so I can't make changes.")
            return
        self.cid = self.customer["customer_id"]
        if "symptom" in self.task.scenario.withheld:
            yield from self.need([k["symptom"].split()[0]], "Thank you. What seems to be the problem with your phone?",
                                 tries=1)
        self.line = (yield from self.lookup("get_details_by_id", {"id": self._line_id(phone)})) or {}
        intents = self.task.scenario.intents
        fixing = False
        for intent in intents:
            if intent.question is not None:
                report = yield from self._telecom_info(intent)
                yield from self.say(f"{report} {ANYTHING_ELSE}")
                continue
            if intent.out_of_policy:
                yield from self._telecom_refuse(intent)
                continue
            if intent.action:
                yield from self._telecom_action(intent)
            if intent.user_actions:
                yield from self._phone_steps(intent.user_actions)
            fixing = fixing or bool(intent.user_actions) or not (intent.action or intent.question)
            if not intent.action and not intent.user_actions and not intent.question and not self.task.gold_actions:
                yield from self._locked_sim()
                return
        if fixing or "symptom" in k:
            yield from self.say("Could you please run a speed test on your phone and tell me the result?")
        yield from self.say(ANYTHING_ELSE)

    def _line_id(self, phone: str) -> str:
        """The id of the line with this number (privileged: which of the account's lines to open)."""
        return self.domain.database().view(self.task.context).devices[phone]["line_id"]

    def _telecom_info(self, intent: Intent) -> Script:
        bills = (yield from self.lookup("get_bills_for_customer", {"customer_id": self.cid})) or []
        want = "overdue" if "overdue" in (intent.question or "") else "issued"
        match = [b for b in bills if b["status"] == want]
        if not match:
            return f"I don't see any {want} bill on your account."
        bill = match[0] if want == "overdue" else match[-1]
        due = "it is overdue" if want == "overdue" else f"it is not due yet; the due date is {bill['due_date']}"
        return f"Your {'overdue' if want == 'overdue' else 'current'} bill {bill['bill_id']} ({bill['period']}) is " \
               f"{_money(bill['amount'])}, and {due}."

    def _telecom_refuse(self, intent: Intent) -> Script:
        if intent.action == "refuel_data":
            usage = (yield from self.lookup("get_data_usage", {"customer_id": self.cid,
                                                               "line_id": intent.args["line_id"]})) or {}
            room = max(0.0, 2.0 - float(usage.get("data_refueled_gb", 0.0)))
            rule = "a line can receive at most 2 GB of refuel in total per billing cycle"
            first = (f"I'm sorry, but {rule}, so I can't add {intent.args['gb_amount']:g} GB. The most I could add "
                     f"this cycle is {room:g} GB.")
        else:
            bills = (yield from self.lookup("get_bills_for_customer", {"customer_id": self.cid})) or []
            overdue = next((b for b in bills if b["status"] == "overdue"), None)
            rule = "a line can only be resumed once the overdue bill is paid"
            amount = f" ({_money(overdue['amount'])}, bill {overdue['bill_id']})" if overdue else ""
            first = (f"I'm sorry, but I can't resume your line while you have an overdue bill{amount}: {rule}. I can "
                     "send you a payment request for it whenever you are ready.")
        yield from self.refuse(first, f"I understand, but I can't make an exception: {rule}.")

    def _telecom_action(self, intent: Intent) -> Script:
        handlers = {
            "refuel_data": self._refuel,
            "enable_roaming": self._roaming,
            "change_plan": self._plan,
            "suspend_line": self._suspend,
            "send_payment_request": self._payment_request,
            "resume_line": self._resume,
        }
        return (yield from handlers[intent.action or ""](intent))

    def _line_words(self, line_id: str) -> str:
        phone = self.line.get("phone_number", "") if self.line.get("line_id") == line_id else ""
        return f"line {line_id} ({phone})" if phone else f"line {line_id}"

    def _refuel(self, intent: Intent) -> Script:
        usage = yield from self.lookup("get_data_usage", {"customer_id": self.cid, "line_id": intent.args["line_id"]})
        plan = (yield from self.lookup("get_details_by_id", {"id": self.line.get("plan_id", "")})) or {}
        per_gb = float(plan.get("refuel_price_per_gb", 0.0))
        used_up = usage is not None and usage.get("data_remaining_gb", 1) <= 0

        def propose(args: Mapping[str, Any]) -> Script:
            lead = "Your line has used up its data allowance for this cycle. " if used_up else ""
            return (f"{lead}I can add {args['gb_amount']:g} GB of data to {self._line_words(args['line_id'])} for "
                    f"{_money(args['gb_amount'] * per_gb)} ({_money(per_gb)} per GB), charged to your current bill.")
            yield

        done = yield from self.settle(intent, "refuel_data", propose)
        self.prefix = f"Done: {intent.args['gb_amount']:g} GB of data has been added to your line." if done else ""

    def _roaming(self, intent: Intent) -> Script:
        def propose(args: Mapping[str, Any]) -> Script:
            return (f"Roaming is currently disabled on {self._line_words(args['line_id'])}, and your plan includes "
                    "roaming. I can enable international roaming on this line.")
            yield

        done = yield from self.settle(intent, "enable_roaming", propose)
        self.prefix = "Roaming is now enabled on your line." if done else ""

    def _plan(self, intent: Intent) -> Script:
        plans = (yield from self.lookup("get_available_plans", {})) or []
        by_id = {p["plan_id"]: p for p in plans}

        def propose(args: Mapping[str, Any]) -> Script:
            p = by_id.get(args["plan_id"])
            if p is None:
                return None
            roam = "includes roaming" if p["roaming_allowed"] else "does not include roaming"
            return (f"The cheapest plan that meets your needs is {p['name']} ({p['plan_id']}): {p['data_gb']:g} GB "
                    f"of data per month for {_money(p['price'])} per month, and it {roam}. I can move "
                    f"{self._line_words(args['line_id'])} from plan {self.line.get('plan_id')} to {p['plan_id']}.")
            yield

        done = yield from self.settle(intent, "change_plan", propose)
        if done:
            self.line = {**self.line, "plan_id": intent.args["plan_id"]}
        self.prefix = f"Your line is now on plan {intent.args['plan_id']}." if done else ""

    def _suspend(self, intent: Intent) -> Script:
        lost = self.known.get("lost_phone_number", "")
        ok = yield from self.need([lost], "Which phone number was lost?")
        if not ok:
            return
        yield from self.lookup("get_details_by_id", {"id": intent.args["line_id"]})

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"I will suspend line {args['line_id']} ({lost}) with the reason \"lost or stolen\", so it cannot "
                    f"be used for calls or data until it is resumed. Your own line {self.known['phone_number']} stays "
                    "active.")
            yield

        done = yield from self.settle(intent, "suspend_line", propose)
        report = f"Line {intent.args['line_id']} ({lost}) is now suspended." if done else "Nothing was suspended."
        yield from self.say(f"{report} {ANYTHING_ELSE}")

    def _payment_request(self, intent: Intent) -> Script:
        bills = (yield from self.lookup("get_bills_for_customer", {"customer_id": self.cid})) or []
        bill = next((b for b in bills if b["bill_id"] == intent.args["bill_id"]), None)
        amount = _money(bill["amount"]) if bill else "the amount due"

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"Your line is suspended because bill {args['bill_id']} ({amount}) is overdue; it must be paid "
                    f"before the line can be resumed. I can send a payment request for bill {args['bill_id']} to your "
                    "carrier app.")
            yield

        done = yield from self.settle(intent, "send_payment_request", propose)
        if done:
            self.prefix = (f"I've sent the payment request for bill {intent.args['bill_id']} ({amount}). Please open "
                           "your carrier app, check your payment requests and pay the bill, then let me know.")

    def _resume(self, intent: Intent) -> Script:
        bill_id = next((a.arguments.get("bill_id") for a in self.task.gold_actions if a.name == "make_payment"), None)
        if bill_id:
            yield from self.lookup("get_details_by_id", {"id": bill_id})

        def propose(args: Mapping[str, Any]) -> Script:
            return f"Your overdue bill is now paid. I can resume {self._line_words(args['line_id'])}."
            yield

        done = yield from self.settle(intent, "resume_line", propose)
        self.prefix = "Your line is active again." if done else ""

    def _phone_steps(self, steps: list[Action]) -> Script:
        """Diagnose, then one instruction per phone step, each waiting for the user's report."""
        first = steps[0].name
        if first in ("toggle_airplane_mode", "reseat_sim_card"):
            yield from self.say("Could you please look at the status bar at the top of your phone's screen and tell "
                                "me what it shows?")
        elif first != "make_payment":
            yield from self.say("Could you please open your phone's mobile network settings and tell me what they "
                                "show?")
        for step in steps:
            if step.name == "make_payment":
                if self.prefix:
                    yield from self.say("")
                continue
            yield from self.say(STEP_WORDS.get(step.name, f"Please do this on your phone: {step.name}."))

    def _locked_sim(self) -> Script:
        yield from self.say("Could you please look at the status bar at the top of your phone's screen and tell me "
                            "what it shows?")
        yield from self.call("transfer_to_human_agents", {
            "summary": f"Customer {self.cid}: the SIM of {self.known['phone_number']} is PUK-locked; it needs "
                       "unlocking, which I cannot do with my tools."})


STEP_WORDS: dict[str, str] = {
    "toggle_airplane_mode": "Airplane mode is on. Please turn off airplane mode, then tell me what you see.",
    "reseat_sim_card": "Your phone does not detect the SIM card. Please take the SIM card out of the phone and put "
                       "it back in firmly, then tell me what happens.",
    "toggle_mobile_data": "Mobile data is switched off. Please turn on mobile data in your settings.",
    "toggle_data_roaming": "Please turn on data roaming in your phone's settings.",
    "reset_apn_settings": "Your APN settings have been modified. Please reset your APN settings to the default.",
    "reboot_device": "Now please restart your phone so the settings take effect.",
    "set_network_mode_preference": "Your phone is limited to an old network generation. Please set the preferred "
                                   "network mode to 4g_5g_preferred (4G/5G preferred).",
}
