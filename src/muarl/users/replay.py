"""ReplayUser: the user side of a recorded trajectory, played back verbatim.

Useful to re-run a policy against a conversation that already happened (regression tests, comparing two
checkpoints on identical user turns, debugging a failed episode) without paying for, or depending on, the
simulator that produced it. The user's own device actions (dual-control domains) are re-executed through
``act`` before the reply they preceded, so the env ends in the state the recorded user left it in.

A replay cannot react: if the agent now says something else, the user still says what it said then. The
last recorded message carries the recorded stop signal (when the episode ended with one); if the agent
talks on past the recording, the user stops.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from muarl.types import Task, ToolRecord, Trajectory
from muarl.users.base import STOP, Act, StopSignal, UserReply, UserSession, UserSimulator

_TAG = re.compile(r"^user_t(\d+)_")
_STOPS: dict[str, StopSignal] = {"user_stop": "stop", "user_transfer": "transfer",
                                 "user_out_of_scope": "out_of_scope"}


@dataclass
class ReplayTurn:
    """One recorded user message and the user-tool calls made just before it."""

    text: str
    actions: list[ToolRecord] = field(default_factory=list)


def user_turns(traj: Trajectory) -> list[ReplayTurn]:
    """The user's turns of ``traj`` in order, each with the user-tool calls that preceded it.

    The episode loop gives each user action the id ``user_t{k}_...`` where ``k`` is the index of the user
    message it preceded, which settles the attribution. Recordings without such ids fall back to position:
    walking the messages and the log side by side, the user records met before a user message (after the
    agent records of the calls in between) go to it. That is exact unless two user turns that both acted
    have no agent tool call between them, in which case the later turn's actions land on the earlier one.
    """
    texts = [m.content for m in traj.messages if m.role == "user"]
    turns = [ReplayTurn(text) for text in texts]
    tagged = [r for r in traj.tool_log if r.actor == "user" and _TAG.match(r.call_id)]
    if tagged:
        for record in tagged:
            index = int(_TAG.match(record.call_id).group(1))  # type: ignore[union-attr]
            if 0 <= index < len(turns):
                turns[index].actions.append(record)
        return turns
    log, pos, index = traj.tool_log, 0, 0
    for msg in traj.messages:
        if msg.role == "assistant" and msg.tool_calls:
            while pos < len(log) and log[pos].actor == "agent":
                pos += 1
        elif msg.role == "user":
            if index > 0:  # the opening is written before the user can act
                while pos < len(log) and log[pos].actor == "user":
                    turns[index].actions.append(log[pos])
                    pos += 1
            index += 1
    return turns


class ReplayUser(UserSimulator):
    """Replays recorded trajectories, one per task id (the seed is ignored: a recording is deterministic)."""

    name = "replay"

    def __init__(self, trajectories: Trajectory | Iterable[Trajectory]):
        items = [trajectories] if isinstance(trajectories, Trajectory) else list(trajectories)
        self.recordings: dict[str, Trajectory] = {t.task_id: t for t in items}

    def session(self, task: Task, seed: int) -> ReplaySession:
        traj = self.recordings.get(task.id)
        if traj is None:
            raise KeyError(f"ReplayUser has no recording of task {task.id!r} "
                           f"(recorded: {', '.join(sorted(self.recordings)) or 'none'})")
        return ReplaySession(traj)


class ReplaySession(UserSession):
    """Plays one recording. ``metadata['mismatches']`` counts device results that differ from the record."""

    def __init__(self, traj: Trajectory):
        self.turns = user_turns(traj)
        self.final_stop = _STOPS.get(traj.stop_reason)
        self.next_index = 0

    def _reply(self, actions_run: int = 0, mismatches: int = 0) -> UserReply:
        index = self.next_index
        if index >= len(self.turns):
            return UserReply(STOP, stop="stop", metadata={"replayed": index, "exhausted": True})
        self.next_index += 1
        last = index == len(self.turns) - 1
        stop: StopSignal | None = self.final_stop if last else None
        meta = {"replayed": index, "user_tool_calls": actions_run, "mismatches": mismatches}
        return UserReply(self.turns[index].text, stop=stop, metadata=meta)

    async def start(self) -> UserReply:
        if not self.turns:
            return UserReply(STOP, stop="stop", metadata={"replayed": 0, "exhausted": True})
        return self._reply()

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        mismatches = 0
        actions = self.turns[self.next_index].actions if self.next_index < len(self.turns) else []
        for record in actions:
            output = await act(record.name, dict(record.arguments))
            mismatches += output != record.output
        return self._reply(len(actions), mismatches)
