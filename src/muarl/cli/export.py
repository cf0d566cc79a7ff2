"""``muarl export CHECKPOINT --out DIR``: a checkpoint of any step, sharded by any number of ranks, as an
ordinary Hugging Face model (or adapter) that ``hf:`` and ``vllm:`` load (:mod:`muarl.train.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "export"
HELP = "write a run's checkpoint (any step, sharded or not) as an ordinary Hugging Face model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="RUN/checkpoints/step_N of an sft or grpo run, or RUN (its newest)")
    p.add_argument("--out", type=Path, required=True,
                   help="the directory to write, new or empty: a Hugging Face checkpoint at DIR itself (hf:DIR, "
                        "vllm serve DIR); a LoRA run's adapter in DIR/adapter, DIR the merged model unless the run "
                        "had --no-merge-lora")


def run(args: argparse.Namespace) -> int:
    from muarl.models import quiet_weight_bars
    from muarl.train.export import export

    quiet_weight_bars()
    written = export(args.checkpoint, args.out)
    print(f"exported {args.checkpoint} to {written} (load it as hf:{written})")
    return 0
