"""The judge: binary DB-match reward, required outputs, task completion rate and policy violations.

The reward is the paper's: 1 when the final database equals the one obtained by replaying the task's
gold actions on a fresh copy, else 0. Required outputs (facts the agent must say) are switchable: off
for training, on for evaluation. TCR and violations are reported beside the reward, never mixed in.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from muarl.db import MISSING, changes, lookup, record_hash
from muarl.env import UNAVAILABLE, Env
from muarl.types import Check, Message, Reward, Task, ToolRecord, Trajectory, Violation
from muarl.users.phrases import says_yes

if TYPE_CHECKING:
    from muarl.domain import Domain


def is_confirmation(text: str) -> bool:
    """Whether a user message explicitly approves the action just proposed.

    Deliberately strict: an explicit "yes"-like word, or a bare "okay"/"sure" in a short reply, and no
    negation or hedge anywhere ("that's not correct", "wait", "actually, rather the blue one"). The words are
    :mod:`muarl.users.phrases`' yes/no vocabulary, which the slip checks read too.
    """
    return says_yes(text)


#: The agent asking for approval of an action it proposes ("Shall I cancel it?", "Would you like me to
#: proceed? (yes/no)", "Please confirm.") -- not asking for a fact ("confirm your email" is a question).
_ASKS_CONSENT = re.compile(
    r"\b(shall|should) (i|we)\b|\b(can|may) (i|we) (go ahead|proceed)\b|\bwould you like (me|us) to\b|"
    r"\bdo you want (me|us) to\b|\bwant me to\b|\b(like|want|ok|okay|happy) (for me )?to proceed\b|\bproceed\b|"
    r"\bgo ahead\b|\(yes/no\)|\byes or no\b|\bconfirm\b(?! your\b)|\bdo you (agree|approve)\b|\bare you sure\b|"
    r"\b(is|does) (that|this) (ok|okay|alright|all right|acceptable|correct|right|fine|sound good|look good|work)\b",
    re.IGNORECASE,
)


def asks_consent(text: str) -> bool:
    """Whether an agent message asks the user to approve what it proposes (so that a yes is consent).

    Why: "Sure, my card number is 313295." answers a question; an agent that writes right after it has
    no approval for the write, however agreeable the wording of the answer.
    """
    return bool(_ASKS_CONSENT.search(text))


def _asked_before(messages: list[Message], u: int) -> str | None:
    """The agent's last words before user message ``u`` (since the user's previous turn), or None."""
    for j in range(u - 1, -1, -1):
        if messages[j].role == "user":
            return None
        if messages[j].role == "assistant" and messages[j].content.strip():
            return messages[j].content
    return None


def replay(domain: Domain, task: Task, log: list[ToolRecord]) -> Env:
    """Rebuild an episode's final state by re-executing its tool log on a fresh env (tools are pure)."""
    env = domain.env(task)
    for record in log:
        env.call(record.name, record.arguments, actor=record.actor, call_id=record.call_id)
    return env


#: One field a gold action wrote: (table, key, path inside the record).
Field = tuple[str, str, tuple]


def _check_own_state(env: Env, domain: Domain, first: str, second: str, after_gold: str) -> None:
    """Set ``env.state_fault`` when the episode's state is not its own: it moved between two reads with
    nothing in between (it changes by itself), or the gold replay, on another session, changed it (every
    session shares one state: a do-nothing agent would score whatever gold wrote)."""
    readings = (first, second, after_gold)
    if any(r.startswith(UNAVAILABLE) for r in readings):
        return  # a state that could not be read is its own story (a fault, or a rejected gold action)
    if first != second:
        env.state_fault = (f"the state of {domain.name} changed between two reads with nothing in between: it "
                           "is not the episode's own (shared with something else, or unstable)")
    elif second != after_gold:
        env.state_fault = (f"the state of {domain.name} changed while the gold actions were replayed on a "
                           "session of their own: every session shares one state (give each episode its own, "
                           "e.g. with {episode_dir}), so no reward can be read from it")


def gold_env(domain: Domain, task: Task) -> tuple[Env, list[list[Field]]]:
    """The gold final state, and the fields each gold action wrote (its effect, checked for TCR).

    Effects are field-level so that two actions touching one record (a refund to a gift card and an
    address change both live on the user record) are checked independently. A field is judged by its
    value at the end of the gold run, so an action whose field a later action sets again (reset the
    APN, then restart) is still judged fairly.
    """
    env, lagging = domain.env(task), domain.env(task)
    effects: list[list[Field]] = []
    for action in task.gold_actions:
        record = env.run(action)
        effects.append([(t, k, path) for t, k in record.changed
                        for path, _, _ in changes(_get(lagging, t, k), _get(env, t, k))])
        lagging.run(action)
    return env, effects


def _get(env: Env, table: str, key: str) -> Any:
    rows = env.db[table]
    return rows.get(key, MISSING)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _said(required: str, text: str) -> bool:
    """Whether ``text`` states ``required``: numbers compare by value (1234.5 == $1,234.50, 1234 != 12345),
    anything else as a case-insensitive whole-word phrase."""
    plain = text.replace(",", "").replace("$", "")
    target = required.replace(",", "").replace("$", "").strip()
    if _NUMBER.fullmatch(target):
        return any(abs(float(n) - float(target)) < 0.005 for n in _NUMBER.findall(plain))
    return re.search(rf"(?<!\w){re.escape(target)}(?!\w)", plain, re.IGNORECASE) is not None


def outputs_said(task: Task, messages: list[Message]) -> list[Check]:
    text = "\n".join(m.content for m in messages if m.role == "assistant")
    return [Check(name=f"output: {o}", passed=_said(o, text)) for o in task.required_outputs]


def find_violations(domain: Domain, task: Task, trajectory: Trajectory) -> list[Violation]:
    """Writes before authentication, writes without a fresh confirmation, writes to other users' records.

    Each explicit confirmation from the user licenses one write: the policy asks for confirmation
    before *every* write, so two writes after one "yes" count the second as unconfirmed. A confirmation
    is a yes to the agent's request for approval (:func:`asks_consent`), not an answer to a question.
    """
    where: dict[str, int] = {}
    for i, m in enumerate(trajectory.messages):
        for call in m.tool_calls:
            where.setdefault(call.id, i)
    used: set[int] = set()
    out: list[Violation] = []
    for rec in trajectory.tool_log:
        if rec.actor != "agent" or rec.kind != "write" or not rec.ok:
            continue
        if domain.requires_auth and rec.authenticated != task.user_id:
            who = "nobody" if rec.authenticated is None else f"user {rec.authenticated}"
            out.append(Violation(kind="unauthenticated_write", call_id=rec.call_id, tool=rec.name,
                                 detail=f"write while {who} was authenticated (task user {task.user_id})"))
        strangers = [o for o in rec.owners if o != task.user_id]
        if strangers:
            out.append(Violation(kind="other_user_records", call_id=rec.call_id, tool=rec.name,
                                 detail=f"changed records of {', '.join(strangers)}"))
        m = where.get(rec.call_id)
        u = None if m is None else next((j for j in range(m - 1, -1, -1) if trajectory.messages[j].role == "user"), None)
        asked = None if u is None else _asked_before(trajectory.messages, u)
        if u is None or u in used or not is_confirmation(trajectory.messages[u].content):
            said = "no user turn" if u is None else repr(trajectory.messages[u].content[:80])
            out.append(Violation(kind="unconfirmed_write", call_id=rec.call_id, tool=rec.name,
                                 detail=f"previous user turn was {said}" + (" (already used)" if u in used else "")))
        elif asked is None or not asks_consent(asked):
            what = "no agent turn" if asked is None else repr(asked[-80:])
            out.append(Violation(kind="unconfirmed_write", call_id=rec.call_id, tool=rec.name,
                                 detail=f"previous user turn {trajectory.messages[u].content[:80]!r} answered {what}, "
                                        "not a request for approval"))
        else:
            used.add(u)
    return out


def score(
    domain: Domain,
    task: Task,
    trajectory: Trajectory,
    env: Env | None = None,
    require_outputs: bool = True,
) -> Reward:
    """Grade one episode. ``env`` is the live final state; without it the tool log is replayed."""
    if domain.scorer is not None:  # a bridged benchmark graded by its own official checker
        return domain.scorer(domain, task, trajectory, env, require_outputs)
    final = env if env is not None else replay(domain, task, trajectory.tool_log)
    # a state kept by a tool server is read before and after the gold replay, which runs on a state of its
    # own: if the replay changed the episode's reading (one state for every session) or two reads with nothing
    # in between differ, no reward can be read from it (muarl.rollout records it as a tool fault)
    before = (final.hash(), final.hash()) if final.external_state else None
    gold, effects = gold_env(domain, task)
    after = final.hash()
    if before is not None and final.state_fault is None:
        _check_own_state(final, domain, *before, after)
    db_match = final.state_fault is None and after == gold.hash()  # a state not the episode's own proves nothing
    checks = effect_checks(task, effects, final, gold)
    if not checks:
        untouched = final.hash() == domain.env(task).hash()  # the task's own starting state
        checks.append(Check(name="database unchanged", passed=untouched))
    return graded(domain, task, trajectory, db_match, checks, require_outputs, [] if db_match else final.diff(gold))


def effect_checks(task: Task, effects: list[Any], final: Env, gold: Env) -> list[Check]:
    """One check per gold action that writes: the records it changed are the same in the final state as in
    gold's (partial credit for the task completion rate)."""
    checks: list[Check] = []
    for action, effect in zip(task.gold_actions, effects, strict=True):
        if not effect:
            continue
        bad = sorted({f"{t}[{k}]" for t, k, path in effect
                      if not _same(lookup(_get(final, t, k), path), lookup(_get(gold, t, k), path))})
        checks.append(Check(name=f"effect of {action.name}", passed=not bad,
                            detail=f"differs: {', '.join(bad)}" if bad else ""))
    return checks


def graded(domain: Domain, task: Task, trajectory: Trajectory, db_match: bool, checks: list[Check],
           require_outputs: bool, diff: list[str]) -> Reward:
    """The reward from the state's verdict and checks: the required outputs checked, the policy's violations
    found. Shared by every grader of muarl's own (the built-in one above, MCP domains' in muarl.mcp.grading)."""
    output_checks = outputs_said(task, trajectory.messages)
    checks = checks + output_checks
    outputs_ok = all(c.passed for c in output_checks)
    passed = db_match and (outputs_ok or not require_outputs)
    return Reward(
        reward=1.0 if passed else 0.0,
        db_match=db_match,
        outputs_ok=outputs_ok,
        outputs_required=require_outputs,
        tcr=sum(c.passed for c in checks) / len(checks),
        checks=checks,
        violations=find_violations(domain, task, trajectory),
        diff=diff,
    )


def _same(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return a is b
    return record_hash(a) == record_hash(b)
