"""The generic teacher: a reference agent for any domain, from the task and the domain's declared tools alone.

A domain of one's own needs a teacher for ``muarl synth`` (cold-start data) and for ``--policy expert``
(the reference row of every results table) before anyone has written a script for it. This one reads
only what every domain declares: which tools authenticate (``@tool(authenticates=True)``), which write,
their parameter names, the written policy, and the task (scenario facts, intents, gold actions,
required outputs). It plays the conversation a careful human agent would:

1. **Authenticate first**, with the first authenticating tool whose required parameters are all facts of
   ``scenario.known`` (by parameter name) and that takes at least one such fact, asking for those the
   user has not said yet (withheld ones included; by ``scenario.fact_words`` when the scenario names them
   so) and calling only once the user has said them all. A login with no arguments, or with none that is
   a fact of the task, would teach logging in as nobody: such a task is :class:`CannotPlay`.
2. For each request, in the order of the scenario's intents:

   - a **write** (a gold action): ask for any fact of the scenario the write's arguments repeat, **look
     up** until every value the proposal will name has been seen (said by the user or shown by a tool),
     **propose** it naming the action and every argument value (the user's ``first_args`` first, the
     changed arguments after a change of mind), wait for an **explicit yes**, act, and report;
   - a **question**: look up until the answer has been seen, then say it;
   - an **out-of-policy** request: look the record up, **refuse** politely quoting the policy clause
     that matches the request (:func:`policy_rule` says how it is chosen), and keep refusing while the
     user insists;
   - a step on the user's device (``user_actions``): ask the user to do it.

3. Say any required output not yet said, and offer more help.

"Look up" calls the read tools whose required parameters can all be filled (by name) from facts the
user has said, from what earlier tool results named (the authenticated id under its record's own field
name, the keys of a JSON object), or from the write's arguments that the conversation has already shown,
in the order the domain declares them, each call at most once per episode, and stops as soon as nothing
in the proposal is unexplained. So the data teaches where every identifier comes from, without calling
every read tool before every write. A write's own arguments fill a read only once said or shown, so a
read tool never gets a value only the write knows (an id nobody has looked up, or the write itself: an
``INSERT`` statement sent to a ``read_query`` tool).

**Identifiers come from the conversation.** Every identifier the teacher puts in a proposal, a refusal
or a tool call (:func:`identifiers`: a word with a digit or an ``@`` in it, such as an id, a date, a card
number, an email or an amount) must appear in a user message or a tool result before it says it; where
the look-ups could not show it, the task raises :class:`CannotPlay` rather than teach a model to invent
ids.

A task it cannot play raises :class:`CannotPlay`, naming the task and what is missing: before the
conversation where the task and the tools show it, else at the message that would have named what the
conversation never showed. It never falls back to a conversation that teaches the wrong thing.
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
_LIMIT = re.compile(r"\b(not|no|only|never|at most|more than|cannot|can't|must|limit\w*|maximum|up to|unless|"
                    r"except|forbidden|prohibited)\b", re.I)
#: a clause that instructs the agent ("refuse a third renewal") rather than states the rule
_TO_AGENT = re.compile(r"\b(refuse|decline|deny|reject)\b", re.I)
#: where an instruction to the agent starts inside a sentence ("..., so refuse a third renewal")
_TO_AGENT_START = re.compile(r"(?:,\s*|\s+)(?:(?:so|and|then|but|or)\s+)?(?=(?:refuse|decline|deny|reject)\b)", re.I)
#: a clause about the steps every request goes through (identity, a yes), not a reason to refuse one
_PROCEDURE = re.compile(r"\b(yes|confirm\w*|authenticat\w*|verif\w*|identity|identif\w*)\b", re.I)
#: words that tell no clause from another when matching a clause to a request
_FILLER = frozenset({
    "the", "and", "for", "with", "this", "that", "these", "those", "from", "into", "your", "their", "our", "his",
    "her", "its", "can", "could", "may", "might", "will", "would", "should", "shall", "please", "want", "like",
    "once", "more", "again", "any", "some", "what", "when", "who", "which", "they", "them", "you"})
#: a word that names something specific: it has a digit or an @ in it (see :func:`identifiers`)
_NAMING = re.compile(r"[^\s,;()\[\]{}<>'\"`]*[\d@][^\s,;()\[\]{}<>'\"`]*")


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


def identifiers(value: Any) -> list[str]:
    """The identifiers an argument value names, as the teacher would say them: every word of its scalar
    values (:func:`render`) that has a digit or an ``@`` in it and at least two characters: ids, dates,
    card numbers, emails, amounts. A lone digit (a quantity, a count) is not one, nor is plain text.

    Why words and not whole values: an identifier inside a text argument (``"renew L00012"``) must come
    from the conversation as much as one that is the whole value."""
    found: list[str] = []
    for leaf in leaves(value):
        for word in _NAMING.findall(render(leaf)):
            word = word.rstrip(".:!?")
            if len(word) >= 2 and word not in found:
                found.append(word)
    return found


def describe(action: str, args: Mapping[str, Any]) -> str:
    """The action and every argument value, e.g. "renew loan with loan id L00012"."""
    parts = [f"{words(k)} {render(v)}" for k, v in args.items()]
    return f"{words(action)} with {listing(parts)}" if parts else words(action)


def clauses(policy: str) -> list[str]:
    """The policy cut into clauses: at line ends (bullets stripped), after ``.``, ``;``, ``:``, ``!`` and
    ``?``, at a dash between spaces, and where an instruction to the agent starts inside a sentence ("A loan
    may not be renewed more than twice, so refuse a third renewal" is two clauses: the rule, and what to do)."""
    out = []
    for line in policy.splitlines():
        for sentence in re.split(r"(?<=[.;:!?])\s+|\s+[-\u2013\u2014]+\s+", line):
            for part in _TO_AGENT_START.split(sentence):
                text = part.strip(" -*#\t.;:,")
                if text:
                    out.append(text)
    return out


def _stems(text: str) -> set[str]:
    """The content words of ``text``, each by its first five letters (renew, renewed, renewal: "renew")."""
    return {w[:5] for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2 and w not in _FILLER}


def policy_rule(policy: str, action: str, request: str = "") -> str:
    """The policy clause a refusal of ``action`` quotes, chosen to match the request (``request``: its words,
    e.g. the intent's description and the action's argument names).

    Among the :func:`clauses` that name the action's verb in any form (``renew_loan``: renew, renewed,
    renewal) and state a limit ("not", "only", "never", "at most", "more than", "cannot", "must" ...), the
    one sharing the most content words with the request (compared by their first five letters), where a
    clause about identity or confirmation (every request goes through those, so none is refused under
    them) counts only when no other does, and the earlier clause wins a tie. Why not the first clause
    that names the verb: "renew a loan only after the member says yes" names it and says "only", yet a third
    renewal is refused under "a loan may not be renewed more than twice". A clause that only instructs the
    agent ("refuse a third renewal") is quoted as "our policy is to ..." when no clause states the rule.
    """
    verb = action.split("_")[0]
    stem = verb[:-1] if verb.endswith("e") and len(verb) > 4 else verb
    if not stem:
        return "this is not allowed under our policy"
    names = re.compile(rf"\b{re.escape(stem)}", re.I)
    wanted = _stems(f"{request} {words(action)}")
    rules, instructions = [], []
    for i, text in enumerate(clauses(policy)):
        if not names.search(text):
            continue
        rank = (not _PROCEDURE.search(text), len(_stems(text) & wanted), -i)
        if _TO_AGENT.search(text):
            instructions.append((rank, text))
        elif _LIMIT.search(text):
            rules.append((rank, text))
    if rules:
        text = max(rules)[1]
        return f"our policy says that {text[:1].lower()}{text[1:]}"
    if instructions:
        text = max(instructions)[1]
        return f"our policy is to {text[:1].lower()}{text[1:]}"
    return "this is not allowed under our policy"


def _cannot(domain: Domain, task: Task, what: str) -> CannotPlay:
    return CannotPlay(f"the generic teacher cannot play task {task.id!r} of domain {domain.name}: {what}")


def plan(domain: Domain, task: Task) -> tuple[list[tuple[Tool, dict[str, Any]]], list[Step]]:
    """The authentication candidates (tool, arguments) and the steps of ``task``; :class:`CannotPlay` when
    the task cannot be played from its scenario and the domain's declared tools."""

    def cannot(what: str) -> CannotPlay:
        return _cannot(domain, task, what)

    known = task.scenario.known
    missing = [k for k in task.scenario.withheld if k not in known]
    if missing:
        raise cannot(f"withheld fact(s) {', '.join(missing)} are not in scenario.known")
    for action in task.gold_actions:
        tools = domain.agent_tools if action.actor == "agent" else domain.user_tool_map
        if action.name not in tools:
            raise cannot(f"gold action {action.name!r} names no {action.actor} tool of the domain")
    auth_tools = [t for t in domain.tools if t.authenticates]
    # a login takes at least one fact of the task: one called with no arguments (every parameter optional
    # and none named after a fact, or none at all) would teach logging in as nobody
    auth: list[tuple[Tool, dict[str, Any]]] = []
    for t in auth_tools:
        args = {p: known[p] for p in t.spec.parameters.get("properties", {}) if p in known}
        if args and all(p in known for p in required(t)):
            auth.append((t, args))
    if domain.requires_auth and not auth_tools:
        raise cannot("the domain requires authentication but declares no authenticating tool "
                     "(mark it @tool(authenticates=True))")
    if domain.requires_auth and not auth:
        raise cannot("no authenticating tool can be called with facts of scenario.known "
                     f"({'; '.join(_login_needs(t, known) for t in auth_tools)}; name the tool's parameters "
                     "after the facts they take)")

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


def _login_needs(tool: Tool, known: Mapping[str, Any]) -> str:
    """Why ``tool`` cannot log the user in from ``known``, for :class:`CannotPlay`."""
    params = list(tool.spec.parameters.get("properties", {}))
    missing = [p for p in required(tool) if p not in known]
    if missing:
        return f"{tool.name} needs {', '.join(missing)}"
    if not params:
        return f"{tool.name} takes no arguments"
    return f"{tool.name} takes {', '.join(params)}, none of them a fact of the task"


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
        self.vouch(arguments, f"calling {name}")
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

    def unshown(self, value: Any) -> list[str]:
        """The :func:`identifiers` of ``value`` that no user message or tool result has contained (as a
        whole word: ``L0001`` is not shown by ``L00012``)."""
        text = " ".join(self.heard + self.seen).lower()
        return [w for w in identifiers(value)
                if not re.search(rf"(?<!\w){re.escape(w.lower())}(?!\w)", text)]

    def vouch(self, args: Mapping[str, Any], doing: str) -> None:
        """Raise :class:`CannotPlay` when ``args`` name an identifier the conversation has not shown.

        Why raise rather than go on: what this teacher says is what a model learns to say, and a proposal,
        a refusal or a call naming an id that nothing showed teaches it to invent ids (the scripted user,
        which knows the task, would even confirm it)."""
        missing = self.unshown(args)
        if missing:
            raise _cannot(self.domain, self.task,
                          f"{doing} would name {listing(missing)}, which no user message or tool result "
                          "contained (declare a read tool whose required parameters the conversation can fill "
                          "and whose result shows it, or have the user say it)")

    def _fact_for(self, param: str, extra: Mapping[str, Any]) -> tuple[Any, str | None]:
        """A value for ``param`` and, when it is a scenario fact the user has not said yet, that fact's key.

        A value from ``extra`` (the write's or the request's arguments) counts only once the conversation
        has shown it: a read is never made with something only the write knows."""
        if param in extra and self._heard_or_seen(extra[param]):
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
            self.vouch(args, f"proposing {step.action}")
            return f"I can {describe(step.action, args)}."

        done = yield from self.settle(intent, step.action, propose)
        if done:
            out = self.output.strip()
            return f"Done: {out.rstrip('.')}." if out and len(out) <= 200 and load_json(out) is None else "Done."
        if self.last_call == step.action and self.output.startswith("Error"):
            return f"I'm sorry, that did not work: {self.output.removeprefix('Error:').strip()}"
        return "I have not made that change."

    def read(self, step: Step) -> Script:
        """A gold action that only reads: look up what it names, then call it (no confirmation needed)."""
        if not (yield from self.ask_facts(step.args)):
            return "I could not look that up without those details."
        yield from self.look_up(list(step.args.values()), step.args)
        yield from self.call(step.action, step.args)
        return ""

    def answer(self, step: Step) -> Script:
        assert step.intent is not None and step.intent.answer is not None
        yield from self.look_up([step.intent.answer], step.args)
        return f"Here is the answer to your question: {step.intent.answer}."

    def refuse_request(self, step: Step) -> Script:
        yield from self.look_up(list(step.args.values()), step.args)
        self.vouch(step.args, f"refusing {step.action or 'the request'}")
        rule = self.rule_for(step)
        what = describe(step.action, step.args) if step.action else "do that"
        yield from self.refuse(f"I'm sorry, but I can't {what}: {rule}.",
                               f"I understand, but I can't make an exception: {rule}.")
        return ""

    def rule_for(self, step: Step) -> str:
        """The policy clause the refusal of ``step`` quotes (:func:`policy_rule`, matched against the
        intent's description, question and argument names). A domain whose policy reads otherwise overrides
        this in its ``Domain.teacher`` subclass."""
        intent = step.intent
        said = [intent.description, intent.question or "", intent.say or ""] if intent else []
        return policy_rule(self.domain.policy, step.action, " ".join([*said, *map(words, step.args)]))

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
