"""The demo's recipe: its presets and knobs (:class:`DemoConfig`, nesting the SFT and GRPO configs), shared
by ``muarl demo`` and ``muarl ablate`` (see :mod:`muarl.demo` for what each stage does with them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from muarl.train.grpo import GRPOConfig
from muarl.train.sft import SFTConfig

#: the GRPO fields the demo and the ablation vary, with their options (None: the field's own option); the
#: ablation's recipe check reads it too, so it lives with the recipe, not the command line
GRPO_OPTIONS = {"steps": "--grpo-steps", "lr": "--grpo-lr", "user": None, "tasks_per_step": None, "group_size": None,
                "kl_beta": None, "num_iterations": None, "dynamic_sampling": None, "mask_truncated": None,
                "penalize_violations": None, "violation_reward": None, "truncation_reward": None, "temperature": None, "max_new_tokens": None,
                "max_turns": None, "max_staleness": None, "tis_cap": None}

#: the demo's SFT: small batches (a model this size learns per step, not per token), one conversation a row
SFT = SFTConfig(epochs=2, lr=3e-3, batch_size=2, warmup_steps=2, max_len=0, packing=False, save_every=100,
                report_to="tensorboard")
#: the demo's GRPO: the measured recipe of research/rl-beats-cold-start.md. 45 steps at lr 2e-4 with two
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
    The defaults are the measured recipe of research/rl-beats-cold-start.md: RL on users who behave
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




def check_base(base: str) -> None:
    """``base`` is one of :data:`BASES` or a model directory (a ``config.json`` in it); else one clear error
    before anything is trained."""
    if base not in BASES and not (Path(base) / "config.json").is_file():
        raise ValueError(f"--base {base!r} is neither one of {', '.join(BASES)} nor a model directory "
                         "(no config.json in it)")

