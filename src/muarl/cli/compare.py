"""``muarl compare``: per-metric differences of eval runs (B - A) with bootstrap intervals over tasks; several
pairs of runs (one per training seed) pool into one estimate."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from muarl.cli import options

NAME = "compare"
HELP = ("per-metric differences of eval runs (B - A) with bootstrap CIs over tasks; several pairs (one per seed) "
        "pool, a task's pairs resampled together")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="RUN_A RUN_B: the baseline run directory (or its results.json) and the run compared with it "
                        "(differences are B - A); more pairs RUN_A2 RUN_B2 ... (say one per training seed) pool into "
                        "one estimate with a cluster bootstrap over tasks")
    p.add_argument("--metrics", nargs="+", help="default: pass^1..pass^k (k shared), policy_fault_rate, "
                                                "user_fault_rate, tool_fault_rate, accuracy, tcr, avg_turns, "
                                                "violation_rate, transfer_rate")
    p.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--confidence", type=float, default=0.95, help="interval coverage")
    options.seed(p, help="seed of the resampling")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from muarl.cli.eval import fmt
    from muarl.compare import compare_pairs, load_run

    options.check_positive(args, "samples")
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must be between 0 and 1 (got {args.confidence})")
    if len(args.runs) < 2 or len(args.runs) % 2:
        raise ValueError(f"compare takes runs in pairs, RUN_A RUN_B [RUN_A2 RUN_B2 ...] (got {len(args.runs)} "
                         f"run{'s' if len(args.runs) != 1 else ''})")
    names = list(zip(args.runs[::2], args.runs[1::2], strict=True))
    pairs = [(load_run(a), load_run(b)) for a, b in names]
    report = compare_pairs(pairs, args.metrics, samples=args.samples, seed=args.seed, confidence=args.confidence)
    report["run_pairs"] = [list(pair) for pair in names]
    if len(names) == 1:
        report.update({"run_a": names[0][0], "run_b": names[0][1], "provenance": report["provenance"][0]})
    if args.json:
        print(json.dumps(report, indent=1))
        _print_provenances(report["provenance"])
        return 0
    console = Console()
    pct = f"{report['confidence']:.0%}"
    several = len(names) > 1
    if several:
        title = (f"B - A pooled over {len(names)} pairs of runs: {report['domain']}, {report['shared_tasks']} tasks "
                 f"({report['task_pairs']} task pairs), cluster bootstrap over tasks, a task's pairs kept together "
                 f"({report['samples']} resamples)")
    else:
        title = (f"{names[0][1]} (B) vs {names[0][0]} (A): {report['domain']}, {report['shared_tasks']} shared tasks, "
                 f"paired bootstrap over tasks ({report['samples']} resamples)")
    table = Table(title=title)
    columns = ["metric", "A", "B", "B - A", f"{pct} CI", "excludes 0", "tasks"] + (["task pairs"] if several else [])
    for col in columns:
        table.add_column(col, justify="left" if col == "metric" else "right")
    for d in report["metrics"]:
        mark = "[bold]yes[/bold]" if d["excludes_zero"] else "no"  # better or worse depends on the metric
        table.add_row(d["metric"].replace("_fault_rate", " fault rate"), fmt(d["a"]), fmt(d["b"]),
                      f"{d['diff']:+.3f}", f"[{d['low']:+.3f}, {d['high']:+.3f}]", mark, str(d["tasks"]),
                      *([str(d["pairs"])] if several else []))
    console.print(table)
    if report["only_a"] or report["only_b"]:
        console.print(f"[yellow]{report['only_a']} task(s) only in A and {report['only_b']} only in B were left "
                      "out[/yellow]")
    sig = [d["metric"] for d in report["metrics"] if d["excludes_zero"]]
    console.print("differences whose interval excludes 0: " + (", ".join(sig) if sig else "none"))
    _print_time(console, report["time"], several)
    _print_provenances(report["provenance"])
    return 0


def _print_time(console: Any, splits: list[dict[str, Any]], several: bool) -> None:
    """Where each pair's episode time went (muarl.time_split): seconds per episode in A and B, and B / A."""
    from rich.table import Table

    from muarl.time_split import compared

    for i, pair in enumerate(splits, 1):
        rows = compared(pair["a"], pair["b"])
        if not rows:
            continue
        table = Table(title=f"where the time went{f' (pair {i})' if several else ''}: per episode, wall time once")
        for col in ("time", "A", "B", "B / A"):
            table.add_column(col, justify="left" if col == "time" else "right")
        for key, a, b in rows:
            table.add_row(key.removeprefix("split_"), f"{a:.3g}", f"{b:.3g}", f"{b / a:.2f}x" if a else "-")
        console.print(table)


def _print_provenances(found: dict[str, Any] | list[dict[str, Any]]) -> None:
    """One pair's provenance differences as they are; several pairs' each under its pair's number."""
    if isinstance(found, dict):
        print_provenance(found)
        return
    for i, one in enumerate(found, 1):
        print_provenance(one, f"pair {i}: ")


def print_provenance(found: dict[str, Any], prefix: str = "") -> None:
    """The runs' provenance differences, one warning line per field (stderr, unwrapped, so that each stays
    one greppable line), or the note that a run has no record."""
    for line in found["warnings"]:
        print(f"warning: {prefix}the runs differ in {line}", file=sys.stderr)
    if found["note"]:
        print(f"note: {prefix}{found['note']}", file=sys.stderr)
