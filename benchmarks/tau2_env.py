"""Cost of one tau2 episode's environment: muarl's bridge vs building it the way tau2 does.

    python benchmarks/tau2_env.py [--repeats 5]

For each tau2 domain: tau2's own ``get_environment()`` (parses the JSON database into pydantic models),
a ``tau2:<domain>`` env from muarl (copy-on-write over the parse cached once per process, the task's
starting state applied, the muarl view in sync), the hash at the end of an episode after the task's
gold actions (muarl's mirror hash vs tau2's ``get_db_hash``), all as medians over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from muarl.bridges.tau2 import bridge
from muarl.domain import get_domain


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| domain | tau2 get_environment() | muarl env | speed-up | muarl hash after gold | tau2 get_db_hash |")
    print("|---|---|---|---|---|---|")
    for name in ("retail", "airline", "telecom"):
        domain = get_domain(f"tau2:{name}")
        task = domain.tasks()[0]
        domain.env(task).hash()  # the one-time parse and base digest
        parse = _median_ms(bridge(name).construct, args.repeats)
        create = _median_ms(lambda d=domain, t=task: d.env(t), args.repeats * 20)
        env = domain.env(task)
        for action in task.gold_actions:
            env.run(action)
        ours = _median_ms(env.hash, args.repeats)
        theirs = _median_ms(env.world.env.get_db_hash, args.repeats)
        print(f"| {name} | {parse:.1f} ms | {create:.2f} ms | {parse / create:,.0f}x | {ours:.3f} ms | {theirs:.1f} ms |")


if __name__ == "__main__":
    main()
