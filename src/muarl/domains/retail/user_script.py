"""How a retail customer words its requests and checks the agent's proposals (the scripted user's script).

The conversation itself (when to answer, confirm, insist, stop) is the generic engine's
(:mod:`muarl.users.scripted`); this module only knows retail: orders, items, addresses and refunds.
Identifiers are strict (the wrong order is always corrected), wording is lenient.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from muarl.domains.service_script import Check, ServiceUserScript, payment_mismatch
from muarl.users.phrases import norm

if TYPE_CHECKING:
    from muarl.types import Intent
    from muarl.users.scripted import Goal, ScriptedSession


def address(args: Mapping[str, Any]) -> str:
    """An address argument in one line."""
    second = f", {args['address2']}" if args.get("address2") else ""
    return f"{args['address1']}{second}, {args['city']}, {args['state']} {args['zip']}, {args['country']}"


# -- checking proposals ------------------------------------------------------------------------------------
def _order(args: Mapping[str, Any], text: str) -> str | None:
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
        return f"the address should be {address(args)}"
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


def _swap_check(args: Mapping[str, Any], intent: Intent, text: str, known: Mapping[str, str], final: bool) -> str | None:
    return _order(args, text) or _swap(args, intent, text) or payment_mismatch(args.get("payment_method_id"), text, intent)


CHECKS: dict[str, Check] = {
    "cancel_pending_order": lambda args, intent, text, known, final: _order(args, text) or _reason(args, text),
    "modify_pending_order_address": lambda args, intent, text, known, final: _order(args, text) or _address(args, text),
    "modify_user_address": lambda args, intent, text, known, final: _address(args, text),
    "return_delivered_order_items": lambda args, intent, text, known, final: (
        _order(args, text) or _items(args, intent, text, final)
        or payment_mismatch(args.get("payment_method_id"), text, intent)),
    "exchange_delivered_order_items": _swap_check,
    "modify_pending_order_items": _swap_check,
}

#: per action: words that name it (a proposal with none of them is not about that action)
ACTION_VERBS: dict[str, str] = {
    "cancel_pending_order": r"cancel",
    "return_delivered_order_items": r"return|refund",
    "exchange_delivered_order_items": r"exchang|swap|replac|switch|chang",
    "modify_pending_order_items": r"modif|exchang|swap|replac|switch|chang|updat",
    "modify_pending_order_address": r"address|ship",
    "modify_user_address": r"address",
}


class RetailUserScript(ServiceUserScript):
    """A retail customer: orders by id, items by name, refunds to a named payment method."""

    known_facts = ("email", "zip", "order_id", "new_address")
    action_verbs = ACTION_VERBS
    checks = CHECKS

    def goal_facts(self, goal: Goal, known: Mapping[str, str]) -> dict[str, str]:
        args, prefs = goal.wanted, goal.intent.preferences
        out: dict[str, str] = {}
        for key in ("order_id", "reason"):
            if key in args:
                out[key] = str(args[key])
        if "reason" in prefs:
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
        if {"address1", "city", "zip"} <= set(args):
            out["new_address"] = address(args)
        return out

    def request(self, session: ScriptedSession, goal: Goal) -> str:
        """The goal as the user would put it, without withheld facts."""
        intent, args = goal.intent, goal.wanted
        hide = session.withheld
        if intent.question:
            return intent.question

        def opt(key: str, text: str) -> str:
            return "" if key in hide else text

        order = opt("order_id", f" {args.get('order_id', '')}")
        pay = self.goal_facts(goal, session.known).get("payment", "")
        action = intent.action or ""
        if intent.out_of_policy and action == "return_delivered_order_items":
            return f"I want to return the {session.known.get('items', 'item')} from my order{order} for a refund right now."
        texts: dict[str, Callable[[], str]] = {
            "cancel_pending_order": lambda: (f"I'd like to cancel my order{order}." +
                                             opt("reason", f" The reason: it's {args.get('reason')}.")),
            "modify_pending_order_address": lambda: (f"I need to change the shipping address of my order{order} to "
                                                     f"{address(args)}."),
            "modify_user_address": lambda: (f"I moved and would like to update the default address of my account to "
                                            f"{address(args)}."),
            "return_delivered_order_items": lambda: self._return_text(goal, session.known, order, pay, hide),
            "exchange_delivered_order_items": lambda: self._swap_text(goal, order, pay, "exchange"),
            "modify_pending_order_items": lambda: self._swap_text(goal, order, pay, "change"),
        }
        if action in texts:
            return texts[action]()
        return super().request(session, goal)

    def _swap_text(self, goal: Goal, order: str, pay: str, verb: str) -> str:
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

    def _return_text(self, goal: Goal, known: Mapping[str, str], order: str, pay: str, hide: set[str]) -> str:
        items = "some items" if "items" in hide else "the " + self.goal_facts(goal, known).get("items", "items")
        refund = "" if "payment" in hide else f" Please refund {pay}."
        return f"I'd like to return {items} from my order{order}.{refund}"

    def change_of_mind(self, session: ScriptedSession, goal: Goal) -> str:
        prefs = goal.intent.preferences
        if goal.intent.action == "return_delivered_order_items":
            kept = [n for n in prefs.get("first_items", []) if n not in prefs.get("items", [])]
            return (f"I'd like to keep the {' and the '.join(kept)} and only return the "
                    f"{' and the '.join(prefs.get('items', []))}.")
        return super().change_of_mind(session, goal)
