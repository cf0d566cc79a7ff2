"""The oracle of an ACEBench item: its milestone calls, reconciled with its expected end state.

The milestones are ACEBench's own answer for the calls; the ground truth its answer for the end state.
On most items the milestones, executed, reach the ground truth. Where they do not, ACEBench's two answers
disagree with each other, and the oracle follows the end state (what the reward is computed on) by the
smallest repairs of the milestones, each a generic rule read off the ground truth, never an item list:

- ``login_device`` / ``turn_on_wifi`` added first when the end state has the device logged in or the
  Wi-Fi on, the item starts without, and the milestones never do it;
- ``login_food_platform`` added when the end state has a user logged in to the food platform that the
  milestones never log in (the password is the one in the end state's user table);
- an order's items taken from the end state's order of the same user at the same merchant;
- a deleted message that the end state still holds replaced by the one message the end state lacks, and
  a sent text replaced by the end state's new message between the same two people.

:func:`oracle` says which of these it used; ``docs/bridges.md`` lists the items and why.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

from muarl.bridges.acebench_data import Call, Item, parse_calls
from muarl.bridges.acebench_world import World, acebench_verdict


def run(item: Item, calls: list[Call]) -> tuple[bool, World]:
    """Execute ``calls`` on a fresh world; (ACEBench's verdict on the end state, the world)."""
    world = World(item)
    for name, arguments in calls:
        with contextlib.suppress(Exception):  # a failing call changes nothing; the verdict tells
            world.call(name, copy.deepcopy(arguments))
    return bool(acebench_verdict(world.state(), item.ground_truth)["valid"]), world


def oracle(item: Item) -> tuple[list[Call], str]:
    """(calls, how they were made): the first milestone sequence that reaches the ground truth, else the
    first one repaired (see the module docstring), else the first one as it is."""
    candidates = [[c for text in candidate for c in parse_calls(text)] for candidate in item.milestones]
    for i, calls in enumerate(candidates):
        if run(item, calls)[0]:
            return calls, "milestones" if i == 0 else f"milestones (alternative {i + 1})"
    calls, notes = list(candidates[0]), []
    for rule in _RULES:
        calls, note = rule(item, calls)
        if note:
            notes.append(note)
    if notes and run(item, calls)[0]:
        return calls, "milestones repaired: " + "; ".join(notes)
    return list(candidates[0]), "milestones (they do not reach the ground truth)"


def _expected(item: Item, cls: str) -> dict[str, Any]:
    """The ground truth's attributes of class ``cls`` (the answer files sometimes misspell the case)."""
    for entry in item.ground_truth:
        for name, attrs in entry.items():
            if name.lower() == cls.lower():
                return attrs
    return {}


def _device(item: Item, calls: list[Call]) -> tuple[list[Call], str]:
    start = World(item).instances
    base = start.get("BaseApi")
    expected = _expected(item, "BaseApi")
    added = []
    for attr, fix in (("logged_in", "login_device"), ("wifi", "turn_on_wifi")):
        if (base is not None and expected.get(attr) is True and not getattr(base, attr)
                and all(n != fix for n, _ in calls)):
            added.append(fix)
    return [(f, {}) for f in added] + calls, ", ".join(f"{f}() added" for f in added)


def _platform_login(item: Item, calls: list[Call]) -> tuple[list[Call], str]:
    expected = _expected(item, "FoodPlatform")
    done = {a.get("username") for n, a in calls if n == "login_food_platform"}
    notes = []
    for user in expected.get("logged_in_users", []):
        password = expected.get("users", {}).get(user, {}).get("password")
        if user in done or password is None:
            continue
        at = next((i for i, (_, a) in enumerate(calls) if a.get("username") == user), 0)
        calls = calls[:at] + [("login_food_platform", {"username": user, "password": password})] + calls[at:]
        notes.append(f"login_food_platform({user}) added")
    return calls, ", ".join(notes)


def _order_items(item: Item, calls: list[Call]) -> tuple[list[Call], str]:
    orders = _expected(item, "FoodPlatform").get("orders", [])
    out, notes = [], []
    for name, args in calls:
        order = next((o for o in orders if name == "add_food_delivery_order"
                      and o.get("user_name") == args.get("username")
                      and o.get("merchant_name") == args.get("merchant_name")), None)
        if order is not None:
            wanted = [{"product": i["product"], "quantity": i["quantity"]} for i in order.get("items", [])]
            if wanted != args.get("items"):
                args = {**args, "items": wanted}
                notes.append("order items as in the end state")
        out.append((name, args))
    return out, ", ".join(notes)


def _messages(item: Item, calls: list[Call]) -> tuple[list[Call], str]:
    api = World(item).instances.get("MessageApi")
    expected = _expected(item, "MessageApi").get("inbox")
    if api is None or not isinstance(expected, dict):
        return calls, ""
    start = {str(k): v for k, v in api.inbox.items()}
    gone = [k for k in start if k not in expected]
    new = [v for k, v in expected.items() if k not in start]
    ids = {name: user["user_id"] for name, user in api.user_list.items()}
    out, notes = [], []
    for name, args in calls:
        if name == "delete_message" and str(args.get("message_id")) in expected and len(gone) == 1:
            args = {**args, "message_id": int(gone[0])}
            notes.append(f"delete_message({gone[0]}) instead")
        if name == "send_message":
            same = [m for m in new if m.get("sender_id") == ids.get(args.get("sender_name"))
                    and m.get("receiver_id") == ids.get(args.get("receiver_name"))]
            if len(same) == 1 and same[0].get("message") != args.get("message"):
                args = {**args, "message": same[0]["message"]}
                notes.append("message text as in the end state")
        out.append((name, args))
    return out, ", ".join(notes)


_RULES: list[Callable[[Item, list[Call]], tuple[list[Call], str]]] = [_device, _platform_login, _order_items,
                                                                      _messages]
