"""How an episode on an MCP server is graded: the server's state read as outcomes, the gold actions replayed once.

A state that lives in a tool server can be shared with something else (every episode, every gold replay) or
keep its own rules about sessions (a reset every few sessions, a snapshot per session), and muarl sees only
what the server answers. :func:`score_episode` (every :class:`~muarl.mcp.domain.MCPDomain`'s ``scorer``) reads
the state as *outcomes*, :class:`Reading`: the state's hash, or why it could not be read (an error is a reading
like any other, never one to skip), and asks of those readings what a server that gives every session its own
state must satisfy:

1. two reads of the episode's state with nothing in between agree;
2. a fresh session starts from the state the episode's session started from (read when it opened, before the
   agent's first call): if the gold replay's session starts elsewhere, it sees the episode's writes (one state
   for every session), or the server resets or snapshots its state by session. The gold actions are then
   **not replayed**, so grading writes nothing into a store that may be shared;
3. the gold actions, where the server accepted a write among them, change the state of their fresh session: a
   gold that leaves a fresh session's state as it was cannot tell a do-nothing agent from a good one (the store
   already holds gold's writes from an earlier replay, or the task's gold does nothing);
4. the episode's state is the same after the gold replay as before it (the replay, on a session of its own,
   must not be seen by the episode's session).

A failed check sets ``env.state_fault`` (the episode becomes a ``tool`` fault, :mod:`muarl.rollout`) and the
database match is false. Each check runs where it means something: 2 and 3 only where the gold actions run on
the server and a state reader reads it (a domain without a base, with ``state``); 1 and 4 wherever the state
is the server's (a state reader, or muarl's own ``muarl_state``).

The gold actions run on one env. The lagging copy :func:`muarl.rewards.gold_env` keeps to find what each gold
action wrote is local here (a domain with a base replays gold on the base's database, no server involved; a
domain without one keeps its write log locally): no second session writes gold into the server. The rest of
the reward (per-action checks, outputs, violations, the diff) is :func:`muarl.rewards.score`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from muarl.db import MISSING, changes
from muarl.rewards import effect_checks, gold_env, graded, replay
from muarl.types import Check, Reward, Task, Trajectory

if TYPE_CHECKING:
    from muarl.domain import Domain
    from muarl.env import Env

#: (table, key, path inside the record): one field a gold action wrote
Field = tuple[str, str, tuple]


@dataclass(frozen=True)
class Reading:
    """One reading of a server's state as an outcome: ``ok`` and the state's hash, or not and why it could not
    be read. Two readings are equal when their outcomes are: an unreadable state equals the same failure, and
    never a readable one (unreadable before and readable after is a state that moved)."""

    ok: bool
    value: str

    def describe(self) -> str:
        return f"state {self.value.removeprefix('state:')[:12]}" if self.ok else f"no state ({self.value[:120]})"


def score_episode(domain: Domain, task: Task, trajectory: Trajectory, env: Env | None = None,
                  require_outputs: bool = True) -> Reward:
    """Grade one episode of an MCP domain (see the module's docstring); ``env`` is the live final state."""
    final: Any = env if env is not None else replay(domain, task, trajectory.tool_log)
    watched = bool(getattr(final, "external_state", False))
    on_server = getattr(domain, "mirror", None) is None  # gold actions run on the server, not on a base
    read_fresh = watched and on_server and getattr(domain, "state", None) is not None
    fault: str | None = None
    first = second = None
    if watched:
        first, second = final.reading(), final.reading()
        if first != second:
            fault = (f"the state of {domain.name} changed between two reads with nothing in between ("
                     f"{first.describe()}, then {second.describe()}): it is not the episode's own (shared with "
                     "something else, or unstable)")
    gold: Any = domain.env(task)
    effects: list[list[Field]] | None = None
    done: Reading | None = None  # the gold session's state after the gold actions, when read already
    if fault is None and read_fresh:
        start, fresh = final.start, gold.reading()
        if start is not None and fresh != start:
            fault = (f"a fresh session of {domain.name} started from another state than the episode's session "
                     f"did ({fresh.describe()}, the episode's {start.describe()}): its sessions do not each start "
                     "from the same state (every session shares one state and sees the others' writes, or the "
                     "server resets or snapshots it by session), so no reward can be read from it; the gold "
                     "actions were not replayed")
    if fault is None:
        if on_server:
            effects = _replay_gold(gold, task)
        else:
            gold, effects = gold_env(domain, task)
        if read_fresh and _wrote(gold):
            done = gold.reading()
            if done.ok and done == gold.start:
                fault = (f"the gold actions of task {task.id} changed nothing in a fresh session of {domain.name}, "
                         "though the server accepted them: either the store already holds their writes (one state "
                         "for every session, an earlier replay's writes in it) or the task's gold does nothing, "
                         "and neither tells a do-nothing agent from a good one")
    after = final.reading() if watched else None
    if fault is None and after is not None and after != second:
        fault = (f"the state of {domain.name} changed while the gold actions were replayed on a session of "
                 f"their own ({second.describe() if second else ''}, then {after.describe()}): every session "
                 "shares one state (give each episode its own, e.g. with {episode_dir}), so no reward can be "
                 "read from it")
    if fault is not None and final.state_fault is None:
        final.state_fault = fault
    if after is None:
        final_hash: str | None = final.hash()
    else:
        final_hash = after.value if after.ok else None
    if effects is None:
        gold_hash = None
    else:  # an unknown state's hash equals no other
        gold_hash = (done.value if done.ok else None) if done is not None else gold.hash()
    db_match = final.state_fault is None and final_hash is not None and final_hash == gold_hash
    checks: list[Check] = []
    if effects is None:  # the gold actions did not run: nothing to check them against
        checks.append(Check(name="state of the episode's own", passed=False, detail=fault or ""))
    else:
        checks = effect_checks(task, effects, final, gold)
        if not checks:  # the task's own starting state: a fresh session's, read before gold ran (no new session)
            if read_fresh and gold.start is not None:
                untouched = after == gold.start
            else:
                untouched = final.hash() == domain.env(task).hash()
            checks.append(Check(name="database unchanged", passed=untouched))
    # a fault first (``muarl gold`` shows why a task fails), then the states' differences if gold ran
    return graded(domain, task, trajectory, db_match, checks, require_outputs,
                  [] if db_match else [*([f"state: {fault}"] if fault else []),
                                       *(final.diff(gold) if effects is not None else [])])


def _replay_gold(gold: Any, task: Task) -> list[list[Field]]:
    """Run the gold actions on ``gold`` (one server session); the fields each wrote in its local write log,
    found against a copy of that log taken before it (no second session replays them)."""
    effects: list[list[Field]] = []
    for action in task.gold_actions:
        before = gold.db.to_dict()
        record = gold.run(action)
        effects.append([(t, k, path) for t, k in record.changed
                        for path, _, _ in changes(before.get(t, {}).get(k, MISSING), _get(gold, t, k))])
    return effects


def _wrote(gold: Any) -> bool:
    """Whether the server accepted a write among the gold actions."""
    return any(r.ok and r.kind == "write" for r in gold.log)


def _get(env: Any, table: str, key: str) -> Any:
    return env.db[table].get(key, MISSING)
