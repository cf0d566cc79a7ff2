"""The user's side of a conversation as an SFT record: data to teach an LLM to play the customer.

A small instruction-tuned model asked to play a customer answers as the agent (SmolLM2-135M: 20 of 20
openings, research/llm-user-pilot.md). A simulated user that already plays the part (the scripted
user) gives the lines to learn from: the same synthesised conversations the agent's cold start is made of,
seen from the other chair. Each record is what :class:`muarl.users.llm.LLMUserSession` sends its endpoint,
so a model fine-tuned on them (``muarl sft``) meets at serving time exactly the prompt it learned under:

- the LLM user's system prompt with the task's instruction;
- the agent's greeting, then every message of the agent that passed the turn to the user (its text only:
  the customer never sees tool calls or their results), as ``user`` messages;
- each of the user's lines, its end marker (###STOP###, ...) included, as ``assistant`` messages: the targets.

Text-only users for now: a dual-control domain's user also acts on its device, and those calls would have to
be placed among its lines, so such a domain is refused rather than taught a user that never uses its tools.
"""

from __future__ import annotations

from typing import Any

from muarl.domain import Domain
from muarl.types import Task, Trajectory
from muarl.users.llm import STOP_MARKERS, opening_messages

#: a trajectory's stop reason -> the marker the user's last line must carry
_MARKER_OF = {f"user_{signal}": marker for marker, signal in STOP_MARKERS.items()}


def check_domain(domain: Domain) -> None:
    """Refuse a domain whose users act on a device (their tool calls are not in the agent's transcript)."""
    if domain.user_tools:
        raise ValueError(f"--side user: domain {domain.name!r} has user tools ({len(domain.user_tools)}); "
                         "user-side data covers users who only talk, so use a domain without them")


def user_messages(task: Task, traj: Trajectory) -> list[dict[str, Any]]:
    """The conversation as the LLM user sees it, its own lines as ``assistant`` messages."""
    out = opening_messages(task)
    said = [m for m in traj.messages if m.role != "system"]
    for i, m in enumerate(said):
        if m.role != "user":
            continue
        if i > 0:  # what the user answered: the agent message before it, which ended the agent's turn
            before = said[i - 1]
            if before.role != "assistant" or before.tool_calls:
                raise ValueError(f"{traj.task_id}: a user line follows a {before.role} message, not the agent's "
                                 "words (not an episode transcript)")
            out.append({"role": "user", "content": before.content})
        out.append({"role": "assistant", "content": m.content})
    marker = _MARKER_OF.get(traj.stop_reason)
    last = out[-1]["content"]
    if marker and out[-1]["role"] == "assistant" and not any(m in last for m in STOP_MARKERS):
        out[-1] = {"role": "assistant", "content": f"{last} {marker}".strip()}
    return out


def to_user_record(domain: Domain, task: Task, traj: Trajectory) -> dict[str, Any]:
    """One data-set line of the user's side (``muarl synth --side user``), in :mod:`muarl.synth`'s chat format."""
    return {"domain": domain.name, "task_id": task.id, "family": task.family, "side": "user", "tools": [],
            "messages": user_messages(task, traj)}
