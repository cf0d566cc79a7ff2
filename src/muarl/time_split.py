"""Where an episode's time goes, and a batch's: the policy, the user, the tools, and waiting.

With the user in the loop a rollout has a second model in it, and a step's rollout time alone cannot say
whether the policy's decoding, the user's server, its queue or the tools took it. So every episode
records, on one clock, when it was in each party's hands (:class:`EpisodeClock`, filled by the episode
loop in :mod:`muarl.rollout`):

- **policy**: from the episode's request for an agent turn to the turn coming back: the engine's queue,
  its prefill and its decode (muarl's engine reports the three: ``policy_queue_s``, ``policy_prefill_s``,
  ``policy_decode_s``);
- **user**: a user turn, its device tools' calls taken out: the scripted user's compute, or an LLM user's
  requests with its server's queue and HTTP;
- **tools**: every tool call, the agent's and the user's (an MCP round trip included);
- **grading**: the reward (the gold replay, the state check of an MCP server);
- **waiting**: the rest of the episode's wall time (the event loop running other episodes).

Each episode's ``metadata["time"]`` holds its seconds per part and its spans (start, end) relative to its
own start. :func:`summarize` turns a batch's episodes into the step's (or evaluation's) split: the mean
seconds per episode in each part, each part's share of the episodes' time, and, since episodes run
concurrently, each part's *busy* share: the fraction of the batch's wall time in which at least one
episode was in it (the union of the spans). The policy's and the user's tokens per second are over their
busy time. Measuring is two clock reads and an append per call (``benchmarks/time_split.py``: its cost).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

#: the parties an episode's time is split between (the rest is waiting)
PARTS = ("policy", "user", "tools", "grading")
#: what muarl's engine reports of a policy turn, each a share of the policy's time
ENGINE_PARTS = ("queue", "prefill", "decode")


class EpisodeClock:
    """One episode's time per party: :meth:`enter` and :meth:`leave` bracket each call. A tool call made
    inside a user turn (a device tool) pauses the user's span and resumes it after, so no second counts
    twice."""

    def __init__(self) -> None:
        self.began_wall = time.time()  # epoch: episodes of several processes line up
        self.began = time.perf_counter()
        self.spans: dict[str, list[list[float]]] = {part: [] for part in PARTS}
        self._open: dict[str, float] = {}
        self._paused_user = False

    def enter(self, part: str) -> None:
        now = time.perf_counter()
        if part == "tools" and "user" in self._open:
            self._close("user", now)
            self._paused_user = True
        self._open[part] = now

    def leave(self, part: str) -> None:
        now = time.perf_counter()
        if part in self._open:
            self._close(part, now)
        if part == "tools" and self._paused_user:
            self._paused_user = False
            self._open["user"] = now
        elif part == "user":
            self._paused_user = False

    def _close(self, part: str, now: float) -> None:
        start = self._open.pop(part)
        self.spans[part].append([round(start - self.began, 6), round(now - self.began, 6)])

    def record(self, engine: dict[str, float] | None = None) -> dict[str, Any]:
        """What the trajectory keeps (``metadata["time"]``): seconds per part, waiting, the episode's wall
        time and start, the engine's own split of the policy's time when it gave one, and the spans."""
        now = time.perf_counter()
        for part in list(self._open):  # a fault left a call open: it ends with the episode
            self._close(part, now)
        episode = now - self.began
        seconds = {part: sum(end - start for start, end in spans) for part, spans in self.spans.items()}
        out: dict[str, Any] = {"start": round(self.began_wall, 6), "episode_s": round(episode, 6),
                               **{f"{part}_s": round(s, 6) for part, s in seconds.items()},
                               "waiting_s": round(max(0.0, episode - sum(seconds.values())), 6)}
        for part in ENGINE_PARTS:
            if engine and f"{part}_s" in engine:
                out[f"policy_{part}_s"] = round(float(engine[f"{part}_s"]), 6)
        out["spans"] = self.spans
        return out


def busy_seconds(spans: Iterable[Sequence[float]]) -> float:
    """The length of the union of ``spans`` ((start, end) on one clock)."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def summarize(trajectories: Iterable[Any]) -> dict[str, float]:
    """A batch's split (empty when no episode recorded one): ``split_wall_s``, and per part (waiting too)
    ``split_<part>_s`` (mean seconds per episode) and ``split_<part>_share`` (its share of the episodes'
    time); per party ``split_<part>_busy`` (share of the wall time with one episode or more in it); the
    engine's ``split_policy_<queue|prefill|decode>_s`` (means) where it reported them; and
    ``policy_tokens_per_s`` / ``user_tokens_per_s`` over their busy time (the user's: an LLM user's
    completion tokens)."""
    timed = [(t, t.metadata["time"]) for t in trajectories if isinstance(t.metadata.get("time"), dict)]
    if not timed:
        return {}
    n = len(timed)
    first = min(rec["start"] for _, rec in timed)
    wall = max(rec["start"] + rec["episode_s"] for _, rec in timed) - first
    total = sum(rec["episode_s"] for _, rec in timed) or 1e-12
    out: dict[str, float] = {"split_wall_s": round(wall, 4)}
    for part in (*PARTS, "waiting"):
        seconds = sum(rec.get(f"{part}_s", 0.0) for _, rec in timed)
        out[f"split_{part}_s"] = round(seconds / n, 4)
        out[f"split_{part}_share"] = round(seconds / total, 4)
    busy: dict[str, float] = {}
    for part in PARTS:
        spans = [(rec["start"] - first + a, rec["start"] - first + b) for _, rec in timed
                 for a, b in rec.get("spans", {}).get(part, [])]
        busy[part] = busy_seconds(spans)
        out[f"split_{part}_busy"] = round(busy[part] / wall, 4) if wall > 0 else 0.0
    for part in ENGINE_PARTS:
        values = [rec[f"policy_{part}_s"] for _, rec in timed if f"policy_{part}_s" in rec]
        if values:
            out[f"split_policy_{part}_s"] = round(sum(values) / len(values), 4)
    sampled = sum(sum(t.loss_mask) for t, _ in timed)
    if busy["policy"] > 0 and sampled:
        out["policy_tokens_per_s"] = round(sampled / busy["policy"], 2)
    spoken = sum(t.metadata.get("user_completion_tokens", 0) for t, _ in timed)
    if busy["user"] > 0 and spoken:
        out["user_tokens_per_s"] = round(spoken / busy["user"], 2)
    return out


#: the trainer's phases of a GRPO step, in the order a step runs them (``metrics.jsonl``)
TRAINER_PHASES = ("scoring_s", "reference_s", "backward_s", "optimizer_s", "sync_s")


def is_timing(key: str) -> bool:
    """Whether a step metric is a measurement of time or speed (never equal across runs of one command)."""
    return key.endswith("_s") or key.startswith("split_") or key.startswith("peak_")


def of_result(timing: dict[str, Any] | None) -> dict[str, float]:
    """The split inside an evaluation's ``timing`` (``results.json``); empty for a run that has none."""
    return {k: v for k, v in (timing or {}).items() if k.startswith("split_") or k.endswith("tokens_per_s")}


def describe(split: dict[str, float]) -> str:
    """One line: each part's share of the episodes' time (and of the wall time busy), and the speeds."""
    if not split:
        return ""
    parts = [f"{part} {split[f'split_{part}_share']:.0%}"
             + (f" (busy {split[f'split_{part}_busy']:.0%})" if f"split_{part}_busy" in split else "")
             for part in (*PARTS, "waiting") if f"split_{part}_share" in split]
    engine = [f"{part} {split[f'split_policy_{part}_s']:.2f} s" for part in ENGINE_PARTS
              if f"split_policy_{part}_s" in split]
    speeds = [f"{who} {split[f'{who}_tokens_per_s']:.0f} tokens/s" for who in ("policy", "user")
              if f"{who}_tokens_per_s" in split]
    line = "episode time: " + ", ".join(parts)
    if engine:
        line += "; the policy's per episode: " + ", ".join(engine)
    return line + ("; " + ", ".join(speeds) if speeds else "")


def compared(a: dict[str, float], b: dict[str, float]) -> list[tuple[str, float, float]]:
    """(row, A, B) for the seconds per episode in each part and the wall time, where both runs have them."""
    keys = ["split_wall_s", *(f"split_{part}_s" for part in (*PARTS, "waiting")),
            *(f"split_policy_{part}_s" for part in ENGINE_PARTS), "policy_tokens_per_s", "user_tokens_per_s"]
    return [(key, a[key], b[key]) for key in keys if key in a and key in b]


def step_seconds(record: dict[str, Any]) -> dict[str, float]:
    """A GRPO step's wall time by where it went (the run page's stacked bar): the rollouts' seconds
    (``rollout_s``) shared out by the episodes' split (policy, user, tools, grading, waiting), then the
    trainer's phases (:data:`TRAINER_PHASES`). Empty for a step logged without a split."""
    if "split_policy_share" not in record:
        return {}
    rollout = float(record.get("rollout_s") or 0.0)
    out = {part: rollout * float(record.get(f"split_{part}_share") or 0.0) for part in (*PARTS, "waiting")}
    for phase in TRAINER_PHASES:
        out[phase.removesuffix("_s")] = float(record.get(phase) or 0.0)
    return out


def without_time(dump: dict[str, Any]) -> dict[str, Any]:
    """A trajectory's ``model_dump()`` without its measured time (``metadata["time"]``): what two plays of
    one episode share when the play is the same, whatever the machine's speed."""
    return {**dump, "metadata": {k: v for k, v in dump.get("metadata", {}).items() if k != "time"}}
