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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from muarl.chat import ChatFormat
from muarl.synth import from_chat_record, untrained_turns
from muarl.train.data import Example, tokenize_conversation
from muarl.train.distributed import compute_device, setup
from muarl.train.fresh_ids import refresh_ids, step_rng
from muarl.train.memory import peak_memory, unmap_large_frees
from muarl.train.optim import make_optimizer
from muarl.train.packing import collate, plan_rows, token_loss
from muarl.train.precision import autocast
from muarl.train.run import data_digests, open_run
from muarl.train.settings import RunSettings, from_preset
from muarl.train.sharded_init import load_sharded
from muarl.train.sharding import (
    grad_norm,
    idle_passes,
    is_sharded,
    pass_count,
    resume_optimizer,
    save_result,
    save_step,
)
from muarl.train.trackers import Trackers, check_report_to
from muarl.train.weights import load_trainable, trainable_parameters
from muarl.types import ToolSpec


@dataclass
class SFTConfig(RunSettings):
    """SFT settings (plus the shared :class:`~muarl.train.settings.RunSettings`); see :data:`PRESETS`."""

    model: str = field(default="tiny", metadata={
        "help": "the starting checkpoint: a directory, a Hub id, tiny, tiny-random or smollm2"})
    data: list[str] = field(default_factory=list, metadata={
        "help": "sft.jsonl file(s) written by `muarl synth` (chat format)", "metavar": "FILE"})
    out: str = field(default="runs/sft", metadata={"help": "run directory: model/, metrics.jsonl, config.json"})
    epochs: int = field(default=2, metadata={"help": "passes over the data set"})
    lr: float = field(default=5e-6, metadata={"help": "peak learning rate (cosine decay after the warmup)"})
    weight_decay: float = field(default=0.0, metadata={"help": "the optimizer's weight decay"})
    warmup_steps: int = field(default=0, metadata={"help": "optimizer steps of linear warmup"})
    batch_size: int = field(default=128, metadata={"help": "conversations per optimizer step"})
    max_len: int = field(default=16384, metadata={"help": "tokens per packed row (raised to the step's longest conversation)"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip"})
    packing: bool = field(default=True, metadata={
        "help": "pack several conversations into each row (--no-packing: one conversation a row)"})
    # rename identifier digit runs afresh in every conversation at every step (muarl.train.fresh_ids):
    # for models trained from scratch, which otherwise memorize the data set's ids instead of copying
    fresh_ids: bool = field(default=False, metadata={
        "help": "rename identifiers (digit runs of 4+) afresh in every conversation at every step, so a model "
                "trained from scratch cannot memorize them (muarl.train.fresh_ids)"})
    save_every: int = field(default=20, metadata={
        "help": "optimizer steps between checkpoints in OUT/checkpoints/step_N (0: only at the end)"})

    def __post_init__(self) -> None:
        self.check_sharding()


#: ``paper``: MUA-RL's cold start (AdamW, lr 5e-6 with cosine decay, 2 epochs, batch 128).
#: ``tiny``: the embedded model on a CPU, which starts from random weights and needs a far larger lr.
PRESETS: dict[str, SFTConfig] = {
    "paper": SFTConfig(),
    "tiny": SFTConfig(epochs=3, lr=3e-3, batch_size=8, warmup_steps=2),
}


@dataclass
class Record:
    """One conversation of the data set: its chat-format line, its tool set's chat format and its tokens."""

    record: dict[str, Any]
    chat: ChatFormat
    example: Example


def chat_format_of(record: dict[str, Any], tokenizer: Any, formats: dict[str, ChatFormat]) -> ChatFormat:
    """The chat format of a chat-format record's tool set, built once per distinct tool set (``formats``)."""
    key = json.dumps(record["tools"], sort_keys=True)
    if key not in formats:
        specs = [ToolSpec(name=t["function"]["name"], description=t["function"].get("description", ""),
                          parameters=t["function"].get("parameters", {})) for t in record["tools"]]
        formats[key] = ChatFormat(tokenizer, specs)
    return formats[key]


def load_records(paths: list[str], tokenizer: Any) -> list[Record]:
    """Read and tokenize every conversation of the data set files (one chat format per distinct tool set)."""
    formats: dict[str, ChatFormat] = {}
    records = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                chat = chat_format_of(record, tokenizer, formats)
                example = record_example(chat, record)
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{n}: not a usable chat record: {err}") from None
            records.append(Record(record, chat, example))
    if not records:
        raise ValueError(f"no conversations in {paths}")
    return records


def load_examples(paths: list[str], tokenizer: Any) -> list[Example]:
    """The tokens of every conversation of the data set files."""
    return [r.example for r in load_records(paths, tokenizer)]


def step_examples(records: list[Record], indices: list[int], step: int, config: SFTConfig) -> list[Example]:
    """One optimizer step's conversations; with ``fresh_ids``, each with identifiers renamed for this step."""
    if not config.fresh_ids:
        return [records[i].example for i in indices]
    return [record_example(records[i].chat, refresh_ids(records[i].record, step_rng(config.seed, step, i)))
            for i in indices]


def record_example(chat: ChatFormat, record: dict[str, Any]) -> Example:
    """The training tokens of one data-set line (its ``"weight": 0`` turns without loss)."""
    return tokenize_conversation(chat, from_chat_record(record), untrained_turns(record))


def accumulate_gradients(model: Any, examples: list[Example], targets: int, max_len: int, packing: bool,
                         pad: int, precision: Any, dist: Any = None) -> tuple[float, float, list[list[int]]]:
    """Forward and backward of one optimizer step's conversations, packed into rows of ``max_len`` tokens
    (one row per forward pass, so memory is bounded by a row); each row's summed loss is divided by
    ``targets``, the whole step's target count, so the accumulated gradient is the step's token-mean.
    A sharded model runs as many passes on every rank (``dist``; :func:`~muarl.train.sharding.idle_passes`).
    The rows go to the run's device (``dist``'s; :func:`~muarl.train.distributed.compute_device`), not the
    parameters' (under ``--fsdp-offload`` those stay on the CPU). Returns (summed loss, summed padding
    fraction of the rows, the rows)."""
    device = compute_device(model, dist)
    max_len = max([max_len, *(len(e) for e in examples)]) if examples else max_len
    rows = plan_rows([len(e) for e in examples], max_len) if packing else [[i] for i in range(len(examples))]
    passes = pass_count(model, len(rows), dist) if dist is not None else len(rows)
    loss_sum, padding = 0.0, 0.0
    for row in rows:
        micro = collate(examples, [row], pad)
        with precision:
            total, _ = token_loss(model, micro.to(device))
        (total / max(targets, 1)).backward()
        loss_sum += float(total.detach())
        padding += micro.padding_fraction
    if passes > len(rows):
        idle_passes(model, len(rows), passes, device)
    return loss_sum, padding, rows


def cosine(step: int, total: int, warmup: int) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def batch_schedule(n: int, config: SFTConfig) -> list[tuple[int, list[int]]]:
    """Every optimizer step's (epoch, example indices), fixed by the seed: the data position is the step."""
    rng = random.Random(config.seed)
    steps = []
    for epoch in range(config.epochs):
        order = list(range(n))
        rng.shuffle(order)
        steps += [(epoch, order[s:s + config.batch_size]) for s in range(0, n, config.batch_size)]
    return steps


def train_sft(config: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Run SFT; writes ``out/model`` (checkpoint), ``metrics.jsonl``, ``config.json``, ``checkpoints/step_N/``
    and the chosen trackers' logs. Resumes from the newest checkpoint in ``out`` unless ``config.resume``
    is False. Under ``accelerate launch`` each process packs and trains on its share of every batch."""
    check_report_to(config.report_to)
    dist = setup(config.device, group=config.fsdp, offload=config.fsdp_offload)
    run = open_run(config, dist, {"data": data_digests(config.data)})
    # a sharded run starts from --model and loads its checkpoint's shards below
    if config.fsdp:  # built on meta, each rank reading its own shards; a resumed run loads its shards below
        unmap_large_frees()  # layer-sized frees of a sharded run return their pages
        model, _, tokenizer = load_sharded(config, dist, files=run.model)
    else:
        model, _, tokenizer = load_trainable(config, str(dist.device), run.resume_from, files=run.model)
    model.train()
    records = load_records(config.data, tokenizer)
    schedule_ = batch_schedule(len(records), config)
    total_steps = len(schedule_)
    params = trainable_parameters(model)
    optimizer = make_optimizer(params, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine(s, total_steps, config.warmup_steps))
    history: list[dict[str, Any]] = []
    if run.resume_from is not None:  # last: restores the random generators as they were at the save
        state = resume_optimizer(run.resume_from, dist, model, optimizer, config.fsdp)
        schedule.load_state_dict(state["scheduler"])
        history = state["metrics"]
    trackers = Trackers(run.out, config.report_to, asdict(config), history, enabled=dist.main, name="sft")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    precision = autocast(config.bf16, dist.device)  # the run's device: offloaded parameters sit on the CPU
    try:
        with _bar(progress and dist.main, total_steps, run.start_step) as advance:
            for step in range(run.start_step, total_steps):
                epoch, indices = schedule_[step]
                began = time.perf_counter()
                # longest first (by the stored tokens), dealt round-robin: every process gets a similar number
                # of tokens, and tokenizes (renames, with fresh_ids) only its own share
                local = step_examples(records, dist.share(sorted(indices, key=lambda i: -len(records[i].example))),
                                      step, config)
                targets = int(dist.sum(sum(sum(e.mask[1:]) for e in local)))  # the whole batch's: its token-mean
                optimizer.zero_grad(set_to_none=True)
                loss_sum, padding, rows = accumulate_gradients(model, local, targets, config.max_len, config.packing,
                                                               pad, precision, dist)
                if not is_sharded(model):  # a sharded model's gradients were reduce-scattered in backward
                    dist.all_reduce_grads(params)
                norm = grad_norm(params, config.grad_clip)
                optimizer.step()
                schedule.step()
                n_rows = dist.sum(len(rows))
                record = {"step": step + 1, "epoch": epoch, "loss": dist.sum(loss_sum) / targets,
                          "lr": schedule.get_last_lr()[0], "grad_norm": norm, "target_tokens": targets,
                          "rows": int(n_rows), "padding": dist.sum(padding) / max(n_rows, 1),
                          "tokens_per_s": dist.sum(sum(len(e) for e in local)) / (time.perf_counter() - began),
                          **peak_memory(dist)}
                history.append(record)
                trackers.log(record, step + 1)
                advance(record)
                if (config.save_every and (step + 1) % config.save_every == 0) or step + 1 == total_steps:
                    state = {"step": step + 1, "scheduler": schedule.state_dict(), "metrics": history}
                    save_step(run.out, step + 1, dist, model, optimizer, tokenizer, state, config.fsdp,
                              config.keep_checkpoints)
    finally:
        trackers.close()
    checkpoint, model = save_result(run.out, model, tokenizer, config, dist)
    return {"steps": len(history), "first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
            "checkpoint": str(checkpoint), "metrics": history, "model": model,
            "side": "user" if all(r.record.get("side") == "user" for r in records) else "agent"}


class _bar:
    """A rich progress bar over optimizer steps (a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int, done: int = 0):
        self.enabled, self.total, self.done = enabled, total, done

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda record: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[stats]}"))
        self.progress.__enter__()
        task = self.progress.add_task("sft", total=self.total, completed=self.done, stats="")
        return lambda r: self.progress.update(task, advance=1, stats=f"loss {r['loss']:.3f} lr {r['lr']:.2e}")

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.progress.__exit__(*exc)


def preset(name: str, **overrides: Any) -> SFTConfig:
    return from_preset(PRESETS, name, "SFT", **overrides)
