"""muarl's judge against tau2-bench's own evaluator, on gold and on perturbed trajectories.

    python scripts/tau2_agreement.py gold [--domains retail airline telecom]
    python scripts/tau2_agreement.py perturb [--n 360] [--seed 0] [--domains retail airline telecom]

``gold`` plays every task's gold actions through muarl (a fresh ``tau2:<domain>`` env, muarl's episode
messages) and grades the trajectory twice: muarl's ``score`` (final DB equal to the gold replay, by
muarl's hash of the mirrored state, plus required outputs) and tau2's evaluator (its environments built
from its own files, its hashes, env assertions, communicate and action checks over the reward basis).

``perturb`` mutates gold action sequences (drop a write, change an argument of a write, swap two actions,
add another task's write, repeat a write, add a read), replays each through muarl and grades it with
both judges. Agreement is reported on the DB check (muarl ``db_match`` vs tau2 ``db_check``) for every
domain, and on the reward where both judges grade the same thing (retail and airline: DB and
communicated facts). tau2 grades telecom by env assertions instead of DB equality, so there the reward
comparison is reported but is not expected to match on every perturbation.

Writes a JSON report (``--out``, default ``runs/tau2_agreement_<mode>.json``) and exits 1 on any
disagreement that should not happen.
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

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from muarl.bridges.tau2 import bridge, tau2_messages, tau2_reward
from muarl.domain import Domain, get_domain
from muarl.gold import gold_score
from muarl.types import Action, Task

DOMAINS = ["retail", "airline", "telecom"]
#: domains where tau2's reward basis is what muarl's reward measures (DB equality and communicated facts)
SAME_BASIS = {"retail", "airline"}
KINDS = ["drop_write", "change_arg", "swap", "extra_write", "repeat_write", "extra_read"]


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def _is_write(domain: Domain, action: Action) -> bool:
    tools = domain.user_tool_map if action.actor == "user" else domain.agent_tools
    tool = tools.get(action.name)
    return tool is not None and tool.is_write


def _synced_gold_db_match(task: Task, trajectory: Any) -> bool:
    """tau2's DB check with one change: its gold environment runs the gold actions through
    ``get_response`` (which calls ``sync_tools`` after each call, as every predicted call does) instead of
    ``make_tool_call`` (which does not). In telecom ``sync_tools`` derives phone state from the account
    (roaming allowed, data exceeded, payment requests), so tau2's own check fails even the gold trajectory
    of some tasks; this variant shows that this is the only source of disagreement."""
    from tau2.data_model.message import ToolCall

    b = bridge(task.domain.split(":", 1)[1])
    t2 = b.tau2_tasks[task.id]
    init = t2.initial_state
    predicted, gold_env = b.construct(), b.construct()
    predicted.set_state(init.initialization_data if init else None, init.initialization_actions if init else None,
                        tau2_messages(trajectory))
    gold_env.set_state(init.initialization_data if init else None, init.initialization_actions if init else None, [])
    for i, a in enumerate(t2.evaluation_criteria.actions or []):
        gold_env.get_response(ToolCall(id=f"g{i}", name=a.name, arguments=a.arguments, requestor=a.requestor))
    return (predicted.get_db_hash(), predicted.get_user_db_hash()) == (gold_env.get_db_hash(),
                                                                       gold_env.get_user_db_hash())


def _judge(domain: Domain, task: Task, actions: list[Action] | None) -> dict[str, Any]:
    traj = gold_score(domain, task, actions)
    assert traj.reward is not None
    theirs = tau2_reward(task, traj)
    result = {"task": task.id, "muarl_reward": traj.reward.reward, "muarl_db_match": traj.reward.db_match,
              "tau2_reward": theirs["reward"], "tau2_db_match": theirs["db_match"], "tau2_parts": theirs["parts"],
              "failed_calls": sum(not r.ok for r in traj.tool_log), "diff": traj.reward.diff[:5]}
    if theirs["db_match"] != traj.reward.db_match:
        result["tau2_db_match_gold_synced"] = _synced_gold_db_match(task, traj)
    return result


def gold(names: list[str]) -> tuple[dict[str, Any], bool]:
    rows, ok = [], True
    with _progress() as bar:
        for name in names:
            domain = get_domain(f"tau2:{name}")
            tasks = domain.tasks()
            job = bar.add_task(f"gold tau2:{name}", total=len(tasks))
            start = time.perf_counter()
            results = []
            for task in tasks:
                results.append(_judge(domain, task, None))
                bar.advance(job)
            row = {"domain": name, "tasks": len(tasks),
                   "muarl_1": sum(r["muarl_reward"] == 1.0 for r in results),
                   "tau2_1": sum(r["tau2_reward"] == 1.0 for r in results),
                   "both_1": sum(r["muarl_reward"] == 1.0 and r["tau2_reward"] == 1.0 for r in results),
                   "gold_calls_failing": sum(r["failed_calls"] for r in results),
                   "tau2_db_check_1": sum(bool(r["tau2_db_match"]) for r in results),
                   "tau2_db_check_gold_synced_1": sum(bool(r.get("tau2_db_match_gold_synced", r["tau2_db_match"]))
                                                      for r in results),
                   "seconds": round(time.perf_counter() - start, 1),
                   "failures": [r for r in results if r["muarl_reward"] != 1.0 or r["tau2_reward"] != 1.0]}
            ok &= row["both_1"] == row["tasks"]
            rows.append(row)
    return {"mode": "gold", "domains": rows}, ok


def _pools(domain: Domain) -> tuple[dict[tuple[str, str], list[Any]], list[Action], list[Action]]:
    """Argument values seen per (tool, argument) across the domain's gold actions; all writes; all reads."""
    values: dict[tuple[str, str], list[Any]] = defaultdict(list)
    writes, reads = [], []
    for task in domain.tasks():
        for action in task.gold_actions:
            (writes if _is_write(domain, action) else reads).append(action)
            for arg, value in action.arguments.items():
                if value not in values[(action.name, arg)]:
                    values[(action.name, arg)].append(value)
    return values, writes, reads


def _other_value(rng: random.Random, value: Any, pool: list[Any]) -> Any:
    others = [v for v in pool if v != value]
    if others and rng.random() < 0.7:
        return rng.choice(others)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.choice([-1, 1, 10])
    if isinstance(value, list) and value:
        return value[:-1] if len(value) > 1 or rng.random() < 0.5 else value * 2
    if isinstance(value, str) and value:
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    return others[0] if others else value


def perturb_actions(rng: random.Random, domain: Domain, task: Task,
                    pools: tuple[dict, list[Action], list[Action]]) -> tuple[str, list[Action]] | None:
    """One mutation of the task's gold actions, or None when the drawn kind does not apply."""
    values, all_writes, all_reads = pools
    actions = list(task.gold_actions)
    writes = [i for i, a in enumerate(actions) if _is_write(domain, a)]
    kind = rng.choice(KINDS)
    if kind == "drop_write" and writes:
        del actions[rng.choice(writes)]
    elif kind == "change_arg" and writes:
        i = rng.choice(writes)
        args = dict(actions[i].arguments)
        if not args:
            return None
        arg = rng.choice(sorted(args))
        new = _other_value(rng, args[arg], values[(actions[i].name, arg)])
        if new == args[arg]:
            return None
        args[arg] = new
        actions[i] = actions[i].model_copy(update={"arguments": args})
    elif kind == "swap" and len(actions) >= 2:
        i, j = sorted(rng.sample(range(len(actions)), 2))
        if actions[i] == actions[j]:
            return None
        actions[i], actions[j] = actions[j], actions[i]
    elif kind == "extra_write" and all_writes:
        actions.insert(rng.randrange(len(actions) + 1), rng.choice(all_writes))
    elif kind == "repeat_write" and writes:
        i = rng.choice(writes)
        actions.insert(i + 1, actions[i])
    elif kind == "extra_read" and all_reads:
        actions.insert(rng.randrange(len(actions) + 1), rng.choice(all_reads))
    else:
        return None
    return kind, actions


def perturb(names: list[str], n: int, seed: int) -> tuple[dict[str, Any], bool]:
    rng = random.Random(seed)
    per_domain = {name: n // len(names) + (i < n % len(names)) for i, name in enumerate(names)}
    rows, ok = [], True
    with _progress() as bar:
        for name in names:
            domain = get_domain(f"tau2:{name}")
            pools = _pools(domain)
            tasks = domain.tasks()
            job = bar.add_task(f"perturbed tau2:{name}", total=per_domain[name])
            results = []
            start = time.perf_counter()
            while len(results) < per_domain[name]:
                task = rng.choice(tasks)
                drawn = perturb_actions(rng, domain, task, pools)
                if drawn is None:
                    continue
                kind, actions = drawn
                try:
                    result = _judge(domain, task, actions)
                except ValueError as err:  # tau2's replay saw a tool result other than the one muarl returned
                    result = {"task": task.id, "replay_error": str(err)[:300], "muarl_db_match": None,
                              "tau2_db_match": None, "muarl_reward": None, "tau2_reward": None}
                result["kind"] = kind
                results.append(result)
                bar.advance(job)
            db_agree = sum(r["muarl_db_match"] == r["tau2_db_match"] and r["muarl_db_match"] is not None
                           for r in results)
            explained = sum(r["muarl_db_match"] != r["tau2_db_match"]
                            and r.get("tau2_db_match_gold_synced") == r["muarl_db_match"] for r in results)
            reward_agree = sum(r["muarl_reward"] == r["tau2_reward"] and r["muarl_reward"] is not None
                               for r in results)
            row = {"domain": name, "trajectories": len(results), "db_agree": db_agree, "db_agree_gold_synced":
                   db_agree + explained, "reward_agree": reward_agree,
                   "reward_compared": name in SAME_BASIS,
                   "muarl_reward_1": sum(r["muarl_reward"] == 1.0 for r in results),
                   "tau2_reward_1": sum(r["tau2_reward"] == 1.0 for r in results),
                   "kinds": dict(Counter(r["kind"] for r in results)),
                   "seconds": round(time.perf_counter() - start, 1),
                   "disagreements": [r for r in results if r["muarl_db_match"] != r["tau2_db_match"]
                                     or (r["muarl_reward"] != r["tau2_reward"])][:50]}
            ok &= db_agree + explained == len(results) and (name not in SAME_BASIS or reward_agree == len(results))
            rows.append(row)
    return {"mode": "perturb", "seed": seed, "domains": rows}, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["gold", "perturb"])
    parser.add_argument("--domains", nargs="+", choices=DOMAINS, default=DOMAINS)
    parser.add_argument("--n", type=int, default=360, help="perturbed trajectories in all (perturb mode)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON report (default runs/tau2_agreement_<mode>.json)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report, ok = gold(args.domains) if args.mode == "gold" else perturb(args.domains, args.n, args.seed)
    report["seconds"] = round(time.perf_counter() - start, 1)
    out = args.out or Path("runs") / f"tau2_agreement_{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    console = Console()
    table = Table(title=f"tau2 {args.mode}: muarl's judge vs tau2's evaluator")
    if args.mode == "gold":
        for col in ("domain", "tasks", "muarl 1.0", "tau2 1.0", "both 1.0", "tau2 DB check", "(gold synced)",
                    "failing gold calls", "seconds"):
            table.add_column(col)
        for r in report["domains"]:
            table.add_row(r["domain"], str(r["tasks"]), str(r["muarl_1"]), str(r["tau2_1"]), str(r["both_1"]),
                          str(r["tau2_db_check_1"]), str(r["tau2_db_check_gold_synced_1"]),
                          str(r["gold_calls_failing"]), str(r["seconds"]))
    else:
        for col in ("domain", "trajectories", "DB check agrees", "(gold synced)", "reward agrees", "muarl 1.0",
                    "tau2 1.0"):
            table.add_column(col)
        for r in report["domains"]:
            reward = f"{r['reward_agree']}" + ("" if r["reward_compared"] else " (different basis)")
            table.add_row(r["domain"], str(r["trajectories"]), str(r["db_agree"]), str(r["db_agree_gold_synced"]),
                          reward, str(r["muarl_reward_1"]), str(r["tau2_reward_1"]))
            console.print(f"{r['domain']} perturbations: {r['kinds']}")
    console.print(table)
    console.print(f"report: {out}; {report['seconds']} s; " + ("[green]agreement[/green]" if ok else "[red]DISAGREEMENT[/red]"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
