"""Pool several ``muarl demo`` runs (one per seed): each seed's change, and the paired bootstrap over
tasks of all seeds together (a task of seed 0 and the same task of seed 1 are separate pairs).

    python scripts/demo_seeds.py runs/demo-s0 runs/demo-s1 runs/demo-s2

Prints a markdown table (the README's demo table) and the pooled 95% intervals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from muarl.compare import load_run, paired_bootstrap

METRICS = ("pass^1", "violation_rate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="demo run directories (each with eval-sft/ and eval-rl/)")
    args = parser.parse_args()
    pooled: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in METRICS}
    print("| seed | cold start pass^1 | after RL pass^1 | change | violations before -> after | minutes |")
    print("|---|---|---|---|---|---|")
    for run in map(Path, args.runs):
        before, after = load_run(run / "eval-sft"), load_run(run / "eval-rl")
        rows_a, rows_b = ({r["task_id"]: r for r in x.tasks} for x in (before, after))
        for metric in METRICS:
            for task, row in rows_a.items():
                if task in rows_b and row.get(metric) is not None and rows_b[task].get(metric) is not None:
                    pooled[metric][0].append(row[metric])
                    pooled[metric][1].append(rows_b[task][metric])
        summary = json.loads((run / "summary.json").read_text())
        a, b = before.metrics["pass^1"], after.metrics["pass^1"]
        print(f"| {summary['seed']} | {a:.3f} | {b:.3f} | {b - a:+.3f} | {before.metrics['violation_rate']:.3f} -> "
              f"{after.metrics['violation_rate']:.3f} | {summary['total_seconds'] / 60:.1f} |")
    for metric, (a, b) in pooled.items():
        mean, low, high = paired_bootstrap(a, b)
        print(f"pooled {metric}: {sum(a) / len(a):.3f} -> {sum(b) / len(b):.3f}, change {mean:+.3f}, "
              f"95% interval [{low:+.3f}, {high:+.3f}] over {len(a)} task pairs")


if __name__ == "__main__":
    main()
