"""Reading a run directory into what the report shows: runs, trajectories as swimlanes, groups, tokens.

Why all of this happens in Python: lanes, diffs against gold, advantages and token tables are computed
(and unit-tested) here, so the page's JavaScript only lays out finished data. A run directory is only
ever read, never repaired: a torn last line (a run still writing, or one that was killed) is skipped
with a warning instead of being cut from the file the way a resuming engine would.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from muarl.faults import credited_reward, fault_counts, fault_message, fault_rates
from muarl.types import Task, Trajectory

# where each kind of run keeps its episodes (rollout / eval, synth raw, per-step GRPO rollouts)
TRAJECTORY_GLOBS = ("trajectories.jsonl", "trajectories/*.jsonl", "rollouts/*.jsonl")
STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


class EmptyRunError(FileNotFoundError):
    """The directory holds nothing the report can show."""


@dataclass
class Entry:
    """One trajectory and where it came from."""

    traj: Trajectory
    source: str
    step: int | None
    scored_here: bool = False


@dataclass
class Run:
    """Everything found in a run directory."""

    path: Path
    entries: list[Entry] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    results: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    omitted: int = 0


def read_jsonl(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """JSON objects of a JSONL file; a torn last line or a bad line becomes a warning, not a crash."""
    rows: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            where = "last line (torn: the run is still writing or was killed)" if n == len(lines) else f"line {n}"
            warnings.append(f"{path.name}: skipped {where}: not JSON")
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            warnings.append(f"{path.name}: skipped line {n}: not a JSON object")
    return rows


def _read_json(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        warnings.append(f"{path.name}: not valid JSON ({err}); left out")
        return None
    if not isinstance(data, dict):
        warnings.append(f"{path.name}: not a JSON object; left out")
        return None
    return data


def trajectory_files(run_dir: Path) -> list[Path]:
    """Trajectory files of a run, step files in step order."""
    found: list[Path] = []
    for pattern in TRAJECTORY_GLOBS:
        found.extend(sorted(run_dir.glob(pattern), key=lambda p: (_step_of(p) or 0, p.name)))
    return found


def _step_of(path: Path) -> int | None:
    match = STEP_FILE.search(path.name)
    return int(match.group(1)) if match else None


def load_run(run_dir: str | Path, max_trajectories: int | None = None) -> Run:
    """Read every known file of ``run_dir``; :class:`EmptyRunError` when there is nothing to show.

    With ``max_trajectories`` (0 or None: all) a larger run keeps its first and last halves (the start
    and the end of training, or of an evaluation) and records how many were left out; the lines left
    out are never parsed.
    """
    path = Path(run_dir)
    if not path.exists():
        raise EmptyRunError(f"run directory {path} does not exist")
    if not path.is_dir():
        raise EmptyRunError(f"{path} is not a directory (expected a run directory)")
    run = Run(path=path)
    for name in ("config.json", "results.json", "summary.json"):
        if (path / name).exists():
            run.files.append(name)
            data = _read_json(path / name, run.warnings)
            setattr(run, name.removesuffix(".json"), data)
    if (path / "metrics.jsonl").exists():
        run.files.append("metrics.jsonl")
        run.metrics = read_jsonl(path / "metrics.jsonl", run.warnings)
    lines: list[tuple[str, int, bool, str]] = []  # (file, line number, is last line, text)
    for file in trajectory_files(path):
        rel = str(file.relative_to(path))
        run.files.append(rel)
        text = file.read_text(encoding="utf-8", errors="replace").splitlines()
        lines.extend((rel, n, n == len(text), line) for n, line in enumerate(text, 1) if line.strip())
    if not run.files:
        raise EmptyRunError(
            f"{path} holds no run files: expected trajectories.jsonl, rollouts/step_*.jsonl, "
            "trajectories/*.jsonl, metrics.jsonl, results.json or summary.json "
            "(written by muarl rollout / eval / synth / sft / grpo)")
    if max_trajectories and len(lines) > max_trajectories:  # decided before parsing: big runs stay cheap
        head, tail = max_trajectories - max_trajectories // 2, max_trajectories // 2
        run.omitted = len(lines) - max_trajectories
        lines = lines[:head] + lines[len(lines) - tail:]
        run.warnings.append(f"{run.omitted} trajectories left out (showing the first {head} and the last "
                            f"{tail}; raise --max-trajectories, or 0 for all)")
    for rel, n, last, line in lines:
        traj = _parse(rel, n, last, line, run.warnings)
        if traj is not None:
            step = traj.metadata.get("step", _step_of(Path(rel)))
            run.entries.append(Entry(traj, rel, int(step) if isinstance(step, int | float) else None))
    return run


def _parse(rel: str, n: int, last: bool, line: str, warnings: list[str]) -> Trajectory | None:
    """One line as a trajectory (parsed and validated in one pass by pydantic), or a warning."""
    from pydantic import ValidationError

    try:
        return Trajectory.model_validate_json(line)
    except ValidationError as err:
        if err.errors()[0]["type"] == "json_invalid":
            where = "last line (torn: the run is still writing or was killed)" if last else f"line {n}"
            warnings.append(f"{rel}: skipped {where}: not JSON")
        else:
            first = " ".join(str(err).splitlines()[:2])
            warnings.append(f"{rel}: line {n} is not a trajectory ({first}); left out")
        return None


def domain_specs(run: Run) -> list[str]:
    """The domains a run says it used, as given on its command line (``retail``, ``my_module:domain``).

    Why: a trajectory records its domain's *name*, which only the built-in domains are registered under;
    a plug-in domain is found again through the ``module:attr`` its run recorded (``config.json`` of eval,
    synth and grpo, ``summary.json`` of rollout, ``results.json``'s config).
    """
    found: list[str] = []
    results_config = (run.results or {}).get("config")
    for source in (run.config, results_config if isinstance(results_config, dict) else None, run.summary):
        if not source:
            continue
        named = source.get("domains")
        for spec in [source.get("domain"), *(named if isinstance(named, list) else [])]:
            if isinstance(spec, str) and spec and spec not in found:
                found.append(spec)
    return found


class TaskIndex:
    """Tasks by (domain, id), loaded once per domain; a domain that cannot be loaded gives None.

    ``specs`` are what the run recorded (see :func:`domain_specs`): a trajectory's domain name is looked
    up among the domains they load first, then by name. A recorded spec that does not load (a plug-in
    module not on the path here) is said once in ``warnings``.
    """

    def __init__(self, specs: list[str] | None = None, warnings: list[str] | None = None) -> None:
        self._tasks: dict[str, dict[str, Task] | None] = {}
        self._domains: dict[str, Any] = {}
        self._specs = list(specs or [])
        self._warnings = warnings if warnings is not None else []
        self._failed: set[str] = set()

    def _load(self, name: str) -> Any:
        from muarl.domain import get_domain

        for spec in self._specs:
            if spec in self._failed:
                continue
            try:
                domain = get_domain(spec)
            except (KeyError, ImportError, AttributeError, ValueError, OSError) as err:
                self._failed.add(spec)
                why = err.args[0] if isinstance(err, KeyError) and err.args else err
                self._warnings.append(f"the run's domain {spec!r} could not be loaded here ({why}); its tasks "
                                      "(family, instruction, gold) are not shown")
                continue
            if domain.name == name:
                return domain
        return get_domain(name)

    def domain(self, name: str) -> Any | None:
        if name not in self._tasks:
            try:
                domain = self._load(name)
                self._domains[name] = domain
                self._tasks[name] = {t.id: t for t in domain.tasks()}
            except (KeyError, ImportError, AttributeError, ValueError, OSError):
                self._tasks[name] = None
        return self._domains.get(name)

    def task(self, domain: str, task_id: str) -> Task | None:
        self.domain(domain)
        tasks = self._tasks.get(domain)
        return tasks.get(task_id) if tasks else None


def ensure_scored(entry: Entry, index: TaskIndex, warnings: list[str]) -> None:
    """Score an unscored trajectory (replaying its tool log) so its diff against gold can be shown."""
    traj = entry.traj
    if traj.reward is not None:
        return
    domain, task = index.domain(traj.domain), index.task(traj.domain, traj.task_id)
    if domain is None or task is None:
        warnings.append(f"{traj.task_id}: unscored and its task is not in domain {traj.domain!r}; no diff")
        return
    from muarl.rewards import score

    traj.reward = score(domain, task, traj)
    entry.scored_here = True


def _args(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def lanes(traj: Trajectory) -> list[dict[str, Any]]:
    """The conversation as ordered events in three lanes: ``agent``, ``user`` and ``tools``.

    Agent text and tool calls go to the agent lane, user messages and the user's own tool calls (phone
    actions in dual-control domains) to the user lane, every execution result to the tools lane. User
    tool calls are not in the agent's messages; their call ids (``user_t{N}_...``) say which user
    message they precede, which is where they are placed.
    """
    records = {r.call_id: r for r in traj.tool_log}
    user_actions: dict[int, list[Any]] = defaultdict(list)
    for r in traj.tool_log:
        if r.actor == "user":
            match = re.match(r"user_t(\d+)_", r.call_id)
            user_actions[int(match.group(1)) if match else -1].append(r)
    events: list[dict[str, Any]] = []
    user_turn = 0
    slips: dict[int, list[str]] = defaultdict(list)  # message index -> what the user got wrong there
    for kind, where in (traj.metadata.get("user_slips") or {}).items():
        for n in where:
            slips[n].append(kind)

    def emit_user_actions(turn: int) -> None:
        for r in user_actions.pop(turn, []):
            events.append({"lane": "user", "kind": "call", "name": r.name, "args": _args(r.arguments), "id": r.call_id})
            events.append({"lane": "tools", "kind": "result", "name": r.name, "text": r.output, "ok": r.ok,
                           "actor": "user", "changed": [f"{t}[{k}]" for t, k in r.changed]})

    for n, m in enumerate(traj.messages):
        if m.role == "system":
            continue
        if m.role == "user":
            emit_user_actions(user_turn)
            events.append({"lane": "user", "kind": "message", "text": m.content, **({"slips": slips[n]} if n in slips
                                                                                   else {})})
            user_turn += 1
        elif m.role == "assistant":
            if m.content.strip() or not m.tool_calls:  # an empty reply is shown too: it is what was said
                events.append({"lane": "agent", "kind": "message", "text": m.content or "(empty message)"})
            for call in m.tool_calls:
                events.append({"lane": "agent", "kind": "call", "name": call.name, "args": _args(call.arguments),
                               "id": call.id})
        elif m.role == "tool":
            record = records.get(m.tool_call_id or "")
            if record is None:  # a malformed call: the parser's error text, no execution
                events.append({"lane": "tools", "kind": "error", "name": m.name or "error", "text": m.content,
                               "ok": False})
            else:
                events.append({"lane": "tools", "kind": "result", "name": record.name, "text": record.output,
                               "ok": record.ok, "actor": "agent", "error": record.error,
                               "changed": [f"{t}[{k}]" for t, k in record.changed]})
    for turn in sorted(user_actions):  # actions after the last user message (or with foreign ids)
        emit_user_actions(turn)
    return events


def fault_of(traj: Trajectory) -> dict[str, str] | None:
    """The episode's fault for the page (kind, message, traceback), None for a clean episode. Older
    trajectories recorded only ``sim_fault`` or a tool-fault record: their kind and message are derived."""
    kind = traj.fault_kind
    if kind is None:
        return None
    recorded = traj.metadata.get("fault")
    trace = str(recorded.get("traceback") or "") if isinstance(recorded, dict) else ""
    return {"kind": kind, "message": fault_message(traj), "traceback": trace}


def advantages(rewards: list[float]) -> list[float]:
    """GRPO's group advantages (muarl.algorithms), for groups whose files do not record them."""
    import torch

    from muarl.algorithms import get_algorithm

    if len(rewards) < 2:
        return [0.0] * len(rewards)
    return [float(a) for a in get_algorithm("grpo").advantages(torch.tensor([rewards]))[0]]


def groups(entries: list[Entry]) -> list[dict[str, Any]]:
    """Groups of episodes of one task played together (same file, step and task), members in order.

    Advantages come from the trajectories' metadata (what training used) when every member has one;
    otherwise they are computed from the rewards with GRPO's formula and marked as computed.
    """
    by_key: dict[tuple[str, int | None, str, Any], list[int]] = defaultdict(list)
    for i, e in enumerate(entries):
        by_key[(e.source, e.step, e.traj.task_id, e.traj.metadata.get("group"))].append(i)
    out = []
    for (source, step, task_id, _), members in by_key.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda i: int(entries[i].traj.metadata.get("member", 0)))
        stored = [entries[i].traj.metadata.get("advantage") for i in members]
        rewards = [entries[i].traj.reward.reward if entries[i].traj.reward else 0.0 for i in members]
        recorded = all(isinstance(a, int | float) for a in stored)
        out.append({"source": source, "step": step, "task_id": task_id, "domain": entries[members[0]].traj.domain,
                    "members": members, "rewards": rewards,
                    "advantages": [float(a) for a in stored] if recorded else advantages(rewards),
                    "advantage_source": "recorded" if recorded else "computed (GRPO)"})
    return out


def overview(run: Run) -> dict[str, Any]:
    """Headline numbers over the trajectories shown."""
    trajs = [e.traj for e in run.entries]
    n = len(trajs)
    rewards = [t.reward for t in trajs if t.reward is not None]
    # as evaluation counts them: a policy fault is a failure, a user or tool fault is left out
    credited = [r for t in trajs if (r := credited_reward(t)) is not None]
    return {
        "trajectories": n,
        "omitted": run.omitted,
        "tasks": len({(t.domain, t.task_id) for t in trajs}),
        "domains": sorted({t.domain for t in trajs}),
        "success": round(sum(credited) / len(credited), 4) if credited else None,
        **{key: round(rate, 4) for key, rate in fault_rates(trajs).items() if rate is not None},
        "tcr": round(sum(r.tcr for r in rewards) / len(rewards), 4) if rewards else None,
        "violation_rate": round(sum(bool(r.violations) for r in rewards) / len(rewards), 4) if rewards else None,
        "mean_turns": round(sum(t.turns for t in trajs) / n, 2) if n else None,
        "stop_reasons": dict(Counter(t.stop_reason or "(none)" for t in trajs).most_common()),
        "faults": fault_counts(trajs),  # faulted episodes by kind (muarl.faults); their rewards are not the agent's
    }
