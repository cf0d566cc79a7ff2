"""Supervised fine-tuning on synthesized conversations: the cold start before GRPO.

Top to bottom: load the model and the chat-format data set, tokenize every conversation exactly as an
episode would (loss on the assistant's own tokens only), then for each epoch shuffle, cut into batches
of ``batch_size`` conversations, pack each batch into rows, accumulate the token-mean loss over the
rows, clip, step AdamW and the cosine schedule, log. The result is an ordinary HF checkpoint.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from muarl.chat import ChatFormat
from muarl.synth import from_chat_record
from muarl.train import from_preset, save_model, start_run
from muarl.train.data import Example, tokenize_conversation
from muarl.train.packing import collate, plan_rows, token_loss
from muarl.types import ToolSpec


@dataclass
class SFTConfig:
    """SFT settings; see :data:`PRESETS` for the paper's and the CPU demo's."""

    model: str = "tiny"
    data: list[str] = field(default_factory=list)
    out: str = "runs/sft"
    epochs: int = 2
    lr: float = 5e-6
    weight_decay: float = 0.0
    warmup_steps: int = 0
    batch_size: int = 128  # conversations per optimizer step
    max_len: int = 16384  # tokens per packed row
    grad_clip: float = 1.0
    packing: bool = True
    seed: int = 0


#: ``paper``: MUA-RL's cold start (AdamW, lr 5e-6 with cosine decay, 2 epochs, batch 128).
#: ``tiny``: the embedded model on a CPU, which starts from random weights and needs a far larger lr.
PRESETS: dict[str, SFTConfig] = {
    "paper": SFTConfig(),
    "tiny": SFTConfig(epochs=3, lr=3e-3, batch_size=8, warmup_steps=2),
}


def load_examples(paths: list[str], tokenizer: Any) -> list[Example]:
    """Tokenize every conversation of the data set files (one chat format per distinct tool set)."""
    formats: dict[str, ChatFormat] = {}
    examples = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = json.dumps(record["tools"], sort_keys=True)
                if key not in formats:
                    specs = [ToolSpec(name=t["function"]["name"], description=t["function"].get("description", ""),
                                      parameters=t["function"].get("parameters", {})) for t in record["tools"]]
                    formats[key] = ChatFormat(tokenizer, specs)
                examples.append(tokenize_conversation(formats[key], from_chat_record(record)))
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{n}: not a usable chat record: {err}") from None
    if not examples:
        raise ValueError(f"no conversations in {paths}")
    return examples


def cosine(step: int, total: int, warmup: int) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_sft(config: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Run SFT; writes ``out/model`` (checkpoint), ``out/metrics.jsonl`` and ``out/config.json``."""
    out, model, tokenizer = start_run(config)
    model.train()
    examples = load_examples(config.data, tokenizer)
    longest = max(len(e) for e in examples)
    max_len = max(config.max_len, longest)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine(s, total_steps, config.warmup_steps))
    rng = random.Random(config.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    history: list[dict[str, Any]] = []
    step = 0
    with (out / "metrics.jsonl").open("w") as log, _bar(progress, total_steps) as advance:
        for epoch in range(config.epochs):
            order = list(range(len(examples)))
            rng.shuffle(order)
            for start in range(0, len(order), config.batch_size):
                batch = [examples[i] for i in order[start:start + config.batch_size]]
                began = time.perf_counter()
                rows = plan_rows([len(e) for e in batch], max_len) if config.packing else [[i] for i in range(len(batch))]
                targets = sum(sum(e.mask[1:]) for e in batch)
                loss_sum, padding = 0.0, []
                optimizer.zero_grad(set_to_none=True)
                for row in rows:  # gradient accumulation: one packed row per forward pass
                    micro = collate(batch, [row], pad)
                    total, _ = token_loss(model, micro)
                    (total / targets).backward()
                    loss_sum += float(total.detach())
                    padding.append(micro.padding_fraction)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
                optimizer.step()
                schedule.step()
                step += 1
                record = {"step": step, "epoch": epoch, "loss": loss_sum / targets, "lr": schedule.get_last_lr()[0],
                          "grad_norm": grad_norm, "target_tokens": targets, "rows": len(rows),
                          "padding": sum(padding) / len(padding),
                          "tokens_per_s": sum(len(e) for e in batch) / (time.perf_counter() - began)}
                log.write(json.dumps(record) + "\n")
                log.flush()
                history.append(record)
                advance(record)
    checkpoint = save_model(out, model, tokenizer)
    return {"steps": step, "first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
            "checkpoint": str(checkpoint)}


class _bar:
    """A rich progress bar over optimizer steps (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda record: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[stats]}"))
        self.progress.__enter__()
        task = self.progress.add_task("sft", total=self.total, stats="")
        return lambda r: self.progress.update(task, advance=1, stats=f"loss {r['loss']:.3f} lr {r['lr']:.2e}")

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.progress.__exit__(*exc)


def preset(name: str, **overrides: Any) -> SFTConfig:
    return from_preset(PRESETS, name, "SFT", **overrides)
