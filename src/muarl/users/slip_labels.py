"""The slip checks held to a labelled set of user turns: precision and recall per kind, with intervals.

``muarl.users.slips`` flags user turns with heuristics on text. A rate of them means what its name says
only as far as the flags agree with a person who read the conversations, so a set of user turns labelled
by hand (``tests/data/slip_labels``: the rules in ``RULES.md``, the conversations in
``conversations.jsonl.gz``, the turns and their labels in ``turns.jsonl``) is run through the current checks
here, and each kind's precision (flagged turns that are slips) and recall (slips that are flagged) is
reported with a Wilson 95% interval. ``docs/conversations.md`` states the figures and a test holds the
checks to them.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from muarl.types import Message, Task, ToolCall
from muarl.users.slips import AGENT_ERROR, SLIPS, find_slips, tool_terms, write_tools

#: where the labelled set lives in the repository
LABELS = Path(__file__).resolve().parents[3] / "tests" / "data" / "slip_labels"


@dataclass(frozen=True)
class Score:
    """One kind's agreement with the labels: counts, and the point estimates with Wilson 95% intervals."""

    kind: str
    tp: int
    fp: int
    fn: int

    @property
    def flagged(self) -> int:
        return self.tp + self.fp

    @property
    def labelled(self) -> int:
        return self.tp + self.fn

    @property
    def precision(self) -> float | None:
        return self.tp / self.flagged if self.flagged else None

    @property
    def recall(self) -> float | None:
        return self.tp / self.labelled if self.labelled else None

    def intervals(self) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        return wilson(self.tp, self.flagged), wilson(self.tp, self.labelled)


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of ``hits`` in ``n``: unlike the normal one it stays inside [0, 1] and is
    not of width 0 at 0 or n hits, which is where a check's precision on a few dozen turns usually sits."""
    if n == 0:
        return None
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, gzipped where its name ends in ``.gz``."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def conversation_messages(conv: Mapping[str, Any]) -> list[Message]:
    """A stored conversation's messages as muarl's: text, tool calls and results (the checks read whether
    the scenario's actions went through)."""
    return [Message(role=m["role"], content=m["content"], tool_call_id=m.get("tool_call_id"),
                    tool_calls=[ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"])
                                for c in m.get("tool_calls", [])])
            for m in conv["messages"]]


@cache
def _domain(name: str) -> tuple[dict[str, Task], frozenset[str], tuple[str, ...]]:
    from muarl.domain import get_domain  # the registry loads every domain: only when a set is checked

    domain = get_domain(name)
    tasks = {t.id: t for split in ("train", "dev", "test") for t in domain.tasks(split)}
    return tasks, frozenset(tool_terms([*domain.tools, *domain.user_tools])), tuple(write_tools(domain.tools))


def flags_now(conversations: Mapping[str, Mapping[str, Any]], turns: Iterable[Mapping[str, Any]]
              ) -> list[set[str]]:
    """For each labelled turn, the kinds the current checks flag on it (the conversation checked whole, as
    an episode is when it ends)."""
    found: dict[str, dict[str, list[int]]] = {}
    out = []
    for turn in turns:
        cid = turn["conversation"]
        if cid not in found:
            conv = conversations[cid]
            tasks, terms, actions = _domain(conv["domain"])
            found[cid] = find_slips(tasks[conv["task_id"]], conversation_messages(conv), conv["stop_reason"],
                                    terms, conv.get("observed", []), actions)
        out.append({kind for kind, where in found[cid].items() if turn["index"] in where})
    return out


def agent_error_score(turns: Sequence[Mapping[str, Any]], flags: Sequence[set[str]]) -> Score:
    """How well :data:`muarl.users.slips.AGENT_ERROR` finds the flagged turns that answer the agent's error,
    against the labels' ``agent_error``, over the turns some kind flags (the only ones it marks)."""
    said = [(bool(t["agent_error"]), AGENT_ERROR in f) for t, f in zip(turns, flags, strict=True)
            if f - {AGENT_ERROR}]
    return Score(AGENT_ERROR, tp=sum(a and b for a, b in said), fp=sum(b and not a for a, b in said),
                 fn=sum(a and not b for a, b in said))


def scores(turns: Sequence[Mapping[str, Any]], flags: Sequence[set[str]]) -> dict[str, Score]:
    """Each kind's counts against the labels (``turn["labels"][kind]``: 1 a slip of that kind, 0 none)."""
    out = {}
    for kind in SLIPS:
        said = [(bool(t["labels"][kind]), kind in f) for t, f in zip(turns, flags, strict=True)]
        out[kind] = Score(kind, tp=sum(a and b for a, b in said), fp=sum(b and not a for a, b in said),
                          fn=sum(a and not b for a, b in said))
    return out


def load(root: Path = LABELS) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The labelled set: conversations by id, and the labelled turns."""
    conversations = {c["id"]: c for c in read_jsonl(root / "conversations.jsonl.gz")}
    return conversations, read_jsonl(root / "turns.jsonl")


def fmt(x: float | None, ci: tuple[float, float] | None) -> str:
    return "n/a" if x is None or ci is None else f"{x:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def table(result: Mapping[str, Score], candidates: Iterable[str] = ()) -> str:
    """The markdown table docs/conversations.md shows (and its test reads back)."""
    rows = ["| kind | flagged | labelled slips | precision [Wilson 95%] | recall [Wilson 95%] | reported as |",
            "|---|---|---|---|---|---|"]
    cands = set(candidates)
    for kind, s in result.items():
        p, r = s.intervals()
        rows.append(f"| `{kind}` | {s.flagged} | {s.labelled} | {fmt(s.precision, p)} | {fmt(s.recall, r)} | "
                    f"{'candidate' if kind in cands else 'slip'} |")
    return "\n".join(rows)
