"""GRPO with the simulated user in the loop: the MUA-RL training step, top to bottom.

Each step: take the next ``tasks_per_step`` training tasks; play ``group_size`` episodes of each with the
live policy against the simulated user (every member of a group meets the same user seed); turn each
group's binary rewards into advantages; score the sampled tokens under the current policy and under the
frozen reference; take one optimizer step on the clipped, token-mean loss with the k3 KL term; log.
Simulator-fault episodes stay out of the gradient (their mask is zeroed) instead of counting as failures.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from muarl.algorithms import LossBatch, get_algorithm, informative_groups
from muarl.domain import get_domain
from muarl.factory import make_user
from muarl.policies.hf import HFPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.train import from_preset, save_model, start_run
from muarl.types import Trajectory


@dataclass
class GRPOConfig:
    """GRPO settings; the defaults are the paper's released script (see :data:`PRESETS`)."""

    model: str = "tiny"
    domain: str = "retail"
    split: str = "train"
    user: str = "scripted"
    out: str = "runs/grpo"
    steps: int = 25
    tasks_per_step: int = 32
    group_size: int = 8
    algorithm: str = "grpo"
    lr: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.001
    temperature: float = 1.0
    max_new_tokens: int = 1024
    max_turns: int = 30
    dynamic_sampling: bool = False  # DAPO: drop all-equal groups from the update
    mask_sim_faults: bool = True
    gradient_checkpointing: bool = True  # recompute activations in backward: long prompts, bounded memory
    seed: int = 0


PRESETS: dict[str, GRPOConfig] = {
    "paper": GRPOConfig(),
    "tiny": GRPOConfig(steps=10, tasks_per_step=4, group_size=4, lr=1e-4, max_new_tokens=128, max_turns=12),
}


def sequence_logprobs(model: Any, ids: list[int], temperature: float,
                      mask: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities of ``ids`` under ``model`` and the entropy of each prediction.

    Only positions where ``mask`` is 1 are scored (others get 0): the output head runs on the hidden
    states that predict agent tokens only, which in these conversations are a few percent of all tokens,
    so the vocabulary-sized logits are never built for the long prompt.
    """
    device = next(model.parameters()).device
    targets = [p for p in range(1, len(ids)) if mask is None or mask[p]]
    hidden = model.model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0]
    logits = model.get_output_embeddings()(hidden[[p - 1 for p in targets]]).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    chosen = logp.gather(-1, torch.tensor([ids[p] for p in targets], device=device).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1).detach()
    index = torch.tensor(targets, device=device, dtype=torch.long)
    full = torch.zeros(len(ids), device=device).index_put((index,), chosen)
    ent = torch.zeros(len(ids), device=device).index_put((index,), entropy)
    return full, ent


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[0])) for r in rows])


def rollout_metrics(groups: list[list[Trajectory]]) -> dict[str, float]:
    """The paper's training dynamics from one step's episodes."""
    trajs = [t for g in groups for t in g]
    n = len(trajs)
    rewards = [[t.reward.reward if t.reward else 0.0 for t in g] for g in groups]
    calls = Counter(r.name for t in trajs for r in t.tool_log if r.actor == "agent")
    return {
        "reward": sum(map(sum, rewards)) / n,
        "all_correct_groups": sum(all(r == 1.0 for r in g) for g in rewards) / len(groups),
        "all_wrong_groups": sum(all(r == 0.0 for r in g) for g in rewards) / len(groups),
        "turns": sum(t.turns for t in trajs) / n,
        "response_tokens": sum(sum(t.loss_mask) for t in trajs) / n,
        "sim_fault_rate": sum(t.sim_fault for t in trajs) / n,
        "violation_rate": sum(bool(t.reward and t.reward.violations) for t in trajs) / n,
        "malformed_calls": sum(t.malformed_calls for t in trajs) / n,
        **{f"calls_{name}": calls[name] / n for name in ("think", "calculate", "transfer_to_human_agents")},
    }


def policy_update(model: Any, reference: Any, optimizer: Any, algorithm: Any,
                  batch: list[tuple[Trajectory, float]], config: GRPOConfig) -> tuple[dict[str, float], float, float]:
    """One optimizer step on (trajectory, advantage) pairs; returns (stats, reference seconds, update seconds).

    The loss is computed once over the whole batch so that token-mean (or Dr.GRPO's per-sequence sums)
    is exact; old log-probs are the ones stored at sampling time (the step is on-policy: ratio 1).
    """
    began = time.perf_counter()
    with torch.no_grad():
        ref = [sequence_logprobs(reference, t.token_ids, config.temperature, t.loss_mask)[0] for t, _ in batch]
    ref_s = time.perf_counter() - began
    began = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    current, entropy = zip(*(sequence_logprobs(model, t.token_ids, config.temperature, t.loss_mask) for t, _ in batch),
                           strict=True)
    width = max(len(t.token_ids) for t, _ in batch)
    mask = _pad([torch.tensor(t.loss_mask, dtype=torch.float) for t, _ in batch], width)
    loss_batch = LossBatch(
        logprobs=_pad(list(current), width),
        old_logprobs=_pad([torch.tensor(t.logprobs) for t, _ in batch], width),
        advantages=_pad([torch.full((len(t.token_ids),), a) for t, a in batch], width),
        mask=mask,
        ref_logprobs=_pad(ref, width),
    )
    loss, loss_stats = algorithm.loss(loss_batch)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
    optimizer.step()
    model.eval()
    stats = {"loss": float(loss.detach()), "kl": loss_stats.kl, "clip_fraction": loss_stats.clip_fraction,
             "grad_norm": grad_norm, "entropy": float((_pad(list(entropy), width) * mask).sum() / mask.sum()),
             "update_tokens": float(loss_stats.tokens)}
    return stats, ref_s, time.perf_counter() - began


def train_grpo(config: GRPOConfig, progress: bool = True) -> dict[str, Any]:
    """Run GRPO; writes ``out/model``, ``out/metrics.jsonl``, ``out/config.json`` and TensorBoard events."""
    from torch.utils.tensorboard import SummaryWriter

    out, model, tokenizer = start_run(config)
    reference = copy.deepcopy(model).eval().requires_grad_(False)  # the starting (cold-start) model
    if config.gradient_checkpointing:  # active in train mode only: generation keeps its KV cache
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    domain = get_domain(config.domain)
    policy = HFPolicy((model, tokenizer), temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                      seed=config.seed)
    episode = EpisodeConfig(max_turns=config.max_turns, require_outputs=False)  # as the paper trains
    engine = RolloutEngine(domain, policy, make_user(config.user), episode, group_size=config.group_size,
                           common_user_seed=True, seed=config.seed, progress=progress)
    algorithm = get_algorithm(config.algorithm, clip_low=config.clip_low, clip_high=config.clip_high,
                              kl_beta=config.kl_beta)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    tasks = domain.tasks(config.split)
    order = random.Random(config.seed).sample(tasks, len(tasks))
    writer = SummaryWriter(str(out / "tensorboard"))
    history = []
    with (out / "metrics.jsonl").open("w") as log:
        for step in range(config.steps):
            chosen = [order[(step * config.tasks_per_step + k) % len(order)] for k in range(config.tasks_per_step)]
            began = time.perf_counter()
            model.eval()
            groups = asyncio.run(engine.run(chosen))
            rollout_s = time.perf_counter() - began
            rewards = torch.tensor([[t.reward.reward if t.reward else 0.0 for t in g] for g in groups])
            advantages = algorithm.advantages(rewards)
            keep = informative_groups(rewards) if config.dynamic_sampling else torch.ones(len(groups), dtype=torch.bool)
            batch = [(t, float(advantages[g, m])) for g, group in enumerate(groups) if keep[g]
                     for m, t in enumerate(group)
                     if sum(t.loss_mask) and not (config.mask_sim_faults and t.sim_fault)]
            stats, ref_s, update_s = {}, 0.0, 0.0
            if batch:
                stats, ref_s, update_s = policy_update(model, reference, optimizer, algorithm, batch, config)
                policy.weights_updated()
            tokens = sum(len(t.token_ids) for g in groups for t in g)
            record = {"step": step + 1, **rollout_metrics(groups), **stats, "trained_sequences": len(batch),
                      "rollout_s": rollout_s, "reference_s": ref_s, "update_s": update_s,
                      "tokens_per_s": tokens / max(rollout_s + ref_s + update_s, 1e-9)}
            log.write(json.dumps(record) + "\n")
            log.flush()
            for key, value in record.items():
                if isinstance(value, int | float):
                    writer.add_scalar(key, value, step + 1)
            history.append(record)
    writer.close()
    checkpoint = save_model(out, model, tokenizer)
    return {"steps": len(history), "checkpoint": str(checkpoint), "metrics": history}


def preset(name: str, **overrides: Any) -> GRPOConfig:
    return from_preset(PRESETS, name, "GRPO", **overrides)
