"""``muarl init-model``: the embedded tiny Qwen3 model from random weights, with its BPE tokenizer, as an
ordinary Hugging Face checkpoint."""

from __future__ import annotations

import argparse

from muarl.cli import options

NAME = "init-model"
HELP = "build the embedded tiny Qwen3 model and its BPE tokenizer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="checkpoint directory to create")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=0,
                   help="width of each attention head (default hidden size / heads); 64 learns to copy ids much sooner")
    p.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default heads / 2)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--prompt", choices=["full", "compact"], default="full",
                   help="system turn of the chat template: full (policy and tool schemas) or compact (tool names "
                        "only; half as many tokens, for a model trained on one domain from random weights)")
    options.seed(p, help="seeds the random weights")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from muarl.tiny_model import TinyConfig, build

    config = TinyConfig.shaped(args.hidden_size, args.layers, args.heads, args.head_dim, args.kv_heads, args.seed,
                               vocab_size=args.vocab_size)
    path = build(Path(args.out), config, prompt=args.prompt)
    print(f"built the embedded model at {path}")
    return 0
