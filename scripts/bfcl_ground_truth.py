"""BFCL-V3 multi-turn ground truth through muarl's episode loop, graded by BFCL's official checker.

    python scripts/bfcl_ground_truth.py [--categories base miss_func miss_param long_context]

For every entry of every category a policy emits the entry's ground-truth calls turn by turn (one step
per turn, then a text reply that ends the turn) against the data-driven user, every call executes in
BFCL's classes inside a muarl episode, and BFCL's ``multi_turn_checker`` (plus its irrelevance checker
for the "miss" categories) grades the episode. Entries whose ground truth has a different number of
turns than the entry has questions cannot pass BFCL's own runner for any model (it fails them as
force-terminated); they are reported apart. Exit 1 if any other entry is not valid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from muarl.bridges.bfcl import CATEGORIES, GroundTruthPolicy, category_data
from muarl.domain import get_domain
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.users.scripted import ScriptedUser


def run(category: str, max_turns: int) -> dict:
    domain = get_domain(f"bfcl:{category}")
    data = category_data(category)
    broken = {i for i, e in data.entries.items() if len(e["question"]) != len(data.answers[i])}
    engine = RolloutEngine(domain, GroundTruthPolicy(), ScriptedUser(), EpisodeConfig(max_turns=max_turns))
    start = time.perf_counter()
    trajs = [g[0] for g in asyncio.run(engine.run(domain.tasks()))]
    seconds = time.perf_counter() - start
    invalid = [{"task": t.task_id, "stop": t.stop_reason, "why": t.reward.diff[:1] if t.reward else []}
               for t in trajs if t.reward is None or t.reward.reward != 1.0]
    return {"category": category, "entries": len(trajs), "valid": len(trajs) - len(invalid),
            "data_defects": sorted(broken), "invalid": invalid, "seconds": round(seconds, 1),
            "ok": all(i["task"] in broken for i in invalid)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES))
    parser.add_argument("--max-turns", type=int, default=60, help="tool executions + user replies per episode")
    parser.add_argument("--out", type=Path, default=Path("runs/bfcl_ground_truth.json"))
    args = parser.parse_args(argv)
    rows = [run(c, args.max_turns) for c in args.categories]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    table = Table(title="BFCL ground truth through muarl, graded by BFCL's multi_turn_checker")
    for col in ("category", "entries", "valid", "invalid", "of which data defects", "seconds"):
        table.add_column(col)
    for r in rows:
        defects = [i["task"] for i in r["invalid"] if i["task"] in r["data_defects"]]
        table.add_row(r["category"], str(r["entries"]), str(r["valid"]), str(len(r["invalid"])),
                      ", ".join(defects) or "-", str(r["seconds"]))
    console = Console()
    console.print(table)
    for r in rows:
        for i in r["invalid"]:
            console.print(f"{r['category']}: {i['task']} ({i['stop']}): {i['why']}")
    console.print(f"report: {args.out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
