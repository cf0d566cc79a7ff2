"""Success without a policy violation (reward 1 and no violation), per arm of `muarl ablate` runs, and the
differences between arms clustered by task over the seeds given: what pass^1 cannot see when one arm's
successes break the domain's rules (research/user-in-the-loop-ablation.md).

    python research/compliant_success.py runs/ablate-tuned-s0 runs/ablate-tuned-s1 [--user scripted]
"""

from __future__ import annotations

import argparse
import collections
import json

from muarl.compare import cluster_bootstrap

ARMS = ("cold-start", "rl-scripted", "rl-static")


def per_task(run: str) -> dict[str, float]:
    """Each task's share of trials that succeeded without a violation."""
    trials: dict[str, list[float]] = collections.defaultdict(list)
    with open(f"{run}/trajectories.jsonl") as lines:
        for line in lines:
            episode = json.loads(line)
            reward = episode["reward"]
            trials[episode["task_id"]].append(float(reward["reward"] >= 1 and not reward.get("violations")))
    return {task: sum(v) / len(v) for task, v in trials.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="muarl ablate run directories, one per seed")
    parser.add_argument("--user", default="scripted", help="the evaluation user")
    args = parser.parse_args()
    arms = {arm: [per_task(f"{run}/eval/{arm}/{args.user}") for run in args.runs] for arm in ARMS}
    for arm, seeds in arms.items():
        print(f"{arm}: {sum(sum(s.values()) / len(s) for s in seeds) / len(seeds):.3f}")
    for a, b in (("rl-static", "rl-scripted"), ("cold-start", "rl-static"), ("cold-start", "rl-scripted")):
        clusters: dict[str, list[float]] = collections.defaultdict(list)
        for seed_a, seed_b in zip(arms[a], arms[b], strict=True):
            for task, value in seed_a.items():
                clusters[task].append(seed_b[task] - value)
        mean, low, high = cluster_bootstrap(list(clusters.values()))
        print(f"{b} - {a}: {mean:+.3f} [{low:+.3f}, {high:+.3f}]")


if __name__ == "__main__":
    main()
