"""GRPO with the simulated user in the loop: the MUA-RL training step, top to bottom.

Each step: take the next ``tasks_per_step`` training tasks; play ``group_size`` episodes of each with the
live policy against the simulated user (every member of a group meets the same user seed); turn each
group's binary rewards into advantages; score the sampled tokens under the current policy and under the
frozen reference; take one optimizer step (or ``num_iterations`` on the same rollouts) on the clipped,
token-mean loss with the k3 KL term; log. Simulator-fault episodes stay out of the gradient (their mask
is zeroed) instead of counting as failures.
With DAPO dynamic sampling, groups whose members all scored alike are dropped and more tasks are played
until ``tasks_per_step`` groups with a learning signal are found (or ``max_rollout_batches`` are spent).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from muarl.algorithms import LossBatch, get_algorithm, informative_groups
from muarl.algorithms.common import k3_kl
from muarl.algorithms.mismatch import mismatch_sums, mismatch_warning, truncated_is_weights
from muarl.domain import get_domain
from muarl.factory import make_user
from muarl.faults import credited_reward, require_unfaulted
from muarl.provenance import domain_record
from muarl.rollout import AGENT_TIMEOUT_S, TOOL_TIMEOUT_S, USER_TIMEOUT_S, EpisodeConfig, RolloutEngine
from muarl.train import RunSettings, autocast, from_preset, make_optimizer
from muarl.train.async_rollouts import RolloutStream, take_step
from muarl.train.checkpoint import load_trainer_state, save_checkpoint
from muarl.train.distributed import Dist, setup
from muarl.train.run import open_run
from muarl.train.samplers import (
    SERVER,
    CopySampler,
    check_rollout_engine,
    check_user_beside_policy,
    make_sampler,
    server_endpoints,
)
from muarl.train.sharding import (
    SHARDS,
    decoder,
    grad_norm,
    idle_passes,
    is_sharded,
    load_shards,
    pass_count,
    save_final_sharded,
    save_shards,
    shard_for_training,
)
from muarl.train.shared_prefix import (
    MIN_PREFIX,
    DetachedPrefix,
    Prefix,
    common_prefix,
    hidden_after_prefix,
    record_prefix,
)
from muarl.train.trackers import Trackers, check_report_to
from muarl.train.weights import (
    causal_lm,
    load_trainable,
    reference_mode,
    save_final,
    trainable_parameters,
    write_weights,
)
from muarl.types import Task, Trajectory


@dataclass
class GRPOConfig(RunSettings):
    """GRPO settings; the defaults are the paper's released script (see :data:`PRESETS`)."""

    model: str = field(default="tiny", metadata={
        "help": "the starting checkpoint (normally the SFT output; a directory, Hub id, tiny or smollm2); also "
                "the KL reference"})
    domain: str = field(default="retail", metadata={"help": "domain name (see `muarl domains`) or module:attr"})
    split: str = field(default="train", metadata={"help": "task split to train on"})
    user: str = field(default="scripted", metadata={"help": "scripted | llm:URL#MODEL | module:attr"})
    out: str = field(default="runs/grpo", metadata={"help": "run directory: model/, metrics.jsonl, config.json"})
    steps: int = field(default=25, metadata={"help": "optimizer steps (each plays a batch of rollouts)"})
    tasks_per_step: int = field(default=32, metadata={"help": "training tasks played per step"})
    group_size: int = field(default=8, metadata={
        "help": "episodes per task, one user seed per group: the group whose rewards give the advantages"})
    algorithm: str = field(default="grpo", metadata={
        "help": "grpo, or dr_grpo (Dr.GRPO: advantages not divided by the group's std, each sequence's loss "
                "over a constant length)",
        "choices": ["grpo", "dr_grpo"]})
    lr: float = field(default=1e-6, metadata={"help": "learning rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "the optimizer's weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip"})
    clip_low: float = field(default=0.2, metadata={"help": "PPO clip below: the ratio's floor is 1 - this"})
    clip_high: float = field(default=0.2, metadata={
        "help": "PPO clip above: the ratio's ceiling is 1 + this (DAPO's clip-higher raises it)"})
    kl_beta: float = field(default=0.001, metadata={
        "help": "weight of the k3 KL term against the reference (0: off, and no reference pass)"})
    temperature: float = field(default=1.0, metadata={
        "help": "sampling temperature (also scales the trained log-probs)"})
    max_new_tokens: int = field(default=1024, metadata={"help": "sampled tokens per assistant turn"})
    max_turns: int = field(default=30, metadata={"help": "tool executions + user replies per episode"})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO: leave all-equal groups out of the update and play more tasks instead (see "
                "--max-rollout-batches)"})
    max_rollout_batches: int = field(default=4, metadata={
        "help": "with --dynamic-sampling: play up to this many batches of --tasks-per-step tasks per step to "
                "fill the update with groups that have a learning signal"})
    mask_sim_faults: bool = field(default=True, metadata={
        "help": "leave every faulted episode (user, policy, tool, timeouts: muarl.faults) out of the gradient"})
    # time limits of one user turn, agent turn, tool call (seconds; None: none): a hit is a masked fault
    user_timeout: float | None = field(default=USER_TIMEOUT_S, metadata={
        "help": "time limit of one user turn (device actions included); past it the episode is a fault (0: no "
                "limit)", "metavar": "SECONDS"})
    agent_timeout: float | None = field(default=AGENT_TIMEOUT_S, metadata={
        "help": "time limit of one agent turn; past it the episode is a fault (0: no limit)", "metavar": "SECONDS"})
    tool_timeout: float | None = field(default=TOOL_TIMEOUT_S, metadata={
        "help": "time limit of one tool call; past it the episode is a fault (0: no limit)", "metavar": "SECONDS"})
    user_http_timeout: float | None = field(default=None, metadata={
        "help": "llm: users: seconds one HTTP request to the user's endpoint may take before it is retried "
                "(default: the LLM user's, 60)", "metavar": "SECONDS"})
    user_max_tokens: int | None = field(default=None, metadata={
        "help": "llm: users: the most tokens one user message may take (default: the server's limit)",
        "metavar": "N"})
    penalize_violations: bool = field(default=False, metadata={
        "help": "train on --violation-reward for an episode that broke a policy rule, even if its database is "
                "right (the paper's reward is the database alone; the CPU demo penalizes)"})
    # the training reward of a rule-breaking episode when penalized: 0 only equals it with a plain failure, so
    # a group of failures gives no signal against the rule; below 0 it does
    violation_reward: float = field(default=0.0, metadata={
        "help": "with --penalize-violations: the reward of a rule-breaking episode (below 0 it also ranks under "
                "a plain failure, so all-failed groups still teach the rule)"})
    # DAPO's overlong filtering: episodes cut at the per-turn token limit stay out of the gradient (they still
    # count, as failures, in their group's advantages), so their run-on tokens cannot dominate the token-mean
    mask_truncated: bool = field(default=False, metadata={
        "help": "leave episodes cut at the per-turn token limit out of the gradient (DAPO's overlong "
                "filtering); they still count as failures in their group's advantages"})
    # None: by need, see set_checkpointing (never on the CPU; on a GPU when the micro-batch's activations
    # would not fit well)
    gradient_checkpointing: bool | None = field(default=None, metadata={
        "help": "recompute activations in backward (default: by need; never on the CPU)"})
    shared_prefix: bool = field(default=True, metadata={
        "help": "compute the batch's shared opening (the system turn) once in the reference pass and the "
                "update; same result, less work (--no-shared-prefix: every sequence whole)"})
    skip_zero_advantage: bool = field(default=True, metadata={
        "help": "no forward or backward for zero-advantage sequences whose KL term is 0, which changes nothing "
                "(--no-skip-zero-advantage: run them too)"})
    zero_advantage_kl: float = field(default=0.0, metadata={
        "help": "also skip zero-advantage sequences whose kl_beta * mean KL is at most this (an approximation; "
                "0: only exact skips)"})
    micro_batch_size: int = field(default=8, metadata={
        "help": "sequences per forward/backward in the update (the gradient is the whole batch's)"})
    num_iterations: int = field(default=1, metadata={
        "help": "optimizer steps on each step's rollouts (GRPO's mu); above 1 the rollouts are reused and the "
                "clip bounds each step"})
    # truncated importance sampling against the rollout-training mismatch (muarl.algorithms.mismatch)
    tis_cap: float = field(default=0.0, metadata={
        "help": "truncated importance sampling against the rollout-training mismatch: ratio against the "
                "trainer's pre-update log-probs, each token weighed by min(trainer / sampler probability, C); 2 "
                "is the published choice (0: off). The mismatch is logged either way (mismatch_kl, "
                "mismatch_outside)", "metavar": "C"})
    # asynchronous GRPO (muarl.train.async_rollouts): episodes keep being played while the trainer updates
    max_staleness: int = field(default=0, metadata={
        "help": "asynchronous rollouts: groups are played on the newest synced weights while the trainer "
                "updates, and a step takes finished groups at most N updates old, the policy term weighed by "
                "the truncated importance ratio (--tis-cap, 2 unless set); 0: sample, then update (docs/training.md)",
        "metavar": "N"})
    # a vLLM engine's weights are synced to the trainer's after each update
    rollout_engine: str = field(default="hf", metadata={
        "help": "what samples the rollouts: muarl's transformers engine (hf) or vLLM, whose weights follow the "
                "trainer's after every update (LoRA: the adapter reloaded in place; full: the weights pushed "
                "in): in this process (vllm, needs `muarl[vllm]`) or a running vLLM server "
                "(vllm-server:URL#MODEL, MODEL its --served-model-name; no vLLM needed here), or several: "
                "vllm-server:URL1#M,URL2#M (whole groups to the least busy, all synced); docs/vllm.md",
        "metavar": "{hf,vllm,vllm-server:URL#MODEL}"})
    vllm_gpu_memory: float = field(default=0.3, metadata={
        "help": "with --rollout-engine vllm on a GPU the trainer shares: the share of its memory vLLM's weights "
                "and KV cache take"})
    # vLLM's sleep mode, level 1
    vllm_sleep: bool = field(default=False, metadata={
        "help": "with --rollout-engine vllm on a GPU: the engine sleeps through each update (weights offloaded "
                "to CPU memory, KV cache freed) and wakes for the weight sync (vLLM's sleep mode; not on the CPU "
                "build)"})
    vllm_sync_dir: str | None = field(default=None, metadata={
        "help": "with --rollout-engine vllm-server:...: the directory the synced weights or adapter are written "
                "to for the server to load (default: a temporary one; a server on another machine needs a "
                "shared one)", "metavar": "DIR"})
    save_every: int = field(default=5, metadata={
        "help": "steps between checkpoints in OUT/checkpoints/step_N (0: only at the end; "
                "muarl.train.checkpoint)"})

    def __post_init__(self) -> None:
        """A config that cannot run fails here, with the option's name, not as a tensor error mid-step."""
        self.check_sharding()
        for name in ("steps", "tasks_per_step", "group_size", "max_rollout_batches", "max_new_tokens", "max_turns",
                     "micro_batch_size", "num_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"GRPO {name} must be at least 1 (got {getattr(self, name)})")
        if self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f"GRPO samples and learns: temperature and lr must be above 0 "
                             f"(got {self.temperature}, {self.lr})")
        self.episode_config()  # refuses a negative time limit, naming its option
        if self.violation_reward != 0.0 and not self.penalize_violations:
            raise ValueError("GRPO violation_reward applies only with penalize_violations "
                             "(--violation-reward needs --penalize-violations)")
        if self.tis_cap < 0:
            raise ValueError(f"--tis-cap must be above 0 (or 0: off), not {self.tis_cap:g}")
        if self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be 0 (synchronous) or more, not {self.max_staleness}")
        if self.max_staleness and self.tis_cap == 0:
            self.tis_cap = 2.0  # stale tokens are weighed by the truncated ratio to their behaviour log-probs
        if self.max_staleness and (self.fsdp or self.rollout_engine != "hf"):
            raise ValueError("--max-staleness runs with muarl's own engine (--rollout-engine hf) and without "
                             "--fsdp for now")
        if self.rollout_engine.startswith(SERVER):
            server_endpoints(self.rollout_engine)  # a malformed URL#MODEL[,...]: one line (no connection yet)
            check_user_beside_policy(self)
        elif self.rollout_engine not in ("hf", "vllm"):
            raise ValueError(f"--rollout-engine must be hf, vllm or {SERVER}URL#MODEL, not {self.rollout_engine!r}")
        if self.vllm_sleep and self.rollout_engine != "vllm":
            raise ValueError("--vllm-sleep puts an engine in this process to sleep: it needs --rollout-engine vllm")
        if self.vllm_sync_dir is not None and not self.rollout_engine.startswith(SERVER):
            raise ValueError(f"--vllm-sync-dir is where a vLLM server reads synced weights: it needs "
                             f"--rollout-engine {SERVER}URL#MODEL")
        if not 0 < self.vllm_gpu_memory <= 1:
            raise ValueError(f"--vllm-gpu-memory is a share of the GPU's memory in (0, 1], not {self.vllm_gpu_memory:g}")
        if self.user_http_timeout is not None and self.user_http_timeout <= 0:
            raise ValueError(f"--user-http-timeout must be above 0 seconds, not {self.user_http_timeout:g}")
        if self.user_max_tokens is not None and self.user_max_tokens < 1:
            raise ValueError(f"--user-max-tokens must be at least 1 (got {self.user_max_tokens})")

    def episode_config(self) -> EpisodeConfig:
        """The episodes' settings: the paper's training ones (required outputs not graded) and the limits."""
        return EpisodeConfig(max_turns=self.max_turns, require_outputs=False, user_timeout=self.user_timeout or None,
                             agent_timeout=self.agent_timeout or None, tool_timeout=self.tool_timeout or None)


PRESETS: dict[str, GRPOConfig] = {
    "paper": GRPOConfig(),
    "tiny": GRPOConfig(steps=10, tasks_per_step=4, group_size=4, lr=1e-4, max_new_tokens=128, max_turns=12),
}


def batch_logprobs(model: Any, sequences: list[list[int]], temperature: float,
                   masks: list[list[int]] | None = None,
                   prefix: Prefix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities of several sequences in one forward pass, and each prediction's entropy.

    Returns two [sequences, longest] tensors (0 where a position is not scored or is padding). Rows are
    right-padded, which needs no attention mask: under causal attention a real token never sees the
    padding after it. Only positions where the mask is 1 are scored: the output head runs on the hidden
    states that predict agent tokens only, a few percent of these conversations, so the vocabulary-sized
    logits are never built for the long prompt. ``prefix``: the sequences' shared opening, already run
    (:mod:`muarl.train.shared_prefix`); only what follows it is computed here. Works on a plain causal
    LM and on a peft (LoRA) model.
    """
    lm = causal_lm(model)
    device = next(lm.parameters()).device
    start = len(prefix) if prefix is not None else 0
    if prefix is not None and any(seq[:start] != prefix.tokens for seq in sequences):
        raise ValueError("every sequence must start with the shared prefix it is scored against")
    width = max(len(ids) for ids in sequences)
    rows, cols, wanted = [], [], []
    for b, seq in enumerate(sequences):
        targets = [p for p in range(max(1, start + 1), len(seq)) if masks is None or masks[b][p]]
        rows += [b] * len(targets)
        cols += targets
        wanted += [seq[p] for p in targets]
    if prefix is not None:
        hidden = hidden_after_prefix(lm, prefix, [seq[start:] for seq in sequences])
    else:
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        for b, seq in enumerate(sequences):
            ids[b, :len(seq)] = torch.tensor(seq)
        hidden = decoder(lm)(input_ids=ids.to(device)).last_hidden_state
    r, c = torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(cols, dtype=torch.long, device=device)
    logits = lm.get_output_embeddings()(hidden[r, c - 1 - start]).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    chosen = logp.gather(-1, torch.tensor(wanted, device=device).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1).detach()
    full = torch.zeros(len(sequences), width, device=device).index_put((r, c), chosen)
    ent = torch.zeros(len(sequences), width, device=device).index_put((r, c), entropy)
    return full, ent


def sequence_logprobs(model: Any, ids: list[int], temperature: float,
                      mask: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batch_logprobs` of one sequence: its [length] log-probabilities and entropies."""
    full, ent = batch_logprobs(model, [ids], temperature, None if mask is None else [mask])
    return full[0], ent[0]


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[0])) for r in rows])


def rollout_metrics(groups: list[list[Trajectory]]) -> dict[str, float]:
    """The paper's training dynamics from one step's episodes."""
    trajs = [t for g in groups for t in g]
    n = len(trajs)
    # as evaluation counts them (muarl.faults.credited_reward): a policy fault fails, a user or tool fault is out
    rewards = [[r for t in g if (r := credited_reward(t)) is not None] for g in groups]
    calls = Counter(r.name for t in trajs for r in t.tool_log if r.actor == "agent")
    return {
        "reward": sum(map(sum, rewards)) / max(1, sum(map(len, rewards))),
        "all_correct_groups": sum(bool(g) and all(r == 1.0 for r in g) for g in rewards) / len(groups),
        "all_wrong_groups": sum(bool(g) and all(r == 0.0 for r in g) for g in rewards) / len(groups),
        "turns": sum(t.turns for t in trajs) / n,
        "response_tokens": sum(sum(t.loss_mask) for t in trajs) / n,
        "sim_fault_rate": sum(t.sim_fault for t in trajs) / n,
        "fault_rate": sum(bool(t.fault_kind) for t in trajs) / n,
        "violation_rate": sum(bool(t.reward and t.reward.violations) for t in trajs) / n,
        "malformed_calls": sum(t.malformed_calls for t in trajs) / n,
        **{f"calls_{name}": calls[name] / n for name in ("think", "calculate", "transfer_to_human_agents")},
    }


def _micro_batches(batch: list[tuple[Trajectory, float]], config: GRPOConfig,
                   indices: list[int] | None = None) -> list[list[int]]:
    """Indices of ``batch`` (or of its ``indices``) in micro-batches of ``config.micro_batch_size``, sorted
    by length (little padding)."""
    size = max(1, config.micro_batch_size)
    order = sorted(range(len(batch)) if indices is None else indices, key=lambda i: len(batch[i][0].token_ids))
    return [order[i:i + size] for i in range(0, len(order), size)]


def shared_opening(trajs: list[Trajectory], config: GRPOConfig) -> list[int]:
    """The tokens all of ``trajs`` share before their first scored one (the system turn, and within a group
    often the first user message), when worth computing once (:mod:`muarl.train.shared_prefix`). Not in a
    sharded run (``fsdp``): the prefix's own forward and backward would be collectives that ranks with no
    sequence to score never reach."""
    if not config.shared_prefix or config.fsdp or len(trajs) < 2:
        return []
    n = common_prefix([t.token_ids for t in trajs], [t.loss_mask for t in trajs])
    return trajs[0].token_ids[:n] if n >= MIN_PREFIX else []


def reference_logprobs(model: Any, reference: Any, batch: list[tuple[Trajectory, float]],
                       config: GRPOConfig, dist: Dist | None = None) -> list[torch.Tensor]:
    """The frozen reference's log-probs of each of ``batch``'s sequences (0 where a token is not scored).

    The shared opening is run once for the whole batch; each micro-batch runs only what follows it.
    """
    params = trainable_parameters(model)
    precision = autocast(config.bf16, params[0].device if params else torch.device("cpu"))
    ref: list[torch.Tensor] = [torch.zeros(0)] * len(batch)
    opening = shared_opening([t for t, _ in batch], config)
    with torch.no_grad(), reference_mode(model, reference) as scorer:
        was_training = scorer.training
        scorer.eval()
        with precision:
            prefix = record_prefix(causal_lm(scorer), opening) if opening else None
            parts = _micro_batches(batch, config)
            passes = pass_count(scorer, len(parts), dist) if dist is not None else len(parts)
            for part in parts:
                scored = batch_logprobs(scorer, [batch[i][0].token_ids for i in part], config.temperature,
                                        [batch[i][0].loss_mask for i in part], prefix)[0]
                for row, i in enumerate(part):
                    ref[i] = scored[row, :len(batch[i][0].token_ids)]
            if passes > len(parts):  # a sharded scorer: as many passes as the busiest rank
                idle_passes(scorer, len(parts), passes, params[0].device if params else torch.device("cpu"),
                            backward=False)
        scorer.train(was_training)
    return ref


def _kl(traj: Trajectory, ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 KL of a trajectory's sampling log-probs to the reference's (float rounding below 0 is 0)."""
    return k3_kl(torch.tensor(traj.logprobs, dtype=torch.float64), ref.cpu().double()).clamp(min=0)


def skipped_sequences(batch: list[tuple[Trajectory, float]], ref: list[torch.Tensor] | None,
                      config: GRPOConfig) -> dict[int, float]:
    """Sequences of ``batch`` whose forward and backward the update can leave out, each with its summed
    KL to the reference over its agent tokens (k3, from its sampling log-probs; 0 without a KL term),
    which the update still logs.

    A sequence whose advantage is 0 adds nothing to the policy term's gradient; only its KL term can. It is
    skipped when that term is off (``kl_beta`` 0), or when its mean KL times ``kl_beta`` is at most
    ``config.zero_advantage_kl`` (a documented approximation; 0, the default, skips only what is exact).
    """
    if not config.skip_zero_advantage:
        return {}
    skip: dict[int, float] = {}
    for i, (traj, advantage) in enumerate(batch):
        if advantage != 0.0:
            continue
        if config.kl_beta == 0 or ref is None:
            skip[i] = 0.0
            continue
        mask = torch.tensor(traj.loss_mask, dtype=torch.float64)
        kl = float((_kl(traj, ref[i]) * mask).sum())
        if config.kl_beta * kl / max(float(mask.sum()), 1.0) <= config.zero_advantage_kl:
            skip[i] = kl
    return skip


def checkpointing(lm: Any) -> bool:
    """Whether activation checkpointing is on for ``lm`` (the attribute was renamed in transformers 5)."""
    return bool(getattr(lm, "is_activation_checkpointing", None) if hasattr(lm, "activation_checkpointing_enable")
                else getattr(lm, "is_gradient_checkpointing", False))


def set_checkpointing(model: Any, config: GRPOConfig, tokens: int) -> bool:
    """Activation checkpointing by need: on when ``config.gradient_checkpointing`` says so, or (None, the
    default) when the update's largest micro-batch (``tokens`` tokens) would keep activations above a
    quarter of the accelerator's free memory. Never by default on the CPU, where memory is the host's and
    recomputing every forward only costs time. Returns whether it is on."""
    lm = causal_lm(model)
    wanted = config.gradient_checkpointing
    if wanted is None:
        device = next(lm.parameters()).device
        if device.type != "cuda":
            wanted = False
        else:
            c = lm.config
            per_token = c.num_hidden_layers * (12 * c.hidden_size + 3 * c.intermediate_size) * 4  # bytes, fp32
            wanted = tokens * per_token > torch.cuda.mem_get_info(device)[0] / 4
    if wanted != checkpointing(lm):
        if wanted and hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif wanted:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif hasattr(lm, "activation_checkpointing_disable"):
            lm.activation_checkpointing_disable()
        else:
            lm.gradient_checkpointing_disable()
    return bool(wanted)


def policy_update(model: Any, reference: Any, optimizer: Any, algorithm: Any,
                  batch: list[tuple[Trajectory, float]], config: GRPOConfig, dist: Dist | None = None,
                  totals: tuple[float, float] | None = None,
                  ref: list[torch.Tensor] | None = None,
                  trainer_old: dict[int, torch.Tensor] | None = None,
                  first: bool = True) -> tuple[dict[str, float], float, float]:
    """One optimizer step on (trajectory, advantage) pairs; returns (stats, reference seconds, update seconds).

    ``batch`` is cut into micro-batches of ``config.micro_batch_size`` sequences (sorted by length, so
    rows of one forward pass waste little padding), each run forward and backward on its own, which
    bounds memory. Every micro-batch's loss is normalised by the whole update's agent-token count (and
    sequence count, for Dr.GRPO): the accumulated gradient is exactly that of the whole batch's
    token-mean loss. The batch's shared opening is computed once, its gradient gathered from every
    micro-batch (:mod:`muarl.train.shared_prefix`); sequences that carry no gradient are not run
    (:func:`skipped_sequences`), their KL and loss counted from their sampling log-probs. With several
    processes ``batch`` is this rank's share, ``totals`` the whole update's (tokens, sequences) and the
    gradients are summed over ranks before the step. Old log-probs are the ones stored at sampling time
    (the step is on-policy: ratio 1). ``reference`` None means LoRA: the reference is the model with its
    adapter disabled. ``ref``: the reference's log-probs of ``batch`` already computed
    (:func:`reference_logprobs`), so several updates on one batch score it once; with ``kl_beta`` 0 the
    reference is not needed and not computed.

    ``trainer_old`` holds, with ``config.tis_cap``, the trainer's own log-probs of each sequence from
    before the first update on this batch: it is filled when ``first`` (the log-probs that update
    computes anyway, detached). The ``first`` update's stats include the rollout-training mismatch (:mod:`muarl.algorithms.mismatch`);
    ``config.tis_cap`` takes the ratio against them and weighs tokens by truncated importance sampling.
    """
    dist = dist or Dist()
    trainer_old = {} if trainer_old is None else trainer_old
    params = trainable_parameters(model)
    tokens, sequences = totals or (float(sum(sum(t.loss_mask) for t, _ in batch)), float(len(batch)))
    precision = autocast(config.bf16, params[0].device if params else torch.device("cpu"))
    ref_s = 0.0
    if ref is None and config.kl_beta:
        began = time.perf_counter()
        ref = reference_logprobs(model, reference, batch, config, dist)
        ref_s = time.perf_counter() - began
    began = time.perf_counter()
    skip = skipped_sequences(batch, ref, config)
    run = [i for i in range(len(batch)) if i not in skip]
    parts = _micro_batches(batch, config, run)
    passes = pass_count(model, len(parts), dist)
    if parts:
        set_checkpointing(model, config, max(len(p) * len(batch[p[-1]][0].token_ids) for p in parts))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0}
    drift = [0.0, 0.0, 0.0]  # the sampler/trainer mismatch: summed KL, tokens outside, tokens
    for kl in skip.values():  # what the skipped sequences add to the logged loss and KL
        sums["kl"] += kl / max(tokens, 1.0)
        sums["loss"] += config.kl_beta * kl / max(tokens, 1.0)
    with precision:
        opening = shared_opening([batch[i][0] for i in run], config)
        shared = DetachedPrefix(record_prefix(causal_lm(model), opening)) if opening else None
    trained_tokens = float(sum(sum(batch[i][0].loss_mask) for i in run))
    for part in parts:
        trajs = [batch[i][0] for i in part]
        with precision:
            current, entropy = batch_logprobs(model, [t.token_ids for t in trajs], config.temperature,
                                              [t.loss_mask for t in trajs], shared.leaves if shared else None)
        width = current.shape[1]
        mask = _pad([torch.tensor(t.loss_mask, dtype=torch.float) for t in trajs], width).to(current.device)
        sampler = _pad([torch.tensor(t.logprobs) for t in trajs], width).to(current.device)
        if first:
            for k, value in enumerate(mismatch_sums(current, sampler, mask)):
                drift[k] += value
            if config.tis_cap:  # kept, on the device, for the later updates on this batch
                for row, i in enumerate(part):
                    trainer_old[i] = current[row, :len(batch[i][0].token_ids)].detach()
        before = _pad([trainer_old[i] for i in part], width) if config.tis_cap else None
        loss_batch = LossBatch(
            logprobs=current,
            old_logprobs=sampler if before is None else before,
            is_weights=None if before is None else truncated_is_weights(before, sampler, config.tis_cap),
            advantages=_pad([torch.full((len(t.token_ids),), batch[i][1]) for i, t in zip(part, trajs, strict=True)],
                            width).to(current.device),
            mask=mask,
            ref_logprobs=_pad([ref[i] for i in part], width).to(current.device) if ref is not None else None,
            total_tokens=tokens,
            total_sequences=sequences,
        )
        loss, loss_stats = algorithm.loss(loss_batch)
        loss.backward()
        sums["loss"] += float(loss.detach())
        sums["kl"] += loss_stats.kl
        sums["clip_fraction"] += loss_stats.clip_fraction
        sums["entropy"] += float((entropy * mask).sum()) / max(trained_tokens, 1.0)
    if shared is not None:
        shared.backward()
    if passes > len(parts):  # a sharded model: as many passes as the busiest rank
        idle_passes(model, len(parts), passes, params[0].device)
    for param in params:  # a gradient of 0, not none: AdamW's moments and weight decay move as in the plain update
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    if not is_sharded(model):  # a sharded model's gradients were reduce-scattered in backward
        dist.all_reduce_grads(params)
    norm = grad_norm(params, config.grad_clip)
    optimizer.step()
    model.eval()
    stats = {key: dist.sum(value) for key, value in sums.items()}
    stats.update(grad_norm=norm, update_tokens=tokens, skipped_sequences=dist.sum(float(len(skip))),
                 shared_prefix_tokens=float(len(opening)))
    if first:  # every rank sums, also one with nothing to run: a collective call
        kl, outside, measured = (dist.sum(value) for value in drift)
        if measured:
            stats.update(mismatch_kl=kl / measured, mismatch_outside=outside / measured)
    return stats, ref_s, time.perf_counter() - began


def update_on_rollouts(model: Any, reference: Any, optimizer: Any, algorithm: Any,
                       batch: list[tuple[Trajectory, float]], config: GRPOConfig, dist: Dist | None = None,
                       totals: tuple[float, float] | None = None) -> tuple[dict[str, float], float, float]:
    """``config.num_iterations`` optimizer steps on one step's rollouts (GRPO's mu; verl's ppo_epochs).

    Rollouts are the expensive part of a step (on the CPU demo about 55 s against 4 s for an update), so
    reusing them for several updates buys more learning per episode. The old log-probs stay the sampling
    ones, so from the second update on the ratio leaves 1 and the clip bounds how far a step can move.
    The reference does not change, so its log-probs are computed once for all the updates (and not at
    all with ``kl_beta`` 0); nor do the trainer's pre-update log-probs, kept from the first update for
    the mismatch and truncated importance sampling. Returns each stat averaged over the updates that
    report it (the mismatch: the first), the reference seconds and the summed update seconds.
    """
    began = time.perf_counter()
    ref = reference_logprobs(model, reference, batch, config, dist) if config.kl_beta else None
    ref_s = time.perf_counter() - began
    trainer_old: dict[int, torch.Tensor] = {}
    runs = [policy_update(model, reference, optimizer, algorithm, batch, config, dist, totals, ref, trainer_old,
                          first=iteration == 0) for iteration in range(config.num_iterations)]
    keys = dict.fromkeys(key for run in runs for key in run[0])
    stats = {key: sum(run[0][key] for run in runs if key in run[0]) / sum(key in run[0] for run in runs)
             for key in keys}
    return stats, ref_s, sum(run[2] for run in runs)


def train_grpo(config: GRPOConfig, progress: bool = True) -> dict[str, Any]:
    """Run GRPO; writes ``out/model``, ``metrics.jsonl``, ``config.json``, ``rollouts/step_N.jsonl``,
    ``checkpoints/step_N/`` and the chosen trackers' logs (TensorBoard by default).

    Resumes from the newest checkpoint in ``out`` unless ``config.resume`` is False (see
    :mod:`muarl.train.run`); the resumed run's metrics and weights equal an uninterrupted run's. Under
    ``accelerate launch`` / ``torchrun`` each process plays its share of every step's groups and only
    rank 0 writes files.
    """
    check_report_to(config.report_to)
    dist = setup(config.device, group=config.fsdp)
    if config.max_staleness and dist.world > 1:
        raise ValueError("--max-staleness runs in one training process for now (its groups are played in a "
                         "thread of the process)")
    check_rollout_engine(config)  # no vLLM, no server: one line before the run directory exists
    domain = get_domain(config.domain)
    # a bridged domain's record names its package version and a digest of the data files it read
    run = open_run(config, dist, {"domain": domain_record(domain)})
    # a sharded run starts from --model and loads its checkpoint's shards below
    model, reference, tokenizer = load_trainable(config, str(dist.device), None if config.fsdp else run.resume_from,
                                                 want_reference=True)
    # a sharded or asynchronous run samples from a copy of the weights that follows them after every update
    plain = copy.deepcopy(model) if config.fsdp or config.max_staleness else None
    if config.fsdp:
        shard_for_training(model, reference, config, dist)
    model.eval()
    user = make_user(config.user, http_timeout=config.user_http_timeout, max_tokens=config.user_max_tokens)
    episode = config.episode_config()  # as the paper trains: required outputs not graded
    algorithm = get_algorithm(config.algorithm, clip_low=config.clip_low, clip_high=config.clip_high,
                              kl_beta=config.kl_beta)
    optimizer = make_optimizer(trainable_parameters(model), config)
    history: list[dict[str, Any]] = []
    if run.resume_from is not None:  # last: restores the random generators as they were at the save
        state = load_trainer_state(run.resume_from, dist, any_world=config.fsdp)
        if config.fsdp:
            load_shards(model, optimizer, run.resume_from / SHARDS)
        else:
            optimizer.load_state_dict(state["optimizer"])
        history = state["metrics"]
    trackers = Trackers(run.out, config.report_to, asdict(config), history, enabled=dist.main, name="grpo")
    tasks = domain.tasks(config.split)
    order = random.Random(config.seed).sample(tasks, len(tasks))
    console = Console() if progress and dist.main else None
    sampler = (make_sampler(config, model, tokenizer, dist) if plain is None  # servers: rank 0 pushes, all sample
               else CopySampler(config, model, plain, tokenizer, dist))
    stream = None
    try:
        sampler.check(model, domain)  # an engine on other weights: one line before a step trains on its episodes
        # the data position: tasks played so far (each step's count is in its metrics, restored on resume)
        cursor = sum(int(r.get("tasks_played", config.tasks_per_step)) for r in history)
        warned = False
        if config.max_staleness:  # --max-staleness: groups played in a thread of their own (async_rollouts)
            stream = RolloutStream(sampler, domain, user, episode, config.group_size, order, cursor,
                                   per_step=config.tasks_per_step, staleness=config.max_staleness,
                                   group_seed=lambda position: _step_seed(config.seed, position, 0),
                                   policy_seed=_step_seed(config.seed, run.start_step)).start()
        for step in range(run.start_step, config.steps):
            began = time.perf_counter()
            model.eval()

            def play(chosen: list[Task], batch_no: int, step: int = step) -> list[list[Trajectory]]:
                policy = sampler.policy(_step_seed(config.seed, step, batch_no))
                engine = RolloutEngine(domain, policy, user, episode, group_size=config.group_size,
                                       common_user_seed=True, seed=config.seed, progress=console is not None)
                local = dist.share(chosen)
                gathered = dist.gather(asyncio.run(engine.run(local)) if local else [])
                return [gathered[g % dist.world][g // dist.world] for g in range(len(chosen))]

            before, asynchrony = cursor, {}
            if stream is None:
                groups, rewards, keep, cursor = collect_groups(play, order, cursor, config)
            else:
                groups, rewards, keep, cursor, asynchrony = take_step(stream, cursor, config, lambda t: train_reward(
                    t, config.penalize_violations, config.violation_reward))
            require_unfaulted((t for g in groups for t in g), f"GRPO step {step + 1}")
            rollout_s = time.perf_counter() - began
            advantages = algorithm.advantages(rewards)
            masked = [[(config.mask_sim_faults and bool(t.fault_kind))
                       or (config.mask_truncated and t.stop_reason == "turn_token_limit") for t in group]
                      for group in groups]
            trained = [[bool(keep[g]) and bool(sum(t.loss_mask)) and not masked[g][m] for m, t in enumerate(group)]
                       for g, group in enumerate(groups)]
            batch = [(g, t, float(advantages[g, m])) for g, group in enumerate(groups) for m, t in enumerate(group)
                     if trained[g][m]]
            stats, ref_s, update_s = {}, 0.0, 0.0
            if batch:
                totals = (float(sum(sum(t.loss_mask) for _, t, _ in batch)), float(len(batch)))
                share = [(t, a) for g, t, a in batch if g % dist.world == dist.rank]
                sampler.release()  # --vllm-sleep: the engine's GPU memory goes to the update until the sync
                stats, ref_s, update_s = update_on_rollouts(model, reference, optimizer, algorithm, share, config,
                                                            dist, totals)
                stats["sync_s"] = sampler.sync(model) if stream is None else stream.sync(model)
                warning = mismatch_warning(step + 1, stats.get("mismatch_kl", 0.0), stats.get("mismatch_outside", 0.0))
                # asynchronous: the mismatch includes the policy's own lag (up to N updates), not only the engine's
                if warning and dist.main and not warned and stream is None:  # once per run, not every step
                    print(warning, file=sys.stderr)
                    warned = True
            if dist.main:
                _write_rollouts(run.out, step + 1, groups, advantages, trained)
            tokens = sum(len(t.token_ids) for g in groups for t in g)
            record = {"step": step + 1, **rollout_metrics(groups), **stats, **asynchrony,
                      "trained_sequences": len(batch), "tasks_played": cursor - before, "trained_groups": int(keep.sum()),
                      "rollout_s": rollout_s, "reference_s": ref_s, "update_s": update_s,
                      "tokens_per_s": tokens / max(rollout_s + ref_s + update_s, 1e-9)}
            history.append(record)
            trackers.log(record, step + 1)
            if console is not None:
                console.print(f"[bold]grpo step {step + 1}/{config.steps}[/bold] reward {record['reward']:.3f} "
                              f"loss {record.get('loss', 0.0):+.4f} kl {record.get('kl', 0.0):.4f} "
                              f"trained {len(batch)} in {rollout_s + ref_s + update_s:.1f} s")
            if (config.save_every and (step + 1) % config.save_every == 0) or step + 1 == config.steps:
                if config.fsdp:  # the weights and optimizer state are sharded: every rank writes its shards
                    save_checkpoint(run.out, step + 1, dist, lambda d: None, {"step": step + 1, "metrics": history},
                                    keep=config.keep_checkpoints,
                                    write_shards=lambda d: save_shards(model, optimizer, d / SHARDS))
                else:
                    save_checkpoint(run.out, step + 1, dist, lambda d: write_weights(model, tokenizer, d),
                                    {"step": step + 1, "optimizer": optimizer.state_dict(), "metrics": history},
                                    keep=config.keep_checkpoints)
    finally:
        if stream is not None:
            stream.close()
        trackers.close()
        sampler.close()
    if config.fsdp:
        checkpoint, model = save_final_sharded(run.out, model, tokenizer, config, dist)
    else:
        checkpoint = save_final(run.out, model, tokenizer, config.merge_lora) if dist.main else run.out / "model"
    dist.barrier()
    return {"steps": len(history), "checkpoint": str(checkpoint), "metrics": history, "model": model}


def train_reward(traj: Trajectory, penalize_violations: bool = False, violation_reward: float = 0.0) -> float:
    """The reward GRPO trains on: the episode's binary reward, or ``violation_reward`` if it broke a rule and
    that is penalized (whether or not its database was right)."""
    if traj.reward is None:
        return 0.0
    return violation_reward if penalize_violations and traj.reward.violations else traj.reward.reward


def collect_groups(play: Callable[[list[Task], int], list[list[Trajectory]]], order: list[Task], cursor: int,
                   config: GRPOConfig) -> tuple[list[list[Trajectory]], torch.Tensor, torch.Tensor, int]:
    """One step's groups: ``play`` the ``tasks_per_step`` tasks of ``order`` from ``cursor`` on (wrapping).

    With dynamic sampling (DAPO), groups whose members all scored alike carry no advantage, so further
    batches are played until ``tasks_per_step`` groups are informative or ``max_rollout_batches`` were
    played, and the update keeps the first ``tasks_per_step`` informative ones. Returns (groups, their
    training rewards, which groups the update keeps, the new cursor).
    """
    groups: list[list[Trajectory]] = []
    for batch_no in range(config.max_rollout_batches if config.dynamic_sampling else 1):
        chosen = [order[(cursor + k) % len(order)] for k in range(config.tasks_per_step)]
        cursor += len(chosen)
        groups += play(chosen, batch_no)
        rewards = torch.tensor([[train_reward(t, config.penalize_violations, config.violation_reward) for t in g] for g in groups])
        if int(informative_groups(rewards).sum()) >= config.tasks_per_step:
            break
    if not config.dynamic_sampling:
        return groups, rewards, torch.ones(len(groups), dtype=torch.bool), cursor
    informative = informative_groups(rewards)
    return groups, rewards, informative & (informative.cumsum(0) <= config.tasks_per_step), cursor


def _step_seed(seed: int, step: int, batch: int = 0) -> int:
    """The policy's sampling seed for one batch of tasks of one step (batches after the first: refills)."""
    key = f"{seed}:step:{step}" + (f":batch:{batch}" if batch else "")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


def _write_rollouts(out: Path, step: int, groups: list[list[Trajectory]], advantages: torch.Tensor,
                    trained: list[list[bool]]) -> Path:
    """``out/rollouts/step_{step:06d}.jsonl``: every episode of the step with its group, member and advantage.

    Written whole and renamed into place, so a reader (the viewer) never sees half a step.
    """
    folder = out / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for g, group in enumerate(groups):
            for m, traj in enumerate(group):
                traj.metadata.update(step=step, group=g, member=m, advantage=float(advantages[g, m]),
                                     trained=trained[g][m])
                f.write(traj.model_dump_json() + "\n")
    tmp.replace(path)
    return path


def preset(name: str, **overrides: Any) -> GRPOConfig:
    return from_preset(PRESETS, name, "GRPO", **overrides)
