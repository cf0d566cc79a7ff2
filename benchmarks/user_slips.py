"""What the user-slip check (:mod:`muarl.users.slips`, run once per episode in ``rollout.run_episode``) adds to
an episode: its time over a finished evaluation's episodes against that evaluation's own wall time per
episode (``results.json``'s ``timing``).

    python benchmarks/user_slips.py runs/ablate-tuned-s0/eval/rl-scripted/scripted --domain retail-lite-forgetful

Last line: ``user-slip check: N.NN ms per episode, N.NN% of an episode's wall time``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from muarl.domain import get_domain
from muarl.types import Trajectory
from muarl.users.slips import find_slips, tool_terms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a muarl eval directory (trajectories.jsonl, results.json)")
    parser.add_argument("--domain", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    run, domain = Path(args.run), get_domain(args.domain)
    with open(run / "trajectories.jsonl") as lines:
        episodes = [Trajectory.model_validate_json(line) for line in lines]
    tasks = [domain.task(t.task_id) for t in episodes]
    terms = tool_terms([*domain.tools, *domain.user_tools])
    began = time.perf_counter()
    for _ in range(args.repeats):
        for episode, task in zip(episodes, tasks, strict=True):
            find_slips(task, episode.messages, episode.stop_reason, terms,
                       [r.output for r in episode.tool_log if r.actor == "user"])
    check = (time.perf_counter() - began) / (args.repeats * len(episodes))
    timing = json.loads((run / "results.json").read_text())["timing"]
    wall = float(timing["wall_s"]) / max(1, int(timing["episodes_run"]))
    print(f"user-slip check: {check * 1e3:.2f} ms per episode, {100 * check / wall:.2f}% of an episode's wall time")


if __name__ == "__main__":
    main()
