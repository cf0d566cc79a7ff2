"""The episode loop: the agent talks to a simulated user while its tool calls really execute.

One episode, top to bottom: the user opens; the agent answers; tool calls run in order against the
episode's own env and their results go back to the agent; text without tool calls goes to the user,
who replies (acting on their device first when asked, in dual-control domains); repeat until a stop.
The reward is computed whatever the ending.

Each episode is isolated from the parties it calls: an exception, a malformed return or a time-limit
hit of the user, the policy session or a tool ends that episode with a recorded fault (see
:mod:`muarl.faults`) instead of ending the run, so the other episodes play on and are saved.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, get_args

from muarl.domain import Domain
from muarl.env import Env
from muarl.faults import STOP_REASONS, EpisodeFault, Side
from muarl.limits import LimitExceeded, bounded, call_in_thread
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rewards import score
from muarl.time_split import EpisodeClock
from muarl.types import Actor, Message, Task, ToolRecord, Trajectory
from muarl.users.base import SimulatorFault, StopSignal, UserReply, UserSession, UserSimulator
from muarl.users.slips import episode_slips

T = TypeVar("T")

#: default time limits (seconds): generous, so only a party that is stuck hits them
USER_TIMEOUT_S, TOOL_TIMEOUT_S, AGENT_TIMEOUT_S = 120.0, 60.0, 600.0
#: the command-line option that sets each side's limit, named in a timeout fault's message
LIMIT_OPTIONS: dict[Side, str] = {"user": "--user-timeout", "policy": "--agent-timeout", "tool": "--tool-timeout"}


@dataclass(kw_only=True)
class TimeLimits:
    """How long each party of an episode may take, defined once: the fields of :class:`EpisodeConfig` (one
    episode) and of :class:`EpisodeLimits` (every command's options). Past its limit a party's episode ends
    with a ``*_timeout`` fault instead of hanging the run; None or 0: no limit."""

    user_timeout: float | None = field(default=USER_TIMEOUT_S, metadata={
        "help": "time limit of one user turn (device actions included); past it the episode is a fault (0: no "
                "limit)", "metavar": "SECONDS"})
    agent_timeout: float | None = field(default=AGENT_TIMEOUT_S, metadata={
        "help": "time limit of one agent turn; past it the episode is a fault (0: no limit)", "metavar": "SECONDS"})
    tool_timeout: float | None = field(default=TOOL_TIMEOUT_S, metadata={
        "help": "time limit of one tool call; past it the episode is a fault (0: no limit)", "metavar": "SECONDS"})

    def check_limits(self) -> None:
        for name in ("user_timeout", "agent_timeout", "tool_timeout"):
            value, option = getattr(self, name), "--" + name.replace("_", "-")
            if value is not None and value < 0:
                raise ValueError(f"{option} must be at least 0 seconds (0: no limit), not {value}")


@dataclass(kw_only=True)
class EpisodeLimits(TimeLimits):
    """The time limits and the LLM user's request limits: the options of every command that plays episodes
    (eval, rollout, synth as options, grpo as fields of its config; :mod:`muarl.cli.config_options` makes
    the options)."""

    user_http_timeout: float | None = field(default=None, metadata={
        "help": "llm: users: seconds one HTTP request to the user's endpoint may take before it is retried "
                "(default: the LLM user's, 60)", "metavar": "SECONDS"})
    user_max_tokens: int | None = field(default=None, metadata={
        "help": "llm: users: the most tokens one user message may take (default: the server's limit, the "
                "context; cap it for a user model that does not end its turns)", "metavar": "N"})


@dataclass
class EpisodeConfig(TimeLimits):
    """Limits and switches of one episode (defaults: the paper's released script); its time limits are
    :class:`TimeLimits`'."""

    #: tool executions + user replies before the episode is cut (the paper counts both)
    max_turns: int = 30
    #: end the episode on a tool call that cannot be parsed, as the paper's code does (default: tell the
    #: agent what was wrong and let it try again)
    end_on_malformed: bool = False
    #: grade required outputs (off for training, on for evaluation, as in the paper)
    require_outputs: bool = True

    def __post_init__(self) -> None:
        self.check_limits()


async def run_episode(
    domain: Domain,
    task: Task,
    policy: Policy,
    user: UserSimulator,
    seed: int = 0,
    config: EpisodeConfig | None = None,
    policy_seed: int | None = None,
) -> Trajectory:
    """Play one episode of ``task`` and return its scored trajectory; a fault of the user, the policy or a
    tool ends it early and is recorded (``metadata["fault"]``), never raised.

    ``seed`` is the user's; ``policy_seed`` fixes the agent's sampling (see :meth:`Policy.session`).
    """
    config = config or EpisodeConfig()
    domain = domain.for_task(task)
    env = domain.env(task)
    traj = Trajectory(task_id=task.id, domain=domain.name, user_seed=seed)
    clock = EpisodeClock()
    fault: EpisodeFault | None = None
    agent: PolicySession | None = None
    try:
        agent = _created("policy", lambda: policy.session(domain, task, seed=policy_seed))
        session = _created("user", lambda: user.for_domain(domain).session(task, seed))
        reason = await _play(env, task, agent, session, traj, config, clock)
    except EpisodeFault as err:
        fault, reason = err, STOP_REASONS[err.side]
    finally:
        if agent is not None:
            closing = _close(agent, traj)
            fault = fault or closing
    traj.stop_reason = reason
    traj.tool_log = list(env.log)  # a copy: an abandoned tool thread may still append to env.log
    # what the simulated user got wrong (muarl.users.slips): reported beside the reward, never part of it
    traj.metadata["user_slips"] = episode_slips(domain, task, traj)
    clock.enter("grading")
    try:
        return _graded(domain, task, env, traj, fault, config)
    finally:
        clock.leave("grading")
        # where the episode's time went (muarl.time_split); the engine's split of the policy's, if it gave one
        traj.metadata["time"] = clock.record(traj.metadata.pop("engine_time", None))


def _graded(domain: Domain, task: Task, env: Env, traj: Trajectory, fault: EpisodeFault | None,
            config: EpisodeConfig) -> Trajectory:
    """``traj`` scored, its fault recorded (a hung tool's episode is not graded: it may still be writing)."""
    if fault is None:
        traj.reward = score(domain, task, traj, env=env, require_outputs=config.require_outputs)
        # the server died after the agent's last call (a death during a call is in the tool log already)
        if env.state_fault is not None and not traj.tool_fault:
            _record(traj, EpisodeFault("tool", f"the episode's final state could not be read from its tool "
                                                f"server: {env.state_fault}"))
        return traj
    _record(traj, fault)
    if fault.kind != "tool_timeout":  # a hung tool may still be writing to env: no grading
        with contextlib.suppress(Exception):  # the fault is the episode's story; a grader crash adds nothing
            traj.reward = score(domain, task, traj, env=env, require_outputs=config.require_outputs)
    return traj


def _created(side: Side, make: Callable[[], T]) -> T:
    """A per-episode session from its factory; a factory that raises is the episode's fault."""
    try:
        return make()
    except Exception as err:
        raise EpisodeFault(side, f"creating the {side} session raised {_describe(err)}",
                           traceback.format_exc()) from err


def _close(agent: PolicySession, traj: Trajectory) -> EpisodeFault | None:
    """Close the agent's session (its metadata goes into the trajectory); a failure is a policy fault."""
    try:
        meta = agent.close()
        traj.metadata.update(meta or {})
    except Exception as err:
        return EpisodeFault("policy", f"{type(agent).__name__}.close() raised {_describe(err)}", traceback.format_exc())
    return None


def _record(traj: Trajectory, fault: EpisodeFault) -> None:
    traj.metadata["fault"] = fault.record()
    if fault.side == "user":  # the simulator could not produce a turn: what sim_fault has always meant
        traj.sim_fault = True
        traj.metadata["sim_fault"] = fault.message


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


async def _guard(side: Side, what: str, make: Callable[[], Awaitable[T]], seconds: float | None) -> T:
    """Await one call to a party under its time limit; whatever goes wrong becomes an :class:`EpisodeFault`
    of that party (a fault raised further in, such as a user's device tool, passes through as it is)."""
    try:
        return await bounded(make, seconds)
    except EpisodeFault:
        raise
    except LimitExceeded as hit:
        abandoned = "; its thread is abandoned (a thread cannot be killed)" if hit.abandoned else ""
        raise EpisodeFault(f"{side}_timeout", f"{what} did not finish within the {LIMIT_OPTIONS[side]} limit "
                                              f"of {hit.seconds:g} s{abandoned}") from None
    except SimulatorFault as err:
        raise EpisodeFault("user", str(err), traceback.format_exc()) from err
    except Exception as err:
        raise EpisodeFault(side, f"{what} raised {_describe(err)}", traceback.format_exc()) from err


_STOPS = frozenset(get_args(StopSignal))


def _checked_reply(reply: Any, what: str) -> UserReply:
    """The user's turn, or a user fault saying how it is malformed. Empty text is a fault for every
    user (an LLM user's empty completion always was one): no real customer sends an empty message."""
    if not isinstance(reply, UserReply):
        problem = f"returned {type(reply).__name__}, not a UserReply"
    elif not isinstance(reply.text, str):
        problem = f"returned text={reply.text!r}, not a string"
    elif not reply.text.strip():
        problem = "returned empty text (an empty user turn is a simulator fault)"
    elif reply.stop is not None and reply.stop not in _STOPS:
        problem = f"returned stop={reply.stop!r}, not one of {', '.join(sorted(_STOPS))} or None"
    elif not isinstance(reply.metadata, dict):
        problem = f"returned metadata of type {type(reply.metadata).__name__}, not a dict"
    else:
        return reply
    raise EpisodeFault("user", f"{what} {problem}")


def _checked_turn(turn: Any, what: str) -> AgentTurn:
    """The agent's turn, or a policy fault saying how it is malformed."""
    if not isinstance(turn, AgentTurn):
        problem = f"returned {type(turn).__name__}, not an AgentTurn"
    elif not isinstance(turn.message, Message) or turn.message.role != "assistant":
        problem = f"returned an AgentTurn whose message is not an assistant Message ({turn.message!r:.200})"
    else:
        return turn
    raise EpisodeFault("policy", f"{what} {problem}")


async def call_tool(env: Env, name: str, arguments: Any, *, actor: Actor, call_id: str,
                    seconds: float | None) -> ToolRecord:
    """One tool call under the tool time limit; a tool that raises, hangs or returns no record is a
    tool fault. An env with local (sync) tools runs the call in a thread, which is abandoned at the limit
    (see :mod:`muarl.limits`); an env whose tools do I/O (it overrides :meth:`Env.acall`) is awaited."""
    what = f"the {actor}'s call {call_id} to tool {name}"
    if type(env).acall is Env.acall:
        async def run() -> ToolRecord:
            return await call_in_thread(lambda: env.call(name, arguments, actor=actor, call_id=call_id), seconds)
    else:
        async def run() -> ToolRecord:
            return await bounded(lambda: env.acall(name, arguments, actor=actor, call_id=call_id), seconds)
    record = await _guard("tool", what, run, None)  # the limit is inside run: a thread's or a deadline
    if not isinstance(record, ToolRecord):
        raise EpisodeFault("tool", f"{what} returned {type(record).__name__}, not a ToolRecord")
    if record.error == "internal":  # the tool itself raised: a bug, not something the agent did
        raise EpisodeFault("tool", f"{what} failed: {record.output}", env.tracebacks.get(call_id, ""))
    return record


async def _play(env: Env, task: Task, agent: PolicySession, user: UserSession, traj: Trajectory,
                config: EpisodeConfig, clock: EpisodeClock) -> str:
    """The conversation itself; returns the stop reason, raises :class:`EpisodeFault`. Fills ``traj``."""
    device_faults: list[EpisodeFault] = []  # a user's device-tool fault, even if the user swallowed it
    user_name = type(user).__name__
    agent_name = type(agent).__name__

    async def act(name: str, arguments: dict) -> str:
        # the id names the user message this action precedes (its index among user messages), so a replay
        # can re-attach user actions to their turn even when no agent call separates two user turns
        turn = sum(m.role == "user" for m in traj.messages)
        clock.enter("tools")
        try:
            record = await call_tool(env, name, arguments, actor="user", call_id=f"user_t{turn}_{len(env.log)}",
                                     seconds=config.tool_timeout)
        except EpisodeFault as fault:
            device_faults.append(fault)
            raise
        finally:
            clock.leave("tools")
        return record.output

    async def user_turn(what: str, make: Callable[[], Awaitable[UserReply]]) -> UserReply:
        clock.enter("user")
        try:
            reply = await _guard("user", what, make, config.user_timeout)
        except EpisodeFault:
            if device_faults:
                raise device_faults[0] from None
            raise
        finally:
            clock.leave("user")
        if device_faults:
            raise device_faults[0]
        return _checked_reply(reply, what)

    opening = await user_turn(f"{user_name}.start()", user.start)
    new = [Message(role="system", content=env.domain.policy), Message(role="user", content=opening.text)]
    traj.messages.extend(new)
    while True:
        what = f"{agent_name}.next()"
        clock.enter("policy")
        try:
            turn = _checked_turn(await _guard("policy", what, partial(agent.next, new), config.agent_timeout), what)
        finally:
            clock.leave("policy")
        traj.messages.append(turn.message)
        _append_tokens(traj, turn)
        new = []
        if turn.finish == "context":
            return "context_limit"
        if turn.finish == "length":
            return "turn_token_limit"
        for problem in turn.parse_errors:
            traj.malformed_calls += 1
            new.append(Message(role="tool", name="error", content=f"Error: malformed tool call: {problem}"))
        if turn.parse_errors and config.end_on_malformed:
            traj.messages.extend(new)
            return "malformed"
        reason = None
        if turn.message.tool_calls:
            for call in turn.message.tool_calls:
                clock.enter("tools")
                try:
                    record = await call_tool(env, call.name, call.arguments, actor="agent", call_id=call.id,
                                             seconds=config.tool_timeout)
                finally:
                    clock.leave("tools")
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
            reply = await user_turn(f"{user_name}.reply()", partial(user.reply, turn.message.content, act))
            traj.turns += 1
            for key, value in reply.metadata.items():  # simulator counters (retries ...) per episode
                if isinstance(value, int | float) and not isinstance(value, bool):
                    traj.metadata[f"user_{key}"] = traj.metadata.get(f"user_{key}", 0) + value
            new.append(Message(role="user", content=reply.text))
            if reply.stop is not None:
                reason = f"user_{reply.stop}"
        traj.messages.extend(new)
        if reason:
            return reason
        if traj.turns >= config.max_turns:
            return "max_turns"


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
        done = load_trajectories(self.out, repair=True) if self.out is not None else {}  # our own output
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


def load_trajectories(path: Path, repair: bool = False) -> dict[tuple[str, int], Trajectory]:
    """Trajectories already in a JSONL file, keyed by (task id, member).

    A torn last line (a run killed in the middle of a write, or one still writing) is skipped; a bad line
    anywhere else is an error naming the line, never silently skipped. Only ``repair=True`` cuts the torn
    line from the file, and only the engine resuming its own output file passes it (it appends after the
    cut, so its episode is simply run again): a replay file, or any run read by another process, is an
    input and is never written.
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
                if repair:
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
