"""Episode faults: what ends an episode that the agent did not cause, recorded instead of raised.

Why this exists: one broken user, policy backend or tool must cost one episode, never the run. The
episode loop (:mod:`muarl.rollout`) turns every exception, malformed return and time-limit hit of those
three parties into an :class:`EpisodeFault`; :func:`muarl.rollout.run_episode` records it in the
trajectory's ``metadata["fault"]`` (kind, message, traceback) and returns normally, so the other episodes
run on and are saved.

Whose fault it was decides how the metrics treat it (:func:`counts_against_policy`). A user or tool fault
says nothing about the agent (the simulator or the tool server broke), so evaluation leaves it out of the
success metrics. A policy fault is the agent under evaluation breaking (it raised, returned garbage or
ran past its time limit): a policy that breaks on the hard tasks must not score as if they did not
exist, so it counts as a failure (reward 0) in every metric. GRPO treats the kinds the same way
(:func:`muarl.train.orchestrator.masks`): ``mask_sim_faults`` masks a user or tool fault from the gradient
and from its group's mean and standard deviation (its tokens are not a sample of the policy's behaviour to
learn from), and a group left with fewer than two members that count trains nothing (``groups_too_small``);
a policy fault is not masked but trains as the agent's failure (reward 0). Everything counts faults by kind
(:func:`fault_rates`) so nothing is hidden.

Kinds name the party and whether it broke or ran out of time: ``user``, ``user_timeout``, ``policy``,
``policy_timeout``, ``tool``, ``tool_timeout``. User faults also set :attr:`Trajectory.sim_fault` (the
simulator could not produce a turn), which keeps every older reader of that flag right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

from muarl.types import Trajectory

Side = Literal["user", "policy", "tool"]
FAULT_KINDS: tuple[str, ...] = ("user", "user_timeout", "policy", "policy_timeout", "tool", "tool_timeout")
#: the parties whose faults are told apart in results tables, in the order they are shown
SIDES: tuple[Side, ...] = ("policy", "user", "tool")
#: the stop reason of an episode ended by a fault of each side ("sim_fault" as before for the user)
STOP_REASONS: dict[str, str] = {"user": "sim_fault", "policy": "policy_fault", "tool": "tool_fault"}


class EpisodeFault(Exception):
    """Ends one episode with a recorded fault; raised inside the episode loop, never out of it."""

    def __init__(self, kind: str, message: str, traceback: str = ""):
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
        super().__init__(message)
        self.kind, self.message, self.traceback = kind, message, traceback

    @property
    def side(self) -> Side:
        """Whose fault: the user, the policy or a tool (a timeout belongs to the party that was slow)."""
        return self.kind.split("_")[0]  # type: ignore[return-value]

    @property
    def timed_out(self) -> bool:
        return self.kind.endswith("_timeout")

    def record(self) -> dict[str, Any]:
        """What ``trajectory.metadata["fault"]`` holds."""
        return {"kind": self.kind, "message": self.message, "traceback": self.traceback}


class RunFailed(RuntimeError):
    """The run played, but what it would report or write would be wrong; the command line says why in one
    line and exits 1 (not 2: the command itself was well formed)."""


class EngineFailed(RunFailed):
    """The rollout engine failed between steps (a weight sync): the run cannot go on, and says so in one line."""


class AllEpisodesFaulted(RunFailed):
    """Every episode of a run faulted: there is nothing to report about the agent."""


def fault_counts(trajs: Iterable[Trajectory]) -> dict[str, int]:
    """Faulted episodes by kind, in :data:`FAULT_KINDS` order (kinds that did not occur are left out)."""
    counts = Counter(t.fault_kind for t in trajs if t.fault_kind)
    known = {k: counts.pop(k) for k in FAULT_KINDS if k in counts}
    return {**known, **dict(sorted(counts.items()))}


def side_of(kind: str) -> str:
    """The party a fault kind belongs to (``policy_timeout`` -> ``policy``)."""
    return kind.split("_")[0]


def counts_against_policy(traj: Trajectory) -> bool:
    """Whether an episode is the agent's to answer for: clean, or ended by a fault of the policy itself.

    Such an episode is a trial in every metric, a policy fault as a failure (reward 0). A user or tool
    fault is not the agent's doing and stays out (unless a caller counts every fault, as ``--sim-faults
    fail`` does)."""
    kind = traj.fault_kind
    return kind is None or side_of(kind) == "policy"


def credited_reward(traj: Trajectory) -> float | None:
    """The episode's reward as the agent's record: its reward when clean, 0 for a policy fault (whatever
    the final database), None for a user or tool fault (not the agent's doing: left out of the mean)."""
    if not counts_against_policy(traj):
        return None
    return traj.reward.reward if traj.reward is not None and not traj.fault_kind else 0.0


def fault_rates(trajs: Iterable[Trajectory]) -> dict[str, float | None]:
    """``{"policy_fault_rate", "user_fault_rate", "tool_fault_rate"}``: the fraction of the episodes that a
    fault of each party ended (timeouts with their party), rounded to 6 places; None without episodes.
    Results tables show them beside pass^1, so a success rate can be read with what was (policy) and was
    not (user, tool) counted in it."""
    sides = [side_of(t.fault_kind) if t.fault_kind else None for t in trajs]
    return {f"{side}_fault_rate": round(sides.count(side) / len(sides), 6) if sides else None for side in SIDES}


def fault_message(traj: Trajectory) -> str:
    """The recorded message of a faulted episode ('' when it recorded none)."""
    fault = traj.metadata.get("fault")
    if isinstance(fault, dict) and fault.get("message"):
        return str(fault["message"])
    if traj.sim_fault:
        return str(traj.metadata.get("sim_fault", ""))
    return next((r.output for r in traj.tool_log if r.error == "tool_fault"), "")


def require_unfaulted(trajs: Iterable[Trajectory], what: str) -> None:
    """Raise :class:`AllEpisodesFaulted` when there are episodes and every one of them faulted.

    Metrics over zero trials would read as a result; this says instead what broke, with the first
    episode's message (the rest are in each trajectory's ``metadata["fault"]``).
    """
    trajs = list(trajs)
    if not trajs or not all(t.fault_kind for t in trajs):
        return
    counts = ", ".join(f"{kind} {n}" for kind, n in fault_counts(trajs).items())
    raise AllEpisodesFaulted(f"{what}: every one of the {len(trajs)} episodes faulted ({counts}), so there is "
                             f"nothing to measure; first fault: {fault_message(trajs[0])}")
