"""``muarl init-model``: the embedded tiny Qwen3 model from random weights, with its BPE tokenizer, as an
ordinary Hugging Face checkpoint; or, with ``--shape qwen3-0.6b`` (1.7b, 8b), a random Qwen3 of that published
shape with Qwen3's own tokenizer and chat template (:mod:`muarl.qwen3`), for runs on the paper's vocabulary."""

from __future__ import annotations

import argparse

from muarl.cli import options

NAME = "init-model"
HELP = "build the embedded tiny Qwen3 model and its BPE tokenizer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muarl.qwen3 import SHAPES, TEMPLATES

    p.add_argument("--out", required=True, help="checkpoint directory to create")
    p.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny",
                   help="tiny: the embedded model (the options below shape it); a Qwen3 shape: that model's published "
                        "config with Qwen3's tokenizer and template (needs the qwen3 extra), --layers cutting its depth")
    p.add_argument("--template", choices=TEMPLATES, default="qwen3",
                   help="the chat template of a Qwen3 shape, as published (read from trl's package data)")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=0, help="decoder layers (default 2 for tiny, the shape's own for Qwen3)")
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

    if args.layers < 0:
        raise ValueError(f"--layers {args.layers}: expected a positive number")
    if args.shape != "tiny":
        from muarl.qwen3 import build_random

        path = build_random(Path(args.out), args.shape, layers=args.layers, seed=args.seed, template=args.template)
        print(f"built a random {args.shape} ({args.layers or 'all'} layers) with Qwen3's tokenizer at {path}")
        return 0
    config = TinyConfig.shaped(args.hidden_size, args.layers or 2, args.heads, args.head_dim, args.kv_heads, args.seed,
                               vocab_size=args.vocab_size)
    tokenizer = None  # the shipped one, unless another vocabulary size is asked for
    if args.vocab_size != TinyConfig().vocab_size:
        from muarl.tokenizer_training import train_tokenizer

        tokenizer = train_tokenizer(args.vocab_size)
    path = build(Path(args.out), config, tokenizer=tokenizer, prompt=args.prompt)
    print(f"built the embedded model at {path}")
    return 0
