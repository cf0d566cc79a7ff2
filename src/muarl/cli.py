"""The ``muarl`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from muarl.domain import domain_names, get_domain
from muarl.gold import gold_score
from muarl.types import SPLITS

BUILTIN = ["retail", "airline", "telecom"]


def _domains_cmd(args: argparse.Namespace) -> int:
    rows = []
    for name in domain_names():
        d = get_domain(name)
        counts = {s: len(d.tasks(s)) for s in SPLITS}
        rows.append({"name": name, "agent_tools": len(d.tools), "user_tools": len(d.user_tools), **counts,
                     "description": d.description})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = Table(title="muarl domains")
    for col in ("domain", "agent tools", "user tools", *SPLITS, "description"):
        table.add_column(col, justify="right" if col not in ("domain", "description") else "left")
    for r in rows:
        table.add_row(r["name"], str(r["agent_tools"]), str(r["user_tools"]),
                      *(str(r[s]) for s in SPLITS), r["description"])
    Console().print(table)
    return 0


def _gold_cmd(args: argparse.Namespace) -> int:
    names = BUILTIN if args.domain == "all" else [args.domain]
    splits = [args.split] if args.split else list(SPLITS)
    console = Console(stderr=args.json)
    summary, failures = [], []
    for name in names:
        domain = get_domain(name)
        for split in splits:
            start = time.perf_counter()
            tasks = domain.tasks(split)
            passed = violations = 0
            for task in tasks:
                traj = gold_score(domain, task)
                assert traj.reward is not None
                errors = [f"{r.name}: {r.output}" for r in traj.tool_log if not r.ok]
                good = traj.reward.reward == 1.0 and not errors
                passed += good
                violations += len(traj.reward.violations)
                if not good:
                    failures.append({"task": task.id, "family": task.family, "diff": traj.reward.diff,
                                     "failed_actions": errors,
                                     "checks": [c.name for c in traj.reward.checks if not c.passed]})
            summary.append({"domain": name, "split": split, "tasks": len(tasks), "passed": passed,
                            "violations": violations, "seconds": round(time.perf_counter() - start, 3)})
    ok = all(s["passed"] == s["tasks"] for s in summary)
    if args.json:
        print(json.dumps({"ok": ok, "summary": summary, "failures": failures}, indent=1))
    else:
        table = Table(title="gold replay: every task's gold actions through a fresh env")
        for col in ("domain", "split", "tasks", "reward 1.0", "violations", "seconds"):
            table.add_column(col)
        for s in summary:
            style = "green" if s["passed"] == s["tasks"] else "red"
            table.add_row(s["domain"], s["split"], str(s["tasks"]), f"[{style}]{s['passed']}[/{style}]",
                          str(s["violations"]), str(s["seconds"]))
        console.print(table)
        for f in failures[:20]:
            console.print(f"[red]FAILED[/red] {f['task']} ({f['family']}): failed actions {f['failed_actions']}, "
                          f"failed checks {f['checks']}, diff {f['diff'][:5]}")
        console.print("[green]all gold trajectories score 1.0[/green]" if ok else
                      f"[red]{len(failures)} task(s) do not score 1.0[/red]")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muarl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("domains", help="list domains with task counts per split")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_domains_cmd)
    p = sub.add_parser("gold", help="replay every task's gold actions and check they all score 1.0")
    p.add_argument("domain", help="a domain name, 'all' for the built-in ones, or module:attribute of your own")
    p.add_argument("--split", choices=SPLITS, help="only this split (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON report instead of a table")
    p.set_defaults(func=_gold_cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyError as err:  # unknown domain or task: a clear message, not a traceback
        print(f"muarl: error: {err.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
