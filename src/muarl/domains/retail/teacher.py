"""The retail domain's teacher: the generic teacher's moves with retail's own wording and lookups.

It authenticates by email or by name and zip, reads the user's profile for how they paid, and for each
request looks the order up, asks for what the request needs (the reason, the items, the new address),
quotes amounts and payment methods from its own tool results, proposes the exact write and waits for
an explicit yes (:class:`~muarl.policies.script.TeacherSession`). With a ``slip_rate`` its identity
lookup is now and then mistyped; it then says it found no account and asks for the details again,
never going on unauthenticated. Set as ``Domain.teacher`` of retail, so the narrowed views
(retail-lite ...) inherit it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from muarl.policies.script import ANYTHING_ELSE, Script, TeacherSession, money
from muarl.types import Intent


class RetailTeacher(TeacherSession):
    """One retail episode of the reference agent."""

    user: Mapping[str, Any]

    def script(self) -> Script:
        uid = yield from self._auth()
        if uid is None:
            yield from self.say("I'm sorry, I could not verify your identity, so I can't make changes.")
            return
        self.user = {}
        if "get_user_details" in self.domain.agent_tools:  # a narrowed domain may not have it
            self.user = (yield from self.lookup("get_user_details", {"user_id": uid})) or {}
        intents = self.task.scenario.intents
        for intent in intents:
            report = yield from self._intent(intent)
            yield from self.say(f"{report} {ANYTHING_ELSE}".strip())

    def _auth(self) -> Script:
        k = self.known
        if "email" in k:
            yield from self.say("I'd be happy to help. First I need to verify your identity: could you please "
                                "tell me the email address on your account?")
        else:
            yield from self.say("I'd be happy to help. First I need to verify your identity: could you please "
                                "tell me your first name, last name and zip code?")
        for _ in range(3):
            if "email" in k and self.said(k["email"]):
                if (yield from self.slip("find_user_id_by_email", {"email": k["email"]})) is not None:
                    yield from self.say("I could not find an account with that email. Could you please give me the "
                                        "email address on your account again?")
                    continue
                out = yield from self.call("find_user_id_by_email", {"email": k["email"]})
                if not out.startswith("Error"):
                    return out
            if self.said(k["first_name"], k["last_name"], k["zip"]):
                name_zip = {"first_name": k["first_name"], "last_name": k["last_name"], "zip": k["zip"]}
                if (yield from self.slip("find_user_id_by_name_zip", name_zip)) is not None:
                    yield from self.say("I could not find an account with those details. Could you please give me "
                                        "your first name, last name and zip code again?")
                    continue
                out = yield from self.call("find_user_id_by_name_zip", name_zip)
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

    def _intent(self, intent: Intent) -> Script:
        """Handle one retail request; returns the sentence reporting what happened."""
        oid = intent.args.get("order_id")
        if intent.question is not None:
            m = re.search(r"#W\d+", intent.question)
            order = yield from self._order(m.group(0) if m else "")
            if order is None:
                return "I'm sorry, I couldn't find that order."
            paid = sum(e["amount"] for e in order["payment_history"] if e["transaction_type"] == "payment")
            return f"You paid a total of {money(paid)} for order {order['order_id']}."
        if intent.action == "modify_user_address":
            return (yield from self._user_address(intent))
        order = yield from self._order(oid)
        if order is None:
            return "I'm sorry, I couldn't find that order."
        if intent.out_of_policy:
            yield from self._refuse(intent, order)
            return ""
        handlers = {
            "cancel_pending_order": self._cancel,
            "modify_pending_order_address": self._order_address,
            "return_delivered_order_items": self._return,
            "exchange_delivered_order_items": self._swap,
            "modify_pending_order_items": self._swap,
        }
        return (yield from handlers[intent.action or ""](intent, order))

    def _refuse(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        oid, status = order["order_id"], order["status"]
        if intent.action == "cancel_pending_order":
            rule = "only pending orders can be cancelled"
            first = f"I'm sorry, but order {oid} is already {status}, and {rule}, so I'm unable to cancel it."
        else:
            rule = "only delivered orders can be returned"
            first = f"I'm sorry, but order {oid} is still {status}, and {rule}, so I'm unable to process a return."
        yield from self.refuse(first, f"I understand, but I can't make an exception: {rule}.")

    def _cancel(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        reason = (intent.first_args or intent.args)["reason"]  # what the user asks for first
        ok = yield from self.need([reason], "May I ask the reason for the cancellation?")
        if not ok:
            return "I need a valid reason to cancel the order."
        paid = sum(e["amount"] for e in order["payment_history"] if e["transaction_type"] == "payment")
        pm = self._pm(order["payment_history"][0]["payment_method_id"])
        items = ", ".join(i["name"] for i in order["items"])

        def propose(args: Mapping[str, Any]) -> Script:
            return f"I can cancel order {args['order_id']} ({items}) with the reason \"{args['reason']}\". " \
                   f"The {money(paid)} you paid will be refunded to {pm}."
            yield

        done = yield from self.settle(intent, "cancel_pending_order", propose)
        return f"Your order {order['order_id']} has been cancelled and {money(paid)} will be refunded to {pm}." \
            if done else "The order was not cancelled."

    def _order_address(self, intent: Intent, order: Mapping[str, Any]) -> Script:
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

    def _user_address(self, intent: Intent) -> Script:
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

    def _return(self, intent: Intent, order: Mapping[str, Any]) -> Script:
        by_id = {i["item_id"]: i for i in order["items"]}
        wanted = (intent.first_args or intent.args)["item_ids"]
        ok = yield from self.need([by_id[i]["name"] for i in wanted],
                                  "Which items from this order would you like to return?")
        if not ok:
            return "I need to know which items to return."

        def propose(args: Mapping[str, Any]) -> Script:
            items = [by_id[i] for i in args["item_ids"]]
            listed = "; ".join(f"{i['name']} ({self._opts(i['options'])}, item {i['item_id']}, {money(i['price'])})"
                               for i in items)
            total = sum(i["price"] for i in items)
            return (f"I will request a return of these items from order {args['order_id']}: {listed}. The refund of "
                    f"{money(total)} will go to {self._pm(args['payment_method_id'])}.")
            yield

        done = yield from self.settle(intent, "return_delivered_order_items", propose)
        return ("The return has been requested; you'll get an email with the return label, and the refund is issued "
                "once the items arrive." if done else "No return was made.")

    def _swap(self, intent: Intent, order: Mapping[str, Any]) -> Script:
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
                f"{self._opts(v['options'])} (item {v['item_id']}) at {money(v['price'])}" for v in blues) + \
                f". Among those at or below your price, the one with the longest battery life is item " \
                f"{intent.args['new_item_ids'][0]}. "

        def propose(args: Mapping[str, Any]) -> Script:
            new = variants[args["new_item_ids"][0]]
            diff = round(new["price"] - old["price"], 2)
            way = "charged to" if diff > 0 else "refunded to"
            pm = self._pm(args["payment_method_id"])
            difference = (f"The price difference of {money(abs(diff))} will be {way} {pm}." if diff
                          else f"There is no price difference; {pm} stays on file.")
            return (f"{listing}In order {args['order_id']}, I will {verb} your {old['name']} "
                    f"({self._opts(old['options'])}, item {old['item_id']}, {money(old['price'])}) for the variant with "
                    f"{self._opts(new['options'])} (item {new['item_id']}, {money(new['price'])}). {difference}")
            yield

        done = yield from self.settle(intent, intent.action or "", propose)
        if not done:
            return "Nothing was changed."
        return ("Your exchange has been requested; you'll receive instructions to send the old item back."
                if verb == "exchange" else f"Your order {order['order_id']} has been updated.")
