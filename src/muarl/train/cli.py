"""Command-line options of ``muarl sft`` and ``muarl grpo`` for checkpoints, LoRA, trackers and precision,
and the ``muarl pretrain`` command.

``muarl.cli`` defines sft and grpo; :func:`add_commands` adds these options to them, adds ``pretrain``,
and installs handlers that pass every option into the config (an option left out keeps the default).
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
    _add(p, "--fsdp", action="store_const", const=True,
         help="shard parameters, gradients and optimizer state over the processes (torch FSDP2; launch with "
              "torchrun or accelerate launch; docs/gpu.md)")
    _add(p, "--fsdp-offload", action="store_const", const=True,
         help="with --fsdp on GPUs: keep the shards and the optimizer state in CPU memory")
    _add(p, "--optimizer", choices=["adamw", "sgd"], help="adamw (default) or sgd")
    _add(p, "--no-progress", action="store_true", help="no progress display")


def _main_process() -> bool:
    """Whether this is rank 0 (or the only process): the one that reports."""
    return os.environ.get("RANK", "0") == "0"


def _options(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    return {n: getattr(args, n, None) for n in names}


COMMON = ["save_every", "keep_checkpoints", "resume", "report_to", "lora_r", "lora_alpha", "lora_dropout",
          "lora_targets", "merge_lora", "bf16", "device", "fsdp", "fsdp_offload", "optimizer"]


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
              "penalize_violations", "violation_reward", "num_iterations", "mask_truncated", "shared_prefix", "skip_zero_advantage",
              "zero_advantage_kl", "gradient_checkpointing", "user_timeout", "agent_timeout", "tool_timeout",
              "user_http_timeout", "user_max_tokens", "tis_cap", "rollout_engine", "vllm_gpu_memory", "vllm_sleep", "vllm_sync_dir"]


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


PRETRAIN = ["model", "out", "steps", "batch_size", "lr", "seed", "chunk_tasks", "slip_rate", "first_chunk",
            "probe_every", "hidden_size", "layers", "heads", "head_dim", "kv_heads", "prompt"]


def _pretrain_cmd(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from muarl.train.pretrain import PretrainConfig, train_pretrain

    given = {k: v for k, v in _options(args, PRETRAIN + COMMON).items() if v is not None}
    if args.domains:
        given["domains"] = args.domains
    if args.exclude_behaviours:
        from muarl.synth import BEHAVIOURS

        unknown = sorted(set(args.exclude_behaviours) - set(BEHAVIOURS))
        if unknown:
            raise ValueError(f"unknown user behaviour {', '.join(unknown)}; choose from {', '.join(BEHAVIOURS)}")
        given["exclude_behaviours"] = args.exclude_behaviours
    config = PretrainConfig(**{k: v for k, v in given.items() if k in {f.name for f in fields(PretrainConfig)}})
    result = train_pretrain(config, progress=not args.no_progress)
    accuracy = result["copy_accuracy"]
    Console().print(f"pretrain: {result['steps']} steps; held-out copy accuracy "
                    f"{'n/a' if accuracy is None else f'{accuracy:.3f}'}; checkpoint {result['checkpoint']}")
    return 0


def _pretrain_parser(sub: Any) -> None:
    p = sub.add_parser("pretrain", help="train the cold-start base on an unlimited stream of expert conversations "
                                        "(fresh databases and ids; resumable)")
    p.add_argument("--out", required=True, help="run directory: model/, metrics.jsonl, copy_probe.jsonl, stream/")
    p.add_argument("--model", help="continue from this checkpoint (default: the embedded model, random weights)")
    p.add_argument("--domains", nargs="+", help="domains whose generators feed the stream (default retail-lite)")
    p.add_argument("--steps", type=int, help="optimizer steps (default 4000; the cosine schedule ends there)")
    p.add_argument("--batch-size", type=int, help="conversations per step (default 8)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    p.add_argument("--chunk-tasks", type=int, help="training tasks per freshly generated database (default 200)")
    p.add_argument("--exclude-behaviours", nargs="+",
                   help="leave out users who show these behaviours (e.g. changes_mind), for RL to teach")
    p.add_argument("--slip-rate", type=float,
                   help="chance that the expert mistypes its identity lookup (then asks again), and again that it "
                        "mistypes a proposal (then proposes again); the wrong message without loss (default 0)")
    p.add_argument("--first-chunk", type=int,
                   help="start the stream at this database (a continuation: past the chunks its base saw; default 0)")
    p.add_argument("--probe-every", type=int, help="steps between held-out copy-accuracy probes (default 250)")
    p.add_argument("--seed", type=int)
    for flag, kind in (("--hidden-size", int), ("--layers", int), ("--heads", int), ("--head-dim", int),
                       ("--kv-heads", int)):
        p.add_argument(flag, type=kind, help="shape of a new model (default 64 / 2 / 4 / 64 / 1)")
    p.add_argument("--prompt", choices=["full", "compact"], help="chat template of a new model (default compact)")
    _common(p)
    p.set_defaults(func=_pretrain_cmd)


def add_commands(sub: Any) -> None:
    """Extend the ``sft`` and ``grpo`` subcommands that ``muarl.cli`` defined, and add ``pretrain``."""
    _pretrain_parser(sub)
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
    _add(grpo, "--violation-reward", type=float,
         help="with --penalize-violations: the reward of a rule-breaking episode (default 0; below 0 it also "
              "ranks under a plain failure, so all-failed groups still teach the rule; the CPU demo uses -1)")
    _add(grpo, "--micro-batch-size", type=int,
         help="sequences per forward/backward in the update (default 8; the gradient is the whole batch's)")
    _add(grpo, "--max-rollout-batches", type=int,
         help="with --dynamic-sampling: play up to this many batches of --tasks-per-step tasks per step to fill "
              "the update with groups that have a learning signal (default 4)")
    _add(grpo, "--num-iterations", type=int,
         help="optimizer steps on each step's rollouts (GRPO's mu, default 1); above 1 the rollouts are reused "
              "and the clip bounds each step")
    _add(grpo, "--mask-truncated", dest="mask_truncated", action="store_const", const=True,
         help="leave episodes cut at the per-turn token limit out of the gradient (DAPO's overlong filtering); "
              "they still count as failures in their group's advantages")
    _add(grpo, "--no-shared-prefix", dest="shared_prefix", action="store_const", const=False,
         help="run every sequence whole in the reference pass and the update (default: the batch's shared "
              "opening, the system turn, is computed once; same result, less work)")
    _add(grpo, "--no-skip-zero-advantage", dest="skip_zero_advantage", action="store_const", const=False,
         help="run zero-advantage sequences too (default: skipped when their KL term is 0, which changes nothing)")
    _add(grpo, "--zero-advantage-kl", type=float,
         help="also skip zero-advantage sequences whose kl_beta * mean KL is at most this (an approximation; "
              "default 0: only exact skips)")
    _add(grpo, "--tis-cap", type=float,
         help="truncated importance sampling against the rollout-training mismatch: ratio against the trainer's "
              "pre-update log-probs, each token weighed by min(trainer / sampler probability, C); 2 is the "
              "published choice (default 0: off). The mismatch is logged either way (mismatch_kl, mismatch_outside)")
    _add(grpo, "--rollout-engine", metavar="{hf,vllm,vllm-server:URL#MODEL}",
         help="what samples the rollouts: muarl's transformers engine (hf, default) or vLLM, whose weights "
              "follow the trainer's after every update (LoRA: the adapter reloaded in place; full: the weights "
              "pushed in): in this process (vllm, needs `muarl[vllm]`) or a running vLLM server "
              "(vllm-server:URL#MODEL, MODEL its --served-model-name; no vLLM needed here); docs/vllm.md")
    _add(grpo, "--vllm-gpu-memory", type=float,
         help="with --rollout-engine vllm on a GPU the trainer shares: the share of its memory vLLM's weights and "
              "KV cache take (default 0.3)")
    _add(grpo, "--vllm-sync-dir", metavar="DIR",
         help="with --rollout-engine vllm-server:...: the directory the synced weights or adapter are written to "
              "for the server to load (default: a temporary one; a server on another machine needs a shared one)")
    _add(grpo, "--vllm-sleep", action="store_true", default=None,
         help="with --rollout-engine vllm on a GPU: the engine sleeps through each update (weights offloaded to "
              "CPU memory, KV cache freed) and wakes for the weight sync (vLLM's sleep mode; not on the CPU build)")
    _add(grpo, "--gradient-checkpointing", dest="gradient_checkpointing", action=argparse.BooleanOptionalAction,
         default=None, help="recompute activations in backward (default: by need; never on the CPU)")
    from muarl.eval_cli import add_limit_options

    add_limit_options(grpo, defaults=False)
    grpo.set_defaults(func=_grpo_cmd)
