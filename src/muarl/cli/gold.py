"""``muarl gold``: replay every task's gold actions and check they all score 1.0, the check that a
domain's tasks are solvable before anything is trained or evaluated on them."""

from __future__ import annotations

import argparse
import json
import time

from muarl.cli import options

NAME = "gold"
HELP = "replay every task's gold actions and check they all score 1.0"
#: domains whose tasks muarl imports unchanged from another benchmark: a gold call of theirs that fails while
#: the task still reaches its gold database is that benchmark's data, reported as a warning, not a failure
IMPORTED_TASKS = ("tau2:", "bfcl:")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("domain", help="a domain name, 'all' for the built-in ones, or module:attribute of your own")
    options.split(p, default=None, help="only this split (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON report instead of a table")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from muarl.domain import get_domain
    from muarl.gold import gold_score
    from muarl.types import SPLITS

    names = options.BUILTIN if args.domain == "all" else [args.domain]
    splits = [args.split] if args.split else list(SPLITS)
    console = Console(stderr=args.json)
    summary, failures, warnings = [], [], []
    for name in names:
        domain = get_domain(name)
        imported = name.startswith(IMPORTED_TASKS)
        for split in splits:
            start = time.perf_counter()
            tasks = domain.tasks(split)
            passed = violations = 0
            for task in tasks:
                traj = gold_score(domain, task)
                assert traj.reward is not None
                errors = [f"{r.name}: {r.output}" for r in traj.tool_log if not r.ok]
                good = traj.reward.reward == 1.0 and (not errors or imported)
                passed += good
                violations += len(traj.reward.violations)
                if good and errors:
                    warnings.append({"task": task.id, "domain": name, "failed_actions": errors})
                if not good:
                    failures.append({"task": task.id, "family": task.family, "diff": traj.reward.diff,
                                     "failed_actions": errors,
                                     "checks": [c.name for c in traj.reward.checks if not c.passed]})
            summary.append({"domain": name, "split": split, "tasks": len(tasks), "passed": passed,
                            "violations": violations, "seconds": round(time.perf_counter() - start, 3)})
    ok = all(s["passed"] == s["tasks"] for s in summary)
    if args.json:
        print(json.dumps({"ok": ok, "summary": summary, "failures": failures, "warnings": warnings}, indent=1))
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
        if warnings:
            console.print(f"[yellow]warning: {len(warnings)} task(s) of {', '.join(sorted({w['domain'] for w in warnings}))} "
                          "have gold calls that fail (the benchmark's own data, imported as is); each still reaches "
                          f"its gold database. First: {warnings[0]['task']}: {warnings[0]['failed_actions'][0]}[/yellow]")
        console.print("[green]all gold trajectories score 1.0[/green]" if ok else
                      f"[red]{len(failures)} task(s) do not score 1.0[/red]")
    return 0 if ok else 1
