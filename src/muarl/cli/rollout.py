"""``muarl rollout``: episodes of a policy against a simulated user, saved as they finish, with a summary;
the raw material the other commands score, view and train on."""

from __future__ import annotations

import argparse
import json

from muarl.cli import options

NAME = "rollout"
HELP = "run episodes of a policy against a simulated user and save them"


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.matchup(p)
    p.add_argument("--n", type=int, default=1, help="episodes per task (a GRPO group)")
    p.add_argument("--out", required=True, help="run directory; trajectories.jsonl is appended as episodes finish")
    p.add_argument("--limit", type=int, help="only the first N tasks of the split")
    options.concurrency(p)
    options.episode(p, temperature=1.0)
    p.add_argument("--independent-users", action="store_true",
                   help="give each group member its own user seed (default: one seed per group)")
    options.limits(p)


def run(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from muarl.evaluate import kept_note
    from muarl.faults import SIDES, require_unfaulted
    from muarl.files import atomic_write
    from muarl.provenance import record
    from muarl.rollout import RolloutEngine
    from muarl.train.diskspace import reported

    options.check_positive(args, "n", "limit", "concurrency", "max_turns", "max_new_tokens")
    domain, tasks, policy, user = options.matchup_of(args)
    out = Path(args.out)
    # a full disk (an episode's line, the summary): one line naming the folder; a rerun resumes
    with reported(out, "writing the rollout", lambda: kept_note(out / "trajectories.jsonl")):
        out.mkdir(parents=True, exist_ok=True)
        engine = RolloutEngine(domain, policy, user, options.episode_config(args), group_size=args.n,
                               concurrency=args.concurrency, common_user_seed=not args.independent_users,
                               seed=args.seed, out=out / "trajectories.jsonl")
        groups = asyncio.run(engine.run(tasks))
        trajs = [t for g in groups for t in g]
        # what was used, as given (module:attr for a plug-in), so `muarl view` finds the tasks again
        summary = {"domain": args.domain, "split": args.split, "policy": args.policy, "user": args.user,
                   **summarize(trajs), "provenance": record([domain], policy, user, args.policy, args.user)}
        atomic_write(out / "summary.json", json.dumps(summary, indent=1) + "\n")  # whole or not at all
    console = Console()
    table = Table(title=f"rollout {args.domain}/{args.split}: {args.policy} x {args.user}, n={args.n}")
    columns = {"episodes": "episodes", "success": "success", **{f"{side}_fault_rate": f"{side} faults"
                                                                for side in SIDES},
               "tcr": "tcr", "violation_rate": "violation rate", "mean_turns": "mean turns",
               "malformed_calls": "malformed calls"}
    for label in columns.values():
        table.add_column(label)
    table.add_row(*(str(summary[k]) for k in columns))
    console.print(table)
    console.print(f"stop reasons: {summary['stop_reasons']}")
    if summary["faults"]:
        console.print(f"[yellow]faulted episodes by kind: {summary['faults']} (each trajectory's metadata.fault "
                      "says why)[/yellow]")
    console.print(f"trajectories: {out / 'trajectories.jsonl'}")
    require_unfaulted(trajs, f"rollout; the trajectories are in {out / 'trajectories.jsonl'}")
    return 0


def summarize(trajs: list) -> dict:
    """``summary.json``'s metrics of a rollout: success, fault rates by party, TCR, violations, turns."""
    from collections import Counter

    from muarl.faults import counts_against_policy, fault_counts, fault_rates

    # user and tool faults say nothing about the agent; a policy fault is the agent failing (reward 0)
    trials = [t for t in trajs if counts_against_policy(t)]
    n = max(len(trials), 1)
    scored = [(t.reward if t.reward is not None and not t.fault_kind else None) for t in trials]
    return {
        "episodes": len(trajs),
        "success": round(sum(r.reward for r in scored if r) / n, 4),
        **fault_rates(trajs),
        "tcr": round(sum(r.tcr for r in scored if r) / n, 4),
        "violation_rate": round(sum(bool(t.reward and t.reward.violations) for t in trials) / n, 4),
        "sim_faults": sum(t.sim_fault for t in trajs),
        "mean_turns": round(sum(t.turns for t in trials) / n, 2),
        "malformed_calls": sum(t.malformed_calls for t in trajs),
        "faults": fault_counts(trajs),
        "tool_errors": dict(Counter(r.error or "error" for t in trajs for r in t.tool_log if not r.ok)),
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs).most_common()),
    }
