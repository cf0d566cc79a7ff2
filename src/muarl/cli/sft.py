"""``muarl sft``: supervised fine-tuning on a synthesized data set (the cold start before GRPO). Its
options are :class:`~muarl.train.sft.SFTConfig`'s fields."""

from __future__ import annotations

import argparse
from typing import Any

from muarl.cli import options
from muarl.cli.config_options import layers

NAME = "sft"
HELP = "supervised fine-tuning on a synthesized data set (loss on agent tokens only)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.train.sft import PRESETS, SFTConfig

    options.preset(p, PRESETS, "tiny", "paper (lr 5e-6 cosine, 2 epochs, batch 128) or tiny")
    options.training(p, SFTConfig, PRESETS, required=("data", "out"))


def sft_config(args: argparse.Namespace) -> Any:
    """The :class:`~muarl.train.sft.SFTConfig` a parsed ``muarl sft`` command line asks for: the preset, the
    config file and the flags (:func:`muarl.train.settings.resolve`; SFT derives no defaults)."""
    from muarl.train.settings import resolve
    from muarl.train.sft import PRESETS, SFTConfig

    file, flags = layers(args, SFTConfig)
    return resolve(PRESETS, args.preset, "SFT", file=file, flags=flags).config


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from muarl.train.sft import train_sft

    result = train_sft(sft_config(args), progress=not args.no_progress)
    Console(quiet=not options.main_process()).print(
        f"SFT: {result['steps']} steps, loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}; checkpoint "
        f"{result['checkpoint']} (use it as {'--user llm:' if result['side'] == 'user' else '--policy hf:'}"
        f"{result['checkpoint']})")
    return 0
