"""What the ablation's arms are made of, read back from their run records, so that "the same RL with and
without the user in the loop" is checked rather than assumed.

Two GRPO runs compared by ``muarl ablate`` must differ in the user they trained with and nothing else: the
same cold start (the digests of the checkpoint each started from, ``provenance.json``), the same settings
(``config.json``, but for the user and where it was written), and so the same tasks met with the same user
seeds at every step (``rollouts/step_N.jsonl``). :func:`arm_differences` reads that from two finished runs.

:func:`verify_method_from` lets the method's arm reuse the GRPO model of a finished ``muarl demo`` run
(three seeds of the demo's 45-step recipe are most of an afternoon on two cores): only when the demo's
recorded recipe (``demo.json``), its GRPO run's settings and seed, and its cold start's digests all match
what this ablation would train; anything else is refused, naming what differs. A demo made by another
muarl commit is accepted with a warning (its code is not recorded beyond the commit), which the
ablation's summary keeps.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from muarl.experiments.recipe import DemoConfig
from muarl.provenance import muarl_commit
from muarl.train.grpo_config import GRPOConfig
from muarl.train.settings import complete

#: DemoConfig settings that choose what is evaluated, not what is trained: a demo run reused for its trained
#: model may have evaluated otherwise
EVAL_KNOBS = ("eval_split", "eval_tasks", "eval_k", "greedy")
#: GRPO config fields that name places, not what a run does: the run directory and the starting checkpoint's
#: path (the checkpoint itself is compared by its digests)
PLACES = ("out", "model", "resume")
#: steps of a reused GRPO run trained again to check that this code reproduces it (the second step's episodes
#: come from the first step's update)
REPLAY_STEPS = 2


def grpo_config(run: Path) -> dict[str, Any]:
    """A GRPO run's settings as recorded, a field added since at its default (what it was then)."""
    return {**asdict(GRPOConfig()), **json.loads((run / "config.json").read_text())}


def cold_start_digests(run: Path) -> dict[str, str] | None:
    """The digests of the checkpoint a GRPO run started from (``provenance.json``), or None unrecorded."""
    path = run / "provenance.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("inputs", {}).get("model")


def episodes_by_step(run: Path) -> dict[int, list[tuple[str, int | None]]]:
    """Per step, the (task, user seed) of every episode the run played, in its order."""
    steps = {}
    for path in sorted((run / "rollouts").glob("step_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        steps[int(path.stem.split("_")[1])] = [(r["task_id"], r.get("user_seed")) for r in rows]
    return steps


def arm_differences(a: Path, b: Path) -> dict[str, Any]:
    """How two GRPO runs differ, from their records: ``settings`` (fields of ``config.json`` that differ,
    places left out), ``same_cold_start`` (equal digests of the starting checkpoint), ``steps`` (steps both
    recorded) and ``same_episodes`` (the same tasks with the same user seeds at each of them)."""
    ca, cb = grpo_config(a), grpo_config(b)
    differ = sorted(k for k in set(ca) | set(cb) if k not in PLACES and ca.get(k) != cb.get(k))
    da, db = cold_start_digests(a), cold_start_digests(b)
    ea, eb = episodes_by_step(a), episodes_by_step(b)
    common = sorted(set(ea) & set(eb))
    return {"settings": differ, "same_cold_start": da is not None and da == db, "steps": len(common),
            "same_episodes": bool(common) and all(ea[s] == eb[s] for s in common)}


def episode_tokens(run: Path, steps: int) -> list[list[tuple[str, int | None, list[int]]]]:
    """The first ``steps`` steps' episodes of a GRPO run, each as (task, user seed, token ids)."""
    out = []
    for step in range(1, steps + 1):
        path = run / "rollouts" / f"step_{step:06d}.jsonl"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] \
            if path.exists() else []
        out.append([(r["task_id"], r.get("user_seed"), r.get("token_ids") or []) for r in rows])
    return out


def replay(demo_grpo: Path, folder: Path, config: GRPOConfig, steps: int = REPLAY_STEPS) -> dict[str, Any]:
    """Train the first ``steps`` steps of the demo's GRPO run again here, with this muarl (``config``: the run's
    settings, the checkpoint it started from), and compare every episode token for token: the second step's
    episodes are sampled from the first step's update, so equal episodes mean this code samples, rewards and
    updates as the code that trained the demo did, on these machines' packages. GRPO's learning rate has no
    schedule, so the first steps of a short run are the long run's."""
    from muarl.train.grpo import train_grpo

    steps = min(steps, config.steps)
    if not (folder / "DONE").exists():
        train_grpo(replace(config, out=str(folder), steps=steps, save_every=steps, report_to="none"), progress=False)
        (folder / "DONE").write_text("{}\n")
    theirs, ours = episode_tokens(demo_grpo, steps), episode_tokens(folder, steps)
    differ = [n + 1 for n, (a, b) in enumerate(zip(theirs, ours, strict=True)) if not a or a != b]
    return {"steps": steps, "episodes": sum(map(len, ours)), "same": not differ, "differing_steps": differ}


def verify_method_from(demo_run: Path, config: DemoConfig, seed: int, cold_start: Path,
                       replay_in: Path | None = None) -> dict[str, Any]:
    """Check that the finished demo run ``demo_run`` trained exactly the model this ablation's method arm
    would (``config`` with its GRPO user, ``seed``, from ``cold_start``); return what was checked (written
    beside the ablation) or raise ValueError naming every difference. With ``replay_in`` (a folder), its first
    steps are trained again there and must come out token for token the same (:func:`replay`)."""
    from muarl.train.run import model_digests

    problems: list[str] = []
    recorded, grpo = demo_run / "demo.json", demo_run / "grpo"
    if not recorded.exists():
        raise ValueError(f"--method-from {demo_run}: no demo.json there (not a `muarl demo` run directory)")
    if not (grpo / "DONE").exists() or not (grpo / "model").exists():
        raise ValueError(f"--method-from {demo_run}: its GRPO stage has not finished (no grpo/DONE); finish the "
                         "demo first (rerun its command)")
    then = {**DemoConfig().settings(), **json.loads(recorded.read_text())}
    ours = {k: v for k, v in config.settings().items() if k not in EVAL_KNOBS}
    problems += [f"demo.json {k}: {then.get(k)!r} there, {v!r} here" for k, v in ours.items() if then.get(k) != v]
    would = asdict(complete(replace(config.grpo, domain=config.domain, seed=seed)).config)  # as a run records it
    there = grpo_config(grpo)
    problems += [f"grpo/config.json {k}: {there.get(k)!r} there, {would.get(k)!r} here"
                 for k in sorted(set(would) | set(there)) if k not in PLACES and there.get(k) != would.get(k)]
    digests, now = cold_start_digests(grpo), model_digests(str(cold_start))
    if digests is None:
        problems.append("grpo/provenance.json records no digests of its cold start: it cannot be checked")
    elif digests != now:
        changed = sorted(k for k in set(digests) | set(now) if digests.get(k) != now.get(k))
        problems.append(f"its cold start is another checkpoint (files differing: {', '.join(changed)})")
    if problems:
        raise ValueError(f"--method-from {demo_run} trained another model than this ablation's method arm would: "
                         + "; ".join(problems))
    replayed = None
    if replay_in is not None:
        replayed = replay(grpo, replay_in, replace(config.grpo, model=str(cold_start), domain=config.domain,
                                                   seed=seed))
        if not replayed["same"]:
            raise ValueError(f"--method-from {demo_run}: training its first {replayed['steps']} steps again with this "
                             f"muarl gives other episodes (steps {replayed['differing_steps']}; {replay_in}): the code "
                             "or packages that trained it differ from these; run without --method-from")
    commit = json.loads((grpo / "provenance.json").read_text()).get("muarl", {}).get("commit")
    return {"run": str(demo_run.resolve()), "model": str((grpo / "model").resolve()), "grpo": str(grpo.resolve()),
            "checked": ["demo.json (every training knob)", "grpo/config.json (every field but out, model: the seed too)",
                        "the cold start's digests"]
                       + ([f"its first {replayed['steps']} steps trained again here: the same episodes, token for "
                           "token"] if replayed else []),
            "replay": replayed, "muarl_commit": commit, "muarl_commit_now": muarl_commit(),
            "warning": None if commit == muarl_commit() or replayed else
            f"trained by muarl commit {commit}, this ablation runs {muarl_commit()}: code that changed between "
            "them is a difference between the arms that the records cannot rule out"}
