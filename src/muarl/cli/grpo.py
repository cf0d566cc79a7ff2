"""``muarl grpo``: GRPO with the simulated user in every rollout. Its options are
:class:`~muarl.train.grpo_config.GRPOConfig`'s fields."""

from __future__ import annotations

import argparse
from typing import Any

from muarl.cli import options
from muarl.cli.config_options import layers

NAME = "grpo"
HELP = "GRPO with the simulated user in every rollout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.train.grpo_config import PRESETS, GRPOConfig

    options.preset(p, PRESETS, "tiny", "paper (group 8, 32 tasks/step, lr 1e-6 ...) or tiny")
    options.training(p, GRPOConfig, PRESETS, required=("out",))


def grpo_config(args: argparse.Namespace) -> Any:
    """The resolved settings (a :class:`~muarl.train.settings.Resolved` GRPOConfig) a parsed ``muarl grpo``
    command line asks for: the preset, the config file, the flags, the derived defaults
    (:func:`muarl.train.settings.resolve`); the run takes them as they are."""
    from muarl.train.grpo_config import PRESETS, GRPOConfig
    from muarl.train.settings import resolve

    file, flags = layers(args, GRPOConfig)
    return resolve(PRESETS, args.preset, "GRPO", file=file, flags=flags)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from muarl.train.grpo import train_grpo

    result = train_grpo(grpo_config(args), progress=not args.no_progress)
    last = result["metrics"][-1] if result["metrics"] else {}
    Console(quiet=not options.main_process()).print(
        f"GRPO: {result['steps']} steps, last reward {last.get('reward', 0):.3f}; checkpoint {result['checkpoint']}")
    return 0
