"""The simulated user's tools: what a person can see and do on their own phone.

These act on ``devices[db.context["phone_number"]]`` only, never on another phone. What the phone can do
also depends on the account (a suspended line, an exhausted allowance, roaming off on the line), so the
speed test reads both tables: neither side alone can say whether data works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from muarl.db import DBView
from muarl.tools import ToolError, tool

#: Issues that stop mobile data entirely, in the order the phone hits them.
BLOCKING = (
    "airplane_mode",
    "sim_missing",
    "sim_locked",
    "line_suspended",
    "mobile_data_off",
    "roaming_not_in_plan",
    "roaming_line_off",
    "roaming_phone_off",
    "apn_broken",
    "needs_reboot",
    "data_exhausted",
)
#: Issues that leave data working but slow.
SLOW = ("slow_network_mode",)

_BASE_MBPS = {"4g_5g_preferred": 180.0, "4g_only": 60.0, "3g_only": 6.0, "2g_only": 0.3}
_NETWORK_LABEL = {"4g_only": "4G", "3g_only": "3G", "2g_only": "2G (E)"}


def connection_issues(db: DBView, device: Mapping[str, Any]) -> list[str]:
    """Every reason this phone's data is down or slow, blocking ones first (empty when all is well)."""
    issues: list[str] = []
    line = db.lines[device["line_id"]]
    plan = db.plans[line["plan_id"]]
    if device["airplane_mode"]:
        issues.append("airplane_mode")
    if device["sim_status"] == "missing":
        issues.append("sim_missing")
    elif device["sim_status"] == "locked":
        issues.append("sim_locked")
    if line["status"] != "active":
        issues.append("line_suspended")
    if not device["mobile_data_enabled"]:
        issues.append("mobile_data_off")
    if device["abroad"]:
        if not plan["roaming_allowed"]:
            issues.append("roaming_not_in_plan")
        elif not line["roaming_enabled"]:
            issues.append("roaming_line_off")
        if not device["data_roaming_enabled"]:
            issues.append("roaming_phone_off")
    if device["apn_settings"] != "ok":
        issues.append("apn_broken")
    elif device["apn_in_use"] != "ok":
        issues.append("needs_reboot")
    if line["data_used_gb"] >= plan["data_gb"] + line["data_refueled_gb"] - 1e-9:
        issues.append("data_exhausted")
    if device["network_mode_preference"] in ("3g_only", "2g_only"):
        issues.append("slow_network_mode")
    return issues


def _device(db: DBView) -> Mapping[str, Any]:
    phone = db.context.get("phone_number")
    if not phone or phone not in db.devices:
        raise ToolError("no phone is available in this conversation")
    return db.devices[phone]


def _edit_device(db: DBView) -> dict[str, Any]:
    return db.devices.edit(_device(db)["phone_number"])


def _has_service(db: DBView, device: Mapping[str, Any]) -> bool:
    return not device["airplane_mode"] and device["sim_status"] == "active"


def _network_type(device: Mapping[str, Any]) -> str:
    mode = device["network_mode_preference"]
    if mode == "4g_5g_preferred":
        return "5G" if device["signal_strength"] >= 3 else "4G"
    return _NETWORK_LABEL[mode]


def speed_test(db: DBView, device: Mapping[str, Any]) -> str:
    """The speed test text for this phone: no connection if any blocking issue, else a speed."""
    issues = connection_issues(db, device)
    if any(i in BLOCKING for i in issues):
        return "Speed test failed: no internet connection."
    factor = device["signal_strength"] / 4 * (0.5 if device["abroad"] else 1.0)
    mbps = round(_BASE_MBPS[device["network_mode_preference"]] * factor, 1)
    if mbps >= 50:
        label = "excellent"
    elif mbps >= 10:
        label = "good"
    elif mbps >= 1:
        label = "slow"
    else:
        label = "very slow"
    return f"Speed test: {mbps} Mbps download, {round(mbps / 4, 1)} Mbps upload ({label})."


@tool(actor="user")
def check_status_bar(db: DBView) -> str:
    """Look at the phone's status bar: airplane mode, signal bars, network type and the mobile data icon."""
    device = _device(db)
    line = db.lines[device["line_id"]]
    parts = [f"Airplane mode: {'ON (airplane icon shown)' if device['airplane_mode'] else 'off'}"]
    if device["airplane_mode"]:
        parts += ["Signal: no bars", "Network: none"]
    elif device["sim_status"] == "missing":
        parts += ["Signal: no bars", "Network: No SIM card"]
    elif device["sim_status"] == "locked":
        parts += ["Signal: no bars", "Network: SIM locked (PUK required)"]
    elif line["status"] != "active":
        parts += [f"Signal: {device['signal_strength']} of 4 bars", "Network: Emergency calls only"]
    else:
        roaming = " (roaming, R icon)" if device["abroad"] else ""
        parts += [f"Signal: {device['signal_strength']} of 4 bars", f"Network: {_network_type(device)}{roaming}"]
    blocked = any(i in BLOCKING for i in connection_issues(db, device))
    if not device["mobile_data_enabled"]:
        parts.append("Mobile data icon: not shown (mobile data is off)")
    elif blocked:
        parts.append("Mobile data icon: shown but no data is moving")
    else:
        parts.append("Mobile data icon: shown, data active")
    return "; ".join(parts)


@tool(actor="user")
def check_network_settings(db: DBView) -> dict[str, Any]:
    """Open the phone's mobile network settings screen and read what it shows."""
    device = _device(db)
    return {
        "mobile_data": "on" if device["mobile_data_enabled"] else "off",
        "data_roaming": "on" if device["data_roaming_enabled"] else "off",
        "preferred_network_mode": device["network_mode_preference"],
        "apn_settings": "default" if device["apn_settings"] == "ok" else "custom (modified, may be wrong)",
        "pending_restart": device["apn_in_use"] != device["apn_settings"],
        "currently_abroad": device["abroad"],
    }


@tool(write=True, actor="user")
def toggle_airplane_mode(db: DBView) -> str:
    """Turn airplane mode on if it is off, or off if it is on."""
    device = _edit_device(db)
    device["airplane_mode"] = not device["airplane_mode"]
    return f"Airplane mode is now {'ON' if device['airplane_mode'] else 'OFF'}."


@tool(write=True, actor="user")
def toggle_mobile_data(db: DBView) -> str:
    """Turn mobile data on if it is off, or off if it is on."""
    device = _edit_device(db)
    device["mobile_data_enabled"] = not device["mobile_data_enabled"]
    return f"Mobile data is now {'ON' if device['mobile_data_enabled'] else 'OFF'}."


@tool(write=True, actor="user")
def toggle_data_roaming(db: DBView) -> str:
    """Turn the phone's data roaming setting on if it is off, or off if it is on."""
    device = _edit_device(db)
    device["data_roaming_enabled"] = not device["data_roaming_enabled"]
    return f"Data roaming is now {'ON' if device['data_roaming_enabled'] else 'OFF'}."


@tool(actor="user")
def check_sim_status(db: DBView) -> str:
    """Look at the SIM card status in the phone's settings."""
    status = _device(db)["sim_status"]
    return {
        "active": "SIM card: detected and active.",
        "missing": "SIM card: not detected (no SIM).",
        "locked": "SIM card: locked, the phone asks for a PUK code.",
    }[status]


@tool(write=True, actor="user")
def reseat_sim_card(db: DBView) -> str:
    """Take the SIM card out of the phone and put it back in firmly."""
    device = _edit_device(db)
    if device["sim_status"] == "missing":
        device["sim_status"] = "active"
        return "SIM card re-inserted. The phone now detects the SIM card."
    if device["sim_status"] == "locked":
        return "SIM card re-inserted. The phone still asks for a PUK code."
    return "SIM card re-inserted. The SIM card is detected as before."


@tool(write=True, actor="user")
def reset_apn_settings(db: DBView) -> str:
    """Reset the phone's APN (access point) settings to the carrier defaults; applies after a restart."""
    device = _edit_device(db)
    device["apn_settings"] = "ok"
    return "APN settings reset to default. Restart the phone for the change to take effect."


@tool(write=True, actor="user")
def set_network_mode_preference(
    db: DBView, mode: Literal["4g_5g_preferred", "4g_only", "3g_only", "2g_only"]
) -> str:
    """Choose which mobile network generations the phone may use.

    Args:
        mode: One of "4g_5g_preferred", "4g_only", "3g_only", "2g_only".
    """
    device = _edit_device(db)
    device["network_mode_preference"] = mode
    return f"Preferred network mode set to {mode}."


@tool(write=True, actor="user")
def reboot_device(db: DBView) -> str:
    """Restart the phone (applies pending settings changes)."""
    device = _edit_device(db)
    device["apn_in_use"] = device["apn_settings"]
    return "The phone restarted."


@tool(actor="user")
def run_speed_test(db: DBView) -> str:
    """Run a mobile data speed test on the phone."""
    device = _device(db)
    return speed_test(db, device)


@tool(actor="user")
def check_payment_requests(db: DBView) -> list[dict[str, Any]]:
    """Open the carrier app and list the payment requests waiting for you."""
    device = _device(db)
    customer = db.customers[device["customer_id"]]
    return [
        {"bill_id": b, "amount": db.bills[b]["amount"], "period": db.bills[b]["period"]}
        for b in customer["bill_ids"]
        if db.bills[b]["payment_requested"] and db.bills[b]["status"] != "paid"
    ]


@tool(write=True, actor="user")
def make_payment(db: DBView, bill_id: str) -> str:
    """Pay a bill the agent sent you a payment request for, with the payment method on file.

    Args:
        bill_id: The bill id shown in the payment request, e.g. "B104502".
    """
    device = _device(db)
    customer = db.customers[device["customer_id"]]
    if bill_id not in customer["bill_ids"]:
        raise ToolError(f"no payment request for bill {bill_id} in your app")
    if not db.bills[bill_id]["payment_requested"] or db.bills[bill_id]["status"] == "paid":
        raise ToolError(f"no pending payment request for bill {bill_id} in your app")
    bill = db.bills.edit(bill_id)
    bill["status"] = "paid"  # payment_requested stays True: it records that the request was sent
    return f"Paid {bill['amount']:.2f} for bill {bill_id} with {customer['payment_method']}."


USER_TOOLS = [
    check_status_bar,
    check_network_settings,
    toggle_airplane_mode,
    toggle_mobile_data,
    toggle_data_roaming,
    check_sim_status,
    reseat_sim_card,
    reset_apn_settings,
    set_network_mode_preference,
    reboot_device,
    run_speed_test,
    check_payment_requests,
    make_payment,
]
