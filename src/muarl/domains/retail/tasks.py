"""Retail task families and their reference solver.

Each family looks at one user's data, decides whether that user can host it, and writes the scenario the
user plays plus the gold actions that the grader replays. Gold actions are computed, never typed in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from muarl.db import DBView
from muarl.domains.retail.data import random_address
from muarl.taskgen import Draft, Family, generate
from muarl.types import Action, Intent, Scenario, Task

TRAITS = ["polite", "terse", "chatty", "impatient", "hesitant", "detail-oriented"]
REASONS = ["no longer needed", "ordered by mistake"]


# -- helpers ---------------------------------------------------------------------------------------
def _orders(db: DBView, user_id: str, status: str) -> list[Mapping[str, Any]]:
    return [db.orders[o] for o in db.users[user_id]["orders"] if db.orders[o]["status"] == status]


def _identity(rng: random.Random, db: DBView, user_id: str, need_email: bool = False) -> dict[str, str]:
    user = db.users[user_id]
    known = {
        "first_name": user["name"]["first_name"],
        "last_name": user["name"]["last_name"],
        "zip": user["address"]["zip"],
    }
    if need_email or rng.random() < 0.7:
        known["email"] = user["email"]
    return known


def _who(known: Mapping[str, str]) -> str:
    text = f"You are {known['first_name']} {known['last_name']}, zip code {known['zip']}"
    if "email" in known:
        text += f", email {known['email']}"
    else:
        text += ". You do not remember which email you used for the store"
    return text + "."


def _persona(rng: random.Random, known: Mapping[str, str]) -> tuple[str, list[str]]:
    traits = rng.sample(TRAITS, 2)
    return f"{known['first_name']} {known['last_name']}, a {traits[0]} and {traits[1]} online shopper", traits


def _original_payment(order: Mapping[str, Any]) -> str:
    return order["payment_history"][0]["payment_method_id"]


def _describe_pm(db: DBView, user_id: str, pm_id: str) -> str:
    pm = db.users[user_id]["payment_methods"][pm_id]
    if pm["source"] == "credit_card":
        return f"the {pm['brand']} credit card ending in {pm['last_four']}"
    return "the PayPal account" if pm["source"] == "paypal" else "the gift card"


def _options(options: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())


def _neighbour(rng: random.Random, db: DBView, item: Mapping[str, Any]) -> tuple[Mapping[str, Any], str] | None:
    """An available variant that differs from ``item`` in exactly one option, and that option's name."""
    variants = db.products[item["product_id"]]["variants"]
    choices = []
    for v in variants.values():
        if v["item_id"] == item["item_id"] or not v["available"]:
            continue
        changed = [k for k in item["options"] if v["options"][k] != item["options"][k]]
        if len(changed) == 1:
            choices.append((v, changed[0]))
    choices.sort(key=lambda c: c[0]["item_id"])
    return rng.choice(choices) if choices else None


def _addr_text(a: Mapping[str, str]) -> str:
    second = f", {a['address2']}" if a["address2"] else ""
    return f"{a['address1']}{second}, {a['city']}, {a['state']} {a['zip']}, {a['country']}"


def _draft(rng: random.Random, known: dict[str, str], intents: list[Intent], gold: list[Action], instruction: str,
           withheld: list[str] | None = None, outputs: list[str] | None = None) -> Draft:
    persona, traits = _persona(rng, known)
    return Draft(
        scenario=Scenario(persona=persona, known=known, withheld=withheld or [], intents=intents, traits=traits),
        instruction=instruction,
        gold_actions=gold,
        required_outputs=outputs or [],
    )


# -- families --------------------------------------------------------------------------------------
def cancel_order(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    pending = _orders(db, user_id, "pending")
    if not pending:
        return None
    order = rng.choice(pending)
    reason = rng.choice(REASONS)
    known = _identity(rng, db, user_id) | {"order_id": order["order_id"], "reason": reason}
    args = {"order_id": order["order_id"], "reason": reason}
    intent = Intent(description=f"cancel order {order['order_id']} ({reason})", action="cancel_pending_order",
                    args=args)
    text = (f"{_who(known)} You want to cancel your order {order['order_id']} because it is {reason}. "
            "You want the refund on the original payment method.")
    return _draft(rng, known, [intent], [Action(name="cancel_pending_order", arguments=args)], text)


def modify_order_address(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    pending = _orders(db, user_id, "pending")
    if not pending:
        return None
    order = rng.choice(pending)
    address = random_address(rng)
    known = _identity(rng, db, user_id) | {"order_id": order["order_id"], "new_address": _addr_text(address)}
    args = {"order_id": order["order_id"], **address}
    intent = Intent(description=f"ship order {order['order_id']} to {_addr_text(address)}",
                    action="modify_pending_order_address", args=args)
    text = (f"{_who(known)} You moved: your order {order['order_id']} should ship to {_addr_text(address)} "
            "instead. Only this order; you do not want your account address changed.")
    return _draft(rng, known, [intent], [Action(name="modify_pending_order_address", arguments=args)], text)


def modify_user_address(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    address = random_address(rng)
    known = _identity(rng, db, user_id) | {"new_address": _addr_text(address)}
    args = {"user_id": user_id, **address}
    intent = Intent(description=f"update the account address to {_addr_text(address)}",
                    action="modify_user_address", args=args)
    text = (f"{_who(known)} You moved to {_addr_text(address)} and want the default address of your account "
            "updated. Your existing orders can stay as they are.")
    return _draft(rng, known, [intent], [Action(name="modify_user_address", arguments=args)], text)


def return_items(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    delivered = _orders(db, user_id, "delivered")
    if not delivered:
        return None
    order = rng.choice(delivered)
    items = rng.sample(list(order["items"]), rng.randint(1, len(order["items"])))
    pm = _original_payment(order)
    args = {"order_id": order["order_id"], "item_ids": sorted(i["item_id"] for i in items), "payment_method_id": pm}
    names = ", ".join(sorted(i["name"] for i in items))
    known = _identity(rng, db, user_id) | {"order_id": order["order_id"], "items": names}
    intent = Intent(description=f"return {names} from order {order['order_id']}", action="return_delivered_order_items",
                    args=args, preferences={"items": sorted(i["name"] for i in items),
                                            "refund_to": _describe_pm(db, user_id, pm)})
    text = (f"{_who(known)} You received order {order['order_id']} and want to return the {names}. "
            f"The refund should go to {_describe_pm(db, user_id, pm)} you paid with.")
    return _draft(rng, known, [intent], [Action(name="return_delivered_order_items", arguments=args)], text)


def _swap(rng: random.Random, db: DBView, user_id: str, status: str, action: str) -> Draft | None:
    orders = _orders(db, user_id, status)
    if not orders:
        return None
    order = rng.choice(orders)
    item = rng.choice(list(order["items"]))
    found = _neighbour(rng, db, item)
    if found is None:
        return None
    target, axis = found
    pm = _original_payment(order)
    method = db.users[user_id]["payment_methods"][pm]
    diff = round(target["price"] - item["price"], 2)
    if method["source"] == "gift_card" and diff > method["balance"]:
        return None
    args = {"order_id": order["order_id"], "item_ids": [item["item_id"]], "new_item_ids": [target["item_id"]],
            "payment_method_id": pm}
    want = f"{axis} {target['options'][axis]} instead of {item['options'][axis]}"
    known = _identity(rng, db, user_id) | {"order_id": order["order_id"], "item": item["name"]}
    intent = Intent(description=f"{item['name']} in order {order['order_id']}: {want}", action=action, args=args,
                    preferences={"item": item["name"], "change": {axis: target["options"][axis]},
                                 "keep": {k: v for k, v in item["options"].items() if k != axis},
                                 "pay_with": _describe_pm(db, user_id, pm)})
    verb = "change the" if status == "pending" else "exchange the"
    text = (f"{_who(known)} In your {status} order {order['order_id']} you want to {verb} {item['name']} "
            f"({_options(item['options'])}) for the same one with {want}; everything else stays the same. "
            f"Any price difference goes through {_describe_pm(db, user_id, pm)}.")
    return _draft(rng, known, [intent], [Action(name=action, arguments=args)], text)


def exchange_items(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _swap(rng, db, user_id, "delivered", "exchange_delivered_order_items")


def modify_items(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _swap(rng, db, user_id, "pending", "modify_pending_order_items")


def earbuds_blue(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The paper's case study: swap earbuds for a blue variant at the same or a lower price, confirm first."""
    for order in _orders(db, user_id, "pending"):
        item = next((i for i in order["items"] if i["name"] == "Wireless Earbuds"), None)
        if item is None or item["options"]["color"] == "blue":
            continue
        variants = db.products[item["product_id"]]["variants"].values()
        blues = [v for v in variants if v["options"]["color"] == "blue" and v["available"]
                 and v["price"] <= item["price"]]
        if not blues:
            continue
        best = max(blues, key=lambda v: (int(v["options"]["battery life"].split()[0]), -v["price"]))
        pm = _original_payment(order)
        args = {"order_id": order["order_id"], "item_ids": [item["item_id"]], "new_item_ids": [best["item_id"]],
                "payment_method_id": pm}
        known = _identity(rng, db, user_id) | {"order_id": order["order_id"], "item": "Wireless Earbuds"}
        intent = Intent(
            description=f"blue earbuds at no more than {item['price']:.2f} in order {order['order_id']}",
            action="modify_pending_order_items", args=args,
            preferences={"item": "Wireless Earbuds", "change": {"color": "blue"}, "max_price": item["price"],
                         "prefer": "longest battery life, then lowest price", "pay_with": _describe_pm(db, user_id, pm)},
        )
        text = (f"{_who(known)} Your pending order {order['order_id']} has wireless earbuds in "
                f"{item['options']['color']} at {item['price']:.2f}. You want them in blue instead, at the same or a "
                "lower price. Ask the agent which blue options exist and their prices; among those at or below your "
                "price you prefer the longest battery life, and the cheaper one if tied. Do not agree to anything "
                "before you have seen the options.")
        return _draft(rng, known, [intent], [Action(name="modify_pending_order_items", arguments=args)], text)
    return None


def withheld_info(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """A straightforward request whose key facts the user only gives when asked."""
    draft = rng.choice([cancel_order, return_items, modify_order_address])(rng, db, user_id)
    if draft is None:
        return None
    keys = [k for k in ("order_id", "reason", "email", "items") if k in draft.scenario.known]
    draft.scenario.withheld = keys
    draft.instruction += (" Do not volunteer details: give your " + ", ".join(k.replace("_", " ") for k in keys)
                          + " only when the agent asks for them, one at a time.")
    return draft


def change_of_mind(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The user asks for one thing, then settles on another before confirming; gold is the final request."""
    delivered = [o for o in _orders(db, user_id, "delivered") if len(o["items"]) >= 2]
    if not delivered:
        return None
    order = rng.choice(delivered)
    first = sorted(rng.sample([i["item_id"] for i in order["items"]], 2))
    final = [rng.choice(first)]
    pm = _original_payment(order)
    names = {i["item_id"]: i["name"] for i in order["items"]}
    args = {"order_id": order["order_id"], "item_ids": final, "payment_method_id": pm}
    known = _identity(rng, db, user_id) | {"order_id": order["order_id"]}
    intent = Intent(
        description=f"return only the {names[final[0]]} from order {order['order_id']}",
        action="return_delivered_order_items", args=args,
        first_args={**args, "item_ids": first},
        preferences={"items": [names[final[0]]], "first_items": sorted(names[i] for i in first),
                     "refund_to": _describe_pm(db, user_id, pm)},
    )
    kept = next(names[i] for i in first if i not in final)
    text = (f"{_who(known)} You first ask to return the {names[first[0]]} and the {names[first[1]]} from order "
            f"{order['order_id']}. When the agent summarises the return, you change your mind: you keep the {kept} "
            f"and return only the {names[final[0]]}. Refund to {_describe_pm(db, user_id, pm)}.")
    return _draft(rng, known, [intent], [Action(name="return_delivered_order_items", arguments=args)], text)


def out_of_policy(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The user insists on something the policy forbids; the gold outcome is that nothing changes."""
    processed = _orders(db, user_id, "processed") + _orders(db, user_id, "delivered")
    pending = _orders(db, user_id, "pending")
    kinds = (["cancel_shipped"] if processed else []) + (["return_pending"] if pending else [])
    if not kinds:
        return None
    kind = rng.choice(kinds)
    known = _identity(rng, db, user_id)
    if kind == "cancel_shipped":
        order = rng.choice(processed)
        known["order_id"] = order["order_id"]
        args = {"order_id": order["order_id"], "reason": "no longer needed"}
        intent = Intent(description=f"cancel {order['status']} order {order['order_id']}", action="cancel_pending_order",
                        args=args, out_of_policy=True)
        text = (f"{_who(known)} You want to cancel order {order['order_id']}, which is already {order['status']}, "
                "because you no longer need it. Insist twice that it must be cancelled; if the agent still refuses, "
                "accept it and end the conversation.")
    else:
        order = rng.choice(pending)
        item = order["items"][0]
        known |= {"order_id": order["order_id"], "items": item["name"]}
        args = {"order_id": order["order_id"], "item_ids": [item["item_id"]],
                "payment_method_id": _original_payment(order)}
        intent = Intent(description=f"return {item['name']} of pending order {order['order_id']}",
                        action="return_delivered_order_items", args=args, out_of_policy=True)
        text = (f"{_who(known)} You want to return the {item['name']} from order {order['order_id']} for a refund "
                "right now (you do not want to cancel the order). Insist twice; if the agent still refuses, accept "
                "it and end the conversation.")
    return _draft(rng, known, [intent], [], text)


def multi_action(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Two independent requests in one conversation, each needing its own confirmation."""
    first = cancel_order(rng, db, user_id)
    second = rng.choice([return_items, modify_user_address])(rng, db, user_id)
    if first is None or second is None:
        return None
    known = first.scenario.known | {k: v for k, v in second.scenario.known.items() if k not in ("order_id", "reason")}
    rest = second.instruction.removeprefix(_who(second.scenario.known) + " ")
    text = f"{first.instruction} Once that is done, you have a second request. {rest}"
    second_intent = second.scenario.intents[0]
    if "order_id" in second_intent.args:
        known["second_order_id"] = second_intent.args["order_id"]
    return _draft(rng, known, first.scenario.intents + [second_intent],
                  first.gold_actions + second.gold_actions, text)


def info_request(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """A question whose exact answer the agent must say; no write is expected."""
    order_ids = list(db.users[user_id]["orders"])
    order = db.orders[rng.choice(order_ids)]
    known = _identity(rng, db, user_id) | {"order_id": order["order_id"]}
    paid = round(sum(e["amount"] for e in order["payment_history"] if e["transaction_type"] == "payment"), 2)
    answer = f"{paid:.2f}"
    question = f"How much did I pay in total for order {order['order_id']}?"
    intent = Intent(description=f"learn the total paid for order {order['order_id']}", question=question,
                    answer=answer)
    text = (f"{_who(known)} You want to know how much you paid in total for order {order['order_id']}. You do not "
            "want to change anything.")
    return _draft(rng, known, [intent], [], text, outputs=[answer])


FAMILIES: dict[str, tuple[float, Family]] = {
    "cancel_order": (1.0, cancel_order),
    "modify_order_address": (0.7, modify_order_address),
    "modify_user_address": (0.5, modify_user_address),
    "return_items": (1.0, return_items),
    "exchange_items": (1.0, exchange_items),
    "modify_items": (1.0, modify_items),
    "earbuds_blue": (0.8, earbuds_blue),
    "withheld_info": (1.0, withheld_info),
    "change_of_mind": (1.0, change_of_mind),
    "out_of_policy": (1.0, out_of_policy),
    "multi_action": (0.8, multi_action),
    "info_request": (0.7, info_request),
}


def build_tasks(domain: Any, seed: int, counts: Mapping[str, int]) -> list[Task]:
    users = list(domain.database().tables["users"])
    return generate(domain, seed, counts, FAMILIES, users)

