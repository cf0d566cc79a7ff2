"""Seeded generator of the telecom world: customers, plans, lines, bills and the phones the users hold.

Everything is drawn from one ``random.Random(seed)`` so the same seed always gives the same database.
Most phones are healthy; a deterministic fraction get one planted fault (airplane mode left on, a
broken APN, a loose SIM, an exhausted data allowance, roaming off abroad ...) so the task families
always find users whose state fits them. No fault label is stored: families read the state itself.
"""

from __future__ import annotations

import random
from typing import Any

#: The fixed "today" of this world (policy and bills refer to it; nothing reads the clock).
TODAY = "2025-06-15"
CYCLE_END = "2025-06-30"

NETWORK_MODES = ("4g_5g_preferred", "4g_only", "3g_only", "2g_only")

PLANS: dict[str, dict[str, Any]] = {
    "P-BASIC-5": {"name": "Basic 5", "data_gb": 5.0, "price": 25.0, "roaming_allowed": False,
                  "refuel_price_per_gb": 5.0},
    "P-START-10": {"name": "Starter 10", "data_gb": 10.0, "price": 35.0, "roaming_allowed": False,
                   "refuel_price_per_gb": 4.5},
    "P-PLUS-20": {"name": "Plus 20", "data_gb": 20.0, "price": 45.0, "roaming_allowed": True,
                  "refuel_price_per_gb": 4.0},
    "P-TRAVEL-15": {"name": "Travel 15", "data_gb": 15.0, "price": 40.0, "roaming_allowed": True,
                    "refuel_price_per_gb": 3.5},
    "P-FAMILY-30": {"name": "Family 30", "data_gb": 30.0, "price": 60.0, "roaming_allowed": True,
                    "refuel_price_per_gb": 3.0},
    "P-MAX-50": {"name": "Max 50", "data_gb": 50.0, "price": 70.0, "roaming_allowed": True,
                 "refuel_price_per_gb": 2.5},
}

_FIRST = ["Ava", "Liam", "Noah", "Emma", "Olivia", "Mateo", "Sofia", "Yuki", "Amara", "Ethan", "Chloe", "Ravi",
          "Fatima", "Lucas", "Mia", "Omar", "Isabel", "Kenji", "Nadia", "Samuel", "Priya", "Diego", "Hannah",
          "Tomas", "Leila", "Jonas", "Grace", "Arjun", "Elena", "Marcus", "Zara", "Felix", "Aisha", "Victor"]
_LAST = ["Nguyen", "Garcia", "Smith", "Kowalski", "Okafor", "Rossi", "Tanaka", "Haddad", "Johansson", "Patel",
         "Martin", "Silva", "Kim", "Novak", "Dubois", "Moreau", "Lopez", "Schmidt", "Brown", "Ibrahim", "Chen",
         "Fischer", "Costa", "Murphy", "Ahmed", "Larsen", "Walker", "Rivera", "Sato", "Mensah"]
_STREETS = ["Maple Ave", "Oak St", "Cedar Ln", "Pine Rd", "Elm St", "Birch Way", "Harbor Blvd", "Hill Dr",
            "Lake Rd", "River St", "Sunset Blvd", "Park Pl"]
_CITIES = [("Austin", "TX"), ("Denver", "CO"), ("Portland", "OR"), ("Columbus", "OH"), ("Raleigh", "NC"),
           ("Phoenix", "AZ"), ("Madison", "WI"), ("Boston", "MA"), ("Tampa", "FL"), ("Reno", "NV")]
_MODELS = ["Pixel 8", "Galaxy S23", "iPhone 14", "iPhone 15", "Moto G Power", "Galaxy A54", "OnePlus 12",
           "Pixel 7a", "Xperia 10 V", "Nokia G42"]

#: Planted device/line states and their weights. ``None`` is a healthy line.
_FAULTS: list[tuple[str | None, float]] = [
    (None, 34.0),
    ("airplane", 6.0),
    ("data_off", 6.0),
    ("apn", 5.0),
    ("reboot", 2.0),
    ("network_2g", 3.0),
    ("network_3g", 3.0),
    ("sim_missing", 5.0),
    ("sim_locked", 2.0),
    ("exhausted", 9.0),
    ("abroad_both_off", 6.0),
    ("abroad_line_off", 3.0),
    ("abroad_phone_off", 3.0),
    ("abroad_no_plan", 4.0),
    ("exhausted_data_off", 4.0),
    ("airplane_data_off", 4.0),
]


def _money(value: float) -> float:
    return round(value + 1e-9, 2)


def _phone(rng: random.Random, used: set[str]) -> str:
    while True:
        number = f"555-{rng.randint(200, 989)}-{rng.randint(0, 9999):04d}"
        if number not in used:
            used.add(number)
            return number


def _healthy_device(rng: random.Random, customer_id: str, line_id: str, phone: str) -> dict[str, Any]:
    return {
        "phone_number": phone,
        "customer_id": customer_id,
        "line_id": line_id,
        "model": rng.choice(_MODELS),
        "airplane_mode": False,
        "mobile_data_enabled": True,
        "data_roaming_enabled": False,
        "sim_status": "active",
        "apn_settings": "ok",
        "network_mode_preference": "4g_5g_preferred",
        "abroad": False,
        "signal_strength": rng.choice([2, 3, 3, 4, 4]),
        # the APN the modem runs with; a changed APN setting only reaches it at the next restart
        "apn_in_use": "ok",
    }


def _plant(rng: random.Random, fault: str | None, line: dict[str, Any], device: dict[str, Any]) -> None:
    """Put one fault into a healthy line/device pair (mutates both)."""
    plan = PLANS[line["plan_id"]]
    if fault == "airplane":
        device["airplane_mode"] = True
    elif fault == "data_off":
        device["mobile_data_enabled"] = False
    elif fault == "apn":
        device["apn_settings"] = "broken"
        device["apn_in_use"] = "broken"
    elif fault == "reboot":  # the APN was reset but the phone not restarted since
        device["apn_in_use"] = "broken"
    elif fault == "network_2g":
        device["network_mode_preference"] = "2g_only"
    elif fault == "network_3g":
        device["network_mode_preference"] = "3g_only"
    elif fault == "sim_missing":
        device["sim_status"] = "missing"
    elif fault == "sim_locked":
        device["sim_status"] = "locked"
    elif fault in ("exhausted", "exhausted_data_off"):
        line["data_used_gb"] = _money(plan["data_gb"] + line["data_refueled_gb"])
        if fault == "exhausted_data_off":
            device["mobile_data_enabled"] = False
    elif fault == "airplane_data_off":
        device["airplane_mode"] = True
        device["mobile_data_enabled"] = False
    elif fault is not None and fault.startswith("abroad"):
        device["abroad"] = True
        if fault == "abroad_no_plan" or not plan["roaming_allowed"]:
            # the plan has no roaming at all: the line flag is necessarily off
            line["roaming_enabled"] = False
            device["data_roaming_enabled"] = rng.random() < 0.3
        elif fault == "abroad_both_off":
            line["roaming_enabled"] = False
            device["data_roaming_enabled"] = False
        elif fault == "abroad_line_off":
            line["roaming_enabled"] = False
            device["data_roaming_enabled"] = True
        else:  # abroad_phone_off
            line["roaming_enabled"] = True
            device["data_roaming_enabled"] = False


def build_db(seed: int, size: int) -> dict[str, dict[str, dict[str, Any]]]:
    """The telecom tables for ``size`` customers, a pure function of ``seed``."""
    rng = random.Random(seed)
    customers: dict[str, dict[str, Any]] = {}
    lines: dict[str, dict[str, Any]] = {}
    bills: dict[str, dict[str, Any]] = {}
    devices: dict[str, dict[str, Any]] = {}
    plans = {pid: {"plan_id": pid, **p} for pid, p in PLANS.items()}
    plan_ids = list(PLANS)
    used_phones: set[str] = set()
    used_names: set[tuple[str, str]] = set()
    fault_names = [f for f, _ in _FAULTS]
    fault_weights = [w for _, w in _FAULTS]
    line_no = 0
    for i in range(size):
        num = 1001 + i
        cid = f"C{num}"
        while True:
            name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
            dob = f"{rng.randint(1950, 2003)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            if (name, dob) not in used_names:
                used_names.add((name, dob))
                break
        city, state = rng.choice(_CITIES)
        n_lines = rng.choices([1, 2, 3], [0.55, 0.3, 0.15])[0]
        line_ids: list[str] = []
        monthly = 0.0
        overdue = rng.random() < 0.14
        suspend_for_debt = overdue and rng.random() < 0.65
        for j in range(n_lines):
            line_no += 1
            lid = f"L{20000 + line_no}"
            phone = _phone(rng, used_phones)
            plan_id = rng.choice(plan_ids)
            plan = PLANS[plan_id]
            line = {
                "line_id": lid,
                "customer_id": cid,
                "phone_number": phone,
                "plan_id": plan_id,
                "status": "active",
                "suspension_reason": None,
                "data_used_gb": _money(rng.uniform(0.0, 0.8) * plan["data_gb"]),
                "data_refueled_gb": 0.0,
                "roaming_enabled": plan["roaming_allowed"] and rng.random() < 0.2,
                "cycle_end": CYCLE_END,
                "activated_on": f"{rng.randint(2016, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            }
            device = _healthy_device(rng, cid, lid, phone)
            if suspend_for_debt and j == 0:
                line["status"] = "suspended"
                line["suspension_reason"] = "overdue_bill"
            else:
                _plant(rng, rng.choices(fault_names, fault_weights)[0], line, device)
            lines[lid] = line
            devices[phone] = device
            line_ids.append(lid)
            monthly += plan["price"]
        bill_ids: list[str] = []
        history = rng.randint(1, 3)
        months = ["2025-06", "2025-05", "2025-04", "2025-03"]
        for k in range(history + 1):
            period = months[history - k]
            bid = f"B{num}{k + 1:02d}"
            extra = _money(rng.choice([0.0, 0.0, rng.uniform(1.0, 30.0)]))
            items = [{"description": f"Monthly plans ({n_lines} line{'s' if n_lines > 1 else ''})",
                      "amount": _money(monthly)}]
            if extra:
                items.append({"description": "Usage charges and fees", "amount": extra})
            month = int(period[5:])
            status = "paid"
            if period == "2025-06":
                status = "issued"
            elif period == "2025-05" and overdue:
                status = "overdue"
            bills[bid] = {
                "bill_id": bid,
                "customer_id": cid,
                "period": period,
                "issue_date": f"2025-{month:02d}-01",
                "due_date": f"2025-{month:02d}-25",
                "amount": _money(monthly + extra),
                "items": items,
                "status": status,
                "payment_requested": False,
            }
            bill_ids.append(bid)
        first, last = name.split(" ")
        customers[cid] = {
            "customer_id": cid,
            "full_name": name,
            "dob": dob,
            "email": f"{first.lower()}.{last.lower()}{num % 100}@example.com",
            "address": {"street": f"{rng.randint(10, 9999)} {rng.choice(_STREETS)}", "city": city,
                        "state": state, "zip": f"{rng.randint(10000, 99999)}"},
            "phone_numbers": [lines[lid]["phone_number"] for lid in line_ids],
            "line_ids": line_ids,
            "bill_ids": bill_ids,
            "payment_method": f"{rng.choice(['Visa', 'Mastercard', 'Amex'])} ending {rng.randint(1000, 9999)}",
            "account_status": "active",
        }
    return {"customers": customers, "plans": plans, "lines": lines, "bills": bills, "devices": devices}
