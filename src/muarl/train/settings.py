"""A training run's settings, resolved in one place: :func:`resolve`.

A run's settings come in four layers, each winning over the one before: the named **preset** (``--preset``),
a **config file** (``--config FILE.yaml``, :mod:`muarl.cli.config_file`), the **flags** given on the command
line, and the **derived defaults**, values left unset that follow from others (:meth:`RunSettings.derived`:
GRPO's ``tis_cap`` 2 with ``--max-staleness``). :func:`resolve` applies them in that order and returns the
settings a run trains with and records (``config.json``, ``config.yaml``); a config built in code (a test, the
demo's stages) has only the last layer to go, :func:`complete`. What comes out is handed down whole: below it
nothing merges, overrides or derives a setting again.

:class:`RunSettings` holds the fields every training run shares (the SFT, GRPO and pretraining configs extend
it); each command's own fields and presets are in its config's module (:mod:`muarl.train.grpo_config`,
:mod:`muarl.train.sft`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

C = TypeVar("C", bound="RunSettings")


@dataclass
class RunSettings:
    """The settings every training run shares (SFT and GRPO configs extend it): seeding, precision, LoRA,
    checkpoints, trackers and device."""

    seed: int = field(default=0, metadata={"help": "seeds the model init, data order, sampling and users"})
    bf16: bool | None = field(default=None, metadata={
        "help": "bfloat16 autocast for training forwards (default: on where CUDA supports it)"})
    lora_r: int = field(default=0, metadata={
        "help": "LoRA rank (peft); 0: full fine-tuning. The KL reference is the adapter switched off"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_targets: str = field(default="all-linear", metadata={
        "help": "modules to adapt: all-linear or comma-separated names like q_proj,v_proj"})
    merge_lora: bool = field(default=True, metadata={
        "help": "with LoRA, also write the adapter merged into the base as OUT/model (--no-merge-lora: only "
                "OUT/adapter)"})
    keep_checkpoints: int = field(default=2, metadata={"help": "newest checkpoints kept (0: all)"})
    resume: bool | None = field(default=None, metadata={
        "help": "--resume: continue from OUT's newest checkpoint, an error if there is none; --no-resume: start "
                "over, deleting OUT's checkpoints (default: continue when there is one, else start fresh)"})
    report_to: str = field(default="tensorboard", metadata={
        "help": "comma-separated trackers: tensorboard, wandb, mlflow, or none; metrics.jsonl is always written",
        "metavar": "LIST"})
    device: str | None = field(default=None, metadata={
        "help": "cpu, cuda, cuda:1 ... (default: this process's GPU if any, else the CPU)"})
    fsdp: bool = field(default=False, metadata={
        "help": "shard parameters, gradients and optimizer state over the processes (torch FSDP2, "
                "muarl.train.sharding; launch with torchrun or accelerate launch; docs/gpu.md)"})
    fsdp_offload: bool = field(default=False, metadata={
        "help": "with --fsdp on GPUs: keep the shards and the optimizer state in CPU memory"})
    optimizer: str = field(default="adamw", metadata={
        "help": "adamw, or sgd (plain gradient steps, no momentum: what cross-rank equality tests use)",
        "choices": ["adamw", "sgd"]})

    def check_sharding(self) -> None:
        """Refuse sharding options that cannot apply, naming the option."""
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"--optimizer must be adamw or sgd, not {self.optimizer!r}")
        if self.fsdp_offload and not self.fsdp:
            raise ValueError("--fsdp-offload moves a sharded run's optimizer state to CPU memory: it needs --fsdp")
        if self.fsdp_offload and (self.device or "").startswith("cpu"):
            raise ValueError("--fsdp-offload moves the optimizer state from the GPU to CPU memory; this run is on "
                             "the CPU already")

    def derived(self) -> dict[str, Any]:
        """The fields left unset whose value follows from others, with that value (the last layer of
        :func:`resolve`); a config never changes a value it was given. None here; a config that has such
        fields says so (:class:`~muarl.train.grpo_config.GRPOConfig`)."""
        return {}


@dataclass(frozen=True)
class Resolved(Generic[C]):
    """A run's settings with every layer applied, and which values the derived defaults filled in (the run
    says them once, and which option would choose otherwise)."""

    config: C
    derived: dict[str, Any] = field(default_factory=dict)


def from_preset(presets: Mapping[str, C], name: str, kind: str, **overrides: Any) -> C:
    """A preset config with the overrides that were given (None means "keep the preset's value"): the
    first layers of :func:`resolve` at once, for a config built in code."""
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; choose from {', '.join(presets)}")
    return replace(presets[name], **{k: v for k, v in overrides.items() if v is not None})


def complete(config: C) -> Resolved[C]:
    """``config`` with its derived defaults filled in (:meth:`RunSettings.derived`), the last layer of
    :func:`resolve`. Filling in twice changes nothing: a derived value, once set, is a value given."""
    filled = config.derived()
    return Resolved(replace(config, **filled) if filled else config, filled)


def resolve(presets: Mapping[str, C], name: str, kind: str, *, file: Mapping[str, Any] | None = None,
            flags: Mapping[str, Any] | None = None) -> Resolved[C]:
    """The settings a run uses: the preset ``name`` of ``presets`` (``kind`` names them in an error), then
    the config file's values, then the flags', then the derived defaults. ``file`` and ``flags`` map field
    names to values; None means "not given" (the layer below stands).

    The layers are merged before the config is built, so it is checked once, whole: a file's
    ``vllm_sleep: true`` with ``--rollout-engine vllm`` on the command line is a valid run, though neither
    layer alone is."""
    given = {k: v for layer in (file or {}, flags or {}) for k, v in layer.items() if v is not None}
    return complete(from_preset(presets, name, kind, **given))
