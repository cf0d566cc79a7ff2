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

Checked against 403 user turns labelled by hand (tests/data/slip_labels, docs/conversations.md): a kind
below 0.9 precision there, or never flagged, is a :data:`CANDIDATES` kind, reported apart
(``user_candidate_slip_rate``), not in ``user_slip_rate``. A flagged turn that answers the agent's own error
(a proposal repeated after a failed call, broken text, a question already answered) is also listed under
:data:`AGENT_ERROR` and counted against the agent (``agent_caused_slip_rate``), not the user.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from muarl.types import Message, Task
from muarl.users.phrases import (
    ANYTHING_ELSE,
    ASK,
    DONE,
    FAILED,
    PROPOSAL,
    SELF_TALK,
    norm,
    opens_with_yes_or_no,
    phrase_pattern,
    says_value,
    says_yes,
    sentences,
    words,
)

#: the kinds whose precision on the labelled set (tests/data/slip_labels, docs/conversations.md) is below 0.9 or
#: not measured: reported as candidates, not as what the user got wrong (``user_candidate_slip_rate``); the
#: labelled set's test holds this set to the scores it states
CANDIDATES: frozenset[str] = frozenset({"invented_fact", "tool_terms", "ignored_reply"})
#: what each kind means
_MEANS: dict[str, str] = {
    "premature_stop": "ended the conversation right after a proposal or a request for facts it knows",
    "invented_fact": "stated an id, number or e-mail in neither its scenario nor the conversation",
    "tool_terms": "named a tool or a tool argument",
    "withheld_fact": "gave none of the facts the agent asked for that it knows",
    "ignored_reply": "repeated its previous message word for word after a new question or proposal",
    "as_agent": "spoke as the agent: offered help or called itself the agent or an assistant",
}
#: the kinds, in the order they are reported, with what each means (for tables and the viewer); a candidate
#: says so first, so every table that prints the meaning says which rates do not name the user
SLIPS: dict[str, str] = {kind: f"candidate (precision below 0.9 on the labels): {means}" if kind in CANDIDATES
                         else means for kind, means in _MEANS.items()}
#: the key of the user turns flagged above that answer the agent's own error (a proposal repeated or garbled,
#: a failed or broken call, a question already answered): what such a turn shows is counted against the agent
AGENT_ERROR = "after_agent_error"
#: a user message in the agent's voice: it offers help, or says it is the agent (a customer asking *for* an
#: agent, "can I talk to a support agent?", is not matched: only "I am / as a ... agent"; nor one naming its
#: own job, "as an assistant manager": the role word must end the phrase); or one doing the agent's work on
#: "your" account ("I could not verify your identity", "I have cancelled your order")
AS_AGENT = re.compile(r"\bhow (can|may|could) i (help|assist)\b|\bi('m| am) here to (help|assist)\b|"
                      r"\bwhat can i do for you\b|\b(can|may|could) i (help|assist) you\b|"
                      r"\b(i|we) (could not|couldn't|can't|cannot) (verify|find|locate) your\b|"
                      r"\bi('ve| have) (cancelled|canceled|refunded|processed|updated) your\b|"
                      r"\b(anything|something)( else)?( that)? (i|we) (can|could|may) (help|assist|do for)\b|"
                      r"\b(as|i'm|i am) (a|an|the|your) (customer[- ]?(service|support) |support |virtual |ai )?"
                      r"(agent|representative|assistant|chatbot)\b(?! (manager|director|editor|professor|"
                      r"principal|coach|teacher|engineer|producer|to the|of the)\b)")
#: the stop reason of a conversation the user ended itself (``###STOP###``)
USER_STOP = "user_stop"
#: what is stripped from either end of a word before it is read as an identifier (``(#W123).`` -> ``#W123``)
_EDGES = "()[]{}<>\"'.,:;!?/*`|"
_IDENT = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
#: a sum of money: a currency sign or decimals (``$120.50``, ``1,234.50``, ``€90``), not a zip or an id
_AMOUNT = re.compile(r"[$€£]\d[\d,]*(\.\d+)?|\d{1,3}(,\d{3})*\.\d{1,2}|\d+\.\d{1,2}")
#: the shortest key that may be found inside a longer one said before (``w7088716`` in an e-mail's text); a
#: shorter one must have been said whole (``#W12`` is not ``#W1234567``)
_SHORT = 6
#: the share of distinct words two user messages must share for the second to repeat the first
_SAME = 0.8
#: how a tool result that failed begins (muarl.env)
ERROR = "Error"
#: a failed call that is the agent's doing whatever the user said: broken syntax, a tool that does not exist
_BROKEN_CALL = re.compile(r"^Error: (malformed tool call|unknown tool|invalid arguments)")
#: tool-call syntax in what the agent says to the user (``"}}``, ``</tool_call>``, ``{"name": ...``)
_BROKEN_TEXT = re.compile(r'</?tool_call>|\{"name"|"\s*\}\}|[a-z_]": ?[\[{"]')
#: a proposal of something more than was asked for
_EXTRA = re.compile(r"\b(also|additionally|as well|too)\b")
#: an e-mail address spelled out: "zoe dot young at example dot com"
_SPOKEN_AT = re.compile(r"\s*(?:\(at\)|\[at\]|\bat\b)\s*")
_SPOKEN_DOT = re.compile(r"\s*(?:\(dot\)|\[dot\]|\bdot\b)\s*")


def _key(token: str) -> str:
    return re.sub(r"[^a-z0-9@]", "", token.lower())


def _facts_in(text: str) -> list[str]:
    """The identifiers in ``text``: e-mail addresses, ids mixing letters and 3+ digits (``#W6216054``,
    ``certificate_6106941``), ids written with a ``#`` and a digit however short (``#W12``: an order number
    cut short is no order of the user's), numbers of 5+ digits (zips, phones). Amounts (``$120.50``,
    ``1,234.50``) and counts are left out: a user may work them out (a certificate's balance against a fare).
    Word by word, in time linear in the text (a regex scan backtracked quadratically on a long malformed
    reply)."""
    found = []
    for word in text.split():
        token = word.strip(_EDGES)
        if _AMOUNT.fullmatch(token):
            continue
        digits = sum(c.isdigit() for c in token)
        name, at, host = token.partition("@")
        if (at and name and "." in host.strip(".")) or digits >= 5 or \
                (digits >= 3 and any(c.isalpha() for c in token)) or (token.startswith("#") and digits):
            found.append(token)
    return found


def _gives(text: str, value: str) -> bool:
    """Whether normalised ``text`` gives ``value``, or one item of a listed value (``Water Bottle, Earbuds``);
    an e-mail address also spelled out ("zoe dot young at example dot com")."""
    if "@" in value and _key(value) in _key(_SPOKEN_DOT.sub(".", _SPOKEN_AT.sub("@", text))):
        return True
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
        fields = intent.model_dump()
        parts += [str(v) for v in fields.values() if isinstance(v, str | int | float)]
        parts += [str(v) for args in (fields.get("args"), fields.get("first_args")) if isinstance(args, dict)
                  for v in args.values()]  # what the user asks for: "please use paypal_5494572" is no invention
    return "\n".join(p for p in parts if p)


def _garbled(text: str) -> bool:
    """Whether the agent's text is broken: tool-call syntax in it, or a run of four words said again in it (a
    small model looping: "will request a return of $23 ... will request a return of"). A request in such text
    is no question a customer can answer, and the user's answer to it is no slip of the user's."""
    if _BROKEN_TEXT.search(text):
        return True
    said = norm(text).split()
    runs = [" ".join(said[i:i + 4]) for i in range(len(said) - 3)]
    return len(runs) != len(set(runs))


def _asks_or_proposes(agent: str) -> bool:
    """Whether one of the agent's sentences, not broken (:func:`_garbled`), asks or proposes something."""
    return any((ASK.search(s) or PROPOSAL.search(s)) and not _garbled(s) for s in map(norm, sentences(agent)))


def _repeats(text: str, previous: str) -> bool:
    """Whether ``text`` says ``previous`` again: word for word, or nearly (``_SAME`` of their distinct words
    shared: "I'm glad you're here..." for "I'm so glad you're here...")."""
    a, b = set(norm(text).split()), set(norm(previous).split())
    return norm(text) == norm(previous) or (bool(a | b) and len(a & b) / len(a | b) >= _SAME)


def _asked(task: Task, agent_text: str) -> dict[str, str]:
    """The known facts the agent asks for in ``agent_text``: named in one of its questions or requests (not a
    proposal, an "anything else?" or a sentence about what the agent does) and not stated there."""
    asks = [s for s in map(norm, sentences(agent_text)) if ASK.search(s) and not _garbled(s) and
            not (PROPOSAL.search(s) or ANYTHING_ELSE.search(s) or SELF_TALK.search(s))]
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


def _requests_done(task: Task, messages: Sequence[Message]) -> bool:
    """Whether every action the scenario asks for was called in ``messages`` and went through (its result no
    error): then the user leaving is no premature stop, whatever the agent offers next ("Shall I also...")."""
    actions = [i.action for i in task.scenario.intents if i.action]
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    done = {c.name for m in messages if m.role == "assistant" for c in m.tool_calls
            if c.id in results and not results[c.id].startswith(ERROR)}
    return bool(actions) and all(a in done for a in actions)


def _another_action(task: Task, agent: str, actions: Iterable[str]) -> bool:
    """Whether the agent's text proposes an action other than those the scenario asks for: it names the verb
    of another of the domain's writes (``return`` of ``return_delivered_order_items``) and none of the
    scenario's own (``cancel``). A user who leaves then has left nothing of its own undone; the agent's
    confusion is its own."""
    own = {i.action.split("_")[0] for i in task.scenario.intents if i.action}
    others = {a.split("_")[0] for a in actions} - own
    said = set(re.findall(r"[a-z]+", norm(agent)))
    return bool(own) and not said & own and bool(said & others)


def _requests(task: Task, text: str) -> bool:
    """Whether the user's ``text`` asks for one of the scenario's actions (names its verb: "I'd like to return")."""
    said = set(re.findall(r"[a-z]+", norm(text)))
    return bool(said & {i.action.split("_")[0] for i in task.scenario.intents if i.action})


def write_tools(tools: Iterable[Any]) -> list[str]:
    """The names of the tools that write: the actions an agent may propose."""
    return [getattr(t, "spec", t).name for t in tools if getattr(getattr(t, "spec", t), "kind", "read") == "write"]


def _extra_offer(sentence: str, agent: str) -> bool:
    """A proposal of something more after a report that the request is done ("Done. Shall I also send a
    confirmation e-mail?"): leaving then declines the extra, it does not abandon the request."""
    return bool(_EXTRA.search(sentence) and DONE.search(norm(agent)) and not FAILED.search(norm(agent)))


def _agent_erred(task: Task, span: Sequence[Message], agent: str, history: Sequence[Message], told: set[str],
                 said_yes: bool) -> str | None:
    """Why the agent's turn ``span`` (everything since the user's last message; ``agent`` its text) is the
    agent's own error that the user's next message answers, or None: a malformed or unknown tool call, a
    proposal made after a failed call or made again after the user said yes, a reply in broken tool syntax,
    a proposal naming an identifier neither the user, the scenario nor a tool result gave (``told``), or a
    request for a fact the user already gave."""
    said = norm(agent)
    errors = [m.content for m in span if m.role == "tool" and m.content.startswith(ERROR)]
    if any(_BROKEN_CALL.search(e) for e in errors):
        return "a malformed or unknown tool call"
    if not said:
        return None
    proposes = bool(PROPOSAL.search(said))
    if proposes and errors:
        return "a proposal after a failed call"
    if proposes and said_yes:
        return "a proposal made again after a yes"
    if _garbled(agent):
        return "broken text: tool syntax, or words looping"
    if proposes and any(_key(t) not in told for t in _facts_in(agent)):
        return "a proposal naming an identifier nobody gave"
    earlier = norm(" ".join(m.content for m in history if m.role == "user"))
    if any(_gives(earlier, v) for v in _asked(task, agent).values()):
        return "a request for a fact the user already gave"
    return None


def find_slips(task: Task, messages: Sequence[Message], stop_reason: str, terms: Iterable[str] = (),
               observed: Iterable[str] = (), actions: Iterable[str] = ()) -> dict[str, list[int]]:
    """For each kind of :data:`SLIPS`, the indices in ``messages`` of the user messages that show it.
    ``terms``: :func:`tool_terms` of the domain's tools (agent and user tools); ``observed``: what the user's
    own tools showed it (a dual-control user reads its phone: the speed it reports is no invention);
    ``actions``: :func:`write_tools` of the domain (a proposal of another action than the scenario's is no
    request the user leaves undone)."""
    slips: dict[str, list[int]] = {kind: [] for kind in [*SLIPS, AGENT_ERROR]}
    terms = {t.lower() for t in terms}
    told = "\n".join([scenario_text(task), *observed])
    known, seen = {_key(t) for t in _facts_in(told)}, _key(told)
    given = set(known)  # what the agent may name: the scenario, the conversation and the tools' results
    agent: str | None = None  # the agent's text since the user's last message
    before: tuple[str, str] | None = None  # (the user's last message, the agent's text that came before it)
    start = 0  # where the agent's turn since the user's last message begins
    for n, m in enumerate(messages):
        if m.role == "tool":
            given.update(_key(t) for t in _facts_in(m.content.replace('"', " ")))
        if m.role == "assistant" and m.content.strip():
            agent = m.content if agent is None else f"{agent}\n{m.content}"
            seen += _key(m.content)
            known.update(_key(t) for t in _facts_in(m.content))
        if m.role != "user":
            continue
        text, asked = m.content, _asked(task, agent or "")
        if any(_key(t) not in known and (len(_key(t)) < _SHORT or _key(t) not in seen) for t in _facts_in(text)):
            slips["invented_fact"].append(n)
        if terms and any(w in terms for w in _IDENT.findall(text.lower())):
            slips["tool_terms"].append(n)
        if AS_AGENT.search(norm(text)):
            slips["as_agent"].append(n)
        if asked and not any(_gives(norm(text), v) for v in asked.values()):
            slips["withheld_fact"].append(n)
        # asked again, answered again: the facts asked for, or a yes, a no or a correction to a proposal made again
        # or the user's request made again to "anything else?" (it says what else the user wants)
        answers = (bool(asked) and any(_gives(norm(text), v) for v in asked.values())) or \
            bool(PROPOSAL.search(norm(agent or "")) and _answers_proposal(text, agent or "")) or \
            bool(ANYTHING_ELSE.search(norm(agent or "")) and _requests(task, text))
        if before is not None and _repeats(text, before[0]) and norm(agent or "") != norm(before[1]) and \
                _asks_or_proposes(agent or "") and not answers:
            slips["ignored_reply"].append(n)
        if n == len(messages) - 1 and stop_reason == USER_STOP and not _requests_done(task, messages) and \
                not _another_action(task, agent or "", actions):
            # it left right after a proposal (so the action never happens) or a request for facts it withheld
            said = [norm(s) for s in sentences(agent or "")]
            if any(PROPOSAL.search(s) and not ANYTHING_ELSE.search(s) and not _extra_offer(s, agent or "")
                   for s in said) or n in slips["withheld_fact"]:
                slips["premature_stop"].append(n)
        span = messages[start:n]
        said_yes = before is not None and says_yes(before[0]) and not any(x.tool_calls for x in span)
        if any(n in slips[kind] for kind in SLIPS) and \
                _agent_erred(task, span, agent or "", messages[:start], given | known, said_yes):
            slips[AGENT_ERROR].append(n)
        seen += _key(text)
        known.update(_key(t) for t in _facts_in(text))
        given.update(known)
        before, agent, start = (text, agent or ""), None, n + 1
    return slips


def episode_slips(domain: Any, task: Task, traj: Any) -> dict[str, list[int]]:
    """:func:`find_slips` of a played episode (its stop reason set): the domain's agent and user tools as the
    terms a customer would not say, and what the user's own tool calls showed it as known."""
    return find_slips(task, traj.messages, traj.stop_reason, tool_terms([*domain.tools, *domain.user_tools]),
                      [r.output for r in traj.tool_log if r.actor == "user"], write_tools(domain.tools))


def _users(slips: Mapping[str, Sequence[int]], kind: str) -> bool:
    """Whether ``slips`` has a turn of ``kind`` that is the user's own: not one answering the agent's error."""
    after = set(slips.get(AGENT_ERROR, ()))
    return any(n not in after for n in slips.get(kind, ()))


def slip_rates(slips: Sequence[Mapping[str, Sequence[int]] | None]) -> dict[str, float | None]:
    """The shares of episodes, over those whose slips were found (None where there are none: trajectories
    recorded before this check), with at least one turn that is the user's own slip:

    - ``user_<kind>_rate`` for each kind, its turns that answer the agent's own error left out;
    - ``user_slip_rate`` for any kind that is not a :data:`CANDIDATES` one (those the labels do not show
      precise enough to name the user), ``user_candidate_slip_rate`` for any candidate kind;
    - ``agent_caused_slip_rate``: episodes with a flagged turn that answers the agent's error
      (:data:`AGENT_ERROR`), the slips the agent made the user make.
    """
    found = [s for s in slips if s is not None]
    n = len(found)

    def share(hit: Any) -> float | None:
        return round(sum(bool(hit(s)) for s in found) / n, 6) if n else None

    rates: dict[str, float | None] = {
        "user_slip_rate": share(lambda s: any(_users(s, k) for k in SLIPS if k not in CANDIDATES)),
        "user_candidate_slip_rate": share(lambda s: any(_users(s, k) for k in CANDIDATES)),
        "agent_caused_slip_rate": share(lambda s: s.get(AGENT_ERROR))}
    rates.update({f"user_{kind}_rate": share(lambda s, kind=kind: _users(s, kind)) for kind in SLIPS})
    return rates
