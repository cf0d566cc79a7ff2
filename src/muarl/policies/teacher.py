"""The generic teacher: a reference agent for any domain, from the task and the domain's declared tools alone.

A domain of one's own needs a teacher for ``muarl synth`` (cold-start data) and for ``--policy expert``
(the reference row of every results table) before anyone has written a script for it. This one reads
only what every domain declares: which tools authenticate (``@tool(authenticates=True)``), which write,
their parameter names, the written policy, and the task (scenario facts, intents, gold actions,
required outputs). It plays the conversation a careful human agent would:

1. **Authenticate first**, with the first authenticating tool whose required parameters are all facts of
   ``scenario.known`` (by parameter name), asking for those the user has not said yet (withheld ones
   included; by ``scenario.fact_words`` when the scenario names them so) and calling only once the user
   has said them all.
2. For each request, in the order of the scenario's intents:

   - a **write** (a gold action): ask for any fact of the scenario the write's arguments repeat, **look
     up** until every value the proposal will name has been seen (said by the user or shown by a tool),
     **propose** it naming the action and every argument value (the user's ``first_args`` first, the
     changed arguments after a change of mind), wait for an **explicit yes**, act, and report;
   - a **question**: look up until the answer has been seen, then say it;
   - an **out-of-policy** request: look the record up, **refuse** politely quoting the policy's rule,
     and keep refusing while the user insists;
   - a step on the user's device (``user_actions``): ask the user to do it.

3. Say any required output not yet said, and offer more help.

"Look up" calls the read tools whose required parameters can all be filled (by name) from the write's
arguments, from facts the user has said, or from what earlier tool results named (the authenticated id
under its record's own field name, the keys of a JSON object), in the order the domain declares them,
each call at most once per episode, and stops as soon as nothing in the proposal is unexplained. So
the data teaches where every identifier comes from, without calling every read tool before every write.

A task it cannot play raises :class:`CannotPlay` before the conversation, naming the task and what is
missing: it never falls back to a conversation that cannot succeed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from muarl.policies.script import ANYTHING_ELSE, Script, TeacherSession, load_json, norm
from muarl.types import Intent

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.tools import Tool
    from muarl.types import Task

#: words in a policy clause that make it a rule someone could be refused under
_LIMIT = re.compile(r"\b(not|only|never|at most|no more than|cannot|can't|must|limit\w*|maximum|up to)\b", re.I)
#: a clause that instructs the agent ("refuse a third renewal") rather than states the rule
_TO_AGENT = re.compile(r"\b(refuse|decline|deny|reject)\b", re.I)


class CannotPlay(ValueError):
    """The generic teacher cannot play a task; the message names the task and what is missing."""


@dataclass(frozen=True)
class Step:
    """One request to settle with the user, in the order the user brings them up."""

    kind: Literal["write", "read", "answer", "refuse", "instruct"]
    action: str
    args: Mapping[str, Any]
    intent: Intent | None = None


def required(tool: Tool) -> list[str]:
    """A tool's required parameter names."""
    return list(tool.spec.parameters.get("required", []))


def words(name: str) -> str:
    """A tool or fact name as the user hears it (and as the scripted user looks for it): "card number"."""
    return name.replace("_", " ")


def listing(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def render(value: Any) -> str:
    """One argument value in a sentence: numbers by value (2.0 -> "2"), booleans as yes/no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return "(" + ", ".join(f"{words(k)} {render(v)}" for k, v in value.items()) + ")"
    if isinstance(value, list | tuple):
        return ", ".join(render(v) for v in value)
    return str(value)


def leaves(value: Any) -> Iterator[Any]:
    """The scalar values inside an argument (lists and objects opened)."""
    if isinstance(value, Mapping):
        for v in value.values():
            yield from leaves(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from leaves(v)
    elif value is not None and not isinstance(value, bool):
        yield value


def describe(action: str, args: Mapping[str, Any]) -> str:
    """The action and every argument value, e.g. "renew loan with loan id L00012"."""
    parts = [f"{words(k)} {render(v)}" for k, v in args.items()]
    return f"{words(action)} with {listing(parts)}" if parts else words(action)


def policy_rule(policy: str, action: str) -> str:
    """The policy clause a refusal of ``action`` can quote: one that names the action's verb and a limit."""
    verb = action.split("_")[0]
    stem = verb[:-1] if verb.endswith("e") and len(verb) > 4 else verb
    for line in policy.splitlines():
        for clause in re.split(r"(?<=[.;])\s+", line):
            text = clause.strip(" -*#\t.;")
            if stem and re.search(rf"\b{re.escape(stem)}", text, re.I) and _LIMIT.search(text) \
                    and not _TO_AGENT.search(text):
                return f"our policy says that {text[:1].lower()}{text[1:]}"
    return "this is not allowed under our policy"


def plan(domain: Domain, task: Task) -> tuple[list[tuple[Tool, dict[str, Any]]], list[Step]]:
    """The authentication candidates (tool, arguments) and the steps of ``task``; :class:`CannotPlay` when
    the task cannot be played from its scenario and the domain's declared tools."""

    def cannot(what: str) -> CannotPlay:
        return CannotPlay(f"the generic teacher cannot play task {task.id!r} of domain {domain.name}: {what}")

    known = task.scenario.known
    missing = [k for k in task.scenario.withheld if k not in known]
    if missing:
        raise cannot(f"withheld fact(s) {', '.join(missing)} are not in scenario.known")
    for action in task.gold_actions:
        tools = domain.agent_tools if action.actor == "agent" else domain.user_tool_map
        if action.name not in tools:
            raise cannot(f"gold action {action.name!r} names no {action.actor} tool of the domain")
    auth_tools = [t for t in domain.tools if t.authenticates]
    auth = [(t, {p: known[p] for p in t.spec.parameters.get("properties", {}) if p in known})
            for t in auth_tools if all(p in known for p in required(t))]
    if domain.requires_auth and not auth_tools:
        raise cannot("the domain requires authentication but declares no authenticating tool "
                     "(mark it @tool(authenticates=True))")
    if domain.requires_auth and not auth:
        needs = "; ".join(f"{t.name} needs {', '.join(p for p in required(t) if p not in known)}" for t in auth_tools)
        raise cannot(f"no authenticating tool can be called from scenario.known ({needs})")

    writes = [a for a in task.gold_actions if a.actor == "agent"]
    on_device = [a for a in task.gold_actions if a.actor == "user"]
    steps: list[Step] = []
    for intent in task.scenario.intents:
        if intent.action and intent.action not in domain.agent_tools:
            raise cannot(f"intent {intent.description!r} names {intent.action!r}, which is no tool of the domain")
        if intent.question is not None:
            if intent.answer is None:
                raise cannot(f"intent {intent.description!r} asks a question but has no answer")
            steps.append(Step("answer", "", intent.args, intent))
        elif intent.out_of_policy:
            steps.append(Step("refuse", intent.action or "", intent.args, intent))
        elif intent.action:
            gold = next((a for a in writes if a.name == intent.action and a.arguments == intent.args), None)
            if gold is None:
                raise cannot(f"intent {intent.description!r} asks for {intent.action} {intent.args}, which is not "
                             "among the task's gold actions")
            writes.remove(gold)
            kind = "write" if domain.agent_tools[gold.name].is_write else "read"
            steps.append(Step(kind, gold.name, gold.arguments, intent))
        for step in intent.user_actions:
            on_device = [a for a in on_device if a != step]
            steps.append(Step("instruct", step.name, step.arguments, intent))
    steps += [Step("write" if domain.agent_tools[a.name].is_write else "read", a.name, a.arguments) for a in writes]
    steps += [Step("instruct", a.name, a.arguments) for a in on_device]
    return auth, steps


class GenericTeacher(TeacherSession):
    """One episode of the generic teacher (see the module docstring for what it does and why)."""

    def __init__(self, domain: Domain, task: Task, skip_confirmation: bool = False):
        self.auth, self.steps = plan(domain, task)
        self.reads = [t for t in domain.tools if not t.is_write and not t.authenticates and not t.terminal
                      and required(t)]
        self.learned: dict[str, str] = {}  # facts named by tool results: {"member_id": "M0007"}
        self.seen: list[str] = []  # every tool output so far
        self.spoken: list[str] = []  # everything the teacher said
        self.called: set[str] = set()  # read calls made (each at most once)
        self.last_call = ""  # the tool the latest output came from
        super().__init__(domain, task, skip_confirmation)

    # -- bookkeeping over the shared moves -------------------------------------------------------------
    def say(self, text: str) -> Script:
        self.spoken.append(text)
        return (yield from super().say(text))

    def call(self, name: str, arguments: Mapping[str, Any]) -> Script:
        out = yield from super().call(name, arguments)
        self.last_call = name
        self.seen.append(out)
        if not out.startswith("Error"):
            self._learn(out)
        return out

    def _learn(self, output: str) -> None:
        """Remember what a tool result names: the keys of a JSON object, or an id under its record's field."""
        data = load_json(output)
        if isinstance(data, Mapping):
            for key, value in data.items():
                if isinstance(value, str | int | float) and not isinstance(value, bool):
                    self.learned.setdefault(key, str(value))
            return
        text = data if isinstance(data, str) else output.strip()
        field = self._id_field(text)
        if field:
            self.learned.setdefault(field, text)

    def _id_field(self, value: str) -> str | None:
        """The field a bare id is stored under in its own record ("M0007" -> "member_id"), if it is a key."""
        if self.domain.make_env is not None or not value or len(value) > 100:
            return None  # not a muarl database: nothing to read the field name from
        for rows in self.domain.database().tables.values():
            record = rows.get(value)
            if isinstance(record, Mapping):
                return next((k for k, v in record.items() if v == value), None)
        return None

    def _heard_or_seen(self, value: Any) -> bool:
        text = norm(" ".join(self.heard + self.seen))
        return all(norm(render(v)) in text or norm(str(v)) in text for v in leaves(value))

    def _fact_for(self, param: str, extra: Mapping[str, Any]) -> tuple[Any, str | None]:
        """A value for ``param`` and, when it is a scenario fact the user has not said yet, that fact's key."""
        if param in extra:
            return extra[param], None
        if param in self.learned:
            return self.learned[param], None
        named = [k for k in self.known if k == param] or [k for k in self.known if k.endswith(f"_{param}")]
        if len(named) == 1:
            key = named[0]
            return self.known[key], None if self.said(self.known[key]) else key
        return None, None

    # -- the conversation -----------------------------------------------------------------------------
    def script(self) -> Script:
        if not (yield from self.authenticate()):
            yield from self.say("I'm sorry, I could not verify your identity, so I can't help with this request.")
            return
        handlers = {"write": self.write, "read": self.read, "answer": self.answer, "refuse": self.refuse_request,
                    "instruct": self.instruct}
        for i, step in enumerate(self.steps):
            report = yield from handlers[step.kind](step)
            if i == len(self.steps) - 1:
                report = f"{report} {self._unsaid_outputs(report)}".strip()
            yield from self.say(f"{report} {ANYTHING_ELSE}".strip())
        if not self.steps:
            yield from self.say(f"{self._unsaid_outputs()} {ANYTHING_ELSE}".strip())

    def authenticate(self) -> Script:
        """Call the first authenticating tool the user has given every argument of; False when none works."""
        if not self.auth:
            return True
        lead = "I'd be happy to help. First I need to verify your identity:"
        for tool, args in self.auth:
            if not (yield from self.need_facts(list(args), lead, whose="your")):
                lead = "Thank you. To find your account another way,"
                continue
            out = yield from self.call(tool.name, args)
            if not out.startswith("Error"):
                return True
        return False

    def need_facts(self, keys: list[str], lead: str = "", whose: str = "the", tries: int = 3) -> Script:
        """Ask for the scenario facts ``keys``, by name and only those not said yet, until the user has said
        them all; False when they never do."""
        for _ in range(tries):
            unsaid = [k for k in keys if not self.said(self.known[k])]
            if not unsaid:
                return True
            question = f"could you please tell me {whose} {listing([self.fact_name(k) for k in unsaid])}?"
            yield from self.say(f"{lead} {question}" if lead else question[:1].upper() + question[1:])
        return all(self.said(self.known[k]) for k in keys)

    def fact_name(self, key: str) -> str:
        """How to name a fact when asking for it: the scenario's own words for it, else its key in words."""
        return next(iter(self.task.scenario.fact_words.get(key, [])), words(key))

    def ask_facts(self, args: Mapping[str, Any]) -> Script:
        """Ask for the scenario facts that ``args`` repeat and the user has not said; False if never said."""
        values = {norm(render(v)) for v in leaves(args)}
        return (yield from self.need_facts([k for k, v in self.known.items() if norm(v) in values]))

    def look_up(self, values: list[Any], extra: Mapping[str, Any]) -> Script:
        """Call fillable read tools, in declared order and each at most once, until ``values`` have been seen.

        A read whose only missing argument is a fact the user has not said yet is called after asking."""
        for ask in (False, True):
            for tool in self.reads:
                if self._heard_or_seen(values):
                    return
                found = {p: self._fact_for(p, extra) for p in required(tool)}
                if any(v is None for v, _ in found.values()):
                    continue
                unsaid = [key for _, key in found.values() if key]
                if unsaid and not ask:
                    continue
                args = {p: v for p, (v, _) in found.items()}
                key = json.dumps([tool.name, args], sort_keys=True, default=str)
                if key in self.called:
                    continue
                if unsaid and not (yield from self.need_facts(unsaid)):
                    continue
                self.called.add(key)
                yield from self.call(tool.name, args)

    def write(self, step: Step) -> Script:
        intent = step.intent or Intent(description=words(step.action), action=step.action, args=dict(step.args))

        def propose(args: Mapping[str, Any]) -> Script:
            if not (yield from self.ask_facts(args)):
                return None
            yield from self.look_up(list(args.values()), args)
            return f"I can {describe(step.action, args)}."

        done = yield from self.settle(intent, step.action, propose)
        if done:
            out = self.output.strip()
            return f"Done: {out.rstrip('.')}." if out and len(out) <= 200 and load_json(out) is None else "Done."
        if self.last_call == step.action and self.output.startswith("Error"):
            return f"I'm sorry, that did not work: {self.output.removeprefix('Error:').strip()}"
        return "I have not made that change."

    def read(self, step: Step) -> Script:
        """A gold action that only reads: call it (no confirmation needed)."""
        yield from self.call(step.action, step.args)
        return ""

    def answer(self, step: Step) -> Script:
        assert step.intent is not None and step.intent.answer is not None
        yield from self.look_up([step.intent.answer], step.args)
        return f"Here is the answer to your question: {step.intent.answer}."

    def refuse_request(self, step: Step) -> Script:
        yield from self.look_up(list(step.args.values()), step.args)
        rule = policy_rule(self.domain.policy, step.action)
        what = describe(step.action, step.args) if step.action else "do that"
        yield from self.refuse(f"I'm sorry, but I can't {what}: {rule}.",
                               f"I understand, but I can't make an exception: {rule}.")
        return ""

    def instruct(self, step: Step) -> Script:
        how = f" ({render(dict(step.args))[1:-1]})" if step.args else ""
        yield from self.say(f"Please {describe(step.action, {})}{how} on your device, then tell me what happens.")
        return ""

    def _unsaid_outputs(self, about_to_say: str = "") -> str:
        """The required outputs not said yet (nor in ``about_to_say``), as one sentence."""
        spoken = norm(" ".join([*self.spoken, about_to_say]))
        left = [o for o in self.task.required_outputs if norm(o) not in spoken]
        return f"For your records: {listing(left)}." if left else ""


def teacher_session(domain: Domain, task: Task, skip_confirmation: bool = False) -> TeacherSession:
    """The reference agent's session for ``task``: the domain's own teacher (``Domain.teacher``) when it has
    one, else the generic teacher. ``Domain.teacher`` is called as ``teacher(domain, task)``, plus
    ``skip_confirmation=True`` for the unsafe variant."""
    make = domain.teacher or GenericTeacher
    return make(domain, task, skip_confirmation=True) if skip_confirmation else make(domain, task)
