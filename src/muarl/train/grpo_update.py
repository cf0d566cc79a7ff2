"""The GRPO update: optimizer steps on one step's (trajectory, advantage) pairs.

Micro-batched forwards and backwards whose accumulated gradient is the whole batch's token-mean loss; the
sequences that carry no gradient left out (:func:`skipped_sequences`); activation checkpointing by need
(:func:`set_checkpointing`); the rollout-training mismatch measured, kept out of the ratio (the trainer's own
old log-probs where engine and trainer differ: :func:`recomputes_old_logprobs`) and, with ``tis_cap``,
corrected; several updates on one batch (:func:`update_on_rollouts`, GRPO's mu).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from muarl.algorithms import LossBatch
from muarl.algorithms.common import k3_kl
from muarl.algorithms.mismatch import mismatch_sums, truncated_is_weights
from muarl.models import causal_lm
from muarl.train.distributed import Dist, compute_device
from muarl.train.grpo_config import GRPOConfig
from muarl.train.precision import autocast
from muarl.train.scoring import batch_logprobs, micro_batches, reference_logprobs, shared_opening
from muarl.train.sharding import grad_norm, idle_passes, is_sharded, pass_count
from muarl.train.shared_prefix import DetachedPrefix, record_prefix
from muarl.train.weights import trainable_parameters
from muarl.types import Trajectory


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[0])) for r in rows])


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


def set_checkpointing(model: Any, config: GRPOConfig, tokens: int,
                      device: torch.device | None = None) -> bool:
    """Activation checkpointing by need: on when ``config.gradient_checkpointing`` says so, or (None, the
    default) when the update's largest micro-batch (``tokens`` tokens) would keep activations above a
    quarter of the accelerator's free memory. Never by default on the CPU, where memory is the host's and
    recomputing every forward only costs time. ``device``: where the forwards compute, the run's
    (:func:`~muarl.train.distributed.compute_device`; None: the parameters'). Returns whether it is on."""
    lm = causal_lm(model)
    wanted = config.gradient_checkpointing
    if wanted is None:
        device = device if device is not None else compute_device(lm)
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


def recomputes_old_logprobs(config: GRPOConfig, trainer_bf16: bool) -> bool:
    """Whether the PPO ratio's denominator, the old log-probs, is the trainer's own (from before the first
    update on the batch) rather than the rollout engine's: the one place this is decided.

    The engine's log-probs are the trainer's only when the engine is the trainer's own model in float32
    (muarl's engine, ``hf``, without bf16): the mismatch is then float noise (1e-12) and they serve as the
    old log-probs. With any other engine (vLLM, in this process or a server: other kernels, dtype and
    batching) or bf16 forwards the mismatch alone moves the ratio, and a token whose two probabilities
    differ by more than the clip is clipped, its gradient gone, before the policy has moved: a biased
    update. There the trainer's log-probs are the old ones (verl's recomputed ``old_log_prob``), and the
    engine's enter only the importance weights (``--tis-cap``, whose weight is trainer over engine: it
    needs them, so it turns this on). ``config.recompute_old_logprobs`` forces it on or off.
    ``trainer_bf16``: the update's forwards autocast to bfloat16."""
    if config.tis_cap:
        return True
    if config.recompute_old_logprobs is not None:
        return bool(config.recompute_old_logprobs)
    return config.rollout_engine != "hf" or trainer_bf16


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
    gradients are summed over ranks before the step. The old log-probs are the trainer's own where engine
    and trainer differ in numerics (:func:`recomputes_old_logprobs`; the first update's ratio is then 1),
    else the ones stored at sampling time. ``reference`` None means LoRA: the reference is the model with its
    adapter disabled. ``ref``: the reference's log-probs of ``batch`` already computed
    (:func:`~muarl.train.scoring.reference_logprobs`), so several updates on one batch score it once;
    with ``kl_beta`` 0 the reference is not needed and not computed.

    ``trainer_old`` holds, where :func:`recomputes_old_logprobs`, the trainer's own log-probs of each
    sequence from before the first update on this batch: it is filled when ``first`` (the log-probs that
    update computes anyway, detached: no extra forward), and the ratio is taken against them. The ``first``
    update's stats include the rollout-training mismatch (:mod:`muarl.algorithms.mismatch`);
    ``config.tis_cap`` also weighs tokens by truncated importance sampling (trainer over engine).
    """
    device = compute_device(model, dist)  # the run's: under --fsdp-offload the parameters sit on the CPU
    dist = dist or Dist(device=device)
    trainer_old = {} if trainer_old is None else trainer_old
    params = trainable_parameters(model)
    tokens, sequences = totals or (float(sum(sum(t.loss_mask) for t, _ in batch)), float(len(batch)))
    precision = autocast(config.bf16, device)
    recompute = recomputes_old_logprobs(config, isinstance(precision, torch.autocast))
    ref_s = 0.0
    if ref is None and config.kl_beta:
        began = time.perf_counter()
        ref = reference_logprobs(model, reference, batch, config, dist)
        ref_s = time.perf_counter() - began
    began = time.perf_counter()
    skip = skipped_sequences(batch, ref, config)
    run = [i for i in range(len(batch)) if i not in skip]
    parts = micro_batches(batch, config, run)
    passes = pass_count(model, len(parts), dist)
    if parts:
        set_checkpointing(model, config, max(len(p) * len(batch[p[-1]][0].token_ids) for p in parts),
                          device)
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
    # every rank's: the logged entropy is a mean over the whole step's trained tokens, not a sum of ranks' means
    trained_tokens = dist.sum(float(sum(sum(batch[i][0].loss_mask) for i in run)))
    phases = PhaseClock(device)  # the trainer's split (muarl.time_split): scoring, backward, optimizer
    for part in parts:
        trajs = [batch[i][0] for i in part]
        phases.start()
        with precision:
            current, entropy = batch_logprobs(model, [t.token_ids for t in trajs], config.temperature,
                                              [t.loss_mask for t in trajs], shared.leaves if shared else None,
                                              device)
        width = current.shape[1]
        mask = _pad([torch.tensor(t.loss_mask, dtype=torch.float) for t in trajs], width).to(current.device)
        sampler = _pad([torch.tensor(t.logprobs) for t in trajs], width).to(current.device)
        if first:
            for k, value in enumerate(mismatch_sums(current, sampler, mask)):
                drift[k] += value
            if recompute:  # the old log-probs, kept on the device for the later updates on this batch
                for row, i in enumerate(part):
                    trainer_old[i] = current[row, :len(batch[i][0].token_ids)].detach()
        before = _pad([trainer_old[i] for i in part], width) if recompute else None
        loss_batch = LossBatch(
            logprobs=current,
            old_logprobs=sampler if before is None else before,  # the engine's only where they are the trainer's
            is_weights=truncated_is_weights(before, sampler, config.tis_cap) if config.tis_cap else None,
            advantages=_pad([torch.full((len(t.token_ids),), batch[i][1]) for i, t in zip(part, trajs, strict=True)],
                            width).to(current.device),
            mask=mask,
            ref_logprobs=_pad([ref[i] for i in part], width).to(current.device) if ref is not None else None,
            total_tokens=tokens,
            total_sequences=sequences,
        )
        loss, loss_stats = algorithm.loss(loss_batch)
        phases.lap("scoring_s")
        loss.backward()
        phases.lap("backward_s")
        sums["loss"] += float(loss.detach())
        sums["kl"] += loss_stats.kl
        sums["clip_fraction"] += loss_stats.clip_fraction
        sums["entropy"] += float((entropy * mask).sum()) / max(trained_tokens, 1.0)
    phases.start()
    if shared is not None:
        shared.backward()
    if passes > len(parts):  # a sharded model: as many passes as the busiest rank
        idle_passes(model, len(parts), passes, device)
    phases.lap("backward_s")
    for param in params:  # a gradient of 0, not none: AdamW's moments and weight decay move as in the plain update
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    if not is_sharded(model):  # a sharded model's gradients were reduce-scattered in backward
        dist.all_reduce_grads(params)
    norm = grad_norm(params, config.grad_clip)
    optimizer.step()
    phases.lap("optimizer_s")
    model.eval()
    stats = {key: dist.sum(value) for key, value in sums.items()}
    stats.update(phases.seconds)  # this rank's own
    stats.update(grad_norm=norm, update_tokens=tokens, skipped_sequences=dist.sum(float(len(skip))),
                 shared_prefix_tokens=float(len(opening)))
    if not dist.sum(float(len(run))):  # no sequence ran forward and backward on any rank: a 0 here would read as
        # a collapse; what only those passes compute is absent (loss and KL too where no KL term made them)
        for key in ("entropy", "clip_fraction", "grad_norm", *(() if config.kl_beta else ("loss", "kl"))):
            stats.pop(key)
    if first:  # every rank sums, also one with nothing to run: a collective call
        kl, outside, measured = (dist.sum(value) for value in drift)
        if measured:
            stats.update(mismatch_kl=kl / measured, mismatch_outside=outside / measured)
    return stats, ref_s, time.perf_counter() - began


class PhaseClock:
    """Seconds per trainer phase of one update, on ``device``'s clock: a GPU's queued kernels are waited
    for at each lap (a few synchronisations per micro-batch, next to its backward pass), or the
    optimizer's time would land in whatever reads a result next."""

    PHASES = ("scoring_s", "backward_s", "optimizer_s")

    def __init__(self, device: Any):
        self.cuda = torch.device(device).type == "cuda"
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self.mark = time.perf_counter()

    def start(self) -> None:
        self._sync()
        self.mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        self._sync()
        now = time.perf_counter()
        self.seconds[phase] += now - self.mark
        self.mark = now

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def update_on_rollouts(model: Any, reference: Any, optimizer: Any, algorithm: Any,
                       batch: list[tuple[Trajectory, float]], config: GRPOConfig, dist: Dist | None = None,
                       totals: tuple[float, float] | None = None) -> tuple[dict[str, float], float, float]:
    """``config.num_iterations`` optimizer steps on one step's rollouts (GRPO's mu; verl's ppo_epochs).

    Rollouts are the expensive part of a step (on the CPU demo about 55 s against 4 s for an update), so
    reusing them for several updates buys more learning per episode. The old log-probs stay those of
    before the first update (the trainer's or the engine's, :func:`recomputes_old_logprobs`), so from the
    second update on the ratio leaves 1 and the clip bounds how far a step can move. The reference does
    not change, so its log-probs are computed once for all the updates (and not at all with ``kl_beta``
    0); nor do the trainer's pre-update log-probs, kept from the first update as the old log-probs and for
    truncated importance sampling. Returns each stat averaged over the updates that
    report it (the mismatch: the first), the reference seconds and the summed update seconds.
    """
    began = time.perf_counter()
    ref = reference_logprobs(model, reference, batch, config, dist) if config.kl_beta else None
    ref_s = time.perf_counter() - began
    trainer_old: dict[int, torch.Tensor] = {}
    runs = [policy_update(model, reference, optimizer, algorithm, batch, config, dist, totals, ref, trainer_old,
                          first=iteration == 0) for iteration in range(config.num_iterations)]
    keys = dict.fromkeys(key for run in runs for key in run[0])
    stats = {key: sum(run[0][key] for run in runs if key in run[0])
             / (1 if key in PhaseClock.PHASES else sum(key in run[0] for run in runs))  # seconds add up
             for key in keys}
    return stats, ref_s, sum(run[2] for run in runs)
