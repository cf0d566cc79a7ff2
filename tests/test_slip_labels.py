"""The user-slip checks held to a labelled set of user turns (tests/data/slip_labels, issue 57 item 2).

The figures the test holds the checks to are read from docs/conversations.md's table (written by
``python scripts/slip_labels.py score``), so the doc and the checks cannot drift apart silently.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from muarl.types import Message, ToolCall
from muarl.users import slips as S
from muarl.users.slip_labels import LABELS, flags_now, load, scores, wilson

DOC = Path(__file__).resolve().parents[1] / "docs" / "conversations.md"
_ROW = re.compile(r"^\| `(\w+)` \| (\d+) \| (\d+) \| ([^|]+) \| ([^|]+) \| (\w+) \|$")


def _stated() -> dict[str, dict[str, float | None | str]]:
    """Each kind's precision and recall as docs/conversations.md states them (n/a: not measured)."""
    text = DOC.read_text()
    block = text[text.index("<!-- slip-labels:start -->"):text.index("<!-- slip-labels:end -->")]
    rows = {}
    for line in block.splitlines():
        m = _ROW.match(line.strip())
        if m:
            point = [None if c.strip() == "n/a" else float(c.split("[")[0]) for c in (m.group(4), m.group(5))]
            rows[m.group(1)] = {"precision": point[0], "recall": point[1], "reported": m.group(6)}
    return rows


@pytest.fixture(scope="module")
def measured() -> dict[str, S.Score]:
    conversations, turns = load()
    return scores(turns, flags_now(conversations, turns))


def test_the_labelled_set_is_large_stratified_and_fully_labelled() -> None:
    conversations, turns = load()
    assert len(turns) >= 300
    assert {t["source"] for t in turns} == {"scripted", "user-model", "smollm2"}
    assert all(t["labels"] is not None and set(t["labels"]) == set(S.SLIPS) for t in turns)
    assert all(t["agent_error"] in (0, 1) for t in turns)
    assert all(t["conversation"] in conversations for t in turns)
    # both strata: turns the checks flagged when drawn, and turns they did not
    assert any(t["flags"] for t in turns) and sum(not t["flags"] for t in turns) >= 100
    assert (LABELS / "RULES.md").exists()


def test_each_kind_keeps_the_precision_and_recall_the_doc_states(measured: dict[str, S.Score]) -> None:
    stated = _stated()
    assert set(stated) == set(S.SLIPS), "docs/conversations.md's table names every kind"
    for kind, score in measured.items():
        for what in ("precision", "recall"):
            bound, now = stated[kind][what], getattr(score, what)
            if bound is not None:
                assert now is not None and round(now, 2) >= bound, (kind, what, now, bound, score)


def test_the_candidate_kinds_are_those_the_labels_do_not_show_precise(measured: dict[str, S.Score]) -> None:
    """A kind whose precision on the labels is below 0.9 (or unmeasured) is a candidate, in the code and the doc."""
    low = {k for k, s in measured.items() if s.precision is None or s.precision < 0.9}
    assert set(S.CANDIDATES) == low
    assert {k for k, row in _stated().items() if row["reported"] == "candidate"} == low


def test_wilson_interval_matches_the_textbook_values() -> None:
    low, high = wilson(8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert wilson(0, 0) is None and wilson(5, 5)[1] == 1.0


def _task():
    from muarl.domain import get_domain

    domain = get_domain("retail-lite")
    return domain, domain.tasks("test")[0]


@pytest.mark.parametrize("agent, user, stop, kind, flagged", [
    ("Done. Shall I also send a confirmation e-mail?", "No thanks, that's all ###STOP###", "user_stop",
     "premature_stop", False),
    ("What was the amount?", "It was $120.50.", "max_turns", "invented_fact", False),
    ("How can I help?", "As an assistant manager at my company, I need to return something.", "max_turns",
     "as_agent", False),
    ("Could you tell me your email address?", "{spelled}", "max_turns", "withheld_fact", False),
    ("Sure.", "Is there anything I can assist you with?", "max_turns", "as_agent", True),
    ("Which order?", "It's order #W12.", "max_turns", "invented_fact", True),
])
def test_the_turns_issue_57_names_are_judged_as_a_person_would(agent: str, user: str, stop: str, kind: str,
                                                                flagged: bool) -> None:
    domain, task = _task()
    spelled = task.scenario.known["email"].replace("@", " at ").replace(".", " dot ")
    said = [Message(role="user", content="Hi, I need help with my order."), Message(role="assistant", content=agent),
            Message(role="user", content=user.format(spelled=spelled))]
    found = S.find_slips(task, said, stop, S.tool_terms([*domain.tools, *domain.user_tools]))
    assert bool(found[kind]) is flagged, found


def test_a_slip_after_the_agents_failed_call_is_counted_against_the_agent() -> None:
    """The user said yes, the write failed, the agent proposes the same again and the user leaves: a premature
    stop, but one the agent's error made; it leaves the user's rates and counts as agent-caused."""
    domain, task = _task()
    intent = task.scenario.intents[0]
    proposal = f"I will request a return of the {task.scenario.known['items']}. Would you like me to proceed? (yes/no)"
    said = [Message(role="user", content="Hi, I want to return something."),
            Message(role="assistant", content=proposal), Message(role="user", content="Yes, please go ahead."),
            Message(role="assistant", tool_calls=[ToolCall(id="c1", name=intent.action, arguments={})]),
            Message(role="tool", content="Error: item not found", tool_call_id="c1"),
            Message(role="assistant", content=proposal), Message(role="user", content="Thanks, bye! ###STOP###")]
    found = S.find_slips(task, said, "user_stop", S.tool_terms([*domain.tools, *domain.user_tools]))
    assert found["premature_stop"] == [6] and found[S.AGENT_ERROR] == [6]
    rates = S.slip_rates([found])
    assert rates["user_premature_stop_rate"] == 0.0 and rates["user_slip_rate"] == 0.0
    assert rates["agent_caused_slip_rate"] == 1.0
