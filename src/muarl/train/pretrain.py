"""``muarl pretrain``: the cold-start base, trained on an unlimited stream of expert conversations.

A model trained from random weights on a fixed data set memorizes its few hundred identifiers instead of
learning to copy them, and then fails every held-out write (README, "The CPU demo"; research/).
Here no conversation is ever seen twice: the stream is cut into *chunks*, each a freshly generated
database (its own users, orders and ids) whose training tasks the expert plays against the scripted
user, and every identifier is renamed again as it is trained on (:mod:`muarl.train.fresh_ids`). The only
way to lower the loss on an id is to copy it from where it appeared.

Only train-split users are played (``muarl.taskgen.user_split`` is a function of the user id, so test
users of any database, the default one included, never appear). The stream is deterministic: chunk
``c`` of domain ``d`` is the same on every machine, so a run resumes exactly from its last checkpoint,
and the chunks already played are kept in ``out/stream/`` (a resumed run reads them instead of playing
them again). Every ``probe_every`` steps the model is scored on held-out conversations (the default
database's dev users): its loss on the agent's tokens and the share of identifier digits it predicts
as its most likely next token, the copy accuracy (``copy_probe.jsonl``).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from muarl.files import write_lines
from muarl.taskgen import FamilyShareWarning
from muarl.train.checkpoint import load_trainer_state, save_checkpoint
from muarl.train.data import Example
from muarl.train.fresh_ids import refresh_ids, step_rng
from muarl.train.precision import autocast
from muarl.train.run import open_run
from muarl.train.settings import RunSettings
from muarl.train.sft import Record, accumulate_gradients, chat_format_of, cosine, load_records, record_example
from muarl.train.trackers import Trackers, check_report_to
from muarl.train.weights import load_trainable, save_final, trainable_parameters, write_weights

#: database seeds of the stream start here, far from the built-in domains' default (0)
STREAM_SEED = 100_000


@dataclass
class PretrainConfig(RunSettings):
    """Settings of ``muarl pretrain``; the defaults built the shipped base (docs/base_model.md)."""

    model: str = field(default="", metadata={
        "help": "continue from this checkpoint (default: the embedded model from random weights, shaped below)"})
    out: str = field(default="runs/pretrain", metadata={
        "help": "run directory: model/, metrics.jsonl, copy_probe.jsonl, stream/"})
    domains: list[str] = field(default_factory=lambda: ["retail-lite"], metadata={
        "help": "domains whose generators feed the stream"})
    steps: int = field(default=4000, metadata={"help": "optimizer steps (the cosine schedule ends there)"})
    batch_size: int = field(default=8, metadata={"help": "conversations per optimizer step"})
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate"})
    warmup_steps: int = field(default=20, metadata={"help": "optimizer steps of linear warmup"})
    weight_decay: float = field(default=0.0, metadata={"help": "the optimizer's weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip"})
    max_len: int = field(default=0, metadata={"help": "tokens per packed row (0: the step's longest conversation)"})
    chunk_tasks: int = field(default=200, metadata={"help": "training tasks per freshly generated database"})
    users: list[str] = field(default_factory=lambda: ["scripted"], metadata={
        "help": "simulated users who play the stream's conversations, taking turns by database (a --user spec: "
                "scripted, static, a plug-in), so a base can learn the openings of more than one kind of user"})
    exclude_behaviours: list[str] = field(default_factory=list, metadata={
        "help": "leave out users who show these behaviours (e.g. changes_mind), for RL to teach"})
    slip_rate: float = field(default=0.0, metadata={
        "help": "chance that the expert mistypes its identity lookup (then asks again), and again that it "
                "mistypes a proposal (then proposes again); the wrong message without loss "
                "(TeacherSession.slip)"})
    first_chunk: int = field(default=0, metadata={
        "help": "start the stream at this database (a continuation: past the chunks its base saw)"})
    probe_every: int = field(default=250, metadata={
        "help": "steps between held-out copy-accuracy probes (0: only at the end)"})
    probe_conversations: int = field(default=24, metadata={"help": "held-out conversations per probe"})
    save_every: int = field(default=100, metadata={
        "help": "steps between checkpoints in OUT/checkpoints/step_N (0: only at the end)"})
    # the embedded model's shape when ``model`` is empty (README, "The CPU demo": wide heads copy sooner)
    hidden_size: int = field(default=64, metadata={"help": "a new model's hidden size"})
    layers: int = field(default=2, metadata={"help": "a new model's decoder layers"})
    heads: int = field(default=4, metadata={"help": "a new model's attention heads"})
    head_dim: int = field(default=64, metadata={"help": "a new model's attention head width"})
    kv_heads: int = field(default=1, metadata={"help": "a new model's key/value heads"})
    prompt: str = field(default="compact", metadata={
        "help": "a new model's chat template: full (policy and tool schemas) or compact (tool names only)",
        "choices": ["full", "compact"]})

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "chunk_tasks", "probe_conversations"):
            if getattr(self, name) < 1:
                raise ValueError(f"pretrain {name} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.slip_rate <= 1:
            raise ValueError(f"pretrain slip_rate must be between 0 and 1 (got {self.slip_rate:g})")
        if self.first_chunk < 0:
            raise ValueError(f"pretrain first_chunk must be 0 or more (got {self.first_chunk})")
        if not self.domains:
            raise ValueError("pretrain needs at least one domain")
        if not self.users:
            raise ValueError("pretrain needs at least one user")
        if self.fsdp or self.optimizer != "adamw":
            raise ValueError("muarl pretrain trains the small embedded base with AdamW, unsharded: --fsdp, "
                             "--fsdp-offload and --optimizer are options of sft and grpo")


class ConversationStream:
    """The deterministic, unlimited stream of training conversations (chat-format records).

    Record ``i`` of the stream is fixed by the config alone: chunks are played in order (domains taking
    turns), each chunk's kept conversations shuffled by its seed. Played chunks are cached in ``folder``.
    """

    def __init__(self, config: PretrainConfig, folder: Path):
        from muarl.domain import get_domain

        self.config, self.folder = config, folder
        self.domains = [get_domain(name) for name in config.domains]
        self.folder.mkdir(parents=True, exist_ok=True)
        self._chunks: list[list[dict[str, Any]]] = []
        self._share_warned: set[str] = set()

    def chunk(self, c: int) -> list[dict[str, Any]]:
        """Chunk ``c``: the expert's clean wins on the train tasks of a freshly generated database."""
        c += self.config.first_chunk
        path = self.folder / f"chunk_{c:06d}.jsonl"
        if path.exists():
            return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        from muarl.factory import make_user
        from muarl.policies.expert import ExpertPolicy
        from muarl.synth import synthesize

        domain = self.domains[c % len(self.domains)]
        user = self.config.users[(c // len(self.domains)) % len(self.config.users)]
        seed = STREAM_SEED + c
        fresh = domain.with_database(seed=seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fresh._tasks = fresh.generate_tasks(seed, {"train": self.config.chunk_tasks, "dev": 0, "test": 0})
        for w in caught:  # every chunk draws the same mix: its share shortfall is said once per domain, not per chunk
            if not issubclass(w.category, FamilyShareWarning) or domain.name not in self._share_warned:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            if issubclass(w.category, FamilyShareWarning):
                self._share_warned.add(domain.name)
        with tempfile.TemporaryDirectory(dir=self.folder) as tmp:
            expert = ExpertPolicy(slip_rate=self.config.slip_rate)
            synthesize([fresh], expert, make_user(user), Path(tmp), split="train",
                       exclude_behaviours=self.config.exclude_behaviours or None, seed=seed, progress=False)
            owners = {t.id: t.user_id for t in fresh._tasks}  # recorded, so a test can check who was played
            lines = [json.dumps({**record, "user_id": owners[record["task_id"]]}, ensure_ascii=False)
                     for record in map(json.loads, (Path(tmp) / "sft.jsonl").read_text(encoding="utf-8").splitlines())]
        if not lines:
            raise ValueError(f"chunk {c} of {domain.name} kept no conversation: the expert won no task")
        random.Random(f"stream:{seed}").shuffle(lines)
        write_lines(path, lines)  # whole or absent: a killed run never leaves half a chunk
        return [json.loads(line) for line in lines]

    def records(self, start: int, count: int) -> list[dict[str, Any]]:
        """Records ``start`` .. ``start + count - 1`` of the stream."""
        out: list[dict[str, Any]] = []
        c, offset = 0, 0
        while len(out) < count:
            while c >= len(self._chunks):
                self._chunks.append(self.chunk(len(self._chunks)))
            size = len(self._chunks[c])
            if offset + size > start + len(out):
                at = start + len(out) - offset
                out += self._chunks[c][at:at + count - len(out)]
            offset += size
            c += 1
        return out


def step_examples(stream: ConversationStream, step: int, config: PretrainConfig, tokenizer: Any,
                  formats: dict[str, Any]) -> list[Example]:
    """One optimizer step's conversations, tokenized, every identifier renamed for this step."""
    examples = []
    for i, record in enumerate(stream.records(step * config.batch_size, config.batch_size)):
        renamed = refresh_ids(record, step_rng(config.seed, step, i))
        examples.append(record_example(chat_format_of(record, tokenizer, formats), renamed))
    return examples


def probe_records(domains: list[str], n: int, folder: Path, tokenizer: Any) -> list[Record]:
    """Held-out conversations for the copy probe: the expert on the default database's dev users."""
    from muarl.domain import get_domain
    from muarl.factory import make_policy, make_user
    from muarl.synth import synthesize

    path = folder / "probe_conversations.jsonl"
    if not path.exists():
        lines: list[str] = []
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            for name in domains:
                synthesize([get_domain(name)], make_policy("expert"), make_user("scripted"), Path(tmp) / name,
                           split="dev", progress=False)
                lines += (Path(tmp) / name / "sft.jsonl").read_text(encoding="utf-8").splitlines()[:n]
        path.write_text("".join(line + "\n" for line in lines if line), encoding="utf-8")
    return load_records([str(path)], tokenizer)


def copy_probe(model: Any, tokenizer: Any, records: list[Record]) -> dict[str, float]:
    """Loss per agent token, and how many identifier digits (tokens of 4+-digit runs and their pieces:
    any agent token holding a digit) the model predicts as its most likely next token."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    digit = {i for i in range(len(tokenizer)) if re.search(r"\d", tokenizer.decode([i]))}
    loss, tokens, right, digits = 0.0, 0, 0, 0
    with torch.no_grad():
        for record in records:
            ex = record.example
            logits = model(input_ids=torch.tensor([ex.ids], device=device)).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1)
            target = torch.tensor(ex.ids[1:], device=device)
            mask = torch.tensor(ex.mask[1:], dtype=torch.bool, device=device)
            nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            loss += float(nll[mask].sum())
            tokens += int(mask.sum())
            is_digit = mask & torch.tensor([t in digit for t in ex.ids[1:]], device=device)
            right += int((logp.argmax(-1) == target)[is_digit].sum())
            digits += int(is_digit.sum())
    model.train(was_training)
    return {"probe_loss": loss / max(tokens, 1), "copy_accuracy": right / max(digits, 1)}


def _initial_model(config: PretrainConfig, out: Path) -> str:
    """The starting checkpoint: ``config.model``, or the embedded model built (once) in ``out/init``."""
    if config.model:
        return config.model
    from muarl.tiny_model import build_shaped

    folder = out / "init"
    if not (folder / "config.json").exists():
        build_shaped(folder, config.hidden_size, config.layers, config.heads, config.head_dim, config.kv_heads,
                     config.seed, config.prompt)
    return str(folder)


def train_pretrain(config: PretrainConfig, progress: bool = True) -> dict[str, Any]:
    """Run the base training; writes ``out/model``, ``metrics.jsonl``, ``copy_probe.jsonl``, ``stream/`` and
    ``checkpoints/``. Resumes from the newest checkpoint unless ``config.resume`` is False."""
    from dataclasses import replace

    from muarl.factory import make_user
    from muarl.train.distributed import setup

    check_report_to(config.report_to)
    for user in config.users:
        make_user(user)  # a malformed spec: one line now, not at the stream's first database that needs it
    dist = setup(config.device)
    if dist.world > 1:
        raise ValueError("muarl pretrain runs in one process (the stream is played by it)")
    run = open_run(config, dist)
    start = replace(config, model=_initial_model(config, run.out))
    model, _, tokenizer = load_trainable(start, str(dist.device), run.resume_from)
    model.train()
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine(s, config.steps, config.warmup_steps))
    history: list[dict[str, Any]] = []
    if run.resume_from is not None:
        state = load_trainer_state(run.resume_from, dist)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
        history = state["metrics"]
    trackers = Trackers(run.out, config.report_to, asdict(config), history, enabled=True, name="pretrain")
    stream = ConversationStream(config, run.out / "stream")
    probes = probe_records(config.domains, config.probe_conversations, run.out, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    precision = autocast(config.bf16, params[0].device)
    formats: dict[str, Any] = {}
    from muarl.train.sft import _bar

    try:
        with _bar(progress, config.steps, run.start_step) as advance:
            for step in range(run.start_step, config.steps):
                began = time.perf_counter()
                examples = step_examples(stream, step, config, tokenizer, formats)
                targets = sum(sum(e.mask[1:]) for e in examples)
                optimizer.zero_grad(set_to_none=True)
                loss_sum, _, _ = accumulate_gradients(model, examples, targets, config.max_len, True, pad,
                                                      precision)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.grad_clip))
                optimizer.step()
                schedule.step()
                record: dict[str, Any] = {
                    "step": step + 1, "loss": loss_sum / max(targets, 1), "lr": schedule.get_last_lr()[0],
                    "grad_norm": grad_norm, "target_tokens": targets,
                    "conversations": (step + 1) * config.batch_size,
                    "tokens_per_s": sum(len(e) for e in examples) / (time.perf_counter() - began)}
                last = step + 1 == config.steps
                if (config.probe_every and (step + 1) % config.probe_every == 0) or last:
                    record.update(copy_probe(model, tokenizer, probes))
                    _write_probes(run.out, history + [record])
                history.append(record)
                trackers.log(record, step + 1)
                advance(record)
                if (config.save_every and (step + 1) % config.save_every == 0) or last:
                    save_checkpoint(run.out, step + 1, dist, lambda d: write_weights(model, tokenizer, d),
                                    {"step": step + 1, "optimizer": optimizer.state_dict(),
                                     "scheduler": schedule.state_dict(), "metrics": history},
                                    keep=config.keep_checkpoints)
    finally:
        trackers.close()
    checkpoint = save_final(run.out, model, tokenizer, config.merge_lora)
    probed = [r for r in history if "copy_accuracy" in r]
    return {"steps": len(history), "checkpoint": str(checkpoint), "metrics": history,
            "copy_accuracy": probed[-1]["copy_accuracy"] if probed else None}


def _write_probes(out: Path, history: list[dict[str, Any]]) -> None:
    """``out/copy_probe.jsonl``: the copy-probe curve so far, rewritten whole (a resumed run never repeats a line)."""
    lines = [json.dumps({k: r[k] for k in ("step", "probe_loss", "copy_accuracy")}) for r in history
             if "copy_accuracy" in r]
    write_lines(out / "copy_probe.jsonl", lines)
