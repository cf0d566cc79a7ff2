"""``muarl eval``, ``muarl compare`` and ``muarl chat``: the evaluation commands (issue 5).

Kept out of cli.py so they can change without touching the shared parser; ``add_commands`` registers
their subparsers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from muarl.factory import POLICY_FORMS as POLICIES
from muarl.factory import USER_FORMS
from muarl.types import SPLITS


def _episode_config(args: argparse.Namespace) -> Any:
    from muarl.rollout import EpisodeConfig

    return EpisodeConfig(max_turns=args.max_turns, end_on_malformed=args.end_on_malformed,
                         require_outputs=not args.no_required_outputs, **limit_kwargs(args))


def add_limit_options(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    """``--user-timeout``, ``--agent-timeout``, ``--tool-timeout``, ``--user-http-timeout`` and
    ``--user-max-tokens`` (eval, rollout, synth, grpo): a party that hits its limit faults its episode
    instead of hanging the run; a user message that hits its token cap ends there.

    With ``defaults=False`` an option left out is None, for commands whose config holds the defaults."""
    from muarl.rollout import AGENT_TIMEOUT_S, TOOL_TIMEOUT_S, USER_TIMEOUT_S
    from muarl.users.llm import HTTP_TIMEOUT_S

    for flag, default, what in (("--user-timeout", USER_TIMEOUT_S, "one user turn (device actions included)"),
                                ("--agent-timeout", AGENT_TIMEOUT_S, "one agent turn"),
                                ("--tool-timeout", TOOL_TIMEOUT_S, "one tool call")):
        p.add_argument(flag, type=float, default=default if defaults else None, metavar="SECONDS",
                       help=f"time limit of {what}; past it the episode is a fault (default {default:g}; 0: "
                            "no limit)")
    p.add_argument("--user-http-timeout", type=float, default=None, metavar="SECONDS",
                   help=f"llm: users: seconds one HTTP request to the user's endpoint may take before it is "
                        f"retried (default {HTTP_TIMEOUT_S:g})")
    p.add_argument("--user-max-tokens", type=int, default=None, metavar="N",
                   help="llm: users: the most tokens one user message may take (default: the server's limit, "
                        "the context; cap it for a user model that does not end its turns)")


def limit_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The time limits given on the command line, as :class:`~muarl.rollout.EpisodeConfig` fields (0: none)."""
    given = {name: getattr(args, name, None) for name in ("user_timeout", "agent_timeout", "tool_timeout")}
    return {name: value or None for name, value in given.items() if value is not None}


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Refuse a count below 1 in one line naming the option (before it reaches code with other names)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")


def _eval_cmd(args: argparse.Namespace) -> int:
    from muarl.domain import get_domain
    from muarl.evaluate import REPORT, RESULTS, TRAJECTORIES, evaluate
    from muarl.factory import make_policy, make_user

    check_positive(args, "k", "limit", "concurrency", "max_turns", "max_new_tokens")
    domain = get_domain(args.domain)
    tasks = domain.tasks(args.split)
    if args.tasks:
        by_id = {t.id: t for t in domain.tasks()}
        missing = [t for t in args.tasks if t not in by_id]
        if missing:
            raise ValueError(f"domain {domain.name} has no task(s) {', '.join(missing)} "
                             f"(e.g. {', '.join(t.id for t in tasks[:3])})")
        tasks = [by_id[t] for t in dict.fromkeys(args.tasks)]
    if args.limit:
        tasks = tasks[: args.limit]
    policy = make_policy(args.policy, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                         seed=args.seed)
    user = make_user(args.user, http_timeout=args.user_http_timeout, max_tokens=args.user_max_tokens)
    # the specs as given (module:attr for a plug-in), so view, compare and a resume find them again
    meta = {"domain": args.domain, "policy": args.policy, "user": args.user, "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens, "split": "+".join(sorted({t.split for t in tasks}))}
    out = Path(args.out)
    result = evaluate(domain, policy, user, tasks, k=args.k, out_dir=out, config=_episode_config(args),
                      seed=args.seed, concurrency=args.concurrency, progress=not args.quiet,
                      sim_faults=args.sim_faults, meta=meta)
    console = Console()
    print_metrics(console, result)
    if args.show_tasks:
        print_tasks(console, result)
    t = result.timing
    console.print(f"{t['episodes_run']} episodes played, {t['episodes_resumed']} already done, in "
                  f"{t['wall_s']:.1f} s; wrote {out / RESULTS}, {out / REPORT} and {out / TRAJECTORIES}")
    if result.metrics.get("fault_rate"):
        kinds = ", ".join(f"{kind} {n}" for kind, n in result.metrics["faults"].items())
        rule = ("policy faults counted as failures, user and tool faults left out of the metrics"
                if args.sim_faults == "exclude" else "every fault counted as a failure")
        console.print(f"[yellow]{result.metrics['fault_rate']:.1%} of episodes faulted ({kinds}; {rule}; each "
                      "trajectory's metadata.fault says why)[/yellow]")
    return 0


def print_metrics(console: Console, result: Any) -> None:
    """The headline metrics, stop reasons and tool-call mix of one evaluation."""
    from muarl.evaluate import FAULT_COLUMNS

    m, c, k = result.metrics, result.config, result.k
    # the fault rates by party right after the pass^j rows: pass^1 counts policy faults as failures and
    # leaves user and tool faults out, so it is read together with them
    keys = [f"pass^{j}" for j in range(1, k + 1)] + [*FAULT_COLUMNS, "accuracy", "tcr", "avg_turns",
                                                      "violation_rate", "transfer_rate", "tool_error_rate"]
    table = Table(title=f"eval {c.get('domain')}/{c.get('split')}: {c.get('policy')} x {c.get('user')}, k={k}, "
                        f"{m['tasks']} tasks, {m['episodes']} episodes")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in keys:
        table.add_row(key.replace("_", " "), _fmt(m.get(key)))
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


def print_tasks(console: Console, result: Any) -> None:
    passes = [f"pass^{j}" for j in range(1, result.k + 1)]
    table = Table(title="per task")
    for col in ("task", "family", "trials", "successes", *passes, "tcr", "turns", "violations"):
        table.add_column(col)
    for r in result.tasks:
        table.add_row(r["task_id"], r["family"], str(r["trials"]), str(r["successes"]),
                      *(_fmt(r[p]) for p in passes), _fmt(r["tcr"]), _fmt(r["avg_turns"]), str(r["violations"]))
    console.print(table)


def _compare_cmd(args: argparse.Namespace) -> int:
    from muarl.compare import compare_pairs, load_run

    check_positive(args, "samples")
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
        table.add_row(d["metric"].replace("_fault_rate", " fault rate"), _fmt(d["a"]), _fmt(d["b"]),
                      f"{d['diff']:+.3f}", f"[{d['low']:+.3f}, {d['high']:+.3f}]", mark, str(d["tasks"]),
                      *([str(d["pairs"])] if several else []))
    console.print(table)
    if report["only_a"] or report["only_b"]:
        console.print(f"[yellow]{report['only_a']} task(s) only in A and {report['only_b']} only in B were left "
                      "out[/yellow]")
    sig = [d["metric"] for d in report["metrics"] if d["excludes_zero"]]
    console.print("differences whose interval excludes 0: " + (", ".join(sig) if sig else "none"))
    _print_provenances(report["provenance"])
    return 0


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
    import sys

    for line in found["warnings"]:
        print(f"warning: {prefix}the runs differ in {line}", file=sys.stderr)
    if found["note"]:
        print(f"note: {prefix}{found['note']}", file=sys.stderr)


def _chat_cmd(args: argparse.Namespace) -> int:
    from muarl.domain import get_domain
    from muarl.factory import make_policy
    from muarl.human import run_chat

    check_positive(args, "max_turns", "max_new_tokens")
    domain = get_domain(args.domain)
    if args.task:
        task = domain.task(args.task)
    else:
        tasks = domain.tasks(args.split)
        if not tasks:
            raise ValueError(f"domain {domain.name} has no {args.split} tasks")
        task = tasks[0]
    policy = make_policy(args.policy, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                         seed=args.seed)
    run_chat(domain, task, policy, config=_episode_config(args), save=args.save)
    return 0


def _episode_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-turns", type=int, default=30, help="tool executions + user replies per episode")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="per assistant message (token backends)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of model backends (default 0: greedy, as the paper validates)")
    p.add_argument("--seed", type=int, default=0, help="user seeds and model sampling derive from it")
    p.add_argument("--end-on-malformed", action="store_true", help="end an episode on a malformed tool call")
    p.add_argument("--no-required-outputs", action="store_true",
                   help="grade the database only (default: required outputs must be said, as in evaluation)")


def add_commands(sub: Any) -> None:
    """Add ``eval``, ``compare`` and ``chat`` to the ``muarl`` subcommands."""
    from muarl.evaluate import SIM_FAULT_MODES

    p = sub.add_parser("eval", help="evaluate a policy against a user: pass^1..pass^k, accuracy, TCR, ... "
                                    "(resumable)")
    p.add_argument("--domain", required=True, help="domain name (see `muarl domains`) or module:attr")
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--policy", default="expert", help=POLICIES)
    p.add_argument("--user", default="scripted", help=USER_FORMS)
    p.add_argument("--k", type=int, default=4, help="trials per task, each with its own user seed (default 4); pass^1..pass^k")
    p.add_argument("--out", required=True,
                   help="run directory: results.json, results.md, trajectories.jsonl; rerun it to resume")
    p.add_argument("--limit", type=int, help="only the first N tasks")
    p.add_argument("--tasks", nargs="+", metavar="ID", help="only these task ids (any split)")
    p.add_argument("--concurrency", type=int, default=64, help="episodes in flight at once (default 64)")
    p.add_argument("--sim-faults", choices=SIM_FAULT_MODES, default="exclude",
                   help="episodes a user or tool fault (or timeout) ended: left out of the metrics (default) or "
                        "counted as failures; a policy fault is always a failure")
    p.add_argument("--show-tasks", action="store_true", help="also print the per-task table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _episode_options(p)
    add_limit_options(p)
    p.set_defaults(func=_eval_cmd)

    p = sub.add_parser("compare", help="per-metric differences of eval runs (B - A) with bootstrap CIs over tasks; "
                                       "several pairs (one per seed) pool, a task's pairs resampled together")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="RUN_A RUN_B: the baseline run directory (or its results.json) and the run compared with it "
                        "(differences are B - A); more pairs RUN_A2 RUN_B2 ... (say one per training seed) pool into "
                        "one estimate with a cluster bootstrap over tasks")
    p.add_argument("--metrics", nargs="+", help="default: pass^1..pass^k (k shared), policy_fault_rate, "
                                                "user_fault_rate, tool_fault_rate, accuracy, tcr, avg_turns, "
                                                "violation_rate, transfer_rate")
    p.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples")
    p.add_argument("--confidence", type=float, default=0.95, help="interval coverage")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_compare_cmd)

    p = sub.add_parser("chat", help="play the user yourself against any policy; tool calls shown as they happen")
    p.add_argument("--domain", required=True, help="domain name (see `muarl domains`) or module:attr")
    p.add_argument("--task", help="task id (default: the first task of --split)")
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--policy", default="expert", help=POLICIES)
    p.add_argument("--save", help="append the scored conversation to this JSONL file (a trajectory per line)")
    _episode_options(p)
    p.set_defaults(func=_chat_cmd)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
