"""``muarl ablate``'s pipeline (:mod:`muarl.ablation`): the cold start, one GRPO run per training user, every
model evaluated with every evaluation user, then the results (:mod:`muarl.ablation.results`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from muarl.ablation.layout import COLD_START, USERS, arm, eval_name, slug
from muarl.experiments.recipe import EVAL_ONLY, PRESETS, SHARED_STAGES, DemoConfig, check_base
from muarl.experiments.stages import (
    Stages,
    check_settings,
    cold_start,
    evaluate_model,
    held_out_tasks,
    reinforce,
    split_dir,
)


def parse_users(value: str | Sequence[str], option: str) -> tuple[str, ...]:
    """``A,B`` (or a list) as user specs, checked: none empty or repeated, each one ``--user`` accepts."""
    from muarl.factory import make_user

    users = tuple(u.strip() for u in (value.split(",") if isinstance(value, str) else value))
    if not users or any(not u for u in users):
        raise ValueError(f"{option}: give users as A,B (got {value!r})")
    if len(set(map(slug, users))) != len(users):
        raise ValueError(f"{option}: a user is listed twice ({', '.join(users)})")
    for user in users:
        make_user(user)  # a malformed spec: one line now, not after the training
    return users


def run_ablate(out: str | Path = "runs/ablate", preset: str = "default", seed: int = 0, progress: bool = True,
               train_users: str | Sequence[str] = USERS, eval_users: str | Sequence[str] = USERS,
               method_from: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Run (or resume) the ablation; returns the split's ``summary.json``. ``overrides`` change the preset's
    recipe as the demo's do (:meth:`muarl.experiments.recipe.DemoConfig.with_overrides`; the GRPO user is each arm's own).
    The first training user is the method every other arm is compared with; ``method_from`` a finished demo
    run whose GRPO model that arm reuses (checked, refused unless it is exactly what this run would train).
    """
    from muarl.ablation.records import arm_differences, verify_method_from
    from muarl.ablation.results import write_results

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = PRESETS[preset].with_overrides(**overrides)
    check_base(config.base)
    trained, evaluated = parse_users(train_users, "--train-users"), parse_users(eval_users, "--eval-users")
    held_out_tasks(config)  # too few tasks in the split: say so now, not after the training
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    where = split_dir(out, config.eval_split)
    where.mkdir(exist_ok=True)
    # the recipe (but the GRPO user, each arm's own) and where the method's model comes from; which users
    # train and evaluate may change between commands: each model and evaluation has a folder of its own
    settings = {"preset": preset, "seed": seed, "method_from": str(method_from) if method_from else None,
                **{k: v for k, v in config.settings().items() if k not in (*EVAL_ONLY, "grpo.user")}}
    check_settings(out / "ablate.json", settings, {**DemoConfig().settings(), "method_from": None}, "an ablation")
    arms = {arm(user): user for user in trained}
    stage = Stages(out, "" if where == out else f"{config.eval_split}/", SHARED_STAGES + tuple(arms))

    cold = cold_start(out, config, seed, progress, stage)
    models: dict[str, Path] = {COLD_START: cold}
    reused = None
    for n, (arm_id, user) in enumerate(arms.items()):
        arm_config = replace(config, grpo=replace(config.grpo, user=user))
        if n == 0 and method_from is not None:
            reused = stage(f"{arm_id}/replay", verify_method_from, Path(method_from), arm_config, seed, cold,
                           out / arm_id / "replay")
            (out / "method-from.json").write_text(json.dumps(reused, indent=1) + "\n")
            if reused["warning"]:
                Console().print(f"[yellow]--method-from: {reused['warning']}")
            models[arm_id] = Path(reused["model"])
            continue
        models[arm_id] = stage(f"{arm_id}/grpo", reinforce, out / arm_id, arm_config, cold, seed, progress)
    greedy = (False, True) if config.greedy else (False,)
    for user in evaluated:  # the first evaluation user's whole row first: the headline comes soonest
        for is_greedy in greedy:
            for model_id, model in models.items():
                name = eval_name(model_id, user, is_greedy)
                stage(name, evaluate_model, where, name, config, model, seed, progress, 0.0 if is_greedy else None,
                      user)
    grpo_runs = {a: Path(reused["grpo"]) if reused and a == next(iter(arms)) else out / a / "grpo" for a in arms}
    first = next(iter(grpo_runs.values()))
    shared = {a: arm_differences(first, run) for a, run in list(grpo_runs.items())[1:]}
    return write_results(out, where, config, preset=preset, seed=seed, arms=arms, evaluated=evaluated,
                         models=models, grpo_runs=grpo_runs, shared=shared, method_from=reused,
                         seconds=stage.seconds())
