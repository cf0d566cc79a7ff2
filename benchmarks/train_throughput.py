"""Update-step throughput: packed rows against padded batches, measured in the same run.

One "update step" is what SFT does per optimizer step (and GRPO's update much the same): forward and
backward over a batch of conversations with loss on the agent's tokens, then one AdamW step. The same
conversations go through each strategy, interleaved repeat by repeat so machine noise hits all alike:

- ``padded``: micro-batches of ``--rows`` conversations in data order, right-padded to the longest of
  the micro-batch (no attention mask needed: causal attention never sees the padding after a token, so
  SDPA takes its fused kernel);
- ``padded-sorted``: the same after sorting the batch by length (what GRPO's micro-batching does);
- ``packed-dense``: first-fit-decreasing rows of at most ``--max-len`` tokens (default 8,192, at least the
  longest conversation), one row per pass, position ids restarting per conversation and a dense block-diagonal
  mask (SDPA's general kernel, quadratic in the row length);
- ``packed``: the same rows with muarl's segment attention (what SFT uses): one fused causal SDPA call
  per conversation, no mask built, cost the sum of squared conversation lengths.

Reported per strategy: real (non-padding) tokens per second, the padding share of computed positions,
and forward passes; the ratios are against ``padded`` in the same run.

Conversations are real: gold conversations of built-in domains tokenized exactly as SFT does. Those of
retail / airline / telecom are 4,000 to 5,600 tokens each (the system turn is about 3,400), so packing
them into rows no longer than the longest combines nothing; ``retail-lite`` (a one-paragraph policy, six
terse tools) gives about 1,650-token conversations. ``--lengths mixed`` (default) draws from both, which is
what a run over several domains sees.

    python benchmarks/train_throughput.py                          # CPU, embedded tiny model
    python benchmarks/train_throughput.py --device cuda --config qwen3-0.6b --conversations 64
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from muarl.chat import ChatFormat
from muarl.domain import get_domain
from muarl.gold import gold_trajectory
from muarl.train.data import Example, tokenize_conversation
from muarl.train.packing import Batch, collate, plan_rows, token_loss
from muarl.train.precision import autocast

LENGTHS = {"domains": ["retail", "airline", "telecom"], "lite": ["retail-lite"],
           "mixed": ["retail", "airline", "telecom", "retail-lite"]}


def conversations(tokenizer: Any, source: str, per_domain: int) -> list[Example]:
    """Gold conversations of the chosen domains' train tasks, tokenized as SFT tokenizes them."""
    out = []
    for name in LENGTHS[source]:
        domain = get_domain(name)
        chat = ChatFormat(tokenizer, [t.spec for t in domain.tools])
        tasks = [t for t in domain.tasks("train") if any(a.actor == "agent" for a in t.gold_actions)][:per_domain]
        out += [tokenize_conversation(chat, gold_trajectory(domain, task)[0].messages) for task in tasks]
    return out


def build_model(config: str, device: str, vocab: int) -> Any:
    """The embedded tiny model, or a randomly initialised model of a real size (nothing is downloaded)."""
    if config == "tiny":
        from muarl.models import load

        return load("tiny-random", device=device)[0]
    from transformers import AutoModelForCausalLM, Qwen3Config

    dims = {"qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128),
            "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128)}[config]
    cfg = Qwen3Config(vocab_size=max(vocab, 151936), max_position_embeddings=40960, tie_word_embeddings=True, **dims)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").to(device)


def plans(examples: list[Example], rows: int, max_len: int, pad: int) -> dict[str, list[Batch]]:
    """The micro-batches each strategy runs for one update over ``examples``."""
    order = list(range(len(examples)))
    by_length = sorted(order, key=lambda i: len(examples[i]))
    packed = plan_rows([len(e) for e in examples], max_len)
    out = {"padded": [collate(examples, [[i] for i in order[s:s + rows]], pad) for s in range(0, len(order), rows)],
           "padded-sorted": [collate(examples, [[i] for i in by_length[s:s + rows]], pad)
                             for s in range(0, len(order), rows)],
           "packed-dense": [collate(examples, [row], pad) for row in packed]}
    out["packed"] = out["packed-dense"]
    return out


def update(model: Any, optimizer: Any, batches: list[Batch], device: str, bf16: bool | None, varlen: bool) -> float:
    """One update step (forward + backward per micro-batch, one AdamW step); returns seconds."""
    targets = sum(int(b.loss_mask[:, 1:].sum()) for b in batches)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    began = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    for batch in batches:
        with autocast(bf16, device):
            total, _ = token_loss(model, batch.to(device), varlen=varlen)
        (total / targets).backward()
    optimizer.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny", choices=["tiny", "qwen3-0.6b", "qwen3-1.7b"],
                        help="tiny: the embedded model; qwen3-*: random weights of that size (no download)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", default="mixed", choices=sorted(LENGTHS), help="which domains' conversations")
    parser.add_argument("--conversations", type=int, default=16, help="conversations per update step")
    parser.add_argument("--rows", type=int, default=4, help="conversations per forward pass when padding")
    parser.add_argument("--max-len", type=int, default=8192,
                        help="tokens per packed row (default 8192, at least the longest conversation)")
    parser.add_argument("--repeats", type=int, default=3, help="timed update steps per strategy (after one warm-up)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bfloat16 autocast (default: on where CUDA supports it)")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="recompute activations in backward (default: on for the real-size configs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.repeats < 1 or args.conversations < 1 or args.rows < 1:
        parser.error("--repeats, --conversations and --rows must be at least 1")
    console = Console()

    from muarl.models import load

    tokenizer = load("tiny-random")[1]
    pool = conversations(tokenizer, args.lengths, per_domain=max(8, args.conversations))
    random.Random(args.seed).shuffle(pool)
    examples = pool[:args.conversations]
    lengths = [len(e) for e in examples]
    max_len = max(args.max_len, max(lengths))
    model = build_model(args.config, args.device, len(tokenizer))
    if args.gradient_checkpointing or (args.gradient_checkpointing is None and args.config != "tiny"):
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:  # transformers >= 5
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    pad = tokenizer.pad_token_id or 0
    strategies = plans(examples, args.rows, max_len, pad)
    console.print(f"{args.config} on {args.device}: {len(examples)} conversations of {min(lengths)} to {max(lengths)} "
                  f"tokens (mean {sum(lengths) / len(lengths):.0f}), {sum(lengths)} tokens per update; "
                  f"packed rows of at most {max_len}")
    times: dict[str, list[float]] = {name: [] for name in strategies}
    for repeat in range(args.repeats + 1):
        for name, batches in strategies.items():
            seconds = update(model, optimizer, batches, args.device, args.bf16, varlen=name != "packed-dense")
            if repeat:  # the first round warms up kernels and allocators
                times[name].append(seconds)
    real = sum(lengths)
    results = {}
    for name, batches in strategies.items():
        computed = sum(b.input_ids.numel() for b in batches)
        best = min(times[name])
        median = sorted(times[name])[len(times[name]) // 2]
        results[name] = {"tokens_per_s": real / best, "tokens_per_s_median": real / median, "median_s": median,
                         "best_s": best, "all_s": times[name], "padding": 1 - real / computed,
                         "passes": len(batches), "computed_tokens": computed}
    base = results["padded"]
    table = Table(title=f"update-step throughput ({args.config}, {args.device}, lengths {args.lengths})")
    for col in ("strategy", "tokens/s (best)", "vs padded", "tokens/s (median)", "vs padded", "padding", "passes"):
        table.add_column(col, no_wrap=True)
    for name, r in results.items():
        table.add_row(name, f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x",
                      f"{r['tokens_per_s_median']:,.0f}",
                      f"{r['tokens_per_s_median'] / base['tokens_per_s_median']:.2f}x", f"{r['padding']:.1%}",
                      str(r["passes"]))
    console = Console(width=max(console.width, 110))
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "lengths": lengths, "results": results}, indent=1))


if __name__ == "__main__":
    main()
