"""What measuring the time split (``muarl.time_split``) costs a rollout, in the same process.

    python benchmarks/time_split.py [--episodes 16] [--repeats 3]

Two measurements of one cost:

1. **Direct.** Rollouts of the shipped base (``hf:tiny``) on retail-lite's train tasks with the scripted
   user, as the demo's GRPO step plays them. Each episode's clock operations (an enter and a leave per
   policy turn, user turn, tool call and grading, then its record) are replayed on fresh clocks, and
   :func:`muarl.time_split.summarize` run over the batch, 200 times: microseconds per episode, against the
   episode's own mean wall time.
2. **A/B.** The same rollouts with the clock and with a no-op one in its place (``muarl.rollout.EpisodeClock``
   patched), alternated ABBA ``--repeats`` times, the fastest of each kept: a ratio of wall times, which on
   a shared machine moves by more than the cost itself, so it bounds it rather than measures it.

Last line: ``time split: N us per episode, P% of an episode's M ms (A/B wall ratio R)``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import muarl.rollout as rollout
from muarl.domain import get_domain
from muarl.policies.hf import HFPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.time_split import PARTS, EpisodeClock, summarize
from muarl.users.scripted import ScriptedUser


class NoClock:
    """The clock's interface, doing nothing: the rollout without the split."""

    def enter(self, part: str) -> None:
        pass

    def leave(self, part: str) -> None:
        pass

    def record(self, engine: Any = None) -> dict[str, Any]:
        return {}


def play(episodes: int) -> tuple[float, list[Any]]:
    domain = get_domain("retail-lite")
    tasks = domain.tasks("train")[:episodes]
    policy = HFPolicy("tiny", temperature=1.0, max_new_tokens=96, seed=0)
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=12), progress=False)
    began = time.perf_counter()
    groups = asyncio.run(engine.run(tasks))
    return time.perf_counter() - began, [t for g in groups for t in g]


def replay_cost(trajs: list[Any], rounds: int = 200) -> float:
    """Seconds per episode of the clock's own work: each episode's operations replayed, then summarized."""
    ops = [sum(len(t.metadata["time"]["spans"][part]) for part in PARTS) for t in trajs]
    began = time.perf_counter()
    for _ in range(rounds):
        for count in ops:
            clock = EpisodeClock()
            for _ in range(count):
                clock.enter("policy")
                clock.leave("policy")
            clock.record({"queue_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0})
        summarize(trajs)
    return (time.perf_counter() - began) / rounds / len(trajs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    play(2)  # warm: the model loaded, the first passes compiled
    walls: dict[str, list[float]] = {"clock": [], "none": []}
    trajs: list[Any] = []
    for n in range(args.repeats):
        for mode in (("clock", "none") if n % 2 == 0 else ("none", "clock")):
            rollout.EpisodeClock = EpisodeClock if mode == "clock" else NoClock  # type: ignore[misc]
            wall, played = play(args.episodes)
            walls[mode].append(wall)
            if mode == "clock":
                trajs = played
            print(f"round {n + 1} {mode}: {wall:.2f} s", flush=True)
    rollout.EpisodeClock = EpisodeClock  # type: ignore[misc]
    per_episode = replay_cost(trajs)
    episode_s = statistics.mean(t.metadata["time"]["episode_s"] for t in trajs)
    ratio = min(walls["clock"]) / min(walls["none"])
    print(summarize(trajs))
    print(f"time split: {per_episode * 1e6:.0f} us per episode, {per_episode / episode_s:.3%} of an episode's "
          f"{episode_s * 1e3:.0f} ms (A/B wall ratio {ratio:.3f})")


if __name__ == "__main__":
    main()
