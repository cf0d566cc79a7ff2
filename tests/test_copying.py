"""The copying warm-up gives a random-init model induction heads: it learns to repeat unseen spans."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from muarl.models import load, tiny_path
from muarl.tiny_model import TinyConfig, build
from muarl.train.copying import CopyConfig, copy_batch, copy_loss, copy_warmup


def test_copy_batch_repeats_its_span_and_skips_special_tokens() -> None:
    ids = copy_batch(range(10, 50), CopyConfig(batch=4, span=6), torch.Generator().manual_seed(0))
    assert ids.shape == (4, 12)
    assert torch.equal(ids[:, :6], ids[:, 6:])
    assert int(ids.min()) >= 10 and int(ids.max()) < 50


@pytest.mark.slow
def test_warmup_teaches_copying_of_spans_never_seen(tmp_path: Path) -> None:
    model_dir = build(tmp_path / "random", TinyConfig(seed=1), tokenizer=AutoTokenizer.from_pretrained(tiny_path()))
    config = CopyConfig(steps=150, batch=16, span=24, seed=3)
    fresh = torch.Generator().manual_seed(12345)  # spans the warm-up never drew
    vocab = range(10, 4096)
    probe = copy_batch(vocab, config, fresh)
    model, _ = load(model_dir)
    with torch.no_grad():
        _, before = copy_loss(model, probe, config.span)
    history = copy_warmup(model_dir, tmp_path / "warm", config)
    warmed, _ = load(tmp_path / "warm")
    with torch.no_grad():
        _, after = copy_loss(warmed, probe, config.span)
    assert before < 0.05
    assert after > 0.5, f"copy accuracy {after:.2f} after {config.steps} steps"
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    assert (tmp_path / "warm" / "copy_metrics.jsonl").read_text().count("\n") == config.steps
