"""What the simulated user costs a GRPO step: the demo's step with five users, split by muarl.time_split.

    python benchmarks/user_in_loop.py [--tasks 8] [--group-size 8] [--user-model runs/user-sft/model]

One GRPO step of the demo's recipe (``experiments/recipe.py``: the shipped cold-start base, the demo's
domain, seed 0, its token and turn limits, two updates per batch), in this one process, once per user:

- **zero-cost**: the scripted user's replies looked up, not computed: played first by the scripted user,
  every reply is recorded under (task, seed, the agent's messages so far), and this user answers from
  that table (the scripted user is a function of exactly those). Same conversations, no user compute:
  the baseline every ratio is against;
- **scripted**: muarl's scripted user, computing its replies;
- **latency-1s**: the scripted user behind one second per reply (an API model's latency, awaited);
- **smollm2**: the embedded LLM user, SmolLM2-135M-Instruct served by ``muarl.serve`` for the step
  (``--user llm``, as the README shows; a step with this user plays other conversations);
- **user-model**: ``llm:DIR``, the user model of research/llm-user-pilot.md, when ``--user-model`` names it.

Each row: the step's rollout seconds and their ratio to the zero-cost user's, the share of the episodes'
time with the policy, the user, the tools, grading and waiting, the user's busy share of the rollout's wall
time, the policy's and the user's tokens/s, and the trainer's phases. Synchronous GRPO with an in-process
user builds every decode batch the same way (a pass waits for every open episode, issue 60), so with the
latency user the batch waits for the slowest reply; an LLM user's step admits by arrival.

Last line: ``user in the loop: the LLM user is U% of the episodes' time, the step R.RRx the zero-cost user's``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from muarl.users.base import UserReply, UserSession, UserSimulator
from muarl.users.scripted import ScriptedUser

#: the scripted user's replies of the first run, by (task id, seed, the agent's messages so far)
RECORDED: dict[tuple[str, int, tuple[str, ...]], UserReply] = {}
MISSES = [0]


class _Keyed(UserSession):
    """A session that knows its key: the task, the seed and what the agent has said."""

    def __init__(self, task: Any, seed: int, inner: UserSession | None):
        self.task_id, self.seed, self.inner, self.said = task.id, seed, inner, ()

    def key(self) -> tuple[str, int, tuple[str, ...]]:
        return self.task_id, self.seed, self.said


class _Recording(_Keyed):
    async def start(self) -> UserReply:
        RECORDED[self.key()] = reply = await self.inner.start()
        return reply

    async def reply(self, agent_text: str, act: Any) -> UserReply:
        self.said += (agent_text,)
        RECORDED[self.key()] = reply = await self.inner.reply(agent_text, act)
        return reply


class _Replaying(_Keyed):
    async def start(self) -> UserReply:
        return self._look_up() or await self.inner.start()

    async def reply(self, agent_text: str, act: Any) -> UserReply:
        self.said += (agent_text,)
        return self._look_up() or await self.inner.reply(agent_text, act)

    def _look_up(self) -> UserReply | None:
        found = RECORDED.get(self.key())
        if found is None:
            MISSES[0] += 1
        return found


class _Late(UserSession):
    def __init__(self, inner: UserSession, seconds: float):
        self.inner, self.seconds = inner, seconds

    async def start(self) -> UserReply:
        await asyncio.sleep(self.seconds)
        return await self.inner.start()

    async def reply(self, agent_text: str, act: Any) -> UserReply:
        await asyncio.sleep(self.seconds)
        return await self.inner.reply(agent_text, act)


class BenchUser(UserSimulator):
    """The scripted user, recording (``mode="record"``), replaying its record (``"replay"``) or late by
    ``latency`` seconds a reply (``"late"``)."""

    def __init__(self, mode: str, latency: float = 1.0, inner: UserSimulator | None = None):
        self.mode, self.latency, self.inner = mode, latency, inner or ScriptedUser()
        self.name = f"bench-{mode}"

    def for_domain(self, domain: Any) -> BenchUser:
        return BenchUser(self.mode, self.latency, self.inner.for_domain(domain))

    def session(self, task: Any, seed: int) -> UserSession:
        inner = self.inner.session(task, seed)
        if self.mode == "late":
            return _Late(inner, self.latency)
        return (_Recording if self.mode == "record" else _Replaying)(task, seed, inner)


def recording() -> BenchUser:
    return BenchUser("record")


def zero_cost() -> BenchUser:
    return BenchUser("replay")


def latency_1s() -> BenchUser:
    return BenchUser("late", 1.0)


COLUMNS = ["rollout_s", "split_policy_share", "split_policy_queue_s", "split_policy_decode_s", "split_user_share",
           "split_tools_share", "split_grading_share", "split_waiting_share", "split_user_busy", "policy_tokens_per_s", "user_tokens_per_s", "scoring_s",
           "backward_s", "optimizer_s"]


def step(user: str, out: Path, tasks: int, group: int) -> dict[str, Any]:
    from muarl.experiments.recipe import DemoConfig
    from muarl.train.grpo import train_grpo

    demo = DemoConfig()
    config = replace(demo.grpo, model="tiny", domain=demo.domain, out=str(out), seed=0, steps=1,
                     tasks_per_step=tasks, group_size=group, save_every=0, report_to="none", user=user,
                     user_timeout=0)
    return train_grpo(config, progress=False)["metrics"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step (the demo's: 8)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task (the demo's: 8)")
    parser.add_argument("--user-model", help="a user model's checkpoint directory (llm:DIR), optional")
    parser.add_argument("--skip-llm", action="store_true", help="leave the SmolLM2 user out")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import user_in_loop as me  # the module the user specs name (this file runs as __main__)
    from muarl.users.embedded import user_server

    users = [("scripted", "user_in_loop:recording"), ("zero-cost", "user_in_loop:zero_cost"),
             ("latency-1s", "user_in_loop:latency_1s")]
    if not args.skip_llm:
        users.append(("smollm2", "llm"))
    if args.user_model:
        users.append(("user-model", f"llm:{args.user_model}"))
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="muarl-user-in-loop-") as root:
        for name, spec in users:
            out = Path(root) / name
            served = user_server([spec], out) if spec.startswith("llm") else contextlib.nullcontext()
            with served:
                rows[name] = step(spec, out, args.tasks, args.group_size)
            print(f"{name}: {json.dumps({k: rows[name].get(k) for k in COLUMNS})}", flush=True)
    print(f"zero-cost user's lookups that missed (replies computed instead): {me.MISSES[0]}")
    base = rows["zero-cost"]["rollout_s"]
    print("| user | " + " | ".join(COLUMNS) + " | rollout / zero-cost |")
    print("|---" * (len(COLUMNS) + 2) + "|")
    for name, row in rows.items():
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), int | float) else "-" for k in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + f" | {row['rollout_s'] / base:.2f}x |")
    llm = next((rows[n] for n in ("smollm2", "user-model") if n in rows), None)
    if llm is not None:
        print(f"user in the loop: the LLM user is {llm['split_user_share']:.0%} of the episodes' time, the step "
              f"{llm['rollout_s'] / base:.2f}x the zero-cost user's")


if __name__ == "__main__":
    main()
