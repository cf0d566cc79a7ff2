"""The episode loop: the agent talks to a simulated user while its tool calls really execute.

One episode, top to bottom: the user opens; the agent answers; tool calls run in order against the
episode's own env and their results go back to the agent; text without tool calls goes to the user,
who replies (acting on their device first when asked, in dual-control domains); repeat until a stop.
The reward is computed whatever the ending.
"""

from __future__ import annotations

from dataclasses import dataclass

from muarl.domain import Domain
from muarl.env import Env
from muarl.policies.base import AgentTurn, Policy
from muarl.rewards import score
from muarl.types import Message, Task, Trajectory
from muarl.users.base import SimulatorFault, UserSimulator


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
) -> Trajectory:
    """Play one episode of ``task`` and return its scored trajectory."""
    config = config or EpisodeConfig()
    env = domain.env(task)
    agent = policy.session(domain, task)
    traj = Trajectory(task_id=task.id, domain=domain.name, user_seed=seed)

    async def act(name: str, arguments: dict) -> str:
        return env.call(name, arguments, actor="user").output

    try:
        session = user.session(task, seed)
        try:
            opening = await session.start()
        except SimulatorFault as err:
            return _finish(domain, task, traj, env, "sim_fault", config, fault=str(err))
        new = [Message(role="system", content=domain.policy), Message(role="user", content=opening.text)]
        traj.messages.extend(new)
        while True:
            turn = await agent.next(new)
            traj.messages.append(turn.message)
            _append_tokens(traj, turn)
            new = []
            if turn.finish == "context":
                return _finish(domain, task, traj, env, "context_limit", config)
            if turn.finish == "length":
                return _finish(domain, task, traj, env, "turn_token_limit", config)
            for problem in turn.parse_errors:
                traj.malformed_calls += 1
                new.append(Message(role="tool", name="error", content=f"Error: malformed tool call: {problem}"))
            if turn.parse_errors and config.end_on_malformed:
                traj.messages.extend(new)
                return _finish(domain, task, traj, env, "malformed", config)
            if turn.message.tool_calls:
                for call in turn.message.tool_calls:
                    record = env.call(call.name, call.arguments, call_id=call.id)
                    traj.turns += 1
                    new.append(Message(role="tool", content=record.output, tool_call_id=call.id, name=call.name))
                    if record.terminal and record.ok:
                        traj.messages.extend(new)
                        return _finish(domain, task, traj, env, "transfer", config)
                    if traj.turns >= config.max_turns:
                        traj.messages.extend(new)
                        return _finish(domain, task, traj, env, "max_turns", config)
            elif not turn.parse_errors:
                try:
                    reply = await session.reply(turn.message.content, act)
                except SimulatorFault as err:
                    return _finish(domain, task, traj, env, "sim_fault", config, fault=str(err))
                traj.turns += 1
                new.append(Message(role="user", content=reply.text))
                if reply.stop is not None:
                    traj.messages.extend(new)
                    return _finish(domain, task, traj, env, f"user_{reply.stop}", config)
            traj.messages.extend(new)
            if traj.turns >= config.max_turns:
                return _finish(domain, task, traj, env, "max_turns", config)
    finally:
        agent.close()


def _append_tokens(traj: Trajectory, turn: AgentTurn) -> None:
    if not turn.token_ids:
        return
    traj.token_ids += turn.prompt_ids + turn.token_ids
    traj.loss_mask += [0] * len(turn.prompt_ids) + [1] * len(turn.token_ids)
    traj.logprobs += [0.0] * len(turn.prompt_ids) + list(turn.logprobs)


def _finish(domain: Domain, task: Task, traj: Trajectory, env: Env, reason: str, config: EpisodeConfig,
            fault: str | None = None) -> Trajectory:
    traj.stop_reason = reason
    traj.tool_log = env.log
    if fault is not None:
        traj.sim_fault = True
        traj.metadata["sim_fault"] = fault
    traj.reward = score(domain, task, traj, env=env, require_outputs=config.require_outputs)
    return traj
