"""A copying warm-up for a model that starts from random weights: random token spans, each shown twice.

Tool use is copying: the email the user just typed goes into ``find_user_id_by_email``, the order id
from the first message into ``cancel_pending_order``. A transformer copies with induction heads
(attend to the token after the previous occurrence of the current token, and repeat it), and a model
trained from random weights on a few hundred conversations does not form them: it learns the format
and writes identifiers it memorized instead of the ones in front of it. On sequences of random tokens
whose second half repeats the first, with the loss on the repeat, induction heads form in about a
hundred steps of a tiny model, so the demo runs this before SFT. It teaches no domain knowledge: the
tokens are uniform over the vocabulary. A pretrained model needs none of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class CopyConfig:
    """The warm-up's size: ``steps`` batches of ``batch`` sequences of a ``span``-token span twice."""

    steps: int = 200
    batch: int = 32
    span: int = 48
    lr: float = 3e-3
    seed: int = 0


def copy_batch(vocab: range, config: CopyConfig, generator: torch.Generator) -> torch.Tensor:
    """[batch, 2 * span] token ids: a random span followed by the same span."""
    span = torch.randint(vocab.start, vocab.stop, (config.batch, config.span), generator=generator)
    return torch.cat([span, span], dim=1)


def copy_loss(model: Any, ids: torch.Tensor, span: int) -> tuple[torch.Tensor, float]:
    """Cross-entropy on the repeated half (its first token is unpredictable, so it is left out), and accuracy."""
    logits = model(input_ids=ids).logits[:, span:-1].float()
    targets = ids[:, span + 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss, float((logits.argmax(-1) == targets).float().mean())


def copy_warmup(model_dir: str | Path, out: str | Path, config: CopyConfig | None = None,
                progress: Any = None) -> list[dict[str, float]]:
    """Train the model in ``model_dir`` on the copying task; save it (with its tokenizer) to ``out``.

    Returns the per-step records, which also go to ``out/copy_metrics.jsonl``. The tokens drawn skip the
    tokenizer's special tokens, so the chat-template markers keep their roles.
    """
    from muarl.models import load

    config = config or CopyConfig()
    model, tokenizer = load(model_dir)
    model.train()
    first = max(tokenizer.all_special_ids or [0]) + 1
    vocab = range(first, len(tokenizer))
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    history = []
    for step in range(1, config.steps + 1):
        loss, accuracy = copy_loss(model, copy_batch(vocab, config, generator), config.span)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        history.append({"step": step, "loss": float(loss.detach()), "copy_accuracy": accuracy})
        if progress is not None:
            progress(history[-1])
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "copy_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    return history
