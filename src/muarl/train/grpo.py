"""GRPO with the simulated user in the loop: the MUA-RL training step, top to bottom.

Each step: take the next ``tasks_per_step`` training tasks; play ``group_size`` episodes of each with the
live policy against the simulated user (every member of a group meets the same user seed); turn each
group's binary rewards into advantages; score the sampled tokens under the current policy and under the
frozen reference; take one optimizer step (or ``num_iterations`` on the same rollouts) on the clipped,
token-mean loss with the k3 KL term; log. Simulator-fault episodes stay out of the gradient (their mask
is zeroed) instead of counting as failures.
With DAPO dynamic sampling, groups whose members all scored alike are dropped and more tasks are played
until ``tasks_per_step`` groups with a learning signal are found (or ``max_rollout_batches`` are spent).

This module is the trainer's side of the loop (model, optimizer, advantages, update, logging, saving); each
job it strings together lives in its own: the settings in :mod:`muarl.train.grpo_config`, what plays the
episodes and hands over each step's groups in :mod:`muarl.train.orchestrator` (in lockstep, or streamed
ahead of the trainer with ``--max-staleness``: one interface, no branch here), the step's metrics and
rollout files in :mod:`muarl.train.groups`, scoring in :mod:`muarl.train.scoring`, the update in
:mod:`muarl.train.grpo_update`.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

from rich.console import Console

from muarl.algorithms import get_algorithm
from muarl.algorithms.mismatch import mismatch_warning
from muarl.domain import get_domain
from muarl.faults import require_unfaulted
from muarl.provenance import domain_record
from muarl.time_split import summarize as time_split
from muarl.train.distributed import setup
from muarl.train.groups import rollout_metrics, write_rollouts
from muarl.train.grpo_config import GRPOConfig
from muarl.train.grpo_update import update_on_rollouts
from muarl.train.memory import peak_memory, unmap_large_frees
from muarl.train.optim import make_optimizer
from muarl.train.orchestrator import check_rollouts, open_rollouts, open_sampler, open_user, sync_figures
from muarl.train.run import open_run
from muarl.train.settings import Resolved, complete
from muarl.train.sharded_init import load_sharded
from muarl.train.sharding import resume_optimizer, save_result, save_step
from muarl.train.trackers import Trackers, check_report_to
from muarl.train.weights import load_trainable, trainable_parameters


def train_grpo(config: GRPOConfig | Resolved[GRPOConfig], progress: bool = True) -> dict[str, Any]:
    """Run GRPO; writes ``out/model``, ``metrics.jsonl``, ``config.json``, ``rollouts/step_N.jsonl``,
    ``checkpoints/step_N/`` and the chosen trackers' logs (TensorBoard by default).

    Resumes from the newest checkpoint in ``out`` unless ``config.resume`` is False (see
    :mod:`muarl.train.run`); the resumed run's metrics and weights equal an uninterrupted run's. Under
    ``accelerate launch`` / ``torchrun`` each process plays its share of every step's groups and only
    rank 0 writes files.

    ``config``: the settings :func:`muarl.train.settings.resolve` returns (the command line's), or a config
    built in code, whose derived defaults are filled in here (:func:`~muarl.train.settings.complete`).
    """
    settings = config if isinstance(config, Resolved) else complete(config)
    config, filled = settings.config, settings.derived  # what the run records (config.json, config.yaml)
    check_report_to(config.report_to)
    dist = setup(config.device, group=config.fsdp, offload=config.fsdp_offload)
    switched_on = {k: v for k, v in filled.items() if v}  # a setting another option turned on is said once
    if switched_on and progress and dist.main:
        print("muarl: settings that follow from others: " + ", ".join(f"{k} {v:g}" for k, v in switched_on.items())
              + " (" + ", ".join(f"--{k.replace('_', '-')} to choose" for k in switched_on) + ")", file=sys.stderr)
    check_rollouts(config, dist)  # no vLLM, no server: one line before the run directory exists
    domain = get_domain(config.domain)
    # a bridged domain's record names its package version and a digest of the data files it read
    run = open_run(config, dist, {"domain": domain_record(domain)})
    # a sharded run starts from --model (built on meta, each rank reading its own shards) and loads its
    # checkpoint's shards below
    if config.fsdp:
        unmap_large_frees()  # layer-sized frees of a sharded run return their pages
        model, reference, tokenizer = load_sharded(config, dist, want_reference=True, files=run.model)
    else:
        model, reference, tokenizer = load_trainable(config, str(dist.device), run.resume_from, want_reference=True,
                                                     files=run.model)
    model.eval()
    algorithm = get_algorithm(config.algorithm, clip_low=config.clip_low, clip_high=config.clip_high,
                              kl_beta=config.kl_beta)
    optimizer = make_optimizer(trainable_parameters(model), config)
    history: list[dict[str, Any]] = []
    if run.resume_from is not None:  # last: restores the random generators as they were at the save
        history = resume_optimizer(run.resume_from, dist, model, optimizer, config.fsdp)["metrics"]
    trackers = Trackers(run.out, config.report_to, asdict(config), history, enabled=dist.main, name="grpo")
    console = Console() if progress and dist.main else None
    # the data position: tasks played so far (each step's count is in its metrics, restored on resume)
    cursor = sum(int(r.get("tasks_played", config.tasks_per_step)) for r in history)
    rollouts = None
    try:
        # what plays the episodes, built once here and handed down: the user, and the engine on the model
        user = open_user(config)
        sampler = open_sampler(config, dist, model, tokenizer, run.model)
        rollouts = open_rollouts(config, dist, domain, model, sampler, user, run.start_step, cursor,
                                 progress=console is not None)
        warned = False
        for step in range(run.start_step, config.steps):
            model.eval()
            got = rollouts.next_step(step)
            groups = got.groups
            require_unfaulted((t for g in groups for t in g), f"GRPO step {step + 1}")
            advantages, batch = got.batch(algorithm)  # over the members that count (no simulator fault)
            trained = got.trained()
            stats, ref_s, update_s = {}, 0.0, 0.0
            if batch:
                totals = (float(sum(sum(t.loss_mask) for _, t, _ in batch)), float(len(batch)))
                share = [(t, a) for g, t, a in batch if g % dist.world == dist.rank]
                rollouts.release()  # --vllm-sleep, a sharded run's copy: memory goes to the update until the sync
                stats, ref_s, update_s = update_on_rollouts(model, reference, optimizer, algorithm, share, config,
                                                            dist, totals)
                optimizer.zero_grad(set_to_none=True)  # no gradients held through the sync and the next rollouts
                stats["sync_s"] = rollouts.sync(model)
                stats.update(sync_figures(rollouts))
                warning = mismatch_warning(step + 1, stats.get("mismatch_kl", 0.0), stats.get("mismatch_outside", 0.0))
                # asynchronous: the mismatch includes the policy's own lag (up to N updates), not only the engine's
                if warning and dist.main and not warned and not rollouts.lagged:  # once per run, not every step
                    print(warning, file=sys.stderr)
                    warned = True
            if dist.main:
                write_rollouts(run.out, step + 1, groups, advantages, trained)
            tokens = sum(len(t.token_ids) for g in groups for t in g)
            rollout_s = got.rollout_s
            record = {"step": step + 1, **rollout_metrics(groups, domain.general_tools), **stats, **got.metrics,
                      **time_split(t for g in groups for t in g),  # where the rollouts' time went
                      "trained_sequences": len(batch), "tasks_played": got.tasks_played,
                      "masked_share": got.masked_share(),
                      "trained_groups": int(got.keep.sum()), "rollout_s": rollout_s, "reference_s": ref_s,
                      "update_s": update_s, "tokens_per_s": tokens / max(rollout_s + ref_s + update_s, 1e-9),
                      **peak_memory(dist)}
            history.append(record)
            trackers.log(record, step + 1)
            if console is not None:
                why = untrained(record, got.keep, got.masked)
                masked = sum(map(sum, got.masked))
                update = (f"nothing trained: {why}" if why else
                          f"loss {record['loss']:+.4f} kl {record.get('kl', 0.0):.4f} trained {len(batch)}"
                          + (f" (masked {masked})" if masked else ""))
                console.print(f"[bold]grpo step {step + 1}/{config.steps}[/bold] reward {record['reward']:.3f} "
                              f"{update} in {rollout_s + ref_s + update_s:.1f} s")
            if (config.save_every and (step + 1) % config.save_every == 0) or step + 1 == config.steps:
                save_step(run.out, step + 1, dist, model, optimizer, tokenizer, {"step": step + 1, "metrics": history},
                          config.fsdp, config.keep_checkpoints)
    finally:
        trackers.close()
        if rollouts is not None:
            rollouts.close()
    checkpoint, model = save_result(run.out, model, tokenizer, config, dist)
    return {"steps": len(history), "checkpoint": str(checkpoint), "metrics": history, "model": model}


def untrained(record: dict[str, Any], keep: Any, masked: list[list[bool]]) -> str | None:
    """Why a step's update computed nothing (its loss, entropy and grad norm are absent from ``record``), or
    None when it trained: no group kept a learning signal, every kept episode masked, or every trained
    sequence's advantage 0 (and no KL term to move it)."""
    if "grad_norm" in record:
        return None
    if not keep.any():
        return "no informative group (every group's members scored alike)"
    if all(masked[g][m] for g in range(len(masked)) if keep[g] for m in range(len(masked[g]))):
        return "every episode of the kept groups masked (simulator faults or truncation)"
    return "no sequence carried a gradient (advantages 0 and no KL term, or no agent tokens)"
