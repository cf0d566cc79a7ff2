"""Rollout throughput of muarl's transformers engine against vLLM, on the same tasks, in one run (issue 18).

    # in the vLLM virtualenv (scripts/install_vllm.sh); the CPU build here:
    VLLM_CPU_KVCACHE_SPACE=2 "$(bash scripts/install_vllm.sh --where)/bin/python" benchmarks/rollout_engines.py
    # on a GPU (random weights of a real size: nothing is downloaded):
    python benchmarks/rollout_engines.py --device cuda --config qwen3-0.6b --tasks 32 --group-size 8

Both engines play the same episodes: the domain's first ``--tasks`` test tasks, ``--group-size`` episodes
each, against the scripted user, at temperature 1 with the same turn and token limits. ``--config tiny``
(the default) is the shipped base, whose turns end by themselves; a sized ``--config`` is a random-weight
Qwen3 of that shape on the embedded tokenizer's vocabulary, saved to a temporary directory for vLLM to
load, whose turns mostly run to ``--max-new-tokens`` (the same work in both engines). Each engine first
plays one warm-up group, then the measured episodes; the script reports episodes/s, agent tokens/s (the
tokens the episodes' loss masks cover) and prompt tokens served by vLLM's prefix cache. Its last line is
``vllm / hf episodes/s N.NNx``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from muarl.domain import get_domain  # noqa: E402
from muarl.rollout import EpisodeConfig, RolloutEngine  # noqa: E402
from muarl.users.scripted import ScriptedUser  # noqa: E402

SHAPES = {
    "smollm2-size": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
}


def checkpoint(config: str, folder: Path) -> Path:
    """The directory both engines load: the shipped base, or a random model of a real shape saved here."""
    from muarl.models import resolve

    if config == "tiny":
        return Path(resolve("tiny"))
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny"))
    shape = Qwen3Config(vocab_size=len(tokenizer), max_position_embeddings=8192, tie_word_embeddings=True,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, **SHAPES[config])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(shape, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def play(policy: Any, tasks: list, args: argparse.Namespace) -> tuple[float, list]:
    domain = get_domain(args.domain)
    engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=args.max_turns),
                           group_size=args.group_size, common_user_seed=True, seed=0, progress=False)
    began = time.perf_counter()
    groups = asyncio.run(engine.run(tasks))
    return time.perf_counter() - began, [t for g in groups for t in g]


def measure(name: str, policy: Any, args: argparse.Namespace) -> dict[str, float]:
    tasks = get_domain(args.domain).tasks("test")
    play(policy, tasks[:1], args)  # warm-up: kernels, caches, the shared system turn
    seconds, episodes = play(policy, tasks[:args.tasks], args)
    agent = sum(sum(t.loss_mask) for t in episodes)
    cached = sum(int(t.metadata.get("cached_tokens", 0)) for t in episodes)
    row = {"episodes": len(episodes), "seconds": seconds, "episodes_per_s": len(episodes) / seconds,
           "agent_tokens_per_s": agent / seconds, "agent_tokens": agent, "cached_tokens": cached}
    print(f"{name:>5}: {len(episodes)} episodes in {seconds:.1f} s: {row['episodes_per_s']:.2f} episodes/s, "
          f"{row['agent_tokens_per_s']:.0f} agent tokens/s ({agent} agent tokens)"
          + (f", {cached} prompt tokens from the prefix cache" if name == "vllm" else ""))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", choices=["tiny", *SHAPES])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--domain", default="retail")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=8)
    args = parser.parse_args()
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.policies.vllm import VLLMPolicy

    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    with tempfile.TemporaryDirectory(prefix="muarl-engines-") as folder:
        path = checkpoint(args.config, Path(folder))
        print(f"model {args.config} ({path}), {args.device}, {dtype}; {args.tasks} tasks x {args.group_size} "
              f"episodes of {args.domain}, up to {args.max_turns} turns of {args.max_new_tokens} tokens")
        model, tokenizer = load(str(path), device=args.device)
        model = model.to(getattr(torch, dtype)).eval()
        hf = measure("hf", HFPolicy((model, tokenizer), temperature=1.0, max_new_tokens=args.max_new_tokens,
                                    seed=0), args)
        del model
        options = {"gpu_memory_utilization": 0.5} if args.device.startswith("cuda") else {}
        policy = VLLMPolicy(str(path), temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0, dtype=dtype,
                            max_batch=args.tasks * args.group_size, **options)
        try:
            vllm = measure("vllm", policy, args)
        finally:
            policy.close()
    print(f"agent tokens/s vllm / hf {vllm['agent_tokens_per_s'] / hf['agent_tokens_per_s']:.2f}x")
    print(f"vllm / hf episodes/s {vllm['episodes_per_s'] / hf['episodes_per_s']:.2f}x")


if __name__ == "__main__":
    main()
