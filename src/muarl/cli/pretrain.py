"""``muarl pretrain``: the cold-start base, trained on an unlimited stream of expert conversations (fresh
databases and ids, so ids are copied, not recalled). Its options are
:class:`~muarl.train.pretrain.PretrainConfig`'s fields."""

from __future__ import annotations

import argparse
from typing import Any

from muarl.cli import options
from muarl.cli.config_options import given

NAME = "pretrain"
HELP = "train the cold-start base on an unlimited stream of expert conversations (fresh databases and ids; resumable)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.train.pretrain import PretrainConfig

    options.training(p, PretrainConfig, {"default": PretrainConfig()}, required=("out",))


def pretrain_config(args: argparse.Namespace) -> Any:
    """The :class:`~muarl.train.pretrain.PretrainConfig` a parsed ``muarl pretrain`` command line asks for."""
    from muarl.synth import BEHAVIOURS
    from muarl.train.pretrain import PretrainConfig

    unknown = sorted(set(args.exclude_behaviours or ()) - set(BEHAVIOURS))
    if unknown:
        raise ValueError(f"unknown user behaviour {', '.join(unknown)}; choose from {', '.join(BEHAVIOURS)}")
    return PretrainConfig(**given(args, PretrainConfig))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from muarl.train.pretrain import train_pretrain

    result = train_pretrain(pretrain_config(args), progress=not args.no_progress)
    accuracy = result["copy_accuracy"]
    Console().print(f"pretrain: {result['steps']} steps; held-out copy accuracy "
                    f"{'n/a' if accuracy is None else f'{accuracy:.3f}'}; checkpoint {result['checkpoint']}")
    return 0
