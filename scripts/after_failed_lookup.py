"""What an agent does right after a failed identity lookup, in evaluation trajectories.

    python scripts/after_failed_lookup.py runs/demo/eval-sft runs/demo/eval-rl

For every episode with an identity lookup (a tool named ``find_*``) that answered an error: is the agent's
next message a question to the user (the policy's way) or another tool call, and did the episode write
while nobody was authenticated. The mechanism behind the demo's violations (research/rl-beats-cold-start.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def classify(messages: list[dict]) -> str | None:
    """"ask" / "call" for the first assistant message after the first failed find_* lookup; None without one."""
    calls: dict[str, str] = {}
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or []:
            calls[c["id"]] = c["name"]
        if m["role"] == "tool" and calls.get(m.get("tool_call_id") or "", "").startswith("find_") \
                and m["content"].startswith("Error"):
            nxt = next((n for n in messages[i + 1:] if n["role"] == "assistant"), None)
            if nxt is None:
                return "end"
            return "call" if nxt.get("tool_calls") else "ask"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evals", nargs="+", help="muarl eval output directories (with trajectories.jsonl)")
    args = parser.parse_args()
    for folder in map(Path, args.evals):
        counts = {"ask": 0, "call": 0, "end": 0}
        episodes = unauth = 0
        for line in (folder / "trajectories.jsonl").read_text().splitlines():
            traj = json.loads(line)
            episodes += 1
            kind = classify(traj["messages"])
            if kind:
                counts[kind] += 1
            violations = (traj.get("reward") or {}).get("violations") or []
            unauth += any(v["kind"] == "unauthenticated_write" for v in violations)
        failed = sum(counts.values())
        print(f"{folder}: {episodes} episodes, {failed} with a failed identity lookup: next the agent asks "
              f"{counts['ask']}, calls a tool {counts['call']}, ends {counts['end']}; "
              f"episodes with an unauthenticated write {unauth}")


if __name__ == "__main__":
    main()
