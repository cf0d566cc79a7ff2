"""``muarl ablate``: the same GRPO with and without the user in the loop (the method's interactive scripted user
vs the static user), or one model per training user evaluated with every evaluation user (:mod:`muarl.ablation`).
Its recipe and options are the demo's (:mod:`muarl.cli.demo`), less the GRPO user, which each arm sets."""

from __future__ import annotations

import argparse

NAME = "ablate"
HELP = "the same RL with and without the user in the loop (or any training users), evaluated with every user"
DESCRIPTION = ("From one cold start, one GRPO model per training user (same steps, seeds, tasks, user seeds), "
               "every model evaluated with every evaluation user on the same held-out tasks; a matrix with "
               "paired intervals clustered by task, report.html. The recipe is muarl demo's.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.cli.demo import add_recipe_options
    from muarl.experiments.recipe import GRPO_OPTIONS, PRESETS

    p.add_argument("--preset", default="default", choices=sorted(PRESETS),
                   help="default (the demo's recipe: two GRPO runs of about 20 minutes each on 2 cores), smoke "
                        "(every stage briefly, CI) or smoke-scratch (the from-random-weights cold start, briefly)")
    p.add_argument("--out", default="runs/ablate", help="run directory (rerun the same command to resume)")
    p.add_argument("--train-users", default="scripted,static", metavar="A,B",
                   help="one GRPO model per user (scripted, static, llm:URL#MODEL, module:attr); the first is the "
                        "method the others are compared with (default scripted,static)")
    p.add_argument("--eval-users", default="scripted,static", metavar="A,B,C",
                   help="every model (and the cold start) is evaluated with each (default scripted,static)")
    p.add_argument("--method-from", metavar="DEMO_RUN",
                   help="take the first training user's model from this finished `muarl demo` run (refused unless "
                        "its recorded recipe, seed and cold start are exactly this run's)")
    p.add_argument("--arm-recipe", action="append", metavar="USER:KEY=VALUE,...",
                   help="GRPO settings of one arm only (repeatable), e.g. static:lr=5e-5,kl_beta=0.04: a baseline "
                        "tuned on its own (research/user-in-the-loop-ablation.md); recorded, and shown beside "
                        "the arm's name")
    add_recipe_options(p, {k: v for k, v in GRPO_OPTIONS.items() if k != "user"})
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from muarl.ablation.run import run_ablate
    from muarl.cli.demo import demo_overrides

    run_ablate(args.out, args.preset, args.seed, progress=not args.quiet, train_users=args.train_users,
               eval_users=args.eval_users, method_from=args.method_from, arm_recipes=args.arm_recipe,
               **demo_overrides(args))
    return 0
