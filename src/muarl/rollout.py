"""The episode loop: the agent talks to a simulated user while its tool calls really execute.

One episode, top to bottom: the user opens; the agent answers; tool calls run in order against the
episode's own env and their results go back to the agent; text without tool calls goes to the user,
who replies (acting on their device first when asked, in dual-control domains); repeat until a stop.
The reward is computed whatever the ending.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from muarl.domain import Domain
from muarl.env import Env
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import score
from muarl.types import Message, Task, Trajectory
from muarl.users.base import SimulatorFault, UserSession, UserSimulator


@dataclass
class EpisodeConfig:
    """Limits and switches of one episode (defaults: the paper's released script)."""

    #: tool executions + user replies before the episode is cut (the paper counts both)
    max_turns: int = 30
    #: end the episode on a tool call that cannot be parsed, as the paper's code does (default: tell the
    #: agent what was wrong and let it try again)
    end_on_malformed: bool = False
    #: grade required outputs (off for training, on for evaluation, as in the paper)
    require_outputs: bool = True


async def run_episode(
    domain: Domain,
    task: Task,
    policy: Policy,
    user: UserSimulator,
    seed: int = 0,
    config: EpisodeConfig | None = None,
    policy_seed: int | None = None,
) -> Trajectory:
    """Play one episode of ``task`` and return its scored trajectory.

    ``seed`` is the user's; ``policy_seed`` fixes the agent's sampling (see :meth:`Policy.session`).
    """
    config = config or EpisodeConfig()
    domain = domain.for_task(task)
    env = domain.env(task)
    agent = policy.session(domain, task, seed=policy_seed)
    traj = Trajectory(task_id=task.id, domain=domain.name, user_seed=seed)
    try:
        reason, fault = await _play(env, task, agent, user.for_domain(domain).session(task, seed), traj, config)
    finally:
        traj.metadata.update(agent.close())
    traj.stop_reason = reason
    traj.tool_log = env.log
    if fault is not None:
        traj.sim_fault = True
        traj.metadata["sim_fault"] = fault
    traj.reward = score(domain, task, traj, env=env, require_outputs=config.require_outputs)
    return traj


async def _play(
    env: Env, task: Task, agent: PolicySession, user: UserSession, traj: Trajectory, config: EpisodeConfig
) -> tuple[str, str | None]:
    """The conversation itself; returns (stop reason, simulator fault or None). Fills ``traj``."""

    async def act(name: str, arguments: dict) -> str:
        # the id names the user message this action precedes (its index among user messages), so a replay
        # can re-attach user actions to their turn even when no agent call separates two user turns
        turn = sum(m.role == "user" for m in traj.messages)
        return (await env.acall(name, arguments, actor="user", call_id=f"user_t{turn}_{len(env.log)}")).output

    try:
        opening = await user.start()
    except SimulatorFault as err:
        return "sim_fault", str(err)
    new = [Message(role="system", content=env.domain.policy), Message(role="user", content=opening.text)]
    traj.messages.extend(new)
    while True:
        turn = await agent.next(new)
        traj.messages.append(turn.message)
        _append_tokens(traj, turn)
        new = []
        if turn.finish == "context":
            return "context_limit", None
        if turn.finish == "length":
            return "turn_token_limit", None
        for problem in turn.parse_errors:
            traj.malformed_calls += 1
            new.append(Message(role="tool", name="error", content=f"Error: malformed tool call: {problem}"))
        if turn.parse_errors and config.end_on_malformed:
            traj.messages.extend(new)
            return "malformed", None
        reason = None
        if turn.message.tool_calls:
            for call in turn.message.tool_calls:
                record = await env.acall(call.name, call.arguments, call_id=call.id)
                traj.turns += 1
                new.append(Message(role="tool", content=record.output, tool_call_id=call.id, name=call.name))
                if record.error in ("unknown_tool", "invalid_arguments"):
                    traj.malformed_calls += 1
                    if config.end_on_malformed:
                        reason = "malformed"
                if record.terminal and record.ok:
                    reason = "transfer"
                if reason or traj.turns >= config.max_turns:
                    break
        elif not turn.parse_errors:
            try:
                reply = await user.reply(turn.message.content, act)
            except SimulatorFault as err:
                return "sim_fault", str(err)
            traj.turns += 1
            for key, value in reply.metadata.items():  # simulator counters (retries ...) per episode
                if isinstance(value, int | float) and not isinstance(value, bool):
                    traj.metadata[f"user_{key}"] = traj.metadata.get(f"user_{key}", 0) + value
            new.append(Message(role="user", content=reply.text))
            if reply.stop is not None:
                reason = f"user_{reply.stop}"
        traj.messages.extend(new)
        if reason:
            return reason, None
        if traj.turns >= config.max_turns:
            return "max_turns", None


def _append_tokens(traj: Trajectory, turn: AgentTurn) -> None:
    if not turn.token_ids:
        return
    traj.token_ids += turn.prompt_ids + turn.token_ids
    traj.loss_mask += [0] * len(turn.prompt_ids) + [1] * len(turn.token_ids)
    traj.logprobs += [0.0] * len(turn.prompt_ids) + list(turn.logprobs)


def user_seed(base: int, task_id: str, member: int) -> int:
    """The user seed of one group member; stable across runs and machines."""
    digest = hashlib.sha256(f"{base}:{task_id}:{member}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


class RolloutEngine:
    """Runs many episodes concurrently on one event loop, in groups of ``group_size`` per task.

    With ``common_user_seed`` every member of a group meets the same user (common random numbers), so
    the differences GRPO turns into advantages come from the agent, not from user luck. With ``out``,
    each trajectory is appended to ``out`` (JSONL) the moment it finishes: an interrupted run keeps all
    finished work, and a rerun with the same file skips what is already there.
    """

    def __init__(
        self,
        domain: Domain,
        policy: Policy,
        user: UserSimulator,
        config: EpisodeConfig | None = None,
        *,
        group_size: int = 1,
        concurrency: int = 64,
        common_user_seed: bool = True,
        seed: int = 0,
        out: Path | None = None,
        progress: bool = True,
    ):
        if group_size < 1 or concurrency < 1:
            raise ValueError("group_size and concurrency must be at least 1")
        self.domain, self.policy, self.user = domain, policy, user
        self.config = config or EpisodeConfig()
        self.group_size, self.concurrency = group_size, concurrency
        self.common_user_seed, self.seed = common_user_seed, seed
        self.out, self.progress = out, progress

    def _seed(self, task: Task, member: int) -> int:
        return user_seed(self.seed, task.id, 0 if self.common_user_seed else member)

    async def run(self, tasks: list[Task]) -> list[list[Trajectory]]:
        """Every group's trajectories, in task order (members in order)."""
        done = load_trajectories(self.out) if self.out is not None else {}
        results: dict[tuple[str, int], Trajectory] = dict(done)
        todo = [(t, m) for t in tasks for m in range(self.group_size) if (t.id, m) not in results]
        gate = asyncio.Semaphore(self.concurrency)
        sink = self.out.open("a", encoding="utf-8") if self.out is not None else None
        try:
            with _progress(self.progress, len(todo), self.domain.name) as bar:
                async def one(task: Task, member: int) -> None:
                    async with gate:
                        traj = await run_episode(self.domain, task, self.policy, self.user,
                                                 self._seed(task, member), self.config,
                                                 policy_seed=user_seed(self.seed, f"{task.id}/agent", member))
                    traj.metadata["member"] = member
                    results[(task.id, member)] = traj
                    if sink is not None:
                        sink.write(traj.model_dump_json() + "\n")
                        sink.flush()
                    bar(traj)

                await asyncio.gather(*(one(t, m) for t, m in todo))
        finally:
            if sink is not None:
                sink.close()
        return [[results[(t.id, m)] for m in range(self.group_size)] for t in tasks]


def load_trajectories(path: Path) -> dict[tuple[str, int], Trajectory]:
    """Trajectories already in a JSONL file, keyed by (task id, member).

    A torn last line (the run was killed in the middle of a write) is cut from the file, so its episode
    is simply run again; a bad line anywhere else is an error naming the line, never silently skipped.
    """
    found: dict[tuple[str, int], Trajectory] = {}
    if not path.exists():
        return found
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    offset = 0
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                traj = Trajectory.model_validate_json(line)
            except ValueError as err:
                if n < len(lines):
                    raise ValueError(f"{path}:{n}: not a trajectory: {err}") from None
                with path.open("r+", encoding="utf-8") as f:
                    f.truncate(len(text[:offset].encode("utf-8")))
                break
            found[(traj.task_id, int(traj.metadata.get("member", 0)))] = traj
        offset += len(line)
    return found


@contextlib.contextmanager
def _progress(enabled: bool, total: int, label: str) -> Iterator[Callable[[Trajectory], None]]:
    """A rich progress bar showing episodes done, success so far and episodes per second."""
    if not enabled or total == 0:
        yield lambda traj: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    wins = [0, 0]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[stats]}"), transient=False) as progress:
        bar = progress.add_task(f"rollouts {label}", total=total, stats="")

        def advance(traj: Trajectory) -> None:
            wins[0] += 1
            wins[1] += int(traj.reward is not None and traj.reward.reward == 1.0)
            progress.update(bar, advance=1, stats=f"success {wins[1] / wins[0]:.2f}")

        yield advance
