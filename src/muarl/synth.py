"""Cold-start synthesis: a teacher plays training tasks against a simulated user; the clean wins are kept.

The teacher is any policy (the scripted expert by default, or an OpenAI-compatible model). A trajectory
is kept when it scored reward 1, broke no policy rule and had no simulator fault. Kept conversations are
written as a chat-format JSONL data set (``messages`` + ``tools`` per line, tool-call arguments as JSON
strings so every line has one schema) that ``datasets.load_dataset("json", data_files=...)`` reads and
muarl's SFT trains on. Which task families and which simulated-user behaviours (:func:`user_behaviours`:
users who withhold facts, change their mind, ask for what the policy forbids ...) the teacher sees is
configurable: the paper's cold-start data came from other scenarios than its RL tasks, which leaves RL
something to teach.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muarl.domain import Domain
from muarl.faults import RunFailed, fault_message
from muarl.files import write_lines
from muarl.policies.base import Policy
from muarl.provenance import record
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.types import Message, Scenario, Task, Trajectory
from muarl.users.base import UserSimulator

#: default least share of played episodes that must be clean wins for a data set to be written
MIN_KEPT = 0.5
#: fault kinds that mean a party raised (could not play the task), as opposed to running out of time
_RAISED = ("policy", "user")


class SynthesisFailed(RunFailed):
    """The teacher (or the simulated user) failed: no data set was written; the message says which tasks
    failed and why."""


@dataclass
class SynthReport:
    """How many episodes were played and kept, per domain and task family, and per user behaviour."""

    played: Counter = field(default_factory=Counter)
    kept: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)  # by reason: reward, violation, sim_fault
    kept_behaviours: Counter = field(default_factory=Counter)  # kept episodes whose user shows each behaviour
    #: every rejected episode: task id, the reason (as in ``rejected``) and what went wrong
    failures: list[dict[str, str]] = field(default_factory=list)
    #: why no data set was written (None: it was)
    refused: str | None = None
    #: what produced the data set (:func:`muarl.provenance.record`: muarl, the domains' data, teacher, user)
    provenance: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"played": dict(self.played), "kept": dict(self.kept), "rejected": dict(self.rejected),
                "kept_behaviours": dict(sorted(self.kept_behaviours.items())),
                "kept_total": sum(self.kept.values()), "played_total": sum(self.played.values()),
                "refused": self.refused, "failures": self.failures, "provenance": self.provenance}


#: what each named simulated-user behaviour looks like in a task's scenario (see :func:`user_behaviours`)
_BEHAVIOUR_CHECKS: dict[str, Callable[[Scenario], bool]] = {
    "withholds_info": lambda s: bool(s.withheld),
    "changes_mind": lambda s: any(i.first_args is not None for i in s.intents),
    "out_of_policy": lambda s: any(i.out_of_policy for i in s.intents),
    "asks_question": lambda s: any(i.question for i in s.intents),
    "several_requests": lambda s: len(s.intents) > 1,
    "acts_on_device": lambda s: any(i.user_actions for i in s.intents),
    "no_email": lambda s: "email" not in s.known and "zip" in s.known,
}
#: behaviour names :func:`user_behaviours` reads from a scenario (plus ``trait:<word>`` per persona trait)
BEHAVIOURS = tuple(_BEHAVIOUR_CHECKS)


def user_behaviours(task: Task) -> set[str]:
    """The simulated-user behaviours a task's scenario asks for, by name, read from its structure.

    ``withholds_info`` (some facts only when asked), ``changes_mind`` (asks for one thing, then another),
    ``out_of_policy`` (insists on what the policy forbids), ``asks_question`` (wants information said),
    ``several_requests``, ``acts_on_device`` (dual control: the user must run tools), ``no_email`` (has
    to be found by name and zip: does not remember the email), and ``trait:<word>`` for each persona
    trait (how an LLM user talks: impatient, terse ...).
    """
    scenario = task.scenario
    return ({name for name, shows in _BEHAVIOUR_CHECKS.items() if shows(scenario)}
            | {f"trait:{t}" for t in scenario.traits})


def select_tasks(tasks: Iterable[Task], families: list[str] | None = None, exclude: list[str] | None = None,
                 behaviours: list[str] | None = None, exclude_behaviours: list[str] | None = None) -> list[Task]:
    """Tasks whose family is in ``families`` (all when None) and not in ``exclude``, whose user shows at
    least one of ``behaviours`` (any when None) and none of ``exclude_behaviours``."""
    tasks = list(tasks)
    shown = {t.id: user_behaviours(t) for t in tasks}
    named = set(behaviours or []) | set(exclude_behaviours or [])
    unknown = sorted(named - set(BEHAVIOURS) - set().union(*shown.values()))
    if unknown:  # a misspelt name would otherwise select nothing, or exclude nothing, in silence
        traits = sorted({b for found in shown.values() for b in found if b.startswith("trait:")})
        raise ValueError(f"unknown user behaviour {', '.join(unknown)}; choose from {', '.join(BEHAVIOURS)}"
                         + (f" or a trait of these tasks' users: {', '.join(traits)}" if traits else ""))
    chosen = [t for t in tasks if (families is None or t.family in families) and t.family not in (exclude or [])
              and (behaviours is None or shown[t.id] & set(behaviours))
              and not shown[t.id] & set(exclude_behaviours or [])]
    if not chosen:
        raise ValueError(f"no task left after selecting families {families} and excluding {exclude}"
                         + (f", behaviours {behaviours} and excluding {exclude_behaviours}" if named else ""))
    return chosen


def reject_reason(traj: Trajectory) -> str | None:
    """Why a trajectory is not clean training data, or None when it is."""
    if traj.sim_fault:
        return "sim_fault"
    if traj.fault_kind:  # a policy or tool fault (see muarl.faults): whatever it scored, not clean data
        return f"{traj.fault_kind}_fault"
    if traj.reward is None or traj.reward.reward != 1.0:
        return "reward"
    if traj.reward.violations:
        return "violation"
    return None


def failure_detail(traj: Trajectory) -> str:
    """What went wrong in a rejected episode, in a few words (the fault's message, the failed checks, the
    violations)."""
    if traj.fault_kind or traj.sim_fault:
        return " ".join((fault_message(traj) or "no message").split())[:300]
    if traj.reward is None:
        return "not graded"
    if traj.reward.reward != 1.0:
        failed = [c.name for c in traj.reward.checks if not c.passed]
        return f"reward 0 (failed: {', '.join(failed) or 'database differs from gold'}; stop {traj.stop_reason})"
    return "violations: " + ", ".join(f"{v.kind} ({v.tool})" for v in traj.reward.violations)


def refusal(report: SynthReport, min_kept: float) -> str | None:
    """Why the played episodes must not become a data set, or None when they may.

    Refused when the teacher or the user raised for any task (it cannot play that task: whatever it did
    elsewhere is suspect), when no episode is a clean win, or when fewer than ``min_kept`` of them are.
    """
    played, kept = sum(report.played.values()), sum(report.kept.values())
    raised = [f for f in report.failures if f["reason"] in {f"{k}_fault" for k in _RAISED} | {"sim_fault"}
              and not f.get("timeout")]
    if raised:
        who = sorted({"the teacher" if f["reason"] == "policy_fault" else "the user" for f in raised})
        return (f"{' and '.join(who)} raised for {_count_tasks(raised)}: {_listing(raised)}; no data set written "
                "(report.json lists every failure)")
    if played and not kept:
        return (f"none of the {played} episodes is a clean win (reward 1, no violation): {_listing(report.failures)}; "
                "no data set written (report.json lists every failure)")
    if played and kept < min_kept * played:
        return (f"only {kept} of {played} episodes are clean wins, below the {min_kept:g} asked (--min-kept): "
                f"{_listing(report.failures)}; no data set written (report.json lists every failure)")
    return None


def _count_tasks(failures: list[dict[str, str]]) -> str:
    n = len({f["task"] for f in failures})
    return f"{n} task{'s' if n != 1 else ''}"


def _listing(failures: list[dict[str, str]], shown: int = 3) -> str:
    """The first few failures, one task each, as ``task (reason: detail)``."""
    by_task: dict[str, dict[str, str]] = {}
    for f in failures:
        by_task.setdefault(f["task"], f)
    parts = [f"{task} ({f['reason']}: {f['detail']})" for task, f in list(by_task.items())[:shown]]
    more = len(by_task) - shown
    return "; ".join(parts) + (f"; and {more} more task(s)" if more > 0 else "")


def to_chat_record(domain: Domain, task: Task, traj: Trajectory) -> dict[str, Any]:
    """One data-set line: the conversation in the chat-template format, with the tools the agent had.

    An assistant message the teacher made wrong on purpose (``metadata["slips"]``: their places among the
    assistant messages, see :meth:`muarl.policies.script.TeacherSession.slip`) gets ``"weight": 0``:
    trained on as context, not as a target (:func:`untrained_turns`)."""
    slips = set(traj.metadata.get("slips") or ())
    messages, said = [], 0
    for m in traj.messages:
        line = _chat_message(m)
        if m.role == "assistant":
            if said in slips:
                line["weight"] = 0
            said += 1
        messages.append(line)
    return {
        "domain": domain.name,
        "task_id": task.id,
        "family": task.family,
        "tools": [t.spec.openai_schema() for t in domain.tools],
        "messages": messages,
    }


def untrained_turns(record: dict[str, Any]) -> set[int]:
    """Indices of a data-set line's assistant messages marked ``"weight": 0`` (OpenAI's fine-tuning format):
    no loss on them. Any other weight is an error, not a silent 1."""
    out = set()
    for i, m in enumerate(record["messages"]):
        if "weight" not in m:
            continue
        if m.get("role") != "assistant" or m["weight"] not in (0, 1):
            raise ValueError(f"message {i}: \"weight\" must be 0 or 1 on an assistant message "
                             f"(got {m['weight']!r} on a {m.get('role')!r} message)")
        if m["weight"] == 0:
            out.add(i)
    return out


def _chat_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                             for c in m.tool_calls]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id or ""
        out["name"] = m.name or ""
    return out


def from_chat_record(record: dict[str, Any]) -> list[Message]:
    """The muarl messages of a data-set line (the inverse of :func:`to_chat_record`)."""
    from muarl.types import ToolCall

    messages = []
    for m in record["messages"]:
        calls = [ToolCall(id=c.get("id") or f"call_{i}", name=c["function"]["name"],
                          arguments=json.loads(c["function"]["arguments"] or "{}"))
                 for i, c in enumerate(m.get("tool_calls") or [])]
        messages.append(Message(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                                tool_call_id=m.get("tool_call_id") or None, name=m.get("name") or None))
    return messages


def prefix_record(record: dict[str, Any], calls: int) -> dict[str, Any]:
    """A data-set line cut right after the agent's ``calls``-th tool call (system turn and tools kept, so
    under any template it renders as an exact prefix of the whole conversation); shorter ones whole.

    Why: a model trained from random weights learns to copy identifiers (names, emails, order ids) from
    these short openings many times sooner than from whole conversations, whose long tails of
    confirmations and summaries dilute every step; once it copies there, whole conversations keep it
    (README, "The CPU demo": the demo's ``sft-prefix`` stage).
    """
    if calls < 1:
        raise ValueError(f"a prefix needs at least one tool call, not {calls}")
    messages, seen = [], 0
    for message in record["messages"]:
        messages.append(message)
        seen += bool(message.get("tool_calls"))
        if seen == calls:
            break
    return {**record, "messages": messages}


def map_records(src: Path, dst: Path, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Every line of a chat-format data set through ``fn`` into ``dst``, atomically (``dst`` may be
    ``src``); returns how many lines."""
    lines = [json.dumps(fn(json.loads(line)), ensure_ascii=False)
             for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    write_lines(dst, lines)
    return len(lines)


def write_prefixes(src: Path, dst: Path, calls: int) -> int:
    """:func:`prefix_record` of every line of ``src`` into ``dst`` (atomically); returns how many."""
    return map_records(src, dst, lambda record: prefix_record(record, calls))


def synthesize(
    domains: list[Domain],
    teacher: Policy,
    user: UserSimulator,
    out: Path,
    split: str = "train",
    n: int = 1,
    families: list[str] | None = None,
    exclude: list[str] | None = None,
    behaviours: list[str] | None = None,
    exclude_behaviours: list[str] | None = None,
    seed: int = 0,
    concurrency: int = 64,
    progress: bool = True,
    config: EpisodeConfig | None = None,
    min_kept: float = MIN_KEPT,
    specs: Mapping[str, str] | None = None,
    side: str = "agent",
) -> SynthReport:
    """Play every selected task ``n`` times per domain and write ``out/sft.jsonl`` and ``out/report.json``.

    Raw trajectories go to ``out/trajectories/<domain>.jsonl`` as they finish, so an interrupted
    synthesis resumes where it stopped; the data set is rewritten from them at the end, one record per
    clean win. ``config`` sets the episodes' limits (default: :class:`EpisodeConfig`'s, required outputs
    graded). A teacher that failed writes no data set (:func:`refusal`: it or the user raised for a task,
    or fewer than ``min_kept`` of the episodes are clean wins): :class:`SynthesisFailed` names the tasks,
    and report.json and the raw trajectories stay for a look (``muarl view OUT``). report.json records what
    produced the data (its ``provenance``; ``specs`` gives the teacher's and user's command-line specs,
    keys ``policy`` and ``user``), so an SFT model can be traced to the teacher and data it learned from.
    ``side="user"`` writes the same wins from the user's chair (:mod:`muarl.users.user_side`): data to
    fine-tune an LLM to play the customer.
    """
    if not 0 <= min_kept <= 1:
        raise ValueError(f"--min-kept must be between 0 and 1 (got {min_kept:g})")
    to_record = to_chat_record
    if side == "user":
        from muarl.users.user_side import check_domain, to_user_record

        for domain in domains:
            check_domain(domain)
        to_record = to_user_record
    elif side != "agent":
        raise ValueError(f"--side must be agent or user, not {side!r}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories").mkdir(exist_ok=True)
    given = dict(specs or {})
    report = SynthReport(provenance=record(domains, teacher, user, given.get("policy"), given.get("user")))
    lines: list[str] = []
    for domain in domains:
        tasks = select_tasks(domain.tasks(split), families, exclude, behaviours, exclude_behaviours)
        engine = RolloutEngine(domain, teacher, user, config or EpisodeConfig(require_outputs=True), group_size=n,
                               concurrency=concurrency, common_user_seed=False, seed=seed,
                               out=out / "trajectories" / f"{domain.name}.jsonl", progress=progress)
        groups = asyncio.run(engine.run(tasks))
        for task, group in zip(tasks, groups, strict=True):
            for traj in group:
                key = f"{domain.name}/{task.family}"
                report.played[key] += 1
                reason = reject_reason(traj)
                if reason:
                    report.rejected[reason] += 1
                    failure = {"task": task.id, "reason": reason, "detail": failure_detail(traj)}
                    if (traj.fault_kind or "").endswith("_timeout"):
                        failure["timeout"] = "yes"  # ran out of time: not a refusal by itself
                    report.failures.append(failure)
                    continue
                report.kept[key] += 1
                report.kept_behaviours.update(user_behaviours(task))
                lines.append(json.dumps(to_record(domain, task, traj), ensure_ascii=False))
    report.refused = refusal(report, min_kept)
    (out / "report.json").write_text(json.dumps(report.as_dict(), indent=1) + "\n")
    data = out / "sft.jsonl"
    if report.refused:
        data.unlink(missing_ok=True)  # an earlier run's data set would read as this one's
        raise SynthesisFailed(f"synthesis: {report.refused}; the trajectories are in {out / 'trajectories'}")
    write_lines(data, lines)  # written whole or not at all
    return report
