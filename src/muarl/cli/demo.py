"""``muarl demo``: MUA-RL on the CPU, from the shipped cold-start base to an agent RL made better
(:mod:`muarl.demo`). Its knobs are :class:`~muarl.experiments.recipe.DemoConfig`'s fields and the fields of the SFT and
GRPO configs it nests that the demo varies, each option generated from its field."""

from __future__ import annotations

import argparse
from typing import Any

from muarl.cli import options
from muarl.cli.config_options import add_config_options, given

NAME = "demo"
HELP = "the whole pipeline on the CPU: tiny model, synth, SFT, GRPO, held-out eval"
DESCRIPTION = "MUA-RL on a CPU, from the shipped cold-start base to an agent RL made better."
#: DemoConfig fields of the from-random-weights recipe (``--base scratch``), shown in a group of their own
RECIPE = ("hidden_size", "layers", "heads", "head_dim", "kv_heads", "prompt", "sft_conversations", "synth_families",
          "prefix_calls", "prefix_epochs", "prefix_batch")
SFT_OPTIONS = {"epochs": "--sft-epochs", "lr": "--sft-lr", "batch_size": "--sft-batch", "fresh_ids": None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.demo import STAGES
    from muarl.experiments.recipe import GRPO_OPTIONS, PRESETS

    p.add_argument("--preset", default="default", choices=sorted(PRESETS),
                   help="default (about 15 minutes on 2 cores), smoke (every stage in under 2 minutes) or "
                        "smoke-scratch (the from-random-weights stages, briefly)")
    p.add_argument("--out", default="runs/demo", help="run directory (rerun the same command to resume)")
    add_recipe_options(p, GRPO_OPTIONS)
    p.add_argument("--stop-after", choices=STAGES, help="end after this stage (rerun without it to go on)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_recipe_options(p: argparse.ArgumentParser, grpo_options: dict[str, str | None]) -> None:
    """``--seed`` and the demo's recipe (its own knobs, those of the GRPO stage in ``grpo_options`` and, in a
    group, the from-random-weights recipe's): the options of ``muarl demo`` and ``muarl ablate``, whose recipe
    is the demo's."""
    from muarl.experiments.recipe import PRESETS, DemoConfig
    from muarl.train.grpo import GRPOConfig
    from muarl.train.sft import SFTConfig

    options.seed(p, help="seeds the model init, data order, sampling and users")
    own = [f for f in DemoConfig.__dataclass_fields__ if f not in ("sft", "grpo")]
    add_config_options(p, DemoConfig, PRESETS, only=[f for f in own if f not in RECIPE])
    grpo = p.add_argument_group("the GRPO stage (muarl grpo's options; default: the preset's)")
    add_config_options(grpo, GRPOConfig, {name: c.grpo for name, c in PRESETS.items()}, only=grpo_options,
                       flags={k: v for k, v in grpo_options.items() if v}, dest_prefix="grpo.")
    recipe = p.add_argument_group("with --base scratch: the model and SFT recipe (research/; default: the "
                                  "preset's)")
    add_config_options(recipe, DemoConfig, PRESETS, only=RECIPE)
    add_config_options(recipe, SFTConfig, {name: c.sft for name, c in PRESETS.items()}, only=SFT_OPTIONS,
                       flags={k: v for k, v in SFT_OPTIONS.items() if v}, dest_prefix="sft.")


def demo_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs a parsed ``muarl demo`` command line changes, as :func:`muarl.demo.run_demo` takes them
    (nested configs' as dicts: ``grpo={"lr": ...}``)."""
    from muarl.experiments.recipe import DemoConfig
    from muarl.train.grpo import GRPOConfig
    from muarl.train.sft import SFTConfig

    return {**given(args, DemoConfig), "sft": given(args, SFTConfig, "sft."), "grpo": given(args, GRPOConfig, "grpo.")}


def run(args: argparse.Namespace) -> int:
    from muarl.demo import run_demo

    run_demo(args.out, args.preset, args.seed, progress=not args.quiet, stop_after=args.stop_after,
             **demo_overrides(args))
    return 0
