"""What a simulated user got wrong in one conversation, read from the conversation and the task alone.

An LLM user is prompted to reveal facts when asked, never invent any, speak as a customer and stop only
when it is done; a small one breaks each of these now and then, and an episode it breaks is not the
agent's doing. These checks find such turns without asking a model, so every evaluation and every
training step can report how often they happen (``user_<kind>_rate`` in the metrics: the share of
episodes with at least one such turn; ``user_slip_rate`` for any). They are heuristics on text: each
names the user messages it flags (``Trajectory.metadata["user_slips"]``), so the viewer can show them and
a person can judge. Any user is checked, the scripted one too (it should score near zero).

- ``premature_stop``: the user ended the conversation right after the agent proposed an action (which
  then never happens) or asked for facts the user knows and did not give.
- ``invented_fact``: a user message states an identifier, number or e-mail address that is neither in the
  task's scenario nor said earlier in the conversation.
- ``tool_terms``: a user message names one of the domain's tools or tool arguments (``cancel_pending_order``,
  ``order_id``): the goal in the agent's terms, which no customer knows.
- ``withheld_fact``: the agent asked for a fact the user knows, and the user's next message gives none of
  the facts asked for.
- ``ignored_reply``: a user message repeats the user's previous one word for word although the agent had
  since asked or proposed something new, as if the agent had said nothing. A repeat that gives a fact the
  agent asked for again ("I could not find that account; your name and zip again?"), or says yes to a
  proposal made again, answers it; so does a repeat that corrects a proposal made again (it says no, or
  names another identifier of a sort the proposal named: "The order id is #W2924786." to a proposal for
  another order).
  Before this rule, a bad agent's garbled proposals made 0.13-0.30 of the scripted user's episodes flagged.
- ``as_agent``: a user message speaks as the agent: offers help ("how can I help you?", "I'm here to
  help") or calls itself the agent or an assistant. SmolLM2-135M opens this way on 20 of 20 dev tasks
  (research/llm-user-pilot.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from muarl.types import Message, Task
from muarl.users.phrases import (
    ANYTHING_ELSE,
    ASK,
    PROPOSAL,
    SELF_TALK,
    norm,
    opens_with_yes_or_no,
    phrase_pattern,
    says_value,
    sentences,
    words,
)

#: the kinds, in the order they are reported, with what each means (for tables and the viewer)
SLIPS: dict[str, str] = {
    "premature_stop": "ended the conversation right after a proposal or a request for facts it knows",
    "invented_fact": "stated an id, number or e-mail in neither its scenario nor the conversation",
    "tool_terms": "named a tool or a tool argument",
    "withheld_fact": "gave none of the facts the agent asked for that it knows",
    "ignored_reply": "repeated its previous message word for word after a new question or proposal",
    "as_agent": "spoke as the agent: offered help or called itself the agent or an assistant",
}
#: a user message in the agent's voice: it offers help, or says it is the agent (a customer asking *for* an
#: agent, "can I talk to a support agent?", is not matched: only "I am / as a ... agent")
AS_AGENT = re.compile(r"\bhow (can|may|could) i (help|assist)\b|\bi('m| am) here to (help|assist)\b|"
                      r"\bwhat can i do for you\b|\b(as|i'm|i am) (a|an|the|your) (customer[- ]?(service|support) |"
                      r"support |virtual )?(agent|representative|assistant|chatbot)\b")
#: the stop reason of a conversation the user ended itself (``###STOP###``)
USER_STOP = "user_stop"
#: what is stripped from either end of a word before it is read as an identifier (``(#W123).`` -> ``#W123``)
_EDGES = "()[]{}<>\"'.,:;!?/*`|"
_IDENT = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def _key(token: str) -> str:
    return re.sub(r"[^a-z0-9@]", "", token.lower())


def _facts_in(text: str) -> list[str]:
    """The identifiers in ``text``: e-mail addresses, ids mixing letters and 3+ digits (``#W6216054``,
    ``certificate_6106941``), numbers of 5+ digits (zips, phones). Amounts and counts are left out: a user
    may work them out (a certificate's balance against a fare). Word by word, in time linear in the text (a
    regex scan backtracked quadratically on a long malformed reply)."""
    found = []
    for word in text.split():
        token = word.strip(_EDGES)
        digits = sum(c.isdigit() for c in token)
        name, at, host = token.partition("@")
        if (at and name and "." in host.strip(".")) or digits >= 5 or \
                (digits >= 3 and any(c.isalpha() for c in token)):
            found.append(token)
    return found


def _gives(text: str, value: str) -> bool:
    """Whether normalised ``text`` gives ``value``, or one item of a listed value (``Water Bottle, Earbuds``)."""
    return any(says_value(text, part) for part in [value, *re.split(r"\s*[,;]\s*", value)] if part)


def tool_terms(tools: Iterable[Any]) -> set[str]:
    """The names a customer would not say: each tool's name and its arguments' names that have an underscore
    (``order_id``; a one-word argument such as ``email`` is an ordinary word)."""
    terms = set()
    for tool in tools:
        spec = getattr(tool, "spec", tool)
        terms.add(spec.name.lower())
        terms.update(name.lower() for name in (spec.parameters or {}).get("properties", {}) if "_" in name)
    return terms


def scenario_text(task: Task) -> str:
    """Everything the task lets the user know, as one text: its instruction, persona, facts and intents."""
    s = task.scenario
    parts = [task.instruction, s.persona, *map(str, s.known.values()), *s.traits]
    for intent in s.intents:
        parts += [str(v) for v in intent.model_dump().values() if isinstance(v, str | int | float)]
    return "\n".join(p for p in parts if p)


def _asked(task: Task, agent_text: str) -> dict[str, str]:
    """The known facts the agent asks for in ``agent_text``: named in one of its questions or requests (not a
    proposal, an "anything else?" or a sentence about what the agent does) and not stated there."""
    asks = [s for s in map(norm, sentences(agent_text))
            if ASK.search(s) and not (PROPOSAL.search(s) or ANYTHING_ELSE.search(s) or SELF_TALK.search(s))]
    found = {}
    for key, value in task.scenario.known.items():
        names = [*task.scenario.fact_words.get(key, []), words(key)]
        if any(re.search(phrase_pattern(n), s) and not says_value(s, value) for s in asks for n in names):
            found[key] = str(value)
    return found


def _kind(token: str) -> str:
    """What sort of identifier ``token`` is, to tell a correction from a restatement: an e-mail, its letter
    prefix (``#W2924786`` and ``#W29150`` are both orders, ``credit_card_1`` a card) or its count of digits."""
    key = _key(token)
    return "@" if "@" in key else re.match(r"[a-z]*", key).group(0) or f"{len(key)} digits"


def _answers_proposal(text: str, proposal: str) -> bool:
    """Whether ``text``, the user's reply to ``proposal``, answers it: a yes, a no, or a correction (an
    identifier of a sort the proposal named, but not the one it named: the right order, card or e-mail). A
    reply that only restates facts the proposal did not touch (a static user's whole request) is none."""
    if opens_with_yes_or_no(norm(text)):  # a yes, or a no (to a wrong proposal, again), answers it
        return True
    named = {_kind(t) for t in _facts_in(proposal)}
    return any(_kind(t) in named and _key(t) not in _key(proposal) for t in _facts_in(text))


def find_slips(task: Task, messages: Sequence[Message], stop_reason: str, terms: Iterable[str] = (),
               observed: Iterable[str] = ()) -> dict[str, list[int]]:
    """For each kind of :data:`SLIPS`, the indices in ``messages`` of the user messages that show it.
    ``terms``: :func:`tool_terms` of the domain's tools (agent and user tools); ``observed``: what the user's
    own tools showed it (a dual-control user reads its phone: the speed it reports is no invention)."""
    slips: dict[str, list[int]] = {kind: [] for kind in SLIPS}
    terms = {t.lower() for t in terms}
    told = "\n".join([scenario_text(task), *observed])
    known, seen = {_key(t) for t in _facts_in(told)}, _key(told)
    agent: str | None = None  # the agent's text since the user's last message
    before: tuple[str, str] | None = None  # (the user's last message, the agent's text that came before it)
    for n, m in enumerate(messages):
        if m.role == "assistant" and m.content.strip():
            agent = m.content if agent is None else f"{agent}\n{m.content}"
            seen += _key(m.content)
            known.update(_key(t) for t in _facts_in(m.content))
        if m.role != "user":
            continue
        text, asked = m.content, _asked(task, agent or "")
        if any(_key(t) not in known and _key(t) not in seen for t in _facts_in(text)):
            slips["invented_fact"].append(n)
        if terms and any(w in terms for w in _IDENT.findall(text.lower())):
            slips["tool_terms"].append(n)
        if AS_AGENT.search(norm(text)):
            slips["as_agent"].append(n)
        if asked and not any(_gives(norm(text), v) for v in asked.values()):
            slips["withheld_fact"].append(n)
        # asked again, answered again: the facts asked for, or a yes, a no or a correction to a proposal made again
        answers = (bool(asked) and any(_gives(norm(text), v) for v in asked.values())) or \
            bool(PROPOSAL.search(norm(agent or "")) and _answers_proposal(text, agent or ""))
        if before is not None and norm(text) == norm(before[0]) and norm(agent or "") != norm(before[1]) and \
                (ASK.search(norm(agent or "")) or PROPOSAL.search(norm(agent or ""))) and not answers:
            slips["ignored_reply"].append(n)
        if n == len(messages) - 1 and stop_reason == USER_STOP:
            # it left right after a proposal (so the action never happens) or a request for facts it withheld
            said = [norm(s) for s in sentences(agent or "")]
            if any(PROPOSAL.search(s) and not ANYTHING_ELSE.search(s) for s in said) or \
                    n in slips["withheld_fact"]:
                slips["premature_stop"].append(n)
        seen += _key(text)
        known.update(_key(t) for t in _facts_in(text))
        before, agent = (text, agent or ""), None
    return slips


def episode_slips(domain: Any, task: Task, traj: Any) -> dict[str, list[int]]:
    """:func:`find_slips` of a played episode (its stop reason set): the domain's agent and user tools as the
    terms a customer would not say, and what the user's own tool calls showed it as known."""
    return find_slips(task, traj.messages, traj.stop_reason, tool_terms([*domain.tools, *domain.user_tools]),
                      [r.output for r in traj.tool_log if r.actor == "user"])


def slip_rates(slips: Sequence[Mapping[str, Sequence[int]] | None]) -> dict[str, float | None]:
    """``user_<kind>_rate`` (share of episodes with such a turn) and ``user_slip_rate`` (with any), over the
    episodes whose slips were found (None where there are none: trajectories recorded before this check)."""
    found = [s for s in slips if s is not None]
    n = len(found)
    rates: dict[str, float | None] = {
        "user_slip_rate": round(sum(any(s.get(k) for k in SLIPS) for s in found) / n, 6) if n else None}
    rates.update({f"user_{kind}_rate": round(sum(bool(s.get(kind)) for s in found) / n, 6) if n else None
                  for kind in SLIPS})
    return rates
