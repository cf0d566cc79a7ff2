"""The experiments' stages, each resumable in a folder of its own: the starting model, cold-start data and
SFT, GRPO, held-out evaluations (what :mod:`muarl.demo` and :mod:`muarl.ablation` run), and the record of
which stages are done and how long they took."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from muarl.experiments.recipe import (
    BASES,
    SPLITS,
    DemoConfig,
)


def _done(folder: Path) -> bool:
    return (folder / "DONE").exists()


def _mark(folder: Path, **info: Any) -> None:
    (folder / "DONE").write_text(json.dumps(info) + "\n")


def check_settings(recorded: Path, settings: dict[str, Any], defaults: dict[str, Any], what: str) -> None:
    """Refuse to go on in a run directory whose ``recorded`` settings (``demo.json``, ``ablate.json``) differ
    from ``settings``, naming the knobs that differ; then record them. A knob added after the run was
    recorded had its value in ``defaults`` then (the greedy evaluations, say). Why: a rerun of the same
    command resumes, and a resumed run with other knobs would report numbers no single command made."""
    if recorded.exists():
        then = {**defaults, **json.loads(recorded.read_text())}
        differ = sorted(key for key in settings if then.get(key) != settings[key])
        if differ:
            raise ValueError(f"{recorded.parent} holds {what} run with other settings ({', '.join(differ)}); use "
                             "another --out")
    recorded.write_text(json.dumps(settings, indent=1) + "\n")


class Stopped(Exception):
    """``stop_after`` reached."""


class Stages:
    """Runs a pipeline's stages (the demo's, the ablation's), each under a header, and keeps the seconds of
    each in ``seconds.json``, summed over every command that ran it (an interrupted stage's parts; the shared
    stages of the split evaluated first), so a split's minutes are its whole run's, whichever ran first.

    A stage's key is its name, under ``prefix`` (``dev/``: the dev split's evaluations) unless it is one of
    ``shared`` (the model, the training); after ``stop_after`` it raises :class:`Stopped`."""

    def __init__(self, out: Path, prefix: str = "", shared: tuple[str, ...] = (), stop_after: str | None = None):
        self.file = out / "seconds.json"
        self.clock: dict[str, float] = json.loads(self.file.read_text()) if self.file.exists() else {}
        self.prefix, self.shared, self.stop_after = prefix, shared, stop_after
        self.console = Console()

    def key(self, name: str) -> str:
        return name if name in self.shared or name.split("/")[0] in self.shared else self.prefix + name

    def __call__(self, name: str, fn: Any, *args: Any) -> Any:
        key = self.key(name)
        self.console.rule(f"[bold]{key}")
        began = time.perf_counter()
        result = fn(*args)
        spent = time.perf_counter() - began
        self.clock[key] = round(self.clock.get(key, 0.0) + spent, 1)
        self.file.write_text(json.dumps(self.clock, indent=1) + "\n")
        self.console.print(f"{key}: {spent:.0f} s")
        if name == self.stop_after:
            raise Stopped
        return result

    def seconds(self) -> dict[str, float]:
        """This split's stages and the shared ones (not another split's evaluations)."""
        def ours(key: str) -> bool:
            if key in self.shared or key.split("/")[0] in self.shared:
                return True
            rest = key[len(self.prefix):] if key.startswith(self.prefix) else None
            return rest is not None and rest.split("/")[0] not in SPLITS
        return {key: value for key, value in self.clock.items() if ours(key)}


def build_model(out: Path, config: DemoConfig, seed: int) -> Path:
    """Stage 1: the shipped base, a model directory of one's own, or (``base="scratch"``) the tiny model from
    random weights of ``seed``."""
    from muarl.models import base_path
    from muarl.tiny_model import build_shaped

    if config.base == "shipped":
        return base_path()
    if config.base not in BASES:  # a model directory (check_base)
        return Path(config.base)
    folder = out / "model"
    if not _done(folder):
        if not (folder / "config.json").exists():  # the tokenizer is the cached tiny model's (trained once)
            build_shaped(folder, config.hidden_size, config.layers, config.heads, config.head_dim, config.kv_heads,
                         seed, config.prompt)
        _mark(folder)
    return folder


def synthesize_data(out: Path, config: DemoConfig, seed: int) -> Path:
    """Stage 2: expert x scripted user on training tasks; the clean wins as a chat data set."""
    from muarl.domain import get_domain
    from muarl.factory import make_policy, make_user
    from muarl.synth import synthesize

    folder = out / "synth"
    if not _done(folder):
        report = synthesize([get_domain(config.domain)], make_policy("expert"), make_user("scripted"), folder,
                            families=list(config.synth_families) or None, seed=seed, progress=False)
        lines = (folder / "sft.jsonl").read_text(encoding="utf-8").splitlines()
        (folder / "sft_used.jsonl").write_text("\n".join(lines[:config.sft_conversations]) + "\n", encoding="utf-8")
        _mark(folder, **report.as_dict())
    return folder / "sft_used.jsonl"


def opening_supervised(out: Path, config: DemoConfig, model: Path, data: Path, seed: int, progress: bool) -> Path:
    """Stage 3a (when ``prefix_calls``): SFT on the conversations' openings, where a model from random
    weights learns to copy ids many times sooner than from whole ones (:func:`muarl.synth.prefix_record`)."""
    from muarl.synth import write_prefixes
    from muarl.train.sft import train_sft

    folder = out / "sft-prefix"
    if not config.prefix_calls:
        return model
    if not _done(folder):
        folder.mkdir(exist_ok=True)
        openings = folder / "openings.jsonl"
        write_prefixes(data, openings, config.prefix_calls)
        train_sft(replace(config.sft, model=str(model), data=[str(openings)], out=str(folder), seed=seed,
                          epochs=config.prefix_epochs, batch_size=config.prefix_batch), progress=progress)
        _mark(folder)
    return folder / "model"


def supervised(out: Path, config: DemoConfig, model: Path, data: Path, seed: int, progress: bool) -> Path:
    """Stage 3: SFT on the synthesized conversations."""
    from muarl.train.sft import train_sft

    folder = out / "sft"
    if not _done(folder):
        train_sft(replace(config.sft, model=str(model), data=[str(data)], out=str(folder), seed=seed),
                  progress=progress)
        _mark(folder)
    return folder / "model"


def reinforce(out: Path, config: DemoConfig, model: Path, seed: int, progress: bool) -> Path:
    """Stage 5: GRPO from the SFT model, the scripted user in every rollout."""
    from muarl.train.grpo import train_grpo

    folder = out / "grpo"
    if not _done(folder):
        train_grpo(replace(config.grpo, model=str(model), domain=config.domain, out=str(folder), seed=seed),
                   progress=progress)
        _mark(folder)
    return folder / "model"


def cold_start(out: Path, config: DemoConfig, seed: int, progress: bool, stage: Stages) -> Path:
    """Stages 1 to 3: the model the evaluations and GRPO start from, the shipped base or (``base="scratch"``)
    the model from random weights, synth, SFT on the openings (when ``prefix_calls``) and SFT."""
    model = stage("model", build_model, out, config, seed)
    if config.base != "scratch":
        return model
    data = stage("synth", synthesize_data, out, config, seed)
    if config.prefix_calls or stage.stop_after == "sft-prefix":
        model = stage("sft-prefix", opening_supervised, out, config, model, data, seed, progress)
    return stage("sft", supervised, out, config, model, data, seed, progress)


def split_dir(out: Path, split: str) -> Path:
    """Where a split's evaluations, comparisons, ``summary.json`` and plots go: the run directory for the
    test split (the layout of runs made before the split was a setting), ``dev/`` inside it for dev."""
    return out if split == "test" else out / split


def held_out_tasks(config: DemoConfig) -> list[Any]:
    """The first ``eval_tasks`` tasks of ``eval_split``; fewer than asked is an error before any training,
    not a smaller evaluation reported under the same name."""
    from muarl.domain import get_domain

    domain = get_domain(config.domain)
    tasks = domain.tasks(config.eval_split)
    if len(tasks) < config.eval_tasks:
        raise ValueError(f"{domain.name} has {len(tasks)} {config.eval_split} tasks, fewer than the "
                         f"{config.eval_tasks} to evaluate (--eval-tasks)")
    return tasks[:config.eval_tasks]


def evaluate_model(out: Path, name: str, config: DemoConfig, model: Path, seed: int, progress: bool,
                   temperature: float | None = None, user: str = "scripted") -> dict[str, Any]:
    """Stages 4 and 6: ``k`` trials of the first ``eval_tasks`` tasks of ``eval_split`` (same users for
    both), sampled at the training temperature unless ``temperature`` is given (0: greedy). ``user``: who
    plays them (a ``--user`` spec; ``muarl ablate`` evaluates with several), the scripted user by default."""
    from muarl.domain import get_domain
    from muarl.evaluate import evaluate
    from muarl.factory import make_user
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.rollout import EpisodeConfig

    domain = get_domain(config.domain)
    temperature = config.grpo.temperature if temperature is None else temperature
    policy = HFPolicy(load(model), temperature=temperature, max_new_tokens=config.grpo.max_new_tokens, seed=seed)
    result = evaluate(domain, policy, make_user(user), held_out_tasks(config), k=config.eval_k,
                      out_dir=out / name, config=EpisodeConfig(max_turns=config.grpo.max_turns), seed=seed,
                      progress=progress, meta={"model": str(model), "temperature": temperature,
                                               "split": config.eval_split, "user": user})
    return result.metrics


def provenance(config: DemoConfig, cold_start: Path, rl_model: Path) -> dict[str, Any]:
    """What produced the demo's numbers (:func:`muarl.provenance.record`): muarl, the domain, the scripted
    user and both evaluated models, the cold start and the RL one, by checkpoint directory."""
    from muarl.domain import get_domain
    from muarl.provenance import record
    from muarl.users.scripted import ScriptedUser

    found = record([get_domain(config.domain)], {}, ScriptedUser(), user_spec="scripted")
    found["policy"] = {role: {"spec": f"hf:{model}", "model": str(model)}
                       for role, model in (("cold_start", cold_start), ("rl", rl_model))}
    return found


