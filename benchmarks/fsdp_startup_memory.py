"""Peak memory of each process of a sharded GRPO run (``--fsdp``), 4 ranks against 1, from start-up to the end
of the first update: what a user runs out of first.

A random-weight model of Qwen3-0.6B's widths (``benchmarks/grpo_step.py``'s ``qwen3-0.6b`` shape; ``--layers``
fewer than its 28 if need be, at least 250M parameters) is saved as an ordinary checkpoint (with the shipped
base's tokenizer), then the same command runs in one process and under ``torchrun`` with 4 ranks (gloo, the
CPU): full fine-tuning GRPO with the KL reference on, muarl's default engine, one step of a few short
episodes of the demo domain (the model is random, so every agent turn runs to ``--max-new-tokens``). Each
run logs the peak resident memory of its processes at the end of its first update (``peak_rss_gb``: the
largest rank's ``ru_maxrss``, ``peak_rss_gb_mean``: the mean over ranks; :mod:`muarl.train.memory`), which
counts everything a process holds: start-up copies, the reference, the rollout copy, gradients, AdamW
state, activations and the runtime itself.

    python benchmarks/fsdp_startup_memory.py                   # 28 layers (596M parameters), about 15 GB at once
    python benchmarks/fsdp_startup_memory.py --layers 8        # 281M parameters, about 7 GB
    python benchmarks/fsdp_startup_memory.py --layers 8 --untied   # the head a matrix of its own (Qwen3-8B and up)

``--gradient-checkpointing`` runs both with activation checkpointing, as muarl turns it on on a GPU at these
sizes (off by default on the CPU).

Last line: ``peak memory per rank, 4 ranks vs 1: worst N.NNx, mean N.NNx`` (the bar: worst <= 0.55x, mean <=
0.40x). The runs go one after the other, so the 4 ranks never share the machine with the 1-process run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import SHAPES  # noqa: E402  (a sibling script, not a package)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def checkpoint(directory: Path, layers: int, untied: bool = False) -> int:
    """A random-weight Qwen3-0.6B-wide checkpoint with ``layers`` layers in ``directory`` (kept between runs);
    its parameter count. ``untied``: its output head a matrix of its own, as Qwen3-8B's and up are (the
    method's sizes), where Qwen3-0.6B ties it to the embeddings."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from muarl.models import base_path

    config = Qwen3Config(**{**SHAPES["qwen3-0.6b"], "num_hidden_layers": layers}, tie_word_embeddings=not untied,
                         max_position_embeddings=40960)
    marker = directory / "benchmark.json"
    shape = {"layers": layers, "untied": untied}
    if marker.is_file() and {k: json.loads(marker.read_text()).get(k, False) for k in shape} == shape:
        return json.loads(marker.read_text())["parameters"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    count = sum(p.numel() for p in model.parameters())
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:  # the shipped base's tokenizer: ids beyond its vocabulary are never sampled
        if (base_path() / name).is_file():
            shutil.copy(base_path() / name, directory / name)
    marker.write_text(json.dumps({**shape, "parameters": count}))
    return count


def run(ranks: int, model: Path, out: Path, args: argparse.Namespace) -> dict:
    """One GRPO step of ``model`` on ``ranks`` processes; its first step's metrics."""
    shutil.rmtree(out, ignore_errors=True)
    command = ["grpo", "--model", str(model), "--domain", "retail-lite", "--fsdp", "--steps", "1",
               "--tasks-per-step", str(args.tasks), "--group-size", str(args.group_size),
               "--max-new-tokens", str(args.max_new_tokens), "--max-turns", str(args.max_turns), "--kl-beta", "0.04",
               "--micro-batch-size", "1", "--save-every", "0", "--report-to", "none", "--no-progress",
               "--out", str(out)] + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])
    launcher = ([sys.executable, "-m", "muarl"] if ranks == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                 "-m", "muarl"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    done = subprocess.run(launcher + command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    print(f"{ranks} rank(s): peak rss largest {first['peak_rss_gb']:.2f} GiB, mean {first['peak_rss_gb_mean']:.2f} "
          f"GiB; {first['trained_sequences']} sequences trained; {time.perf_counter() - began:.0f} s", flush=True)
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-0.6B has 28)")
    parser.add_argument("--untied", action="store_true",
                        help="an output head of its own (Qwen3-8B and up), not tied to the embeddings as 0.6B's is")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="activation checkpointing in both runs, as muarl turns it on on a GPU at these sizes "
                             "(a micro-batch's activations above a quarter of free memory); off on the CPU by default")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=4, help="tasks in the step (each rank plays its share)")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "muarl-fsdp-startup"),
                        help="where the checkpoint and the runs go (the checkpoint is kept for the next run)")
    args = parser.parse_args()
    work = Path(args.dir)
    count = checkpoint(work / "checkpoint", args.layers, args.untied)
    print(f"model: Qwen3-0.6B widths, {args.layers} layers, {'untied' if args.untied else 'tied'} head, "
          f"{count / 1e6:.0f}M parameters "
          f"({count * 4 / 2**30:.2f} GiB in float32)", flush=True)
    one = run(1, work / "checkpoint", work / "one", args)
    many = run(args.ranks, work / "checkpoint", work / f"ranks{args.ranks}", args)
    print(f"peak memory per rank, {args.ranks} ranks vs 1: worst {many['peak_rss_gb'] / one['peak_rss_gb']:.2f}x, "
          f"mean {many['peak_rss_gb_mean'] / one['peak_rss_gb']:.2f}x")


if __name__ == "__main__":
    main()
