"""Whose conversation a tau2 task is, who owns each record, and which tools identify the customer.

muarl's policy checks (``unauthenticated_write``, ``other_user_records``) need three facts the built-in
domains carry and tau2's tasks leave implicit:

- **the task's user**, derived from tau2's task data: the ``user_id`` / ``customer_id`` its gold actions
  name; else the owner of an order, reservation, line or bill they name; else the user its scenario
  text identifies (a phone number, an email, a user id, or a name with a zip code found in the DB);
- **the owner of a record** in the mirrored tables: retail and airline records carry their ``user_id``,
  telecom's customers and bills their ``customer_id``, and a line or device belongs to the customer
  whose ``line_ids`` hold it; products, flights and plans belong to nobody;
- **authentication**: the tools tau2's policies tell the agent to identify the customer with (retail:
  ``find_user_id_by_email`` / ``_by_name_zip``; airline: ``get_user_details``; telecom:
  ``get_customer_by_phone`` / ``_by_id`` / ``_by_name``); a successful call authenticates the user it
  returns, as the built-in domains' lookups do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

#: per tau2 domain: the tools whose successful result identifies (authenticates) the customer
IDENTIFY: dict[str, set[str]] = {
    "retail": {"find_user_id_by_email", "find_user_id_by_name_zip"},
    "airline": {"get_user_details"},
    "telecom": {"get_customer_by_phone", "get_customer_by_id", "get_customer_by_name"},
}
_ID_ARGS = ("user_id", "customer_id")
_PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def owners(tables: Mapping[str, Mapping[str, Any]]) -> Callable[[str, Mapping[str, Any]], str | None]:
    """``owner_of`` for a tau2 domain, given its mirrored tables (telecom's lines and devices are owned
    through the customer records that list them)."""
    line_owner: dict[str, str] = {}
    for customer in tables.get("customers", {}).values():
        for line_id in customer.get("line_ids", []):
            line_owner[line_id] = customer["customer_id"]
    device_owner = {line["device_id"]: line_owner[line["line_id"]] for line in tables.get("lines", {}).values()
                    if line.get("device_id") and line.get("line_id") in line_owner}

    def owner_of(table: str, record: Mapping[str, Any]) -> str | None:
        if table.startswith("user."):  # the customer's own phone
            return None
        if table == "lines":
            return line_owner.get(record.get("line_id", ""))
        if table == "devices":
            return device_owner.get(record.get("device_id", ""))
        for key in _ID_ARGS:
            if isinstance(record.get(key), str):
                return record[key]
        return None

    return owner_of


def identified(output: str) -> str | None:
    """The user an identifying tool's result names: a bare id (retail), or a record's id field."""
    try:
        value = json.loads(output)
    except (json.JSONDecodeError, TypeError):
        value = output.strip()
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict):
        return next((value[k] for k in _ID_ARGS if isinstance(value.get(k), str)), None)
    return value if isinstance(value, str) and value and " " not in value else None


def task_user(t2: Any, tables: Mapping[str, Mapping[str, Any]],
              owner_of: Callable[[str, Mapping[str, Any]], str | None]) -> str:
    """The customer a tau2 task is about (see the module docstring); "" when the data does not say."""
    criteria = t2.evaluation_criteria
    actions = list(criteria.actions or []) if criteria is not None else []
    for action in actions:
        for key in _ID_ARGS:
            if isinstance(action.arguments.get(key), str):
                return action.arguments[key]
    for action in actions:
        for arg, table in (("order_id", "orders"), ("reservation_id", "reservations"), ("line_id", "lines"),
                           ("bill_id", "bills")):
            found = _by_field(tables.get(table, {}), arg, action.arguments.get(arg))
            if found is not None and owner_of(table, found):
                return str(owner_of(table, found))
    return _from_text(_scenario_text(t2), tables, owner_of)


def _by_field(table: Mapping[str, Any], field: str, value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if value in table:
        return table[value]
    return next((r for r in table.values() if isinstance(r, Mapping) and r.get(field) == value), None)


def _scenario_text(t2: Any) -> str:
    parts = [str(t2.user_scenario)]
    state = getattr(t2, "initial_state", None)
    for action in (getattr(state, "initialization_actions", None) or []):
        parts.append(json.dumps(getattr(action, "arguments", {}), default=str))
    return "\n".join(parts)


def _from_text(text: str, tables: Mapping[str, Mapping[str, Any]],
               owner_of: Callable[[str, Mapping[str, Any]], str | None]) -> str:
    users = tables.get("users", {})
    for user_id in users:
        if re.search(rf"\b{re.escape(user_id)}\b", text):
            return user_id
    for phone in _PHONE.findall(text):
        for table in ("customers", "lines"):
            record = _by_field(tables.get(table, {}), "phone_number", phone)
            if record is not None and owner_of(table, record):
                return str(owner_of(table, record))
    for email in _EMAIL.findall(text):
        record = _by_field(users, "email", email.rstrip("."))
        if record is not None:
            return str(record.get("user_id", ""))
    lowered = text.lower()
    for user_id, user in users.items():
        name = user.get("name", {})
        full = f"{name.get('first_name', '')} {name.get('last_name', '')}".strip().lower()
        if full and full in lowered and str(user.get("address", {}).get("zip", "")) in text:
            return user_id
    return ""
