"""One ACEBench episode's world: evalscope's scenario instances, and how calls and end states are judged.

The instances are built by evalscope's own ``load_scenario_instances`` (the item's classes with its
``initial_config`` applied the way ACEBench applies it), privately for each episode: nothing is shared
between episodes, so concurrent episodes cannot see each other's messages, orders or bookings.

A call runs the way ACEBench's executor runs it: on every involved instance that has a public method of
that name, the last result being the answer (the phone apps all inherit ``BaseApi``, so
``turn_on_wifi()`` must reach each of them or later calls still see the Wi-Fi off).

The end state is evalscope's ``snapshot_states`` (the attributes ACEBench grades, through JSON as its
result files are) and is judged by ACEBench's own ``check_agent_end_state``. Beside it, muarl reports two
readings of its own: a strict comparison (every expected class, also those the answer files misspell,
and every attribute exactly, so an extra message or order counts) and a milestone score that compares
calls by name and value instead of by their text.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from muarl.bridges.acebench_data import Call, Item, parse_calls
from muarl.bridges.acebench_evalscope import module
from muarl.tools import ToolError


class World:
    """An item's scenario instances, private to one episode."""

    def __init__(self, item: Item):
        self.item = item
        self.instances: dict[str, Any] = module("scenarios").load_scenario_instances(
            item.initial_config, item.classes, "en")

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run one call on every instance that has it; ``ToolError`` for ACEBench's failures.

        A result ``{"status": False, "message": ...}`` (the scenario classes' way of refusing: device
        logged out, inbox full, balance too low) is reported as a tool error with that message; like an
        exception inside a method, it is also what ACEBench's agent would read.
        """
        methods = [getattr(i, name, None) for i in self.instances.values()] if not name.startswith("_") else []
        methods = [m for m in methods if callable(m)]
        if not methods:
            raise ToolError(f"name '{name}' is not defined")
        result: Any = None
        try:
            for method in methods:
                result = method(**arguments)
        except Exception as err:  # noqa: BLE001 - the scenario code's own failure, shown to the agent
            raise ToolError(f"{type(err).__name__}: {err}") from None
        if isinstance(result, dict) and result.get("status") is False:
            raise ToolError(str(result.get("message", result)))
        return result

    def state(self) -> list[dict[str, Any]]:
        """The graded attributes of every instance, as ACEBench records them (``[{Class: {attr: value}}]``)."""
        return module("scenarios").snapshot_states(self.instances)


def acebench_verdict(state: list[dict[str, Any]], ground_truth: list[dict[str, Any]]) -> dict[str, Any]:
    """ACEBench's own end-state check: ``{"valid": bool, "error": [...], ...}``."""
    return module("checker").check_agent_end_state(state, ground_truth)


def strict_mismatches(state: list[dict[str, Any]], ground_truth: list[dict[str, Any]]) -> list[str]:
    """muarl's strict reading: each expected class (a misspelt name matched to the closest class) has
    exactly the expected attributes; returns what differs."""
    have = {name: attrs for entry in state for name, attrs in entry.items()}
    problems = []
    for entry in ground_truth:
        for name, expected in entry.items():
            match = difflib.get_close_matches(name.lower(), [h.lower() for h in have], n=1, cutoff=0.8)
            actual = next((attrs for h, attrs in have.items() if match and h.lower() == match[0]), None)
            if actual is None:
                problems.append(f"{name}: no such class in the end state")
                continue
            for attr, value in expected.items():
                if _canonical(actual.get(attr)) != _canonical(value):
                    problems.append(f"{name}.{attr} differs")
    return problems


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def milestone_score(calls: list[Call], candidates: list[list[str]]) -> tuple[float, int, int]:
    """(score, matched, total) of the best milestone sequence: each milestone's calls found, in order,
    among the agent's calls, compared by name and value (ACEBench compares the raw texts)."""
    best = (0.0, 0, 0)
    for candidate in candidates:
        stones = [parse_calls(text) for text in candidate]
        if not stones:
            return 1.0, 0, 0
        cursor = matched = 0
        for stone in stones:
            found = _find(calls, stone, cursor)
            if found is not None:
                matched, cursor = matched + 1, found
        score = round(matched / len(stones), 3)
        if score > best[0] or not best[2]:
            best = (score, matched, len(stones))
    return best


def _find(calls: list[Call], stone: list[Call], start: int) -> int | None:
    """The position after ``stone``'s calls matched in order from ``start``, or None."""
    position = start
    for name, arguments in stone:
        want = _canonical(arguments)
        while position < len(calls) and (calls[position][0] != name or _canonical(calls[position][1]) != want):
            position += 1
        if position >= len(calls):
            return None
        position += 1
    return position
