"""The telecom domain's teacher: account fixes with the agent's tools, phone fixes through the user.

Dual control: after finding the customer by phone number it diagnoses by asking the user to read their
phone, instructs one phone step at a time (:data:`STEP_WORDS`) and waits for each report, and makes the
account-side writes (refuel, roaming, plan, suspension, payment request, resume) only after proposing
them and hearing an explicit yes (:class:`~muarl.policies.script.TeacherSession`). With a ``slip_rate``
its account lookup may first be mistyped, then asked again (``TeacherSession.identify``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from muarl.policies.script import ANYTHING_ELSE, Script, TeacherSession, money
from muarl.types import Action, Intent


class TelecomTeacher(TeacherSession):
    """One telecom episode of the reference agent."""

    customer: Mapping[str, Any]
    cid: str
    line: Mapping[str, Any]

    def script(self) -> Script:
        k = self.known
        phone = k["phone_number"]
        ok = yield from self.need([phone], "I'm happy to help. To find your account, could you please give me the "
                                           "phone number of your line?")
        again = "I could not find an account with that number. Could you please give me the phone number again?"
        self.customer = (yield from self.identify("get_customer_by_phone", {"phone_number": phone}, again)) if ok else None
        if self.customer is None:
            yield from self.say("I'm sorry, I could not find your account, so I can't make changes.")
            return
        self.cid = self.customer["customer_id"]
        if "symptom" in self.task.scenario.withheld:
            yield from self.need([k["symptom"].split()[0]], "Thank you. What seems to be the problem with your phone?",
                                 tries=1)
        self.line = (yield from self.lookup("get_details_by_id", {"id": self._line_id(phone)})) or {}
        intents = self.task.scenario.intents
        fixing = False
        for intent in intents:
            if intent.question is not None:
                report = yield from self._info(intent)
                yield from self.say(f"{report} {ANYTHING_ELSE}")
                continue
            if intent.out_of_policy:
                yield from self._refuse(intent)
                continue
            if intent.action:
                yield from self._action(intent)
            if intent.user_actions:
                yield from self._phone_steps(intent.user_actions)
            fixing = fixing or bool(intent.user_actions) or not (intent.action or intent.question)
            if not intent.action and not intent.user_actions and not intent.question and not self.task.gold_actions:
                yield from self._locked_sim()
                return
        if fixing or "symptom" in k:
            yield from self.say("Could you please run a speed test on your phone and tell me the result?")
        yield from self.say(ANYTHING_ELSE)

    def _line_id(self, phone: str) -> str:
        """The id of the line with this number (privileged: which of the account's lines to open)."""
        return self.domain.database().view(self.task.context).devices[phone]["line_id"]

    def _info(self, intent: Intent) -> Script:
        bills = (yield from self.lookup("get_bills_for_customer", {"customer_id": self.cid})) or []
        want = "overdue" if "overdue" in (intent.question or "") else "issued"
        match = [b for b in bills if b["status"] == want]
        if not match:
            return f"I don't see any {want} bill on your account."
        bill = match[0] if want == "overdue" else match[-1]
        due = "it is overdue" if want == "overdue" else f"it is not due yet; the due date is {bill['due_date']}"
        return f"Your {'overdue' if want == 'overdue' else 'current'} bill {bill['bill_id']} ({bill['period']}) is " \
               f"{money(bill['amount'])}, and {due}."

    def _refuse(self, intent: Intent) -> Script:
        if intent.action == "refuel_data":
            usage = (yield from self.lookup("get_data_usage", {"customer_id": self.cid,
                                                               "line_id": intent.args["line_id"]})) or {}
            room = max(0.0, 2.0 - float(usage.get("data_refueled_gb", 0.0)))
            rule = "a line can receive at most 2 GB of refuel in total per billing cycle"
            first = (f"I'm sorry, but {rule}, so I can't add {intent.args['gb_amount']:g} GB. The most I could add "
                     f"this cycle is {room:g} GB.")
        else:
            bills = (yield from self.lookup("get_bills_for_customer", {"customer_id": self.cid})) or []
            overdue = next((b for b in bills if b["status"] == "overdue"), None)
            rule = "a line can only be resumed once the overdue bill is paid"
            amount = f" ({money(overdue['amount'])}, bill {overdue['bill_id']})" if overdue else ""
            first = (f"I'm sorry, but I can't resume your line while you have an overdue bill{amount}: {rule}. I can "
                     "send you a payment request for it whenever you are ready.")
        yield from self.refuse(first, f"I understand, but I can't make an exception: {rule}.")

    def _action(self, intent: Intent) -> Script:
        handlers = {
            "refuel_data": self._refuel,
            "enable_roaming": self._roaming,
            "change_plan": self._plan,
            "suspend_line": self._suspend,
            "send_payment_request": self._payment_request,
            "resume_line": self._resume,
        }
        return (yield from handlers[intent.action or ""](intent))

    def _line_words(self, line_id: str) -> str:
        phone = self.line.get("phone_number", "") if self.line.get("line_id") == line_id else ""
        return f"line {line_id} ({phone})" if phone else f"line {line_id}"

    def _refuel(self, intent: Intent) -> Script:
        usage = yield from self.lookup("get_data_usage", {"customer_id": self.cid, "line_id": intent.args["line_id"]})
        plan = (yield from self.lookup("get_details_by_id", {"id": self.line.get("plan_id", "")})) or {}
        per_gb = float(plan.get("refuel_price_per_gb", 0.0))
        used_up = usage is not None and usage.get("data_remaining_gb", 1) <= 0

        def propose(args: Mapping[str, Any]) -> Script:
            lead = "Your line has used up its data allowance for this cycle. " if used_up else ""
            return (f"{lead}I can add {args['gb_amount']:g} GB of data to {self._line_words(args['line_id'])} for "
                    f"{money(args['gb_amount'] * per_gb)} ({money(per_gb)} per GB), charged to your current bill.")
            yield

        done = yield from self.settle(intent, "refuel_data", propose)
        self.prefix = f"Done: {intent.args['gb_amount']:g} GB of data has been added to your line." if done else ""

    def _roaming(self, intent: Intent) -> Script:
        def propose(args: Mapping[str, Any]) -> Script:
            return (f"Roaming is currently disabled on {self._line_words(args['line_id'])}, and your plan includes "
                    "roaming. I can enable international roaming on this line.")
            yield

        done = yield from self.settle(intent, "enable_roaming", propose)
        self.prefix = "Roaming is now enabled on your line." if done else ""

    def _plan(self, intent: Intent) -> Script:
        plans = (yield from self.lookup("get_available_plans", {})) or []
        by_id = {p["plan_id"]: p for p in plans}

        def propose(args: Mapping[str, Any]) -> Script:
            p = by_id.get(args["plan_id"])
            if p is None:
                return None
            roam = "includes roaming" if p["roaming_allowed"] else "does not include roaming"
            return (f"The cheapest plan that meets your needs is {p['name']} ({p['plan_id']}): {p['data_gb']:g} GB "
                    f"of data per month for {money(p['price'])} per month, and it {roam}. I can move "
                    f"{self._line_words(args['line_id'])} from plan {self.line.get('plan_id')} to {p['plan_id']}.")
            yield

        done = yield from self.settle(intent, "change_plan", propose)
        if done:
            self.line = {**self.line, "plan_id": intent.args["plan_id"]}
        self.prefix = f"Your line is now on plan {intent.args['plan_id']}." if done else ""

    def _suspend(self, intent: Intent) -> Script:
        lost = self.known.get("lost_phone_number", "")
        ok = yield from self.need([lost], "Which phone number was lost?")
        if not ok:
            return
        yield from self.lookup("get_details_by_id", {"id": intent.args["line_id"]})

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"I will suspend line {args['line_id']} ({lost}) with the reason \"lost or stolen\", so it cannot "
                    f"be used for calls or data until it is resumed. Your own line {self.known['phone_number']} stays "
                    "active.")
            yield

        done = yield from self.settle(intent, "suspend_line", propose)
        report = f"Line {intent.args['line_id']} ({lost}) is now suspended." if done else "Nothing was suspended."
        yield from self.say(f"{report} {ANYTHING_ELSE}")

    def _payment_request(self, intent: Intent) -> Script:
        bills = (yield from self.lookup("get_bills_for_customer", {"customer_id": self.cid})) or []
        bill = next((b for b in bills if b["bill_id"] == intent.args["bill_id"]), None)
        amount = money(bill["amount"]) if bill else "the amount due"

        def propose(args: Mapping[str, Any]) -> Script:
            return (f"Your line is suspended because bill {args['bill_id']} ({amount}) is overdue; it must be paid "
                    f"before the line can be resumed. I can send a payment request for bill {args['bill_id']} to your "
                    "carrier app.")
            yield

        done = yield from self.settle(intent, "send_payment_request", propose)
        if done:
            self.prefix = (f"I've sent the payment request for bill {intent.args['bill_id']} ({amount}). Please open "
                           "your carrier app, check your payment requests and pay the bill, then let me know.")

    def _resume(self, intent: Intent) -> Script:
        bill_id = next((a.arguments.get("bill_id") for a in self.task.gold_actions if a.name == "make_payment"), None)
        if bill_id:
            yield from self.lookup("get_details_by_id", {"id": bill_id})

        def propose(args: Mapping[str, Any]) -> Script:
            return f"Your overdue bill is now paid. I can resume {self._line_words(args['line_id'])}."
            yield

        done = yield from self.settle(intent, "resume_line", propose)
        self.prefix = "Your line is active again." if done else ""

    def _phone_steps(self, steps: list[Action]) -> Script:
        """Diagnose, then one instruction per phone step, each waiting for the user's report."""
        first = steps[0].name
        if first in ("toggle_airplane_mode", "reseat_sim_card"):
            yield from self.say("Could you please look at the status bar at the top of your phone's screen and tell "
                                "me what it shows?")
        elif first != "make_payment":
            yield from self.say("Could you please open your phone's mobile network settings and tell me what they "
                                "show?")
        for step in steps:
            if step.name == "make_payment":
                if self.prefix:
                    yield from self.say("")
                continue
            yield from self.say(STEP_WORDS.get(step.name, f"Please do this on your phone: {step.name}."))

    def _locked_sim(self) -> Script:
        yield from self.say("Could you please look at the status bar at the top of your phone's screen and tell me "
                            "what it shows?")
        yield from self.call("transfer_to_human_agents", {
            "summary": f"Customer {self.cid}: the SIM of {self.known['phone_number']} is PUK-locked; it needs "
                       "unlocking, which I cannot do with my tools."})


STEP_WORDS: dict[str, str] = {
    "toggle_airplane_mode": "Airplane mode is on. Please turn off airplane mode, then tell me what you see.",
    "reseat_sim_card": "Your phone does not detect the SIM card. Please take the SIM card out of the phone and put "
                       "it back in firmly, then tell me what happens.",
    "toggle_mobile_data": "Mobile data is switched off. Please turn on mobile data in your settings.",
    "toggle_data_roaming": "Please turn on data roaming in your phone's settings.",
    "reset_apn_settings": "Your APN settings have been modified. Please reset your APN settings to the default.",
    "reboot_device": "Now please restart your phone so the settings take effect.",
    "set_network_mode_preference": "Your phone is limited to an old network generation. Please set the preferred "
                                   "network mode to 4g_5g_preferred (4G/5G preferred).",
}
