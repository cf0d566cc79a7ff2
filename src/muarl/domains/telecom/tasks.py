"""Telecom task families: each reads a customer's account and phone state and drafts a solvable task.

The reference solver is the family itself: it picks a line whose state (computed by
:func:`connection_issues`, the same logic the phone's speed test uses) fits the family, then writes the
gold actions, both the agent's account writes and the user's phone steps (``actor="user"``), so that
replaying them leaves the line and the phone working. Families never look at fault labels: there are
none in the data, only states.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from muarl.db import DBView
from muarl.domain import Domain
from muarl.taskgen import Draft, Family, generate
from muarl.types import Action, Intent, Scenario, Task

from .user_tools import connection_issues

_OCCUPATIONS = ["nurse on night shifts", "university student", "retired teacher", "delivery driver",
                "freelance designer", "small-business owner", "software tester", "restaurant manager",
                "sales representative", "graduate researcher", "electrician", "flight attendant"]
_TRAITS = ["polite", "impatient", "not tech-savvy", "terse", "chatty", "skeptical", "anxious", "in a hurry",
           "friendly", "easily confused by jargon"]
_COUNTRIES = ["Spain", "Japan", "Mexico", "Canada", "Italy", "Portugal", "Germany", "Thailand", "France"]

_PHONE_RULES = (
    "You can only act on your phone through your phone tools. Do only the steps the agent asks for, one at "
    "a time, and tell the agent what you see after each one; do not try fixes on your own."
)

#: Phone-side problems a user can fix alone, and the steps the reference solver prescribes.
_PHONE_FIXES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "airplane_mode": [("toggle_airplane_mode", {})],
    "sim_missing": [("reseat_sim_card", {})],
    "mobile_data_off": [("toggle_mobile_data", {})],
    "apn_broken": [("reset_apn_settings", {}), ("reboot_device", {})],
    "needs_reboot": [("reboot_device", {})],
    "slow_network_mode": [("set_network_mode_preference", {"mode": "4g_5g_preferred"})],
}

_SYMPTOMS: dict[str, str] = {
    "airplane_mode": "your phone shows no signal at all: no calls, no texts, no mobile internet",
    "sim_missing": "since you dropped your phone yesterday it shows no signal and you cannot call or use data",
    "mobile_data_off": "mobile internet does not work anywhere, although calls and texts work",
    "apn_broken": "mobile internet stopped working after you changed some settings last week; calls still work",
    "needs_reboot": "mobile internet has not worked since you changed a setting yesterday; calls still work",
    "slow_network_mode": "mobile internet works but is painfully slow; pages take minutes to load",
    "data_exhausted": "mobile internet stopped working a few days ago; you suspect you used up your data",
}


# -- helpers ----------------------------------------------------------------------------------------
def _user_action(name: str, args: Mapping[str, Any] | None = None) -> Action:
    return Action(name=name, arguments=dict(args or {}), actor="user")


def _persona(rng: random.Random, customer: Mapping[str, Any]) -> tuple[str, list[str]]:
    traits = rng.sample(_TRAITS, rng.choice([1, 2]))
    job = rng.choice(_OCCUPATIONS)
    return f"{customer['full_name']}, {'an' if job[0] in 'aeiou' else 'a'} {job}", traits


def _known(rng: random.Random, customer: Mapping[str, Any], phone: str) -> dict[str, str]:
    known = {"full_name": customer["full_name"], "dob": customer["dob"], "phone_number": phone}
    if rng.random() < 0.3:
        known["customer_id"] = customer["customer_id"]
    return known


def _identity(known: Mapping[str, str], withheld: Sequence[str] = ()) -> str:
    text = f"You are {known['full_name']} (date of birth {known['dob']}). Your phone number is {known['phone_number']}."
    if "customer_id" in known:
        text += f" Your customer id is {known['customer_id']}."
    if "phone_number" in withheld:
        text += " Do not give your phone number until the agent asks for it."
    return text


def _style(traits: Sequence[str]) -> str:
    return f"You are {' and '.join(traits)}."


def _lines(db: DBView, user_id: str) -> list[tuple[Mapping[str, Any], Mapping[str, Any], list[str]]]:
    """(line, device, issues) for every line of the customer."""
    out = []
    for lid in db.customers[user_id]["line_ids"]:
        line = db.lines[lid]
        device = db.devices[line["phone_number"]]
        out.append((line, device, connection_issues(db, device)))
    return out


def _pick(rng: random.Random, db: DBView, user_id: str,
          fits: Callable[[Mapping[str, Any], Mapping[str, Any], list[str]], bool]
          ) -> tuple[Mapping[str, Any], Mapping[str, Any], list[str]] | None:
    hosts = [h for h in _lines(db, user_id) if fits(*h)]
    return rng.choice(hosts) if hosts else None


def _only_phone_issue(issues: list[str]) -> bool:
    return len(issues) == 1 and issues[0] in _PHONE_FIXES


def _draft(scenario: Scenario, instruction: str, gold: list[Action], phone: str,
           outputs: Sequence[str] = ()) -> Draft:
    return Draft(scenario=scenario, instruction=instruction, gold_actions=gold,
                 required_outputs=list(outputs), context={"phone_number": phone})


def _refuel_price(db: DBView, line: Mapping[str, Any]) -> float:
    return db.plans[line["plan_id"]]["refuel_price_per_gb"]


def _exhausted_only(line: Mapping[str, Any], device: Mapping[str, Any], issues: list[str]) -> bool:
    return issues == ["data_exhausted"] and line["data_refueled_gb"] == 0


# -- phone-side fixes -------------------------------------------------------------------------------
def _phone_fix(rng: random.Random, db: DBView, user_id: str, issue_keys: Sequence[str],
               withheld: Sequence[str] = ()) -> Draft | None:
    """A connectivity problem on the phone only; the agent must walk the user through the fix."""
    host = _pick(rng, db, user_id, lambda line, device, issues: _only_phone_issue(issues)
                 and issues[0] in issue_keys)
    if host is None:
        return None
    line, device, issues = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    steps = [_user_action(n, a) for n, a in _PHONE_FIXES[issues[0]]]
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = _SYMPTOMS[issues[0]]
    slow = issues[0] == "slow_network_mode"
    goal = "Get normal mobile data speed back" if slow else "Get mobile data working again"
    scenario = Scenario(
        persona=persona, known=known, withheld=list(withheld), traits=traits,
        intents=[Intent(description=f"{goal} on your phone {phone}", user_actions=steps)],
    )
    opening = ("You only say that 'something is wrong with your phone' and describe the problem only when "
               "the agent asks what is happening. " if "symptom" in withheld else "")
    instruction = (
        f"{_identity(known, withheld)} Your problem: {known['symptom']}. You want it fixed. {opening}"
        f"{_PHONE_RULES} When the agent says it should work now, run a speed test; once it shows a "
        f"{'good' if slow else 'working'} speed, thank the agent and end the conversation. {_style(traits)}"
    )
    return _draft(scenario, instruction, steps, phone)


def family_airplane_mode(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _phone_fix(rng, db, user_id, ["airplane_mode"])


def family_mobile_data_off(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _phone_fix(rng, db, user_id, ["mobile_data_off"])


def family_apn_reset(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _phone_fix(rng, db, user_id, ["apn_broken", "needs_reboot"])


def family_network_mode(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _phone_fix(rng, db, user_id, ["slow_network_mode"])


def family_sim_reseat(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    return _phone_fix(rng, db, user_id, ["sim_missing"])


def family_withheld_info(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Any phone-side fault, but the user keeps back their number and/or the symptom until asked."""
    withheld = rng.choice([["phone_number"], ["symptom"], ["phone_number", "symptom"]])
    return _phone_fix(rng, db, user_id, list(_PHONE_FIXES), withheld=withheld)


def family_multi_phone_settings(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Two phone settings are wrong at once; fixing only the first still leaves no data."""
    host = _pick(rng, db, user_id, lambda line, device, issues: issues == ["airplane_mode", "mobile_data_off"])
    if host is None:
        return None
    line, _, _ = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    steps = [_user_action("toggle_airplane_mode"), _user_action("toggle_mobile_data")]
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = "after a flight yesterday your phone still has no service and no mobile internet"
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Get service and mobile data working again on {phone}", user_actions=steps)])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. You fiddled with several settings on the "
        f"plane and do not remember which. {_PHONE_RULES} Only end the conversation once a speed test "
        f"shows a working connection. {_style(traits)}"
    )
    return _draft(scenario, instruction, steps, phone)


def family_sim_locked_transfer(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """No fix exists in the tools (a PUK-locked SIM): the agent must transfer, changing nothing."""
    host = _pick(rng, db, user_id, lambda line, device, issues: issues == ["sim_locked"])
    if host is None:
        return None
    line, _, _ = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = "after you typed a wrong PIN several times your phone asks for a PUK code and has no signal"
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Get the SIM of {phone} unlocked (needs a human agent)")])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. You do not have the PUK code. {_PHONE_RULES} "
        f"If the agent transfers you to a human agent, accept it. {_style(traits)}"
    )
    return _draft(scenario, instruction, [], phone)


# -- account-side fixes -----------------------------------------------------------------------------
def _refuel_action(user_id: str, line: Mapping[str, Any], gb: float) -> Action:
    return Action(name="refuel_data", arguments={"customer_id": user_id, "line_id": line["line_id"],
                                                 "gb_amount": gb})


def family_data_refuel(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The allowance is used up; the agent refuels what the user asks for (within the limit)."""
    host = _pick(rng, db, user_id, _exhausted_only)
    if host is None:
        return None
    line, _, _ = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    gb = rng.choice([1.0, 1.5, 2.0])
    action = _refuel_action(user_id, line, gb)
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = _SYMPTOMS["data_exhausted"]
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Get {gb:g} GB of extra data on line {phone}", action="refuel_data",
               args=dict(action.arguments), preferences={"max_price": round(gb * _refuel_price(db, line), 2)})])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. You want {gb:g} GB of extra data to get "
        f"through to the end of the month, and you accept the price the agent quotes. {_PHONE_RULES} "
        f"{_style(traits)}"
    )
    return _draft(scenario, instruction, [action], phone)


def family_refuel_change_of_mind(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The user asks for one amount, hears the price and settles for another; gold is the final one."""
    host = _pick(rng, db, user_id, _exhausted_only)
    if host is None:
        return None
    line, _, _ = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    first, final = rng.choice([(2.0, 1.0), (2.0, 0.5), (1.5, 1.0), (1.0, 2.0)])
    action = _refuel_action(user_id, line, final)
    first_args = {**action.arguments, "gb_amount": first}
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = _SYMPTOMS["data_exhausted"]
    why = ("that is more than you want to spend" if final < first
           else "you realise you will need more for a trip next week")
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Refuel data on line {phone}: first ask {first:g} GB, then settle for {final:g} GB",
               action="refuel_data", args=dict(action.arguments), first_args=first_args)])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. Ask for {first:g} GB of extra data. When the "
        f"agent tells you the price, before confirming anything, change your mind because {why}: ask for "
        f"{final:g} GB instead, and confirm only that. {_PHONE_RULES} {_style(traits)}"
    )
    return _draft(scenario, instruction, [action], phone)


def family_refuel_over_limit(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Out of policy: the user insists on more than the 2 GB cycle limit; nothing may be written."""
    host = _pick(rng, db, user_id, _exhausted_only)
    if host is None:
        return None
    line, _, _ = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    gb = rng.choice([3.0, 4.0, 5.0])
    args = {"customer_id": user_id, "line_id": line["line_id"], "gb_amount": gb}
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = _SYMPTOMS["data_exhausted"]
    scenario = Scenario(persona=persona, known=known, traits=[*traits, "insistent"], intents=[
        Intent(description=f"Get {gb:g} GB of extra data at once on line {phone}", action="refuel_data",
               args=args, out_of_policy=True)])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. You need exactly {gb:g} GB of extra data in "
        f"one go and you refuse any smaller amount or a plan change. If the agent refuses, insist twice; if it "
        f"still refuses, end the conversation. {_style(traits)}"
    )
    return _draft(scenario, instruction, [], phone)


def family_multi_refuel_data_toggle(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Two causes at once: mobile data switched off on the phone and the allowance used up."""
    host = _pick(rng, db, user_id, lambda line, device, issues: issues == ["mobile_data_off", "data_exhausted"]
                 and line["data_refueled_gb"] == 0)
    if host is None:
        return None
    line, _, _ = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    gb = rng.choice([1.0, 2.0])
    steps = [_user_action("toggle_mobile_data")]
    action = _refuel_action(user_id, line, gb)
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = "mobile internet does not work; you turned some settings off and on trying to fix it"
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Get mobile data working again on {phone}", user_actions=steps),
        Intent(description=f"If data is used up, refuel {gb:g} GB", action="refuel_data",
               args=dict(action.arguments)),
    ])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. If the agent says your data allowance is used "
        f"up, you want {gb:g} GB of extra data and accept the price. {_PHONE_RULES} Only end the conversation "
        f"once a speed test shows a working connection. {_style(traits)}"
    )
    return _draft(scenario, instruction, [*steps, action], phone)


def family_roaming_abroad(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Abroad without data: roaming must be on both on the line (agent) and in the phone (user)."""
    wanted = {"roaming_line_off", "roaming_phone_off"}
    host = _pick(rng, db, user_id, lambda line, device, issues: bool(issues) and set(issues) <= wanted)
    if host is None:
        return None
    line, _, issues = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    gold: list[Action] = []
    intents: list[Intent] = []
    if "roaming_line_off" in issues:
        args = {"customer_id": user_id, "line_id": line["line_id"]}
        gold.append(Action(name="enable_roaming", arguments=args))
        intents.append(Intent(description=f"Enable roaming on line {phone}", action="enable_roaming", args=args))
    steps = [_user_action("toggle_data_roaming")] if "roaming_phone_off" in issues else []
    gold += steps
    if steps:
        intents.append(Intent(description="Get mobile data working while abroad", user_actions=steps))
    country = rng.choice(_COUNTRIES)
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = f"you just landed in {country} and mobile internet does not work"
    known["location"] = country
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=intents)
    instruction = (
        f"{_identity(known)} You are travelling: {known['symptom']}. You want it working for your trip and "
        f"accept roaming on your line. {_PHONE_RULES} Only end the conversation once a speed test shows a "
        f"working connection. {_style(traits)}"
    )
    return _draft(scenario, instruction, gold, phone)


def _cheapest_plan(db: DBView, min_data: float, roaming: bool, exclude: str) -> str | None:
    fits = [db.plans[p] for p in db.plans if db.plans[p]["data_gb"] >= min_data
            and (db.plans[p]["roaming_allowed"] or not roaming) and p != exclude]
    return min(fits, key=lambda p: (p["price"], p["plan_id"]))["plan_id"] if fits else None


def family_roaming_plan_upgrade(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Several actions: abroad on a plan without roaming, so change plan, enable roaming, phone roaming on."""
    allowed = {"roaming_not_in_plan", "roaming_phone_off"}
    host = _pick(rng, db, user_id, lambda line, device, issues: "roaming_not_in_plan" in issues
                 and set(issues) <= allowed)
    if host is None:
        return None
    line, _, issues = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    current = db.plans[line["plan_id"]]
    min_data = max(current["data_gb"], rng.choice([0.0, 0.0, 20.0, 30.0]))
    plan_id = _cheapest_plan(db, min_data, True, line["plan_id"])
    if plan_id is None:
        return None
    ids = {"customer_id": user_id, "line_id": line["line_id"]}
    change = Action(name="change_plan", arguments={**ids, "plan_id": plan_id})
    enable = Action(name="enable_roaming", arguments=dict(ids))
    steps = [_user_action("toggle_data_roaming")] if "roaming_phone_off" in issues else []
    country = rng.choice(_COUNTRIES)
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = f"you are in {country} for two weeks and mobile internet does not work"
    known["location"] = country
    need = (f"at least {min_data:g} GB of data" if min_data > current["data_gb"]
            else "no less data than your current plan")
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description="Switch to the cheapest plan with roaming that meets your data need",
               action="change_plan", args=dict(change.arguments),
               preferences={"roaming": True, "min_data_gb": min_data, "cheapest": True}),
        Intent(description=f"Enable roaming on line {phone}", action="enable_roaming", args=dict(ids)),
        Intent(description="Get mobile data working abroad", user_actions=steps),
    ])
    instruction = (
        f"{_identity(known)} You are travelling: {known['symptom']}. If your plan has no roaming, you are "
        f"willing to switch plans: you want the cheapest plan that includes roaming and has {need}. Accept "
        f"roaming on your line. {_PHONE_RULES} Only end the conversation once a speed test shows a working "
        f"connection. {_style(traits)}"
    )
    return _draft(scenario, instruction, [change, enable, *steps], phone)


# -- bills and suspended lines ----------------------------------------------------------------------
def _debt_host(db: DBView, user_id: str) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """The customer's line suspended for a single overdue bill, with an otherwise healthy phone."""
    customer = db.customers[user_id]
    overdue = [db.bills[b] for b in customer["bill_ids"] if db.bills[b]["status"] == "overdue"]
    if len(overdue) != 1:
        return None
    for line, _, issues in _lines(db, user_id):
        if line["suspension_reason"] == "overdue_bill" and issues == ["line_suspended"]:
            return line, overdue[0]
    return None


def family_pay_and_resume(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Dual control over money: agent sends a payment request, user pays in the app, agent resumes."""
    host = _debt_host(db, user_id)
    if host is None:
        return None
    line, bill = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    ids = {"customer_id": user_id, "line_id": line["line_id"]}
    request = Action(name="send_payment_request", arguments={"customer_id": user_id, "bill_id": bill["bill_id"]})
    pay = _user_action("make_payment", {"bill_id": bill["bill_id"]})
    resume = Action(name="resume_line", arguments=ids)
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = "your phone only allows emergency calls since last week"
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Pay the overdue bill {bill['bill_id']} of {bill['amount']:.2f}",
               action="send_payment_request", args=dict(request.arguments), user_actions=[pay]),
        Intent(description=f"Get line {phone} working again", action="resume_line", args=ids),
    ])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. You forgot to pay a bill and you are willing "
        f"to pay it now through a payment request in your carrier app (check your payment requests and pay "
        f"when the agent says it sent one). Then you want your line working again. {_PHONE_RULES} "
        f"{_style(traits)}"
    )
    return _draft(scenario, instruction, [request, pay, resume], phone)


def family_resume_overdue_insist(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Out of policy: resume a line while its bill stays unpaid; the agent must refuse, nothing written."""
    host = _debt_host(db, user_id)
    if host is None:
        return None
    line, bill = host
    customer = db.customers[user_id]
    phone = line["phone_number"]
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["symptom"] = "your line was suspended and the phone only allows emergency calls"
    scenario = Scenario(persona=persona, known=known, traits=[*traits, "insistent"], intents=[
        Intent(description=f"Get line {phone} resumed without paying the overdue bill now", action="resume_line",
               args={"customer_id": user_id, "line_id": line["line_id"]}, out_of_policy=True)])
    instruction = (
        f"{_identity(known)} Your problem: {known['symptom']}. You know a bill of about {bill['amount']:.0f} "
        f"dollars is late, but you get paid only next week and you refuse to pay anything or receive a payment "
        f"request today. You want the line resumed right now anyway. Insist twice if refused, then end the "
        f"conversation. {_style(traits)}"
    )
    return _draft(scenario, instruction, [], phone)


def family_bill_inquiry(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """Information request: the agent must read a bill and say its exact amount."""
    customer = db.customers[user_id]
    bills = [db.bills[b] for b in customer["bill_ids"]]
    overdue = [b for b in bills if b["status"] == "overdue"]
    issued = [b for b in bills if b["status"] == "issued"]
    if overdue and rng.random() < 0.6:
        bill, which = overdue[0], "overdue"
        question = "How much is my overdue bill?"
    elif issued:
        bill, which = issued[-1], "current"
        question = "How much is my current bill for this month, and is it already due?"
    else:
        return None
    phone = customer["phone_numbers"][0]
    answer = f"{bill['amount']:.2f}"
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Learn the amount of your {which} bill", question=question, answer=answer)])
    instruction = (
        f"{_identity(known)} You want to know the exact amount of your {which} bill. Ask: \"{question}\" You "
        f"do not want to pay now or change anything on your account; once you have the amount, end the "
        f"conversation. {_style(traits)}"
    )
    return _draft(scenario, instruction, [], phone, outputs=[answer])


def family_suspend_lost_line(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """A second phone on the account was lost: suspend that line, not the one the user calls from."""
    lines = _lines(db, user_id)
    if len(lines) < 2:
        return None
    lost = [line for line, _, _ in lines if line["status"] == "active"]
    if not lost:
        return None
    lost_line = rng.choice(lost)
    caller = rng.choice([line for line, _, _ in lines if line["line_id"] != lost_line["line_id"]])
    customer = db.customers[user_id]
    phone = caller["phone_number"]
    args = {"customer_id": user_id, "line_id": lost_line["line_id"], "reason": "lost_or_stolen"}
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    known["lost_phone_number"] = lost_line["phone_number"]
    who = rng.choice(["your teenage son", "your partner", "you (it is your second phone)", "your daughter"])
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Suspend the lost line {lost_line['phone_number']}", action="suspend_line",
               args=args)])
    instruction = (
        f"{_identity(known)} You are calling from {phone}. The phone with number {lost_line['phone_number']}, "
        f"used by {who} and on your account, was lost this afternoon. You want that line suspended so nobody "
        f"can use it. Do not touch your own line. {_style(traits)}"
    )
    return _draft(scenario, instruction, [Action(name="suspend_line", arguments=args)], phone)


def family_change_plan(rng: random.Random, db: DBView, user_id: str) -> Draft | None:
    """The user states needs; the solver picks the cheapest plan that meets them."""
    host = _pick(rng, db, user_id, lambda line, device, issues: not issues)
    if host is None:
        return None
    line, _, _ = host
    min_data = rng.choice([5.0, 10.0, 15.0, 20.0, 30.0, 50.0])
    roaming = rng.random() < 0.4 or line["roaming_enabled"]
    plan_id = _cheapest_plan(db, min_data, roaming, "")
    if plan_id is None or plan_id == line["plan_id"]:
        return None
    customer = db.customers[user_id]
    phone = line["phone_number"]
    args = {"customer_id": user_id, "line_id": line["line_id"], "plan_id": plan_id}
    persona, traits = _persona(rng, customer)
    known = _known(rng, customer, phone)
    need = f"at least {min_data:g} GB of data per month" + (" and roaming for travel abroad" if roaming else "")
    scenario = Scenario(persona=persona, known=known, traits=traits, intents=[
        Intent(description=f"Move line {phone} to the cheapest plan with {need}", action="change_plan",
               args=args, preferences={"min_data_gb": min_data, "roaming": roaming, "cheapest": True})])
    instruction = (
        f"{_identity(known)} You want to change the plan of your line {phone}: you need {need}, and among "
        f"plans that do that you want the cheapest one. You do not know the plan names; let the agent "
        f"propose. {_style(traits)}"
    )
    return _draft(scenario, instruction, [Action(name="change_plan", arguments=args)], phone)


#: name -> (sampling weight, family)
FAMILIES: dict[str, tuple[float, Family]] = {
    "airplane_mode": (1.0, family_airplane_mode),
    "mobile_data_off": (1.0, family_mobile_data_off),
    "apn_reset": (1.0, family_apn_reset),
    "network_mode": (0.9, family_network_mode),
    "sim_reseat": (0.9, family_sim_reseat),
    "withheld_info": (1.0, family_withheld_info),
    "multi_phone_settings": (0.6, family_multi_phone_settings),
    "sim_locked_transfer": (0.4, family_sim_locked_transfer),
    "data_refuel": (1.0, family_data_refuel),
    "refuel_change_of_mind": (0.8, family_refuel_change_of_mind),
    "out_of_policy_refuel": (0.8, family_refuel_over_limit),
    "multi_refuel_data_toggle": (0.6, family_multi_refuel_data_toggle),
    "roaming_abroad": (1.1, family_roaming_abroad),
    "roaming_plan_upgrade": (0.7, family_roaming_plan_upgrade),
    "pay_and_resume": (0.8, family_pay_and_resume),
    "out_of_policy_resume": (0.7, family_resume_overdue_insist),
    "info_bill_amount": (0.8, family_bill_inquiry),
    "suspend_lost_line": (0.6, family_suspend_lost_line),
    "change_plan": (0.7, family_change_plan),
}


def build_tasks(domain: Domain, seed: int, counts: Mapping[str, int]) -> list[Task]:
    """The telecom task set: every customer may host tasks; splits are fixed per customer by taskgen."""
    users = list(domain.database().tables["customers"])
    return generate(domain, seed, counts, FAMILIES, users=users)
