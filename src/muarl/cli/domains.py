"""``muarl domains``: the domains muarl knows, with their tool and task counts."""

from __future__ import annotations

import argparse
import json

NAME = "domains"
HELP = "list domains with task counts per split"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from muarl.domain import domain_names, get_domain
    from muarl.types import SPLITS

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
