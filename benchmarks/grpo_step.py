"""GRPO step cost: the reference pass and the update, today's way against the old way, on the same rollouts.

The old way is what the trainer did before the shared-prefix change (and what its options still select):
every sequence run whole, forward and backward, with activation checkpointing on, the reference scored
even with the KL term off, and zero-advantage sequences updated like the others. The new way (the
defaults): the batch's shared opening (the system turn) computed once per pass, its gradient gathered
from every sequence (:mod:`muarl.train.shared_prefix`), checkpointing by need (off on the CPU), no
reference pass without a KL term, and no forward or backward for sequences with advantage 0 when their
KL term is 0 (:func:`muarl.train.grpo_update.skipped_sequences`).

A third way is the baseline a careful user would write (TRL's GRPO defaults): every sequence run whole,
no activation checkpointing where memory allows (never on the CPU), no reference pass without a KL term,
every sequence updated; its ratio is reported first.

Two settings, each with its own rollouts, the three ways interleaved repeat by repeat so noise hits all
alike:

- ``demo``: the CPU demo's model and prompt, on real conversations (the expert with the scripted user on
  retail-lite train tasks, rendered with the demo model's chat template);
- ``tau2``: a tau2-bench-sized system turn (``--system-tokens``, default 3,000) before conversations of
  ``--conversation-tokens`` (default 1,500; a quarter of them agent tokens, in turns), random tokens.

Groups of ``--group-size`` members share their first user message; half the groups have mixed rewards
(advantages +-1), half scored alike (advantage 0), as in a step of the demo. Each setting is measured
with the KL term at the paper's 0.001 (the reference pass runs, no sequence is skipped: only the shared
prefix and checkpointing differ) and with it off (KL 0: DAPO's and Dr.GRPO's choice). Reported: seconds
of reference and update, positions computed per position outside the shared opening (1.00 would compute
only the tokens that differ), and the ratio. The last line is the tau2-sized speed-up with KL off.

    python benchmarks/grpo_step.py                         # CPU: the demo model and the tiny size
    python benchmarks/grpo_step.py --config smollm2-size   # a random model of SmolLM2-135M's shape
    python benchmarks/grpo_step.py --device cuda --config qwen3-0.6b --groups 16
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from muarl.algorithms import get_algorithm
from muarl.train.grpo_config import GRPOConfig
from muarl.train.grpo_update import skipped_sequences, update_on_rollouts
from muarl.train.scoring import reference_logprobs, shared_opening

SHAPES = {
    "smollm2-size": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
}


@dataclass
class Rollout:
    """What the update reads of a trajectory."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


def demo_model(device: str) -> tuple[Any, Any]:
    """The demo's starting model: the shipped base."""
    from muarl.models import load

    return load("tiny", device=device)


def sized_model(config: str, device: str) -> Any:
    """A random-weight model: the embedded tiny shape, or a real size (nothing is downloaded)."""
    if config == "tiny":
        from muarl.models import load

        return load("tiny-random", device=device)[0]
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(max_position_embeddings=40960, tie_word_embeddings=True, **SHAPES[config])
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").to(device)


def demo_rollouts(tokenizer: Any, groups: int, size: int) -> list[list[list[int]]]:
    """(tokens, mask) of real retail-lite conversations rendered with the base's (compact) template,
    ``size`` members per group sharing the task's opening (members differ after the first agent turn:
    each is another task's continuation)."""
    from muarl.domain import get_domain
    from muarl.factory import make_policy, make_user
    from muarl.synth import synthesize
    from muarl.train.sft import load_examples

    with tempfile.TemporaryDirectory() as tmp:
        synthesize([get_domain("retail-lite")], make_policy("expert"), make_user("scripted"), Path(tmp),
                   families=None, progress=False)
        examples = load_examples([str(Path(tmp) / "sft.jsonl")], tokenizer)
    rng = random.Random(0)
    out = []
    for _ in range(groups):
        head = rng.choice(examples)
        first = head.mask.index(1)
        members = []
        for _ in range(size):
            tail = rng.choice(examples)
            start = tail.mask.index(1)
            members.append([head.ids[:first] + tail.ids[start:], head.mask[:first] + tail.mask[start:]])
        out.append(members)
    return out


def tau2_rollouts(vocab: int, groups: int, size: int, system: int, length: int) -> list[list[list[int]]]:
    """Random tokens shaped like tau2-bench episodes: one system turn for all, a first user message per
    group, then user/tool turns (no loss) and agent turns (loss), a quarter of the conversation."""
    rng = random.Random(1)
    opening = [rng.randrange(vocab) for _ in range(system)]
    out = []
    for _ in range(groups):
        first = [rng.randrange(vocab) for _ in range(60)]
        members = []
        for _ in range(size):
            ids, mask = opening + first, [0] * (system + 60)
            while len(ids) < system + length:
                agent = rng.randint(20, 80)
                other = 3 * agent
                ids += [rng.randrange(vocab) for _ in range(agent + other)]
                mask += [1] * agent + [0] * other
            members.append([ids[:system + length], mask[:system + length]])
        out.append(members)
    return out


def with_advantages(model: Any, groups: list[list[list[int]]], device: str) -> list[tuple[Rollout, float]]:
    """Sampling log-probs from ``model`` itself, and advantages: mixed groups +-1, the other half 0."""
    from muarl.train.scoring import batch_logprobs

    batch = []
    for g, members in enumerate(groups):
        for m, (ids, mask) in enumerate(members):
            with torch.no_grad():
                lp, _ = batch_logprobs(model, [ids], 1.0, [mask])
            advantage = (1.0 if m % 2 == 0 else -1.0) if g % 2 == 0 else 0.0
            batch.append((Rollout(ids, mask, lp[0].tolist()), advantage))
    return batch


def computed_positions(batch: list[tuple[Rollout, float]], config: GRPOConfig, old: bool) -> float:
    """Positions the reference pass and the update run through the model, per position an ideal step
    computes (each sequence's tokens outside the batch's shared opening, once per pass that is needed)."""
    trajs = [t for t, _ in batch]
    lengths = [len(t.token_ids) for t in trajs]
    outside = sum(lengths) - len(trajs) * len(shared_opening(trajs, replace(config, shared_prefix=True)))
    ideal = outside * (2 if config.kl_beta else 1)
    if old:  # the reference always, every sequence whole; checkpointing runs the update's forward twice
        return (sum(lengths) + 2 * sum(lengths)) / ideal
    computed = 0.0
    if config.kl_beta:  # the reference pass; the policy has left its reference: only a threshold skips
        opening = len(shared_opening(trajs, config))
        computed += sum(lengths) - len(trajs) * opening + opening
        run = [t for t, a in batch if a != 0.0 or not config.zero_advantage_kl or not config.skip_zero_advantage]
    else:
        run = [t for i, (t, _) in enumerate(batch) if i not in skipped_sequences(batch, None, config)]
    opening = len(shared_opening(run, config))
    computed += sum(len(t.token_ids) for t in run) - len(run) * opening + (opening if run else 0)
    return computed / ideal


def one_step(model: Any, reference: Any, batch: list[tuple[Rollout, float]], config: GRPOConfig) -> float:
    """Seconds for the reference pass and one update (weights restored after, so every repeat is alike)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    began = time.perf_counter()
    update_on_rollouts(model, reference, optimizer, get_algorithm("grpo", kl_beta=config.kl_beta), batch, config)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    model.load_state_dict(state)
    return seconds


def measure(name: str, model: Any, batch: list[tuple[Rollout, float]], kl: float, repeats: int,
            micro: int, zero_advantage_kl: float = 0.0) -> dict[str, Any]:
    reference = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():  # the policy has moved from its reference, as after the first step: the KL is not 0
        for p in reference.parameters():
            p.mul_(1 + 0.01 * torch.randn_like(p))
    old = GRPOConfig(kl_beta=kl, micro_batch_size=micro, gradient_checkpointing=True, shared_prefix=False,
                     skip_zero_advantage=False)
    # the plain baseline: every sequence whole and updated, no checkpointing, the reference only for a KL term
    plain = GRPOConfig(kl_beta=kl, micro_batch_size=micro, gradient_checkpointing=False, shared_prefix=False,
                       skip_zero_advantage=False)
    new = GRPOConfig(kl_beta=kl, micro_batch_size=micro, zero_advantage_kl=zero_advantage_kl)
    times: dict[str, list[float]] = {"old": [], "plain": [], "new": []}
    for _ in range(repeats):
        for label, config in (("old", old), ("plain", plain), ("new", new)):
            times[label].append(one_step(model, reference, batch, config))
    if kl == 0:  # the old code scored the reference even without a KL term
        for _ in range(repeats):
            began = time.perf_counter()
            reference_logprobs(model, reference, batch, old)
            times["old"][_] += time.perf_counter() - began
    row = {"setting": name + (f", skip KL <= {zero_advantage_kl:g}" if zero_advantage_kl else ""), "kl": kl,
           "sequences": len(batch),
           "tokens": sum(len(t.token_ids) for t, _ in batch) / len(batch)}
    for label, config in (("old", old), ("new", new)):
        row[f"{label}_s"] = statistics.median(times[label])
        row[f"{label}_per_outside"] = computed_positions(batch, config, label == "old")
    row["plain_s"] = statistics.median(times["plain"])
    row["speedup"] = row["old_s"] / row["new_s"]
    row["vs_plain"] = row["plain_s"] / row["new_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny", choices=["tiny", *SHAPES],
                        help="model size of the tau2-sized setting (default tiny)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--conversation-tokens", type=int, default=1500)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-demo", action="store_true", help="only the tau2-sized setting")
    parser.add_argument("--zero-advantage-kl", type=float, default=0.0,
                        help="also measure the KL-on setting with this skip threshold (GRPOConfig.zero_advantage_kl)")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    if not args.skip_demo:
        model, tokenizer = demo_model(args.device)
        batch = with_advantages(model, demo_rollouts(tokenizer, args.groups, args.group_size), args.device)
        for kl in (0.001, 0.0):
            rows.append(measure("demo", model, batch, kl, args.repeats, args.micro_batch_size))
    model = sized_model(args.config, args.device)
    vocab = model.config.vocab_size
    rollouts = tau2_rollouts(vocab, args.groups, args.group_size, args.system_tokens, args.conversation_tokens)
    batch = with_advantages(model, rollouts, args.device)
    if args.zero_advantage_kl:
        rows.append(measure(f"tau2 {args.config}", model, batch, 0.001, args.repeats, args.micro_batch_size,
                            args.zero_advantage_kl))
    for kl in (0.001, 0.0):
        rows.append(measure(f"tau2 {args.config}", model, batch, kl, args.repeats, args.micro_batch_size))
    table = Table(title=f"GRPO reference + update on {args.device}: a plain baseline, muarl's old way and its "
                        "new way, same rollouts")
    for column in ("setting", "KL", "seqs", "tokens/seq", "plain s", "old s", "new s", "old pos/outside",
                   "new pos/outside", "vs plain", "vs old"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["setting"], f"{r['kl']:g}", str(r["sequences"]), f"{r['tokens']:.0f}", f"{r['plain_s']:.2f}",
                      f"{r['old_s']:.2f}", f"{r['new_s']:.2f}", f"{r['old_per_outside']:.2f}",
                      f"{r['new_per_outside']:.2f}", f"{r['vs_plain']:.2f}x", f"{r['speedup']:.2f}x")
    Console(width=170).print(table)
    print(f"reference+update speed-up vs plain {rows[-1]['vs_plain']:.2f}x (vs muarl's old way {rows[-1]['speedup']:.2f}x)")


if __name__ == "__main__":
    main()
