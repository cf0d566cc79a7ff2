"""``muarl ablate``'s pipeline (:mod:`muarl.ablation`): the cold start, one GRPO run per training user, every
model evaluated with every evaluation user, then the results (:mod:`muarl.ablation.results`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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


def _typed(text: str) -> Any:
    """A command line's value as the number or truth value it spells (``1e-4``, ``15``, ``true``), else text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_arm_recipes(values: Sequence[str] | Mapping[str, Mapping[str, Any]] | None,
                      users: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--arm-recipe USER:KEY=VALUE,...`` (repeatable) as {user: {GRPO field: value}}, checked: USER is one
    of ``users`` (the training users), each key a GRPO option the recipe takes (not the user), each value
    of the option's type (``1e-4``, ``true``, ``15``). A mapping is taken as already parsed."""
    from muarl.experiments.recipe import GRPO_OPTIONS
    from muarl.train.grpo_config import GRPOConfig

    recipes: dict[str, dict[str, Any]] = {}
    if isinstance(values, Mapping):
        recipes = {user: dict(given) for user, given in values.items()}
    for value in () if isinstance(values, Mapping) else values or ():
        user = next((u for u in sorted(users, key=len, reverse=True) if value.startswith(f"{u}:")), None)
        if user is None:
            raise ValueError(f"--arm-recipe {value!r}: give TRAINING_USER:KEY=VALUE[,KEY=VALUE] for one of the "
                             f"training users ({', '.join(users)})")
        pairs = [p.strip() for p in value[len(user) + 1:].split(",") if p.strip()]
        if not pairs or any("=" not in p for p in pairs):
            raise ValueError(f"--arm-recipe {value!r}: give {user}:KEY=VALUE[,KEY=VALUE]")
        recipes.setdefault(user, {}).update({k.strip().replace("-", "_"): _typed(v.strip())
                                             for k, v in (p.split("=", 1) for p in pairs)})
    allowed, defaults = sorted({*GRPO_OPTIONS, "max_rollout_batches"} - {"user"}), GRPOConfig()
    for user, given in recipes.items():
        if user not in users:
            raise ValueError(f"--arm-recipe {user}: not a training user (--train-users {','.join(users)})")
        for key, value in given.items():
            if key not in allowed:
                raise ValueError(f"--arm-recipe {user}: {key!r} is not a GRPO option an arm may set; choose from "
                                 f"{', '.join(allowed)}")
            default = getattr(defaults, key)
            kind = float if default is None else type(default)  # tis_cap: None (the run picks) or a float
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float) if kind is float
                                                                           else kind):
                raise ValueError(f"--arm-recipe {user}: {key}={value!r} is not of type {kind.__name__}")
            if kind is float:
                given[key] = float(value)
    return recipes


def run_ablate(out: str | Path = "runs/ablate", preset: str = "default", seed: int = 0, progress: bool = True,
               train_users: str | Sequence[str] = USERS, eval_users: str | Sequence[str] = USERS,
               method_from: str | Path | None = None,
               arm_recipes: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
               **overrides: Any) -> dict[str, Any]:
    """Run (or resume) the ablation; returns the split's ``summary.json``. ``overrides`` change the preset's
    recipe as the demo's do (:meth:`muarl.experiments.recipe.DemoConfig.with_overrides`; the GRPO user is each arm's own).
    The first training user is the method every other arm is compared with; ``method_from`` a finished demo
    run whose GRPO model that arm reuses (checked, refused unless it is exactly what this run would train).
    ``arm_recipes`` (:func:`parse_arm_recipes`) change the GRPO recipe of one arm only: a baseline tuned on
    its own, with the same budget of trials as the method had. Its differences are recorded and shown.
    """
    from muarl.ablation.records import arm_differences, verify_method_from
    from muarl.ablation.results import write_results

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = PRESETS[preset].with_overrides(**overrides)
    check_base(config.base)
    trained, evaluated = parse_users(train_users, "--train-users"), parse_users(eval_users, "--eval-users")
    recipes = parse_arm_recipes(arm_recipes, trained)
    for user, recipe in recipes.items():  # an arm's recipe that cannot train: one line now, not after the others
        replace(config.grpo, user=user, **recipe)  # GRPOConfig checks its values when made
    held_out_tasks(config)  # too few tasks in the split: say so now, not after the training
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    where = split_dir(out, config.eval_split)
    where.mkdir(exist_ok=True)
    # the recipe (but the GRPO user, each arm's own) and where the method's model comes from; which users
    # train and evaluate may change between commands: each model and evaluation has a folder of its own
    settings = {"preset": preset, "seed": seed, "method_from": str(method_from) if method_from else None,
                **{k: v for k, v in config.settings().items() if k not in (*EVAL_ONLY, "grpo.user")},
                "arm_recipes": recipes}
    check_settings(out / "ablate.json", settings, {**DemoConfig().settings(), "method_from": None, "arm_recipes": {}},
                   "an ablation")
    arms = {arm(user): user for user in trained}
    stage = Stages(out, "" if where == out else f"{config.eval_split}/", SHARED_STAGES + tuple(arms))

    cold = cold_start(out, config, seed, progress, stage)
    models: dict[str, Path] = {COLD_START: cold}
    reused = None
    for n, (arm_id, user) in enumerate(arms.items()):
        arm_config = replace(config, grpo=replace(config.grpo, user=user, **recipes.get(user, {})))
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
                         seconds=stage.seconds(), arm_recipes=recipes)
