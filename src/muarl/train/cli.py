"""Command-line options of ``muarl sft`` and ``muarl grpo`` for checkpoints, LoRA, trackers and precision.

``muarl.cli`` defines the two commands; :func:`add_commands` adds these options to them and installs
handlers that pass every option into the config (an option left out keeps the preset's value).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rich.console import Console


def _add(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """Add an option unless the parser already has it (``muarl.cli`` may define some itself)."""
    if not any(f in parser._option_string_actions for f in flags):
        parser.add_argument(*flags, **kwargs)


def _common(p: argparse.ArgumentParser) -> None:
    _add(p, "--save-every", type=int, help="steps between checkpoints in OUT/checkpoints/step_N (0: only at the end)")
    _add(p, "--keep-checkpoints", type=int, help="newest checkpoints kept (0: all; default 2)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", dest="resume", action="store_const", const=True,
                       help="continue from OUT's newest checkpoint; an error if there is none (default: continue "
                            "when there is one, else start fresh)")
    group.add_argument("--no-resume", dest="resume", action="store_const", const=False,
                       help="start over, deleting OUT's checkpoints")
    _add(p, "--report-to", help="comma-separated trackers: tensorboard (default), wandb, mlflow, or none; "
                                "metrics.jsonl is always written")
    _add(p, "--lora-r", type=int, help="LoRA rank (peft); 0 = full fine-tuning (default)")
    _add(p, "--lora-alpha", type=int, help="LoRA alpha (default 16)")
    _add(p, "--lora-dropout", type=float, help="LoRA dropout (default 0)")
    _add(p, "--lora-targets", help="modules to adapt: all-linear (default) or names like q_proj,v_proj")
    _add(p, "--no-merge-lora", dest="merge_lora", action="store_const", const=False,
         help="with LoRA, write only OUT/adapter (default: also the merged model as OUT/model)")
    _add(p, "--bf16", dest="bf16", action=argparse.BooleanOptionalAction, default=None,
         help="bfloat16 autocast for training forwards (default: on where CUDA supports it)")
    _add(p, "--device", help="cpu, cuda, cuda:1 ... (default: this process's GPU if any, else the CPU)")
    _add(p, "--no-progress", action="store_true", help="no progress display")


def _main_process() -> bool:
    """Whether this is rank 0 (or the only process): the one that reports."""
    return os.environ.get("RANK", "0") == "0"


def _options(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    return {n: getattr(args, n, None) for n in names}


COMMON = ["save_every", "keep_checkpoints", "resume", "report_to", "lora_r", "lora_alpha", "lora_dropout",
          "lora_targets", "merge_lora", "bf16", "device"]


def _sft_cmd(args: argparse.Namespace) -> int:
    from muarl.train.sft import preset, train_sft

    config = preset(args.preset, model=args.model, data=args.data, out=args.out, epochs=args.epochs, lr=args.lr,
                    batch_size=args.batch_size, max_len=args.max_len, seed=args.seed, fresh_ids=args.fresh_ids,
                    **_options(args, COMMON))
    result = train_sft(config, progress=not args.no_progress)
    Console(quiet=not _main_process()).print(f"SFT: {result['steps']} steps, loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}; "
                    f"checkpoint {result['checkpoint']} (use it as --policy hf:{result['checkpoint']})")
    return 0


GRPO_EXTRA = ["split", "max_new_tokens", "max_turns", "temperature", "kl_beta", "micro_batch_size", "max_rollout_batches",
              "penalize_violations", "num_iterations"]


def grpo_config(args: argparse.Namespace) -> Any:
    """The :class:`muarl.train.grpo.GRPOConfig` a parsed ``muarl grpo`` command line asks for."""
    from muarl.train.grpo import preset

    return preset(args.preset, model=args.model, domain=args.domain, user=args.user, out=args.out,
                  steps=args.steps, tasks_per_step=args.tasks_per_step, group_size=args.group_size, lr=args.lr,
                  algorithm=args.algorithm, dynamic_sampling=args.dynamic_sampling or None, seed=args.seed,
                  **_options(args, COMMON + GRPO_EXTRA))


def _grpo_cmd(args: argparse.Namespace) -> int:
    from muarl.train.grpo import train_grpo

    result = train_grpo(grpo_config(args), progress=not args.no_progress)
    last = result["metrics"][-1] if result["metrics"] else {}
    Console(quiet=not _main_process()).print(f"GRPO: {result['steps']} steps, last reward {last.get('reward', 0):.3f}; "
                    f"checkpoint {result['checkpoint']}")
    return 0


def add_commands(sub: Any) -> None:
    """Extend the ``sft`` and ``grpo`` subcommands that ``muarl.cli`` defined."""
    sft = sub.choices["sft"]
    _common(sft)
    _add(sft, "--fresh-ids", dest="fresh_ids", action="store_const", const=True,
         help="rename identifiers (digit runs of 4+) afresh in every conversation at every step, so a model "
              "trained from scratch cannot memorize them (muarl.train.fresh_ids)")
    sft.set_defaults(func=_sft_cmd)
    grpo = sub.choices["grpo"]
    _common(grpo)
    _add(grpo, "--split", help="task split to train on (default train)")
    _add(grpo, "--max-new-tokens", type=int, help="sampled tokens per assistant turn")
    _add(grpo, "--max-turns", type=int, help="tool executions + user replies per episode")
    _add(grpo, "--temperature", type=float, help="sampling temperature (also scales the trained log-probs)")
    _add(grpo, "--kl-beta", type=float, help="weight of the k3 KL term against the reference")
    _add(grpo, "--penalize-violations", dest="penalize_violations", action="store_const", const=True,
         help="train on reward 0 for an episode that broke a policy rule, even if its database is right "
              "(the paper's reward is the database alone; the CPU demo penalizes)")
    _add(grpo, "--micro-batch-size", type=int,
         help="sequences per forward/backward in the update (default 8; the gradient is the whole batch's)")
    _add(grpo, "--max-rollout-batches", type=int,
         help="with --dynamic-sampling: play up to this many batches of --tasks-per-step tasks per step to fill "
              "the update with groups that have a learning signal (default 4)")
    _add(grpo, "--num-iterations", type=int,
         help="optimizer steps on each step's rollouts (GRPO's mu, default 1); above 1 the rollouts are reused "
              "and the clip bounds each step")
    grpo.set_defaults(func=_grpo_cmd)
