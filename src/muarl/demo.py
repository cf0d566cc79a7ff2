"""``muarl demo``: MUA-RL on a CPU, from the shipped cold-start base to an agent RL made better.

Top to bottom, each stage in its own folder of the run directory:

1. ``model/``: the starting model. By default the shipped base (``hf:tiny``, trained by ``muarl
   pretrain`` on an unlimited stream of expert conversations: it copies identifiers; docs/base_model.md).
   With ``base="scratch"`` the older recipe instead: the embedded model from random weights, then
   ``synth/`` (the expert teacher against the scripted user; clean wins), ``sft-prefix/`` (optional, SFT
   on the conversations' openings) and ``sft/`` (SFT on whole conversations).
2. ``eval-sft/``: the cold start on held-out tasks of the evaluation split (``eval_split``), ``k``
   sampled trials each (T = 1); ``eval-sft-greedy/``: the same tasks and users, greedy (T = 0).
3. ``grpo/``: GRPO from it with the scripted user in every rollout (on the train split).
4. ``eval-rl/``, ``eval-rl-greedy/``: the RL model on the same held-out tasks, same users, same trials.
5. ``summary.json``, ``comparison.json`` and ``comparison-greedy.json`` (paired bootstrap intervals, as
   ``muarl compare``), ``changed.md`` (held-out conversations that changed), ``plots/`` and ``report.html``
   (:func:`report`: the table, the plots and the changed conversations, linked into the viewer's pages of
   ``grpo/`` and the evaluations).

The evaluation split is the protocol's lever: a recipe is chosen on ``dev`` and the ``test`` split is
scored once per reported figure. Both splits' evaluations share one run directory and so one trained
model: the test split's stages 2, 4 and 5 write to the directory itself (as before the split existed), the
dev split's to ``dev/`` inside it, and a rerun with the other ``eval_split`` only evaluates (the model,
SFT and GRPO stages are found done). Training never sees either split.

The domain is ``retail-lite-forgetful``: retail narrowed to cancelling and returning, with terse tools
(short enough conversations to learn on two cores), played by users of whom only a quarter remember
the email on their account, where the cold start saw 70%: its habit of asking for the email first fails
on most of them, and RL with the simulated user in the loop has something to teach. Evaluation samples at the training
temperature: the demo shows what RL changes in the policy the model actually is; the greedy evaluations
(``greedy=True``, the default) show the same for the model's most likely answers, which is how a model is
usually deployed and evaluated (``muarl eval``'s default). Every stage resumes:
rerunning the same command after an interruption continues where it stopped (finished stages are
skipped, training resumes from its last checkpoint, evaluation from its last finished episode).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from muarl.train.grpo import GRPOConfig
from muarl.train.sft import SFTConfig

#: the demo's SFT: small batches (a model this size learns per step, not per token), one conversation a row
SFT = SFTConfig(epochs=2, lr=3e-3, batch_size=2, warmup_steps=2, max_len=0, packing=False, save_every=100,
                report_to="tensorboard")
#: the demo's GRPO: the measured recipe of docs/research/rl-beats-cold-start.md. 45 steps at lr 2e-4 with two
#: updates per batch of rollouts (GRPO's mu), no KL term, run-on episodes out of the gradient; a rule-breaking
#: episode trains as a plain failure: below 0 lowered violations but cut the success gain (seed 2: -1 gave
#: +0.035, -0.25 gave +0.075, 0 gave +0.185). Its temperature, token and turn limits are the evaluations' too.
GRPO = GRPOConfig(steps=45, tasks_per_step=8, group_size=8, lr=2e-4, kl_beta=0.0, num_iterations=2,
                  mask_truncated=True, penalize_violations=True, violation_reward=0.0, max_new_tokens=200,
                  max_turns=16, temperature=1.0, save_every=2, report_to="tensorboard")
#: fields of the nested configs that each stage sets itself (its model, data, run directory, the demo's seed
#: and domain): not knobs, so neither options nor part of the recorded settings
STAGE_FIELDS = ("model", "data", "out", "seed", "domain")
#: where the cold start comes from: the packaged base, or random weights trained by synth and SFT
BASES = ("shipped", "scratch")
#: DemoConfig fields that choose which evaluations run, not what is trained: a run directory holds one
#: trained model and each split's evaluations in folders of their own, so a rerun may change them
EVAL_ONLY = ("eval_split",)
#: the stages every split's demo shares (each split's evaluations are its own)
SHARED_STAGES = ("model", "synth", "sft-prefix", "sft", "grpo")
#: the held-out splits a run evaluates; a split other than test keeps its evaluations in a folder of its name
SPLITS = ("dev", "test")


@dataclass(frozen=True)
class DemoConfig:
    """Every knob of the demo; :data:`PRESETS` holds the default run (timed in the README) and the smoke runs.

    The SFT and GRPO stages' settings are whole :class:`~muarl.train.sft.SFTConfig` and
    :class:`~muarl.train.grpo.GRPOConfig` objects (``sft``, ``grpo``), not copies of their fields: a training
    option is defined once, and the demo's command line offers the ones it varies (:mod:`muarl.cli.demo`).
    The defaults are the measured recipe of docs/research/rl-beats-cold-start.md: RL on users who behave
    otherwise than the cold start's (most forgot their email).
    """

    domain: str = field(default="retail-lite-forgetful", metadata={
        "help": "the domain GRPO trains on and evaluation tests"})
    base: str = field(default="shipped", metadata={
        "help": "shipped: start from the packaged cold-start base; scratch: random weights, synth and SFT first; "
                "or a model directory: a cold start of your own (a Hugging Face causal LM with a chat template)"})
    # the embedded model (base="scratch")
    hidden_size: int = field(default=64, metadata={"help": "hidden size of the model from random weights"})
    layers: int = field(default=2, metadata={"help": "decoder layers of the model from random weights"})
    heads: int = field(default=4, metadata={"help": "attention heads of the model from random weights"})
    head_dim: int = field(default=0, metadata={
        "help": "attention head width (0: hidden size / heads; 64 learns to copy ids far sooner)"})
    kv_heads: int = field(default=0, metadata={"help": "key/value heads (0: heads / 2)"})
    prompt: str = field(default="full", metadata={
        "help": "the chat template's system turn: full, or compact (tool names only)", "choices": ["full", "compact"]})
    # cold-start data: which families the teacher plays, how many of its conversations SFT uses
    sft_conversations: int = field(default=400, metadata={"help": "the teacher's conversations SFT trains on"})
    synth_families: tuple[str, ...] = field(default=(), metadata={
        "help": "task families the teacher plays (default: all)", "metavar": "FAMILY"})
    # SFT first on the conversations' openings, where copying ids is learned first (0: skip)
    prefix_calls: int = field(default=0, metadata={
        "help": "first train on openings cut after the agent's Nth tool call (0: skip that stage)"})
    prefix_epochs: int = field(default=20, metadata={"help": "epochs of the openings stage"})
    prefix_batch: int = field(default=8, metadata={"help": "conversations per step of the openings stage"})
    sft: SFTConfig = field(default_factory=lambda: replace(SFT), metadata={
        "help": "the SFT stages' settings (the openings stage: its epochs and batch size instead)"})
    grpo: GRPOConfig = field(default_factory=lambda: replace(GRPO), metadata={"help": "the GRPO stage's settings"})
    # evaluation
    eval_split: str = field(default="test", metadata={
        "help": "the held-out split evaluated: dev to choose a recipe, test to score the chosen one (dev's "
                "evaluations go to OUT/dev/; the trained model is shared)", "choices": ["dev", "test"]})
    eval_tasks: int = field(default=50, metadata={"help": "held-out tasks evaluated (the first N of the split)"})
    eval_k: int = field(default=4, metadata={"help": "trials per evaluated task"})
    # also evaluate greedily (T = 0), before and after RL, on the same tasks and users: two more evaluations
    greedy: bool = field(default=True, metadata={
        "help": "also evaluate greedily (T = 0) before and after RL, same tasks and users (two more evaluations)"})

    def with_overrides(self, **overrides: Any) -> DemoConfig:
        """This config with the overrides that were given (None: keep); a nested config's overrides come as a
        dict of its fields (``grpo={"steps": 3}``) and change only those."""
        given = {}
        for name, value in overrides.items():
            if value is None:
                continue
            current = getattr(self, name)
            if is_dataclass(current) and isinstance(value, dict):
                value = replace(current, **{k: v for k, v in value.items() if v is not None})
            given[name] = value
        return replace(self, **given)

    def settings(self) -> dict[str, Any]:
        """The knobs as plain values, nested configs by field name (``grpo.steps``), without the fields each
        stage sets itself: what ``demo.json`` records and a resumed run must match."""
        flat: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if is_dataclass(value):
                flat.update({f"{f.name}.{k}": v for k, v in asdict(value).items() if k not in STAGE_FIELDS})
            else:
                flat[f.name] = list(value) if isinstance(value, tuple) else value
        return flat


PRESETS: dict[str, DemoConfig] = {
    "default": DemoConfig(),
    # smoke: every stage of the default run, briefly (CI runs it)
    "smoke": DemoConfig(grpo=replace(GRPO, steps=2, tasks_per_step=2, group_size=4, max_new_tokens=48, max_turns=8),
                        eval_tasks=4, eval_k=2),
    # smoke-scratch: the from-random-weights recipe's stages (compact prompt, openings first, fresh ids), briefly
    "smoke-scratch": DemoConfig(base="scratch", prompt="compact", prefix_calls=2, prefix_epochs=1, sft_conversations=24,
                                sft=replace(SFT, epochs=1, batch_size=8, fresh_ids=True),
                                grpo=replace(GRPO, steps=2, tasks_per_step=2, group_size=4, max_new_tokens=48,
                                             max_turns=8),
                                eval_tasks=4, eval_k=2),
}


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


def check_base(base: str) -> None:
    """``base`` is one of :data:`BASES` or a model directory (a ``config.json`` in it); else one clear error
    before anything is trained."""
    if base not in BASES and not (Path(base) / "config.json").is_file():
        raise ValueError(f"--base {base!r} is neither one of {', '.join(BASES)} nor a model directory "
                         "(no config.json in it)")


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


def compare_evaluations(out: Path, suffix: str = "") -> dict[str, Any]:
    """``comparison.json``: after RL minus cold start per metric, paired over tasks with 95% bootstrap intervals
    (``suffix="-greedy"``: the greedy evaluations, ``comparison-greedy.json``)."""
    from muarl.compare import compare_runs, load_run

    comparison = compare_runs(load_run(out / f"eval-sft{suffix}"), load_run(out / f"eval-rl{suffix}"))
    (out / f"comparison{suffix}.json").write_text(json.dumps(comparison, indent=1) + "\n")
    return comparison


def _conversation(traj: Any) -> str:
    lines = []
    for m in traj.messages[1:]:
        calls = "; ".join(f"{c.name}({json.dumps(c.arguments)})" for c in m.tool_calls)
        text = (m.content or "").strip().replace("\n", " ")
        lines.append(f"- **{m.role}**: {text}" + (f" `{calls}`" if calls else ""))
    return "\n".join(lines)


def changed_summary(changes: list[Any]) -> str:
    """How many held-out episodes RL fixed and broke, as changed.md and the report say it."""
    fixed = sum(c.gain > 0 for c in changes)
    return (f"{fixed} episodes went from failure to success, {len(changes) - fixed} the other way (same task, "
            "same user seed, before and after).")


def changed_conversations(out: Path, shown: int = 3, runs: tuple[str, str] = ("eval-sft", "eval-rl"),
                          labels: tuple[str, str] = ("cold start", "after RL"),
                          title: str = "Held-out conversations that changed with RL") -> Path:
    """``changed.md`` in ``out``: held-out episodes of the evaluations ``runs`` (folders of
    ``out``: the cold start's and the RL model's) whose outcome differs, before and after, same task and
    same user seed (the same trial of the same task), the ones the second fixed first
    (:func:`muarl.report.comparison.paired_changes`); ``labels`` name the two sides."""
    from muarl.report.comparison import paired_changes

    changes = paired_changes(out / runs[0], out / runs[1])
    parts = [f"# {title}\n\n{changed_summary(changes)}\n"]
    for c in changes[:shown]:
        a, b = c.a, c.b
        parts.append(f"## {a.task_id}: {'fixed' if c.gain > 0 else 'broken'} ({labels[0]} -> {labels[1]})\n\n### {labels[0]} "
                     f"(reward {a.reward.reward if a.reward else 0:.0f})\n\n{_conversation(a)}\n\n### {labels[1]} "
                     f"(reward {b.reward.reward if b.reward else 0:.0f})\n\n{_conversation(b)}\n")
    path = out / "changed.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


#: the demo table's rows; "faults" is the fault rate by party, beside success because a policy fault counts
#: as a failure in pass^1 and a user or tool fault is left out of it
ROWS = (("success (pass^1)", "pass^1"), ("fault rate: policy / user / tool", "faults"), ("pass^k", None),
        ("TCR", "tcr"), ("avg turns", "avg_turns"), ("violation rate", "violation_rate"),
        ("malformed calls / episode", "malformed_calls"))
FAULT_KEYS = ("policy_fault_rate", "user_fault_rate", "tool_fault_rate")


def _value(metrics: dict[str, Any], key: str | None, k: int) -> float:
    return float(metrics.get(key or f"pass^{k}") or 0.0)


#: the arms of the demo's comparison: the cold start and the model after RL
ARMS = ("cold_start", "rl")


def metric_rows(arms: dict[str, dict[str, Any]], k: int,
                differences: list[tuple[str, str, dict[str, Any] | None]],
                greedy: tuple[dict[str, dict[str, Any]], list[dict[str, Any] | None]] | None = None
                ) -> list[dict[str, Any]]:
    """Rows of :data:`ROWS` as :func:`muarl.report.comparison.build_comparison_report` takes them: each arm's
    value (``arms``: arm id -> its evaluation's metrics) and one entry per difference (``(minus, plus,
    comparison)``: plus minus minus, with the paired 95% interval of ``comparison``, a :func:`muarl.compare.
    compare_runs` report, where it has the metric). ``greedy`` (the arms' metrics at T = 0 and the
    differences' comparisons at T = 0, in the same order) adds the greedy success and faults right below
    the sampled ones. The demo's table and the ablation's are made of these rows."""
    rows = []

    def row(label: str, key: str | None, metrics: dict[str, dict[str, Any]],
            cmps: list[dict[str, Any] | None]) -> dict[str, Any]:
        if key == "faults":  # one row, three parties: the interval column stays for single metrics
            parts = {arm: [_value(m, f, k) for f in FAULT_KEYS] for arm, m in metrics.items()}
            return {"metric": label, "values": {arm: " / ".join(f"{x:.3f}" for x in v) for arm, v in parts.items()},
                    "differences": [" / ".join(f"{y - x:+.3f}" for x, y in zip(parts[a], parts[b], strict=True))
                                    for a, b, _ in differences]}
        entries = []
        for (a, b, _), cmp in zip(differences, cmps, strict=True):
            m = {d["metric"]: d for d in (cmp or {}).get("metrics", [])}.get(key or f"pass^{k}")
            entries.append({"diff": _value(metrics[b], key, k) - _value(metrics[a], key, k),
                            **({"low": m["low"], "high": m["high"]} if m else {})})
        return {"metric": label.replace("pass^k", f"pass^{k}"),
                "values": {arm: _value(m, key, k) for arm, m in metrics.items()}, "differences": entries}

    for label, key in ROWS:
        rows.append(row(label, key, arms, [c for _, _, c in differences]))
        if greedy and key == "faults":  # the greedy success and faults right below the sampled ones
            rows.extend(row(f"{g_label}, T = 0", g_key, *greedy) for g_label, g_key in ROWS[:2])
    return rows


def table_rows(before: dict[str, Any], after: dict[str, Any], k: int, comparison: dict[str, Any] | None = None,
               greedy: tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None = None
               ) -> list[dict[str, Any]]:
    """The demo table's rows (:func:`metric_rows`): the cold start and after RL (:data:`ARMS`), one
    difference, after RL minus cold start; ``greedy`` is (before, after, comparison) at T = 0. The
    console's table and the report's are both made of these rows."""
    return metric_rows(dict(zip(ARMS, (before, after), strict=True)), k, [(*ARMS, comparison)],
                       (dict(zip(ARMS, greedy[:2], strict=True)), [greedy[2]]) if greedy else None)


def table_title(split: str, temperature: float, greedy: bool) -> str:
    """The demo table's title."""
    return (f"held-out {split} tasks: cold start vs after GRPO"
            + (f" (T = {temperature:g} unless marked T = 0)" if greedy else ""))


def table(before: dict[str, Any], after: dict[str, Any], k: int, comparison: dict[str, Any] | None = None,
          greedy: tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None] | None = None,
          temperature: float = 1.0, split: str = "test") -> Table:
    """Cold start vs after RL, metric by metric, with the paired 95% interval of the change where known;
    ``greedy`` (before, after, comparison at T = 0) adds the greedy success and faults right below the
    sampled ones, so the two read side by side (:func:`table_rows`)."""
    from muarl.report.comparison import format_difference, format_value

    t = Table(title=table_title(split, temperature, greedy is not None))
    for col in ("metric", "cold start", "after RL", "change", "95% interval"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for row in table_rows(before, after, k, comparison, greedy):
        t.add_row(row["metric"], *(format_value(row["values"][arm]) for arm in ARMS),
                  *format_difference(row["differences"][0]))
    return t


def series(path: Path, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` in a ``metrics.jsonl``-like file (nothing when the file is missing)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    rows = [r for r in rows if key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display on a server, nor needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cold_start(out: Path, folder: Path) -> Path:
    """``cold_start.png``: the SFT loss of a cold start trained here, else the shipped base's pretraining
    curve, which travels with it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if (out / "sft" / "metrics.jsonl").exists():
        ax.plot(*series(out / "sft" / "metrics.jsonl", "loss"))
        ax.set(title="SFT: loss on agent tokens", xlabel="optimizer step", ylabel="cross-entropy")
    else:
        from muarl.models import base_path

        curve = base_path() / "curve.jsonl"
        ax.plot(*series(curve, "loss"), label="loss on agent tokens")
        ax.plot(*series(curve, "copy_accuracy"), label="held-out copy accuracy", marker="o", markersize=3)
        ax.set(title="cold-start base: muarl pretrain", xlabel="optimizer step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "cold_start.png", dpi=110)
    plt.close(fig)
    return folder / "cold_start.png"


def plot_grpo(run: Path, path: Path, title: str = "GRPO: training dynamics") -> Path:
    """``path``: a GRPO run's reward, violation rate and groups all wrong / all correct, per step."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in ("reward", "violation_rate", "all_wrong_groups", "all_correct_groups"):
        ax.plot(*series(run / "metrics.jsonl", key), label=key, marker="o", markersize=3)
    ax.set(title=title, xlabel="step", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(out: Path, where: Path | None = None) -> list[Path]:
    """``plots/`` in ``where`` (a split's folder; default ``out``): SFT loss, GRPO reward and violation rate
    per step, SFT vs RL on the split's held-out tasks."""
    plt = pyplot()
    where = out if where is None else where
    folder = where / "plots"
    folder.mkdir(exist_ok=True)
    written = [plot_cold_start(out, folder)]

    written.append(plot_grpo(out / "grpo", folder / "grpo_dynamics.png"))

    summary = json.loads((where / "summary.json").read_text())
    labels = ["pass^1", f"pass^{summary['k']}", "violation_rate"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [summary["sft"].get(k) or 0 for k in labels], width=0.4, label="cold start")
    ax.bar([x + 0.2 for x in xs], [summary["rl"].get(k) or 0 for k in labels], width=0.4, label="after RL")
    ax.set_xticks(list(xs), labels)
    ax.set(title=f"held-out {summary.get('split', 'test')} tasks", ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "eval.png", dpi=110)
    written.append(folder / "eval.png")
    plt.close(fig)
    return written


#: held-out episodes the report shows side by side: this many that RL fixed, then up to half as many it broke
REPORT_PAIRS = 6
#: the evaluations the report links to, by folder: (label, arm, greedy)
EVALUATIONS = (("eval-sft", "cold start", False), ("eval-rl", "after RL", False),
               ("eval-sft-greedy", "cold start", True), ("eval-rl-greedy", "after RL", True))


def report(out: Path, where: Path | None = None) -> Path:
    """``report.html`` of a split (in ``where``, default ``out``): the comparison page
    (:func:`muarl.report.comparison.build_comparison_report`), opening on the cold start vs after RL table
    with its paired intervals, then the plots, the held-out conversations RL changed side by side and links
    into the run viewer's pages, which it writes beside the runs they show (``grpo/report.html``: training
    curves, rollouts, groups; ``eval-*/report.html``: every held-out episode). Made from the files the
    demo wrote (``summary.json``, ``comparison*.json``, ``plots/``, the evaluations' trajectories), so a rerun
    of a finished demo rebuilds it."""
    from muarl.report.comparison import build_comparison_report, change_pair, href, paired_changes
    from muarl.report.html import build_report

    where = out if where is None else where
    page = where / "report.html"
    summary = json.loads((where / "summary.json").read_text())
    settings = json.loads((out / "demo.json").read_text()) if (out / "demo.json").exists() else {}
    temperature = float(settings.get("grpo.temperature", GRPO.temperature))
    split, k = summary.get("split", "test"), summary["k"]

    def read(name: str) -> dict[str, Any] | None:
        return json.loads((where / name).read_text()) if (where / name).exists() else None

    comparison, comparison_greedy = read("comparison.json"), read("comparison-greedy.json")
    greedy = ((summary["sft_greedy"], summary["rl_greedy"], comparison_greedy) if "rl_greedy" in summary else None)
    viewers: dict[str, Path] = {}  # the viewer's page of each run, every episode in it (the links' numbers)
    for name in ("grpo", *(e[0] for e in EVALUATIONS)):
        run = out / name if name == "grpo" else where / name
        if run.exists():
            viewers[name] = build_report(run, max_trajectories=5000 if name == "grpo" else 0)

    changes = paired_changes(where / "eval-sft", where / "eval-rl")
    fixed = [c for c in changes if c.gain > 0]
    broken = [c for c in changes if c.gain < 0]
    shown = fixed[:REPORT_PAIRS] + broken[:max(1, REPORT_PAIRS // 2)]
    pairs = [change_pair(c, ("cold start", "after RL"),
                         (href(viewers["eval-sft"], page, f"traj/{c.a_index}"),
                          href(viewers["eval-rl"], page, f"traj/{c.b_index}")),
                         title=f"{c.a.task_id} (user seed {c.a.user_seed}): {'fixed' if c.gain > 0 else 'broken'} "
                               f"by RL, reward {c.a.reward.reward if c.a.reward else 0:g} to "
                               f"{c.b.reward.reward if c.b.reward else 0:g}")
             for c in shown]

    links = []
    if "grpo" in viewers:
        links += [{"label": "GRPO training curves", "href": href(viewers["grpo"], page, "training"),
                   "detail": "reward, groups all correct / all wrong, turns, KL, ... per step"},
                  {"label": "GRPO rollouts, groups side by side", "href": href(viewers["grpo"], page, "groups"),
                   "detail": "every training episode with its advantage"}]
    for name, label, is_greedy in EVALUATIONS:
        if name in viewers:
            links.append({"label": f"{label}: held-out episodes, {'greedy (T = 0)' if is_greedy else f'T = {temperature:g}'}",
                          "href": href(viewers[name], page, "trajectories"), "detail": f"{name}/"})
    links += [{"label": name, "href": href(where / name, page), "detail": what}
              for name, what in (("comparison.json", "the paired intervals, every metric"),
                                 ("comparison-greedy.json", "the same, greedy"),
                                 ("summary.json", "the figures and their provenance"),
                                 ("changed.md", "the first changed conversations as text"))
              if (where / name).exists()]

    note = ("Change: after RL minus cold start, on the same tasks, users and trials. Interval: paired "
            "bootstrap over tasks" + (f", {comparison['samples']} resamples" if comparison else "")
            + " (muarl compare).")
    seconds = summary.get("total_seconds")
    plots = [("cold_start.png", "the cold start: its training curve"),
             ("grpo_dynamics.png", "GRPO, per step: reward, violation rate, groups all wrong / all correct"),
             ("eval.png", f"held-out {split} tasks: success and violations before and after RL")]
    spec = {
        "title": "muarl demo: cold start vs after RL",
        "subtitle": str(out.resolve().name) + ("" if where == out else f"/{where.name}"),
        "arms": [{"id": ARMS[0], "label": "cold start", "detail": "the model GRPO starts from",
                  **({"href": href(viewers["eval-sft"], page, "trajectories")} if "eval-sft" in viewers else {})},
                 {"id": ARMS[1], "label": "after RL",
                  "detail": f"after GRPO with the scripted user in every rollout ({settings.get('grpo.steps', '?')} "
                            "steps)",
                  **({"href": href(viewers["eval-rl"], page, "trajectories")} if "eval-rl" in viewers else {})}],
        "tables": [{"title": table_title(split, temperature, greedy is not None),
                    "differences": [{"label": "change", "minus": ARMS[0], "plus": ARMS[1]}],
                    "rows": table_rows(summary["sft"], summary["rl"], k, comparison, greedy), "note": note}],
        "facts": {"domain": summary.get("domain"), "held-out tasks": f"{summary.get('eval_tasks')} of the {split} "
                  f"split, {k} trials each", "seed": summary.get("seed"), "preset": summary.get("preset"),
                  **({"minutes": round(seconds / 60, 1)} if seconds is not None else {})},
        # absolute: the page's relative paths start from its own folder, and ``where`` may itself be relative
        "plots": [{"path": (where / "plots" / name).resolve(), "caption": caption} for name, caption in plots
                  if (where / "plots" / name).exists()],
        "changed": {"title": "held-out conversations RL changed", "summary": changed_summary(changes)
                    + (f" Shown: {len(fixed[:REPORT_PAIRS])} fixed, {len(broken[:max(1, REPORT_PAIRS // 2)])} "
                       "broken; every episode is in the viewer." if changes else ""),
                    "pairs": pairs},
        "links": links,
    }
    return build_comparison_report(spec, page)


STAGES = ("model", "synth", "sft-prefix", "sft", "eval-sft", "eval-sft-greedy", "grpo", "eval-rl", "eval-rl-greedy")


def run_demo(out: str | Path = "runs/demo", preset: str = "default", seed: int = 0, progress: bool = True,
             stop_after: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Run (or resume) every stage; returns the summary written to the split's ``summary.json``. ``overrides``
    change the preset's knobs (:meth:`DemoConfig.with_overrides`: ``greedy=False``, ``grpo={"lr": 1e-4}``,
    ``eval_split="dev"``). ``stop_after`` ends the run after that stage (say ``eval-sft``, to measure an SFT
    recipe without the GRPO stage); rerunning without it continues from there."""
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"unknown stage {stop_after!r}; choose from {', '.join(STAGES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown demo preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = PRESETS[preset].with_overrides(**overrides)
    check_base(config.base)
    held_out_tasks(config)  # too few tasks in the split: say so now, not after the training
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    where = split_dir(out, config.eval_split)
    where.mkdir(exist_ok=True)
    settings = {"preset": preset, "seed": seed,
                **{k: v for k, v in config.settings().items() if k not in EVAL_ONLY}}
    check_settings(out / "demo.json", settings, DemoConfig().settings(), "a demo")
    console = Console()
    prefix = "" if where == out else f"{config.eval_split}/"
    stage = Stages(out, prefix, SHARED_STAGES, stop_after)

    try:
        sft_model = cold_start(out, config, seed, progress, stage)
        before = stage("eval-sft", evaluate_model, where, "eval-sft", config, sft_model, seed, progress)
        if config.greedy:
            before_greedy = stage("eval-sft-greedy", evaluate_model, where, "eval-sft-greedy", config, sft_model,
                                  seed, progress, 0.0)
        rl_model = stage("grpo", reinforce, out, config, sft_model, seed, progress)
        after = stage("eval-rl", evaluate_model, where, "eval-rl", config, rl_model, seed, progress)
        if config.greedy:
            after_greedy = stage("eval-rl-greedy", evaluate_model, where, "eval-rl-greedy", config, rl_model, seed,
                                 progress, 0.0)
    except Stopped:
        console.print(f"stopped after {stop_after}; rerun without --stop-after to go on")
        return {"preset": preset, "seed": seed, "stopped_after": stop_after, "seconds": stage.clock}
    seconds = stage.seconds()
    summary = {"preset": preset, "seed": seed, "domain": config.domain, "split": config.eval_split,
               "k": config.eval_k, "eval_tasks": config.eval_tasks,
               "task_ids": [t.id for t in held_out_tasks(config)], "sft": before, "rl": after,
               "seconds": seconds, "total_seconds": round(sum(seconds.values()), 1)}
    comparison = compare_evaluations(where)
    summary["comparison"] = {m["metric"]: [m["diff"], m["low"], m["high"]] for m in comparison["metrics"]}
    greedy = None
    if config.greedy:
        comparison_greedy = compare_evaluations(where, "-greedy")
        summary.update({"sft_greedy": before_greedy, "rl_greedy": after_greedy, "comparison_greedy": {
            m["metric"]: [m["diff"], m["low"], m["high"]] for m in comparison_greedy["metrics"]}})
        greedy = (before_greedy, after_greedy, comparison_greedy)
    summary["provenance"] = provenance(config, sft_model, rl_model)
    (where / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    changed = changed_conversations(where)
    plot(out, where)
    try:
        page = report(out, where)
    except Exception as err:  # the report is a convenience: never lose a finished demo over it
        page = None
        console.print(f"[yellow]report not written: {err}")
    console.print(table(before, after, config.eval_k, comparison, greedy, config.grpo.temperature, config.eval_split))
    console.print(f"total {summary['total_seconds']:.0f} s ({config.eval_split} split); run directory {out} "
                  f"(plots/, report.html, summary.json, {changed.name}: held-out conversations RL changed"
                  + (f"; this split's in {where}" if where != out else "") + ")")
    if page is not None:
        console.print(f"report: {page}")
    return summary
