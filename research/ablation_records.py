"""Per-task records of `muarl ablate` evaluations, kept in the repository, and the three-arm table pooled
over seeds from them (research/user-in-the-loop-ablation.md, "Three seeds").

A run directory does not outlive the machine it ran on; these records do, so later seeds pool with earlier
ones. A record is one evaluation's tasks from its ``results.json``: rewards per trial, the number of trials
that broke the policy, and the share that succeeded without breaking it.

    python research/ablation_records.py keep runs/ablate-nopen-s0 runs/ablate-method-s0 --to research/data/ablation-s0
    python research/ablation_records.py pool research/data/ablation-s0 research/data/ablation-s1 research/data/ablation-s2

``pool`` reads, per seed folder, the method from the method run's ``rl-scripted`` arm, the method without the
violation penalty from the no-penalty run's ``rl-scripted`` and the tuned static arm from its ``rl-static``
(trained with the same reward), and checks that both runs' cold-start evaluations are the same episodes.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from muarl.compare import cluster_bootstrap

METRICS = ("pass^1", "violation rate", "clean success")
ARMS = {  # arm of the table: (run whose record it is, arm inside that run)
    "cold start": ("nopen", "cold-start"),
    "method": ("method", "rl-scripted"),
    "no penalty": ("nopen", "rl-scripted"),
    "tuned static": ("nopen", "rl-static"),
}
PAIRS = (("tuned static", "method", "both causes"), ("tuned static", "no penalty", "the user in the loop"),
         ("no penalty", "method", "the penalty"))


def keep(runs: list[Path], to: Path) -> None:
    """Write each evaluation of each run in ``runs`` as ``<run>.<arm>.<user>.json`` under ``to``."""
    to.mkdir(parents=True, exist_ok=True)
    for run in runs:
        for results in sorted(run.glob("eval/*/*/results.json")):
            arm, user = results.parent.parent.name, results.parent.name
            data = json.loads(results.read_text())
            record = {"from": str(results), "pass^1": data["metrics"]["pass^1"],
                      "tasks": [{key: task[key] for key in ("task_id", "rewards", "violations", "compliant_success")}
                                for task in data["tasks"]]}
            target = to / f"{run.name}.{arm}.{user}.json"
            target.write_text(json.dumps(record, indent=0) + "\n")
            print(f"{target}: pass^1 {record['pass^1']}")


def _record(folder: Path, run: str, arm: str, user: str) -> dict[str, tuple[float, float, float]]:
    """Each task's (pass^1, violation rate, clean success) in one kept evaluation."""
    matches = sorted(folder.glob(f"ablate-{run}-s*.{arm}.{user}.json"))
    if len(matches) != 1:
        raise SystemExit(f"{folder}: expected one record of the {run} run's {arm} arm with the {user} user, "
                         f"found {len(matches)}")
    tasks = json.loads(matches[0].read_text())["tasks"]
    return {t["task_id"]: (sum(r >= 1 for r in t["rewards"]) / len(t["rewards"]),
                           t["violations"] / len(t["rewards"]), t["compliant_success"]) for t in tasks}


def pool(folders: list[Path], user: str) -> str:
    """The markdown tables: each arm per seed and pooled, and the three paired differences clustered by task."""
    seeds = []
    for folder in folders:
        arms = {name: _record(folder, run, arm, user) for name, (run, arm) in ARMS.items()}
        if _record(folder, "method", "cold-start", user) != arms["cold start"]:
            raise SystemExit(f"{folder}: the two runs' cold-start evaluations differ; they are not one cold start")
        seeds.append((folder.name, arms))
    lines = ["| arm | " + " | ".join(f"{m}, per seed" for m in METRICS) + " | "
             + " | ".join(f"{m}, pooled" for m in METRICS) + " |", "|---" * (1 + 2 * len(METRICS)) + "|"]
    for name in ARMS:
        per_seed = [[sum(v[i] for v in arms[name].values()) / len(arms[name]) for _, arms in seeds]
                    for i in range(len(METRICS))]
        lines.append(f"| {name} | " + " | ".join(" / ".join(f"{x:.3f}" for x in xs) for xs in per_seed) + " | "
                     + " | ".join(f"{sum(xs) / len(xs):.3f}" for xs in per_seed) + " |")
    lines += ["", "| paired difference (cluster bootstrap over tasks, all seeds) | " + " | ".join(METRICS) + " |",
              "|---" * (1 + len(METRICS)) + "|"]
    for a, b, cause in PAIRS:
        cells = []
        for i in range(len(METRICS)):
            clusters: dict[str, list[float]] = collections.defaultdict(list)
            for _, arms in seeds:
                for task, values in arms[a].items():
                    clusters[task].append(arms[b][task][i] - values[i])
            mean, low, high = cluster_bootstrap(list(clusters.values()))
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        lines.append(f"| {b} - {a} ({cause}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    keeping = commands.add_parser("keep", help="keep the per-task records of ablate runs")
    keeping.add_argument("runs", nargs="+", type=Path, help="muarl ablate run directories")
    keeping.add_argument("--to", type=Path, required=True, help="the folder of one seed's records")
    pooling = commands.add_parser("pool", help="the three-arm table over the seeds' record folders")
    pooling.add_argument("folders", nargs="+", type=Path, help="one folder of records per seed")
    pooling.add_argument("--user", default="scripted", help="the evaluation user")
    args = parser.parse_args()
    if args.command == "keep":
        keep(args.runs, args.to)
    else:
        print(pool(args.folders, args.user))


if __name__ == "__main__":
    main()
