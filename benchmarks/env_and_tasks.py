"""Env creation cost and task generation speed for the built-in domains.

    python benchmarks/env_and_tasks.py [--tasks 10000] [--task-db-size 2000] [--domains retail airline telecom]

Env creation is compared, in the same run, against the two ways other stacks give each rollout its own
database: a deep copy of the parsed data, and re-parsing the JSON file (what the MUA-RL release does).
The end-of-episode DB hash of a view is compared against hashing the materialised database.
Task generation draws 10,000 verified tasks from a database of --task-db-size users (the default
databases are small; distinct tasks need enough users).
Targets (issue 2): env creation < 1 ms at the default size; 10,000 tasks per domain generated.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable

from muarl.db import record_hash, to_json
from muarl.domain import get_domain


def per_call(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds per call over 5 rounds of ``repeat`` calls."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        rounds.append((time.perf_counter() - start) / repeat)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks to generate per domain")
    parser.add_argument("--task-db-size", type=int, default=2000, help="users in the database tasks are drawn from")
    parser.add_argument("--domains", nargs="+", default=["retail", "airline", "telecom"])
    args = parser.parse_args()
    print(f"{'domain':8} {'records':>8} {'env (us)':>9} {'deepcopy (ms)':>14} {'json parse (ms)':>16} "
          f"{'vs deepcopy':>12} {'vs parse':>9} {'hash (us)':>10} {'full hash (ms)':>15} {'vs full':>8} "
          f"{'tasks':>7} {'gen (s)':>8} {'tasks/s':>8}")
    for name in args.domains:
        domain = get_domain(name)
        db = domain.database()
        plain = db.to_dict()
        text = to_json(plain)
        records = sum(len(t) for t in plain.values())
        env_s = per_call(domain.env, 2000)
        copy_s = per_call(lambda plain=plain: copy.deepcopy(plain), 3)
        parse_s = per_call(lambda text=text: json.loads(text), 3)
        task = next(t for t in domain.tasks("test") if t.gold_actions)
        env = domain.env(task)
        for action in task.gold_actions:
            env.run(action)
        hash_s = per_call(env.hash, 200)
        full_s = per_call(lambda env=env: record_hash(env.db.to_dict()), 3)
        n = args.tasks
        counts = {"train": int(n * 0.8), "dev": n // 10, "test": n - int(n * 0.8) - n // 10}
        big = domain.with_database(size=args.task_db_size)
        big.database()
        start = time.perf_counter()
        tasks = big.generate_tasks(seed=12345, counts=counts)
        gen_s = time.perf_counter() - start
        assert len(tasks) == n
        print(f"{name:8} {records:8d} {env_s * 1e6:9.2f} {copy_s * 1e3:14.2f} {parse_s * 1e3:16.2f} "
              f"{copy_s / env_s:11.0f}x {parse_s / env_s:8.0f}x {hash_s * 1e6:10.1f} {full_s * 1e3:15.2f} "
              f"{full_s / hash_s:7.0f}x {n:7d} {gen_s:8.2f} {n / gen_s:8.0f}")


if __name__ == "__main__":
    main()
