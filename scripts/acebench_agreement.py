"""muarl's judgement against ACEBench's own checker, on gold and on perturbed trajectories.

    MUARL_ACEBENCH_DATA=tests/data/acebench/data_en python scripts/acebench_agreement.py gold
    MUARL_ACEBENCH_DATA=tests/data/acebench/data_en python scripts/acebench_agreement.py perturb [--n 200] [--seed 0]

Both judges grade the same muarl trajectory (the task's gold actions, or a mutation of them, played as a
conversation by ``muarl.gold``):

- muarl's: the episode ran through muarl (its env, its tools executing the calls on the episode's own
  scenario instances); the reward is ACEBench's ``check_agent_end_state`` on that end state, the process
  score muarl's milestone match by value (full credit when the end state is right);
- ACEBench's (``muarl.bridges.acebench.acebench_judge``): the agent messages rendered as ACEBench call
  texts, decoded and executed by evalscope's ACEBench rollout on fresh instances, graded by its checker
  and its ``milestone_accuracy`` on the raw texts, combined as evalscope's adapter does.

``gold`` grades each item's oracle (the milestones reconciled with the end state) and its raw first
milestone sequence. ``perturb`` mutates oracles: drop a call, repeat a call, swap two calls, change an
argument (to a value another item uses, or a small edit). Reward agreement must be total (exit 1
otherwise); the process scores are compared and their differences listed, since ACEBench compares
milestone texts character by character and muarl compares calls. muarl's strict end-state check is
reported beside (how often it is stricter than ACEBench's checker).

Writes a JSON report (``--out``, default ``runs/acebench_agreement_<mode>.json``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from muarl.bridges.acebench import acebench_judge
from muarl.bridges.acebench_data import CATEGORIES, parse_calls
from muarl.bridges.acebench_evalscope import module
from muarl.domain import Domain, get_domain
from muarl.gold import gold_score
from muarl.types import Action, Task

KINDS = ["drop", "repeat", "swap", "change_arg"]


def judge(domain: Domain, task: Task, actions: list[Action] | None) -> dict[str, Any]:
    """Both judges on the trajectory of ``actions`` (default: the task's gold actions)."""
    traj = gold_score(domain, task, actions)
    assert traj.reward is not None
    theirs = acebench_judge(task, traj)
    strict = next(c for c in traj.reward.checks if "strict" in c.name)
    return {"task": task.id, "muarl_reward": traj.reward.reward, "acebench_acc": theirs["acc"],
            "muarl_process": traj.reward.tcr, "acebench_process": theirs["process_acc"],
            "muarl_strict": strict.passed, "strict_detail": strict.detail,
            "muarl_diff": traj.reward.diff[:3], "acebench_error": theirs["error"][:3]}


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"trajectories": len(results),
            "reward_agree": sum(r["muarl_reward"] == r["acebench_acc"] for r in results),
            "process_agree": sum(abs(r["muarl_process"] - r["acebench_process"]) < 1e-9 for r in results),
            "process_muarl_higher": sum(r["muarl_process"] > r["acebench_process"] + 1e-9 for r in results),
            "muarl_1": sum(r["muarl_reward"] == 1.0 for r in results),
            "acebench_1": sum(r["acebench_acc"] == 1.0 for r in results),
            "strict_1": sum(r["muarl_strict"] for r in results),
            "reward_disagreements": [r for r in results if r["muarl_reward"] != r["acebench_acc"]][:50],
            "process_disagreements": [r for r in results
                                      if abs(r["muarl_process"] - r["acebench_process"]) >= 1e-9][:50]}


def gold(categories: list[str]) -> tuple[dict[str, Any], bool]:
    rows, ok = [], True
    for category in categories:
        domain = get_domain(f"acebench:{category}")
        start = time.perf_counter()
        oracle, raw = [], []
        for task in domain.tasks():
            oracle.append(judge(domain, task, None))
            first = task.context["acebench"]["gold"] == "milestones"
            stones = [Action(name=n, arguments=a) for text in _first_milestones(task) for n, a in parse_calls(text)]
            raw.append(judge(domain, task, None if first else stones) | {"gold": task.context["acebench"]["gold"]})
        row = {"category": category, "oracle": _summary(oracle), "raw_milestones": _summary(raw),
               "repaired": {t.id: t.context["acebench"]["gold"] for t in domain.tasks()
                            if t.context["acebench"]["gold"] != "milestones"},
               "seconds": round(time.perf_counter() - start, 2)}
        ok &= row["oracle"]["muarl_1"] == row["oracle"]["acebench_1"] == len(oracle)
        ok &= row["raw_milestones"]["reward_agree"] == len(raw)
        rows.append(row)
    return {"mode": "gold", "categories": rows}, ok


def _first_milestones(task: Task) -> list[str]:
    from muarl.bridges.acebench import item_of

    return item_of(task).milestones[0]


def _pools(domains: list[Domain]) -> dict[tuple[str, str], list[Any]]:
    """Argument values seen per (function, argument) across all oracles."""
    values: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for domain in domains:
        for task in domain.tasks():
            for action in task.gold_actions:
                for arg, value in action.arguments.items():
                    if value not in values[(action.name, arg)]:
                        values[(action.name, arg)].append(value)
    return values


def _other_value(rng: random.Random, value: Any, pool: list[Any]) -> Any:
    others = [v for v in pool if v != value]
    if others and rng.random() < 0.6:
        return rng.choice(others)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.choice([-1, 1, 2])
    if isinstance(value, list) and value:
        return value[:-1] if len(value) > 1 else value * 2
    if isinstance(value, str) and value:
        return value[:-1] + ("x" if value[-1] != "x" else "y")
    return others[0] if others else value


def perturb_actions(rng: random.Random, task: Task, pool: dict[tuple[str, str], list[Any]]
                    ) -> tuple[str, list[Action]] | None:
    """One mutation of the task's oracle, or None when the drawn kind does not apply."""
    actions = list(task.gold_actions)
    kind = rng.choice(KINDS)
    if not actions:
        return None
    if kind == "drop":
        del actions[rng.randrange(len(actions))]
    elif kind == "repeat":
        i = rng.randrange(len(actions))
        actions.insert(i + 1, actions[i])
    elif kind == "swap" and len(actions) >= 2:
        i, j = sorted(rng.sample(range(len(actions)), 2))
        if actions[i] == actions[j]:
            return None
        actions[i], actions[j] = actions[j], actions[i]
    elif kind == "change_arg":
        with_args = [i for i, a in enumerate(actions) if a.arguments]
        if not with_args:
            return None
        i = rng.choice(with_args)
        args = dict(actions[i].arguments)
        arg = rng.choice(sorted(args))
        new = _other_value(rng, args[arg], pool[(actions[i].name, arg)])
        if new == args[arg]:
            return None
        args[arg] = new
        actions[i] = actions[i].model_copy(update={"arguments": args})
    else:
        return None
    return kind, actions


def perturb(categories: list[str], n: int, seed: int) -> tuple[dict[str, Any], bool]:
    rng = random.Random(seed)
    domains = [get_domain(f"acebench:{c}") for c in CATEGORIES]
    pool = _pools(domains)
    per = {c: n // len(categories) + (i < n % len(categories)) for i, c in enumerate(categories)}
    rows, ok = [], True
    for category in categories:
        domain = get_domain(f"acebench:{category}")
        tasks = domain.tasks()
        start = time.perf_counter()
        results: list[dict[str, Any]] = []
        while len(results) < per[category]:
            task = rng.choice(tasks)
            drawn = perturb_actions(rng, task, pool)
            if drawn is None:
                continue
            kind, actions = drawn
            results.append(judge(domain, task, actions) | {"kind": kind})
        row = {"category": category, **_summary(results), "kinds": dict(Counter(r["kind"] for r in results)),
               "seconds": round(time.perf_counter() - start, 2)}
        ok &= row["reward_agree"] == len(results)
        rows.append(row)
    return {"mode": "perturb", "seed": seed, "categories": rows}, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["gold", "perturb"])
    parser.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES))
    parser.add_argument("--n", type=int, default=200, help="perturbed trajectories in all (perturb mode)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON report (default runs/acebench_agreement_<mode>.json)")
    args = parser.parse_args(argv)
    module("rollout")  # ACEBench's executor: fail here, with the install hint, if it cannot be imported
    start = time.perf_counter()
    report, ok = gold(args.categories) if args.mode == "gold" else perturb(args.categories, args.n, args.seed)
    report["seconds"] = round(time.perf_counter() - start, 1)
    out = args.out or Path("runs") / f"acebench_agreement_{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for row in report["categories"]:
        parts = [("oracle", row["oracle"]), ("raw milestones", row["raw_milestones"])] if args.mode == "gold" \
            else [("perturbed", row)]
        for label, s in parts:
            print(f"acebench:{row['category']} {label}: {s['trajectories']} trajectories, reward agrees "
                  f"{s['reward_agree']}, process agrees {s['process_agree']} (muarl higher on {s['process_muarl_higher']}), muarl 1.0 {s['muarl_1']}, "
                  f"ACEBench 1.0 {s['acebench_1']}, muarl strict {s['strict_1']}")
        if args.mode == "perturb":
            print(f"  kinds {row['kinds']}")
    print(f"report: {out}; {report['seconds']} s; {'agreement' if ok else 'DISAGREEMENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
