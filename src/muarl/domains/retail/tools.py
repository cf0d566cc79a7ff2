"""Retail agent tools. Hard rules (status, ownership, availability, balances) are enforced here; rules
that need judgement (confirmation, authentication) are in the policy and checked by the grader."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from muarl.db import DBView
from muarl.domains.common import COMMON_TOOLS
from muarl.tools import ToolError, tool


def _order(db: DBView, order_id: str) -> Mapping[str, Any]:
    if order_id not in db.orders:
        raise ToolError(f"order {order_id} not found")
    return db.orders[order_id]


def _user(db: DBView, user_id: str) -> Mapping[str, Any]:
    if user_id not in db.users:
        raise ToolError(f"user {user_id} not found")
    return db.users[user_id]


def _payment_method(db: DBView, order: Mapping[str, Any], payment_method_id: str) -> Mapping[str, Any]:
    methods = db.users[order["user_id"]]["payment_methods"]
    if payment_method_id not in methods:
        raise ToolError(f"payment method {payment_method_id} not found for this user")
    return methods[payment_method_id]


def _variant(db: DBView, product_id: str, item_id: str) -> Mapping[str, Any]:
    variants = db.products[product_id]["variants"]
    if item_id not in variants:
        raise ToolError(f"item {item_id} is not a variant of product {product_id}")
    return variants[item_id]


def _settle(db: DBView, order_id: str, user_id: str, payment_method_id: str, amount: float) -> None:
    """Charge (amount > 0) or refund (amount < 0) the order's difference to a payment method."""
    amount = round(amount, 2)
    if amount == 0:
        return
    method = db.users[user_id]["payment_methods"][payment_method_id]
    if method["source"] == "gift_card":
        if amount > 0 and method["balance"] < amount:
            raise ToolError(f"gift card balance {method['balance']:.2f} is not enough to pay {amount:.2f}")
        user = db.users.edit(user_id)
        card = user["payment_methods"][payment_method_id]
        card["balance"] = round(card["balance"] - amount, 2)
    db.orders.edit(order_id)["payment_history"].append({
        "transaction_type": "payment" if amount > 0 else "refund",
        "amount": abs(amount),
        "payment_method_id": payment_method_id,
    })


def _swap_items(db: DBView, order: Mapping[str, Any], item_ids: list[str], new_item_ids: list[str]) -> float:
    """Validate a same-product swap of ``item_ids`` for ``new_item_ids``; returns the price difference."""
    if not item_ids:
        raise ToolError("item_ids must not be empty")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("item_ids and new_item_ids must have the same length")
    remaining = [i["item_id"] for i in order["items"]]
    diff = 0.0
    for old_id, new_id in zip(item_ids, new_item_ids, strict=True):
        if old_id not in remaining:
            raise ToolError(f"item {old_id} not found in order {order['order_id']}")
        remaining.remove(old_id)
        item = next(i for i in order["items"] if i["item_id"] == old_id)
        if new_id == old_id:
            raise ToolError(f"new item {new_id} is the same as the old one")
        new = _variant(db, item["product_id"], new_id)
        if not new["available"]:
            raise ToolError(f"new item {new_id} is not available")
        diff += new["price"] - item["price"]
    return round(diff, 2)


def _refund_target_ok(order: Mapping[str, Any], method: Mapping[str, Any], payment_method_id: str) -> None:
    original = order["payment_history"][0]["payment_method_id"]
    if payment_method_id != original and method["source"] != "gift_card":
        raise ToolError("refunds go to the original payment method or an existing gift card")


@tool(authenticates=True)
def find_user_id_by_email(db: DBView, email: str) -> str:
    """Find a user id by email address. This authenticates the user.

    Args:
        email: The user's email, such as "emma.kim1234@example.com".
    """
    for uid, user in db.users.items():
        if user["email"].lower() == email.strip().lower():
            db.authenticate(uid)
            return uid
    raise ToolError("user not found")


@tool(authenticates=True)
def find_user_id_by_name_zip(db: DBView, first_name: str, last_name: str, zip: str) -> str:
    """Find a user id by first name, last name and zip code. This authenticates the user.

    Args:
        first_name: The first name, such as "Emma".
        last_name: The last name, such as "Kim".
        zip: The zip code of the user's address, such as "78701".
    """
    for uid, user in db.users.items():
        name = user["name"]
        if (name["first_name"].lower(), name["last_name"].lower(), user["address"]["zip"]) == (
            first_name.strip().lower(), last_name.strip().lower(), zip.strip()
        ):
            db.authenticate(uid)
            return uid
    raise ToolError("user not found")


@tool
def get_user_details(db: DBView, user_id: str) -> Mapping[str, Any]:
    """Get a user's profile: name, address, email, payment methods and order ids.

    Args:
        user_id: The user id, such as "emma_kim_1234".
    """
    return _user(db, user_id)


@tool
def get_order_details(db: DBView, order_id: str) -> Mapping[str, Any]:
    """Get an order's status, items, address, fulfillments and payments.

    Args:
        order_id: The order id, starting with "#", such as "#W0000000".
    """
    return _order(db, order_id)


@tool
def get_product_details(db: DBView, product_id: str) -> Mapping[str, Any]:
    """Get a product's variants: item ids, options, price and availability.

    Args:
        product_id: The product id (not an item id), such as "6086499569".
    """
    if product_id not in db.products:
        raise ToolError(f"product {product_id} not found")
    return db.products[product_id]


@tool
def list_all_product_types(db: DBView) -> dict[str, str]:
    """List every product type sold, as a map from product name to product id."""
    return {p["name"]: pid for pid, p in sorted(db.products.items(), key=lambda kv: kv[1]["name"])}


@tool(write=True)
def cancel_pending_order(
    db: DBView, order_id: str, reason: Literal["no longer needed", "ordered by mistake"]
) -> Mapping[str, Any]:
    """Cancel a pending order and refund it. Only after the user explicitly confirms.

    Args:
        order_id: The order id, such as "#W0000000".
        reason: Why the user cancels: "no longer needed" or "ordered by mistake".
    """
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order is {order['status']}, only pending orders can be cancelled")
    for entry in list(order["payment_history"]):
        if entry["transaction_type"] == "payment":
            _settle(db, order_id, order["user_id"], entry["payment_method_id"], -entry["amount"])
    record = db.orders.edit(order_id)
    record["status"] = "cancelled"
    record["cancel_reason"] = reason
    return record


@tool(write=True)
def modify_pending_order_items(
    db: DBView, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> Mapping[str, Any]:
    """Swap items of a pending order for other variants of the same products. Can be done only once per
    order, so collect every item to change first. Only after the user explicitly confirms.

    Args:
        order_id: The order id, such as "#W0000000".
        item_ids: The item ids to replace, such as ["1008292230"].
        new_item_ids: The new item ids, same product and position as item_ids, such as ["1008292231"].
        payment_method_id: The user's payment method that pays or receives the price difference.
    """
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order is {order['status']}, only pending orders can be modified")
    method = _payment_method(db, order, payment_method_id)
    diff = _swap_items(db, order, item_ids, new_item_ids)
    if method["source"] == "gift_card" and diff > method["balance"]:
        raise ToolError("gift card balance is not enough to pay the price difference")
    _settle(db, order_id, order["user_id"], payment_method_id, diff)
    record = db.orders.edit(order_id)
    pending = list(zip(item_ids, new_item_ids, strict=True))
    for item in record["items"]:
        for k, (old_id, new_id) in enumerate(pending):
            if item["item_id"] == old_id:
                variant = db.products[item["product_id"]]["variants"][new_id]
                item.update(item_id=new_id, price=variant["price"], options=dict(variant["options"]))
                pending.pop(k)
                break
    record["status"] = "pending (item modified)"
    return record


@tool(write=True)
def modify_pending_order_address(
    db: DBView, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> Mapping[str, Any]:
    """Change the shipping address of a pending order. Only after the user explicitly confirms.

    Args:
        order_id: The order id, such as "#W0000000".
        address1: First line, such as "123 Main St".
        address2: Second line, such as "Apt 1", or "" if none.
        city: City, such as "Austin".
        state: State, such as "TX".
        country: Country, such as "USA".
        zip: Zip code, such as "78701".
    """
    order = _order(db, order_id)
    if not order["status"].startswith("pending"):
        raise ToolError(f"order is {order['status']}, only pending orders can be modified")
    record = db.orders.edit(order_id)
    record["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                         "country": country, "zip": zip}
    return record


@tool(write=True)
def modify_pending_order_payment(db: DBView, order_id: str, payment_method_id: str) -> Mapping[str, Any]:
    """Pay a pending order with another of the user's payment methods. Only after the user explicitly confirms.

    Args:
        order_id: The order id, such as "#W0000000".
        payment_method_id: The new payment method id, such as "gift_card_0000000".
    """
    order = _order(db, order_id)
    if not order["status"].startswith("pending"):
        raise ToolError(f"order is {order['status']}, only pending orders can be modified")
    payments = [e for e in order["payment_history"] if e["transaction_type"] == "payment"]
    if len(payments) != 1:
        raise ToolError("only orders paid with a single payment can change payment method")
    old = payments[0]
    if old["payment_method_id"] == payment_method_id:
        raise ToolError("the new payment method is the one already used")
    _payment_method(db, order, payment_method_id)
    _settle(db, order_id, order["user_id"], payment_method_id, old["amount"])
    _settle(db, order_id, order["user_id"], old["payment_method_id"], -old["amount"])
    return db.orders[order_id]


@tool(write=True)
def return_delivered_order_items(
    db: DBView, order_id: str, item_ids: list[str], payment_method_id: str
) -> Mapping[str, Any]:
    """Request a return of items of a delivered order. The refund goes to the original payment method or
    a gift card of the user. Only after the user explicitly confirms.

    Args:
        order_id: The order id, such as "#W0000000".
        item_ids: The item ids to return, such as ["1008292230"].
        payment_method_id: Where the refund goes, such as "credit_card_0000000".
    """
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order is {order['status']}, only delivered orders can be returned")
    if not item_ids:
        raise ToolError("item_ids must not be empty")
    method = _payment_method(db, order, payment_method_id)
    _refund_target_ok(order, method, payment_method_id)
    remaining = [i["item_id"] for i in order["items"]]
    for item_id in item_ids:
        if item_id not in remaining:
            raise ToolError(f"item {item_id} not found in order {order_id}")
        remaining.remove(item_id)
    record = db.orders.edit(order_id)
    record["status"] = "return requested"
    record["return_items"] = sorted(item_ids)
    record["return_payment_method_id"] = payment_method_id
    return record


@tool(write=True)
def exchange_delivered_order_items(
    db: DBView, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> Mapping[str, Any]:
    """Request an exchange of items of a delivered order for other variants of the same products. Can be
    done only once per order, so collect every item first. Only after the user explicitly confirms.

    Args:
        order_id: The order id, such as "#W0000000".
        item_ids: The item ids to exchange, such as ["1008292230"].
        new_item_ids: The new item ids, same product and position as item_ids.
        payment_method_id: The payment method that pays or receives the price difference.
    """
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order is {order['status']}, only delivered orders can be exchanged")
    method = _payment_method(db, order, payment_method_id)
    diff = _swap_items(db, order, item_ids, new_item_ids)
    if method["source"] == "gift_card" and diff > method["balance"]:
        raise ToolError("gift card balance is not enough to pay the price difference")
    record = db.orders.edit(order_id)
    record["status"] = "exchange requested"
    record["exchange_items"] = sorted(item_ids)
    record["exchange_new_items"] = sorted(new_item_ids)
    record["exchange_payment_method_id"] = payment_method_id
    record["exchange_price_difference"] = diff
    return record


@tool(write=True)
def modify_user_address(
    db: DBView, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> Mapping[str, Any]:
    """Change the default address of a user (not of existing orders). Only after the user explicitly confirms.

    Args:
        user_id: The user id, such as "emma_kim_1234".
        address1: First line, such as "123 Main St".
        address2: Second line, such as "Apt 1", or "" if none.
        city: City, such as "Austin".
        state: State, such as "TX".
        country: Country, such as "USA".
        zip: Zip code, such as "78701".
    """
    _user(db, user_id)
    record = db.users.edit(user_id)
    record["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                         "country": country, "zip": zip}
    return record


TOOLS = [
    find_user_id_by_email,
    find_user_id_by_name_zip,
    get_user_details,
    get_order_details,
    get_product_details,
    list_all_product_types,
    cancel_pending_order,
    modify_pending_order_items,
    modify_pending_order_address,
    modify_pending_order_payment,
    return_delivered_order_items,
    exchange_delivered_order_items,
    modify_user_address,
    *COMMON_TOOLS,
]
