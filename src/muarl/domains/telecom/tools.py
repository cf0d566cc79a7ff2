"""The agent's tools: look up and change the customer's account (lines, plans, bills).

Hard rules the system itself enforces (a line with an overdue bill cannot be resumed, roaming needs a
plan that includes it) raise :class:`ToolError`. Softer rules that need judgement (how much data to
refuel, asking for confirmation) live in the policy, so an agent can break them and the grader sees it.
Every new id is derived from the data, never from a clock or a random source, so replays are exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from muarl.db import DBView
from muarl.domains.common import COMMON_TOOLS
from muarl.tools import ToolError, tool

#: The most a line may be refueled with in one billing cycle (a technical ceiling above the policy's).
MAX_REFUEL_TECHNICAL_GB = 10.0


def _money(value: float) -> float:
    return round(value + 1e-9, 2)


def _customer(db: DBView, customer_id: str) -> Mapping[str, Any]:
    if customer_id not in db.customers:
        raise ToolError(f"customer {customer_id} not found")
    return db.customers[customer_id]


def _line(db: DBView, customer_id: str, line_id: str) -> Mapping[str, Any]:
    customer = _customer(db, customer_id)
    if line_id not in customer["line_ids"]:
        raise ToolError(f"line {line_id} does not belong to customer {customer_id}")
    return db.lines[line_id]


def _overdue_bills(db: DBView, customer: Mapping[str, Any]) -> list[str]:
    return [b for b in customer["bill_ids"] if db.bills[b]["status"] == "overdue"]


@tool(authenticates=True)
def get_customer_by_phone(db: DBView, phone_number: str) -> dict[str, Any]:
    """Find and authenticate a customer by one of the phone numbers on their account.

    Args:
        phone_number: The phone number, formatted like "555-123-4567".
    """
    if phone_number not in db.devices:
        raise ToolError(f"no customer has phone number {phone_number}")
    customer = db.customers[db.devices[phone_number]["customer_id"]]
    db.authenticate(customer["customer_id"])
    return dict(customer)


@tool(authenticates=True)
def get_customer_by_id(db: DBView, customer_id: str) -> dict[str, Any]:
    """Find and authenticate a customer by their customer id.

    Args:
        customer_id: The customer id, e.g. "C1042".
    """
    customer = _customer(db, customer_id)
    db.authenticate(customer_id)
    return dict(customer)


@tool(authenticates=True)
def get_customer_by_name(db: DBView, full_name: str, dob: str) -> dict[str, Any]:
    """Find and authenticate a customer by full name and date of birth (both must match).

    Args:
        full_name: First and last name, e.g. "Ava Nguyen".
        dob: Date of birth as YYYY-MM-DD, e.g. "1987-04-12".
    """
    wanted = " ".join(full_name.lower().split())
    for cid in db.customers:
        customer = db.customers[cid]
        if customer["full_name"].lower() == wanted and customer["dob"] == dob.strip():
            db.authenticate(cid)
            return dict(customer)
    raise ToolError("no customer matches that name and date of birth")


@tool
def get_details_by_id(db: DBView, id: str) -> dict[str, Any]:
    """Get the details of a line, a plan or a bill from its id.

    Args:
        id: A line id ("L20013"), plan id ("P-PLUS-20") or bill id ("B104502").
    """
    for table in ("lines", "plans", "bills"):
        if id in db[table]:
            return dict(db[table][id])
    raise ToolError(f"no line, plan or bill has id {id}")


@tool
def get_bills_for_customer(db: DBView, customer_id: str) -> list[dict[str, Any]]:
    """List all bills of a customer, oldest first.

    Args:
        customer_id: The customer id.
    """
    customer = _customer(db, customer_id)
    return [dict(db.bills[b]) for b in customer["bill_ids"]]


@tool
def get_data_usage(db: DBView, customer_id: str, line_id: str) -> dict[str, Any]:
    """Show a line's data usage this billing cycle against its plan allowance plus refuels.

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
    """
    line = _line(db, customer_id, line_id)
    plan = db.plans[line["plan_id"]]
    limit = _money(plan["data_gb"] + line["data_refueled_gb"])
    return {
        "line_id": line_id,
        "plan_data_gb": plan["data_gb"],
        "data_refueled_gb": line["data_refueled_gb"],
        "data_used_gb": line["data_used_gb"],
        "data_remaining_gb": max(0.0, _money(limit - line["data_used_gb"])),
        "cycle_end": line["cycle_end"],
    }


@tool
def get_available_plans(db: DBView) -> list[dict[str, Any]]:
    """List every plan a line can be moved to, with data allowance, price and roaming."""
    return [dict(db.plans[p]) for p in db.plans]


@tool(write=True)
def suspend_line(
    db: DBView, customer_id: str, line_id: str, reason: Literal["lost_or_stolen", "customer_request"]
) -> dict[str, Any]:
    """Suspend an active line (no calls or data until resumed).

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
        reason: "lost_or_stolen" for a lost or stolen phone, else "customer_request".
    """
    _line(db, customer_id, line_id)
    line = db.lines.edit(line_id)
    if line["status"] != "active":
        raise ToolError(f"line {line_id} is already suspended")
    line["status"] = "suspended"
    line["suspension_reason"] = reason
    return line


@tool(write=True)
def resume_line(db: DBView, customer_id: str, line_id: str) -> dict[str, Any]:
    """Resume a suspended line. Not possible while the customer has an overdue bill.

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
    """
    customer = _customer(db, customer_id)
    _line(db, customer_id, line_id)
    overdue = _overdue_bills(db, customer)
    if overdue:
        raise ToolError(f"cannot resume: customer has overdue bill(s) {', '.join(overdue)}; they must be paid first")
    line = db.lines.edit(line_id)
    if line["status"] != "suspended":
        raise ToolError(f"line {line_id} is not suspended")
    line["status"] = "active"
    line["suspension_reason"] = None
    return line


@tool(write=True)
def enable_roaming(db: DBView, customer_id: str, line_id: str) -> dict[str, Any]:
    """Turn on international roaming for a line (the plan must include roaming).

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
    """
    current = _line(db, customer_id, line_id)
    if not db.plans[current["plan_id"]]["roaming_allowed"]:
        raise ToolError(f"plan {current['plan_id']} does not include roaming; change to a plan with roaming first")
    if current["status"] != "active":
        raise ToolError(f"line {line_id} is suspended")
    if current["roaming_enabled"]:
        raise ToolError(f"roaming is already enabled on line {line_id}")
    line = db.lines.edit(line_id)
    line["roaming_enabled"] = True
    return line


@tool(write=True)
def disable_roaming(db: DBView, customer_id: str, line_id: str) -> dict[str, Any]:
    """Turn off international roaming for a line.

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
    """
    current = _line(db, customer_id, line_id)
    if not current["roaming_enabled"]:
        raise ToolError(f"roaming is already disabled on line {line_id}")
    line = db.lines.edit(line_id)
    line["roaming_enabled"] = False
    return line


@tool(write=True)
def refuel_data(db: DBView, customer_id: str, line_id: str, gb_amount: float) -> dict[str, Any]:
    """Add extra data to a line for the current cycle, charged at the plan's refuel price per GB.

    The charge is added to the customer's current (issued) bill, or to a new bill if there is none.

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
        gb_amount: Gigabytes to add, a positive multiple of 0.5, e.g. 1.0.
    """
    current = _line(db, customer_id, line_id)
    if gb_amount <= 0 or round(gb_amount * 2) != gb_amount * 2:
        raise ToolError("gb_amount must be a positive multiple of 0.5")
    if current["status"] != "active":
        raise ToolError(f"line {line_id} is suspended; data cannot be refueled")
    if current["data_refueled_gb"] + gb_amount > MAX_REFUEL_TECHNICAL_GB:
        raise ToolError(f"a line cannot hold more than {MAX_REFUEL_TECHNICAL_GB} GB of refuels per cycle")
    plan = db.plans[current["plan_id"]]
    cost = _money(gb_amount * plan["refuel_price_per_gb"])
    line = db.lines.edit(line_id)
    line["data_refueled_gb"] = _money(line["data_refueled_gb"] + gb_amount)
    customer = db.customers[customer_id]
    item = {"description": f"Data refuel {gb_amount:g} GB on line {line_id}", "amount": cost}
    issued = [b for b in customer["bill_ids"] if db.bills[b]["status"] == "issued"]
    if issued:
        bill = db.bills.edit(issued[-1])
        bill["items"].append(item)
        bill["amount"] = _money(bill["amount"] + cost)
    else:
        bill_id = f"B{customer_id[1:]}{len(customer['bill_ids']) + 1:02d}"
        bill = db.bills.insert(bill_id, {
            "bill_id": bill_id, "customer_id": customer_id, "period": "2025-06", "issue_date": "2025-06-15",
            "due_date": "2025-06-25", "amount": cost, "items": [item], "status": "issued",
            "payment_requested": False,
        })
        db.customers.edit(customer_id)["bill_ids"].append(bill_id)
    return {"line": line, "charged": cost, "bill_id": bill["bill_id"]}


@tool(write=True)
def change_plan(db: DBView, customer_id: str, line_id: str, plan_id: str) -> dict[str, Any]:
    """Move a line to another plan, effective immediately.

    Args:
        customer_id: The customer id owning the line.
        line_id: The line id.
        plan_id: The new plan id, e.g. "P-PLUS-20".
    """
    current = _line(db, customer_id, line_id)
    if plan_id not in db.plans:
        raise ToolError(f"no plan {plan_id}")
    if current["plan_id"] == plan_id:
        raise ToolError(f"line {line_id} is already on plan {plan_id}")
    if current["roaming_enabled"] and not db.plans[plan_id]["roaming_allowed"]:
        raise ToolError(f"plan {plan_id} has no roaming; disable roaming on line {line_id} first")
    line = db.lines.edit(line_id)
    line["plan_id"] = plan_id
    return line


@tool(write=True)
def send_payment_request(db: DBView, customer_id: str, bill_id: str) -> str:
    """Send the customer a payment request for an overdue bill; they pay it in their carrier app.

    Args:
        customer_id: The customer id.
        bill_id: The overdue bill's id.
    """
    customer = _customer(db, customer_id)
    if bill_id not in customer["bill_ids"]:
        raise ToolError(f"bill {bill_id} does not belong to customer {customer_id}")
    if db.bills[bill_id]["status"] != "overdue":
        raise ToolError(f"bill {bill_id} is not overdue (status {db.bills[bill_id]['status']})")
    if any(db.bills[b]["payment_requested"] and db.bills[b]["status"] != "paid" for b in customer["bill_ids"]):
        raise ToolError("the customer already has a pending payment request")
    bill = db.bills.edit(bill_id)
    bill["payment_requested"] = True
    return f"Payment request for bill {bill_id} ({bill['amount']:.2f}) sent to the customer's app."


TOOLS = [
    get_customer_by_phone,
    get_customer_by_id,
    get_customer_by_name,
    get_details_by_id,
    get_bills_for_customer,
    get_data_usage,
    get_available_plans,
    suspend_line,
    resume_line,
    enable_roaming,
    disable_roaming,
    refuel_data,
    change_plan,
    send_payment_request,
    *COMMON_TOOLS,
]
