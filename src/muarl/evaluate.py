"""Evaluation: k trials of every task by any policy against any user, and the metrics tau-bench reports.

:func:`evaluate` plays ``k`` trials per task with the :class:`~muarl.rollout.RolloutEngine` (a trial is a
group member, each with its own user seed, so the k trials are k independent conversations) and
summarises them. With ``out_dir`` every finished trajectory is appended to ``trajectories.jsonl`` the
moment it ends, so a killed evaluation loses nothing and a rerun with the same directory plays only the
missing trials; the metrics are computed from the trajectories in task and trial order, never in
completion order, so a resumed run reports exactly what an uninterrupted one would.

Faulted episodes (see :mod:`muarl.faults`) are treated by whose fault it was. A *policy* fault (the
policy under evaluation raised, returned something malformed or ran past its time limit) is a failed
trial (reward 0) in every metric: a policy that breaks on the hard tasks must not score as if those
tasks did not exist. A *user* or *tool* fault (the simulator or a tool server broke) says nothing about
the agent and is by default *left out* of every denominator; ``sim_faults="fail"`` counts those as
failed trials too (tau-bench counts every episode), for comparisons with numbers computed that way.
``policy_fault_rate``, ``user_fault_rate`` and ``tool_fault_rate`` (over every episode) stand beside
pass^1 in every results table, and ``faults`` counts them by kind, so nothing is hidden. A run in which
every episode faulted raises :class:`~muarl.faults.AllEpisodesFaulted` (after writing its results) rather
than report metrics over nothing. Tool failures the agent saw (errors by kind, ``tool_error_rate``) are
counted over every episode.

An evaluation into a full disk stops with one line (:class:`~muarl.train.diskspace.OutOfSpace`) naming the
folder, its free bytes and the episodes kept; rerunning the command once there is room resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from muarl.domain import Domain
from muarl.faults import SIDES, counts_against_policy, fault_counts, fault_rates, require_unfaulted, side_of
from muarl.files import atomic_write
from muarl.policies.base import Policy
from muarl.provenance import record as provenance_record
from muarl.rollout import EpisodeConfig, RolloutEngine, load_trajectories
from muarl.time_split import summarize as time_split
from muarl.train.diskspace import reported
from muarl.types import Task, Trajectory
from muarl.users.base import UserSimulator
from muarl.users.slips import SLIPS, slip_rates

SimFaults = Literal["exclude", "fail"]
SIM_FAULT_MODES: tuple[str, ...] = ("exclude", "fail")
#: Options that change what a trial plays; a rerun into a directory evaluated with other values is refused
#: (mixing their trajectories would make the metrics meaningless). k, the task list, concurrency and the
#: sim-fault rule may change: new trials are added, and the metrics are recomputed from the trajectories.
IDENTITY_KEYS: tuple[str, ...] = ("domain", "policy", "user", "seed", "max_turns", "end_on_malformed",
                                  "require_outputs", "temperature", "top_p", "max_new_tokens")
RESULTS, REPORT, TRAJECTORIES, RUN_CONFIG = "results.json", "results.md", "trajectories.jsonl", "config.json"
#: the fault rates every results table shows beside pass^1 (metric key: column label)
FAULT_COLUMNS: dict[str, str] = {f"{side}_fault_rate": f"{side} fault rate" for side in SIDES}


# -- metrics -------------------------------------------------------------------------------------------------
def pass_hat_k(n: int, c: int, k: int) -> float | None:
    """tau-bench's pass^k for one task with ``n`` trials of which ``c`` succeeded.

    The probability that ``k`` trials drawn without replacement from the ``n`` all succeed:
    C(c, k) / C(n, k). It is 0 when c < k and undefined (None) when fewer than k trials exist.
    """
    if k < 1 or n < 0 or not 0 <= c <= n:
        raise ValueError(f"pass^k needs k >= 1 and 0 <= c <= n (got n={n}, c={c}, k={k})")
    if n < k:
        return None
    return math.comb(c, k) / math.comb(n, k)


def _counts(traj: Trajectory, sim_faults: SimFaults) -> bool:
    """Whether an episode is a trial that enters the denominators: always when it is the policy's to answer
    for (clean, or a policy fault), a user or tool fault only with ``sim_faults="fail"``."""
    return counts_against_policy(traj) or sim_faults == "fail"


def _reward(traj: Trajectory) -> float:
    """The trial's reward; a faulted episode that is counted is a failure whatever the final DB says (a
    policy that broke after its last write did not finish the conversation)."""
    if traj.fault_kind or traj.reward is None:
        return 0.0
    return traj.reward.reward


def _tcr(traj: Trajectory) -> float:
    if traj.fault_kind or traj.reward is None:
        return 0.0
    return traj.reward.tcr


def _violated(traj: Trajectory) -> bool:
    return traj.reward is not None and bool(traj.reward.violations)


def _compliant(traj: Trajectory) -> float:
    """1 for a success that broke none of the domain's rules: what an agent that authenticates, confirms and
    only then acts is for, where pass^1 also counts a right database reached by skipping a check."""
    return float(_reward(traj) >= 1.0 and not _violated(traj))


def _mean(values: Sequence[float]) -> float | None:
    return _round(sum(values) / len(values)) if values else None


def _round(x: float) -> float:
    return round(x, 6)


def task_row(task_id: str, family: str, trajs: Sequence[Trajectory], k: int,
             sim_faults: SimFaults = "exclude") -> dict[str, Any]:
    """One task's line of the per-task table (``trajs`` in trial order)."""
    trials = [t for t in trajs if _counts(t, sim_faults)]
    n = len(trials)
    c = sum(_reward(t) >= 1.0 for t in trials)
    row: dict[str, Any] = {"task_id": task_id, "family": family, "trials": n, "successes": c}
    for j in range(1, k + 1):
        v = pass_hat_k(n, c, j)
        row[f"pass^{j}"] = None if v is None else _round(v)
    violations = sum(_violated(t) for t in trials)
    row.update({
        "accuracy": _mean([_reward(t) for t in trials]),
        "tcr": _mean([_tcr(t) for t in trials]),
        "avg_turns": _mean([t.turns for t in trials]),
        "violations": violations,
        "violation_rate": _round(violations / n) if n else None,
        "compliant_success": _mean([_compliant(t) for t in trials]),
        "transfer_rate": _mean([float(t.stop_reason == "transfer") for t in trials]),
        "truncation_rate": _mean([float(t.truncated) for t in trials]),
        **slip_rates([t.metadata.get("user_slips") for t in trials]),
        "sim_faults": sum(t.sim_fault for t in trajs),
        "faults": sum(bool(t.fault_kind) for t in trajs),
        **fault_rates(trajs),
        "rewards": [_reward(t) if _counts(t, sim_faults) else None for t in trajs],
    })
    return row


def summarize(groups: Sequence[Sequence[Trajectory]], families: Mapping[str, str], k: int,
              sim_faults: SimFaults = "exclude") -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """(metrics, per-task rows, per-family metrics) of one evaluation; ``groups`` holds each task's trials.

    Episode-level means (accuracy, TCR, turns, rates, tool calls) are over trials, i.e. over every episode
    except, with ``sim_faults="exclude"``, user and tool faults (policy faults are failed trials);
    ``pass^j`` is the mean over the tasks that have at least j trials; ``stop_reasons``, the fault rates
    and counts and the tool-error counts cover every episode.
    """
    if sim_faults not in SIM_FAULT_MODES:
        raise ValueError(f"sim_faults must be one of {SIM_FAULT_MODES}, not {sim_faults!r}")
    everything = [t for g in groups for t in g]
    trials = [t for t in everything if _counts(t, sim_faults)]
    rows = [task_row(g[0].task_id, families.get(g[0].task_id, ""), g, k, sim_faults) for g in groups if g]
    metrics: dict[str, Any] = {}
    pass_tasks: dict[str, int] = {}
    for j in range(1, k + 1):
        values = [r[f"pass^{j}"] for r in rows if r[f"pass^{j}"] is not None]
        metrics[f"pass^{j}"] = _mean(values)
        pass_tasks[f"pass^{j}"] = len(values)
    n = len(trials)
    agent_calls: Counter[str] = Counter()
    user_calls: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for t in trials:
        for record in t.tool_log:
            (agent_calls if record.actor == "agent" else user_calls)[record.name] += 1
        if t.reward is not None:
            kinds.update(v.kind for v in t.reward.violations)
    metrics.update({
        "accuracy": _mean([_reward(t) for t in trials]),
        "tcr": _mean([_tcr(t) for t in trials]),
        "avg_turns": _mean([t.turns for t in trials]),
        "tool_calls": {name: _round(c / n) for name, c in sorted(agent_calls.items())} if n else {},
        "user_tool_calls": {name: _round(c / n) for name, c in sorted(user_calls.items())} if n else {},
        "transfer_rate": _mean([float(t.stop_reason == "transfer") for t in trials]),
        # cut off at a token, context or turn limit: what a success rate cannot show RL trading for
        "truncation_rate": _mean([float(t.truncated) for t in trials]),
        # what the simulated user got wrong (muarl.users.slips): episodes the agent is not to blame for
        **slip_rates([t.metadata.get("user_slips") for t in trials]),
        "violation_rate": _mean([float(_violated(t)) for t in trials]),
        # success with no rule broken: pass^1 counts a right database reached by skipping a check
        "compliant_success": _mean([_compliant(t) for t in trials]),
        "violations": dict(sorted(kinds.items())),
        "db_match_rate": _mean([float(not t.fault_kind and t.reward is not None and t.reward.db_match)
                                for t in trials]),
        "malformed_calls": _mean([t.malformed_calls for t in trials]),
        "sim_fault_rate": _mean([float(t.sim_fault) for t in everything]),
        "fault_rate": _mean([float(bool(t.fault_kind)) for t in everything]),
        **fault_rates(everything),
        "faults": fault_counts(everything),
        **_tool_errors(everything),
        "stop_reasons": dict(Counter(t.stop_reason for t in everything).most_common()),
        "episodes": len(everything),
        "trials": n,
        "tasks": len(rows),
        "pass_tasks": pass_tasks,
    })
    by_family: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_family.setdefault(row["family"], []).append(row)
    fams = {}
    for name, fam_rows in sorted(by_family.items()):
        entry: dict[str, Any] = {"tasks": len(fam_rows), "trials": sum(r["trials"] for r in fam_rows)}
        for j in range(1, k + 1):
            entry[f"pass^{j}"] = _mean([r[f"pass^{j}"] for r in fam_rows if r[f"pass^{j}"] is not None])
        entry["accuracy"] = _mean([x for r in fam_rows for x in r["rewards"] if x is not None])
        fams[name] = entry
    return metrics, rows, fams


def _tool_errors(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Failed tool calls (agent's and user's) over every episode: the rate per call and counts by error
    kind (unknown_tool, invalid_arguments, domain, internal, tool_fault), so a broken tool shows up."""
    records = [r for t in trajs for r in t.tool_log]
    errors = Counter(r.error or "error" for r in records if not r.ok)
    return {"tool_error_rate": _round(sum(errors.values()) / len(records)) if records else None,
            "tool_errors": dict(sorted(errors.items()))}


# -- results -------------------------------------------------------------------------------------------------
@dataclass
class EvalResult:
    """An evaluation: its configuration, the metrics, the per-task table and every trajectory."""

    config: dict[str, Any]
    metrics: dict[str, Any]
    tasks: list[dict[str, Any]]
    trajectories: list[list[Trajectory]] = field(default_factory=list)
    families: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    #: what produced it (:func:`muarl.provenance.record`); None for a run written before muarl kept one, or
    #: rebuilt from trajectories alone
    provenance: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """What ``results.json`` holds (trajectories live in ``trajectories.jsonl``)."""
        return {"config": self.config, "metrics": self.metrics, "families": self.families, "tasks": self.tasks,
                "timing": self.timing, "provenance": self.provenance}

    def write(self, out_dir: str | Path) -> None:
        """Write results.json and results.md (atomically), and trajectories.jsonl when it is not there yet."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.trajectories and not (out / TRAJECTORIES).exists():
            atomic_write(out / TRAJECTORIES, "".join(t.model_dump_json() + "\n"
                                                     for g in self.trajectories for t in g))
        atomic_write(out / RESULTS, json.dumps(self.to_json(), indent=1) + "\n")
        atomic_write(out / REPORT, self.markdown())

    @property
    def k(self) -> int:
        return int(self.config.get("k", 1))

    def markdown(self) -> str:
        """results.md: the headline metrics, stop reasons, tool-call mix, families and the per-task table."""
        c, m, k = self.config, self.metrics, self.k
        passes = [f"pass^{j}" for j in range(1, k + 1)]
        excluded = c.get("sim_faults", "exclude") == "exclude"
        rule = ("policy faults counted as failures, user and tool faults left out" if excluded
                else "every fault counted as a failure")
        heads = [*passes, *FAULT_COLUMNS.values(), "truncation rate", "accuracy", "TCR", "avg turns",
                 "violation rate", "success within the policy", "transfer rate", "tool error rate"]
        keys = [*passes, *FAULT_COLUMNS, "truncation_rate", "accuracy", "tcr", "avg_turns", "violation_rate",
                "compliant_success", "transfer_rate", "tool_error_rate"]
        lines = [f"# Evaluation: {c.get('domain')}/{c.get('split')}: {c.get('policy')} x {c.get('user')}, k={k}",
                 "", f"{m['tasks']} tasks, {m['episodes']} episodes ({m['trials']} trials; {rule}), seed "
                 f"{c.get('seed')}, max turns {c.get('max_turns')}.", "",
                 "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads),
                 "| " + " | ".join(_fmt(m.get(key)) for key in keys) + " |", ""]
        if m.get("faults"):
            counted = {kind: not excluded or side_of(kind) == "policy" for kind in m["faults"]}
            heading = ("counted as failures" if all(counted.values()) else "left out of the metrics"
                       if not any(counted.values()) else "policy faults counted as failures, the others left out")
            lines += [f"## Faults ({heading})", "", "| kind | episodes | in the metrics |", "|---|---|---|"]
            lines += [f"| {kind} | {n} | {'as failures' if counted[kind] else 'left out'} |"
                      for kind, n in m["faults"].items()] + [""]
        if m.get("tool_errors"):
            lines += ["## Tool errors (every episode)", "", "| error | calls |", "|---|---|"]
            lines += [f"| {kind} | {n} |" for kind, n in m["tool_errors"].items()] + [""]
        if m.get("user_slip_rate") is not None:
            lines += ["## The simulated user's slips (share of trials; muarl.users.slips)", "",
                      "| slip | trials | what it means |", "|---|---|---|",
                      f"| any | {_fmt(m['user_slip_rate'])} | the user's own, of the kinds the labels show precise |",
                      f"| any candidate | {_fmt(m.get('user_candidate_slip_rate'))} | a kind below 0.9 precision |",
                      f"| after the agent's error | {_fmt(m.get('agent_caused_slip_rate'))} | a flagged turn that answers "
                      "a repeated or garbled proposal, a failed call or a question already answered |"]
            lines += [f"| {kind} | {_fmt(m.get(f'user_{kind}_rate'))} | {what} |" for kind, what in SLIPS.items()]
            lines += [""]
        lines += ["## Stop reasons", "", "| stop reason | episodes |", "|---|---|"]
        lines += [f"| {r} | {n} |" for r, n in m["stop_reasons"].items()]
        lines += ["", "## Tool calls (mean per trial)", "", "| tool | agent calls |", "|---|---|"]
        lines += [f"| {name} | {_fmt(v)} |" for name, v in m["tool_calls"].items()]
        lines += [f"| {name} (user) | {_fmt(v)} |" for name, v in m.get("user_tool_calls", {}).items()]
        if m.get("violations"):
            lines += ["", "## Violations", "", "| kind | count |", "|---|---|"]
            lines += [f"| {kind} | {n} |" for kind, n in m["violations"].items()]
        lines += ["", "## Families", "", "| family | tasks | " + " | ".join([*passes, "accuracy"]) + " |",
                  "|---|---|" + "---|" * (k + 1)]
        for name, f in self.families.items():
            lines.append(f"| {name} | {f['tasks']} | " + " | ".join(_fmt(f[key]) for key in [*passes, "accuracy"])
                         + " |")
        lines += ["", "## Tasks", "", "| task | family | trials | successes | " + " | ".join(passes)
                  + " | TCR | avg turns | violations | faults |", "|---|---|---|---|" + "---|" * (k + 4)]
        for r in self.tasks:
            lines.append(f"| {r['task_id']} | {r['family']} | {r['trials']} | {r['successes']} | "
                         + " | ".join(_fmt(r[p]) for p in passes)
                         + f" | {_fmt(r['tcr'])} | {_fmt(r['avg_turns'])} | {r['violations']} | "
                         f"{r.get('faults', r['sim_faults'])} |")
        return "\n".join(lines) + "\n"

    @classmethod
    def load(cls, path: str | Path, trajectories: bool = False) -> EvalResult:
        """Read a run directory (or its results.json); with ``trajectories`` also its trajectories.jsonl."""
        path = Path(path)
        file = path / RESULTS if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"{file} not found (is {path} an evaluation run directory?)")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{file} is not valid JSON: {err}") from None
        missing = [key for key in ("config", "metrics", "tasks") if key not in data]
        if missing:
            raise ValueError(f"{file} is not a muarl eval results file (missing {', '.join(missing)})")
        groups: list[list[Trajectory]] = []
        if trajectories:
            found = load_trajectories(file.parent / TRAJECTORIES)
            k = int(data["config"].get("k", 1))
            groups = [[found[(r["task_id"], m)] for m in range(k) if (r["task_id"], m) in found]
                      for r in data["tasks"]]
        return cls(data["config"], data["metrics"], data["tasks"], groups, data.get("families", {}),
                   data.get("timing", {}), data.get("provenance"))


def result_from_trajectories(path: str | Path, sim_faults: SimFaults = "exclude",
                             domain: Domain | None = None) -> EvalResult:
    """Rebuild an evaluation from a trajectories.jsonl alone (say, a run killed before it wrote results).

    k is the largest trial count found; task families come from ``domain`` (or the domain named in the
    trajectories, when it is registered) and are empty otherwise.
    """
    found = load_trajectories(Path(path))
    if not found:
        raise ValueError(f"{path} holds no trajectories")
    order: dict[str, list[Trajectory]] = {}
    for (task_id, _member), traj in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        order.setdefault(task_id, []).append(traj)
    name = next(iter(found.values())).domain
    families: dict[str, str] = {}
    try:
        from muarl.domain import get_domain

        dom = domain or get_domain(name)
        families = {t.id: t.family for t in dom.tasks() if t.id in order}
    except (KeyError, ImportError, ValueError):
        pass
    k = max(len(g) for g in order.values())
    groups = list(order.values())
    metrics, rows, fams = summarize(groups, families, k, sim_faults)
    config = {"domain": name, "split": None, "k": k, "sim_faults": sim_faults, "source": str(path)}
    return EvalResult(config, metrics, rows, groups, fams)


# -- running -------------------------------------------------------------------------------------------------
def _split_of(tasks: Iterable[Task]) -> str:
    return "+".join(sorted({t.split for t in tasks}))


def _check_run_dir(out: Path, config: dict[str, Any], provenance: dict[str, Any] | None = None) -> None:
    """Refuse to resume into a directory whose trajectories were played with other settings; then record
    the settings (with ``provenance``, so that an interrupted run still says what produced it)."""
    saved = out / RUN_CONFIG
    if saved.exists():
        try:
            before = json.loads(saved.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{saved} is not valid JSON ({err}); remove it or use another output directory") \
                from None
        clash = [f"{key}: {before[key]!r} there, {config[key]!r} now" for key in IDENTITY_KEYS
                 if key in before and key in config and before[key] != config[key]]
        if clash:
            raise ValueError(f"{out} holds an evaluation with other settings ({'; '.join(clash)}); "
                             "use another output directory, or the same settings to resume it")
    elif (out / TRAJECTORIES).exists():
        raise ValueError(f"{out / TRAJECTORIES} exists but {out} has no {RUN_CONFIG} from an evaluation "
                         "(a `muarl rollout` directory?); use an empty output directory")
    atomic_write(saved, json.dumps({**config, "provenance": provenance}, indent=1) + "\n")


def kept_note(trajectories: Path) -> str:
    """What a run stopped by a full disk keeps and how to go on (for its one-line error): the finished
    episodes in ``trajectories`` (complete lines; a torn last one is dropped when the run resumes)."""
    try:
        with trajectories.open("rb") as f:
            done = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        done = 0
    return (f"the {done} finished episodes in {trajectories} are kept; free some space and rerun the same "
            "command to resume")


async def evaluate_async(
    domain: Domain,
    policy: Policy,
    user: UserSimulator,
    tasks: list[Task],
    *,
    k: int = 1,
    out_dir: str | Path | None = None,
    config: EpisodeConfig | None = None,
    seed: int = 0,
    concurrency: int = 64,
    progress: bool = True,
    sim_faults: SimFaults = "exclude",
    meta: Mapping[str, Any] | None = None,
) -> EvalResult:
    """:func:`evaluate` for callers already inside an event loop."""
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    if not tasks:
        raise ValueError("no tasks to evaluate")
    ids = [t.id for t in tasks]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"tasks listed twice: {', '.join(dup)}")
    if sim_faults not in SIM_FAULT_MODES:
        raise ValueError(f"sim_faults must be one of {SIM_FAULT_MODES}, not {sim_faults!r}")
    config = config or EpisodeConfig()
    run_config: dict[str, Any] = {
        "domain": domain.name, "split": _split_of(tasks), "policy": getattr(policy, "name", type(policy).__name__),
        "user": getattr(user, "name", type(user).__name__), "k": k, "seed": seed, "max_turns": config.max_turns,
        "end_on_malformed": config.end_on_malformed, "require_outputs": config.require_outputs,
        "sim_faults": sim_faults, "user_timeout": config.user_timeout, "agent_timeout": config.agent_timeout,
        "tool_timeout": config.tool_timeout, **dict(meta or {}),
    }
    specs = dict(meta or {})
    provenance = provenance_record([domain], policy, user, specs.get("policy"), specs.get("user"))
    out = Path(out_dir) if out_dir is not None else None
    resumed = 0
    # a full disk anywhere below (the settings, an episode's line, the results): one line, resumable
    with (reported(out, "writing the evaluation", lambda: kept_note(out / TRAJECTORIES))
          if out is not None else contextlib.nullcontext()):
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            _check_run_dir(out, run_config, provenance)
            present = load_trajectories(out / TRAJECTORIES)
            resumed = sum((t.id, m) in present for t in tasks for m in range(k))
        engine = RolloutEngine(domain, policy, user, config, group_size=k, concurrency=concurrency,
                               common_user_seed=False, seed=seed,
                               out=out / TRAJECTORIES if out is not None else None, progress=progress)
        start = time.perf_counter()
        groups = await engine.run(tasks)
        wall = time.perf_counter() - start
        metrics, rows, fams = summarize(groups, {t.id: t.family for t in tasks}, k, sim_faults)
        timing = {"wall_s": round(wall, 3), "episodes_run": len(tasks) * k - resumed, "episodes_resumed": resumed,
                  **time_split(t for g in groups for t in g)}  # where the episodes' time went (muarl.time_split)
        result = EvalResult(run_config, metrics, rows, groups, fams, timing, provenance)
        if out is not None:
            result.write(out)
    where = f"; the trajectories are in {out / TRAJECTORIES}" if out is not None else ""
    require_unfaulted((t for g in groups for t in g), f"evaluation of {domain.name}{where}")
    return result


def evaluate(
    domain: Domain,
    policy: Policy,
    user: UserSimulator,
    tasks: list[Task],
    *,
    k: int = 1,
    out_dir: str | Path | None = None,
    config: EpisodeConfig | None = None,
    seed: int = 0,
    concurrency: int = 64,
    progress: bool = True,
    sim_faults: SimFaults = "exclude",
    meta: Mapping[str, Any] | None = None,
) -> EvalResult:
    """Play ``k`` trials of every task and compute the metrics; with ``out_dir``, resumable and written.

    Each trial gets its own user seed (derived from ``seed``, the task id and the trial index, so a rerun
    meets the same users). ``meta`` adds entries to the recorded configuration (the CLI records the
    policy and user specs and the split). Synchronous; inside an event loop use :func:`evaluate_async`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # none running: the normal case. Run outside this handler, or every exception raised during
        # the evaluation (a tool's, logged with its traceback) would be chained to this "no running event loop"
    else:
        raise RuntimeError("evaluate() was called inside a running event loop; use `await evaluate_async(...)`")
    return asyncio.run(evaluate_async(domain, policy, user, tasks, k=k, out_dir=out_dir, config=config,
                                      seed=seed, concurrency=concurrency, progress=progress,
                                      sim_faults=sim_faults, meta=meta))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
