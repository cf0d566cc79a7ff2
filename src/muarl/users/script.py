"""UserScript: what the scripted user says and checks on one domain, driven by the task's scenario.

The conversation engine (:mod:`muarl.users.scripted`) knows *when* to answer, confirm, insist or stop;
a ``UserScript`` knows *what*: how each intent is worded, which facts go with it and how an agent may
name them, whether a proposed action is the one the user wants, what the user does on its device when
told to, and whether it verifies the fix before it stops. A domain supplies one as
``Domain(user_script=...)``, usually a subclass that overrides a few methods; nothing about any domain
lives in the engine.

This base class is the generic script, and it needs nothing but the task's :class:`Scenario`:

- identity and other facts are ``scenario.known``; a fact named in ``scenario.withheld`` is said only
  once the agent asks for it (by its key in words, "card number", or by ``scenario.fact_words``);
- an intent is worded from ``Intent.say`` (``{fact}`` placeholders filled from ``known``; a sentence
  naming a fact still withheld is left out), else its ``question``, else its ``description`` in the
  first person;
- a proposal is about an intent when it names the intent's action (the tool name, its words, or its
  verb) and it matches when it also states every scalar value of the intent's arguments, looked for
  recursively through lists and objects (numbers by value, ISO dates in any usual form);
- with ``first_args`` the user first asks for those, declines a proposal of them and says what it wants
  instead (``Intent.change_say``, else the changed values);
- on the device, a step of ``user_actions`` is done when the agent's instruction names its tool.

A task this script cannot play raises ``ValueError`` naming the task and what is missing
(:meth:`UserScript.check`), so an unplayable scenario never turns into a conversation that cannot succeed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from muarl.types import Intent, Task
from muarl.users.base import Act, UserReply
from muarl.users.conversation import Goal, ScriptSession
from muarl.users.phrases import (
    ASK,
    SELF_TALK,
    first_person,
    phrase_pattern,
    says_value,
    sentences,
    words,
)

#: a ``{fact}`` placeholder in ``Intent.say`` / ``Intent.change_say``
PLACEHOLDER = re.compile(r"\{(\w+)\}")
#: the request already reads as the user's own sentence (no "I'd like to" in front)
_OWN_WORDS = re.compile(r"^(i|i'm|i'd|i've|i'll|my|please|can|could|would|is|are|do|does|when|what|where|how|"
                        r"why|which|who)\b", re.IGNORECASE)
#: the user's device reports an error
_ERROR = re.compile(r"^\s*error\b", re.IGNORECASE)


def leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """The scalar values inside an argument, each with the innermost key it sits under (lists and objects
    opened; None and booleans skipped: a proposal need not say "true")."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from leaves(v, str(k))
    elif isinstance(value, list | tuple):
        for v in value:
            yield from leaves(v, key)
    elif value is not None and not isinstance(value, bool):
        yield key, value


def render(value: Any) -> str:
    """A value in a sentence: numbers by value (2.0 -> 2), lists joined, objects as "key value" pairs."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{words(str(k))} {render(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(render(v) for v in value)
    return str(value)


def _lower_first(text: str) -> str:
    """``text`` to go after other words: its first letter lower-cased unless that word is "I" or a name."""
    first = text.split()[0] if text.split() else ""
    if first == "I" or first.startswith("I'") or not first[1:].islower():
        return text
    return text[:1].lower() + text[1:]


def changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The arguments of ``after`` that differ from ``before``, in words: "book id BK007"."""
    parts = [f"{words(k)} {render(v)}" for k, v in after.items() if before.get(k) != v]
    return ", ".join(parts)


class UserScript:
    """The generic, scenario-driven script; subclass it to give a domain its own wording and checks.

    Methods receive the episode's session (:class:`~muarl.users.conversation.ScriptSession`: its known facts,
    facts still withheld, goals, seeded ``rng`` and ``notes`` for per-episode state), so one script
    object serves every episode of a domain and must keep no state of its own.
    """

    # -- can this task be played? ----------------------------------------------------------------------
    def check(self, task: Task) -> None:
        """Raise ``ValueError`` naming the task and what is missing when this script cannot play it."""
        problems = self.problems(task)
        if problems:
            raise ValueError(f"the scripted user cannot play task {task.id!r} of {task.domain}: "
                             + "; ".join(problems))

    def problems(self, task: Task) -> list[str]:
        """What keeps this script from playing ``task`` (empty: it can)."""
        scenario = task.scenario
        found: list[str] = []
        if not scenario.intents:
            found.append("its scenario has no intents")
        missing = [k for k in scenario.withheld if k not in scenario.known]
        if missing:
            found.append(f"withheld fact(s) {', '.join(missing)} are not in scenario.known")
        for n, intent in enumerate(scenario.intents):
            label = f"intent {n} ({intent.description!r})"
            if not (intent.say or intent.description.strip() or intent.question):
                found.append(f"{label} has no wording (say, question or description)")
            if intent.question is not None and intent.answer is None:
                found.append(f"{label} asks a question but has no answer to check")
            if intent.first_args is not None and not intent.action:
                found.append(f"{label} has first_args but no action to propose them with")
            if not self.settles(task, intent):
                found.append(f"{label} has neither an action, a question nor user_actions, so the user could "
                             "never tell that it is settled")
            for field, text in (("say", intent.say), ("change_say", intent.change_say)):
                unknown = [p for p in PLACEHOLDER.findall(text or "") if p not in scenario.known]
                if unknown:
                    found.append(f"{label}: {field} names {', '.join('{' + p + '}' for p in unknown)}, which "
                                 "scenario.known does not have")
        return found

    def settles(self, task: Task, intent: Intent) -> bool:
        """Whether the user can tell when ``intent`` is settled: a proposal to confirm, an answer to
        check or device steps to do. A domain that verifies a fix itself (:meth:`verify`) says yes to more."""
        return bool(intent.action or intent.question or intent.user_actions)

    # -- wording ---------------------------------------------------------------------------------------
    def request(self, session: ScriptSession, goal: Goal) -> str:
        """The goal as the user puts it now (the first request until it changed its mind), leaving out
        what it still keeps back."""
        intent = goal.intent
        if goal.changed_mind:
            if intent.change_say:
                return self.fill(session, intent.change_say)
            return self._wish(session, intent, changed(intent.first_args or {}, intent.args))
        if intent.say:
            return self.fill(session, intent.say)
        if intent.question:
            return intent.question
        if intent.first_args is not None:
            return f"I'd like to {words(intent.action or '')} with {changed(intent.args, intent.first_args)}."
        return self._wish(session, intent, "")

    def change_of_mind(self, session: ScriptSession, goal: Goal) -> str:
        """What the user says when it switches from ``first_args`` to the final ``args``."""
        intent = goal.intent
        if intent.change_say:
            return self.fill(session, intent.change_say)
        what = self._core(session, intent)
        values = changed(intent.first_args or {}, intent.args)
        return f"What I want instead: {what}" + (f" ({values})." if values else ".")

    def fill(self, session: ScriptSession, template: str) -> str:
        """``template`` with its ``{fact}`` placeholders filled from the known facts; a sentence naming a
        fact the user still keeps back is left out until the agent has asked for it."""
        kept = []
        for sentence in re.split(r"(?<=[.!?])\s+", template.strip()):
            names = PLACEHOLDER.findall(sentence)
            if any(n in session.withheld for n in names):
                continue
            kept.append(PLACEHOLDER.sub(lambda m: str(session.known.get(m.group(1), m.group(0))), sentence))
        return " ".join(kept) or self._wish(session, Intent(description=""), "")

    def _core(self, session: ScriptSession, intent: Intent) -> str:
        """The description in the first person, without sentences that name a fact still withheld."""
        hidden = [str(session.known[k]) for k in session.withheld if k in session.known]
        text = first_person(intent.description.strip())
        kept = [s for s in re.split(r"(?<=[.!?])\s+", text) if s and not any(h and h in s for h in hidden)]
        core = " ".join(kept).rstrip(".").strip()
        if not core:
            return words(intent.action or "") or "get some help"
        return _lower_first(core)

    def _wish(self, session: ScriptSession, intent: Intent, values: str) -> str:
        core = self._core(session, intent)
        text = core[:1].upper() + core[1:] if _OWN_WORDS.match(core) else f"I'd like to {core}"
        return f"{text} ({values})." if values else f"{text}."

    # -- facts -----------------------------------------------------------------------------------------
    def facts(self, session: ScriptSession) -> dict[str, str]:
        """What the user can say when asked: every known fact (a withheld one too: it is never volunteered
        in a request, but given once the agent asks for it)."""
        return {k: str(v) for k, v in session.known.items()}

    def fact_words(self, session: ScriptSession, key: str) -> list[str]:
        """How an agent may name the fact ``key``: ``scenario.fact_words`` and the key in words."""
        return [*session.scenario.fact_words.get(key, []), words(key)]

    def asked_facts(self, session: ScriptSession, text: str) -> list[str]:
        """The facts the agent asks for in ``text`` (a fact it states itself is not asked for)."""
        if not ASK.search(text):
            return []
        asked = []
        for key, value in self.facts(session).items():
            if not any(re.search(phrase_pattern(w), text) for w in self.fact_words(session, key)):
                continue
            if says_value(text, value):
                continue  # the agent is stating it, not asking for it
            asked.append(key)
        return asked

    def fact_sentence(self, session: ScriptSession, key: str, facts: Mapping[str, str]) -> str:
        """One sentence giving ``key`` ("" when the user does not know it)."""
        value = facts.get(key)
        if value is None:
            return ""
        pattern = session.rng.choice(["My {w} is {v}.", "The {w} is {v}."])
        return pattern.format(w=words(key), v=value)

    def statements(self, session: ScriptSession, facts: Mapping[str, str]) -> list[str]:
        """``facts`` (known facts, in the scenario's order) stated unasked, a sentence each: the
        non-interactive user (:mod:`muarl.users.static`) says every fact in its opening, since no question of
        the agent's will ever be answered. A domain overrides it for its own wording (a name in one
        sentence); each value must stay in it verbatim, so that the agent can copy it."""
        return [f"My {words(key)} is {render(value)}." for key, value in facts.items()]

    # -- proposals -------------------------------------------------------------------------------------
    def action_pattern(self, action: str) -> str:
        """A regex for words that name ``action``: its tool name, the name in words, or its verb."""
        verb = action.split("_")[0].lower()
        stem = verb[:-1] if verb.endswith("e") and len(verb) > 4 else verb
        alternatives = [phrase_pattern(action)]
        if len(stem) >= 3:
            alternatives.append(rf"(?<!\w){re.escape(stem)}")
        return "|".join(alternatives)

    def names_action(self, action: str, text: str) -> bool:
        """Whether ``text`` is about ``action`` (a proposal about another action is not checked against it)."""
        return re.search(self.action_pattern(action), text) is not None

    def mismatch(self, session: ScriptSession, goal: Goal, args: Mapping[str, Any], text: str,
                 final: bool) -> str | None:
        """Why ``text`` does not propose ``goal``'s action with ``args``, or None when it does: every scalar
        value of ``args`` must be stated. ``final``: ``args`` are the intent's final ones (not ``first_args``)."""
        for key, value in leaves(args):
            if not says_value(text, value):
                return f"the {words(key) or 'value'} should be {render(value)}"
        return None

    def answered(self, goal: Goal, text: str) -> bool:
        """Whether the agent's ``text`` gives the answer to the goal's question."""
        return goal.intent.answer is not None and says_value(text, goal.intent.answer)

    # -- the user's device -----------------------------------------------------------------------------
    def plan_steps(self, session: ScriptSession, text: str) -> list[tuple[str, dict[str, Any]]]:
        """The device steps the agent instructs in ``text``, in order: a pending step of the scenario's
        ``user_actions`` (with its arguments), or a user tool of the domain that takes no arguments,
        named in a sentence addressed to the user."""
        options: list[tuple[str, dict[str, Any]]] = []
        for goal in session.goals:
            if goal.status != "done":
                options += [(a.name, dict(a.arguments)) for a in goal.intent.user_actions
                            if a.name not in goal.performed]
        domain = session.domain
        for tool in getattr(domain, "user_tools", None) or []:
            if not tool.spec.parameters.get("required") and all(tool.name != n for n, _ in options):
                options.append((tool.name, {}))
        plan: list[tuple[str, dict[str, Any]]] = []
        for sentence in sentences(text):
            if SELF_TALK.search(sentence) and not re.search(r"\byou\b", sentence):
                continue
            for name, args in options:
                if (name, args) not in plan and re.search(phrase_pattern(name), sentence):
                    plan.append((name, args))
        return plan

    def describe_output(self, name: str, out: str) -> str:
        """What the user tells the agent after doing a step: the device's own words."""
        if _ERROR.match(out):
            return f"That didn't work, my device says: {out}"
        return f"Done. My device says: \"{out}\""

    async def device_turn(self, session: ScriptSession, text: str, act: Act) -> UserReply | None:
        """Do the device steps ``text`` instructs and say what the device showed; None when it asks none."""
        plan = self.plan_steps(session, text)
        if not plan:
            return None
        reports = [self.describe_output(name, await session.do(act, name, args)) for name, args in plan[:4]]
        report = " ".join(r for r in reports if r)
        session.stale = 0
        if session.settle_steps():
            if session.current is None:
                verified = await self.verify(session, act)
                return verified or session.stop(f"{report} That's everything, thank you!")
            return session.after_done(report)
        return UserReply(text=report or "Hmm, I am not sure what to do.")

    # -- ending ----------------------------------------------------------------------------------------
    async def verify(self, session: ScriptSession, act: Act) -> UserReply | None:
        """Before stopping with every intent settled: check the outcome on the device and say so (a reply
        ends or continues the episode), or None to stop with thanks. The generic user does not verify."""
        return None


#: the script of a domain that brings none
GENERIC = UserScript()


def script_of(domain: Any) -> UserScript:
    """``domain.user_script`` (an instance, or a class to instantiate), else the generic script."""
    script = getattr(domain, "user_script", None)
    if script is None:
        return GENERIC
    if isinstance(script, type):
        script = script()
    if not isinstance(script, UserScript):
        raise TypeError(f"domain {getattr(domain, 'name', domain)!r}: user_script must be a "
                        f"muarl.users.script.UserScript, not {type(script).__name__}")
    return script
