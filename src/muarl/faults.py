"""Episode faults: what ends an episode that the agent did not cause, recorded instead of raised.

Why this exists: one broken user, policy backend or tool must cost one episode, never the run. The
episode loop (:mod:`muarl.rollout`) turns every exception, malformed return and time-limit hit of those
three parties into an :class:`EpisodeFault`; :func:`muarl.rollout.run_episode` records it in the
trajectory's ``metadata["fault"]`` (kind, message, traceback) and returns normally, so the other episodes
run on and are saved. A faulted episode says nothing about the agent: evaluation leaves it out of the
success metrics (as simulator faults always were) and GRPO masks it from the gradient; both count faults
by kind so nothing is hidden.

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


class AllEpisodesFaulted(RunFailed):
    """Every episode of a run faulted: there is nothing to report about the agent."""


def fault_counts(trajs: Iterable[Trajectory]) -> dict[str, int]:
    """Faulted episodes by kind, in :data:`FAULT_KINDS` order (kinds that did not occur are left out)."""
    counts = Counter(t.fault_kind for t in trajs if t.fault_kind)
    known = {k: counts.pop(k) for k in FAULT_KINDS if k in counts}
    return {**known, **dict(sorted(counts.items()))}


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
