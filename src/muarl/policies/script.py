"""TeacherSession: a reference agent written as a script, and the conversational moves every script shares.

A teacher may read the task (gold actions, scenario) to decide *what* to do, but it only *acts* on what
the user has said so far: an id, an email or a date is used only once it appears in a user message, and
the teacher asks for it otherwise. So its trajectories are what a careful human agent would produce:
authenticate, look up, propose the exact action, wait for an explicit yes, write, report. One tool call
per message, never text and a call together.

The script is a generator per episode: each ``yield`` is one assistant message and receives the new
messages (tool results or the user's reply). ``skip_confirmation=True`` makes the unsafe variant that
writes on the user's first request without asking, which the grader must flag. ``slip_rate`` makes a
teacher that now and then mistypes a value it copies (into an identity lookup, :meth:`TeacherSession.slip`,
or into a proposal, :meth:`TeacherSession.confirm_write`) and then recovers the way the policy wants
(asks again and looks up again; proposes again and waits for a yes): data that shows what follows a
failed lookup or a corrected proposal, its wrong message marked so that no model is trained to write it.

The generic teacher (:mod:`muarl.policies.teacher`) and each domain's richer teacher (``Domain.teacher``)
are subclasses that implement :meth:`TeacherSession.script` with these moves.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

from muarl.policies.base import AgentTurn, PolicySession
from muarl.types import Intent, Message, ToolCall
from muarl.users.phrases import says_yes

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Task

#: A script step: yields one assistant message, receives the new messages, returns a value.
Script = Generator[Message, list[Message], Any]

ANYTHING_ELSE = "Is there anything else I can help you with?"
CONFIRM = "Would you like me to proceed? (yes/no)"
GOODBYE = "Thank you for contacting us. Have a great day!"
#: a reply that accepts a refusal (and does not, in the same breath, insist again)
_ACCEPT = re.compile(r"\b(understand|alright|all right|ok|okay|fine|i see|never ?mind|forget it)\b", re.IGNORECASE)
_INSIST = re.compile(r"\b(please|really|exception|need)\b", re.IGNORECASE)


def norm(text: str) -> str:
    """Lower case with collapsed whitespace: the form :meth:`TeacherSession.said` compares in."""
    return " ".join(text.lower().split())


def load_json(text: str) -> Any:
    """A tool output parsed as JSON, or None when it is plain text."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _values(value: Any) -> list[Any]:
    """The scalar values inside arguments (lists and mappings flattened)."""
    if isinstance(value, Mapping):
        return [x for v in value.values() for x in _values(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _values(v)]
    return [value]


def mistype(value: str, rng: random.Random) -> str:
    """``value`` with one character replaced: a digit by another digit, a letter by another letter."""
    spots = [i for i, c in enumerate(value) if c.isdigit()] or [i for i, c in enumerate(value) if c.isalpha()]
    if not spots:
        return value + "x"
    i = rng.choice(spots)
    pool = "0123456789" if value[i].isdigit() else "abcdefghijklmnopqrstuvwxyz"
    new = rng.choice([c for c in pool if c != value[i].lower()])
    return value[:i] + (new.upper() if value[i].isupper() else new) + value[i + 1:]


def money(x: float) -> str:
    """An amount as teachers say it: $1,234.50."""
    return f"${x:,.2f}"


class TeacherSession(PolicySession):
    """One episode of a scripted teacher: :meth:`script` driven by the messages it receives."""

    def __init__(self, domain: Domain, task: Task, skip_confirmation: bool = False):
        self.domain = domain
        self.task = task
        self.skip = skip_confirmation
        self.slip_rate = 0.0  # chance of a mistyped lookup / proposal, each once per episode (set by ExpertPolicy)
        self.rng = random.Random(task.id)
        self.turn = 0  # assistant messages sent so far
        self.slips: list[int] = []  # which of them (0-based) were made wrong on purpose
        self._slipped: set[str] = set()
        self.known = task.scenario.known
        self.heard: list[str] = []  # every user message so far
        self.reply = ""  # the latest user message
        self.output = ""  # the latest tool output
        self.prefix = ""  # said before the next message (a report that waits for the next turn)
        self._ids = itertools.count()
        self._script = self.script()
        self._started = False

    def script(self) -> Script:
        """The whole conversation, one yielded assistant message at a time."""
        raise NotImplementedError(f"{type(self).__name__} must implement script()")

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        for m in new_messages:
            if m.role == "user":
                self.heard.append(m.content)
                self.reply = m.content
            elif m.role == "tool":
                self.output = m.content
        try:
            if not self._started:
                self._started = True
                message = next(self._script)
            else:
                message = self._script.send(new_messages)
        except StopIteration:
            message = Message(role="assistant", content=GOODBYE)
        self.turn += 1
        return AgentTurn(message=message)

    def close(self) -> dict[str, Any]:
        return {"slips": list(self.slips)} if self.slips else {}

    # -- primitives ---------------------------------------------------------------------------------------
    def say(self, text: str) -> Script:
        """Send ``text`` to the user; returns the user's reply."""
        content = f"{self.prefix} {text}".strip()
        self.prefix = ""
        yield Message(role="assistant", content=content)
        return self.reply

    def call(self, name: str, arguments: Mapping[str, Any]) -> Script:
        """Make one tool call; returns its output text."""
        call = ToolCall(id=f"call_{next(self._ids)}", name=name, arguments=dict(arguments))
        yield Message(role="assistant", content="", tool_calls=[call])
        return self.output

    def _slipping(self, kind: str) -> bool:
        """Whether to slip now: chance ``slip_rate``, each kind (lookup, proposal) once per episode."""
        if kind in self._slipped or self.slip_rate <= 0 or self.rng.random() >= self.slip_rate:
            return False
        self._slipped.add(kind)
        return True

    def slip(self, name: str, arguments: Mapping[str, Any]) -> Script:
        """With chance ``slip_rate`` (once per episode), call ``name`` with one character of one value
        mistyped, as a model that miscopies would; returns the output, or None when it did not slip.

        The message is recorded in ``slips`` (the data set marks it ``"weight": 0``): the teacher's recovery
        after it is what the data teaches. A slip that happens to find something is still only context.
        """
        keys = [k for k, v in arguments.items() if isinstance(v, str) and v]
        if not keys or not self._slipping("lookup"):
            return None
        key = self.rng.choice(keys)
        call = ToolCall(id=f"call_{next(self._ids)}", name=name,
                        arguments={**arguments, key: mistype(arguments[key], self.rng)})
        self.slips.append(self.turn)
        yield Message(role="assistant", content="", tool_calls=[call])
        return self.output

    def identify(self, name: str, arguments: Mapping[str, Any], again: str) -> Script:
        """The identity lookup (parsed as :meth:`lookup`), after a slip with chance ``slip_rate``: a mistyped
        lookup first, then saying so and asking again (``again``), then the right one."""
        if (yield from self.slip(name, arguments)) is not None:
            yield from self.say(again)
        return (yield from self.lookup(name, arguments))

    def lookup(self, name: str, arguments: Mapping[str, Any]) -> Script:
        """A read call whose JSON output is parsed (None on an error)."""
        out = yield from self.call(name, arguments)
        return None if out.startswith("Error") else load_json(out)

    def said(self, *values: Any) -> bool:
        """Whether the user has said every value so far (the teacher acts on nothing else)."""
        text = norm(" ".join(self.heard))
        return all(norm(str(v)) in text for v in values)

    def need(self, values: list[Any], question: str, tries: int = 3) -> Script:
        """Ask ``question`` until the user has said ``values``; False when they never do."""
        for _ in range(tries):
            if self.said(*values):
                return True
            yield from self.say(question)
        return self.said(*values)

    def confirm_write(self, proposal: str, name: str, args: Mapping[str, Any]) -> Script:
        """Propose, wait for an explicit yes, then write. None when the user did not confirm.

        A slip (chance ``slip_rate``) first proposes with one identifier of ``args`` mistyped in the text;
        whatever the user answers (a correction, or a yes to the wrong words), the right proposal follows
        and only a yes to it licenses the write."""
        if not self.skip:
            ids = sorted({str(v) for v in _values(args) if re.search(r"\d", str(v)) and str(v) in proposal})
            if ids and self._slipping("proposal"):
                wrong = self.rng.choice(ids)
                self.slips.append(self.turn)
                yield from self.say(f"{proposal.replace(wrong, mistype(wrong, self.rng))} {CONFIRM}")
            reply = yield from self.say(f"{proposal} {CONFIRM}")
            if not says_yes(reply):
                return None
        out = yield from self.call(name, args)
        return not out.startswith("Error")

    def proposals(self, intent: Intent) -> list[Mapping[str, Any]]:
        """What to propose in turn: the user's first request, then, after a change of mind, its final one."""
        options = [intent.first_args, intent.args] if intent.first_args is not None else [intent.args]
        return options[:1] if self.skip else options

    def settle(self, intent: Intent, name: str, propose: Callable[[Mapping[str, Any]], Script]) -> Script:
        """Propose the user's current request (first_args before a change of mind), write on a yes."""
        options = self.proposals(intent)
        for attempt in range(3):
            args = options[min(attempt, len(options) - 1)]
            text = yield from propose(args)
            if text is None:
                return False
            done = yield from self.confirm_write(text, name, args)
            if done is not None:
                return done
        return False

    def refuse(self, first: str, again: str) -> Script:
        """Refuse an out-of-policy request, and keep refusing while the user insists."""
        reply = yield from self.say(first)
        for _ in range(4):
            if _ACCEPT.search(reply) and not _INSIST.search(reply):
                return
            reply = yield from self.say(again)
