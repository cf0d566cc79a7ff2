"""The rollout-training mismatch of a vLLM engine in bfloat16 against muarl's float32 trainer (issue 18).

    # in the vLLM virtualenv (scripts/install_vllm.sh); the CPU build here (bf16 kernels need AVX-512 BF16):
    VLLM_CPU_KVCACHE_SPACE=2 "$(bash scripts/install_vllm.sh --where)/bin/python" benchmarks/engine_precision.py
    # on a GPU (random weights of a real size: nothing is downloaded):
    python benchmarks/engine_precision.py --device cuda --config qwen3-0.6b

A GPU run samples in bf16 while the trainer recomputes in float32 (or autocast), so every step logs some
``mismatch_kl`` and ``mismatch_outside`` (:mod:`muarl.algorithms.mismatch`), and a run whose share of
tokens outside [0.5, 2] passes ``WARN_OUTSIDE`` is warned (and, on the opening prompt before the first
step, refused). This script measures what precision alone gives, so that threshold can be read against
it: the engine plays the same episodes once in float32 (the baseline, the same process: the noise floor
of two implementations) and once in bfloat16, the trainer recomputes every sampled token in float32, and
the script prints each dtype's k3 KL, share outside [0.5, 2] and largest |log-prob difference|. Its last
line is ``bfloat16 outside share N.NNNN (threshold 0.1)``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from muarl.algorithms.mismatch import WARN_OUTSIDE, mismatch_sums  # noqa: E402
from muarl.domain import get_domain  # noqa: E402
from muarl.rollout import EpisodeConfig, RolloutEngine  # noqa: E402
from muarl.users.scripted import ScriptedUser  # noqa: E402
from rollout_engines import SHAPES, checkpoint  # noqa: E402


def mismatch(path: Path, dtype: str, args: argparse.Namespace) -> dict[str, float]:
    """Episodes sampled by a vLLM engine in ``dtype``, scored again by the float32 trainer."""
    from transformers import AutoModelForCausalLM

    from muarl.policies.vllm import VLLMPolicy
    from muarl.train.scoring import sequence_logprobs

    domain = get_domain(args.domain)
    policy = VLLMPolicy(str(path), dtype=dtype, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    try:
        engine = RolloutEngine(domain, policy, ScriptedUser(), EpisodeConfig(max_turns=args.max_turns),
                               group_size=args.group_size, seed=args.seed, progress=False)
        trajs = [t for g in asyncio.run(engine.run(domain.tasks("test")[:args.tasks])) for t in g]
    finally:
        policy.close()
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device).eval()
    kl = outside = tokens = 0.0
    largest = 0.0
    for traj in trajs:
        mask = torch.tensor(traj.loss_mask, dtype=torch.float64)
        if not mask.sum():
            continue
        with torch.no_grad():
            scored, _ = sequence_logprobs(trainer, traj.token_ids, 1.0, traj.loss_mask)
        sampled = torch.tensor(traj.logprobs, dtype=torch.float64)
        k, o, n = mismatch_sums(scored.double().cpu(), sampled, mask)
        kl, outside, tokens = kl + k, outside + o, tokens + n
        largest = max(largest, float(((scored.double().cpu() - sampled) * mask).abs().max()))
    return {"episodes": len(trajs), "tokens": tokens, "kl": kl / max(tokens, 1), "outside": outside / max(tokens, 1),
            "largest": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny", choices=["tiny", *SHAPES], help="the shipped base or a random "
                        "model of a real shape")
    parser.add_argument("--device", default="cpu", help="the trainer's device (the engine's is vLLM's platform)")
    parser.add_argument("--domain", default="retail-lite")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--max-turns", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="muarl-precision-") as folder:
        path = checkpoint(args.config, Path(folder))
        results = {dtype: mismatch(path, dtype, args) for dtype in ("float32", "bfloat16")}
    for dtype, r in results.items():
        print(f"{dtype:>9}: {r['episodes']} episodes, {r['tokens']:.0f} agent tokens: mismatch_kl {r['kl']:.2e}, "
              f"outside [0.5, 2] {r['outside']:.4f}, largest |log-prob difference| {r['largest']:.3f}")
    print(f"bfloat16 outside share {results['bfloat16']['outside']:.4f} (threshold {WARN_OUTSIDE:g})")


if __name__ == "__main__":
    main()
