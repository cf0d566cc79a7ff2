"""How a telecom customer words its requests, checks proposals and works its own phone (dual control).

The conversation itself is the generic engine's (:mod:`muarl.users.scripted`); this module knows the
phone: which instructions name which of the user's tools (:mod:`muarl.domains.telecom.user_tools`), that
a toggle is checked before it is flipped (so "turn off X" never turns an already-off X on), how the
phone's screens are read out, and that a customer whose data was broken runs a speed test before it says
goodbye (a connectivity intent is settled by the speed test, not by a proposal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from muarl.domains.service_script import Check, ServiceUserScript
from muarl.users.base import Act, UserReply
from muarl.users.phrases import first_person, sentences

if TYPE_CHECKING:
    from muarl.types import Intent, Task
    from muarl.users.scripted import Goal, ScriptedSession

# -- phone instructions ------------------------------------------------------------------------------------
#: toggle tool -> (label, the read tool showing its state, the field in that tool's output)
TOGGLES: dict[str, tuple[str, str, str]] = {
    "toggle_airplane_mode": ("Airplane mode", "check_status_bar", "airplane_mode"),
    "toggle_mobile_data": ("Mobile data", "check_network_settings", "mobile_data"),
    "toggle_data_roaming": ("Data roaming", "check_network_settings", "data_roaming"),
}
READ_STEPS = {"check_status_bar", "check_network_settings", "check_sim_status", "run_speed_test",
              "check_payment_requests"}
_IMPERATIVE = re.compile(
    r"\b(turn|switch|toggle|disable|enable|deactivate|activate|reset|restart|reboot|power|reseat|remove|"
    r"reinsert|re-insert|insert|take|put|pop|set|change|select|choose|run|perform|do|try|make|pay|open|go to|"
    r"navigate|tap|complete|settle)\b")
_AGENT_SELF = re.compile(r"^(i|i'll|i've|i'm|i will|i have|i can|i could|let me|we|we'll|we've|shall i|should i|"
                         r"may i|can i)\b|\b(shall|should|can|may) i\b|\bwould you like me\b|\bwant me to\b|"
                         r"\bi('ll| will| can|'ve| have) (now )?(enable|turn|send|change|switch|refuel|add|set)\w*")
_STEP_KEYS: list[tuple[str, str]] = [
    ("toggle_airplane_mode", r"\b(airplane|aeroplane|flight|plane) mode\b"),
    ("toggle_data_roaming", r"\bdata roaming\b|\broaming\b.{0,40}\b(phone|settings?|device)\b|"
                            r"\b(phone|settings?|device)\b.{0,40}\broaming\b"),
    ("toggle_mobile_data", r"\b(mobile|cellular) data\b|\bdata connection\b|\bmobile internet\b"),
    ("reset_apn_settings", r"\bapns?\b|\baccess point\b"),
    ("reboot_device", r"\b(restart|reboot)\b|\bpower (it |your phone |the phone )?(off|cycle)\b|"
                      r"\bturn (it|your phone|the phone|your device) off and (back )?on\b"),
    ("reseat_sim_card", r"\bsim\b.{0,40}(\bout\b|reseat|remov|reinsert|re-insert|back in|\btake\b|insert)|"
                        r"\b(reseat|remov|reinsert|re-insert|take out|pop out|take)\w*.{0,30}\bsim\b"),
    ("set_network_mode_preference", r"\bnetwork mode\b|\bpreferred network\b|\bnetwork type\b|\b4g|\b5g\b|\blte\b"),
    ("run_speed_test", r"\bspeed ?test\b|\btest (your|the) (speed|connection|data|internet)\b"),
    ("make_payment", r"\bpayment requests?\b.{0,80}\bpay\b|\bpay\b.{0,60}\b(bill|request|app)\b|"
                     r"\bcarrier app\b|\bmake (the|a) payment\b"),
]
_CHECK_KEYS: list[tuple[str, str]] = [
    ("check_sim_status", r"\bsim\b"),
    ("check_status_bar", r"\bstatus bar\b|\bsignal (bars|icon|strength|indicator)\b|\btop of (your|the) screen\b|"
                         r"\b(airplane|aeroplane|flight) mode\b"),
    ("check_network_settings", r"\b(network|mobile|cellular|data) settings\b|\bapn\b|\bnetwork mode\b|"
                               r"\b(mobile|cellular) data\b|\bdata roaming\b"),
    ("run_speed_test", r"\bspeed ?test\b"),
    ("check_payment_requests", r"\bpayment requests?\b"),
]


def _want(sentence: str, name: str) -> bool:
    """The state a toggle instruction asks for; without a clear word, the state that fixes data."""
    off = re.search(r"\b(turn|switch|toggle|set|put|make sure|ensure|is)\b.{0,40}\boff\b|\b(disable|deactivate)\b",
                    sentence) and not re.search(r"\boff and (back )?on\b", sentence)
    on = re.search(r"\b(turn|switch|toggle|set|put|make sure|ensure|is)\b.{0,40}\bon\b|\b(enable|activate)\b", sentence)
    if off and not on:
        return False
    if on and not off:
        return True
    return name != "toggle_airplane_mode"


def _network_mode(sentence: str) -> str:
    if re.search(r"\b4g[ _-]?only\b|\blte[ _-]?only\b", sentence):
        return "4g_only"
    return "4g_5g_preferred"


def phone_plan(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The phone steps instructed in ``text``, in order; a check when the agent only asks to look."""
    actions: list[tuple[str, dict[str, Any]]] = []
    checks: list[tuple[str, dict[str, Any]]] = []
    for sentence in sentences(text):
        imperative = _IMPERATIVE.search(sentence) is not None
        self_talk = _AGENT_SELF.search(sentence) is not None and not re.search(r"\byou\b", sentence)
        if re.search(r"\b(shall|should|can|may) i\b|\bwould you like me\b|\bwant me to\b", sentence):
            self_talk = True
        found = False
        if imperative and not self_talk:
            for name, pattern in _STEP_KEYS:
                if not re.search(pattern, sentence):
                    continue
                if name == "set_network_mode_preference" and not re.search(r"\b(set|change|switch|select|choose)\b",
                                                                           sentence):
                    continue
                if name in TOGGLES and re.search(r"\b(check|look|see|whether|tell me|is it|is your)\b", sentence) \
                        and not re.search(r"\b(turn|switch|toggle|disable|enable|deactivate|activate)\b", sentence):
                    continue
                args: dict[str, Any] = {}
                if name in TOGGLES:
                    args = {"want": _want(sentence, name)}
                elif name == "set_network_mode_preference":
                    args = {"mode": _network_mode(sentence)}
                if (name, args) not in actions:
                    actions.append((name, args))
                found = True
                if name == "toggle_data_roaming":
                    break
        if not found and not self_talk and re.search(r"\b(check|look|see|tell me|what does|what do|is there|is your|"
                                                     r"are you seeing|open|read|whether)\b|^(is|are|does|do)\b",
                                                     sentence):
            for name, pattern in _CHECK_KEYS:
                if re.search(pattern, sentence) and (name, {}) not in checks:
                    checks.append((name, {}))
                    break
    return actions or checks


def describe_output(name: str, out: str) -> str:
    """What the user tells the agent after a step: the phone's own words, made conversational."""
    if name == "check_network_settings":
        try:
            data = json.loads(out)
            shown = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in data.items())
            return f"My network settings show: {shown}."
        except ValueError:
            return f"My network settings show: {out}"
    if name == "check_status_bar":
        return f"My status bar shows: {out}."
    if name == "check_sim_status":
        return f"It says: {out}"
    if name == "run_speed_test":
        ok = re.search(r"\((excellent|good)\)", out)
        return f"I ran the speed test: {out}" + ("" if ok else " It's still not working properly.")
    if name == "check_payment_requests":
        return f"My carrier app shows these payment requests: {out}"
    if out.startswith("Error"):
        return f"That didn't work, my phone says: {out}"
    return f"Done. My phone says: \"{out}\""


# -- checking proposals ------------------------------------------------------------------------------------
def _gb(args: Mapping[str, Any], text: str) -> str | None:
    amounts = [float(n) for n in re.findall(r"(\d+(?:\.\d+)?)\s*(?:gb|gigabytes?)\b", text)]
    if float(args["gb_amount"]) not in amounts:
        return f"I'd like {args['gb_amount']:g} GB"
    return None


def _lost_line(args: Mapping[str, Any], text: str, known: Mapping[str, str]) -> str | None:
    lost = known.get("lost_phone_number", "")
    if lost not in text and str(args.get("line_id", "")).lower() not in text:
        return f"it's the line {lost} that was lost"
    return None


def _bill(args: Mapping[str, Any], text: str) -> str | None:
    bills = set(re.findall(r"\bb\d{4,}\b", text))
    if bills and str(args.get("bill_id", "")).lower() not in bills:
        return "that's not the overdue bill"
    return None


CHECKS: dict[str, Check] = {
    "refuel_data": lambda args, intent, text, known, final: _gb(args, text),
    "change_plan": lambda args, intent, text, known, final: (
        None if str(args.get("plan_id", "")).lower() in text else f"I want the plan {args.get('plan_id')}"),
    "suspend_line": lambda args, intent, text, known, final: _lost_line(args, text, known),
    "send_payment_request": lambda args, intent, text, known, final: _bill(args, text),
}

#: per action: words that name it (a proposal with none of them is not about that action)
ACTION_VERBS: dict[str, str] = {
    "refuel_data": r"refuel|top.?up|extra data|add|data",
    "enable_roaming": r"roaming",
    "disable_roaming": r"roaming",
    "change_plan": r"plan",
    "suspend_line": r"suspend|block|deactivat|disabl|freez",
    "resume_line": r"resum|reactivat|restor|unsuspend|reconnect|turn .{0,20}back on",
    "send_payment_request": r"payment request|request (for )?(a )?payment|send .{0,30}request|request .{0,30}bill",
}


class TelecomUserScript(ServiceUserScript):
    """A phone customer: describes a symptom, works its phone when told to, verifies with a speed test."""

    known_facts = ("dob", "phone_number", "customer_id", "location", "lost_phone_number", "symptom")
    action_verbs = ACTION_VERBS
    checks = CHECKS

    def settles(self, task: Task, intent: Intent) -> bool:
        """A connectivity complaint without a proposal or steps is settled by the speed test."""
        return super().settles(task, intent) or "symptom" in task.scenario.known

    def goal_facts(self, goal: Goal, known: Mapping[str, str]) -> dict[str, str]:
        args, prefs = goal.wanted, goal.intent.preferences
        out: dict[str, str] = {}
        if "reason" in args:
            out["reason"] = str(args["reason"])
        if "gb_amount" in args:
            out["gb_amount"] = f"{args['gb_amount']:g}"
        if "min_data_gb" in prefs:
            roam = " with roaming" if prefs.get("roaming") else ""
            out["data_need"] = f"at least {prefs['min_data_gb']:g} GB of data per month{roam}, the cheapest plan that does that"
        return out

    # -- wording ---------------------------------------------------------------------------------------
    def request(self, session: ScriptedSession, goal: Goal) -> str:
        """The goal as the user would put it, without withheld facts."""
        intent, args, known = goal.intent, goal.wanted, session.known
        if intent.question:
            return intent.question
        symptom = first_person(known["symptom"]) + "." if "symptom" in known and "symptom" not in session.withheld \
            else "Something is wrong with my phone."
        texts: dict[str, Callable[[], str]] = {
            "refuel_data": lambda: f"{symptom} Could I get {args['gb_amount']:g} GB of extra data on my line?",
            "enable_roaming": lambda: f"{symptom} I need mobile data to work while I'm abroad.",
            "change_plan": lambda: self._plan_text(goal, known, symptom),
            "suspend_line": lambda: (f"The phone with number {known.get('lost_phone_number')} on my account was lost "
                                     "this afternoon. Please suspend that line so nobody can use it."),
            "resume_line": lambda: (f"{symptom} I want my line resumed right now, but I can't pay the overdue bill "
                                    "until next week." if intent.out_of_policy
                                    else "Can you get my line working again now?"),
            "send_payment_request": lambda: (f"{symptom} I think I forgot to pay a bill. I can pay it now through a "
                                             "payment request in my app."),
        }
        action = intent.action or ""
        return texts[action]() if action in texts else symptom

    def _plan_text(self, goal: Goal, known: Mapping[str, str], symptom: str) -> str:
        prefs = goal.intent.preferences
        need = f"at least {prefs.get('min_data_gb', 0):g} GB of data per month"
        if prefs.get("roaming") and "location" in known:
            return (f"{symptom} If my plan doesn't include roaming, I'm happy to switch to the cheapest plan that "
                    f"includes roaming and has {need}.")
        roam = " and roaming for travel abroad" if prefs.get("roaming") else ""
        return f"I'd like to change the plan of my line: I need {need}{roam}, and the cheapest plan that does that."

    def change_of_mind(self, session: ScriptedSession, goal: Goal) -> str:
        intent = goal.intent
        if intent.action == "refuel_data":
            first = intent.first_args or {}
            return f"I'd rather get {intent.args['gb_amount']:g} GB instead of {first.get('gb_amount', 0):g} GB."
        return super().change_of_mind(session, goal)

    # -- the phone -------------------------------------------------------------------------------------
    def plan_steps(self, session: ScriptedSession, text: str) -> list[tuple[str, dict[str, Any]]]:
        return phone_plan(text)

    def describe_output(self, name: str, out: str) -> str:
        return describe_output(name, out)

    def needs_speed_test(self, session: ScriptedSession) -> bool:
        """A connectivity complaint (not one the agent must refuse) is verified before saying goodbye."""
        connectivity = "symptom" in session.known and any(
            g.intent.user_actions or not (g.intent.action or g.intent.question) for g in session.goals)
        return connectivity and not any(g.intent.out_of_policy for g in session.goals)

    async def device_turn(self, session: ScriptedSession, text: str, act: Act) -> UserReply | None:
        """Perform the phone steps the agent instructs, in order, and say what the phone showed."""
        known = session.known
        if "symptom" not in known and "lost_phone_number" not in known and "phone_number" not in known:
            return None
        plan = self.plan_steps(session, text)
        if not plan:
            return None
        cur = session.current
        if any(name == "make_payment" for name, _ in plan) and cur is not None and cur.intent.out_of_policy:
            return session.going_nowhere("No, I can't pay anything before next week. I just want my line working.")
        reports = []
        for name, args in plan[:4]:
            reports.append(await self._perform(session, name, args, text, act))
        reply = " ".join(r for r in reports if r)
        session.stale = 0
        session.settle_steps()
        speed_ok = session.notes.get("speed_ok")
        if speed_ok:
            for goal in session.goals:
                if goal.status == "pending" and not (goal.intent.action or goal.intent.question
                                                     or goal.intent.user_actions):
                    goal.status = "done"
        if session.current is None and speed_ok:
            return session.stop(f"{reply} It works now, thank you so much!")
        if session.current is None and not self.needs_speed_test(session):
            return session.stop(f"{reply} That's everything, thank you!")
        return UserReply(text=reply or "Hmm, I am not sure what to do.")

    async def verify(self, session: ScriptedSession, act: Act) -> UserReply | None:
        """Every goal settled: a customer whose data was broken runs a speed test before saying goodbye."""
        if self.needs_speed_test(session) and not session.notes.get("speed_ok"):
            result = await self._do(session, act, "run_speed_test", {})
            if not session.notes.get("speed_ok"):
                return session.going_nowhere(f"I ran a speed test myself: {result} It still doesn't work.")
            return session.stop(f"I just ran a speed test: {result} It works now, thank you!")
        return None

    async def _do(self, session: ScriptedSession, act: Act, name: str, args: dict[str, Any]) -> str:
        out = await session.do(act, name, args)
        if name == "run_speed_test":
            session.notes["speed_ok"] = bool(re.search(r"\((excellent|good)\)", out))
        elif name not in READ_STEPS:
            session.notes["speed_ok"] = session.notes.get("speed_ok") or None
        return out

    async def _perform(self, session: ScriptedSession, name: str, args: dict[str, Any], text: str, act: Act) -> str:
        if name in TOGGLES:
            return await self._toggle(session, name, args.get("want"), act)
        if name == "make_payment":
            return await self._pay(session, text, act)
        out = await self._do(session, act, name, args)
        return self.describe_output(name, out)

    async def _toggle(self, session: ScriptedSession, name: str, want: bool | None, act: Act) -> str:
        """Check the current state first, so "turn off X" never turns an already-off X on."""
        label, reader, field_name = TOGGLES[name]
        state = await self._read_toggle(act, reader, field_name)
        if want is not None and state is not None and state == want:
            return f"{label} is already {'on' if want else 'off'} on my phone."
        out = await self._do(session, act, name, {})
        return f"I did that. My phone says: \"{out}\""

    async def _read_toggle(self, act: Act, reader: str, field_name: str) -> bool | None:
        out = str(await act(reader, {}))
        if reader == "check_status_bar":
            m = re.search(r"airplane mode: (on|off)", out.lower())
            return None if m is None else m.group(1) == "on"
        try:
            data = json.loads(out)
        except ValueError:
            return None
        value = data.get(field_name) if isinstance(data, dict) else None
        return None if value is None else value == "on"

    async def _pay(self, session: ScriptedSession, text: str, act: Act) -> str:
        listing = str(await act("check_payment_requests", {}))
        pending = re.findall(r"B\d{4,}", listing)
        if not pending:
            return "I checked my carrier app but I don't see any payment request."
        named = list(re.findall(r"\bb\d{4,}\b", text))
        bill = next((b for b in pending if b.lower() in named), pending[0])
        out = await self._do(session, act, "make_payment", {"bill_id": bill})
        return f"I found the payment request in my app and paid it: \"{out}\""
