"""Scoring sequences under a model: the per-token log-probabilities (and entropies) of the agent's tokens,
for the update, for the frozen reference and for checking a rollout engine against the trainer.

What a scored batch shares is computed once: its common opening (the system turn) through
:mod:`muarl.train.shared_prefix`, and the output head only on the positions that predict agent tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from muarl.models import causal_lm
from muarl.train.distributed import Dist, compute_device
from muarl.train.grpo_config import GRPOConfig
from muarl.train.precision import autocast
from muarl.train.sharding import decoder, idle_passes, pass_count
from muarl.train.shared_prefix import MIN_PREFIX, Prefix, common_prefix, hidden_after_prefix, record_prefix
from muarl.train.weights import reference_mode
from muarl.types import Trajectory


def batch_logprobs(model: Any, sequences: list[list[int]], temperature: float,
                   masks: list[list[int]] | None = None,
                   prefix: Prefix | None = None,
                   device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities of several sequences in one forward pass, and each prediction's entropy.

    Returns two [sequences, longest] tensors (0 where a position is not scored or is padding). Rows are
    right-padded, which needs no attention mask: under causal attention a real token never sees the
    padding after it. Only positions where the mask is 1 are scored: the output head runs on the hidden
    states that predict agent tokens only, a few percent of these conversations, so the vocabulary-sized
    logits are never built for the long prompt. ``prefix``: the sequences' shared opening, already run
    (:mod:`muarl.train.shared_prefix`); only what follows it is computed here. Works on a plain causal
    LM and on a peft (LoRA) model. ``device``: where the forward computes, the run's
    (:func:`~muarl.train.distributed.compute_device`; under ``--fsdp-offload`` not the parameters', which
    stay on the CPU); None: the parameters'.
    """
    lm = causal_lm(model)
    device = device if device is not None else compute_device(lm)
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
                      mask: list[int] | None = None,
                      device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batch_logprobs` of one sequence: its [length] log-probabilities and entropies."""
    full, ent = batch_logprobs(model, [ids], temperature, None if mask is None else [mask], device=device)
    return full[0], ent[0]


def micro_batches(batch: list[tuple[Trajectory, float]], config: GRPOConfig,
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

    The shared opening is run once for the whole batch; each micro-batch runs only what follows it. The
    forwards compute on the run's device (``dist``'s; :func:`~muarl.train.distributed.compute_device`).
    """
    device = compute_device(model, dist)
    precision = autocast(config.bf16, device)
    ref: list[torch.Tensor] = [torch.zeros(0)] * len(batch)
    opening = shared_opening([t for t, _ in batch], config)
    with torch.no_grad(), reference_mode(model, reference) as scorer:
        was_training = scorer.training
        scorer.eval()
        with precision:
            prefix = record_prefix(causal_lm(scorer), opening) if opening else None
            parts = micro_batches(batch, config)
            passes = pass_count(scorer, len(parts), dist) if dist is not None else len(parts)
            for part in parts:
                scored = batch_logprobs(scorer, [batch[i][0].token_ids for i in part], config.temperature,
                                        [batch[i][0].loss_mask for i in part], prefix, device)[0]
                for row, i in enumerate(part):
                    ref[i] = scored[row, :len(batch[i][0].token_ids)]
            if passes > len(parts):  # a sharded scorer: as many passes as the busiest rank
                idle_passes(scorer, len(parts), passes, device, backward=False)
        scorer.train(was_training)
        lm = causal_lm(scorer)
        if hasattr(lm, "reshard"):  # a sharded root stays gathered after a forward (for a backward that never comes)
            lm.reshard()
    return ref
