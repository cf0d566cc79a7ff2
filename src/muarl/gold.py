"""Gold replay: a task's gold actions played as an ideal conversation, to prove each task is solvable.

The replay is the oracle agent: already authenticated as the task's user, asking for and receiving a
confirmation before every write, and stating the required outputs at the end. Its trajectory should
score reward 1.0 with no violations; anything else is a bug in the domain, the task or the grader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from muarl.env import Env
from muarl.rewards import score
from muarl.types import Message, ToolCall, Trajectory

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.types import Action, Task


def gold_trajectory(domain: Domain, task: Task, actions: list[Action] | None = None) -> tuple[Trajectory, Env]:
    """Play ``actions`` (default: the task's gold actions) as a conversation; returns it and its final env."""
    env = domain.env(task)
    env.db.authenticate(task.user_id)
    messages = [Message(role="system", content=domain.policy), Message(role="user", content=task.instruction)]
    for i, action in enumerate(task.gold_actions if actions is None else actions):
        call_id = f"gold_{i}"
        if action.actor == "user":
            env.call(action.name, action.arguments, actor="user", call_id=call_id)
            continue
        tool = domain.agent_tools.get(action.name)
        if tool is not None and tool.is_write:
            messages.append(Message(role="assistant", content=f"I will now run {action.name}. Shall I proceed?"))
            messages.append(Message(role="user", content="Yes, please go ahead."))
        record = env.call(action.name, action.arguments, call_id=call_id)
        messages.append(Message(role="assistant", tool_calls=[ToolCall(id=call_id, name=action.name,
                                                                        arguments=action.arguments)]))
        messages.append(Message(role="tool", content=record.output, tool_call_id=call_id, name=action.name))
    if task.required_outputs:
        messages.append(Message(role="assistant", content="Here you go: " + "; ".join(task.required_outputs)))
    trajectory = Trajectory(task_id=task.id, domain=domain.name, messages=messages, tool_log=env.log,
                            stop_reason="gold")
    return trajectory, env


def gold_score(domain: Domain, task: Task, actions: list[Action] | None = None) -> Trajectory:
    """The gold (or perturbed-gold) trajectory with its reward filled in."""
    trajectory, env = gold_trajectory(domain, task, actions)
    trajectory.reward = score(domain, task, trajectory, env=env, require_outputs=True)
    return trajectory
