"""``muarl eval``: a policy against a user on a split's tasks, k trials each: pass^1..pass^k, fault rates by
party, accuracy, TCR, ... (resumable: rerun the command to continue)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from muarl.cli import options

NAME = "eval"
HELP = "evaluate a policy against a user: pass^1..pass^k, accuracy, TCR, ... (resumable)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.evaluate import SIM_FAULT_MODES

    options.matchup(p)
    p.add_argument("--k", type=int, default=4, help="trials per task, each with its own user seed (default 4); pass^1..pass^k")
    p.add_argument("--out", required=True,
                   help="run directory: results.json, results.md, trajectories.jsonl; rerun it to resume")
    p.add_argument("--limit", type=int, help="only the first N tasks")
    p.add_argument("--tasks", nargs="+", metavar="ID", help="only these task ids (any split)")
    options.concurrency(p)
    p.add_argument("--sim-faults", choices=SIM_FAULT_MODES, default="exclude",
                   help="episodes a user or tool fault (or timeout) ended: left out of the metrics (default) or "
                        "counted as failures; a policy fault is always a failure")
    p.add_argument("--show-tasks", action="store_true", help="also print the per-task table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    options.episode(p)
    options.limits(p)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from muarl.evaluate import REPORT, RESULTS, TRAJECTORIES, evaluate
    from muarl.time_split import describe, of_result

    options.check_positive(args, "k", "limit", "concurrency", "max_turns", "max_new_tokens")
    domain, tasks, policy, user = options.matchup_of(args)
    # the specs as given (module:attr for a plug-in), so view, compare and a resume find them again
    meta = {"domain": args.domain, "policy": args.policy, "user": args.user, "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens, "split": "+".join(sorted({t.split for t in tasks}))}
    out = Path(args.out)
    result = evaluate(domain, policy, user, tasks, k=args.k, out_dir=out, config=options.episode_config(args),
                      seed=args.seed, concurrency=args.concurrency, progress=not args.quiet,
                      sim_faults=args.sim_faults, meta=meta)
    console = Console()
    print_metrics(console, result)
    if args.show_tasks:
        print_tasks(console, result)
    t = result.timing
    split = describe(of_result(t))
    if split:
        console.print(split)
    console.print(f"{t['episodes_run']} episodes played, {t['episodes_resumed']} already done, in "
                  f"{t['wall_s']:.1f} s; wrote {out / RESULTS}, {out / REPORT} and {out / TRAJECTORIES}")
    if result.metrics.get("fault_rate"):
        kinds = ", ".join(f"{kind} {n}" for kind, n in result.metrics["faults"].items())
        rule = ("policy faults counted as failures, user and tool faults left out of the metrics"
                if args.sim_faults == "exclude" else "every fault counted as a failure")
        console.print(f"[yellow]{result.metrics['fault_rate']:.1%} of episodes faulted ({kinds}; {rule}; each "
                      "trajectory's metadata.fault says why)[/yellow]")
    return 0


def print_metrics(console: Any, result: Any) -> None:
    """The headline metrics, stop reasons and tool-call mix of one evaluation."""
    from rich.table import Table

    from muarl.evaluate import FAULT_COLUMNS

    m, c, k = result.metrics, result.config, result.k
    # the fault rates by party right after the pass^j rows: pass^1 counts policy faults as failures and
    # leaves user and tool faults out, so it is read together with them
    # then the truncation rate: episodes cut off at a token, context or turn limit, which a success rate
    # cannot tell from clean failures
    keys = [f"pass^{j}" for j in range(1, k + 1)] + [*FAULT_COLUMNS, "truncation_rate", "accuracy", "tcr",
                                                      "avg_turns", "violation_rate", "compliant_success",
                                                      "transfer_rate", "tool_error_rate"]
    table = Table(title=f"eval {c.get('domain')}/{c.get('split')}: {c.get('policy')} x {c.get('user')}, k={k}, "
                        f"{m['tasks']} tasks, {m['episodes']} episodes")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in keys:
        table.add_row(key.replace("_", " "), fmt(m.get(key)))
    console.print(table)
    console.print("stop reasons: " + ", ".join(f"{r} {n}" for r, n in m["stop_reasons"].items()))
    calls = sorted(m["tool_calls"].items(), key=lambda kv: -kv[1])
    console.print("agent tool calls per trial: " + ", ".join(f"{n} {v:.2f}" for n, v in calls))
    if m.get("violations"):
        console.print("violations: " + ", ".join(f"{kind} {n}" for kind, n in m["violations"].items()))
    if m.get("faults"):
        console.print("faulted episodes by kind: " + ", ".join(f"{kind} {n}" for kind, n in m["faults"].items()))
    if m.get("tool_errors"):
        console.print("failed tool calls by error: " + ", ".join(f"{kind} {n}" for kind, n in m["tool_errors"].items()))


def print_tasks(console: Any, result: Any) -> None:
    """The per-task table of one evaluation (``--show-tasks``)."""
    from rich.table import Table

    passes = [f"pass^{j}" for j in range(1, result.k + 1)]
    table = Table(title="per task")
    for col in ("task", "family", "trials", "successes", *passes, "tcr", "turns", "violations"):
        table.add_column(col)
    for r in result.tasks:
        table.add_row(r["task_id"], r["family"], str(r["trials"]), str(r["successes"]),
                      *(fmt(r[p]) for p in passes), fmt(r["tcr"]), fmt(r["avg_turns"]), str(r["violations"]))
    console.print(table)


def fmt(value: Any) -> str:
    """A metric as the tables show it: three decimals, ``-`` where there is none."""
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
